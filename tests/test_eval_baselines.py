"""The paper's baselines through the real episode loop and planner, on a scripted backend."""

from __future__ import annotations

import json

import pytest

from omtr.evaluation.harness import answer_text
from omtr.evaluation.run import EvalConfig, evaluate
from omtr.inference.baselines import read_prompt
from omtr.inference.policy import Generation
from omtr.inference.prompts import actor_messages, editor_messages
from omtr.inference.registry import make_policy
from omtr.solver import SolverPool
from omtr.tasks.generators import generate


@pytest.fixture(scope="module")
def pool():
    with SolverPool(1) as p:
        yield p


@pytest.fixture(scope="module")
def tasks():
    return generate("blocksworld", 2, 3, verify=False)


class ScriptedBackend:
    """Answers spec prompts from a list per task (broken first, then right); logs every prompt."""

    name = "scripted"

    def __init__(self, tasks, broken_first: int = 1):
        self.tasks, self.broken_first = tasks, broken_first
        self.prompts: list[tuple[list, object]] = []
        self.count: dict[str, int] = {}

    def _task(self, text):
        return next((t for t in self.tasks if t.nl in text), None)

    def chat(self, prompts, sampling, *, stop_when=None, grammar=False):
        out = []
        for p in prompts:
            self.prompts.append((p, sampling))
            last = p[-1]["content"]
            if "one number from 1 to 10" in last:
                out.append(Generation(text="7"))
                continue
            if "Be brief." in last:
                out.append(Generation(text="blocks a b c; predicates on, clear"))
                continue
            t = self._task("\n".join(m["content"] for m in p))
            k = self.count.get(t.id, 0)
            self.count[t.id] = k + 1
            d, pr = t.reference.domain, t.reference.problem
            if k < self.broken_first:
                d = d.replace("(:predicates", "(:predicates (", 1)
            out.append(Generation(text="Let me think.\n" + answer_text(d, pr)))
        return out


def _run(name, tasks, pool, tmp_path, backend, budget=6):
    policy = make_policy(name, tasks=tasks, backend=backend, budget=budget)
    m = evaluate(tasks, policy, tmp_path, env=pool, config=EvalConfig(budget=budget, bootstrap=0, validate_log=False,
                                                                      figures=False), policy_name=name)
    recs = [json.loads(x) for x in (tmp_path / "traces.jsonl").read_text().splitlines()]
    return m, recs


def test_read_prompt_recovers_task_family_spec_and_diagnostic(tasks):
    t = tasks[0].for_training()
    turn = read_prompt("actor", actor_messages(t))
    assert (turn.nl, turn.family) == (t.nl, "blocksworld")
    turn = read_prompt("editor", editor_messages(t, "(define (domain x))", "syntax", "Missing ')'"))
    assert (turn.nl, turn.spec, turn.category, turn.diagnostic) == (t.nl, "(define (domain x))", "syntax", "Missing ')'")


@pytest.mark.parametrize("name", ["CoT", "LLM+P"])
def test_independent_samples_never_see_the_diagnostic(name, tasks, pool, tmp_path):
    be = ScriptedBackend(tasks, broken_first=2)
    m, recs = _run(name, tasks, pool, tmp_path, be)
    assert m["success"] == 1.0 and m["calls"] == 3.0  # two broken samples, then the right one
    texts = [json.dumps(p) for p, _ in be.prompts]
    assert not any("planner" in x and "rejected" in x for x in texts)
    assert len(set(texts)) == len(tasks)  # the same prompt per task each time
    seeds = [s.seed for _, s in be.prompts]
    assert be.prompts[0][1].greedy and not be.prompts[-1][1].greedy and len(set(seeds)) == 3
    if name == "LLM+P":
        assert "An example problem" in texts[0] and "Assumptions" in texts[0]
    assert all(r["judge_score"] is None for r in recs)


def test_self_refine_revises_from_the_raw_diagnostic(tasks, pool, tmp_path):
    be = ScriptedBackend(tasks, broken_first=1)
    m, recs = _run("self-refine+solver", tasks, pool, tmp_path, be)
    assert m["success"] == 1.0 and m["calls"] == 2.0
    revision = be.prompts[-1][0]
    diag = recs[0]["steps"][0]["verdict"]["message"]
    assert revision[-1]["content"].startswith("The planner answered:\n") and diag[:40] in json.dumps(revision)
    assert revision[2]["role"] == "assistant" and "(define (domain" in revision[2]["content"]


def test_tot_searches_then_checks_at_most_k_final_specs(tasks, pool, tmp_path):
    be = ScriptedBackend(tasks, broken_first=10)  # every final spec broken: all K are checked
    m, recs = _run("ToT", tasks, pool, tmp_path, be, budget=3)
    assert m["success"] == 0.0 and all(r["planner_calls"] == 3 for r in recs)
    kinds = [p[-1]["content"] for p, _ in be.prompts]
    assert sum("one number from 1 to 10" in k for k in kinds) == len(tasks) * (1 * 2 + 2 * 2)  # breadth 2 from the root, then from each of 2 beam states
    finals = [k for k in kinds if "Using this analysis" in k]
    assert len(finals) <= 3 * len(tasks)
