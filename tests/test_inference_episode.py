"""The episode loop (Algorithm 1) driven by a scripted policy against the real planner."""

import threading

import pytest

from omtr.config import ConfigError, EpisodeConfig, SolverConfig
from omtr.inference.episode import run_episodes, summarize
from omtr.inference.scripted import ScriptedPolicy
from omtr.pddl.categories import Category
from omtr.solver import SolverPool
from omtr.solver.examples import BW_DOMAIN, BW_PROBLEM, MALFORMED
from omtr.tasks.training import TrainingTask

from env_helpers import CountingEnv

GOOD = f"```pddl\n{BW_DOMAIN}```\n```pddl\n{BW_PROBLEM}```"
BY_NAME = {e.name: e for e in MALFORMED}


def _answer(name: str) -> str:
    ex = BY_NAME[name]
    return f"Here you go:\n{ex.domain}\n{ex.problem}\nThat is all."


SYNTAX = _answer("syntax-missing-paren")
SCHEMA = _answer("schema-undeclared-predicate")
GOAL = _answer("goal-undeclared-object")
NO_SPEC = "I am not sure how to write this."


def _task(i: int, family: str | None = "blocksworld") -> TrainingTask:
    return TrainingTask(f"t{i}", family, None, f"Task number {i}: put block a on block b, then b on c.")



@pytest.fixture(scope="module")
def pool():
    with SolverPool(1, SolverConfig(time_limit_s=20)) as p:
        yield p


@pytest.fixture
def env(pool):
    return CountingEnv(pool)


def test_actor_success_ends_the_episode_without_an_editor(env):
    t = _task(0)
    policy = ScriptedPolicy.for_tasks([t], {"t0": [GOOD, SCHEMA]}, scores_by_id={"t0": 0.9})
    (ep,) = run_episodes([t], policy, env)
    assert ep.success and ep.actor_success and ep.planner_calls == 1 and ep.repairs == 0
    assert [role for role, _ in policy.calls] == ["actor", "judge"]
    step = ep.steps[0]
    assert step.role == "actor" and step.judge_score == 0.9 and step.verdict.success
    assert step.domain.startswith("(define (domain bw4)") and step.problem.startswith("(define (problem")
    assert step.token_ids and len(step.logprobs) == len(step.token_ids)
    assert {"generate_ms", "solve_ms", "judge_ms", "batch", "at_ms"} <= set(step.times)
    assert env.batches == [1]


def test_broken_then_fixed_the_editor_reads_the_latest_diagnostic(env):
    t = _task(1)
    policy = ScriptedPolicy.for_tasks([t], {"t1": [SYNTAX, SCHEMA, GOOD]})
    (ep,) = run_episodes([t], policy, env)
    assert ep.success and not ep.actor_success and ep.planner_calls == 3 and ep.repairs == 2
    cats = [s.verdict.category for s in ep.steps]
    assert cats == [Category.SYNTAX, Category.PREDICATE_SCHEMA, None]
    assert [s.planner_calls for s in ep.steps] == [1, 2, 3]
    assert [s.role for s in ep.steps] == ["actor", "editor", "editor"]
    editor_prompts = [p for role, batch in policy.calls if role == "editor" for p in batch]
    assert len(editor_prompts) == 2
    for prompt, previous in zip(editor_prompts, ep.steps):
        text = prompt[-1]["content"]
        assert previous.verdict.message in text and str(previous.verdict.category) in text
    assert "Here you go" in editor_prompts[0][-1]["content"]  # no spec extracted: the raw answer is shown
    assert ep.steps[1].domain in editor_prompts[1][-1]["content"]  # the latest spec, not the first one
    # the second repair does not see the first diagnostic
    assert "never closed" in ep.steps[0].verdict.message
    assert ep.steps[0].verdict.message not in editor_prompts[1][-1]["content"]
    assert ep.steps[1].judge_score is None and ep.steps[0].judge_score == 0.5


@pytest.mark.parametrize("budget", [1, 3, 6])
def test_budget_is_respected(env, budget):
    t = _task(2)
    policy = ScriptedPolicy.for_tasks([t], {"t2": [SCHEMA, GOAL]})
    (ep,) = run_episodes([t], policy, env, budget=budget)
    assert not ep.success and ep.planner_calls == budget and len(ep.steps) == budget
    assert sum(len(b) for role, b in policy.calls if role in ("actor", "editor")) == budget


def test_default_budget_is_the_papers(env):
    t = _task(3)
    policy = ScriptedPolicy.for_tasks([t], {"t3": [SCHEMA]})
    (ep,) = run_episodes([t], policy, env)
    assert ep.planner_calls == EpisodeConfig().planner_call_budget == 6
    (ep,) = run_episodes([t], policy, env, config=EpisodeConfig(max_repairs=2))
    assert ep.planner_calls == 3


def test_unextractable_answer_is_a_syntax_verdict_without_a_planner_call(env):
    t = _task(4)
    policy = ScriptedPolicy.for_tasks([t], {"t4": [NO_SPEC, GOOD]})
    (ep,) = run_episodes([t], policy, env)
    first = ep.steps[0]
    assert first.verdict.category == Category.SYNTAX and first.verdict.stage == "extract"
    assert "no (define (domain" in first.verdict.message.lower()
    assert ep.success and ep.planner_calls == 2
    assert env.batches == [1]  # only the repaired spec reached the planner
    editor_prompt = [b for role, b in policy.calls if role == "editor"][0][0][-1]["content"]
    assert NO_SPEC in editor_prompt  # the Editor sees what was written when no spec was found


def test_many_episodes_advance_in_batches(env):
    tasks = [_task(10 + i) for i in range(5)]
    scripts = {
        "t10": [GOOD], "t11": [SYNTAX, GOOD], "t12": [SCHEMA, GOAL, GOOD],
        "t13": [NO_SPEC, SCHEMA, GOOD], "t14": [GOAL],
    }
    policy = ScriptedPolicy.for_tasks(tasks, scripts)
    finished = []
    eps = run_episodes(tasks, policy, env, budget=4, on_episode=lambda e: finished.append(e.task.id))
    assert [e.task.id for e in eps] == [t.id for t in tasks]
    assert [e.planner_calls for e in eps] == [1, 2, 3, 3, 4]
    assert [e.success for e in eps] == [True, True, True, True, False]
    assert sorted(finished) == sorted(t.id for t in tasks) and len(finished) == 5
    actor_calls = [b for role, b in policy.calls if role == "actor"]
    assert len(actor_calls) == 1 and len(actor_calls[0]) == 5  # every Actor prompt in one generate call
    assert env.batches[0] == 3  # the three extractable Actor specs in one planner batch
    # unextractable answers (NO_SPEC, the unbalanced SYNTAX answer) never reach the planner
    assert sum(env.batches) == sum(e.planner_calls for e in eps) - 2
    s = summarize(eps)
    assert s["tasks"] == 5 and s["solved"] == 4 and s["actor_solved"] == 1 and s["repaired"] == 3
    assert s["planner_calls"] == 13 and s["calls_per_task"] == 2.6
    assert s["final_categories"] == {"success": 4, "goal_constraint": 1}
    assert s["first_categories"]["syntax"] == 2


def test_batch_size_caps_generation_batches(env):
    tasks = [_task(20 + i) for i in range(5)]
    policy = ScriptedPolicy.for_tasks(tasks, {t.id: [GOOD] for t in tasks})
    run_episodes(tasks, policy, env, batch_size=2)
    assert [len(b) for role, b in policy.calls if role == "actor"] == [2, 2, 1]


def test_judge_runs_while_the_environment_plans(pool):
    """The environment's batch is submitted before the Judge scores: the two overlap."""
    judged = threading.Event()
    seen = {}

    class WaitingEnv:
        def solve_many(self, specs):
            seen["judged_during_solve"] = judged.wait(timeout=10)
            return pool.solve_many(specs)

    class JudgeSignals(ScriptedPolicy):
        def judge(self, prompts):
            out = super().judge(prompts)
            judged.set()
            return out

    t = _task(30)
    policy = JudgeSignals({t.nl: [GOOD]})
    (ep,) = run_episodes([t], policy, WaitingEnv())
    assert ep.success and seen["judged_during_solve"]


def test_tasks_with_references_are_reduced_to_the_training_view(env):
    from omtr.tasks.records import ReferenceSpec, Task

    secret = "(define (domain secret-reference-domain))"
    task = Task("ref-1", "blocksworld", "test", "Stack a on b.", ReferenceSpec(secret, "(define (problem secret))"),
                meta={"reference_plan": ["(secret-step)"], "n_objects": 2})
    policy = ScriptedPolicy({task.nl: [SYNTAX, GOOD]})
    (ep,) = run_episodes([task], policy, env)
    assert isinstance(ep.task, TrainingTask) and not hasattr(ep.task, "reference")
    blob = repr(policy.calls) + repr(ep.to_json())
    assert "secret" not in blob


def test_trace_json(env):
    import json

    t = _task(40)
    policy = ScriptedPolicy.for_tasks([t], {"t40": [SCHEMA, GOOD]})
    (ep,) = run_episodes([t], policy, env)
    d = json.loads(json.dumps(ep.to_json()))
    assert d["id"] == "t40" and d["success"] and d["planner_calls"] == 2 and d["budget"] == 6
    assert d["plan"] and d["domain"].startswith("(define") and d["final_category"] is None
    s0 = d["steps"][0]
    assert s0["role"] == "actor" and s0["verdict"]["category"] == "predicate_schema"
    assert SCHEMA.startswith(s0["text"]) and "That is all" not in s0["text"]  # stopped once complete
    assert s0["new_tokens"] > 0 and "token_ids" not in s0
    assert "token_ids" in ep.to_json(tokens=True)["steps"][0]


def test_bad_budget_is_a_config_error(env):
    with pytest.raises(ConfigError, match="at least 1"):
        run_episodes([_task(50)], ScriptedPolicy({}), env, budget=0)
