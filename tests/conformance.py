"""The conformance suite: one small hand-written spec per PDDL feature Fast Downward's translator
supports. Fast Downward and VAL solve every one of them (``test_conformance.py`` checks that
with the plain driver), so the environment must answer each with a success and a VAL-valid plan.

Each spec is written as a user or an IPC domain author would write it, odd layout included.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ConformanceSpec:
    name: str
    features: tuple[str, ...]
    domain: str | bytes
    problem: str | bytes


TYPING = ConformanceSpec(
    "typing-inheritance-either",
    ("typing", "either"),
    """(define (domain depot-lite)
  (:requirements :strips :typing)
  (:types place locatable - object
          depot market - place
          truck crate - locatable)
  (:predicates (at ?x - locatable ?p - place) (in ?c - crate ?t - truck)
               (stocked ?p - (either depot market)))
  (:action drive
    :parameters (?t - truck ?from ?to - place)
    :precondition (at ?t ?from)
    :effect (and (at ?t ?to) (not (at ?t ?from))))
  (:action load
    :parameters (?c - crate ?t - truck ?p - place)
    :precondition (and (at ?c ?p) (at ?t ?p))
    :effect (and (in ?c ?t) (not (at ?c ?p))))
  (:action unload
    :parameters (?c - crate ?t - truck ?p - market)
    :precondition (and (in ?c ?t) (at ?t ?p))
    :effect (and (at ?c ?p) (stocked ?p) (not (in ?c ?t)))))
""",
    """(define (problem depot-lite-1)
  (:domain depot-lite)
  (:objects d1 - depot m1 - market t1 - truck c1 c2 - crate)
  (:init (at t1 d1) (at c1 d1) (at c2 d1))
  (:goal (and (at c1 m1) (at c2 m1) (stocked m1))))
""",
)

MULTIPLE_PARENTS = ConformanceSpec(
    "type-with-two-parents",
    ("typing", "multiple-parents"),
    """(define (domain shelves)
  (:requirements :typing)
  (:types hoist surface place area - object
          storearea transitarea - area
          area crate - surface)
  (:predicates (on ?c - crate ?s - surface) (clear ?s - surface) (holding ?h - hoist ?c - crate)
               (free ?h - hoist) (at ?h - hoist ?a - area))
  (:action lift
    :parameters (?h - hoist ?c - crate ?s - surface ?a - area)
    :precondition (and (free ?h) (at ?h ?a) (on ?c ?s) (clear ?c))
    :effect (and (holding ?h ?c) (clear ?s) (not (on ?c ?s)) (not (free ?h))))
  (:action drop
    :parameters (?h - hoist ?c - crate ?s - storearea)
    :precondition (and (holding ?h ?c) (at ?h ?s) (clear ?s))
    :effect (and (on ?c ?s) (free ?h) (not (clear ?s)) (not (holding ?h ?c)))))
""",
    """(define (problem shelves-1)
  (:domain shelves)
  (:objects h - hoist c - crate s1 - storearea s2 - storearea)
  (:init (free h) (at h s2) (on c s1) (clear c) (clear s2))
  (:goal (on c s2)))
""",
)

CONSTANTS = ConformanceSpec(
    "constants",
    ("constants",),
    """(define (domain lamp)
  (:requirements :strips :typing)
  (:types room)
  (:constants hall - room)
  (:predicates (lit ?r - room) (in ?r - room))
  (:action walk
    :parameters (?from ?to - room)
    :precondition (in ?from)
    :effect (and (in ?to) (not (in ?from))))
  (:action light-hall
    :parameters ()
    :precondition (in hall)
    :effect (lit hall)))
""",
    """(define (problem lamp-1)
  (:domain lamp)
  (:objects kitchen - room)
  (:init (in kitchen))
  (:goal (and (lit hall) (in kitchen))))
""",
)

NEGATIVE_PRECONDITIONS = ConformanceSpec(
    "negative-preconditions",
    ("negative-preconditions",),
    """(define (domain switches)
  (:requirements :strips :negative-preconditions)
  (:predicates (on ?s) (locked ?s) (done))
  (:action turn-on
    :parameters (?s)
    :precondition (and (not (on ?s)) (not (locked ?s)))
    :effect (on ?s))
  (:action finish
    :parameters (?a ?b)
    :precondition (and (on ?a) (on ?b) (not (done)))
    :effect (done)))
""",
    """(define (problem switches-1)
  (:domain switches)
  (:objects s1 s2 s3)
  (:init (locked s3))
  (:goal (and (done) (on s1) (on s2) (not (on s3)))))
""",
)

EQUALITY = ConformanceSpec(
    "equality",
    ("equality",),
    """(define (domain swap)
  (:requirements :strips :equality)
  (:predicates (at ?x ?p) (place ?p) (token ?x))
  (:action move
    :parameters (?x ?from ?to)
    :precondition (and (token ?x) (place ?to) (at ?x ?from) (not (= ?from ?to)))
    :effect (and (at ?x ?to) (not (at ?x ?from)))))
""",
    """(define (problem swap-1)
  (:domain swap)
  (:objects t p1 p2)
  (:init (token t) (place p1) (place p2) (at t p1))
  (:goal (at t p2)))
""",
)

DISJUNCTIVE = ConformanceSpec(
    "disjunctive-and-implication",
    ("disjunctive-preconditions", "imply"),
    """(define (domain doors)
  (:requirements :strips :disjunctive-preconditions)
  (:predicates (has-key) (has-card) (open) (alarm) (silenced))
  (:action take-card :parameters () :precondition (and) :effect (has-card))
  (:action silence :parameters () :precondition (has-card) :effect (silenced))
  (:action open-door
    :parameters ()
    :precondition (and (or (has-key) (has-card)) (imply (alarm) (silenced)))
    :effect (open)))
""",
    """(define (problem doors-1)
  (:domain doors)
  (:init (alarm))
  (:goal (or (open) (has-key))))
""",
)

QUANTIFIED = ConformanceSpec(
    "quantified-preconditions",
    ("existential-preconditions", "universal-preconditions"),
    """(define (domain harvest)
  (:requirements :typing :quantified-preconditions)
  (:types field worker)
  (:predicates (ripe ?f - field) (picked ?f - field) (rested ?w - worker) (sold))
  (:action pick
    :parameters (?f - field)
    :precondition (and (ripe ?f) (exists (?w - worker) (rested ?w)))
    :effect (picked ?f))
  (:action sell
    :parameters ()
    :precondition (forall (?f - field) (picked ?f))
    :effect (sold)))
""",
    """(define (problem harvest-1)
  (:domain harvest)
  (:objects f1 f2 - field w - worker)
  (:init (ripe f1) (ripe f2) (rested w))
  (:goal (sold)))
""",
)

CONDITIONAL = ConformanceSpec(
    "conditional-effects",
    ("conditional-effects",),
    """(define (domain briefcase)
  (:requirements :typing :conditional-effects)
  (:types place thing)
  (:predicates (at-case ?p - place) (at ?t - thing ?p - place) (inside ?t - thing))
  (:action put-in
    :parameters (?t - thing ?p - place)
    :precondition (and (at ?t ?p) (at-case ?p))
    :effect (and (inside ?t) (not (at ?t ?p))))
  (:action move
    :parameters (?from ?to - place ?t - thing)
    :precondition (at-case ?from)
    :effect (and (at-case ?to) (not (at-case ?from))
                 (when (inside ?t) (and (at ?t ?to) (not (at ?t ?from)))))))
""",
    """(define (problem briefcase-1)
  (:domain briefcase)
  (:objects home office - place paper - thing)
  (:init (at-case home) (at paper home))
  (:goal (and (at paper office))))
""",
)

UNIVERSAL_EFFECTS = ConformanceSpec(
    "universal-effects",
    ("universal-effects", "conditional-effects"),
    """(define (domain lights)
  (:requirements :typing :adl)
  (:types lamp room)
  (:predicates (in ?l - lamp ?r - room) (on ?l - lamp) (dark ?r - room))
  (:action switch-room-on
    :parameters (?r - room)
    :precondition (dark ?r)
    :effect (and (not (dark ?r))
                 (forall (?l - lamp) (when (in ?l ?r) (on ?l)))))
  (:action all-off
    :parameters ()
    :precondition (and)
    :effect (forall (?l - lamp) (not (on ?l)))))
""",
    """(define (problem lights-1)
  (:domain lights)
  (:objects l1 l2 l3 - lamp kitchen attic - room)
  (:init (in l1 kitchen) (in l2 kitchen) (in l3 attic) (dark kitchen) (dark attic) (on l3))
  (:goal (and (on l1) (on l2) (forall (?r - room) (not (dark ?r))))))
""",
)

DERIVED = ConformanceSpec(
    "derived-predicates",
    ("derived-predicates",),
    """(define (domain relay)
  (:requirements :typing :derived-predicates :negative-preconditions)
  (:types station)
  (:predicates (link ?a ?b - station) (powered ?s - station) (source ?s - station)
               (reached ?s - station) (blocked ?s - station) (broken ?s - station))
  (:derived (reached ?s - station)
    (or (source ?s) (exists (?t - station) (and (link ?t ?s) (reached ?t) (powered ?t)))))
  (:derived (blocked ?s - station) (and (broken ?s) (not (powered ?s))))
  (:action power
    :parameters (?s - station)
    :precondition (and (reached ?s) (not (blocked ?s)))
    :effect (powered ?s))
  (:action break
    :parameters (?s - station)
    :precondition (not (powered ?s))
    :effect (broken ?s)))
""",
    """(define (problem relay-1)
  (:domain relay)
  (:objects s0 s1 s2 - station)
  (:init (source s0) (link s0 s1) (link s1 s2))
  (:goal (and (reached s2) (blocked s2))))
""",
)

ACTION_COSTS = ConformanceSpec(
    "action-costs",
    ("action-costs",),
    """(define (domain roads)
  (:requirements :typing :action-costs)
  (:types city)
  (:predicates (at ?c - city) (road ?a ?b - city))
  (:functions (total-cost) - number (distance ?a ?b - city) - number)
  (:action drive
    :parameters (?a ?b - city)
    :precondition (and (at ?a) (road ?a ?b))
    :effect (and (at ?b) (not (at ?a)) (increase (total-cost) (distance ?a ?b)))))
""",
    """(define (problem roads-1)
  (:domain roads)
  (:objects x y z - city)
  (:init (at x) (road x y) (road y z) (road x z)
         (= (distance x y) 1) (= (distance y z) 1) (= (distance x z) 5) (= (total-cost) 0))
  (:goal (at z))
  (:metric minimize (total-cost)))
""",
)

UNTYPED_OBJECTS = ConformanceSpec(
    "objects-without-types",
    ("untyped-objects",),
    """(define (domain hanoi-lite)
  (:requirements :strips)
  (:predicates (clear ?x) (on ?x ?y) (smaller ?x ?y))
  (:action move
    :parameters (?disc ?from ?to)
    :precondition (and (smaller ?to ?disc) (on ?disc ?from) (clear ?disc) (clear ?to))
    :effect (and (clear ?from) (on ?disc ?to) (not (on ?disc ?from)) (not (clear ?to)))))
""",
    """(define (problem hanoi-2)
  (:domain hanoi-lite)
  (:objects peg1 peg2 peg3 d1 d2)
  (:init (smaller peg1 d1) (smaller peg1 d2) (smaller peg2 d1) (smaller peg2 d2)
         (smaller peg3 d1) (smaller peg3 d2) (smaller d2 d1)
         (clear peg2) (clear peg3) (clear d1) (on d2 peg1) (on d1 d2))
  (:goal (and (on d2 peg3) (on d1 d2))))
""",
)

# Layout as found in the wild: tabs, CRLF line ends, comments after tokens and inside forms,
# upper case, a '?' glued to a name (``(aircraft?a)``), sections out of the BNF's order, an empty
# precondition, and a Latin-1 byte in a comment.
ODD_LAYOUT = ConformanceSpec(
    "odd-whitespace-and-comments",
    ("layout", "comments", "case", "glued-variables", "latin-1-comments", "section-order"),
    (
        b"; Travel domain \xe9crit \xe0 la main (Latin-1 comment)\r\n"
        b"(define\t(domain TRAVEL) ; the name\r\n"
        b"  (:requirements :STRIPS :typing)\r\n"
        b"  (:types\taircraft city)(:predicates\r\n"
        b"\t(AT ?x - aircraft ?c - city)(ready?a - aircraft) ; glued\r\n"
        b"\t(visited?c - city))\r\n"
        b"  (:action FLY :parameters(?a - aircraft ?from ?to - city)\r\n"
        b"   :precondition (and(AT ?a ?from)(ready?a)) ; (not a form)\r\n"
        b"   :effect(and (at ?a ?to)(visited ?to)(not(at ?a ?from))))\r\n"
        b"  (:action REST :parameters (?a - aircraft) :precondition () :effect (and))\r\n"
        b")\r\n"
    ),
    (
        b"(define (problem TRAVEL-1);\r\n"
        b"(:domain travel)\t(:objects plane1 - AIRCRAFT paris rome - CITY)\r\n"
        b"(:INIT (at plane1 paris) (READY plane1)\r\n"
        b")\r\n"
        b"(:goal(AND(visited rome)))\r\n"
        b")"
    ),
)

NEGATIVE_GOAL_AND_EMPTY = ConformanceSpec(
    "negative-goal",
    ("negative-preconditions", "negative-goal"),
    """(define (domain chores)
  (:requirements :strips :negative-preconditions)
  (:predicates (dirty ?r) (tired))
  (:action clean
    :parameters (?r)
    :precondition (and (dirty ?r) (not (tired)))
    :effect (not (dirty ?r))))
""",
    """(define (problem chores-1)
  (:domain chores)
  (:objects kitchen bath)
  (:init (dirty kitchen) (dirty bath))
  (:goal (and (not (dirty kitchen)) (not (dirty bath)))))
""",
)

# Legal oddities seen in published domains: the planner and VAL accept them (omtr warns).
IPC_QUIRKS = ConformanceSpec(
    "published-domain-quirks",
    ("negated-init", "duplicate-action", "undeclared-derived", "section-order", "problem-requirements"),
    """(define (domain tidy)
  (:predicates (messy ?r) (tidy ?r) (home ?r))
  (:requirements :strips :negative-preconditions :derived-predicates :existential-preconditions)
  (:derived (any-messy) (exists (?r) (messy ?r)))
  (:action tidy-up
    :parameters (?r)
    :precondition (messy ?r)
    :effect (and (tidy ?r) (not (messy ?r))))
  (:action tidy-up
    :parameters (?r)
    :precondition (and (messy ?r) (home ?r))
    :effect (and (tidy ?r) (not (messy ?r)))))
""",
    """(define (problem tidy-1)
  (:domain tidy)
  (:requirements :strips)
  (:objects den loft)
  (:init (messy den) (messy loft) (not (tidy den)) (home den))
  (:goal (and (tidy den) (tidy loft) (not (messy den)))))
""",
)

SUITE = (
    TYPING, MULTIPLE_PARENTS, CONSTANTS, NEGATIVE_PRECONDITIONS, EQUALITY, DISJUNCTIVE, QUANTIFIED,
    CONDITIONAL, UNIVERSAL_EFFECTS, DERIVED, ACTION_COSTS, UNTYPED_OBJECTS, ODD_LAYOUT,
    NEGATIVE_GOAL_AND_EMPTY, IPC_QUIRKS,
)
