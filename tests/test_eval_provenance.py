"""What an evaluation records about itself, and the refusals built on it: ``--resume`` under other
settings, and ``compare`` over other tasks, budgets or solver configs; paired differences.

Real planner (SolverPool), real checker; the policies are the oracle, a mutant and file: replays."""

from __future__ import annotations

import json

import pytest

from omtr.cli import main
from omtr.config import SolverConfig
from omtr.evaluation.metrics import paired_differences
from omtr.evaluation.provenance import RunMismatch
from omtr.evaluation.report import CompareError, compare
from omtr.evaluation.run import EvalConfig, evaluate
from omtr.inference.registry import make_policy
from omtr.solver import SolverPool
from omtr.tasks.generators import generate
from omtr.tasks.records import write_tasks

FAST = EvalConfig(bootstrap=0, validate_log=False, figures=False)


@pytest.fixture(scope="module")
def pool():
    with SolverPool(1) as p:
        yield p


@pytest.fixture(scope="module")
def tasks():
    return generate("gripper", 4, 11, verify=False)


def test_metrics_carry_provenance_and_identical_counts(tasks, pool, tmp_path):
    f = tmp_path / "tasks.jsonl"
    write_tasks(f, tasks)
    m = evaluate(tasks, make_policy("oracle", tasks=tasks), tmp_path / "o", env=pool, config=FAST,
                 run_info={"tasks_file": str(f), "model": None, "backend": None})
    pv = m["provenance"]
    assert {"policy", "backend", "model", "budget", "solver", "tools", "omtr", "tasks", "eval"} <= set(pv)
    assert pv["policy"] == "oracle" and pv["budget"] == 6
    assert pv["solver"]["search"] == SolverConfig().search and pv["solver"]["time_limit_s"] == 60.0
    assert pv["tools"]["fast_downward"]["package"] and pv["tools"]["fast_downward"]["revision"]
    assert pv["tools"]["val"]["package"] and pv["tools"]["val"]["version"]
    assert pv["omtr"]["version"]
    import hashlib

    assert pv["tasks"]["sha256"] == hashlib.sha256(f.read_bytes()).hexdigest() and pv["tasks"]["count"] == 4
    assert m["identical_to_reference"] == 4  # the oracle copies every reference
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    assert run["key"] == {"policy": "oracle", "budget": 6, "solver": pv["solver"]}

    # a copy with a comment and other layout is still identical; a mutant is not
    f2 = tmp_path / "copy.jsonl"
    f2.write_text("".join(json.dumps({"id": t.id, "domain": "; copied\n" + t.reference.domain.upper(),
                                      "problem": t.reference.problem.replace(" ", "  ")}) + "\n" for t in tasks))
    m = evaluate(tasks, make_policy(f"file:{f2}", tasks=tasks), tmp_path / "copy", env=pool, config=FAST)
    assert m["identical_to_reference"] == 4
    m = evaluate(tasks, make_policy("mutant:drop_goal_atom", tasks=tasks), tmp_path / "mut", env=pool, config=FAST)
    assert m["identical_to_reference"] == 0


def test_resume_refuses_other_policy_budget_or_solver_config(tasks, pool, tmp_path):
    out = tmp_path / "run"
    evaluate(tasks, make_policy("oracle", tasks=tasks), out, env=pool, config=FAST, policy_name="oracle")
    before = (out / "traces.jsonl").read_text()
    with pytest.raises(RunMismatch, match=r"another budget: budget differs \(6 there, 3 now\)"):
        evaluate(tasks, make_policy("oracle", tasks=tasks), out, env=pool, policy_name="oracle", resume=True,
                 config=EvalConfig(budget=3, bootstrap=0, validate_log=False, figures=False))
    with pytest.raises(RunMismatch, match="another policy"):
        evaluate(tasks, make_policy("mutant:drop_goal_atom", tasks=tasks), out, env=pool, config=FAST,
                 policy_name="mutant:drop_goal_atom", resume=True)
    with pytest.raises(RunMismatch, match=r"solver config differs \(time_limit_s 60.0 there, 5.0 now\)"):
        evaluate(tasks, make_policy("oracle", tasks=tasks), out, env=pool, config=FAST, policy_name="oracle",
                 resume=True, solver_config=SolverConfig(time_limit_s=5.0))
    assert (out / "traces.jsonl").read_text() == before  # nothing lost
    m = evaluate(tasks, make_policy("oracle", tasks=tasks), out, env=pool, config=FAST, policy_name="oracle", resume=True)
    assert m["resumed"] == 4


def test_resume_refusal_from_the_command_line_is_one_line(tasks, tmp_path, capsys):
    f = tmp_path / "tasks.jsonl"
    write_tasks(f, tasks)
    base = ["-q", "evaluate", "--policy", "oracle", "--tasks", str(f), "--workers", "1", "--no-report",
            "--no-episode-log", "--bootstrap", "0", "--out", str(tmp_path / "o")]
    assert main(base) == 0
    capsys.readouterr()
    assert main(base + ["--resume", "--time-limit", "7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "solver config differs" in err[0] and "time_limit_s" in err[0]


def _run(tasks, pool, out, policy="oracle", **kw):
    cfg = EvalConfig(**{"bootstrap": 0, "validate_log": False, "figures": False, **kw})
    evaluate(tasks, make_policy(policy, tasks=tasks, budget=cfg.budget), out, env=pool, config=cfg, policy_name=policy)
    return out


def test_compare_refuses_other_tasks_budgets_and_solver_configs(tasks, pool, tmp_path):
    a = _run(tasks, pool, tmp_path / "a")
    with pytest.raises(CompareError, match="different task sets"):
        compare([a, _run(tasks[:3], pool, tmp_path / "fewer")])
    with pytest.raises(CompareError, match=r"different budgets \(K=6 vs K=2\)"):
        compare([a, _run(tasks, pool, tmp_path / "k2", budget=2)])
    cfg = EvalConfig(bootstrap=0, validate_log=False, figures=False)
    evaluate(tasks, make_policy("oracle", tasks=tasks), tmp_path / "lama", env=pool, config=cfg,
             solver_config=SolverConfig(search="astar(blind())"))
    with pytest.raises(CompareError, match=r"different solver configs \(search 'lama-first' vs 'astar\(blind\(\)\)'\)"):
        compare([a, tmp_path / "lama"])
    html, md = compare([a, _run(tasks, pool, tmp_path / "m", policy="mutant:drop_goal_atom")])
    assert "Differences against oracle" in md and "over 4 shared tasks" in md


def _rec(id_, success, faithful=True, calls=1):
    return {"id": id_, "kind": "planning", "success": success, "actor_success": success and calls == 1,
            "planner_calls": calls, "steps": [{"verdict": {"success": success, "category": None if success else "syntax"}}],
            "faithful": {"reference": True, "checked": success, "faithful": faithful if success else None}}


def test_paired_differences_on_a_hand_made_pair_of_runs():
    # 10 shared tasks: A solves 0-5, all faithful; B solves 0-8 and drifts on 0 and 8
    a = [_rec(str(i), i < 6) for i in range(10)] + [_rec("only-a", True)]
    b = [_rec(str(i), i < 9, faithful=i not in (0, 8), calls=2) for i in range(10)]
    d = paired_differences(a, b, bootstrap=2000, seed=1)
    assert (d["shared"], d["only_a"], d["only_b"]) == (10, 1, 0)
    assert d["success"]["diff"] == pytest.approx(0.3) and d["faithful"]["diff"] == pytest.approx(0.1)
    assert d["drift"]["diff"] == pytest.approx(2 / 9, abs=1e-4) and d["calls"]["diff"] == pytest.approx(1.0)
    lo, hi = d["success"]["ci"]
    # every task B loses is one A loses too: each resample's difference is >= 0
    assert 0.0 <= lo < 0.3 < hi <= 1.0
    assert d["calls"]["ci"] == [1.0, 1.0]  # B spends one more call on every task
    lo, hi = d["faithful"]["ci"]
    assert lo < 0 < 0.1 < hi  # task by task B gains 6 and 7 but loses 0: the interval spans zero


def test_paired_differences_of_plan_runs():
    a = [{"id": str(i), "kind": "plan", "valid": i < 2} for i in range(6)]
    b = [{"id": str(i), "kind": "plan", "valid": i < 5} for i in range(6)]
    d = paired_differences(a, b, bootstrap=500)
    assert d["shared"] == 0 and d["plan_valid"]["diff"] == 0.5 and d["plan_valid"]["shared"] == 6
    lo, hi = d["plan_valid"]["ci"]
    assert 0.0 < lo <= 0.5 <= hi <= 1.0  # B is never worse task by task: the whole interval is above zero
