"""The `supported` reward, the Judge's target and the collapse guards (issue 35, part 2).

Generated BlocksWorld tasks give a real domain and problems; their references build test inputs
only (a faithful problem, the same with the hand empty while holding a block). The planner's
verdicts are made by hand: what is under test is the score of a verdict, not the planner.
"""

from __future__ import annotations

import pytest

from omtr.rl.config import TrainConfig, train_profile
from omtr.rl.recipe import CollapseGuard
from omtr.rl.rewards import OUTCOME_SCORES, supported_score
from omtr.solver.verdict import Verdict
from omtr.tasks.generators import generate


@pytest.fixture(scope="module")
def bw():
    return generate("blocksworld", 1, 4417, split="test", min_objects=3, max_objects=3, verify=False)[0]


def _solved(plan=("(pick-up a)",)):
    return Verdict(success=True, plan=list(plan))


def _broken(problem: str) -> str:
    # holding a block while the hand is empty: two atoms of one mutex group
    return problem.replace("(:init", "(:init (holding a)", 1)


def test_supported_pays_only_a_solved_spec_whose_init_breaks_no_invariant(bw):
    d, p = bw.reference.domain, bw.reference.problem
    assert "handempty" in p.lower()
    verdicts = [_solved(), _solved(), _solved(plan=()), Verdict(success=False), Verdict(success=False, timed_out=True)]
    problems = [p, _broken(p), p, p, p]
    out = supported_score([""] * 5, verdicts=verdicts, problems=problems, domains=[d] * 5)
    assert out == [1.0, 0.0, 0.0, 0.0, None]
    # the planner-only reward it replaces pays the broken spec in full
    assert OUTCOME_SCORES["nontrivial"]([""] * 5, verdicts=verdicts)[1] == 1.0
    # broken_credit: a partial score for the broken one, still below the supported one
    part = supported_score([""] * 2, verdicts=verdicts[:2], problems=problems[:2], domains=[d] * 2, broken_credit=0.25)
    assert part == [1.0, 0.25]


def test_supported_keeps_nontrivial_where_the_signal_has_nothing_to_say(bw):
    d, p = bw.reference.domain, bw.reference.problem
    out = supported_score([""] * 2, verdicts=[_solved(), _solved()], problems=["(define (problem", p],
                          domains=["(define (domain none) (:predicates (p)))", d])
    assert out == [1.0, 1.0]  # an unreadable problem / a domain without invariants: no verdict either way
    with pytest.raises(ValueError, match="domains"):
        supported_score([""], verdicts=[_solved()], problems=[p])


def test_agreement_weight_shares_the_score_by_cluster(bw):
    d, p = bw.reference.domain, bw.reference.problem
    other = p.replace(p[p.index("(:goal"):], "(:goal (and (holding a))))")
    verdicts = [_solved()] * 4 + [_solved()]
    problems = [p, p, other, _broken(p), p]
    out = supported_score([""] * 5, verdicts=verdicts, problems=problems, domains=[d] * 5,
                          task_ids=["t", "t", "t", "t", "u"], agreement_weight=0.5)
    # task t: two of four agree on p, one alone on `other`, the broken one scores 0 and agrees with none
    assert out[:4] == [0.75, 0.75, 0.625, 0.0]
    assert out[4] == 1.0  # a lone sample agrees with itself


def test_config_knobs_and_small_profile():
    assert train_profile("small").reward == "supported"
    assert TrainConfig(reward="supported").judge_target == "score"
    with pytest.raises(Exception, match="judge_target"):
        TrainConfig(judge_target="faithful")
    with pytest.raises(Exception, match="broken_credit"):
        TrainConfig(broken_credit=1.5)


def test_judge_labels_follow_the_score_unless_told_verdict(bw):
    """rewarded_items labels the Judge's items with the reward's full score (a broken solved spec is
    a negative), or with the bare verdict under judge_target=verdict."""
    import functools

    from omtr.inference.episode import Episode, Step
    from omtr.rl.steps import rewarded_items

    task = bw.for_training().with_given_domain() if hasattr(bw.for_training(), "with_given_domain") else None
    if task is None:
        task = bw.with_given_domain().for_training()
    d, p = bw.reference.domain, bw.reference.problem
    eps = []
    for prob in (p, _broken(p)):
        ep = Episode(task=task, budget=1)
        ep.steps.append(Step(role="actor", index=0, text=prob, domain=d, problem=prob, verdict=_solved()))
        eps.append(ep)
    cfg = TrainConfig(reward="supported", samples_per_task=2, episodes_per_batch=2)
    score = functools.partial(OUTCOME_SCORES["supported"])
    items, judge = rewarded_items(eps, 0, cfg, score, 0, judge_term=False)
    assert [it.score for it in items] == [1.0, 0.0]
    assert [j.label for j in judge] == [True, False]
    _, judge_v = rewarded_items(eps, 0, cfg.replace(judge_target="verdict"), score, 0, judge_term=False)
    assert [j.label for j in judge_v] == [True, True]


def test_collapse_guard_reports_shares_clusters_and_changes():
    eq = lambda a, b: a[1][0] == b[1][0]  # noqa: E731  the problem's first letter is its cluster
    from omtr.faithfulness.signals import clusters

    g = CollapseGuard(clusters_fn=lambda specs: clusters(specs, eq), eq=eq)
    first = g.observe({"t": [("d", "x1"), ("d", "x2"), ("d", "y"), None], "u": [None, None]})
    assert first["top_cluster_share"] == pytest.approx((2 / 4 + 0) / 2)
    assert first["clusters_per_task"] == pytest.approx((2 + 0) / 2)
    assert "top_cluster_changed" not in first  # nothing seen before
    second = g.observe({"t": [("d", "y1"), ("d", "y2"), ("d", "y3"), ("d", "x")]})
    assert second["top_cluster_share"] == 0.75
    assert second["top_cluster_changed"] == 1.0  # x was on top, now y
    third = g.observe({"t": [("d", "y9")]})
    assert third["top_cluster_changed"] == 0.0


def test_supported_pays_in_full_only_a_problem_that_states_each_clause():
    """PlanBench Mystery's real text: the spelled reference scores 1; the same problem with a
    clause's atom written under another predicate (no invariant broken, still solved) scores
    ungrounded_credit * typed grounding; with grounding off the invariants alone decide (1)."""
    from omtr.evaluation.spelling import spelled_problem
    from omtr.faithfulness.signals import typed_grounding
    from omtr.tasks.planbench import import_config
    from omtr.tasks.planbench_data import shipped_root

    t = min(import_config(shipped_root(), "mystery_blocksworld"), key=lambda t: len(t.nl))
    d, p = t.reference.domain, spelled_problem(t).lower()
    i = p.index("(craves", p.index("(:init"))
    atom = p[i:p.index(")", i) + 1]
    wrong = p.replace(atom, f"(province {atom.split()[1]})", 1)
    g = typed_grounding(t.nl, d, wrong)
    assert 0 < g < 1
    kw = dict(verdicts=[_solved(), _solved()], problems=[p, wrong], domains=[d, d], nls=[t.nl, t.nl])
    assert supported_score([""] * 2, **kw) == [1.0, round(0.5 * g, 6)]
    assert supported_score([""] * 2, **kw, ungrounded_credit=0.0) == [1.0, 0.0]
    assert supported_score([""] * 2, **kw, grounding=False) == [1.0, 1.0]
    cfg = TrainConfig(reward="supported")
    assert cfg.grounding_support and cfg.ungrounded_credit == 0.5
    with pytest.raises(Exception, match="ungrounded_credit"):
        TrainConfig(ungrounded_credit=2.0)
