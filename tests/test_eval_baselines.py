"""The paper's baselines through the real episode loop and planner, on a scripted backend."""

from __future__ import annotations

import json

import pytest

from omtr.evaluation.harness import answer_text
from omtr.evaluation.run import EvalConfig, evaluate
from omtr.inference.baselines import read_prompt
from omtr.inference.prompts import actor_messages, editor_messages
from omtr.inference.registry import make_policy
from omtr.policy import Generation
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
        self.prompts: list[tuple[list, object]] = []  # spec-writing and rating calls
        self.reasoning: list[list] = []  # CoT's free-text reasoning calls
        self.grammar: list[tuple[str, bool]] = []  # (last message, grammar flag) of every call
        self.count: dict[str, int] = {}

    def _task(self, text):
        return next((t for t in self.tasks if t.nl in text), None)

    def chat(self, prompts, sampling, *, stop_when=None, grammar=False):
        out = []
        for p in prompts:
            last = p[-1]["content"]
            self.grammar.append((last, grammar))
            if "Do not write PDDL yet." in last:
                self.reasoning.append(p)
                out.append(Generation(text="Objects: blocks. Predicates: on, clear, holding."))
                continue
            self.prompts.append((p, sampling))
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
    cat = recs[0]["steps"][0]["verdict"]["category"]
    assert revision[-1]["content"].startswith(f"The planner rejected it ({cat}):\n") and diag[:40] in json.dumps(revision)
    assert revision[-2]["role"] == "assistant" and "(define (domain" in revision[-2]["content"]


def test_tot_searches_then_checks_at_most_k_final_specs(tasks, pool, tmp_path):
    be = ScriptedBackend(tasks, broken_first=10)  # every final spec broken: all K are checked
    m, recs = _run("ToT", tasks, pool, tmp_path, be, budget=3)
    assert m["success"] == 0.0 and all(r["planner_calls"] == 3 for r in recs)
    kinds = [p[-1]["content"] for p, _ in be.prompts]
    assert sum("one number from 1 to 10" in k for k in kinds) == len(tasks) * (1 * 2 + 2 * 2)  # breadth 2 from the root, then from each of 2 beam states
    finals = [k for k in kinds if "Using this analysis" in k]
    assert len(finals) <= 3 * len(tasks)


@pytest.mark.parametrize("name", ["cot", "tot", "self-refine", "llm+p"])
def test_every_baseline_is_shown_the_actors_demonstration_and_writes_under_the_grammar(name, tasks, pool, tmp_path):
    from omtr.inference.prompts import demo_for

    be = ScriptedBackend(tasks, broken_first=1)
    m, _ = _run(name, tasks, pool, tmp_path, be)
    assert m["success"] == 1.0
    demo = demo_for("blocksworld")
    spec_calls = [p for p, _ in be.prompts if "one number from 1 to 10" not in p[-1]["content"]
                  and "Be brief." not in p[-1]["content"]]
    assert spec_calls and all(any(msg["content"] == demo.answer for msg in p) for p in spec_calls)
    for last, g in be.grammar:  # spec-writing calls under the grammar, reasoning and ratings free
        free = "Do not write PDDL yet." in last or "one number from 1 to 10" in last or "Be brief." in last
        assert g is (not free), (name, last[:80])
    if name == "cot":  # one free-text reasoning call before each spec
        assert len(be.reasoning) == len(spec_calls)


def test_grammar_off_gives_free_text_and_one_cot_call(tasks, pool, tmp_path):
    be = ScriptedBackend(tasks, broken_first=0)
    policy = make_policy("cot", tasks=tasks, backend=be, grammar=False)
    evaluate(tasks, policy, tmp_path, env=pool, config=EvalConfig(bootstrap=0, validate_log=False, figures=False))
    assert not be.reasoning and be.grammar and not any(g for _, g in be.grammar)


def test_backends_take_the_grammar_switch():
    """hf: hands the switch to the model's decoder; openai: sends the grammar the server reads."""
    from omtr.inference.backends import HFBackend, make_backend
    from omtr.policy import Sampling

    class Model:  # stands in for a loaded role model (its decoder is tested in test_model_grammar)
        seen = []

        def generate(self, role, prompts, sampling, *, stop_when=None, grammar=None):
            self.seen.append(grammar)
            return [Generation(text="") for _ in prompts]

    hf = HFBackend("micro", model=Model())
    hf.chat([[{"role": "user", "content": "x"}]], Sampling(), grammar=True)
    hf.chat([[{"role": "user", "content": "x"}]], Sampling())
    assert Model.seen == [True, False]
    be = make_backend("openai:http://127.0.0.1:9/v1", model="m", grammar="vllm")
    msgs = [{"role": "user", "content": "x"}]
    assert "structured_outputs" in be.body(msgs, Sampling(), True)
    assert "structured_outputs" not in be.body(msgs, Sampling(), False)


def test_tot_breadth_beam_and_thought_length_are_options(tasks, pool, tmp_path):
    be = ScriptedBackend(tasks, broken_first=10)
    policy = make_policy("tot", tasks=tasks, backend=be, budget=2, breadth=3, beam=1, thought_tokens=40)
    assert (policy.breadth, policy.beam, policy.thought_tokens) == (3, 1, 40)
    evaluate(tasks, policy, tmp_path, env=pool, config=EvalConfig(budget=2, bootstrap=0, validate_log=False, figures=False))
    kinds = [p[-1]["content"] for p, _ in be.prompts]
    assert sum("one number from 1 to 10" in k for k in kinds) == len(tasks) * (3 + 1 * 3)
    thoughts = [s for p, s in be.prompts if "Be brief." in p[-1]["content"]]
    assert thoughts and all(s.max_new_tokens == 40 for s in thoughts)
    with pytest.raises(ValueError, match="ToT's beam must be a whole number of at least 1, got 0"):
        make_policy("tot", tasks=tasks, backend=be, beam=0)


def test_each_baseline_answers_transfer_tasks_with_its_own_method(pool, tmp_path):
    from omtr.tasks.transfer import BENCHMARKS

    b = BENCHMARKS["prontoqa"]
    tasks = b.to_tasks(b.generate(2, 1))
    seen = {}
    for name in ("cot", "tot", "self-refine", "llm+p"):
        be = ScriptedBackend(tasks)
        be.chat_log = []
        orig = be.chat

        def chat(prompts, sampling, *, stop_when=None, grammar=False, _be=be, _orig=orig):
            _be.chat_log.extend(p[-1]["content"] for p in prompts)
            if any("one number from 1 to 10" in p[-1]["content"] for p in prompts):
                return _orig(prompts, sampling, stop_when=stop_when, grammar=grammar)
            return [Generation(text="True") for _ in prompts]

        be.chat = chat
        policy = make_policy(name, tasks=tasks, backend=be)
        evaluate(tasks, policy, tmp_path / name, env=pool, config=EvalConfig(bootstrap=0, validate_log=False,
                                                                             figures=False))
        seen[name] = be.chat_log
    assert all("step by step" in x for x in seen["cot"]) and len(seen["cot"]) == 2
    assert sum("Check your answer against every fact" in x for x in seen["self-refine"]) == 2
    assert len(seen["self-refine"]) == 4  # answer, then one critique-and-revise round, per task
    assert sum("one number from 1 to 10" in x for x in seen["tot"]) == 2 * (2 + 2 * 2)
    assert len(seen["llm+p"]) == 2
