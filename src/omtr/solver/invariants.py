"""Fast Downward's mutex invariants of a domain, from its actions alone.

The translator's invariant synthesis proves groups of atoms of which at most one holds in any state
reachable from a sound initial state (the hand empty, or holding one block; a block clear, held, or
under another). Three users read them: the support verdict and the supported reward
(:mod:`omtr.faithfulness.signals`), ``--select`` (:mod:`omtr.inference.select`) and the decoder's
``init_invariants`` rule (:mod:`omtr.model.scope.invariants`), which is why this lives beside the
planner, below all of them.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import threading
from typing import Sequence

log = logging.getLogger(__name__)


def synthesise_invariants(domain_text: str, problem_text: str) -> tuple:
    try:
        from fast_downward.translate import invariant_finder, normalize
        from fast_downward.translate import options as topts
        from fast_downward.translate.pddl_parser import lisp_parser, parsing_functions

        with contextlib.redirect_stdout(io.StringIO()):
            if topts.options is None:
                topts.set_options(["domain.pddl", "problem.pddl"])
            task = parsing_functions.parse_task(lisp_parser.parse_nested_list(io.StringIO(domain_text)),
                                                lisp_parser.parse_nested_list(io.StringIO(problem_text)))
            normalize.normalize(task)
            invs = list(invariant_finder.find_invariants(task, None))
        return tuple(tuple((p.predicate.lower(), tuple(p.args), p.omitted_pos) for p in sorted(inv.parts)) for inv in invs)
    except BaseException as exc:  # noqa: BLE001 - no invariants is a weaker, still sound answer
        if isinstance(exc, KeyboardInterrupt):
            raise
        log.debug("invariant synthesis failed: %s", exc)
        return ()



_INVARIANTS: dict[str, tuple] = {}
# Fast Downward's translator keeps global state: one invariant synthesis at a time in this process
# (held by omtr.inference.select and by the decoder's init_invariants rule).
TRANSLATOR = threading.Lock()
_DOMAIN_NAME = re.compile(r"\(\s*domain\s+([^\s()]+)", re.IGNORECASE)


def domain_invariants(domain: str) -> tuple:
    """Fast Downward's mutex invariants of ``domain``, from its actions alone: one tuple per
    invariant of its parts ``(predicate, args, omitted_position)``, ``args`` holding the
    invariant's parameter numbers and -1 at the counted position. Empty when the translator cannot
    read the domain. Cached per domain text (the translator keeps global state: one at a time)."""
    hit = _INVARIANTS.get(domain)
    if hit is not None:
        return hit
    m = _DOMAIN_NAME.search(domain or "")
    if not m:
        return ()
    # The translator parses a task: a problem with no objects and an empty goal stands in, so the
    # invariants never depend on (or fail with) the problem being scored.
    stub = f"(define (problem signals-stub) (:domain {m.group(1)}) (:init) (:goal (and)))"
    with contextlib.redirect_stdout(io.StringIO()):
        hit = synthesise_invariants(domain, stub)
    if len(_INVARIANTS) > 64:
        _INVARIANTS.clear()
    _INVARIANTS[domain] = hit
    return hit


def counts_in_a_sound_state(parts: Sequence) -> bool:
    """Whether an invariant's "at most one" is a property of every sound state of the domain.

    Fast Downward's synthesis proves *balance* (no action raises a group's count), not "at most one":
    its own ``useful_groups`` drops a group that the initial state overcrowds. A group with a
    parameter (per block x: clear x, holding x, on ? x) or with a nullary atom (the hand: handempty,
    holding ?) is tied to one thing, so two true atoms are a contradiction. An invariant without
    parameters and without a nullary atom ranges over all objects of its predicates (Depots'
    ``clear ?x``: as many clear surfaces as there are stacks), so the domain alone cannot say that more
    than one atom is wrong; it is not used (it would call every Depots task unsupported)."""
    if any(not pargs for _, pargs, _ in parts):
        return True
    return any(v != -1 for _, pargs, _ in parts for v in pargs)


def atom_groups(invariants: Sequence, atom: Sequence[str], every: bool = False) -> list[tuple[int, tuple]]:
    """The mutex groups one atom ``(pred, arg, ...)`` belongs to, as ``(invariant index, the group's
    parameters)``, once per part of the invariant it matches (an atom matching two parts of one
    invariant with the same parameters fills that group twice on its own). Invariants that a sound
    state may overcrowd (:func:`counts_in_a_sound_state`) are skipped. :func:`violated_groups` and
    the decoder's ``init_invariants`` rule (:mod:`omtr.model.scope.invariants`) both count by it.
    ``every``: count every invariant given (the caller has chosen them: the decoder's rule adds an
    invariant without parameters only where the English says the one thing it counts is in one place)."""
    atom = tuple(str(x).lower() for x in atom)
    pred, args = atom[0], atom[1:]
    out = []
    for k, parts in enumerate(invariants):
        if not every and not counts_in_a_sound_state(parts):
            continue
        for ppred, pargs, omitted in parts:
            if ppred != pred or len(pargs) != len(args):
                continue
            params: dict[int, str] = {}
            ok = True
            for pos, (v, a) in enumerate(zip(pargs, args)):
                if pos == omitted or v == -1:
                    continue
                if params.setdefault(v, a) != a:
                    ok = False
            if ok:
                out.append((k, tuple(sorted(params.items()))))
    return out


def violated_groups(invariants: Sequence, init: Sequence[Sequence[str]]) -> list[tuple[int, tuple, list[tuple]]]:
    """The mutex groups with more than one true atom in ``init`` (atoms as ``(pred, arg, ...)``):
    ``(invariant index, the group's parameters, its true atoms)`` each. A group is an invariant with
    its parameters bound (``{clear x, holding x, on ? x}`` for one block x), as Fast Downward's
    ``useful_groups`` forms them from the initial state; duplicate atoms count once. Invariants that a
    sound state may overcrowd (:func:`counts_in_a_sound_state`) are skipped."""
    atoms = sorted({tuple(str(x).lower() for x in a) for a in init if len(a) >= 1})
    groups: dict[tuple, list[tuple]] = {}
    for atom in atoms:
        for g in atom_groups(invariants, atom):
            groups.setdefault(g, []).append(atom)
    return [(k, key, members) for (k, key), members in sorted(groups.items()) if len(members) > 1]


__all__ = ["TRANSLATOR", "atom_groups", "counts_in_a_sound_state", "domain_invariants", "synthesise_invariants",
           "violated_groups"]
