"""The small-model recipe's rules on hand-made numbers: group advantages without cross-task
whitening, dynamic sampling's choice of groups, the Judge gate, the curriculum's schedule, the
whitening guard, the value head's own gradient clip and a timed-out verdict's b = 0."""

from __future__ import annotations

import pytest
from pytest import approx

from omtr.rl import losses as L
from omtr.rl.recipe import Curriculum, JudgeGate, groups_with_signal, object_count
from omtr.tasks.training import TrainingTask


def _task(i: int, n: int | None) -> TrainingTask:
    meta = {} if n is None else {"n_objects": n}
    return TrainingTask(f"t{i}", "blocksworld", "train", f"task {i}", meta)


# ------------------------------------------------------------------ group advantages

def test_group_advantages_are_normalised_within_each_group_not_across_tasks():
    # task a: 1 of 4 samples succeeded; task b: 3 of 4
    rewards = [1, 0, 0, 0, 1, 1, 1, 0]
    groups = ["a"] * 4 + ["b"] * 4
    adv = L.group_advantages([float(r) for r in rewards], groups, scale=True)
    std = (0.25 * 0.75) ** 0.5 + 1e-6  # the estimator adds eps to the spread
    assert adv[:4] == [approx(0.75 / std), approx(-0.25 / std), approx(-0.25 / std), approx(-0.25 / std)]
    assert adv[4:] == [approx(0.25 / std)] * 3 + [approx(-0.75 / std)]
    # each group is zero-mean on its own
    assert sum(adv[:4]) == approx(0.0, abs=1e-9) and sum(adv[4:]) == approx(0.0, abs=1e-9)


def test_a_group_with_equal_rewards_gets_zero_advantages_not_blown_up_noise():
    # an untrained Judge's 0.3 s_J differs by 1e-5 inside a group of failures: no scaling to unit size
    adv = L.group_advantages([0.3, 0.30001, 0.29999, 0.3], ["g"] * 4, scale=True)
    assert max(abs(a) for a in adv) < 1e-4


def test_whitening_guard_centres_a_near_constant_batch_instead_of_scaling_it():
    xs = [0.12, 0.1200004, 0.1199996]
    w = L.whiten(xs)
    assert max(abs(v) for v in w) < 1e-5  # before the guard: values of about +-1.2
    assert L.whiten([1.0, 3.0]) == [approx(-1.0), approx(1.0)]  # a real spread is still whitened


def test_distributed_whitening_has_the_same_guard():
    from omtr.rl.distributed import Collective, whiten

    xs = [0.5, 0.5000001, 0.4999999]
    assert whiten(xs, Collective()) == approx(L.whiten(xs))
    assert max(abs(v) for v in whiten(xs, Collective())) < 1e-5


# ------------------------------------------------------------------ dynamic sampling

def test_groups_with_signal_are_those_whose_returns_differ():
    returns = [("a", 1.0), ("a", 0.0), ("b", 0.0), ("b", 0.0), ("c", 1.0), ("c", 1.0), ("d", 0.4), ("d", 0.6),
               ("e", 1.0)]
    assert groups_with_signal(returns) == {"a", "d"}  # b all fail, c all succeed, e is a single sample


def test_the_trainer_keeps_groups_with_signal_up_to_what_the_batch_needs():
    from omtr.rl.trainer import StepItem, Trainer

    def item(ep, group, role, reward, step=0):
        return StepItem(ep=ep, group=group, role=role, step=step, prompt=[], tokens=[1], old_logprobs=[0.0],
                        outcome="syntax", limited=False, judge_score=None, reward=reward)

    items = [item(0, "g0", "actor", 0.0), item(1, "g0", "actor", 0.0),  # no signal
             item(2, "g1", "actor", 1.0), item(3, "g1", "actor", 0.0),  # actor signal
             item(4, "g2", "actor", 0.0), item(5, "g2", "actor", 0.0),  # editor signal only
             item(4, "g2", "editor", 0.9, 1), item(5, "g2", "editor", -0.1, 1),
             item(6, "g3", "actor", 1.0), item(7, "g3", "actor", 0.0)]
    assert Trainer._groups_with_signal(items, 5) == {"g1", "g2", "g3"}
    assert Trainer._groups_with_signal(items, 2) == {"g1", "g2"}  # rollout order, truncated
    assert Trainer._groups_with_signal(items, 0) == set()


def test_a_group_whose_actor_returns_differ_only_by_the_judges_term_carries_no_signal():
    """R_A = b0 + 0.3 s_J: when every spec of a group got the same outcome score, the Judge's term
    is all the returns vary by; group normalisation would turn that into unit-size advantages, so
    such a group is not trained on (its outcome scores decide, not its returns)."""
    from omtr.rl.trainer import StepItem, Trainer

    def item(ep, group, b0, s_j):
        return StepItem(ep=ep, group=group, role="actor", step=0, prompt=[], tokens=[1], old_logprobs=[0.0],
                        outcome="success", limited=False, judge_score=s_j, reward=b0 + 0.3 * s_j, score=b0)

    items = [item(0, "judge-only", 0.0, 0.9), item(1, "judge-only", 0.0, 0.2),
             item(2, "outcome", 1.0, 0.5), item(3, "outcome", 0.0, 0.5)]
    assert Trainer._groups_with_signal(items, 4) == {"outcome"}


# ------------------------------------------------------------------ the Judge gate

def test_the_judge_gate_opens_only_once_the_judge_separates_success_from_failure():
    gate = JudgeGate(0.6, window=2)
    assert not gate.open  # nothing seen yet
    gate.observe([0.5, 0.5, 0.5], [False, False, False])
    assert not gate.open and gate.auc() is None  # one class only: no AUC
    gate.observe([0.4, 0.6, 0.5, 0.5], [True, False, False, True])
    assert gate.auc() == approx(0.2) and not gate.open  # 2 of 10 pairs (ties count half): below 0.6
    gate.observe([0.9, 0.8, 0.2, 0.1], [True, True, False, False])
    gate.observe([0.7, 0.3], [True, False])
    assert gate.auc() == approx(1.0) and gate.open  # the window forgot the uninformative batches
    restored = JudgeGate(0.6, window=2)
    restored.load_state_dict(gate.state_dict())
    assert restored.open and restored.auc() == approx(1.0)
    assert JudgeGate(0.0).open  # no threshold: always open (the paper's R_A)


# ------------------------------------------------------------------ curriculum

def test_the_curriculum_starts_small_and_rises_a_level_when_the_cap_is_mastered():
    tasks = [_task(0, 1), _task(1, 2), _task(2, 3), _task(3, 4), _task(4, None)]
    cur = Curriculum(tasks, enabled=True, start=2, advance_at=0.5)
    assert cur.levels == [1, 2, 3, 4] and cur.cap == 2
    assert [t.id for t in cur.eligible(tasks)] == ["t0", "t1", "t4"]  # unknown size admitted
    assert not cur.observe([(2, True), (2, False), (2, False), (1, True), (1, True)])  # 1/3 at the cap
    assert cur.cap == 2
    assert cur.observe([(2, True), (2, False), (1, False)])  # 1/2 at the cap
    assert cur.cap == 3 and "t2" in {t.id for t in cur.eligible(tasks)}
    assert not cur.observe([(2, True), (2, True)])  # no rollout at the new cap yet
    assert cur.observe([(3, True)]) and cur.cap == 4 and cur.final
    assert not cur.observe([(4, True)]) and cur.cap == 4  # the last level stays
    again = Curriculum(tasks, enabled=True, start=2)
    again.load_state_dict(cur.state_dict())
    assert again.cap == 4
    off = Curriculum(tasks, enabled=False)
    assert off.eligible(tasks) == tasks and off.final


@pytest.mark.parametrize("plan,cap", [([], 1), (["(stack a b)"], 2)])
def test_the_curriculum_counts_only_what_the_reward_counts_as_success(tmp_path, plan, cap):
    """Under the nontrivial reward a planner's success with an empty plan is not mastery: rollouts
    whose every spec was "solved" that way leave the curriculum at its first level; with a plan it
    moves on. The trainer's own bookkeeping on hand-made episodes (micro's specs never parse)."""
    import torch

    from omtr.inference.episode import Episode, Step
    from omtr.model import build_model
    from omtr.rl.config import train_profile
    from omtr.rl.trainer import Trainer
    from omtr.solver.verdict import Verdict

    torch.set_num_threads(1)
    tasks = [TrainingTask("a1", "blocksworld", None, "Stack a on b.", {"n_objects": 1}),
             TrainingTask("b2", "blocksworld", None, "Stack c on d.", {"n_objects": 2})]
    cfg = train_profile("micro").replace(curriculum=True, curriculum_start=1, curriculum_advance_at=0.5,
                                         use_judge=False, reward="nontrivial", mlflow=False)
    tr = Trainer(cfg, tasks, tmp_path / "run", env=object(), quiet=True, model=build_model("micro"))
    assert tr.curriculum.cap == 1
    solved = Verdict(success=True, plan=list(plan), plan_length=len(plan), stage="done")
    episodes = [Episode(tasks[0], budget=1, steps=[Step("actor", 0, "spec", "(define)", "(define)", solved)])
                for _ in range(4)]
    assert all(e.success for e in episodes)
    out = tr._observe_recipe(episodes, False, 0, 0)
    assert out["curriculum_cap"] == 1.0  # the cap these rollouts ran under
    assert tr.curriculum.cap == cap


@pytest.mark.parametrize("reward,opens", [("binary", True), ("nontrivial", False)])
def test_the_judge_gate_measures_the_judge_against_what_the_reward_counts(tmp_path, reward, opens):
    """The gate compares s_J with the Actor's rewarded success. A Judge that scores specs solved
    with an empty plan high separates the planner's verdicts (AUC 1) but not the nontrivial
    reward's (AUC 0.5), so under that reward its term stays out of R_A. Hand-made episodes
    through the trainer's own bookkeeping (micro's specs never parse)."""
    import torch

    from omtr.inference.episode import Episode, Step
    from omtr.model import build_model
    from omtr.pddl.categories import Category
    from omtr.rl.config import train_profile
    from omtr.rl.trainer import Trainer
    from omtr.solver.verdict import Verdict

    torch.set_num_threads(1)
    tasks = [TrainingTask("a1", "blocksworld", None, "Stack a on b.", {"n_objects": 1})]
    cfg = train_profile("micro").replace(judge_gate_auc=0.6, reward=reward, curriculum=False, mlflow=False)
    tr = Trainer(cfg, tasks, tmp_path / "run", env=object(), quiet=True, model=build_model("micro"))
    with_plan = Verdict(success=True, plan=["(stack a b)"], plan_length=1, stage="done")
    empty = Verdict(success=True, plan=[], plan_length=0, stage="done")
    failed = Verdict(success=False, category=Category("syntax"), message="bad", stage="parse")
    episodes = []
    for verdict, s_j in ((with_plan, 0.2), (with_plan, 0.2), (empty, 0.9), (empty, 0.9), (failed, 0.1), (failed, 0.1)):
        step = Step("actor", 0, "spec", "(define)", "(define)", verdict)
        step.judge_score = s_j
        episodes.append(Episode(tasks[0], budget=1, steps=[step]))
    out = tr._observe_recipe(episodes, False, 0, 0)
    assert out["judge_gate_auc"] == pytest.approx(1.0 if reward == "binary" else 0.5)
    assert tr.judge_gate.open is opens


def test_the_curriculum_starts_at_the_smallest_level_when_every_task_is_larger():
    cur = Curriculum([_task(0, 5), _task(1, 3)], enabled=True, start=2)
    assert cur.cap == 3
    assert object_count(_task(9, 7)) == 7 and object_count(_task(9, None)) is None


# ------------------------------------------------------------------ the value head's clip

def test_the_value_loss_does_not_shrink_the_policy_step():
    """TorchBackend clips the policy's parameters and the value head apart: a huge value gradient
    leaves the policy's (already small) gradient as it is."""
    import torch
    from torch import nn

    from omtr.rl.config import TrainConfig
    from omtr.rl.engine import TorchBackend, TrainModules

    torch.manual_seed(0)
    policy = nn.Linear(3, 1, bias=False)
    value = nn.Linear(3, 2)
    mods = TrainModules({"shared": policy}, value)
    cfg = TrainConfig(lr=1.0, max_grad_norm=1.0, value_lr=1.0)
    be = TorchBackend(mods, cfg)
    x = torch.ones(1, 3)
    be.zero_grad()
    (0.1 * policy(x).sum() + 1e4 * value(x).pow(2).sum() + 1e4 * value(x).sum()).backward()
    before = policy.weight.detach().clone()
    grad = policy.weight.grad.detach().clone()
    norm = be.step()
    assert norm == approx(float(grad.norm()))
    # SGD-like first Adam step moves each weight by lr * sign: the direction is the policy's own
    assert torch.allclose(before - policy.weight.detach(), torch.sign(grad), atol=1e-4)
    assert float(value.weight.grad.norm()) <= 1.0 + 1e-5  # the value head was clipped on its own


# ------------------------------------------------------------------ config

def test_recipe_settings_are_checked_and_the_paper_has_no_kl_and_zero_for_time_outs():
    from omtr.config import ConfigError
    from omtr.rl.config import TrainConfig, train_profile

    paper = train_profile("paper")
    assert paper.kl_coef == 0.0 and paper.limited_reward == "zero" and paper.judge_gate_auc == 0.0
    with pytest.raises(ConfigError, match="samples_per_task"):
        TrainConfig(dynamic_sampling=True, samples_per_task=1)
    with pytest.raises(ConfigError, match="limited_reward"):
        TrainConfig(limited_reward="maybe")
    with pytest.raises(ConfigError, match="judge_gate_auc"):
        TrainConfig(judge_gate_auc=1.5)
    with pytest.raises(ConfigError, match="rollout_batch_size=none"):
        train_profile("small").with_overrides(["rollout_batch_size=0"])
    assert train_profile("small").with_overrides(["rollout_batch_size=none"]).rollout_batch_size is None
    small = train_profile("small")
    # one task's samples at a time: the rollout's keys and values bound (the whole omtr train under 3 GB)
    assert small.rollout_batch_size == small.samples_per_task
    assert small.advantage == "group" and small.samples_per_task >= 4 and small.dynamic_sampling
    assert small.judge_gate_auc > 0.5 and small.curriculum and not small.whiten_advantages
    assert small.ppo_epochs * small.minibatches > 1  # the clip can act
    # empty plans and initial states no plan reaches earn nothing in the recipe; the paper: the bare verdict
    assert small.reward == "supported" and paper.reward == "binary" and paper.judge_target == "verdict"


# ------------------------------------------------------------------ through the trainer (micro)

def test_the_trainer_skips_groups_without_signal_and_rolls_out_replacements(tmp_path):
    """micro (a random tiny model) with a hand-made score: tasks s* get a reward that varies by
    sample, tasks z* a constant one. Dynamic sampling trains only on s* groups, rolls out replacements
    for a z* group, and logs the z* rows rewarded but unadvantaged; the curriculum, which starts at
    1 object, never admits the 2-object task, since micro's specs never reach a plan."""
    import pandas as pd
    import torch

    from omtr.model import build_model
    from omtr.rl.config import train_profile
    from omtr.rl.rewards import register_outcome_score
    from omtr.rl.trainer import Trainer

    torch.set_num_threads(1)

    @register_outcome_score("toy_by_task")
    def toy_by_task(completions, *, verdicts, token_ids, task_ids, **_):
        return [0.0 if t.startswith("z") else float(sum(ids) % 2) for t, ids in zip(task_ids, token_ids)]

    class NoPlanner:
        def solve_many(self, specs):
            from omtr.solver import solve

            return [solve(d, p) for d, p in specs]

    tasks = [TrainingTask("z0", "blocksworld", None, "Stack a on b.", {"n_objects": 1}),
             TrainingTask("s1", "blocksworld", None, "Stack c on d.", {"n_objects": 1}),
             TrainingTask("s3", "blocksworld", None, "Stack g on h.", {"n_objects": 2})]
    cfg = train_profile("micro").replace(
        cycles=1, updates_per_cycle=2, episodes_per_batch=8, samples_per_task=4, advantage="group",
        whiten_advantages=False, dynamic_sampling=True, dynamic_sampling_rounds=3, curriculum=True,
        curriculum_start=1, curriculum_advance_at=0.01, judge_gate_auc=0.6, judge_items_per_update=3,
        max_new_tokens=9, max_repairs=0,
        reward="toy_by_task", save_model_every_cycle=False, validate_logs=True, mlflow=False, seed=4)
    tr = Trainer(cfg, tasks, tmp_path / "run", env=NoPlanner(), quiet=True, model=build_model("micro"))
    assert {t.id for t in tr.curriculum.eligible(tasks)} == {"z0", "s1"}
    assert tr.run() == "finished"
    h1, h2 = tr.history
    # z0's group has no signal: a replacement round ran (more groups rolled out than the batch's 2)
    assert h1["groups_with_signal"] <= 2 and h1["groups_rolled_out"] > 2
    assert h1["judge_gate_open"] == 0.0  # no Judge separation seen before the first update
    assert h1["curriculum_cap"] == 1.0
    logs = sorted((tmp_path / "run" / "episodes").rglob("*.parquet"))
    df = pd.concat(pd.read_parquet(p) for p in logs)
    actor = df[df.role == "actor"]
    assert actor.episode.is_unique  # replacement rounds are numbered on, not over
    z = actor[actor.task_id == "z0"]
    trained = actor[actor.advantage.notna()]
    assert not z.empty and z.advantage.isna().all() and z.reward.notna().all()  # rewarded, logged, not trained
    assert not trained.empty and set(trained.task_id) == {"s1"}
    assert "s3" not in set(df.task_id) and h2["curriculum_cap"] == 1.0  # above the cap: never rolled out
    # every trained group is zero-mean (group advantages, no whitening across tasks)
    sums = trained.assign(g=trained.episode // 4).groupby("g").advantage.sum()
    assert (sums.abs() < 1e-6).all()


def test_the_judge_trains_on_a_balanced_subset_of_the_batchs_specs():
    import random

    from omtr.rl.recipe import balanced_sample
    from omtr.rl.trainer import JudgeItem

    items = [JudgeItem([], i < 3) for i in range(20)]  # 3 accepted, 17 rejected
    got = balanced_sample(items, 8, random.Random(0))
    assert len(got) == 8 and sum(j.label for j in got) == 3  # every accepted spec, rejected ones fill up
    assert [items.index(j) for j in got] == sorted(items.index(j) for j in got)  # original order
    even = [JudgeItem([], i % 2 == 0) for i in range(20)]
    got = balanced_sample(even, 8, random.Random(1))
    assert sum(j.label for j in got) == 4 and len(got) == 8
    assert balanced_sample(items[:5], 8, random.Random(0)) == items[:5]
