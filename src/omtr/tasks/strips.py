"""Small pure-Python STRIPS helpers for the task generators.

* ``Schema`` / ``simulate``: replay a plan on a positive-precondition STRIPS domain read from its
  PDDL text with ``omtr.pddl``. Generators use it to prove their constructive plans reach the goal
  under the very PDDL they emit, so every generated task is solvable without calling a planner.
* ``render_problem``: PDDL problem text from atoms.
* ``signature``: a canonical hash of (init, goal) up to object renaming (colour refinement), used
  to keep splits disjoint. Isomorphic instances always get the same signature; a rare collision
  between non-isomorphic ones only makes the split check stricter, never leaky.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Iterable, Sequence

from omtr.pddl.model import conjunction_literals, parse_domain, parse_problem
from omtr.pddl.plan import parse_step

Atom = tuple[str, ...]


class PlanError(ValueError):
    """A plan step that is not applicable, or a plan that misses the goal."""


@dataclass(frozen=True)
class Schema:
    name: str
    params: tuple[str, ...]
    pre: tuple[Atom, ...]
    add: tuple[Atom, ...]
    delete: tuple[Atom, ...]


def _conj(formula, what: str) -> tuple[list[Atom], list[Atom]]:
    """(positive atoms, negated atoms) of a conjunction of literals."""
    lits = conjunction_literals(formula)
    if lits is None:
        raise ValueError(f"{what}: only conjunctions of literals are supported here")
    pos = [tuple(str(x) for x in a) for a, neg in lits if not neg]
    neg = [tuple(str(x) for x in a) for a, neg in lits if neg]
    return pos, neg


@functools.lru_cache(maxsize=64)
def schemas(domain_text: str) -> dict[str, Schema]:
    dom = parse_domain(domain_text)
    out = {}
    for name, act in dom.actions.items():
        pre, _ = _conj(act.precondition, f"action {name} precondition")
        add, dele = _conj(act.effect, f"action {name} effect")
        out[name] = Schema(name, tuple(p for p, _ in act.parameters), tuple(pre), tuple(add), tuple(dele))
    return out


def parse_action(step: str) -> tuple[str, tuple[str, ...]]:
    parsed = parse_step(step)
    if parsed is None:
        raise PlanError(f"not a plan step: {step!r}")
    return parsed.name, parsed.args


def simulate(domain_text: str, init: Iterable[Atom], goal: Iterable[Atom], plan: Sequence[str]) -> None:
    """Replay ``plan`` from ``init``; raise ``PlanError`` unless every step applies and the goal holds."""
    acts = schemas(domain_text)
    state = {tuple(a) for a in init}
    for i, step in enumerate(plan, 1):
        name, args = parse_action(step)
        sch = acts.get(name)
        if sch is None or len(args) != len(sch.params):
            raise PlanError(f"step {i} {step}: unknown action or wrong number of arguments")
        sub = dict(zip(sch.params, args))

        def g(atom: Atom) -> Atom:
            return tuple(sub.get(x, x) for x in atom)

        missing = [g(a) for a in sch.pre if g(a) not in state]
        if missing:
            raise PlanError(f"step {i} {step}: precondition {missing[0]} does not hold")
        for a in sch.delete:
            state.discard(g(a))
        for a in sch.add:
            state.add(g(a))
    unmet = [a for a in goal if tuple(a) not in state]
    if unmet:
        raise PlanError(f"plan ends without reaching goal atom {unmet[0]}")


def problem_atoms(problem_text: str) -> tuple[dict[str, str], list[Atom], list[Atom]]:
    """(objects, init atoms, goal atoms) of a problem whose goal is a conjunction of atoms."""
    prob = parse_problem(problem_text)
    init = [tuple(str(x) for x in a) for a in prob.init]
    pos, neg = _conj(prob.goal, "goal")
    if neg:
        raise ValueError("negative goals are not supported here")
    return dict(prob.objects), init, pos


def _atom_text(a: Atom) -> str:
    return "(" + " ".join(a) + ")"


def render_problem(
    name: str, domain: str, objects: dict[str, str], init: Iterable[Atom], goal: Iterable[Atom], *, typed: bool = True
) -> str:
    """PDDL problem text; objects grouped by type in first-seen order."""
    by_type: dict[str, list[str]] = {}
    for o, t in objects.items():
        by_type.setdefault(t if typed else "", []).append(o)
    objs = " ".join(f"{' '.join(os_)} - {t}" if t else " ".join(os_) for t, os_ in by_type.items())
    init_txt = "\n    ".join(_atom_text(a) for a in init)
    goal_txt = "\n      ".join(_atom_text(a) for a in goal)
    return (
        f"(define (problem {name})\n  (:domain {domain})\n  (:objects {objs})\n"
        f"  (:init\n    {init_txt})\n  (:goal (and\n      {goal_txt})))\n"
    )


def _h(s: str) -> str:
    return hashlib.blake2b(s.encode(), digest_size=12).hexdigest()


def signature(objects: dict[str, str], init: Iterable[Atom], goal: Iterable[Atom], rounds: int | None = None) -> str:
    """Canonical hash of (init, goal) up to a renaming of objects (Weisfeiler-Lehman refinement)."""
    atoms = [("i",) + tuple(a) for a in init] + [("g",) + tuple(a) for a in goal]
    colour = {o: _h("type:" + t) for o, t in objects.items()}
    for a in atoms:  # objects only mentioned in atoms
        for x in a[2:]:
            colour.setdefault(x, _h("type:?"))
    occurs: dict[str, list[tuple[tuple, int]]] = {o: [] for o in colour}
    for a in atoms:
        for pos, x in enumerate(a[2:]):
            occurs[x].append((a, pos))
    n_rounds = rounds if rounds is not None else max(2, len(colour))
    n_classes = len(set(colour.values()))
    for _ in range(n_rounds):
        new = {}
        for o, occ in occurs.items():
            ctx = sorted(
                a[0] + "/" + a[1] + "/" + str(pos) + "/" + ",".join(colour[x] for x in a[2:]) for a, pos in occ
            )
            new[o] = _h(colour[o] + "|" + ";".join(ctx))
        colour = new
        k = len(set(colour.values()))
        if k == n_classes:
            break
        n_classes = k
    desc = sorted(a[0] + "/" + a[1] + "/" + ",".join(colour[x] for x in a[2:]) for a in atoms)
    types = sorted(colour[o] for o in objects)
    return _h("|".join(desc) + "#" + ",".join(types))

