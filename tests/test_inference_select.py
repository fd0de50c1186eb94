"""``--select invariants``: Actor samples within the budget, chosen by the domain's mutex invariants.

Scripted policies (fixed answers: the greedy one, then the sampled ones in turn) against the real
planner (the project's solver pool); nothing here mocks Fast Downward."""

import json

import pytest

from omtr.config import ConfigError, SolverConfig
from omtr.inference.episode import run_episodes
from omtr.inference.scripted import ScriptedPolicy
from omtr.policy import Sampling
from omtr.inference.select import (SelectedEpisode, check_select, run_selected, run_with_select,
                                   selection_summary)
from omtr.solver import SolverPool
from omtr.solver.examples import BW_DOMAIN, BW_PROBLEM
from omtr.tasks.training import TrainingTask

from env_helpers import CountingEnv


def _problem(init: str, goal: str, name: str = "p") -> str:
    return f"(define (problem {name}) (:domain bw4) (:objects a b c)\n (:init {init})\n (:goal (and {goal})))"


def _fenced(problem: str) -> str:
    return f"```pddl\n{problem}\n```"


GOOD = _fenced(BW_PROBLEM)  # solved, breaks nothing
# solved (stack a b), but the hand is empty while it holds a: one broken group
BROKEN1 = _fenced(_problem("(handempty) (holding a) (ontable b) (clear b) (ontable c) (clear c)", "(on a b)"))
# the same, laid out differently (equivalent to BROKEN1)
BROKEN1_AGAIN = _fenced(_problem("(clear c)  (ontable c) (clear b) (ontable b) (holding a) (handempty)", "(on a b)", "q"))
# another task (c on b), one broken group too
BROKEN1_OTHER = _fenced(_problem("(handempty) (holding a) (ontable b) (on c b) (clear c)", "(on a c)"))
# holding a while a is on the table, and the hand empty: two broken groups
BROKEN2 = _fenced(_problem("(handempty) (holding a) (ontable a) (ontable b) (clear b) (ontable c) (clear c)",
                           "(on a b)"))
EMPTY_PLAN = _fenced(_problem("(handempty) (on a b) (clear a) (ontable b) (ontable c) (clear c)", "(on a b)"))
UNSOLVABLE = _fenced(_problem("(handempty) (ontable a) (clear a) (ontable b) (clear b) (ontable c) (clear c)",
                              "(on a b) (on b a)"))
NO_SPEC = "I cannot write this one."



class Recorder(ScriptedPolicy):
    """A scripted policy that also notes how it was asked to decode."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.samplings: list[Sampling] = []

    def generate(self, role, prompts, sampling, **kw):
        self.samplings.append(sampling)
        return super().generate(role, prompts, sampling, **kw)


@pytest.fixture(scope="module")
def pool():
    with SolverPool(1, SolverConfig(time_limit_s=20)) as p:
        yield p


@pytest.fixture
def env(pool):
    return CountingEnv(pool)


def _task(i: int = 0, domain: str | None = BW_DOMAIN) -> TrainingTask:
    return TrainingTask(f"t{i}", "blocksworld", None, f"Task {i}: stack the blocks as asked.", domain=domain)


def _policy(tasks, greedy: dict, samples: dict | None = None, editor: dict | None = None) -> Recorder:
    scripts = {t.id: [greedy[t.id], *(editor or {}).get(t.id, [])] for t in tasks}
    nl = {t.id: t.nl for t in tasks}
    return Recorder({nl[i]: v for i, v in scripts.items()},
                    samples={nl[i]: v for i, v in (samples or {}).items()})


def test_a_good_greedy_spec_stops_at_one_call(env):
    t = _task()
    policy = _policy([t], {"t0": GOOD}, {"t0": [BROKEN1]})
    (ep,) = run_selected([t], policy, env, budget=4, sampling=Sampling(greedy=True, seed=0))
    assert isinstance(ep, SelectedEpisode)
    assert ep.planner_calls == 1 and env.batches == [1] and ep.success and ep.selected == 0
    assert [s.greedy for s in policy.samplings] == [True]  # no sample drawn
    sel = ep.to_json()["selection"]
    assert sel["candidates"] == 1 and sel["selected"] == 0 and sel["broken"] == [0] and sel["accepted"]
    assert sel["stopped_early"] and "greedy spec is solved with a plan and breaks no mutex invariant" in sel["reason"]


def test_the_unbroken_solved_sample_wins_over_a_broken_greedy_spec(env):
    t = _task()
    policy = _policy([t], {"t0": BROKEN1}, {"t0": [BROKEN2, GOOD, BROKEN1]})
    (ep,) = run_selected([t], policy, env, budget=6, sampling=Sampling(greedy=True, seed=5))
    # greedy (broken 1), sample 1 (broken 2), sample 2 (good): stops there, 3 calls of 6
    assert ep.planner_calls == 3 and env.batches == [1, 1, 1]
    assert ep.selected == 2 and ep.success and ep.final is ep.steps[2]
    assert [s.index for s in ep.steps] == [0, 1, 2] and [s.planner_calls for s in ep.steps] == [1, 2, 3]
    assert all(s.role == "actor" for s in ep.steps) and ep.repairs == 0
    assert [(s.greedy, s.temperature, s.seed) for s in policy.samplings] == [(True, 0.7, 5), (False, 0.7, 6),
                                                                             (False, 0.7, 7)]
    j = ep.to_json()
    assert j["problem"] == ep.steps[2].problem and j["success"] and j["plan"]
    assert j["selection"]["broken"] == [1, 2, 0] and j["selection"]["selected"] == 2
    assert j["selection"]["drawn"] == ["greedy", "t=0.7 seed=6", "t=0.7 seed=7"]
    assert "sample 2 is solved with a plan" in j["selection"]["reason"]
    assert json.loads(json.dumps(j)) == j


def test_the_budget_is_respected_and_the_fewest_broken_is_chosen(env):
    t = _task()
    policy = _policy([t], {"t0": BROKEN1}, {"t0": [BROKEN2, UNSOLVABLE, NO_SPEC]})
    (ep,) = run_selected([t], policy, env, budget=3)
    assert ep.planner_calls == 3 and len(ep.steps) == 3
    assert ep.selected == 0 and ep.success  # solved with one broken group beats two, and beats unsolved
    sel = ep.selection
    assert sel["broken"] == [1, 2, None] and sel["solved"] == [True, True, False] and not sel["accepted"]
    assert not sel["stopped_early"] and "1 broken mutex group" in sel["reason"]
    # budget 1: the greedy spec alone, whatever it is
    env.batches.clear()
    (ep1,) = run_selected([t], _policy([t], {"t0": BROKEN1}, {"t0": [GOOD]}), env, budget=1)
    assert ep1.planner_calls == 1 and env.batches == [1] and ep1.selected == 0 and ep1.selection["broken"] == [1]


def test_an_answer_without_a_spec_is_a_call_and_a_solved_candidate_beats_it(env):
    t = _task()
    policy = _policy([t], {"t0": NO_SPEC}, {"t0": [UNSOLVABLE, EMPTY_PLAN, BROKEN1]})
    (ep,) = run_selected([t], policy, env, budget=4)
    assert ep.planner_calls == 4
    # no spec (a syntax verdict without a planner start) and unsolvable each count as a call
    assert [s.verdict.success for s in ep.steps] == [False, False, True, True]
    assert ep.selected == 3  # a plan, though broken, beats the empty plan (the goal already held)
    assert env.batches == [1, 1, 1]  # the unextractable answer never reached the planner


def test_agreement_breaks_a_tie_among_equally_broken_candidates(env):
    t = _task()
    policy = _policy([t], {"t0": UNSOLVABLE}, {"t0": [BROKEN1_OTHER, BROKEN1, BROKEN1_AGAIN]})
    (ep,) = run_selected([t], policy, env, budget=4)
    sel = ep.selection
    assert sel["broken"] == [None, 1, 1, 1] and sel["agreement"] is not None
    assert sel["agreement"][2] == sel["agreement"][3] == pytest.approx(2 / 3, abs=1e-4) and sel["agreement"][1] == pytest.approx(1 / 3, abs=1e-4)
    assert ep.selected == 2 and "agreement" in sel["reason"]


def test_episodes_are_batched_and_decided_in_their_own_round(env):
    tasks = [_task(i) for i in range(3)]
    greedy = {"t0": GOOD, "t1": BROKEN1, "t2": UNSOLVABLE}
    samples = {"t1": [GOOD], "t2": [BROKEN1, BROKEN1, BROKEN1]}
    decided = []
    eps = run_selected(tasks, _policy(tasks, greedy, samples), env, budget=3,
                       on_episode=lambda e: decided.append(e.task.id))
    assert [e.planner_calls for e in eps] == [1, 2, 3] and [e.selected for e in eps] == [0, 1, 1]
    assert env.batches == [3, 2, 1] and decided == ["t0", "t1", "t2"]
    s = selection_summary([e.to_json() for e in eps])
    assert s["episodes"] == 3 and s["greedy_kept"] == 1 and s["accepted"] == 2 and s["chosen_solved_broken"] == 1
    assert s["candidates_per_task"] == 2.0 and s["selected_index"] == {"0": 1, "1": 2}


def test_full_mode_reads_the_specs_own_domain(env):
    t = _task(domain=None)
    full_broken = f"```pddl\n{BW_DOMAIN}```\n{BROKEN2}"
    full_good = f"```pddl\n{BW_DOMAIN}```\n{GOOD}"
    (ep,) = run_selected([t], _policy([t], {"t0": full_broken}, {"t0": [full_good]}), env, budget=2)
    assert ep.mode == "full" and ep.selection["broken"] == [2, 0] and ep.selected == 1 and ep.success


def test_greedy_mode_is_the_loop_unchanged(env, pool):
    t = _task()
    script = {"t0": BROKEN1}
    editor = {"t0": [GOOD]}
    a = run_with_select("greedy", [t], _policy([t], script, {"t0": [GOOD]}, editor), env, budget=4)
    b = run_episodes([t], _policy([t], script, None, editor), CountingEnv(pool), budget=4)
    assert type(a[0]) is type(b[0]) and not isinstance(a[0], SelectedEpisode)

    def strip(ep):
        j = ep.to_json()
        j.pop("wall_ms")
        for s in j["steps"]:
            s.pop("times")
            s["verdict"].pop("timings", None)
        return j

    # greedy: the Actor's (broken but solved) spec ends the episode; sampling is never asked for
    assert strip(a[0]) == strip(b[0]) and a[0].planner_calls == 1 and "selection" not in a[0].to_json()


def test_bad_select_values_are_config_errors(env):
    assert check_select("invariants") == "invariants"
    with pytest.raises(ConfigError, match="select must be one of greedy, invariants, supported; got 'best'"):
        check_select("best")
    with pytest.raises(ConfigError, match="--select must be one of"):
        check_select(None, what="--select")
    t = _task()
    with pytest.raises(ConfigError, match="select must be one of"):
        run_with_select("majority", [t], _policy([t], {"t0": GOOD}), env)
    with pytest.raises(ConfigError, match="budget must be at least 1"):
        run_selected([t], _policy([t], {"t0": GOOD}), env, budget=0)
    assert env.batches == []


# ------------------------------------------------------------------------------ the command lines


def _broken(problem: str, obj: str) -> str:
    """A problem whose initial state also holds ``obj``: still solvable, breaks mutex groups."""
    return problem.replace("(:init", f"(:init (holding {obj})", 1)


@pytest.fixture(scope="module")
def given_tasks(tmp_path_factory):
    from omtr.tasks.generators import generate
    from omtr.tasks.records import write_tasks

    tasks = [t.with_given_domain() for t in generate("blocksworld", 2, 7, verify=False)]
    d = tmp_path_factory.mktemp("select")
    write_tasks(d / "tasks.jsonl", tasks)
    # task 0: the reference problem at once; task 1: a broken greedy answer, then the reference sampled
    held = [next(a for a in ("a", "b", "c", "d", "e") if f"(clear {a})" in t.reference.problem) for t in tasks]
    lines = [{"id": tasks[0].id, "texts": [_fenced(tasks[0].reference.problem)]},
             {"id": tasks[1].id, "texts": [_fenced(_broken(tasks[1].reference.problem, held[1]))],
              "samples": [_fenced(tasks[1].reference.problem)]}]
    (d / "answers.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return d, tasks


def test_infer_select_records_the_choice_per_episode(given_tasks, tmp_path, capsys):
    from omtr.cli import main

    d, tasks = given_tasks
    out = tmp_path / "traces.jsonl"
    assert main(["-q", "infer", "--model", f"scripted:{d / 'answers.jsonl'}", "--tasks", str(d / "tasks.jsonl"),
                 "--budget", "3", "--select", "invariants", "--out", str(out)]) == 0
    recs = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    a, b = recs[tasks[0].id], recs[tasks[1].id]
    assert a["planner_calls"] == 1 and a["selection"]["selected"] == 0 and a["selection"]["broken"] == [0]
    assert b["planner_calls"] == 2 and b["selection"]["selected"] == 1 and b["selection"]["broken"][1] == 0
    assert b["selection"]["broken"][0] >= 2 and b["success"] and b["problem"] == b["steps"][1]["problem"]
    printed = capsys.readouterr().out
    assert "selection (invariants): 1.5 candidates per task; greedy spec kept 1" in printed
    # greedy (the default): task 1's broken spec is solved and ends its episode, no selection block
    out2 = tmp_path / "greedy.jsonl"
    assert main(["-q", "infer", "--model", f"scripted:{d / 'answers.jsonl'}", "--tasks", str(d / "tasks.jsonl"),
                 "--budget", "3", "--out", str(out2)]) == 0
    recs2 = {r["id"]: r for r in map(json.loads, out2.read_text().splitlines())}
    assert recs2[tasks[1].id]["planner_calls"] == 1 and "selection" not in recs2[tasks[1].id]


def test_a_bad_select_value_is_a_clear_error(given_tasks, tmp_path, capsys):
    from omtr.cli import main

    d, _ = given_tasks
    for argv in (["infer", "--model", f"scripted:{d / 'answers.jsonl'}", "--out", str(tmp_path / "t.jsonl")],
                 ["evaluate", "--policy", "model", "--model", "small", "--out", str(tmp_path / "e")]):
        with pytest.raises(SystemExit) as e:
            main([*argv, "--tasks", str(d / "tasks.jsonl"), "--select", "best"])
        assert e.value.code == 2
        assert "--select: invalid choice: 'best' (choose from 'greedy', 'invariants', 'supported')" in capsys.readouterr().err
    assert main(["-q", "evaluate", "--policy", "oracle", "--tasks", str(d / "tasks.jsonl"), "--select", "invariants",
                 "--out", str(tmp_path / "o")]) == 2
    assert "--select invariants samples omtr's role model (--policy model); oracle cannot" in capsys.readouterr().err


def test_evaluate_select_reports_the_choice_and_grades_the_chosen_spec(given_tasks, tmp_path, capsys):
    from omtr.cli import main

    d, tasks = given_tasks
    runs = {}
    for mode in ("greedy", "invariants"):
        out = tmp_path / mode
        assert main(["-q", "evaluate", "--policy", "model", "--model", f"scripted:{d / 'answers.jsonl'}",
                     "--tasks", str(d / "tasks.jsonl"), "--budget", "3", "--select", mode, "--workers", "1",
                     "--bootstrap", "50", "--no-report", "--out", str(out)]) == 0
        runs[mode] = json.loads((out / "metrics.json").read_text())
    g, s = runs["greedy"], runs["invariants"]
    assert (g["success"], g["faithful"], g["calls"]) == (1.0, 0.5, 1.0)  # task 1's broken spec: solved, drifting
    assert (s["success"], s["faithful"], s["calls"]) == (1.0, 1.0, 1.5)  # the sample breaking nothing chosen
    assert "selection" not in g and g["provenance"]["eval"]["select"] == "greedy"
    assert s["selection"]["greedy_kept"] == 1 and s["selection"]["accepted"] == 2
    assert s["provenance"]["eval"]["select"] == "invariants" and not s["provenance"]["eval"]["greedy"]
    assert s["episode_log"]["valid"], s["episode_log"]
    assert s["overall"]["final_categories"] == {"success": 2}
    assert "selection (invariants): 1.5 candidates per task" in capsys.readouterr().out
    # a resumed run under the other mode is refused
    assert main(["-q", "evaluate", "--policy", "model", "--model", f"scripted:{d / 'answers.jsonl'}",
                 "--tasks", str(d / "tasks.jsonl"), "--budget", "3", "--resume", "--out", str(tmp_path / "invariants")]) == 2
    assert "selection mode differs ('invariants' there, 'greedy' now)" in capsys.readouterr().err


# ------------------------------------------------------------------------------ the served model


def _served(env, nl, greedy_text, samples, limits=None):
    from omtr.tracking.pyfunc import RoleModelPyfunc, ServingLimits

    py = RoleModelPyfunc()
    py.limits, py.metrics, py.env = limits or ServingLimits(budget=3), None, env
    py.model = ScriptedPolicy({nl: [greedy_text]}, samples={nl: samples})
    return py


def test_served_model_selects_by_request_param_or_config(env):
    from mlflow.exceptions import MlflowException

    from omtr.tracking.pyfunc import ServingLimits

    nl = "Put block a on block b; a is in the hand."
    req = {"task": [nl], "domain": [BW_DOMAIN]}
    py = _served(env, nl, BROKEN1, [GOOD])
    plain = py.predict(None, req)  # the endpoint's default: greedy, the broken spec answers
    assert plain.loc[0, "planner_calls"] == 1 and plain.loc[0, "selection"] == ""
    chosen = py.predict(None, req, params={"select": "invariants"})
    row = chosen.iloc[0]
    sel = json.loads(row["selection"])
    assert row["planner_calls"] == 2 and sel["selected"] == 1 and sel["broken"] == [1, 0]
    assert "(on c a)" in row["problem"]  # BW_PROBLEM, the sample
    assert [s["selected"] for s in json.loads(row["repair_trace"])] == [False, True]
    with pytest.raises(MlflowException) as e:
        py.predict(None, req, params={"select": "majority"})
    assert e.value.get_http_status_code() == 400
    assert "bad params: select must be one of greedy, invariants, supported; got 'majority'" in e.value.message
    py2 = _served(env, nl, BROKEN1, [GOOD], ServingLimits(budget=3, select="invariants"))
    assert json.loads(py2.predict(None, req).loc[0, "selection"])["selected"] == 1
    with pytest.raises(ValueError, match="select must be one of greedy, invariants, supported; got 'best'"):
        ServingLimits(select="best")


def test_supported_mode_goes_on_past_a_solved_spec_that_misstates_the_goal(env):
    """A generated BlocksWorld task (PlanBench's layout): the greedy spec is solved and breaks no
    invariant, but its goal is not the English's (typed grounding < 1). ``invariants`` stops there;
    ``supported`` draws on and answers the sample that states every clause."""
    from omtr.evaluation.spelling import spelled_problem
    from omtr.tasks.generators import generate

    g = generate("blocksworld", 1, 4417, split="test", min_objects=3, max_objects=3, verify=False)[0]
    t = TrainingTask("s0", "blocksworld", None, g.nl, domain=g.reference.domain)
    right = spelled_problem(g)
    goal = right[right.index("(:goal"):]
    wrong = right.replace(goal, "(:goal (and (on red orange))))")  # solvable, but not the task's goal
    assert wrong != right
    for mode, calls, picked in (("invariants", 1, 0), ("supported", 2, 1)):
        policy = _policy([t], {"s0": _fenced(wrong)}, {"s0": [_fenced(right)]})
        (ep,) = run_selected([t], policy, env, budget=4, sampling=Sampling(greedy=True, seed=0), mode=mode)
        assert ep.planner_calls == calls and ep.selected == picked and ep.success, (mode, ep.selection)
        sel = ep.to_json()["selection"]
        assert sel["mode"] == mode
    assert sel["support"] == ["unsupported", "supported"] and sel["grounding"][1] == 1.0 > sel["grounding"][0]
    assert "supported" in sel["reason"] and ep.support.verdict == "supported"
    with pytest.raises(ConfigError, match="selection mode"):
        run_selected([t], policy, env, budget=2, mode="greedy")
