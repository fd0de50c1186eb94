"""How gradients are applied: plain torch (CPU, one GPU) or a DeepSpeed engine (many GPUs).

The trainer computes losses in micro-batches and calls :meth:`Backend.backward` once per
micro-batch, then :meth:`Backend.step` once per optimizer step; both backends accumulate the
micro-batches' gradients. The same trainer code runs on either.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn


class TrainModules(nn.Module):
    """Everything the optimizer updates: the role model(s) and the value head, as one module."""

    def __init__(self, models: dict[str, nn.Module], value_head: nn.Module):
        super().__init__()
        self.models = nn.ModuleDict(models)
        self.value_head = value_head

    def trainable_named(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.named_parameters() if p.requires_grad]


def param_groups(mods: TrainModules, lr: float, value_lr: float, weight_decay: float) -> list[dict]:
    main = [p for n, p in mods.trainable_named() if not n.startswith("value_head.")]
    value = list(mods.value_head.parameters())
    return [{"params": main, "lr": lr, "weight_decay": weight_decay},
            {"params": value, "lr": value_lr, "weight_decay": 0.0}]


class TorchBackend:
    name = "torch"

    def __init__(self, mods: TrainModules, cfg):
        self.mods = mods
        self.cfg = cfg
        self.optimizer = torch.optim.Adam(param_groups(mods, cfg.lr, cfg.value_lr, cfg.weight_decay),
                                          betas=tuple(cfg.adam_betas))

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor, *, last: bool) -> None:
        loss.backward()

    def step(self) -> float:
        params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else float("inf"))
        self.optimizer.step()
        return float(norm)

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])


class DeepSpeedBackend:
    """A DeepSpeed engine around :class:`TrainModules`. The trainer still calls the role model's
    methods (``token_logprobs``, ``judge_scores``) on ``engine.module``; ZeRO's hooks gather
    partitioned parameters on every submodule's forward, so that works at every ZeRO stage."""

    name = "deepspeed"

    def __init__(self, mods: TrainModules, cfg):
        import deepspeed

        ds_cfg = load_ds_config(cfg.deepspeed)
        if not torch.distributed.is_initialized():
            os.environ.setdefault("RANK", "0")
            os.environ.setdefault("LOCAL_RANK", "0")
            os.environ.setdefault("WORLD_SIZE", "1")
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29511")
            deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
        ds_cfg.setdefault("gradient_clipping", cfg.max_grad_norm)
        # The trainer marks accumulation boundaries itself (set_gradient_accumulation_boundary).
        ds_cfg["gradient_accumulation_steps"] = 1
        ds_cfg.setdefault("train_micro_batch_size_per_gpu", 1)
        ds_cfg.pop("train_batch_size", None)
        optimizer = None
        if "optimizer" not in ds_cfg:
            optimizer = torch.optim.Adam(param_groups(mods, cfg.lr, cfg.value_lr, cfg.weight_decay),
                                         betas=tuple(cfg.adam_betas))
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=mods, optimizer=optimizer,
            model_parameters=None if optimizer is not None else param_groups(mods, cfg.lr, cfg.value_lr, cfg.weight_decay),
            config=ds_cfg)
        self.mods = self.engine.module

    def zero_grad(self) -> None:
        self.engine.zero_grad()

    def backward(self, loss: torch.Tensor, *, last: bool) -> None:
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss)

    def step(self) -> float:
        self.engine.set_gradient_accumulation_boundary(True)
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def state_dict(self) -> dict:
        return {}  # saved by save_checkpoint (partitioned optimizer states)

    def save(self, folder: Path, client_state: dict) -> None:
        self.engine.save_checkpoint(str(folder), tag="ds", client_state=client_state)

    def load(self, folder: Path) -> dict:
        _, client = self.engine.load_checkpoint(str(folder), tag="ds")
        return client or {}


def load_ds_config(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"DeepSpeed config {path} not found; see configs/deepspeed/") from None


def make_backend(mods: TrainModules, cfg):
    return DeepSpeedBackend(mods, cfg) if cfg.deepspeed else TorchBackend(mods, cfg)
