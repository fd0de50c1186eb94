"""The grounding term of the ``grounded`` reward: the task's stated facts against the problem's atoms.

Real generated tasks (BlocksWorld, Gripper) and hand-written problems: the task's own reference
problem lines up in full, the degenerate spec a reward-hacking SmolLM2 wrote scores 0, and partial or
reordered facts score in between. The reference is read here only to build test inputs; the reward
itself is given the task's text and a generated problem.
"""

from __future__ import annotations

import dataclasses

import pytest

from omtr.pddl.categories import Category
from omtr.rl.grounding import grounding_score, statement_parts
from omtr.rl.rewards import OUTCOME_SCORES
from omtr.solver.verdict import Verdict
from omtr.tasks.generators import generate
from omtr.tasks.generators.blocksworld import COLOURS, LETTERS


@pytest.fixture(scope="module")
def tasks():
    """Generated tasks whose reference problems name the objects as the English does (BlocksWorld's
    references call the blocks a, b, c; its English, red, blue, orange)."""
    out = []
    for fam, seed in (("blocksworld", 11), ("gripper", 12)):
        for t in generate(fam, 6, seed, min_objects=2, max_objects=5, verify=False):
            if fam == "blocksworld":
                objects, init, goal = _atoms(t.reference.problem)
                c = dict(zip(LETTERS, COLOURS))
                r = lambda a: (a[0], *[c[x] for x in a[1:]])  # noqa: E731
                named = _render({c[o]: ty for o, ty in objects.items()}, [r(a) for a in init], [r(a) for a in goal])
                t = dataclasses.replace(t, reference=dataclasses.replace(t.reference, problem=named))
            out.append(t)
    return out


def test_a_tasks_own_problem_lines_up_in_full(tasks):
    for t in tasks:
        assert grounding_score(t.nl, t.reference.problem) == 1.0, t.id


def test_objects_the_english_does_not_name_pair_with_nothing():
    t = generate("blocksworld", 1, 11, min_objects=3, max_objects=3, verify=False)[0]
    assert grounding_score(t.nl, t.reference.problem) == 0.0  # a, b, c for red, blue, orange


def _bw(tasks):
    return next(t for t in tasks if t.family == "blocksworld" and t.meta.get("n_objects", 0) >= 3)


def test_the_hacked_spec_scores_zero(tasks):
    t = _bw(tasks)
    hacked = """(define (problem p) (:domain blocksworld-4ops) (:objects blocksworld)
      (:init (clear blocksworld) (handempty) (holding blocksworld)) (:goal (on blocksworld blocksworld)))"""
    assert grounding_score(t.nl, hacked) == 0.0


def _atoms(problem_text):
    from omtr.tasks.strips import problem_atoms
    return problem_atoms(problem_text)


def _render(objects, init, goal):
    from omtr.tasks.strips import render_problem
    return render_problem("p", "blocksworld-4ops", objects, init, goal, typed=False)


def test_missing_and_reordered_facts_score_in_between(tasks):
    t = _bw(tasks)
    objects, init, goal = _atoms(t.reference.problem)
    full = grounding_score(t.nl, _render(objects, init, goal))
    dropped = grounding_score(t.nl, _render(objects, init, goal[:-1] if len(goal) > 1 else []))
    on = next(a for a in goal if len(a) == 3)
    swapped = [a if a != on else (a[0], a[2], a[1]) for a in goal]
    reordered = grounding_score(t.nl, _render(objects, init, swapped))
    init_as_goal = grounding_score(t.nl, _render(objects, init, init))
    assert full == 1.0
    assert 0.0 < dropped < 1.0
    assert dropped < reordered < 1.0  # a swapped pair keeps half its credit
    assert 0.0 < init_as_goal < 1.0  # a goal copied from the initial state pairs only the init
    swapped_parts = grounding_score(t.nl, _render(objects, goal, init))
    assert swapped_parts < 0.5  # the stated facts, each in the other part: the init and goal are kept apart


def test_objects_named_in_other_spellings_still_pair(tasks):
    t = next(t for t in tasks if t.family == "gripper")
    objects, init, goal = _atoms(t.reference.problem)
    ren = {o: o.replace("ball", "ball_").replace("room", "room-") for o in objects}
    r = lambda a: (a[0], *[ren.get(x, x) for x in a[1:]])  # noqa: E731
    spelled = _render({ren[o]: ty for o, ty in objects.items()}, [r(a) for a in init], [r(a) for a in goal])
    assert grounding_score(t.nl, spelled) == 1.0
    b = _bw(tasks)
    objects, init, goal = _atoms(b.reference.problem)
    suffixed = {o: f"{o}_block" for o in objects}
    s = lambda a: (a[0], *[suffixed.get(x, x) for x in a[1:]])  # noqa: E731
    assert grounding_score(b.nl, _render({suffixed[o]: ty for o, ty in objects.items()},
                                         [s(a) for a in init], [s(a) for a in goal])) == 1.0


def test_what_it_cannot_judge(tasks):
    t = _bw(tasks)
    assert grounding_score("Stack the red block on the blue block.", t.reference.problem) is None  # no statement
    assert grounding_score(t.nl, "(define (problem p") == 0.0  # does not parse
    assert grounding_score(t.nl, None) == 0.0
    names, init, goal = statement_parts(t.nl)
    assert names and init and goal
    assert not names & {"block", "table", "goal", "initial", "the"}  # description and template words


def test_the_grounded_reward_halves_a_planner_success_that_is_not_the_task(tasks):
    t = _bw(tasks)
    hacked = """(define (problem p) (:domain blocksworld-4ops) (:objects x)
      (:init (clear x) (handempty) (holding x)) (:goal (on x x)))"""
    ok = Verdict(success=True, plan=["(stack x x)"])
    empty = Verdict(success=True, plan=[])
    failed = Verdict(success=False, category=Category.SYNTAX, message="bad")
    limited = Verdict(success=False, category=Category.UNREACHABLE_SEARCH, message="time", timed_out=True)
    score = OUTCOME_SCORES["grounded"]
    got = score(["", "", "", "", ""], verdicts=[ok, Verdict(success=True, plan=["(stack a b)"]), empty, failed, limited],
                nls=[t.nl] * 5, problems=[hacked, t.reference.problem, t.reference.problem, t.reference.problem, hacked])
    assert got == [0.5, 1.0, 0.5, 0.5, None]
    with pytest.raises(ValueError, match="nls="):
        score([""], verdicts=[ok])


def test_the_trainer_rewards_a_spec_of_the_stated_task_above_a_degenerate_one(tasks):
    """Through the trainer's own reward path (``rewarded_items``, which hands the score the tasks'
    English and the extracted problems): two solved specs of one group, the stated task's and the
    hacked one, get 1 and 0.5, so the group carries signal."""
    from omtr.inference.episode import Episode, Step
    from omtr.rl.config import train_profile
    from omtr.rl.steps import rewarded_items, select_groups
    from omtr.tasks.records import TrainingTask

    t = _bw(tasks)
    task = TrainingTask(t.id, t.family, "train", t.nl, {"n_objects": t.meta["n_objects"]},
                        domain=t.reference.domain)
    hacked = """(define (problem p) (:domain blocksworld-4ops) (:objects blocksworld-4ops)
      (:init (clear blocksworld-4ops) (handempty) (holding blocksworld-4ops))
      (:goal (on blocksworld-4ops blocksworld-4ops)))"""
    solved = Verdict(success=True, plan=["(stack a b)"], plan_length=1)
    eps = [Episode(task, budget=1, steps=[Step("actor", 0, p, None, p, solved, token_ids=[1, 2])])
           for p in (t.reference.problem, hacked)]
    cfg = train_profile("micro").replace(reward="grounded", samples_per_task=2, use_judge=False, mlflow=False)
    items, _ = rewarded_items(eps, 0, cfg, OUTCOME_SCORES["grounded"], 0, judge_term=False)
    assert [it.reward for it in items] == [1.0, 0.5]
    assert select_groups(items, 1) == {items[0].group}


def test_the_trainer_weighs_grounding_by_its_config(tmp_path, tasks):
    """``grounding_weight`` reaches the score the trainer uses: a solved degenerate spec keeps
    ``1 - w`` of its reward."""
    import torch

    from omtr.model import build_model
    from omtr.rl.config import train_profile
    from omtr.rl.trainer import Trainer
    from omtr.tasks.records import TrainingTask

    torch.set_num_threads(1)
    t = _bw(tasks)
    task = TrainingTask(t.id, t.family, "train", t.nl, {"n_objects": t.meta["n_objects"]})
    hacked = "(define (problem p) (:domain d) (:objects x) (:init (holding x) (clear x)) (:goal (on x x)))"
    solved = Verdict(success=True, plan=["(stack x x)"], plan_length=1)
    for w in (0.5, 0.8):
        cfg = train_profile("micro").replace(reward="grounded", grounding_weight=w, use_judge=False, mlflow=False)
        tr = Trainer(cfg, [task], tmp_path / f"run{w}", env=object(), quiet=True, model=build_model("micro"))
        assert tr.score([""], verdicts=[solved], nls=[t.nl], problems=[hacked]) == [pytest.approx(1 - w)]
    with pytest.raises(Exception, match="grounding_weight"):
        train_profile("micro").replace(reward="grounded", grounding_weight=1.5)
