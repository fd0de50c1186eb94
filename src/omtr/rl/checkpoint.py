"""What a training run writes to resume from: checkpoints, ``config.json`` and the saved model.

**Where the checkpoint is written** (:meth:`CheckpointMixin.save_checkpoint`):
``checkpoints/update-NNNNNN`` (model, optimizer, RNG states, counters, data position, history and the
recipe's state) is written at every cycle's end and every ``checkpoint_every_updates`` updates;
SIGTERM writes one and stops. ``checkpoints/latest`` names the newest complete one, and
:meth:`CheckpointMixin._load_latest` resumes from it: a resumed run takes the same next batch with
the same parameters as one never stopped.

With several ranks, checkpoints are written by all ranks together (DeepSpeed's is collective; each
rank's RNG states beside it), ``latest`` by rank 0 after the others finished. ``config.json`` and
``model/`` (:meth:`CheckpointMixin.save_model`) are rank 0's.

The methods live on :class:`CheckpointMixin`, a base of :class:`omtr.rl.trainer.Trainer`; they read
its ``cfg``, ``coll``, ``backend``, ``out``, counters, ``cycle``, ``batch_tasks``, ``history``,
``judge_gate``, ``curriculum``, ``models`` and ``distinct``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from pathlib import Path

import torch

from omtr.config import ROLE_NAMES

log = logging.getLogger("omtr.rl")

STATE_FILE = "state.pt"
LATEST = "latest"


class CheckpointMixin:
    """The trainer's checkpoints (write, find, resume), its ``config.json`` and its saved model."""

    # ------------------------------------------------------------------ checkpoints
    def _ckpt_root(self) -> Path:
        return self.out / "checkpoints"

    def _latest_dir(self) -> Path | None:
        p = self._ckpt_root() / LATEST
        if not p.is_file():
            return None
        d = self._ckpt_root() / p.read_text().strip()
        return d if d.is_dir() else None

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().cpu().clone() for n, p in self.backend.mods.trainable_named()}

    def save_checkpoint(self) -> Path:
        """Write ``checkpoints/update-NNNNNN`` and point ``latest`` at it. With several ranks every
        rank calls this (DeepSpeed's save is collective, and each rank keeps its RNG states);
        rank 0 makes the folder, and renames it and writes ``latest`` after all ranks are done."""
        coll = self.coll
        root = self._ckpt_root()
        name = _ckpt_name(self.update)
        tmp = root / f".{name}.tmp"
        if coll.is_main:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        coll.barrier()
        rng = {"python": random.getstate(), "torch": torch.get_rng_state()}
        client = {
            "counters": {"update": self.update, "episodes": self.episodes_done, "planner_calls": self.planner_calls},
            "data_position": {"cycle": self.cycle, "update_in_cycle": self.update % self.cfg.updates_per_cycle,
                              "next_tasks": [t.id for t in self.batch_tasks()] if self.update < self.cfg.total_updates else []},
            "rng": rng,
            "history": self.history,
            "recipe": {"judge_gate": self.judge_gate.state_dict(), "curriculum": self.curriculum.state_dict()},
            "config": self.cfg.to_dict(),
        }
        if self.backend.name == "deepspeed":
            self.backend.save(tmp, client)  # collective
        elif coll.is_main:
            torch.save({"params": self.trainable_state(), "backend": self.backend.state_dict(), **client},
                       tmp / STATE_FILE)
        if coll.active:
            torch.save(rng, tmp / _rng_file(coll.rank))
        coll.barrier()
        final = root / name
        if coll.is_main:
            info = {k: client[k] for k in ("counters", "data_position")}
            info["world_size"] = coll.world
            (tmp / "trainer.json").write_text(json.dumps(info, indent=2) + "\n")
            shutil.rmtree(final, ignore_errors=True)
            os.rename(tmp, final)
            _atomic_write(root / LATEST, name)
            kept = sorted(d for d in root.iterdir() if d.is_dir() and d.name.startswith("update-"))
            for d in kept[:-self.cfg.keep_checkpoints]:
                shutil.rmtree(d, ignore_errors=True)
            log.info("checkpoint %s (update %d, cycle %d)", final, self.update, self.cycle)
        coll.barrier()
        return final

    def _load_latest(self) -> None:
        d = self._latest_dir()
        if d is None:
            raise FileNotFoundError(f"{self.out}: no checkpoint to resume (checkpoints/{LATEST} is missing); "
                                    "start the run without --resume")
        if self.backend.name == "deepspeed":
            state = self.backend.load(d)
        else:
            state = torch.load(d / STATE_FILE, map_location="cpu", weights_only=False)
            params = dict(self.backend.mods.trainable_named())
            missing = set(params) ^ set(state["params"])
            if missing:
                raise ValueError(f"checkpoint {d} does not match this model: {sorted(missing)[:3]} ...")
            with torch.no_grad():
                for n, p in params.items():
                    p.copy_(state["params"][n].to(p.device, p.dtype))
            self.backend.load_state_dict(state["backend"])
        c = state["counters"]
        self.update, self.episodes_done, self.planner_calls = c["update"], c["episodes"], c["planner_calls"]
        rng = state["rng"]
        if self.coll.active:
            own = d / _rng_file(self.coll.rank)
            if own.is_file():
                rng = torch.load(own, map_location="cpu", weights_only=False)
            else:
                log.warning("%s holds no RNG states of rank %d (written by a run with another world size); "
                            "this rank starts from rank 0's", d, self.coll.rank)
        random.setstate(rng["python"])
        torch.set_rng_state(rng["torch"])
        self.history = list(state.get("history", []))
        recipe = state.get("recipe") or {}
        self.judge_gate.load_state_dict(recipe.get("judge_gate") or {})
        self.curriculum.load_state_dict(recipe.get("curriculum") or {})
        log.info("resumed from %s: update %d of %d", d, self.update, self.cfg.total_updates)

    def _write_config(self) -> None:
        _atomic_write(self.out / "config.json", json.dumps(self.cfg.to_dict(), indent=2) + "\n")

    # ------------------------------------------------------------------ the model
    def save_model(self) -> Path:
        if len(self.distinct) == 1:
            return self.distinct[0].save(self.out / "model")
        for r in ROLE_NAMES:
            self.models[r].save(self.out / f"model-{r}")
        return self.out


# ---------------------------------------------------------------------------------------- helpers

def _ckpt_name(update: int) -> str:
    return f"update-{update:06d}"


def _rng_file(rank: int) -> str:
    return f"rng-rank-{rank:04d}.pt"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
