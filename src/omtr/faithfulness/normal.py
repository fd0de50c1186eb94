"""A normal form of a (domain, problem) pair that the checker compares.

Everything that ASSUMPTIONS.md declares semantically irrelevant is removed here, once, so that
the mapping and the comparison only see what changes the planning task:

* declared types become unary static predicates ``type:<t>`` (objects get one atom per type
  and ancestor, an action parameter ``?x - t`` becomes the precondition ``(type:t ?x)``), so a
  declared type and a unary static type predicate are the same thing;
* a unary static predicate that holds for every object is dropped (it is ``object``);
* predicates that no action and no goal mentions are dropped with their init atoms;
* goal literals over static predicates that the initial state already decides are dropped;
* effects that cannot change the state are dropped (an add of a positive precondition, a delete
  of a negative precondition, a delete that the same action also adds).

Action literals refer to parameters by position (``int``) and to domain constants as
``"c:<name>"``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from omtr.pddl import SpecError, atoms_of, parse_domain, parse_problem
from omtr.pddl.model import ROOT_TYPE

log = logging.getLogger(__name__)

TYPE_PREFIX = "type:"
EQ = "="
_COMPLEX_HEADS = {"or", "imply", "exists", "forall", "when"}

GAtom = tuple  # (sym, (obj, ...))
ALit = tuple  # (sym, (arg, ...), positive) with arg an int (parameter index) or "c:<const>"


class NormalizeError(ValueError):
    """A spec that cannot be put in normal form; ``part`` names domain or problem."""

    def __init__(self, part: str, message: str):
        super().__init__(f"{part}: {message}")
        self.part = part
        self.message = message


@dataclass
class NAction:
    name: str
    params: list[str]
    pre: frozenset  # of ALit
    add: frozenset  # of (sym, args)
    dele: frozenset  # of (sym, args)
    complex: bool = False

    @property
    def arity(self) -> int:
        return len(self.params)


@dataclass
class NSpec:
    domain_name: str
    problem_name: str
    arity: dict[str, int]  # every symbol kept, with its arity
    static: set[str]
    objects: list[str]
    init: frozenset  # of GAtom
    goal: frozenset  # of (sym, args, positive)
    actions: dict[str, NAction]
    complex_goal: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def type_like(self) -> set[str]:
        """Unary static symbols: declared types and type predicates alike."""
        return {s for s in self.static if self.arity.get(s) == 1}


def display(sym: str) -> str:
    return f"type {sym[len(TYPE_PREFIX):]}" if sym.startswith(TYPE_PREFIX) else sym


def _has_complex(f) -> bool:
    if not isinstance(f, list) or not f:
        return False
    if f.head in _COMPLEX_HEADS:
        return True
    return any(_has_complex(g) for g in f[1:] if isinstance(g, list))


def normalize(domain_text: str, problem_text: str) -> NSpec:
    """Parse and normalise; raises :class:`NormalizeError` for anything unusable."""
    if not isinstance(domain_text, str) or not isinstance(problem_text, str):
        raise NormalizeError("spec", "domain and problem must be text")
    try:
        dom = parse_domain(domain_text)
    except SpecError as exc:
        raise NormalizeError("domain", f"does not parse ({exc.category}): {exc.message}") from None
    try:
        prob = parse_problem(problem_text)
    except SpecError as exc:
        raise NormalizeError("problem", f"does not parse ({exc.category}): {exc.message}") from None
    return _normalize(dom, prob)


def _normalize(dom, prob) -> NSpec:
    notes: list[str] = []

    def sym_of(name: str, n: int) -> str:
        """The symbol for ``name`` used with ``n`` arguments; a use with another arity than the
        declaration is a different (undeclared) symbol ``name/n``."""
        if name == EQ:
            return name
        if name in arity and arity[name] != n:
            name = f"{name}/{n}"
        arity.setdefault(name, n)
        return name

    objects: dict[str, str] = dict(dom.constants)
    for o, t in prob.objects.items():
        objects[o] = t
    arity: dict[str, int] = {p: len(args) for p, args in dom.predicates.items()}

    init: set = set()
    for o, t in objects.items():
        if t.startswith("either:"):
            raise NormalizeError("problem", f"object {o} has an (either ...) type")
        for a in dom.ancestors(t)[:-1]:  # every declared type above it; `object` says nothing
            init.add((TYPE_PREFIX + a, (o,)))
            arity[TYPE_PREFIX + a] = 1
    for atom in prob.init:
        if atom.head is None:
            raise NormalizeError("problem", f"init entry {atom!r} is not an atom")
        if atom.head == EQ or atom.head in ("not",):
            continue  # (= (f) n) numeric fluents, negative init atoms: closed world makes them moot
        args = tuple(str(a) for a in atom[1:])
        if any(isinstance(a, list) for a in atom[1:]):
            raise NormalizeError("problem", f"init atom {atom.head} has a nested argument")
        init.add((sym_of(str(atom.head), len(args)), args))

    actions: dict[str, NAction] = {}
    for act in dom.actions.values():
        index = {v: i for i, (v, _) in enumerate(act.parameters)}
        complex_ = _has_complex(act.precondition) or _has_complex(act.effect)

        def arg(x):
            if isinstance(x, list):
                raise NormalizeError("domain", f"action {act.name}: nested term {x!r}")
            x = str(x)
            if x in index:
                return index[x]
            if x.startswith("?"):
                return "v:" + x  # quantified variable (complex action)
            return "c:" + x

        pre: set = set()
        for i, (_, t) in enumerate(act.parameters):
            if t.startswith("either:"):
                sym = TYPE_PREFIX + t
                arity[sym] = 1
                for o, ot in objects.items():
                    if any(ot == m or dom.is_subtype(ot, m) for m in t.split(":")[1:]):
                        init.add((sym, (o,)))
                pre.add((sym, (i,), True))
            elif t != ROOT_TYPE:
                arity.setdefault(TYPE_PREFIX + t, 1)
                pre.add((TYPE_PREFIX + t, (i,), True))
        if act.precondition is not None:
            for atom, neg, _bound in atoms_of(act.precondition):
                args = tuple(arg(a) for a in atom[1:])
                pre.add((sym_of(str(atom.head), len(args)), args, not neg))
        add: set = set()
        dele: set = set()
        if act.effect is not None:
            for atom, neg, _bound in atoms_of(act.effect, effect=True):
                args = tuple(arg(a) for a in atom[1:])
                (dele if neg else add).add((sym_of(str(atom.head), len(args)), args))
        dele -= add
        add = {a for a in add if (a[0], a[1], True) not in pre}
        dele = {d for d in dele if (d[0], d[1], False) not in pre}
        actions[act.name] = NAction(act.name, [v for v, _ in act.parameters], frozenset(pre),
                                    frozenset(add), frozenset(dele), complex_)

    goal: set = set()
    complex_goal = _has_complex(prob.goal)
    for atom, neg, bound in atoms_of(prob.goal):
        if any(isinstance(a, list) for a in atom[1:]):
            raise NormalizeError("problem", f"goal atom {atom.head} has a nested argument")
        args = tuple(str(a) for a in atom[1:])
        goal.add((sym_of(str(atom.head), len(args)), args, not neg))

    # names used as objects in init or goal but never declared count as (untyped) objects, so
    # that they show up as extra/missing objects instead of vanishing
    used = {a for _, args in init for a in args} | {a for _, args, _ in goal for a in args}
    undeclared = sorted(used - set(objects))
    for a in undeclared:
        objects[a] = ROOT_TYPE
    if undeclared:
        notes.append(f"object(s) {', '.join(undeclared[:5])} used in :init/:goal but not declared: "
                     "treated as untyped objects")

    changed = {s for a in actions.values() for s, _ in (*a.add, *a.dele)}
    static = {s for s in arity if s not in changed}

    # goal literals over static predicates are decided by the initial state
    for lit in sorted(goal):
        sym, args, pos = lit
        if sym == EQ:
            holds = len(args) == 2 and args[0] == args[1]
        elif sym in static:
            holds = (sym, args) in init
        else:
            continue
        if holds == pos:
            goal.discard(lit)
            notes.append(f"goal literal {'' if pos else 'not '}({display(sym)} {' '.join(args)}) is true "
                         "in the initial state and static: ignored")

    relevant = {s for a in actions.values() for s, _, _ in a.pre} | changed | {s for s, _, _ in goal}
    for s in sorted(set(arity) - relevant):
        if any(a[0] == s for a in init):
            notes.append(f"{display(s)} is never used by an action or the goal: ignored")
        init = {a for a in init if a[0] != s}
        del arity[s]
    static &= set(arity)

    all_objects = set(objects)
    for s in sorted(static):
        if arity.get(s) != 1 or not all_objects:
            continue
        ext = {a[1][0] for a in init if a[0] == s}
        if ext == all_objects:
            notes.append(f"{display(s)} holds for every object: treated as `object`")
            init = {a for a in init if a[0] != s}
            goal = {g for g in goal if g[0] != s}
            for act in actions.values():
                act.pre = frozenset(p for p in act.pre if p[0] != s)
            del arity[s]
            static.discard(s)

    return NSpec(
        domain_name=dom.name,
        problem_name=prob.name,
        arity=arity,
        static=static,
        objects=sorted(objects),
        init=frozenset(init),
        goal=frozenset(goal),
        actions=actions,
        complex_goal=complex_goal,
        notes=notes,
    )
