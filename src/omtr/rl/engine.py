"""How gradients are applied: plain torch (CPU, one GPU) or a DeepSpeed engine (many GPUs).

The trainer computes losses in micro-batches and calls :meth:`Backend.backward` once per
micro-batch, then :meth:`Backend.step` once per optimizer step; both backends accumulate the
micro-batches' gradients. The same trainer code runs on either.

Data parallelism (``world > 1``, see :mod:`omtr.rl.distributed`): the gradient a step applies is
the **sum over ranks** of what each rank's backward calls produced, so the trainer normalises its
losses by batch-wide counts. Ranks hold different numbers of micro-batches and roles, so neither
backend reduces inside a micro-batch's backward: each rank accumulates locally and the ranks meet
once per step, with one collective of the same shape on every rank (plain torch: one all-reduce of
the flattened gradients; DeepSpeed: one backward of a surrogate ``sum(p * g)`` over every trainable
parameter, whose gradient is the accumulated ``g``, times ``world`` because DeepSpeed averages).
The local accumulation holds one gradient-sized buffer of the trainable parameters per rank (small
for adapters; a trainable backbone's size in its dtype otherwise). ZeRO-3 is refused across ranks:
its parameters are gathered by collectives in every forward pass, and ranks whose rollouts
generate different numbers of tokens would wait on each other forever.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

import torch
from torch import nn

from omtr.config import ConfigError
from omtr.paths import free_port
from omtr.rl.distributed import Collective, deepspeed_init_distributed, deepspeed_without_shm_op

log = logging.getLogger(__name__)


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

    def __init__(self, mods: TrainModules, cfg, coll: Collective | None = None):
        self.mods = mods
        self.cfg = cfg
        self.coll = coll or Collective()
        self.optimizer = torch.optim.Adam(param_groups(mods, cfg.lr, cfg.value_lr, cfg.weight_decay),
                                          betas=tuple(cfg.adam_betas))
        self.skipped_steps = 0  # optimizer steps skipped for a non-finite gradient
        if self.coll.active:  # every rank starts from rank 0's trainable parameters
            with torch.no_grad():
                for _, p in mods.trainable_named():
                    torch.distributed.broadcast(p.data, src=0)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor, *, last: bool) -> None:
        loss.backward()

    def step(self) -> float:
        if self.coll.active:
            self._all_reduce_grads()
        # The policy's parameters and the value head are clipped apart: the value loss's gradient
        # must not shrink the policy's step (nor the policy's the value head's). The norm returned
        # (logged as grad_norm) is the policy's; the value head's is kept as last_value_grad_norm.
        limit = self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else float("inf")
        main, value = ([p for p in g["params"] if p.grad is not None] for g in self.optimizer.param_groups[:2])
        norm = torch.nn.utils.clip_grad_norm_(main, limit) if main else torch.zeros(())
        self.last_value_grad_norm = float(torch.nn.utils.clip_grad_norm_(value, limit)) if value else None
        if not (math.isfinite(float(norm)) and math.isfinite(self.last_value_grad_norm or 0.0)):
            # A NaN or infinite gradient (a loss that overflowed) would write NaN into every parameter
            # and Adam's moments for good: this step is skipped instead, as a loss scaler skips one.
            self.optimizer.zero_grad(set_to_none=True)
            self.skipped_steps += 1
            log.warning("optimizer step skipped: the gradient norm is %s (policy) / %s (value head); the "
                        "parameters keep their values (%d skipped so far; a lower lr or --set update_dtype=fp32 "
                        "if this repeats)", float(norm), self.last_value_grad_norm, self.skipped_steps)
            return float(norm)
        self.optimizer.step()
        return float(norm)

    def _all_reduce_grads(self) -> None:
        """Sum every trainable parameter's gradient over the ranks (a rank without one adds zeros);
        a parameter no rank gave a gradient keeps none, as in one process."""
        params = [p for _, p in self.mods.trainable_named()]
        has = torch.tensor([float(p.grad is not None) for p in params], device=params[0].device)
        flat = torch.cat([has] + [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float()
                                  for p in params])
        torch.distributed.all_reduce(flat)
        i = len(params)
        for k, p in enumerate(params):
            n = p.numel()
            if flat[k] > 0:
                p.grad = flat[i:i + n].view_as(p).to(p.dtype).clone()
            i += n

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])


class DeepSpeedBackend:
    """A DeepSpeed engine around :class:`TrainModules`. The trainer still calls the role model's
    methods (``token_logprobs``, ``judge_scores``) on ``engine.module``; ZeRO's hooks gather
    partitioned parameters on every submodule's forward, so that works at every ZeRO stage."""

    name = "deepspeed"

    def __init__(self, mods: TrainModules, cfg, coll: Collective | None = None):
        import deepspeed

        ds_cfg = load_ds_config(cfg.deepspeed)
        self.coll = coll or Collective()
        stage = int((ds_cfg.get("zero_optimization") or {}).get("stage", 0))
        if self.coll.active and stage >= 3:
            raise ConfigError(
                f"{cfg.deepspeed}: ZeRO-3 across {self.coll.world} ranks is not supported for training: it "
                "partitions parameters, so every forward pass is collective, and the ranks' rollouts generate "
                "different numbers of tokens (generation would hang). Use ZeRO-1 or ZeRO-2, e.g. "
                "--set deepspeed=configs/deepspeed/zero2_bf16.json")
        # before anything of DeepSpeed's starts: init_distributed below, or initialize(), which makes
        # its own torch backend when none exists yet
        deepspeed_without_shm_op()
        if not torch.distributed.is_initialized():
            os.environ.setdefault("RANK", "0")
            os.environ.setdefault("LOCAL_RANK", "0")
            os.environ.setdefault("WORLD_SIZE", "1")
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            # a port the system has free: a fixed one fails with EADDRINUSE whenever anything else on
            # the machine holds it (another one-process DeepSpeed run, a launcher's store)
            os.environ.setdefault("MASTER_PORT", str(free_port()))
            deepspeed_init_distributed()
        # DeepSpeed clips one global norm over every parameter it holds, the value head included:
        # unlike TorchBackend, the value loss's gradient still shares the policy's clip here.
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
        self._params = [p for _, p in self.mods.trainable_named()]
        self._acc: list[torch.Tensor | None] = [None] * len(self._params)

    def zero_grad(self) -> None:
        self.engine.zero_grad()
        self._acc = [None] * len(self._params)

    def backward(self, loss: torch.Tensor, *, last: bool) -> None:
        if self.coll.active:  # accumulate here; the ranks meet in step()
            grads = torch.autograd.grad(loss, self._params, allow_unused=True)
            for i, g in enumerate(grads):
                if g is not None:  # kept in the parameter's dtype, as DeepSpeed accumulates itself
                    if self._acc[i] is None:
                        self._acc[i] = g.detach().clone()
                    else:
                        self._acc[i].add_(g.detach())
            return
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss)

    def step(self) -> float:
        self.engine.set_gradient_accumulation_boundary(True)
        if self.coll.active:
            # The same graph on every rank: d/dp sum(p * g) = g for every trainable parameter, so
            # ZeRO's gradient hooks fire in one order everywhere; DeepSpeed averages over ranks,
            # the factor world makes that the sum.
            w = float(self.coll.world)
            surrogate = sum((p * (torch.zeros_like(p) if g is None else g.to(p.dtype) * w)).sum()
                            for p, g in zip(self._params, self._acc))
            self.engine.backward(surrogate)
            self._acc = [None] * len(self._params)
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


def make_backend(mods: TrainModules, cfg, coll: Collective | None = None):
    return DeepSpeedBackend(mods, cfg, coll) if cfg.deepspeed else TorchBackend(mods, cfg, coll)
