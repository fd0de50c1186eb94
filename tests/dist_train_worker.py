"""One rank of the data-parallel trainer test (tests/test_rl_distributed.py starts two of these with
``python -m torch.distributed.run``). Each phase writes what it saw to ``OUT/rank-R.json``.

Phases, all on the micro model saved by the test (``MODEL``) and a DeepSpeed CPU config:

- ``grad`` (``gradtorch``: the same on the plain-torch backend): one ``_update`` on a fixed batch of
  step items, each rank given its share; the merged statistics (grad norm, losses) are compared by
  the test with one process's on the whole batch;
- ``run``: one update of a real run (rollouts, log validation, checkpoint), then
  ``resume``: a new trainer on a fresh copy of the model resumes it and finishes the run;
- ``straight``: the same run as ``run`` + ``resume``, never stopped;
- ``idle``: a batch of one task, so rank 0 has nothing to roll out and still steps with rank 1;
- ``stop``: only rank 1 asks to stop; every rank stops (a collective flag) with a checkpoint;
- ``badlog``: only rank 1's episode log fails validation; every rank raises before its update.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from pathlib import Path

import torch

from omtr.rl.config import train_profile
from omtr.rl.rewards import OUTCOME_SCORES, register_outcome_score
from omtr.tasks.training import TrainingTask

TASKS = [TrainingTask(f"t{i}", "blocksworld", None, f"Put block b{i} on the table, then stack b{i + 1} on it.")
         for i in range(6)]

if "toy_even_tokens" not in OUTCOME_SCORES:
    @register_outcome_score("toy_even_tokens")
    def toy_even_tokens(completions, *, verdicts, token_ids, **_):
        return [sum(1 for t in ids if t % 2 == 0) / max(1, len(ids)) for ids in token_ids]


class NoPlanner:
    def solve_many(self, specs):
        from omtr.solver import solve

        return [solve(d, p) for d, p in specs]


def cfg(model: str, ds: str | None, **kw):
    base = dict(model=model, cycles=1, updates_per_cycle=2, episodes_per_batch=4, max_new_tokens=10,
                reward="toy_even_tokens", save_model_every_cycle=True, validate_logs=True, mlflow=True,
                checkpoint_every_updates=1, deepspeed=ds)
    base.update(kw)
    return train_profile("micro").replace(**base)


def perturb(trainer, seed=3):
    """Non-zero LoRA B matrices (B = 0 at initialisation gives A no gradient); the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in trainer.backend.mods.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.05)


def digest(state: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].float().numpy().tobytes())
    return h.hexdigest()


def fixed_batch(trainer, n_episodes=4):
    """Step items and Judge items of a made-up batch, the same in every process."""
    from omtr.inference import prompts as P
    from omtr.rl.trainer import JudgeItem, StepItem

    g = torch.Generator().manual_seed(11)
    hidden = trainer.value_head.weight.shape[1]
    vocab = trainer.models["actor"]._vocab_size()
    items, judge = [], []
    for ep in range(n_episodes):
        task = TASKS[ep]
        for role, step in (("actor", 0), ("editor", 1)) if ep % 2 == 0 else (("actor", 0),):
            n = 5 + ep
            items.append(StepItem(
                ep=ep, group=(0, ep), role=role, step=step, prompt=P.actor_messages(task),
                tokens=torch.randint(3, vocab, (n,), generator=g).tolist(),
                old_logprobs=(-3.0 - torch.rand(n, generator=g)).tolist(), outcome="syntax", limited=False,
                judge_score=None, reward=0.0, advantage=float(torch.randn(1, generator=g)),
                ret=float(torch.randn(1, generator=g)), feature=torch.randn(hidden, generator=g)))
        judge.append(JudgeItem(P.judge_messages(task, f"(define (domain d{ep}))"), ep % 2 == 0, index=ep))
    return items, judge


def share(trainer, items, judge, n_episodes=4):
    from omtr.rl.distributed import shard

    mine = set(shard(n_episodes, trainer.coll.rank, trainer.coll.world))
    return [it for it in items if it.ep in mine], [j for j in judge if j.index in mine]


def main() -> None:
    phases, out, model, ds = sys.argv[1].split(","), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    from omtr.rl.distributed import leave_process_group

    for phase in phases:
        run_phase(phase, out, model, ds)
    leave_process_group()  # as ``omtr train`` ends: no rank tears its connections down under another


def run_phase(phase: str, out: Path, model: str, ds: str) -> None:
    from omtr.model import RoleModel
    from omtr.rl.trainer import EpisodeLogInvalid, Trainer

    record: dict = {}

    def fresh():
        return RoleModel.load(model)

    if phase in ("grad", "gradtorch"):
        engine = ds if phase == "grad" else None  # gradtorch: the plain-torch backend's all-reduce
        tr = Trainer(cfg(model, engine, mlflow=False), TASKS, out / phase, env=NoPlanner(), quiet=True, model=fresh())
        perturb(tr)
        items, judge = fixed_batch(tr)
        mine, mine_j = share(tr, items, judge)
        record["stats"] = tr._update(mine, mine_j)
        record["items"] = len(mine)
        record["after"] = digest(tr.trainable_state())
        if engine:  # DeepSpeed's torch backend on a CPU, without its shared-memory all-reduce op
            from deepspeed.comm import comm as ds_comm

            record["shm_op"] = ds_comm.cdb is not None and ds_comm.cdb.shm_comm_op is not None
    elif phase == "run":
        c = cfg(model, ds)
        a = Trainer(c, TASKS, out / "run", env=NoPlanner(), quiet=True, model=fresh())
        perturb(a)
        record["status_a"] = a.run(max_updates=1)
        record["rollout"] = {0: a.rollout_task_ids}
        record["after_a"] = digest(a.trainable_state())
        a.coll.barrier()
        record["metrics_lines_a"] = len((out / "run" / "metrics.jsonl").read_text().splitlines())
        b = Trainer(c, TASKS, out / "run", env=NoPlanner(), quiet=True, model=fresh(), resume=True)
        record["resumed_update"] = b.update
        record["after_load"] = digest(b.trainable_state())
        record["status_b"] = b.run()
        record["rollout"][1] = b.rollout_task_ids
        record["after_b"] = digest(b.trainable_state())
        record["history"] = b.history
        record["batches"] = {u: [t.id for t in b.batch_tasks(u)] for u in (0, 1)}
    elif phase == "straight":  # the run of ``run`` + ``resume`` without the interruption
        tr = Trainer(cfg(model, ds, mlflow=False), TASKS, out / "straight", env=NoPlanner(), quiet=True, model=fresh())
        perturb(tr)
        record["status"] = tr.run()
        record["after"] = digest(tr.trainable_state())
        record["history"] = tr.history
    elif phase == "idle":  # one task a batch: rank 0 rolls out nothing and still takes part
        c = cfg(model, ds, mlflow=False, updates_per_cycle=1, episodes_per_batch=2, samples_per_task=2)
        tr = Trainer(c, TASKS, out / "idle", env=NoPlanner(), quiet=True, model=fresh())
        perturb(tr)
        before = digest(tr.trainable_state())
        record["status"] = tr.run()
        record["rollout"] = tr.rollout_task_ids
        record["changed"] = digest(tr.trainable_state()) != before
        record["after"] = digest(tr.trainable_state())
        record["episodes"] = tr.episodes_done
    elif phase == "stop":
        tr = Trainer(cfg(model, ds, mlflow=False), TASKS, out / "stop", env=NoPlanner(), quiet=True, model=fresh())
        if tr.coll.rank == 1:
            tr.request_stop()
        record["status"] = tr.run()
        record["update"] = tr.update
    elif phase == "badlog":
        import omtr.validation.episodes as V

        tr = Trainer(cfg(model, ds, mlflow=False), TASKS, out / "badlog", env=NoPlanner(), quiet=True, model=fresh())
        if tr.coll.rank == 1:
            real = V.validate_episode_log

            def failing(*args, **kw):
                rep = real(*args, **kw)
                rep.success = False
                return rep

            V.validate_episode_log = failing
        try:
            record["status"] = tr.run()
        except EpisodeLogInvalid as exc:
            record["invalid"] = str(exc)
        record["update"] = tr.update
    else:
        raise SystemExit(f"unknown phase {phase}")
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    (out / f"{phase}-rank-{rank}.json").write_text(json.dumps(record, default=str))


if __name__ == "__main__":
    main()
