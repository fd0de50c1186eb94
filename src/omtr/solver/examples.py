"""Hand-written specs for demos, tests and the throughput benchmark.

Two small, valid bases (an untyped BlocksWorld and a typed Gripper) and malformed variants, each
labelled with the diagnostic category the environment must give and a word its message must name.
"""

from __future__ import annotations

from dataclasses import dataclass

BW_DOMAIN = """; BlocksWorld with four operators
(define (domain bw4)
  (:requirements :strips)
  (:predicates (clear ?x) (ontable ?x) (handempty) (holding ?x) (on ?x ?y))
  (:action pick-up
    :parameters (?x)
    :precondition (and (clear ?x) (ontable ?x) (handempty))
    :effect (and (holding ?x) (not (clear ?x)) (not (ontable ?x)) (not (handempty))))
  (:action put-down
    :parameters (?x)
    :precondition (holding ?x)
    :effect (and (clear ?x) (handempty) (ontable ?x) (not (holding ?x))))
  (:action stack
    :parameters (?x ?y)
    :precondition (and (clear ?y) (holding ?x))
    :effect (and (handempty) (clear ?x) (on ?x ?y) (not (clear ?y)) (not (holding ?x))))
  (:action unstack
    :parameters (?x ?y)
    :precondition (and (on ?x ?y) (clear ?x) (handempty))
    :effect (and (holding ?x) (clear ?y) (not (on ?x ?y)) (not (clear ?x)) (not (handempty)))))
"""

BW_PROBLEM = """(define (problem bw-3)
  (:domain bw4)
  (:objects a b c)
  (:init (handempty) (ontable a) (ontable b) (on c a) (clear b) (clear c))
  (:goal (and (on a b) (on b c))))
"""

GRIPPER_DOMAIN = """(define (domain gripper-typed)
  (:requirements :strips :typing)
  (:types room ball gripper)
  (:predicates (at-robby ?r - room) (at ?b - ball ?r - room) (free ?g - gripper) (carry ?b - ball ?g - gripper))
  (:action move
    :parameters (?from ?to - room)
    :precondition (at-robby ?from)
    :effect (and (at-robby ?to) (not (at-robby ?from))))
  (:action pick
    :parameters (?b - ball ?r - room ?g - gripper)
    :precondition (and (at ?b ?r) (at-robby ?r) (free ?g))
    :effect (and (carry ?b ?g) (not (at ?b ?r)) (not (free ?g))))
  (:action drop
    :parameters (?b - ball ?r - room ?g - gripper)
    :precondition (and (carry ?b ?g) (at-robby ?r))
    :effect (and (at ?b ?r) (free ?g) (not (carry ?b ?g)))))
"""

GRIPPER_PROBLEM = """(define (problem gripper-2)
  (:domain gripper-typed)
  (:objects rooma roomb - room ball1 ball2 - ball left right - gripper)
  (:init (at-robby rooma) (free left) (free right) (at ball1 rooma) (at ball2 rooma))
  (:goal (and (at ball1 roomb) (at ball2 roomb))))
"""


@dataclass(frozen=True)
class Example:
    name: str
    category: str | None  # expected diagnostic category; None for a valid spec
    domain: str
    problem: str
    mentions: str = ""  # a word the diagnostic message must contain


def _variant(base_domain: str, base_problem: str, name, category, mentions, *, dom=(), prob=()) -> Example:
    """A base spec with textual edits (each ``old`` must occur in the base)."""
    d, p = base_domain, base_problem
    for old, new in dom:
        assert old in d, old
        d = d.replace(old, new)
    for old, new in prob:
        assert old in p, old
        p = p.replace(old, new)
    return Example(name, category, d, p, mentions)


def _bw(*args, **kw) -> Example:
    return _variant(BW_DOMAIN, BW_PROBLEM, *args, **kw)


def _gr(*args, **kw) -> Example:
    return _variant(GRIPPER_DOMAIN, GRIPPER_PROBLEM, *args, **kw)


VALID = [
    Example("bw-valid", None, BW_DOMAIN, BW_PROBLEM),
    Example("gripper-valid", None, GRIPPER_DOMAIN, GRIPPER_PROBLEM),
]

MALFORMED = [
    # --- syntax
    _bw("syntax-missing-paren", "syntax", "never closed",
        dom=[("(not (handempty))))\n  (:action put-down", "(not (handempty)))\n  (:action put-down")]),
    _bw("syntax-unknown-section", "syntax", ":objectz", prob=[("(:objects a b c)", "(:objectz a b c)")]),
    _bw("syntax-double-paren-formula", "syntax", "and",
        dom=[(":precondition (and (clear ?y) (holding ?x))", ":precondition ((clear ?y) (holding ?x))")]),
    _bw("syntax-init-true-and-false", "syntax", "both true and false",
        prob=[("(clear c))", "(clear c) (not (clear c)))")]),
    # --- object_type
    _bw("object-undeclared-in-init", "object_type", "`d`", prob=[("(clear b)", "(clear b) (clear d)")]),
    _gr("object-undeclared-param-type", "object_type", "`rom`",
        dom=[(":parameters (?from ?to - room)", ":parameters (?from ?to - rom)")]),
    _gr("object-wrong-type-in-init", "object_type", "`ball1`", prob=[("(at-robby rooma)", "(at-robby ball1)")]),
    _gr("object-undeclared-object-type", "object_type", "`bal`", prob=[("ball1 ball2 - ball", "ball1 ball2 - bal")]),
    _gr("object-constant-redeclared", "object_type", "`rooma`",
        dom=[("(:types room ball gripper)", "(:types room ball gripper)\n  (:constants rooma - room)")]),
    # --- predicate_schema
    _bw("schema-undeclared-predicate", "predicate_schema", "`holdin`",
        dom=[(":precondition (holding ?x)", ":precondition (holdin ?x)")]),
    _bw("schema-arity-mismatch", "predicate_schema", "`on`",
        dom=[("(on ?x ?y) (clear ?x) (handempty))", "(on ?x) (clear ?x) (handempty))")]),
    _bw("schema-unbound-parameter", "predicate_schema", "?z",
        dom=[("(handempty) (clear ?x) (on ?x ?y)", "(handempty) (clear ?z) (on ?x ?y)")]),
    _bw("schema-action-without-effect", "predicate_schema", "`put-down`",
        dom=[(":precondition (holding ?x)\n    :effect (and (clear ?x) (handempty) (ontable ?x) (not (holding ?x))))",
              ":precondition (holding ?x))")]),
    # --- precondition_effect
    _bw("effect-contradictory-precondition", "precondition_effect", "`stack`",
        dom=[(":precondition (and (clear ?y) (holding ?x))", ":precondition (and (clear ?y) (holding ?x) (not (holding ?x)))")]),
    _bw("effect-pickup-never-holds", "precondition_effect", "`stack`",
        dom=[(":effect (and (holding ?x) (not (clear ?x))", ":effect (and (not (clear ?x))"),
             ("(and (holding ?x) (clear ?y) (not (on ?x ?y))", "(and (clear ?y) (not (on ?x ?y))")]),
    _gr("effect-never-free", "precondition_effect", "`pick`",
        prob=[("(free left) (free right) ", "")]),
    # --- goal_constraint
    _bw("goal-undeclared-object", "goal_constraint", "`b9`", prob=[("(on b c)", "(on b b9)")]),
    _bw("goal-undeclared-predicate", "goal_constraint", "`above`", prob=[("(on b c)", "(above b c)")]),
    _gr("goal-static-impossible", "goal_constraint", "carry",
        dom=[("(carry ?b ?g) (not (at ?b ?r)) (not (free ?g))", "(not (at ?b ?r)) (not (free ?g))")],
        prob=[("(at ball2 roomb)", "(carry ball2 left)")]),
    # --- unreachable_search
    _bw("search-cycle-goal", "unreachable_search", "unsolvable",
        prob=[("(and (on a b) (on b c))", "(and (on a b) (on b c) (on c a))")]),
    _bw("search-self-on", "unreachable_search", "unsolvable", prob=[("(and (on a b) (on b c))", "(on a a)")]),
    _gr("search-mutex-goal", "unreachable_search", "unsolvable",
        prob=[("(and (at ball1 roomb) (at ball2 roomb))", "(and (at ball1 roomb) (at ball1 rooma))")]),
]

ALL = VALID + MALFORMED
