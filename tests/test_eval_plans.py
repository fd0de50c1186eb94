"""Plan generation (PlanBench's protocol): the LLM's NL plan is read back with PlanBench's templates
and checked by the real VAL against the reference domain and problem.

The LLM is a scripted backend (a stand-in for SmolLM2 or a served model: what is tested is the
reading and the scoring, not the model)."""

from __future__ import annotations

import json

import pytest

from omtr.evaluation.plans import PlanPolicyError, plan_complete, read_plan, render_plan
from omtr.evaluation.run import EvalConfig, evaluate
from omtr.inference.registry import make_policy
from omtr.policy import Generation
from omtr.solver import SolverPool
from omtr.tasks.generators import generate
from omtr.tasks.planbench import import_planbench
from omtr.tasks.planbench_data import shipped_root


@pytest.fixture(scope="module")
def tasks():
    picked = []
    for cfg in ("blocksworld", "mystery_blocksworld", "logistics", "depots"):
        picked += [t for t in import_planbench(shipped_root(), [cfg]) if t.meta.get("gold_plan")][:2]
    return picked


class Planner:
    """Answers each task with its gold plan in PlanBench's NL (numbered), or a wrong plan for ``wrong`` ids."""

    name = "scripted"

    def __init__(self, tasks, wrong=()):
        self.tasks, self.wrong, self.prompts = tasks, set(wrong), []

    def chat(self, prompts, sampling, *, stop_when=None, grammar=False):
        out = []
        for p in prompts:
            self.prompts.append(p)
            t = next(t for t in self.tasks if t.nl in p[-1]["content"])
            gold = list(t.meta["gold_plan"])
            plan = gold[:-1] if t.id in self.wrong else gold  # a plan one step short misses the goal
            nl = render_plan(plan, t).splitlines()
            out.append(Generation(text="Here is my plan:\n[PLAN]\n" + "\n".join(f"{i}. {x}." for i, x in enumerate(nl, 1))
                                  + "\n[PLAN END]\nI hope this helps."))
        return out


def test_nl_plans_read_back_into_pddl_actions(tasks):
    for t in tasks:
        gold = [a.lower() for a in t.meta["gold_plan"]]
        plan, skipped = read_plan(render_plan(gold, t) + "\nThat is all.", t)
        assert plan == gold and skipped == 1, t.id
    t = tasks[0]
    plan, skipped = read_plan("1. (" + gold_first(t) + ")\n- nonsense line", t)
    assert plan == ["(" + gold_first(t) + ")"] and skipped == 1


def gold_first(t):
    return t.meta["gold_plan"][0].strip("()")


def test_plan_policy_is_scored_by_val_on_the_reference(tasks, tmp_path):
    wrong = {tasks[1].id, tasks[4].id}
    be = Planner(tasks, wrong=wrong)
    extra = generate("gripper", 1, 0, verify=False)  # no NL action templates: left out, counted
    policy = make_policy("plan:zero-shot", tasks=tasks + extra, backend=be)
    with SolverPool(1) as pool:
        m = evaluate(tasks + extra, policy, tmp_path, env=pool, config=EvalConfig(bootstrap=200, validate_log=False),
                     policy_name="plan:zero-shot")
    recs = {r["id"]: r for r in map(json.loads, (tmp_path / "traces.jsonl").read_text().splitlines())}
    assert all(recs[t.id]["valid"] is (t.id not in wrong) for t in tasks)
    assert "goal" in recs[tasks[1].id]["message"].lower() or "plan" in recs[tasks[1].id]["message"].lower()
    pg = m["plan_generation"]
    assert pg["overall"]["tasks"] == 8 and pg["overall"]["valid"]["value"] == 0.75
    assert pg["families"]["planbench/blocksworld"]["valid"]["value"] == 0.5
    assert pg["families"]["planbench/logistics"]["valid"]["value"] == 0.5  # tasks[4] is a Logistics one
    assert pg["families"]["planbench/mystery_blocksworld"]["valid"]["value"] == 1.0
    assert m["excluded"]["count"] == 1 and m["success"] is None
    assert all(p[-1]["content"].endswith("Just give the actions in the plan.") for p in be.prompts)
    assert all("(define" not in p[-1]["content"] for p in be.prompts)  # the LLM sees no PDDL
    assert "Plan generation" in (tmp_path / "report.html").read_text()


def test_cot_plan_prompt_and_unknown_method(tasks):
    be = Planner(tasks)
    policy = make_policy("plan:cot", tasks=tasks, backend=be)
    assert "[PLAN]" in policy.messages("x")[-1]["content"]
    with pytest.raises(PlanPolicyError, match="unknown plan method 'tree'"):
        make_policy("plan:tree", tasks=tasks, backend=be)


def test_decoding_stops_at_plan_end_or_a_loop():
    assert plan_complete("[PLAN]\n(a)\n[PLAN END]")
    assert not plan_complete("pick up the red block\nstack the red block on top of the blue block\n")
    assert plan_complete("x\nattack object a\nattack object a\nattack object a\n")
    assert not plan_complete("attack object a\nattack object a\nattack object a")  # the line may go on
