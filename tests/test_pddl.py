"""The PDDL reader and structural model."""

import pytest

from omtr.pddl import SpecError, atoms_of, parse_domain, parse_problem, read_sexpr
from omtr.pddl.categories import Category
from omtr.pddl.sexpr import SExprError


def test_reader_lowercases_strips_comments_and_keeps_lines():
    x = read_sexpr("(Define ; comment (\n (Domain BW))")
    assert x == ["define", ["domain", "bw"]]
    assert x[1].line == 2


def test_reader_errors_name_the_line():
    with pytest.raises(SExprError, match="opened at line 1 is never closed"):
        read_sexpr("(define\n (domain x)")
    with pytest.raises(SExprError, match="unexpected '\\)' at line 3"):
        read_sexpr("(define\n (domain x))\n)")
    with pytest.raises(SExprError, match="deeper than 8"):
        read_sexpr("(" * 9 + ")" * 9, max_depth=8)


def test_effect_reading_leaves_out_when_conditions():
    f = read_sexpr("(and (p ?x) (when (q ?x) (not (r ?x))))")
    assert [(list(a), n) for a, n, _ in atoms_of(f, effect=True)] == [(["p", "?x"], False), (["r", "?x"], True)]
    assert ["q", "?x"] in [list(a) for a, _, _ in atoms_of(f)]


def test_typed_lists_and_either():
    d = parse_domain("""(define (domain t) (:requirements :typing)
      (:types car truck - vehicle vehicle place)
      (:predicates (at ?v - vehicle ?p - place) (near ?x - (either car place)))
      (:action go :parameters (?v - vehicle ?from ?to - place) :effect (at ?v ?to)))""")
    assert d.types == {"car": ("vehicle",), "truck": ("vehicle",), "vehicle": ("object",), "place": ("object",)}
    assert d.predicates["near"] == [("?x", "either:car:place")]
    assert d.is_subtype("car", "vehicle") and not d.is_subtype("place", "vehicle")
    assert d.actions["go"].parameters == [("?v", "vehicle"), ("?from", "place"), ("?to", "place")]


def test_problem_requires_a_goal():
    with pytest.raises(SpecError) as e:
        parse_problem("(define (problem p) (:domain d) (:objects a) (:init))")
    assert e.value.category == Category.GOAL_CONSTRAINT
