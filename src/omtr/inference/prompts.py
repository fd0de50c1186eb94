"""The three roles' prompts, as chat messages, and their hand-written demonstrations.

* Actor: task -> spec (one-shot: a demonstration of the task's family, or a generic one).
* Judge: task + spec -> score (the Judge's head reads the prompt; no answer text is generated).
* Editor: task + latest spec + latest diagnostic -> repaired spec.

Prompts read a task's ``nl``, ``family`` and given ``domain`` and nothing else, so they work on a
``TrainingTask`` (which has no reference) and on a user's NL-only task. The demonstrations below
were written by hand for these prompts; they are not taken from any task file or generator, and
their instances are not ones the generators produce (other object names, other vocabularies).

The answer format asked for: the domain ``(define (domain ...))`` then the problem
``(define (problem ...))``, plain or in ```pddl fences (``omtr.inference.extract`` reads both).

The domain-given mode (a task whose record carries ``domain``): the prompts show that domain before
the task's text (under :data:`GIVEN_HEAD`) and ask for the problem alone; the demonstration shows
its own domain as given and its problem as the answer; the Editor sees and repairs the problem
only; the Judge sees the task, the given domain and the problem.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from omtr.policy import Messages


class TaskLike(Protocol):
    """What a prompt reads from a task (``TrainingTask`` and ``Task`` both have it; ``domain``,
    the given domain, is read with ``getattr`` so that objects without it are full-mode tasks)."""

    nl: str
    family: str | None


def given_domain(task) -> str | None:
    """The task's given domain (PDDL text), or None in the full mode."""
    return getattr(task, "domain", None) or None


@dataclass(frozen=True)
class Demo:
    """One worked example: a task in English and its PDDL answer."""

    nl: str
    domain: str
    problem: str
    # The English uses the domain's own predicate and action names as words (Mystery
    # BlocksWorld's style): shown in a given domain's vocabulary, those words are renamed too.
    names_in_text: bool = False

    @property
    def answer(self) -> str:
        return f"{self.domain}\n\n{self.problem}"


SYSTEM = (
    "You translate planning tasks written in English into PDDL for a classical planner. "
    "Answer with the domain (define (domain ...)) and then the problem (define (problem ...)), "
    "nothing else. Use lower-case names; declare every predicate, type and object you use."
)

SYSTEM_EDITOR = (
    "You repair PDDL that a classical planner rejected. Read the planner's diagnostic, fix the "
    "cause, and answer with the complete corrected domain (define (domain ...)) and then the "
    "complete problem (define (problem ...)), nothing else."
)

SYSTEM_GIVEN = (
    "You translate planning tasks written in English into PDDL for a classical planner. The domain "
    "is given with the task; answer with the problem (define (problem ...)) for that domain, nothing "
    "else. Use the given domain's name, predicates, types and constants; declare every object you use."
)

SYSTEM_EDITOR_GIVEN = (
    "You repair a PDDL problem that a classical planner rejected; its domain is given and correct. "
    "Read the planner's diagnostic, fix the cause, and answer with the complete corrected problem "
    "(define (problem ...)) for the given domain, nothing else."
)

# How a prompt shows a given domain: first, under this line (what a family shares comes before
# the task's own statement, so that the prompts of a family's tasks share nearly all their tokens
# and the rollout engine's prefix cache computes them once; see omtr.rollout.prefix_cache).
GIVEN_HEAD = "Given domain:\n"
GIVEN_MARK = "\n\nGiven domain:\n"  # the former order: the task's text, then the domain under this line
_GIVEN_ASK = "\n\nWrite the problem (define (problem ...)) for this domain, for the task below.\n\n"
STATEMENT = "[STATEMENT]"  # PlanBench's marker between a family's description and the task's own statement

SYSTEM_JUDGE = (
    "You judge whether PDDL written for a planning task will be accepted by a classical planner: "
    "both files parse, a plan exists, and the plan reaches the goal."
)

# ----------------------------------------------------------------------------- demonstrations

_BLOCKS = Demo(
    nl=(
        "I move blocks with one hand, one at a time. A block is clear when nothing is on it and I "
        "am not holding it. I can pick up a clear block from the table when my hand is empty, put "
        "down the block I hold on the table, stack the block I hold on a clear block, and unstack a "
        "clear block from the block under it when my hand is empty.\n[STATEMENT]\n"
        "As initial conditions I have that, the green block is clear, the hand is empty, the green "
        "block is on top of the white block and the white block is on the table.\n"
        "My goal is to have that the white block is on top of the green block."
    ),
    domain="""(define (domain blocks)
  (:requirements :strips)
  (:predicates (clear ?b) (on-table ?b) (on ?b ?c) (holding ?b) (hand-empty))
  (:action pick-up :parameters (?b)
    :precondition (and (clear ?b) (on-table ?b) (hand-empty))
    :effect (and (holding ?b) (not (clear ?b)) (not (on-table ?b)) (not (hand-empty))))
  (:action put-down :parameters (?b)
    :precondition (holding ?b)
    :effect (and (on-table ?b) (clear ?b) (hand-empty) (not (holding ?b))))
  (:action stack :parameters (?b ?c)
    :precondition (and (holding ?b) (clear ?c))
    :effect (and (on ?b ?c) (clear ?b) (hand-empty) (not (holding ?b)) (not (clear ?c))))
  (:action unstack :parameters (?b ?c)
    :precondition (and (on ?b ?c) (clear ?b) (hand-empty))
    :effect (and (holding ?b) (clear ?c) (not (on ?b ?c)) (not (clear ?b)) (not (hand-empty)))))""",
    problem="""(define (problem green-white)
  (:domain blocks)
  (:objects green white)
  (:init (clear green) (hand-empty) (on green white) (on-table white))
  (:goal (on white green)))""",
)

# Mystery tasks rename everything; the demonstration uses a vocabulary of its own so that the
# model learns to take names from the task's text.
_MYSTERY = Demo(
    nl=(
        "I work with a set of objects and four kinds of action, with these rules:\n"
        "Light object: possible only when spark object, ground object and calm are all true. "
        "Afterwards glow object is true, and spark object, ground object and calm become false.\n"
        "Douse object: possible only when glow object is true. Afterwards spark object, calm and "
        "ground object are true, and glow object becomes false.\n"
        "Join object to another object: possible only when glow object and spark other object are "
        "true. Afterwards calm, spark object and object links other object are true, and spark "
        "other object and glow object become false.\n"
        "Split object from another object: possible only when object links other object, spark "
        "object and calm are all true. Afterwards glow object and spark other object are true, and "
        "object links other object, spark object and calm become false.\n[STATEMENT]\n"
        "As initial conditions I have that, spark object p, spark object q, calm, ground object p "
        "and ground object q.\nMy goal is to have that object q links object p."
    ),
    domain="""(define (domain lights)
  (:requirements :strips)
  (:predicates (spark ?x) (ground ?x) (calm) (glow ?x) (links ?x ?y))
  (:action light :parameters (?x)
    :precondition (and (spark ?x) (ground ?x) (calm))
    :effect (and (glow ?x) (not (spark ?x)) (not (ground ?x)) (not (calm))))
  (:action douse :parameters (?x)
    :precondition (glow ?x)
    :effect (and (spark ?x) (calm) (ground ?x) (not (glow ?x))))
  (:action join :parameters (?x ?y)
    :precondition (and (glow ?x) (spark ?y))
    :effect (and (calm) (spark ?x) (links ?x ?y) (not (spark ?y)) (not (glow ?x))))
  (:action split :parameters (?x ?y)
    :precondition (and (links ?x ?y) (spark ?x) (calm))
    :effect (and (glow ?x) (spark ?y) (not (links ?x ?y)) (not (spark ?x)) (not (calm)))))""",
    problem="""(define (problem p-q)
  (:domain lights)
  (:objects p q)
  (:init (spark p) (spark q) (calm) (ground p) (ground q))
  (:goal (links q p)))""",
    names_in_text=True,
)

_LOGISTICS = Demo(
    nl=(
        "I move packages between locations with trucks and airplanes. Every location is in one "
        "city; some locations are airports. Trucks load, unload and drive between locations of "
        "their city; airplanes load, unload and fly between airports.\n[STATEMENT]\n"
        "As initial conditions I have that, north_port is an airport, south_port is an airport, "
        "north_port and north_mill are in the city north, south_port is in the city south, van_1 "
        "is at north_mill, jet_1 is at north_port and crate_1 is at north_mill.\n"
        "My goal is to have that crate_1 is at south_port."
    ),
    domain="""(define (domain transport)
  (:requirements :strips :typing)
  (:types truck airplane - vehicle package vehicle - thing airport - location thing location city)
  (:predicates (at ?x - thing ?l - location) (in ?p - package ?v - vehicle) (in-city ?l - location ?c - city))
  (:action load-truck :parameters (?p - package ?v - truck ?l - location)
    :precondition (and (at ?v ?l) (at ?p ?l)) :effect (and (in ?p ?v) (not (at ?p ?l))))
  (:action unload-truck :parameters (?p - package ?v - truck ?l - location)
    :precondition (and (at ?v ?l) (in ?p ?v)) :effect (and (at ?p ?l) (not (in ?p ?v))))
  (:action load-airplane :parameters (?p - package ?v - airplane ?l - airport)
    :precondition (and (at ?v ?l) (at ?p ?l)) :effect (and (in ?p ?v) (not (at ?p ?l))))
  (:action unload-airplane :parameters (?p - package ?v - airplane ?l - airport)
    :precondition (and (at ?v ?l) (in ?p ?v)) :effect (and (at ?p ?l) (not (in ?p ?v))))
  (:action drive :parameters (?v - truck ?l1 ?l2 - location ?c - city)
    :precondition (and (at ?v ?l1) (in-city ?l1 ?c) (in-city ?l2 ?c))
    :effect (and (at ?v ?l2) (not (at ?v ?l1))))
  (:action fly :parameters (?v - airplane ?l1 ?l2 - airport)
    :precondition (at ?v ?l1) :effect (and (at ?v ?l2) (not (at ?v ?l1)))))""",
    problem="""(define (problem crate-south)
  (:domain transport)
  (:objects north_port south_port - airport north_mill - location north south - city
            van_1 - truck jet_1 - airplane crate_1 - package)
  (:init (in-city north_port north) (in-city north_mill north) (in-city south_port south)
         (at van_1 north_mill) (at jet_1 north_port) (at crate_1 north_mill))
  (:goal (at crate_1 south_port)))""",
)

_GRIPPER = Demo(
    nl=(
        "A robot with two grippers, a left one and a right one, carries balls between rooms; each "
        "gripper holds one ball at a time. The robot can move between rooms, pick a ball in its "
        "room with a free gripper, and drop a carried ball in its room.\n[STATEMENT]\n"
        "As initial conditions I have that, the robot is in hall, the left gripper is free, the "
        "right gripper is free and ball_red is in hall.\nMy goal is to have that ball_red is in attic."
    ),
    domain="""(define (domain carry)
  (:requirements :strips :typing)
  (:types room ball gripper)
  (:predicates (robot-at ?r - room) (ball-at ?b - ball ?r - room) (free ?g - gripper) (holds ?g - gripper ?b - ball))
  (:action move :parameters (?from ?to - room)
    :precondition (robot-at ?from)
    :effect (and (robot-at ?to) (not (robot-at ?from))))
  (:action pick :parameters (?b - ball ?r - room ?g - gripper)
    :precondition (and (ball-at ?b ?r) (robot-at ?r) (free ?g))
    :effect (and (holds ?g ?b) (not (ball-at ?b ?r)) (not (free ?g))))
  (:action drop :parameters (?b - ball ?r - room ?g - gripper)
    :precondition (and (holds ?g ?b) (robot-at ?r))
    :effect (and (ball-at ?b ?r) (free ?g) (not (holds ?g ?b)))))""",
    problem="""(define (problem red-to-attic)
  (:domain carry)
  (:objects hall attic - room ball_red - ball left right - gripper)
  (:init (robot-at hall) (free left) (free right) (ball-at ball_red hall))
  (:goal (ball-at ball_red attic)))""",
)

# For tasks of no known family (the user's own).
_GENERIC = Demo(
    nl=(
        "A cleaning robot moves between connected rooms and can mop the room it is in. The hall "
        "is connected to the kitchen and the kitchen to the hall. The robot is in the hall and "
        "both rooms are dirty. Make the kitchen clean."
    ),
    domain="""(define (domain cleaning)
  (:requirements :strips :typing)
  (:types room)
  (:predicates (robot-in ?r - room) (connected ?a ?b - room) (clean ?r - room))
  (:action go :parameters (?from ?to - room)
    :precondition (and (robot-in ?from) (connected ?from ?to))
    :effect (and (robot-in ?to) (not (robot-in ?from))))
  (:action mop :parameters (?r - room)
    :precondition (robot-in ?r)
    :effect (clean ?r)))""",
    problem="""(define (problem mop-kitchen)
  (:domain cleaning)
  (:objects hall kitchen - room)
  (:init (robot-in hall) (connected hall kitchen) (connected kitchen hall))
  (:goal (clean kitchen)))""",
)

DEMOS: dict[str, Demo] = {
    "blocksworld": _BLOCKS,
    "mystery_blocksworld": _MYSTERY,
    "logistics": _LOGISTICS,
    "gripper": _GRIPPER,
}
GENERIC = _GENERIC


def demo_for(family: str | None, domain: str | None = None) -> Demo:
    """The demonstration of a task's family; the generic one for unknown families. ``domain`` (the
    domain-given mode): the demonstration in that domain's vocabulary where it is the
    demonstration's domain up to renaming (:mod:`omtr.inference.demo_vocab`), with that domain
    shown as its given domain."""
    demo = DEMOS.get((family or "").lower(), GENERIC)
    if domain:
        from omtr.inference.demo_vocab import in_given_vocabulary

        demo = in_given_vocabulary(demo, domain, rename_text=demo.names_in_text)
    return demo


# ----------------------------------------------------------------------------- prompts

MAX_SPEC_CHARS = 6000  # a degenerate previous answer is cut to this many characters in prompts


def with_domain(nl: str, domain: str) -> str:
    """The Actor's user turn in the domain-given mode: the given domain and the request first, then
    the task (the family's description, then its statement): what a family shares comes first."""
    return f"{GIVEN_HEAD}{domain.strip()}{_GIVEN_ASK}{nl}"


def split_given(text: str) -> tuple[str, str | None]:
    """``(nl, given domain)`` of a user turn written by :func:`with_domain` (domain None otherwise;
    a turn in the former order, the task then the domain, is read too)."""
    if text.startswith(GIVEN_HEAD):
        at = text.find(_GIVEN_ASK, len(GIVEN_HEAD))
        if at >= 0:
            return text[at + len(_GIVEN_ASK):], text[len(GIVEN_HEAD):at]
    at = text.rfind(GIVEN_MARK)
    if at < 0:
        return text, None
    rest = text[at + len(GIVEN_MARK):]
    old_ask = "\n\nWrite the problem (define (problem ...)) for this domain."
    if rest.endswith(old_ask):
        rest = rest[: -len(old_ask)]
    return text[:at], rest


def spec_text(domain: str | None, problem: str | None, raw: str = "", *, given: bool = False) -> str:
    """The spec as a prompt shows it: both blocks (only the problem when the domain is given), or
    the raw answer when it could not be read."""
    if given:
        text = problem if problem is not None else raw
    else:
        text = f"{domain}\n\n{problem}" if domain is not None and problem is not None else raw
    text = text.strip() or "(empty answer)"
    if len(text) > MAX_SPEC_CHARS:
        text = text[:MAX_SPEC_CHARS] + "\n... (cut)"
    return text


def actor_messages(task: TaskLike) -> Messages:
    """Task -> spec, one-shot with the family's demonstration (with a given domain: task + domain
    -> problem, the demonstration's domain shown as given and its problem as the answer)."""
    domain = given_domain(task)
    demo = demo_for(task.family, domain)
    if domain is not None:
        return [
            {"role": "system", "content": SYSTEM_GIVEN},
            {"role": "user", "content": with_domain(demo.nl, demo.domain)},
            {"role": "assistant", "content": demo.problem},
            {"role": "user", "content": with_domain(task.nl, domain)},
        ]
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": demo.nl},
        {"role": "assistant", "content": demo.answer},
        {"role": "user", "content": task.nl},
    ]


JUDGE_CHECKS = "Checks of this PDDL against the task's English (made without the planner or any reference):"


def judge_checks(task: TaskLike, domain: str | None, problem: str | None) -> str:
    """The checks section of the Judge's prompt: :func:`omtr.faithfulness.support.checks_before_planner`
    of this spec (the task's given domain where it has one), one line each, or "none against it"."""
    from omtr.faithfulness.support import checks_before_planner

    given = given_domain(task)
    found = checks_before_planner(task.nl, given if given is not None else domain, problem,
                                  domain_written=given is None)
    if not found:
        return f"{JUDGE_CHECKS} none against it."
    return JUDGE_CHECKS + "".join(f"\n- {c}" for c in found)


def judge_checks_on(policy) -> bool:
    """Whether a policy's Judge asks with the checks section: its model config's ``judge_checks``
    (omtr's role model; False for anything without one, such as a baseline's LM)."""
    return bool(getattr(getattr(policy, "cfg", None), "judge_checks", False))


def judge_messages(task: TaskLike, spec: str, *, checks: bool = False, domain: str | None = None,
                   problem: str | None = None) -> Messages:
    """Task + spec -> the Judge's score (read by a scalar head; nothing is generated). With a given
    domain the Judge reads the task, the domain and the problem (``spec``). ``checks``: the prompt also
    shows what the annotation-free checks find against the spec (:func:`judge_checks` of ``domain``
    and ``problem``, the spec's parsed blocks), just before the question: the signals that see a
    solved-but-unfaithful spec (docs/model.md) as the Judge's own input, so its head can learn to weigh
    them. Every door of omtr asks with ``checks=True`` (``judge_checks`` in the model's config); without
    it the prompt is the paper's (task, spec)."""
    domain_given = given_domain(task)
    tail = f"\n\n{judge_checks(task, domain, problem)}" if checks else ""
    if domain_given is not None:
        return [
            {"role": "system", "content": SYSTEM_JUDGE},
            {"role": "user", "content": f"{GIVEN_HEAD}{domain_given.strip()}\n\nTask:\n{task.nl}\n\nPDDL problem:\n{spec}"
                                        f"{tail}\n\nWill the planner accept this PDDL?"},
        ]
    return [
        {"role": "system", "content": SYSTEM_JUDGE},
        {"role": "user", "content": f"Task:\n{task.nl}\n\nPDDL:\n{spec}{tail}\n\nWill the planner accept this PDDL?"},
    ]


def editor_messages(task: TaskLike, spec: str, category: str | None, diagnostic: str) -> Messages:
    """Task + the latest spec + the latest diagnostic -> a repaired spec (with a given domain: the
    task, the domain, the latest problem and diagnostic -> a repaired problem)."""
    kind = f" ({category})" if category else ""
    domain = given_domain(task)
    if domain is not None:
        return [
            {"role": "system", "content": SYSTEM_EDITOR_GIVEN},
            {
                "role": "user",
                "content": (
                    f"{GIVEN_HEAD}{domain.strip()}\n\nTask:\n{task.nl}\n\nProblem written for it:\n{spec}\n\n"
                    f"The planner rejected it{kind}: {diagnostic}\n\n"
                    "Write the corrected problem in full."
                ),
            },
        ]
    return [
        {"role": "system", "content": SYSTEM_EDITOR},
        {
            "role": "user",
            "content": (
                f"Task:\n{task.nl}\n\nPDDL written for it:\n{spec}\n\n"
                f"The planner rejected it{kind}: {diagnostic}\n\n"
                "Write the corrected domain and problem in full."
            ),
        },
    ]
