"""The Judge's checks section (``ModelConfig.judge_checks``): the annotation-free checks against a spec
shown in the Judge's own prompt, built the same way at every door (episode loop, evaluation, training
items). On PlanBench's real text and the generators'."""

from __future__ import annotations

import functools
import random
from types import SimpleNamespace

import pytest

from omtr.evaluation.spelling import spelled_problem
from omtr.faithfulness.support import checks_before_planner, spec_checks, support
from omtr.inference import prompts as P
from omtr.rl.negatives import mutants
from omtr.tasks.generators import generate
from omtr.tasks.planbench import import_config
from omtr.tasks.planbench_data import shipped_root


def _tasks():
    out = [min(import_config(shipped_root(), fam), key=lambda t: len(t.nl))
           for fam in ("blocksworld", "mystery_blocksworld", "logistics", "depots")]
    return out + [generate(fam, 1, 12, split="test", verify=False)[0] for fam in ("gripper", "logistics")]


def _user(messages) -> str:
    return next(m["content"] for m in messages if m["role"] == "user")


@pytest.mark.parametrize("task", _tasks(), ids=lambda t: t.id)
def test_a_reference_has_nothing_against_it_and_each_mutant_has_its_finding(task):
    view = task.with_given_domain().for_training()
    d, p = view.domain, spelled_problem(task)
    shown = _user(P.judge_messages(view, p, checks=True, domain=d, problem=p))
    assert shown.endswith(f"{P.JUDGE_CHECKS} none against it.\n\nWill the planner accept this PDDL?")
    seen = 0
    for seed in range(4):
        for kind, m in mutants(d, p, random.Random(seed), k=3):
            found = checks_before_planner(view.nl, d, m, domain_written=False)
            text = _user(P.judge_messages(view, m, checks=True, domain=d, problem=m))
            if found:  # every finding is a line of the prompt, before the question
                seen += 1
                assert all(f"\n- {f}" in text for f in found) and "none against it" not in text
            if kind == "object":  # an object the English never names is always found
                assert any("never mentions" in f for f in found), m
    assert seen > 0


def test_without_checks_the_prompt_is_the_papers_task_and_spec():
    task = _tasks()[0]
    view = task.with_given_domain().for_training()
    p = spelled_problem(task)
    plain = _user(P.judge_messages(view, p))
    assert P.JUDGE_CHECKS not in plain and plain.endswith(f"PDDL problem:\n{p}\n\nWill the planner accept this PDDL?")
    full = SimpleNamespace(nl=task.nl, domain=None, family=task.family)
    spec = P.spec_text(task.reference.domain, p)
    shown = _user(P.judge_messages(full, spec, checks=True, domain=task.reference.domain, problem=p))
    assert shown.startswith(f"Task:\n{task.nl}\n\nPDDL:\n{spec}\n\n{P.JUDGE_CHECKS}")


def test_what_cannot_be_read_and_a_goal_that_already_holds_are_said():
    task = _tasks()[0]
    view = task.with_given_domain().for_training()
    assert checks_before_planner(view.nl, view.domain, "(define (problem", domain_written=False) == (
        "the answer holds no readable PDDL problem",)
    assert checks_before_planner(view.nl, view.domain, None) == ("the answer holds no readable PDDL problem",)
    p = spelled_problem(task)
    init = p[p.index("(:init"):p.index("(:goal")].strip()
    holds = p[:p.index("(:goal")] + "(:goal (and " + init[len("(:init"):].strip().rstrip(")").strip() + ")))\n"
    found = checks_before_planner(view.nl, view.domain, holds, domain_written=False)
    assert found[0] == "the goal already holds in the initial state"


def test_support_reads_the_same_checks():
    """support()'s reasons against a solved spec are exactly spec_checks' (one source for both)."""
    task = _tasks()[3]
    view = task.with_given_domain().for_training()
    d, p = view.domain, spelled_problem(task)
    for _, m in mutants(d, p, random.Random(5), k=3):
        s = support(view.nl, d, m, solved=True, plan=["(a)"], domain_written=False)
        checks = spec_checks(view.nl, d, m, domain_written=False)
        assert (s.verdict == "unsupported") == bool(checks)
        if checks:
            assert s.reasons == checks


def test_the_episode_loop_asks_the_judge_with_checks_when_the_model_says_so(tmp_path):
    from omtr.config import SolverConfig
    from omtr.inference.episode import run_episodes
    from omtr.inference.scripted import ScriptedPolicy
    from omtr.solver import SolverPool

    g = generate("blocksworld", 1, 4417, split="test", min_objects=3, max_objects=3, verify=False)[0]
    task = g.with_given_domain().for_training()
    p = spelled_problem(g)
    wrong = mutants(g.reference.domain, p, random.Random(0), k=1, kinds=("object",))[0][1]

    class Checked(ScriptedPolicy):
        cfg = SimpleNamespace(judge_checks=True)

    with SolverPool(1, SolverConfig(time_limit_s=20)) as env:
        for cls, on in ((ScriptedPolicy, False), (Checked, True)):
            policy = cls({task.nl: [f"```pddl\n{wrong}```"]})
            run_episodes([task], policy, env, budget=1)
            (judged,) = [prompts for role, prompts in policy.calls if role == "judge"]
            text = _user(judged[0])
            assert (P.JUDGE_CHECKS in text) == on
            if on:
                assert "never mentions" in text


def test_training_items_carry_the_checks_for_positives_and_mutants():
    from omtr.inference.episode import Episode, Step
    from omtr.rl.config import TrainConfig
    from omtr.rl.rewards import OUTCOME_SCORES
    from omtr.rl.steps import rewarded_items
    from omtr.solver.verdict import Verdict

    g = generate("blocksworld", 1, 4417, split="test", min_objects=3, max_objects=3, verify=False)[0]
    task = g.with_given_domain().for_training()
    d, p = g.reference.domain, spelled_problem(g)
    ep = Episode(task=task, budget=1)
    ep.steps.append(Step(role="actor", index=0, text=p, domain=d, problem=p,
                         verdict=Verdict(success=True, plan=["(pick-up red)"])))
    score = functools.partial(OUTCOME_SCORES["supported"])
    cfg = TrainConfig(reward="supported", samples_per_task=1, episodes_per_batch=1, judge_negatives=2)
    _, off = rewarded_items([ep], 0, cfg, score, 0, judge_term=False)
    assert not any(P.JUDGE_CHECKS in _user(j.prompt) for j in off)
    _, on = rewarded_items([ep], 0, cfg, score, 0, judge_term=False, judge_checks=True)
    assert [j.label for j in on] == [True, False, False]
    assert "none against it" in _user(on[0].prompt)
    assert all("none against it" not in _user(j.prompt) and "\n- " in _user(j.prompt) for j in on[1:])


def test_the_train_setting_reaches_the_model_and_is_saved(tmp_path):
    from omtr.model import RoleModel, load_model
    from omtr.rl.config import TrainConfig
    from omtr.rl.trainer import build_models

    micro = load_model("micro")
    assert micro.cfg.judge_checks is True  # on by default
    models = build_models(TrainConfig(model="micro", judge_checks=False), model=micro)
    assert models["judge"].cfg.judge_checks is False and not P.judge_checks_on(models["judge"])
    models["judge"].save(tmp_path / "m")
    assert RoleModel.load(tmp_path / "m").cfg.judge_checks is False
