"""The trainer on the micro model: one update moves every trainable parameter (and no frozen one),
the Judge's loss falls on fixed labels, references never reach it, and an interrupted run resumes
to the same state as one never stopped."""

import json
import os
import signal

import pytest

torch = pytest.importorskip("torch")

from omtr.rl.config import train_profile  # noqa: E402
from omtr.rl.rewards import register_outcome_score  # noqa: E402
from omtr.tasks.training import TrainingTask  # noqa: E402


@register_outcome_score("toy_even_tokens")
def toy_even_tokens(completions, *, verdicts, token_ids, **_):
    """A verifiable toy reward: the share of generated tokens with an even id."""
    return [sum(1 for t in ids if t % 2 == 0) / max(1, len(ids)) for ids in token_ids]


TASKS = [TrainingTask(f"t{i}", "blocksworld", None, f"Put block b{i} on the table, then stack b{i + 1} on it.")
         for i in range(6)]


class NoPlanner:
    """The environment for runs whose answers never hold a spec (micro writes noise)."""

    def solve_many(self, specs):
        from omtr.solver import solve

        return [solve(d, p) for d, p in specs]


@pytest.fixture(scope="module")
def micro():
    """One micro model for the quick tests (building it trains a tokenizer: ~10 s)."""
    torch.set_num_threads(1)
    from omtr.model import build_model

    return build_model("micro")


def _cfg(**kw):
    base = dict(cycles=1, updates_per_cycle=1, episodes_per_batch=4, max_new_tokens=12, reward="toy_even_tokens",
                save_model_every_cycle=False, validate_logs=False, mlflow=False)
    base.update(kw)
    return train_profile("micro").replace(**base)


def _perturb(trainer, seed=3):
    """Non-zero LoRA B matrices: at initialisation B = 0 makes A's gradient vanish by construction."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in trainer.backend.mods.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.05)


def test_one_update_moves_every_trainable_parameter_and_no_frozen_one(tmp_path, micro):
    from omtr.rl.trainer import Trainer

    tr = Trainer(_cfg(validate_logs=True), TASKS, tmp_path / "run", env=NoPlanner(), quiet=True, model=micro)
    _perturb(tr)
    frozen = {n: p.detach().clone() for n, p in tr.backend.mods.named_parameters() if not p.requires_grad}
    assert frozen, "the micro profile freezes the backbone"
    before = tr.trainable_state()
    assert any("lora_" in n and ".editor." in n for n in before) and any("judge_head" in n for n in before)
    assert any(n.startswith("value_head") for n in before)
    assert tr.run() == "finished"
    after = tr.trainable_state()
    unchanged = [n for n in before if torch.equal(before[n], after[n])]
    assert not unchanged, f"not updated: {unchanged[:5]}"
    for n, p in tr.backend.mods.named_parameters():
        if n in frozen:
            assert torch.equal(frozen[n], p.detach()), n
    h = tr.history[-1]
    for key in ("reward_actor", "reward_editor", "judge_loss", "judge_bce", "judge_ece", "judge_brier", "actor_kl",
                "actor_clip_frac", "actor_entropy", "rollout_tokens_per_s", "update_tokens_per_s", "value_loss",
                "share_final_syntax", "len_actor"):
        assert key in h, key
    # the episode log was written and validated before the update
    log = tmp_path / "run" / "episodes" / "cycle-0000" / "update-000000.parquet"
    assert log.is_file() and "passed" in log.with_suffix(".validation.txt").read_text()
    from omtr.validation.episodes import read_episode_log

    df = read_episode_log(log)
    assert set(df["role"]) == {"actor", "editor", "judge"}
    assert df.loc[df.role == "actor", "reward"].notna().all()
    # beside it, what each step wrote, keyed like the log's rows and with the same spec hashes
    import json

    specs = [json.loads(x) for x in log.with_name("update-000000.specs.jsonl").read_text().splitlines()]
    steps = df[df.role != "judge"]
    assert len(specs) == len(steps)
    by_key = {(s["episode"], s["role"], s["step"]): s for s in specs}
    for r in steps.itertuples():
        s = by_key[(r.episode, r.role, r.step)]
        assert s["spec_hash"] == r.spec_hash and isinstance(s["text"], str)


def test_judge_loss_falls_on_fixed_labelled_data(tmp_path, micro):
    from omtr.inference import prompts as P
    from omtr.rl.trainer import Trainer

    tr = Trainer(_cfg(lr=3e-3), TASKS, tmp_path / "run", env=NoPlanner(), quiet=True, model=micro)
    good = "(define (domain d) (:predicates (p)) (:action a :parameters () :precondition (p) :effect (not (p))))"
    bad = "(define (domain d) (:predicates (p) (:action"
    prompts, labels = [], []
    for t in TASKS[:4]:
        prompts += [P.judge_messages(t, good), P.judge_messages(t, bad)]
        labels += [True, False]
    losses = [tr.judge_step(prompts, labels) for _ in range(25)]
    assert losses[-1] < 0.5 * losses[0], losses
    with torch.no_grad():
        s = tr.models["judge"].judge_scores(prompts)
    assert all((si > 0.5) == y for si, y in zip(s.tolist(), labels))


def test_trainer_cannot_read_references(tmp_path, micro):
    from omtr.rl.trainer import Trainer
    from omtr.tasks.records import Task  # evaluation side: only this test touches it
    from omtr.tasks.training import load_training_tasks

    marker = "zzreferencemarkerzz"
    path = tmp_path / "tasks.jsonl"
    with open(path, "w") as f:
        for t in TASKS[:4]:
            f.write(json.dumps({"id": t.id, "family": t.family, "nl": t.nl,
                                "reference": {"domain": f"(define (domain {marker}))",
                                              "problem": f"(define (problem {marker}))"}}) + "\n")
    tasks = load_training_tasks(path)
    assert all(not hasattr(t, "reference") for t in tasks)
    with pytest.raises(TypeError, match="TrainingTask"):
        Trainer(_cfg(), [Task.__new__(Task)], tmp_path / "x", env=NoPlanner())
    run = tmp_path / "run"
    tr = Trainer(_cfg(validate_logs=True), tasks, run, env=NoPlanner(), quiet=True, model=micro)
    assert tr.run() == "finished"
    for p in run.rglob("*"):
        if p.is_file():
            assert marker.encode() not in p.read_bytes(), p


@pytest.mark.slow
def test_interrupted_and_resumed_equals_uninterrupted(tmp_path):
    """A SIGTERM mid-run writes a checkpoint; --resume then reaches the very state (parameters,
    optimizer, counters, next batch) of a run that was never stopped."""
    from omtr.rl.trainer import Trainer

    cfg = _cfg(cycles=2, updates_per_cycle=2, checkpoint_every_updates=1)
    total = 3
    a = Trainer(cfg, TASKS, tmp_path / "a", env=NoPlanner(), quiet=True)
    assert a.run(max_updates=total) == "paused"

    b = Trainer(cfg, TASKS, tmp_path / "b", env=NoPlanner(), quiet=True)
    step = b.train_step

    def step_then_term(env):  # a real SIGTERM right after the first update, whatever the machine's speed
        out = step(env)
        if b.update == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    b.train_step = step_then_term
    status = b.run(max_updates=total)
    assert status == "stopped"
    done = b.update
    assert done == 1
    assert (tmp_path / "b" / "checkpoints" / "latest").is_file()
    del b
    c = Trainer(cfg, TASKS, tmp_path / "b", env=NoPlanner(), quiet=True, resume=True)
    assert c.update == done
    assert c.run(max_updates=total - done) == "paused"

    sa, sc = a.trainable_state(), c.trainable_state()
    assert sa.keys() == sc.keys()
    diff = [n for n in sa if not torch.equal(sa[n], sc[n])]
    assert not diff, diff[:5]
    assert [t.id for t in a.batch_tasks()] == [t.id for t in c.batch_tasks()]
    assert (a.update, a.episodes_done, a.planner_calls) == (c.update, c.episodes_done, c.planner_calls)
    oa, oc = a.backend.optimizer.state_dict()["state"], c.backend.optimizer.state_dict()["state"]
    assert all(torch.equal(oa[k]["exp_avg"], oc[k]["exp_avg"]) for k in oa)


@pytest.mark.slow
def test_learning_raises_a_toy_verifiable_reward(tmp_path):
    """micro + a toy verifiable reward through the same trainer: the mean reward clearly rises."""
    from omtr.rl.trainer import Trainer

    # the trainable-backbone switch: every output row can move, so the signal is strong and fast
    cfg = _cfg(cycles=1, updates_per_cycle=10, episodes_per_batch=8, samples_per_task=4, advantage="group",
               use_judge=False, use_editor=False, frozen_backbone=False, lr=1e-2, kl_coef=0.0,
               max_new_tokens=16, micro_batch_size=8, temperature=1.0)
    tr = Trainer(cfg, TASKS, tmp_path / "run", env=NoPlanner(), quiet=True)
    assert tr.run() == "finished"
    rewards = [h["reward_actor"] for h in tr.history]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.15, rewards


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2])
def test_one_real_update_through_a_deepspeed_engine_on_cpu(tmp_path, stage, monkeypatch):
    pytest.importorskip("deepspeed")
    from pathlib import Path

    from omtr.rl.trainer import Trainer

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    # the engine picks a free port for its one-process group (a fixed one failed in CI: EADDRINUSE)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    cfg_file = Path(__file__).resolve().parents[1] / "configs" / "deepspeed" / f"zero{stage}_cpu.json"
    tr = Trainer(_cfg(deepspeed=str(cfg_file)), TASKS, tmp_path / "run", env=NoPlanner(), quiet=True)
    assert tr.backend.name == "deepspeed" and tr.backend.engine.zero_optimization_stage() == stage
    # no shared-memory all-reduce op built on a CPU (omtr.rl.distributed.deepspeed_init_distributed)
    from deepspeed.comm import comm as ds_comm

    assert ds_comm.cdb is not None and ds_comm.cdb.shm_comm_op is None
    _perturb(tr)
    before = tr.trainable_state()
    assert tr.run() == "finished"
    after = tr.trainable_state()
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert len(changed) == len(before), [n for n in before if n not in changed][:5]
    assert (tmp_path / "run" / "checkpoints" / "latest").is_file()


def test_the_update_reports_progress_like_the_rollout(tmp_path, micro, monkeypatch, caplog):
    """Items done and tokens/s of the old-log-prob pass and the update (PPO and Judge losses)."""
    import logging

    import omtr.rl.update as U
    from omtr.rl.trainer import Trainer

    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(U, "PROGRESS_EVERY_S", 0.0)
    tr = Trainer(_cfg(), TASKS, tmp_path / "run", env=NoPlanner(), quiet=False, model=micro)
    with caplog.at_level(logging.INFO, logger="omtr.rl.trainer"):
        tr.run()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("update (PPO and Judge losses): ")]
    assert lines, [r.getMessage() for r in caplog.records]
    assert all("tokens/s" in x for x in lines)
    assert "(100%)" in lines[-1] and lines[-1].endswith("(finished)")


def test_an_update_reports_the_skipped_optimizer_steps(tmp_path, micro):
    """The count of optimizer steps skipped for a non-finite gradient reaches the update's metrics
    (and with them MLflow): 0 on a healthy run, the backend's count otherwise."""
    from omtr.rl.trainer import Trainer

    tr = Trainer(_cfg(), TASKS, tmp_path / "run", env=NoPlanner(), quiet=True, model=micro)
    tr.backend.skipped_steps = 2  # as if two steps had been skipped before this run
    assert tr.run() == "finished"
    assert tr.history[-1]["skipped_steps"] == 2.0 and tr.backend.skipped_steps == 2
