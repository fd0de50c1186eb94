"""The Judge-negatives benchmark's two additions: rescoring evaluations already run (the prompt the
episode loop gave the Judge, solved first steps only) and the rollout under the names rule alone
(the actor's decoder flags lowered for it and put back)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from bench_helpers import load_benchmark  # noqa: E402

DOMAIN = "(define (domain d) (:predicates (p ?x)) (:action a :parameters (?x) :precondition (p ?x) :effect (not (p ?x))))"


def test_evaluation_items_rebuild_the_judges_prompt_of_each_solved_first_step(tmp_path):
    from omtr.inference import prompts as P

    bench = load_benchmark("judge_negatives")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(json.dumps(r) for r in [
        {"id": "bw-1", "family": "blocksworld", "nl": "Block a is clear.", "domain": DOMAIN},
        {"id": "gen-g-1", "family": "gripper", "nl": "Ball b is in room r.", "domain": DOMAIN}]) + "\n")
    problem = "(define (problem x) (:domain d) (:objects a) (:init (p a)) (:goal (not (p a))))"
    for name, rows in (("scoped", [("bw-1", True, True), ("gen-g-1", True, True)]),
                       ("names", [("bw-1", True, False), ("gen-g-1", False, False)])):
        d = tmp_path / name
        d.mkdir()
        (d / "traces.jsonl").write_text("\n".join(json.dumps(
            {"id": tid, "kind": "planning", "faithful": {"faithful": faithful},
             "steps": [{"verdict": {"success": solved}, "domain": DOMAIN, "problem": problem, "text": problem}]})
            for tid, solved, faithful in rows) + "\n")
    items = bench.evaluation_items(str(tasks), [str(tmp_path / "scoped"), str(tmp_path / "names")])
    # the unsolved answer is left out; sets and labels come from the task and the checker's grade
    assert [(i[0], i[1], i[3]) for i in items] == [("bw-1", "planbench/blocksworld", True),
                                                    ("gen-g-1", "generated/gripper", True),
                                                    ("bw-1", "planbench/blocksworld", False)]
    view = SimpleNamespace(nl="Block a is clear.", domain=DOMAIN)
    want = P.judge_messages(view, problem, checks=True, domain=DOMAIN, problem=problem)
    assert items[0][2] == want and "Block a is clear." in want[1]["content"] and problem in want[1]["content"]
    assert P.JUDGE_CHECKS in want[1]["content"]  # as the loop builds it for a model with judge_checks
    plain = bench.evaluation_items(str(tasks), [str(tmp_path / "scoped")], checks=False)
    assert plain[0][2] == P.judge_messages(view, problem)


def test_loose_episodes_lower_the_statement_rules_for_that_rollout_only():
    from omtr.config import ModelConfig

    bench = load_benchmark("judge_negatives")
    actor = SimpleNamespace(cfg=ModelConfig(backbone="micro"))
    seen = []

    def policy():
        seen.append((actor.cfg.statement_facts, actor.cfg.statement_predicates, actor.cfg.init_invariants,
                     actor.cfg.statement_objects))
        raise RuntimeError("no engine here")

    tr = SimpleNamespace(models={"actor": actor}, _rollout_policy=policy, cfg=SimpleNamespace(temperature=0.7, top_p=1.0))
    with pytest.raises(RuntimeError, match="no engine"):
        bench.loose_episodes(tr, [], None, 2, 16, 0)
    assert seen == [(False, False, False, True)]  # the names rule stays, the rest is off
    assert actor.cfg == ModelConfig(backbone="micro")  # put back, even after a failure
