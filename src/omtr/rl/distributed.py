"""Data parallelism for the trainer: which rank does what, and the few collectives it needs.

Under ``deepspeed --num_gpus G -m omtr train`` or ``torchrun --nnodes N --nproc_per_node G -m omtr
train`` every process runs a :class:`~omtr.rl.trainer.Trainer`. The batch of an update is still
``Trainer.batch_tasks(update)``; each rank rolls out a contiguous share of its tasks
(:func:`shard`), so the samples of one task (a ``group``) stay on one rank. What must describe the
whole batch goes through :class:`Collective`: whitening statistics, loss normalisers, metrics, the
stop flag and the episode-log verdict. One process (``world == 1``) gets a :class:`Collective`
whose operations return their inputs, so the trainer has one code path.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch

log = logging.getLogger("omtr.rl")


def env_world_size() -> int:
    """WORLD_SIZE as a launcher (torchrun, the deepspeed launcher) sets it; 1 without one."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def deepspeed_without_shm_op() -> None:
    """Keep DeepSpeed from building its shared-memory all-reduce op on a CPU.

    DeepSpeed's torch backend (created by ``init_distributed`` and again by ``initialize``) otherwise
    JIT-compiles ``deepspeed_shm_comm`` (C++ built by ninja on the first start of each machine) and
    maps /dev/shm segments for it. Only tensor-parallel inference (``inference_all_reduce``) uses that
    op; ZeRO's gradient reduction goes through ``torch.distributed``. The build costs a compiler run
    on every fresh machine and was seen to abort a two-rank CPU run (SIGABRT in CI), so on a CPU it
    is marked incompatible and the ranks talk over gloo alone. With a GPU nothing changes."""
    if torch.cuda.is_available():
        return
    import deepspeed

    # DeepSpeed keeps this dict for the life of the process and reads it in build_shm_op.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def deepspeed_init_distributed() -> None:
    """``deepspeed.init_distributed`` for this machine: NCCL with a GPU, gloo (and no shared-memory
    op, :func:`deepspeed_without_shm_op`) without."""
    import deepspeed

    deepspeed_without_shm_op()
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")


def init_from_env(*, use_deepspeed: bool) -> "Collective":
    """Join the process group a launcher described (RANK, WORLD_SIZE, MASTER_ADDR/PORT) and pin
    this process's GPU (LOCAL_RANK) before any model is built; a single process gets a trivial
    :class:`Collective`. DeepSpeed's own initialisation is used when the run trains through it."""
    dist = torch.distributed
    if not dist.is_initialized() and env_world_size() > 1:
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        if use_deepspeed:
            deepspeed_init_distributed()
        else:
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return Collective.current()


def leave_process_group(*, clean: bool = True) -> None:
    """End this process's part in the group of ranks it joined; a no-op in a single process (a
    one-rank DeepSpeed group stays, for whatever else the process runs).

    Without this, each rank tears its process group down at interpreter exit, in whatever order its
    objects die, and two gloo ranks that simply exit abort about half the time after all their work
    is done ("terminate called without an active exception", SIGABRT; 12 of 25 launches of a bare
    two-rank script on a 2-core machine, none of 25 that left the group first). ``clean`` (the run
    ended normally, on every rank alike): first a barrier, so no rank leaves while another still
    talks; after an error the other ranks may be stuck elsewhere, so the group is only destroyed."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return
    if clean:
        dist.barrier()
    dist.destroy_process_group()


@dataclass(frozen=True)
class Collective:
    """This process's place in the data-parallel group and the collectives the trainer uses."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @classmethod
    def current(cls) -> "Collective":
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return cls(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
        return cls()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def _device(self) -> torch.device:
        if torch.distributed.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier()

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over ranks (float64)."""
        return self._reduce(values, torch.distributed.ReduceOp.SUM)

    def max(self, values: Sequence[float]) -> list[float]:
        return self._reduce(values, torch.distributed.ReduceOp.MAX)

    def _reduce(self, values: Sequence[float], op) -> list[float]:
        values = [float(v) for v in values]
        if not self.active or not values:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self._device())
        torch.distributed.all_reduce(t, op=op)
        return t.cpu().tolist()

    def any(self, flag: bool) -> bool:
        """True on every rank when it is true on any (the stop flag, a failed episode log)."""
        return self.max([1.0 if flag else 0.0])[0] > 0

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out


def shard(n: int, rank: int, world: int) -> range:
    """The contiguous, balanced share of ``n`` items that ``rank`` of ``world`` takes: the shares
    of all ranks are disjoint, in rank order, and cover ``range(n)``; sizes differ by at most one."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a world of {world}")
    return range(n * rank // world, n * (rank + 1) // world)


def whiten(values: Sequence[float], coll: Collective, eps: float = 1e-8) -> list[float]:
    """``(x - mean) / (std + eps)`` with mean and population std over every rank's values (the
    whole batch); a batch of one value becomes 0 and a spread below ``MIN_STD`` is only centred,
    like :func:`omtr.rl.losses.whiten`."""
    from omtr.rl.losses import MIN_STD

    n, s = coll.sum([len(values), math.fsum(values)])
    if n == 0:
        return []
    mean = s / n
    (ss,) = coll.sum([math.fsum((v - mean) ** 2 for v in values)])
    std = math.sqrt(ss / n)
    if n == 1:
        return [0.0 for _ in values]
    if std < MIN_STD:
        return [v - mean for v in values]
    return [(v - mean) / (std + eps) for v in values]


def merge_weighted_means(stats: dict[str, list[float]], coll: Collective) -> dict[str, float]:
    """Per-key means over every rank's values (each value one item): the batch's figure.
    Keys are unioned across ranks; a key with no values anywhere is left out."""
    keys = sorted(set().union(*coll.gather(sorted(stats))))
    flat = []
    for k in keys:
        xs = stats.get(k, [])
        flat += [math.fsum(xs), len(xs)]
    tot = coll.sum(flat)
    return {k: tot[2 * i] / tot[2 * i + 1] for i, k in enumerate(keys) if tot[2 * i + 1] > 0}
