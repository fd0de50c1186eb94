"""The environment never rejects a spec that Fast Downward and VAL solve.

* Every spec of the conformance suite (``conformance.py``, one per translator feature) is solved
  by the plain driver + VAL, and omtr answers it with a success and a plan VAL accepts.
* Every hand-written malformed example that lint rejects is rejected by the plain driver + VAL
  too: lint rejects only what the planner or VAL would reject (or what is provably wrong).
* The ``pddl`` package (AI-Planning) is an independent second reader: wherever it reads a spec,
  it must see the same declarations omtr's reader sees; a disagreement names the element.
"""

from __future__ import annotations

import pytest

from conformance import SUITE, ConformanceSpec
from omtr.config import SolverConfig
from omtr.paths import planbench_family
from omtr.pddl.categories import Category
from omtr.pddl.model import ROOT_TYPE, atoms_of
from omtr.solver import SolverPool, lint, validate_plan
from omtr.solver.examples import BW_DOMAIN, BW_PROBLEM, MALFORMED
from omtr.solver.naive import plain_driver_solves as naive_solves

LIMIT_S = 20


def _text(x: str | bytes) -> str:
    return x.decode("latin-1") if isinstance(x, bytes) else x


def plain_driver_solves(domain: str | bytes, problem: str | bytes) -> tuple[bool, str]:
    """The naive way: Fast Downward's own driver (lama-first), then VAL on its plan."""
    return naive_solves(domain, problem, time_limit_s=LIMIT_S, memory_limit_mb=2048)


@pytest.fixture(scope="module")
def pool():
    with SolverPool(2, SolverConfig(time_limit_s=LIMIT_S, cache=False)) as p:
        yield p


# ------------------------------------------------------------------------------ conformance


@pytest.mark.parametrize("spec", SUITE, ids=lambda s: s.name)
def test_conformance_spec_is_solved_like_the_planner_solves_it(spec: ConformanceSpec, pool):
    ok, output = plain_driver_solves(spec.domain, spec.problem)
    assert ok, f"the suite's own premise failed: Fast Downward + VAL do not solve {spec.name}:\n{output}"
    v = pool.solve(spec.domain, spec.problem)
    assert v.success, f"{spec.name} ({', '.join(spec.features)}): {v.category}: {v.message}"
    assert v.category is None and v.stage == "done" and v.plan_length == len(v.plan)
    check = validate_plan(_text(spec.domain), _text(spec.problem), v.plan)
    assert check.valid, f"{spec.name}: VAL rejects omtr's plan: {check.message}"


def test_the_suite_covers_every_translator_feature():
    covered = {f for s in SUITE for f in s.features}
    wanted = {
        "typing", "either", "multiple-parents", "constants", "negative-preconditions", "equality",
        "disjunctive-preconditions", "existential-preconditions", "universal-preconditions",
        "conditional-effects", "universal-effects", "derived-predicates", "action-costs",
        "untyped-objects", "layout", "comments", "glued-variables", "latin-1-comments",
        "negated-init", "duplicate-action", "undeclared-derived",
    }
    assert wanted <= covered, sorted(wanted - covered)


# -------------------------------------------------- lint rejects only what the planner rejects


REJECTED_BY_LINT = [ex for ex in MALFORMED if lint(ex.domain, ex.problem).error is not None]


def test_lint_rejects_some_examples_itself():
    assert len(REJECTED_BY_LINT) >= 12  # the guard below is not vacuous


@pytest.mark.parametrize("ex", REJECTED_BY_LINT, ids=lambda e: e.name)
def test_a_spec_lint_rejects_is_one_the_planner_or_val_rejects(ex):
    ok, output = plain_driver_solves(ex.domain, ex.problem)
    assert not ok, (
        f"lint rejects {ex.name} ({lint(ex.domain, ex.problem).error.message}) but Fast Downward + VAL "
        f"solve it; make that check a warning\n{output}"
    )


def test_unusual_but_legal_input_is_a_warning():
    # Each of these is accepted by Fast Downward and VAL; omtr warns and solves.
    domain = BW_DOMAIN.replace("(:requirements :strips)", "(:requirements :strips :derived-predicates)")
    cases = {
        "negated atom in :init": (BW_DOMAIN, BW_PROBLEM.replace("(clear c))", "(clear c) (not (holding a)))")),
        "duplicate action": (BW_DOMAIN.replace(
            "  (:action put-down",
            "  (:action put-down :parameters (?x) :precondition (holding ?x)"
            " :effect (and (clear ?x) (handempty) (ontable ?x) (not (holding ?x))))\n  (:action put-down",
        ), BW_PROBLEM),
        "undeclared derived predicate": (domain.replace(
            "(:action pick-up", "(:derived (above ?x) (exists (?y) (on ?x ?y)))\n  (:action pick-up", 1
        ), BW_PROBLEM),
    }
    for name, (d, p) in cases.items():
        res = lint(d, p)
        assert res.error is None, (name, res.error and res.error.message)
        assert res.warnings, name
        assert plain_driver_solves(d, p)[0], name


def test_an_undeclared_type_matters_only_where_its_predicate_is_used(pool):
    spec = next(s for s in SUITE if s.name == "typing-inheritance-either")
    unused = spec.domain.replace("(stocked ?p - (either depot market)))", "(stocked ?p - (either depot market))\n"
                                 "               (near ?p - harbour))")
    assert plain_driver_solves(unused, spec.problem)[0]
    res = lint(unused, spec.problem)
    assert res.error is None and any("`harbour`" in w for w in res.warnings), res.warnings
    assert pool.solve(unused, spec.problem).success
    used = unused.replace("(stocked ?p) (not (in ?c ?t))", "(stocked ?p) (near ?p) (not (in ?c ?t))")
    assert not plain_driver_solves(used, spec.problem)[0]
    res = lint(used, spec.problem)
    assert res.error is not None and res.error.category == Category.OBJECT_TYPE
    assert "`harbour`" in res.error.message


def test_a_parent_type_named_only_in_types_is_a_type(pool):
    # (:types crate - thing): `thing` is never declared itself. Fast Downward reads it as a type
    # under object; VAL accepts it too as long as no type check has to pass through it (here every
    # parameter and predicate is typed `crate`). omtr warns and solves.
    domain = """(define (domain stacking)
  (:requirements :strips :typing)
  (:types crate - thing)
  (:predicates (clear ?x - crate) (on-floor ?x - crate) (free) (held ?x - crate) (on ?x ?y - crate))
  (:action lift :parameters (?x - crate)
    :precondition (and (clear ?x) (on-floor ?x) (free))
    :effect (and (held ?x) (not (clear ?x)) (not (on-floor ?x)) (not (free))))
  (:action put-on :parameters (?x ?y - crate)
    :precondition (and (held ?x) (clear ?y))
    :effect (and (on ?x ?y) (clear ?x) (free) (not (held ?x)) (not (clear ?y)))))
"""
    problem = """(define (problem two) (:domain stacking) (:objects a b - crate)
  (:init (free) (on-floor a) (on-floor b) (clear a) (clear b)) (:goal (on a b)))"""
    assert plain_driver_solves(domain, problem)[0]
    res = lint(domain, problem)
    assert res.error is None, res.error.message
    assert any("`thing`" in w for w in res.warnings), res.warnings
    v = pool.solve(domain, problem)
    assert v.success, f"{v.category}: {v.message}"
    assert validate_plan(domain, problem, v.plan).valid


def test_derived_goal_blames_the_rule_when_unsolvable(pool):
    spec = next(s for s in SUITE if s.name == "derived-predicates")
    # s2 is linked to nothing: the derived predicate `reached` can never hold for it.
    problem = spec.problem.replace("(link s1 s2)", "")
    v = pool.solve(spec.domain, problem)
    assert not v.success and v.category == Category.GOAL_CONSTRAINT, v.message
    assert "derived predicate `reached`" in v.message and "no action adds" not in v.message


# ----------------------------------------------------------- a second, independent reader


def omtr_view(domain: str, problem: str) -> dict[str, object]:
    res = lint(domain, problem)
    assert res.domain is not None and res.problem is not None, res.error and res.error.message
    d, p = res.domain, res.problem

    def types_of(t: str) -> frozenset:
        return frozenset(t.split(":")[1:]) if t.startswith("either:") else frozenset({t})

    return {
        "domain name": d.name,
        "types": {t: frozenset(ps) for t, ps in d.types.items()},
        "constants": {c: types_of(t) for c, t in d.constants.items()},
        "predicates": {n: tuple(types_of(t) for _, t in ps) for n, ps in d.predicates.items()},
        "actions": {n: tuple(types_of(t) for _, t in a.parameters) for n, a in d.actions.items()},
        "derived predicates": frozenset(d.derived_predicates),
        "problem name": p.name,
        "objects": {o: types_of(t) for o, t in p.objects.items()},
        "init": frozenset(tuple(a) for a in p.init if a.head not in ("=", "not")),
        "goal atoms": frozenset(tuple(a) for a, _, bound in atoms_of(p.goal) if not bound and a[0] != "="),
    }


_PARSERS: dict[str, object] = {}


def _pddl_parse(kind: str, text: str):
    """Parse with a reused ``pddl`` parser (building one costs ~0.1 s, a parse ~5 ms); a parser
    is unusable after an error, so a failed parse drops it."""
    if kind not in _PARSERS:
        from pddl.parser.domain import DomainParser
        from pddl.parser.problem import ProblemParser

        _PARSERS[kind] = DomainParser() if kind == "domain" else ProblemParser()
    try:
        return _PARSERS[kind](text)
    except Exception:
        del _PARSERS[kind]
        raise


def pddl_view(domain: str, problem: str) -> dict[str, object]:
    """What the ``pddl`` package reads, in lower case (PDDL names are case-insensitive, ``pddl``
    keeps the case as written); raises where it does not support a feature."""
    from pddl.logic.base import And, Imply, Not, Or
    from pddl.logic.predicates import Predicate

    d = _pddl_parse("domain", domain)
    p = _pddl_parse("problem", problem)

    def low(x) -> str:
        return str(x).lower()

    def tags(term) -> frozenset:
        return frozenset(low(t) for t in term.type_tags) or frozenset({ROOT_TYPE})

    def atoms(f):
        if isinstance(f, Predicate):
            yield (low(f.name), *(low(t) for t in f.terms))
        elif isinstance(f, (And, Or)):
            for g in f.operands:
                yield from atoms(g)
        elif isinstance(f, Not):
            yield from atoms(f.argument)
        elif isinstance(f, Imply):
            yield from atoms(f.left)
            yield from atoms(f.right)

    return {
        "domain name": low(d.name),
        "types": {low(t): frozenset({low(parent) if parent else ROOT_TYPE}) for t, parent in d.types.items()},
        "constants": {low(c.name): tags(c) for c in d.constants},
        "predicates": {low(q.name): tuple(tags(t) for t in q.terms) for q in d.predicates},
        "actions": {low(a.name): tuple(tags(t) for t in a.parameters) for a in d.actions},
        "derived predicates": frozenset(low(x.predicate.name) for x in d.derived_predicates),
        "problem name": low(p.name),
        "objects": {low(o.name): tags(o) for o in p.objects},
        "init": frozenset((low(a.name), *(low(t) for t in a.terms)) for a in p.init if isinstance(a, Predicate)),
        "goal atoms": frozenset(atoms(p.goal)),
    }


def disagreements(ours: dict, theirs: dict) -> list[str]:
    out = []
    for part, mine in ours.items():
        other = theirs[part]
        if isinstance(mine, dict):
            for name in sorted(set(mine) | set(other)):
                if mine.get(name) != other.get(name):
                    out.append(f"{part} `{name}`: omtr reads {mine.get(name)}, pddl reads {other.get(name)}")
        elif isinstance(mine, frozenset):
            for name in sorted(mine ^ other):
                out.append(f"{part}: {name} only in {'omtr' if name in mine else 'pddl'}'s reading")
        elif mine != other:
            out.append(f"{part}: omtr reads {mine!r}, pddl reads {other!r}")
    return out


def _differential(specs) -> tuple[int, list[str], list[str]]:
    """(compared, disagreements, skipped) over (id, domain, problem) triples."""
    compared, problems, skipped = 0, [], []
    for sid, d, p in specs:
        try:
            theirs = pddl_view(d, p)
        except Exception as exc:  # noqa: BLE001 - pddl does not read this feature: nothing to compare
            skipped.append(f"{sid}: {type(exc).__name__}")
            continue
        compared += 1
        problems.extend(f"{sid}: {x}" for x in disagreements(omtr_view(d, p), theirs))
    return compared, problems, skipped


def test_second_reader_agrees_on_the_conformance_suite():
    compared, problems, skipped = _differential((s.name, _text(s.domain), _text(s.problem)) for s in SUITE)
    assert not problems, "\n".join(problems)
    assert compared >= 8, skipped  # pddl reads most of the suite; the rest uses what it lacks


@pytest.mark.parametrize("family", ["blocksworld", "mystery_blocksworld", "logistics", "depots"])
def test_second_reader_agrees_on_every_planbench_reference(family, benchmarks):
    domain, files = planbench_family(family, benchmarks)
    compared, problems, skipped = _differential((f.name, domain, f.read_text()) for f in files)
    assert not problems, "\n".join(problems[:20])
    assert compared == len(files), skipped[:5]


def test_second_reader_agrees_on_generated_specs():
    from omtr.faithfulness.mutators import family_specs

    specs = [s for fam in ("blocksworld", "mystery_blocksworld", "logistics", "gripper")
             for s in family_specs(fam, 25, seed=3)]
    compared, problems, skipped = _differential(specs)
    assert not problems, "\n".join(problems[:20])
    assert compared == len(specs), skipped[:5]


def test_a_disagreement_names_the_element():
    ours = omtr_view(BW_DOMAIN, BW_PROBLEM)
    theirs = pddl_view(BW_DOMAIN, BW_PROBLEM.replace("(on c a)", "(on a c)"))
    found = disagreements(ours, theirs)
    assert any("init" in x and "'on', 'c', 'a'" in x for x in found), found
