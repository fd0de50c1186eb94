"""Judge negatives made from the Actor's own specs (omtr.rl.negatives): one edit each, the spec's
own layout, a meaning the English does not state; no reference read. On PlanBench's real text and
the generators'."""

from __future__ import annotations

import random

import pytest

from omtr.evaluation.spelling import spelled_problem
from omtr.faithfulness.signals import _domain_predicates, typed_grounding
from omtr.faithfulness.support import unmentioned_objects
from omtr.pddl.model import parse_problem
from omtr.rl.negatives import KINDS, mutants
from omtr.tasks.generators import generate
from omtr.tasks.planbench import import_config
from omtr.tasks.planbench_data import shipped_root


def _tasks():
    out = [min(import_config(shipped_root(), fam), key=lambda t: len(t.nl))
           for fam in ("blocksworld", "mystery_blocksworld", "logistics", "depots")]
    return out + [generate(fam, 1, 11, verify=False)[0] for fam in ("gripper", "logistics")]


@pytest.mark.parametrize("task", _tasks(), ids=lambda t: t.id)
def test_each_kind_is_one_edit_that_the_english_does_not_state(task):
    d, p = task.reference.domain, spelled_problem(task)
    assert typed_grounding(task.nl, d, p) == 1.0
    seen = set()
    for seed in range(6):
        for kind, m in mutants(d, p, random.Random(seed), k=3):
            seen.add(kind)
            assert m != p
            parse_problem(m)  # still a problem
            if kind == "object":  # its facts may all be static (`(truck t0-p1)`): the names check sees it
                (new,) = set(parse_problem(m).objects) - set(parse_problem(p).objects)
                assert new in unmentioned_objects(task.nl, list(parse_problem(m).objects))[0]
            elif kind == "drop":
                gone = {tuple(a) for a in parse_problem(p).init} - {tuple(a) for a in parse_problem(m).init}
                static = any(a[0].lower() in _domain_predicates(d)[1] for a in gone)  # no clause states it
                assert typed_grounding(task.nl, d, m) < 1.0 or static, m
            # one edit in the spec's own text: everything before the first change is the spec's
            i = next(i for i, (a, b) in enumerate(zip(p, m)) if a != b)
            assert p[:i] == m[:i] and abs(len(m.splitlines()) - len(p.splitlines())) <= 1
            assert not any(line.strip() == "" for line in m.splitlines()) or any(
                line.strip() == "" for line in p.splitlines())  # no blank line left behind
    assert seen == set(KINDS)


def test_the_object_kind_joins_two_names_and_keeps_the_type():
    t = generate("gripper", 1, 11, verify=False)[0]
    d, p = t.reference.domain, spelled_problem(t)
    for seed in range(10):
        got = mutants(d, p, random.Random(seed), k=3, kinds=("object",))
        if got:
            break
    kind, m = got[0]
    before, after = parse_problem(p).objects, parse_problem(m).objects
    (new,) = set(after) - set(before)
    first, second = new.split("-", 1) if new.count("-") == 1 else (None, None)
    assert first in before and second in before and after[new] == before[first]


def test_seeded_and_nothing_for_what_does_not_read():
    t = _tasks()[0]
    d, p = t.reference.domain, spelled_problem(t)
    assert mutants(d, p, random.Random(3), k=3) == mutants(d, p, random.Random(3), k=3)
    assert mutants(d, "(define (problem", random.Random(0)) == []
    assert mutants("(define (domain", p, random.Random(0)) == []
    with pytest.raises(ValueError, match="unknown mutant kind"):
        mutants(d, p, random.Random(0), kinds=("shuffle",))


def test_rewarded_items_add_negatives_for_accepted_specs_only():
    """judge_negatives=K: each Actor spec the Judge learns as accepted brings K mutants labelled
    False, shown as the Judge sees specs; a rejected spec brings none; 0 (the default) adds none."""
    import functools

    from omtr.inference.episode import Episode, Step
    from omtr.rl.config import TrainConfig
    from omtr.rl.rewards import OUTCOME_SCORES
    from omtr.rl.steps import rewarded_items
    from omtr.solver.verdict import Verdict

    g = generate("blocksworld", 1, 4417, split="test", min_objects=3, max_objects=3, verify=False)[0]
    task = g.with_given_domain().for_training()
    d, p = g.reference.domain, spelled_problem(g)
    eps = []
    for ok in (True, False):
        ep = Episode(task=task, budget=1)
        ep.steps.append(Step(role="actor", index=0, text=p, domain=d, problem=p,
                             verdict=Verdict(success=ok, plan=["(pick-up red)"] if ok else None)))
        eps.append(ep)
    score = functools.partial(OUTCOME_SCORES["supported"])
    cfg = TrainConfig(reward="supported", samples_per_task=2, episodes_per_batch=2)
    _, plain = rewarded_items(eps, 0, cfg, score, 0, judge_term=False)
    assert [j.label for j in plain] == [True, False]
    _, more = rewarded_items(eps, 0, cfg.replace(judge_negatives=2), score, 0, judge_term=False)
    assert [j.label for j in more] == [True, False, False, False]
    shown = [m["content"] for j in more[1:3] for m in j.prompt if m["role"] == "user"]  # after their positive
    assert all(p not in s for s in shown) and len(set(shown)) == 2
    with pytest.raises(Exception, match="judge_negatives"):
        TrainConfig(judge_negatives=-1)
