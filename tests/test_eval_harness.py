"""omtr evaluate's harness: the oracle scores 100%, every mutant kind reports its drift category,
file: replays attempts in order, a killed run resumes — all through the real loop and planner."""

from __future__ import annotations

import json

import pytest

from omtr.evaluation.harness import HarnessError, answer_text, expected_category, from_file
from omtr.evaluation.run import EvalConfig, evaluate
from omtr.faithfulness.mutators import FAITHFUL, MUTATORS
from omtr.inference.registry import UnknownPolicy, make_policy
from omtr.solver import SolverPool
from omtr.tasks.generators import generate
from omtr.tasks.planbench import import_planbench
from omtr.tasks.planbench_data import shipped_root


@pytest.fixture(scope="module")
def pool():
    with SolverPool(2) as p:
        yield p


@pytest.fixture(scope="module")
def tasks():
    pb = import_planbench(shipped_root(), ["blocksworld_3", "logistics", "depots", "mystery_blocksworld_3"])
    by_fam: dict[str, list] = {}
    for t in pb:
        by_fam.setdefault(t.family, []).append(t)
    picked = [t for ts in by_fam.values() for t in ts[:3]]
    return picked + generate("gripper", 3, 0, verify=False)


FAST = EvalConfig(bootstrap=200, validate_log=False, figures=False)


def test_oracle_is_perfect_on_every_family(tasks, pool, tmp_path):
    policy = make_policy("oracle", tasks=tasks)
    m = evaluate(tasks, policy, tmp_path, env=pool, config=FAST, policy_name="oracle")
    assert (m["success"], m["faithful"], m["drift"], m["calls"]) == (1.0, 1.0, 0.0, 1.0)
    assert set(m["families"]) == {"planbench/blocksworld_3", "planbench/logistics", "planbench/depots",
                                  "planbench/mystery_blocksworld_3", "gripper"}
    assert m["identical_to_reference"] == len(tasks)
    for b in m["families"].values():
        assert b["success"]["value"] == 1.0 and b["faithful"]["value"] == 1.0 and b["calls"]["value"] == 1.0
    lines = [json.loads(x) for x in (tmp_path / "traces.jsonl").read_text().splitlines()]
    assert len(lines) == len(tasks) and all(r["faithful"]["checked"] for r in lines)


def test_oracle_with_the_full_checker_is_still_faithful(tasks, pool, tmp_path):
    cfg = EvalConfig(bootstrap=0, validate_log=False, figures=False, full_check=True)
    few = tasks[::4]
    m = evaluate(few, make_policy("oracle", tasks=few), tmp_path, env=pool, config=cfg)
    assert m["faithful"] == 1.0
    lines = [json.loads(x) for x in (tmp_path / "traces.jsonl").read_text().splitlines()]
    assert not any(r["faithful"].get("identical") for r in lines)


DRIFT_KINDS = [m.name for m in MUTATORS if m.expected != FAITHFUL and "+" not in m.name]


@pytest.mark.parametrize("kind", DRIFT_KINDS)
def test_each_mutant_reports_its_expected_drift_category(kind, tasks, pool, tmp_path):
    few = [t for t in tasks if t.family in ("blocksworld", "gripper", "logistics")]
    policy = make_policy(f"mutant:{kind}", tasks=few)
    m = evaluate(few, policy, tmp_path, env=pool, config=FAST, policy_name=f"mutant:{kind}")
    cats = m["overall"]["drift_categories"]
    expected = expected_category(kind)
    solved_d = m["overall"]["drift"]["k"]
    # every mutant the planner still solves drifts, and the first finding is the mutator's category
    assert solved_d == m["overall"]["drift"]["n"], (kind, m["overall"]["drift"])
    if solved_d:
        assert list(cats) == [expected], (kind, cats)
    assert m["overall"]["calls"]["value"] == 1.0  # one attempt per task: no repairs to spend


def test_meaning_preserving_mutants_stay_faithful(tasks, pool, tmp_path):
    few = [t for t in tasks if t.family in ("blocksworld", "logistics")][:4]
    m = evaluate(few, make_policy("mutant:rename_permute_reorder", tasks=few), tmp_path, env=pool, config=FAST)
    assert m["success"] == 1.0 and m["faithful"] == 1.0 and m["drift"] == 0.0


def test_file_policy_replays_attempts_in_order_and_stops_at_the_first_success(tasks, pool, tmp_path):
    a, b = tasks[0], tasks[1]
    broken = a.reference.domain.replace("(:predicates", "(:predicates (", 1)
    f = tmp_path / "theirs.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in [
        {"id": a.id, "domain": broken, "problem": a.reference.problem},
        {"id": a.id, "domain": a.reference.domain, "problem": a.reference.problem},
        {"id": a.id, "domain": a.reference.domain, "problem": a.reference.problem},  # never needed
        {"id": b.id, "domain": broken, "problem": b.reference.problem},
        {"id": "not-a-task", "domain": "x", "problem": "y"},
    ]) + "\n")
    policy = make_policy(f"file:{f}", tasks=[a, b])
    m = evaluate([a, b], policy, tmp_path / "out", env=pool, config=FAST)
    recs = {r["id"]: r for r in map(json.loads, (tmp_path / "out" / "traces.jsonl").read_text().splitlines())}
    assert recs[a.id]["success"] and recs[a.id]["planner_calls"] == 2
    assert recs[a.id]["steps"][0]["verdict"]["category"] == "syntax"
    assert not recs[b.id]["success"] and recs[b.id]["planner_calls"] == 1  # its only attempt
    assert m["calls"] == 1.5 and m["success"] == 0.5


def test_file_policy_routes_by_id_warns_counts_and_scores(tasks, pool, tmp_path, caplog):
    """Two tasks with one NL text keep their own attempts; lines beyond K, unknown ids and tasks
    without attempts are warned about and counted; given scores become the Judge's pooled AUC."""
    import dataclasses

    a, b, c = tasks[0], tasks[1], tasks[2]
    twin = dataclasses.replace(b, id="twin-of-a", nl=a.nl)  # same NL text as a, b's reference
    broken = a.reference.domain.replace("(:predicates", "(:predicates (", 1)
    f = tmp_path / "theirs.jsonl"
    lines = [
        {"id": twin.id, "domain": b.reference.domain, "problem": b.reference.problem, "score": 0.2},
        {"id": a.id, "domain": broken, "problem": a.reference.problem, "score": 0.1},
        {"id": a.id, "domain": a.reference.domain, "problem": a.reference.problem, "score": 0.9},
        {"id": a.id, "domain": a.reference.domain, "problem": a.reference.problem},  # 3rd: beyond K=2
        {"id": "nobody", "domain": "x", "problem": "y"},
        {"id": "nobody", "domain": "x", "problem": "y"},
    ]
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    three = [a, twin, c]
    cfg = EvalConfig(budget=2, bootstrap=100, validate_log=False, figures=False)
    with caplog.at_level("WARNING", logger="omtr.evaluation.harness"):
        policy = make_policy(f"file:{f}", tasks=three, budget=2)
    warned = caplog.text
    assert "beyond the budget of 2" in warned and "not in the task file" in warned and "no attempt" in warned
    m = evaluate(three, policy, tmp_path / "out", env=pool, config=cfg)
    recs = {r["id"]: r for r in map(json.loads, (tmp_path / "out" / "traces.jsonl").read_text().splitlines())}
    # routed by id: a's attempts went to a (broken, then fixed), the twin got b's spec
    assert recs[a.id]["planner_calls"] == 2 and recs[a.id]["success"]
    assert recs[twin.id]["planner_calls"] == 1 and recs[twin.id]["success"]
    assert recs[twin.id]["problem"].strip() == b.reference.problem.strip()
    assert not recs[c.id]["success"] and recs[c.id]["steps"][0]["verdict"]["category"] == "syntax"
    pf = m["policy_file"]
    assert pf["beyond_budget"] == {"attempts": 1, "tasks": 1, "ids": [a.id]}
    assert pf["unknown_ids"]["lines"] == 2 and pf["unknown_ids"]["ids"] == ["nobody"]
    assert pf["no_attempt"]["ids"] == [c.id] and pf["scored_attempts"] == 3
    assert [s["judge_score"] for s in recs[a.id]["steps"]] == [0.1, 0.9]
    # pooled: a's fixed spec and the twin's spec (its own reference) are F; a's broken one is U
    j = m["overall"]["judge"]
    assert j["pooled"]["F"]["n"] == 2 and j["pooled"]["U"]["n"] == 1  # a's broken attempt; c has no score


def test_file_policy_takes_problem_only_attempts_and_rejects_bad_lines(tasks, tmp_path):
    a = tasks[0]
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"id": a.id, "problem": a.reference.problem}) + "\n")
    policy = from_file(f, [a])
    assert policy.attempts[a.id] == [(None, a.reference.problem)] and policy.report["problem_only_attempts"] == 1
    assert answer_text(None, a.reference.problem).count("```pddl") == 1
    f.write_text(json.dumps({"id": a.id, "problem": "(define)"}) + "\n" + json.dumps({"id": a.id, "problem": "x",
                                                                                      "score": 3}) + "\n")
    with pytest.raises(HarnessError, match=r"p\.jsonl:2: .*'score' must be a number from 0 to 1"):
        from_file(f, [a])
    f.write_text(json.dumps({"id": "zzz", "problem": "x"}) + "\n")
    with pytest.raises(HarnessError, match="no line names a task of the task file"):
        from_file(f, [a])
    f.write_text(json.dumps([1, 2]) + "\n")
    with pytest.raises(HarnessError, match=r"p\.jsonl:1: expected a JSON object"):
        from_file(f, [a])


def test_file_policy_errors_are_one_sentence(tasks, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(HarnessError, match="not valid JSON"):
        from_file(bad, tasks)
    with pytest.raises(HarnessError, match="no such file"):
        from_file(tmp_path / "missing.jsonl", tasks)
    with pytest.raises(HarnessError, match="unknown mutator"):
        make_policy("mutant:nope", tasks=tasks)
    with pytest.raises(UnknownPolicy, match="unknown policy"):
        make_policy("gpt-9", tasks=tasks)


def test_a_killed_run_resumes_without_repeating_finished_tasks(tasks, pool, tmp_path):
    policy = make_policy("oracle", tasks=tasks)

    class Kill(Exception):
        pass

    seen = []

    def die_after_four(rec):
        seen.append(rec["id"])
        if len(seen) == 4:
            raise Kill

    with pytest.raises(Kill):
        evaluate(tasks, policy, tmp_path, env=pool, config=FAST, on_record=die_after_four)
    traces = tmp_path / "traces.jsonl"
    with open(traces, "a") as fh:
        fh.write('{"id": "half a line')  # a kill mid-write
    first = [json.loads(x)["id"] for x in traces.read_text().splitlines()[:4]]
    rest = []
    m = evaluate(tasks, make_policy("oracle", tasks=tasks), tmp_path, env=pool, config=FAST, resume=True,
                 on_record=lambda r: rest.append(r["id"]))
    assert m["resumed"] == 4 and not set(first) & set(rest)
    ids = [json.loads(x)["id"] for x in traces.read_text().splitlines()]
    assert sorted(ids) == sorted(t.id for t in tasks) and m["success"] == 1.0


def test_generating_policies_see_only_the_nl_task(tasks, pool, tmp_path):
    """The loop's prompts carry no reference PDDL, even for a harness policy (it finds its answer by id)."""
    from omtr.policy import Generation

    seen = []

    class Spy:
        uses_judge = False

        def generate(self, role, prompts, sampling, *, stop_when=None):
            seen.extend(prompts)
            return [Generation(text="") for _ in prompts]

        def judge(self, prompts):
            return [0.5] * len(prompts)

    few = tasks[:3]
    evaluate(few, Spy(), tmp_path, env=pool, config=EvalConfig(budget=2, bootstrap=0, validate_log=False, figures=False))
    text = json.dumps(seen)
    for t in few:
        assert t.reference.problem.strip()[:60] not in text
    assert answer_text("(define (domain d))", "(define (problem p))").count("```pddl") == 2


def test_transfer_tasks_are_scored_by_the_task_suites_scorers(pool, tmp_path):
    from omtr.tasks.transfer import BENCHMARKS

    tasks = []
    for name, n in (("prontoqa", 3), ("trip", 2), ("calendar", 2)):
        b = BENCHMARKS[name]
        tasks += b.to_tasks(b.generate(n, 1))
    m = evaluate(tasks, make_policy("oracle", tasks=tasks), tmp_path / "oracle", env=pool, config=FAST)
    assert m["transfer"]["overall"]["exact_match"]["value"] == 1.0 and m["success"] is None
    assert set(m["transfer"]["families"]) == {"prontoqa", "natural_plan_trip", "natural_plan_calendar"}
    wrong = tmp_path / "answers.jsonl"
    wrong.write_text("".join(json.dumps({"id": t.id, "answer": "I do not know"}) + "\n" for t in tasks[:4]))
    m = evaluate(tasks, make_policy(f"file:{wrong}", tasks=tasks), tmp_path / "file", env=pool, config=FAST)
    t = m["transfer"]["overall"]
    assert t["exact_match"]["value"] == 0.0 and t["answered"] == 4 and t["tasks"] == 7
