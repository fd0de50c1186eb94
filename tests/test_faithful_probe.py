"""The held-out faithful probe (omtr.evaluation.probe) and the trainer's hook for it.

The probe runs a policy on held-out tasks with references and grades every answer with the real
planner and the checker; the scripted policy stands in for a model so the grades are known. The
trainer's hook is run on the micro model (random weights, no GPU): what is under test there is that
the probe's numbers are logged and that a failing probe never stops training.
"""

from __future__ import annotations

import json

import pytest

from omtr.evaluation.probe import FaithfulProbe
from omtr.inference.scripted import ScriptedPolicy
from omtr.solver import SolverPool
from omtr.tasks.generators import generate
from omtr.tasks.records import write_tasks


@pytest.fixture(scope="module")
def tasks():
    return [t.with_given_domain() for t in generate("blocksworld", 4, 6203, split="test", min_objects=3,
                                                       max_objects=5, verify=False)]


@pytest.fixture(scope="module")
def pool():
    with SolverPool(1) as p:
        yield p


def _broken(problem: str) -> str:
    return problem.replace("(:init", "(:init (holding a)", 1)


def _other_goal(problem: str) -> str:
    return problem[:problem.index("(:goal")] + "(:goal (and (holding a))))"


def test_probe_grades_answers_with_the_checker(tasks, pool):
    refs = [t.reference.problem for t in tasks]
    answers = {tasks[0].id: [refs[0]], tasks[1].id: [refs[1]], tasks[2].id: [_other_goal(refs[2])],
               tasks[3].id: ["(define (problem nonsense"]}
    policy = ScriptedPolicy.for_tasks(tasks, answers, scores_by_id={tasks[0].id: 0.9, tasks[1].id: 0.8,
                                                                     tasks[2].id: 0.1, tasks[3].id: 0.5})
    out = FaithfulProbe(tasks)(policy, pool)
    assert out["probe_tasks"] == 4
    assert out["probe_faithful"] == 0.5
    assert out["probe_nontrivial"] == 0.75  # the other goal is solved with a plan, another task
    assert out["probe_drift"] == pytest.approx(1 / 3)
    assert out["probe_judge_auc_fd"] == 1.0  # both faithful specs outscore the unfaithful one


def test_probe_reports_the_share_of_samples_that_are_faithful(tasks, pool):
    """Greedy answers all right, samples right half the time: the greedy rate is 1, the sampled
    rate is what the samples were (3 of 8: task 0's two samples, one of task 1's, none of the rest)."""
    refs = [t.reference.problem for t in tasks]
    answers = {t.id: [r] for t, r in zip(tasks, refs)}
    samples = {tasks[0].id: [refs[0], refs[0]], tasks[1].id: [refs[1], _other_goal(refs[1])],
               tasks[2].id: [_broken(refs[2]), _other_goal(refs[2])], tasks[3].id: ["(define", "(define"]}
    policy = ScriptedPolicy.for_tasks(tasks, answers, samples_by_id=samples)
    out = FaithfulProbe(tasks, samples=2)(policy, pool)
    assert out["probe_faithful"] == 1.0
    assert out["probe_faithful_sampled"] == pytest.approx(3 / 8)
    assert "probe_faithful_sampled" not in FaithfulProbe(tasks)(ScriptedPolicy.for_tasks(tasks, answers), pool)


def test_probe_refuses_tasks_without_references(tasks):
    with pytest.raises(ValueError, match="reference"):
        FaithfulProbe([t.for_training() for t in tasks])
    with pytest.raises(ValueError, match="at least one"):
        FaithfulProbe([])


def test_trainer_logs_the_probe_and_survives_a_failing_one(tmp_path):
    import torch

    from omtr.model import build_model
    from omtr.rl.config import train_profile
    from omtr.rl.trainer import Trainer
    from omtr.tasks.training import TrainingTask

    torch.set_num_threads(1)
    micro = build_model("micro")
    train = [TrainingTask(f"t{i}", "blocksworld", None, f"Put block b{i} on the table.") for i in range(4)]
    seen = []

    def probe(policy, env):
        seen.append((policy, env))
        if len(seen) == 2:
            raise RuntimeError("probe broke")
        return {"probe_faithful": 0.25}

    cfg = train_profile("micro").replace(cycles=1, updates_per_cycle=3, episodes_per_batch=2, max_new_tokens=8,
                                         save_model_every_cycle=False, validate_logs=False, mlflow=False)

    class NoPlanner:
        def solve_many(self, specs):
            from omtr.solver import solve

            return [solve(d, p) for d, p in specs]

    tr = Trainer(cfg, train, tmp_path / "run", env=NoPlanner(), quiet=True, model=micro, probe=probe, probe_every=2)
    assert tr.run() == "finished"
    assert len(seen) == 2  # after update 2 (every 2) and after the last (3)
    assert all(hasattr(p, "generate") for p, _ in seen)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("probe_faithful") for r in rows] == [None, 0.25, None]  # the failing call logs nothing


def test_train_cli_refuses_a_probe_without_references_or_with_training_text(tmp_path, tasks, capsys):
    from omtr.cli import main

    train = tmp_path / "train.jsonl"
    write_tasks(train, [t.for_training() for t in tasks[:2]])
    no_refs = tmp_path / "noref.jsonl"
    write_tasks(no_refs, [t.for_training() for t in tasks[2:]])
    overlap = tmp_path / "overlap.jsonl"
    write_tasks(overlap, tasks[1:])
    for path, why in ((no_refs, "reference"), (overlap, "training task")):
        rc = main(["-q", "train", "--profile", "micro", "--model", "micro", "--tasks", str(train), "--out",
                   str(tmp_path / f"run-{path.stem}"), "--probe", str(path)])
        assert rc != 0
        err = capsys.readouterr()
        assert why in (err.err + err.out)
        assert not (tmp_path / f"run-{path.stem}" / "checkpoints").exists()
