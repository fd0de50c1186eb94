"""The initial state's invariants rule (``init_invariants``): ``:init`` keeps the given domain's mutex invariants.

In the domain-given mode the domain's actions say which atoms can never hold together: Fast Downward's
invariant synthesis (:func:`omtr.solver.invariants.domain_invariants`, run once per given domain and
cached) proves groups such as "at most one of handempty, holding ?x" or, per block x, "at most one of
clear x, holding x, on ? x". An initial state with two atoms of one group is a state no plan of the
domain reaches from a sound state, and the support verdict calls it ``unsupported``
(:func:`omtr.faithfulness.signals.broken_invariants`). So an atom of ``:init`` that would put a second
atom into a group (``(holding a)`` after ``(handempty)``) is refused, and so is one that would leave
a clause the statement rules still hold ``:init`` to without any atom that keeps the groups (``(on a
a)`` while "a is on the table" waits for its ``(ontable a)``). An atom identical to one already
written is refused by the scope rule already (no literal repeats in ``:init``), never counted twice.

No dead end: the refusal is part of every place that decides whether an ``:init`` atom can still be
written (its predicate, each argument, and whether ``:init`` may close: a clause none of whose atoms
keeps the groups no longer holds ``:init`` open), so a prefix is admitted only where some completion
keeps the groups, and ``:init`` may always close instead. Sound: a spec whose initial state breaks no
group (every PlanBench and generator reference) is never refused, whatever the order of its atoms.
Only the invariants that count in every sound state are used (:func:`counts_in_a_sound_state`).
"""

from __future__ import annotations

import itertools
import logging

log = logging.getLogger(__name__)

_GIVEN: dict[str, tuple] = {}


def given_invariants(domain: str) -> tuple:
    """The mutex invariants of a given domain (PDDL text) the rule uses, cached per text; empty when
    the translator cannot read it (the rule then stands aside)."""
    return _given_split(domain)[0]


def given_loose_invariants(domain: str) -> tuple:
    """The given domain's invariants that a sound state may overcrowd (no parameter, no nullary atom:
    :func:`omtr.solver.invariants.counts_in_a_sound_state`), cached per text. The rule uses one only
    where the statement's reading says the one thing it counts is in one place (:meth:`InvariantsRule._use_single`)."""
    return _given_split(domain)[1]


def _given_split(domain: str) -> tuple:
    got = _GIVEN.get(domain)
    if got is None:
        from omtr.solver.invariants import TRANSLATOR, counts_in_a_sound_state, domain_invariants

        try:
            with TRANSLATOR:
                invs = domain_invariants(domain)
        except Exception as exc:  # noqa: BLE001 - no invariants: the rule stands aside
            log.warning("invariant synthesis failed (%s: %s); the init_invariants rule stands aside",
                        type(exc).__name__, exc)
            invs = ()
        got = (tuple(parts for parts in invs if counts_in_a_sound_state(parts)),
               tuple(parts for parts in invs if not counts_in_a_sound_state(parts)))
        if len(_GIVEN) > 64:
            _GIVEN.clear()
        _GIVEN[domain] = got
    return got


class InvariantsRule:
    """The rule's state: ``mutex`` (the given domain's invariants, empty: rule off), ``mutex_held``
    (each group of the atoms written in ``:init`` -> its atom; replaced, never changed in place, so
    clones share it safely) and a memo of each atom's groups (shared by clones: a pure function)."""

    def _init_invariants(self, given) -> None:
        self.mutex: tuple = tuple(getattr(given, "invariants", ()) or ())
        self._loose: tuple = tuple(getattr(given, "loose_invariants", ()) or ()) if self.mutex else ()
        self.mutex_held: dict = {}
        self._mutex_memo: dict = {}

    def _use_single(self, predicates) -> None:
        """Plain English: for each :init clause the reading marks :attr:`omtr.statement.Clause.single`
        ("the robot is in room r1": one robot, in one place) whose words name a predicate of one
        argument (``at-robby``), the given domain's invariants without parameters made of that
        predicate alone count too ("at most one at-robby ?r"): a second ``(at-robby r2)`` says the
        robot is in two places. Such an invariant in general may count many things (Depots' ``clear
        ?x``); the reading's one thing is what makes it "at most one". Before any atom is written."""
        reading = getattr(getattr(self, "_statement", None), "reading", None)
        if not self._loose or reading is None or getattr(reading, "layout", "") != "plain":
            return
        from omtr.statement import clause_predicate

        singles = {clause_predicate(c, predicates) for c in reading.init if getattr(c, "single", False)}
        singles = {p for p in singles if p is not None and len(predicates.get(p, ())) == 1}
        extra = tuple(parts for parts in self._loose
                      if parts and all(pp in singles for pp, _, _ in parts) and parts not in self.mutex)
        if extra:
            self.mutex = self.mutex + extra
            self._mutex_memo = {}

    def _groups_of(self, atom: tuple) -> tuple:
        got = self._mutex_memo.get(atom)
        if got is None:
            from omtr.solver.invariants import atom_groups

            got = self._mutex_memo[atom] = tuple(atom_groups(self.mutex, atom, every=True))
        return got

    def _clashes(self, atom: tuple, held: dict | None = None) -> bool:
        """Would ``atom`` put a second atom into one of its groups (beside ``held``'s atoms, or
        twice on its own)?"""
        gs = self._groups_of(atom)
        if len(set(gs)) < len(gs):
            return True
        held = self.mutex_held if held is None else held
        return any(held.get(g, atom) != atom for g in gs)

    def _mutex_waiting(self) -> list[list[tuple]]:
        """For each clause the statement rules still hold ``:init`` to, the atoms that could stand for
        it without breaking a group now (only clauses with at least one such atom; clauses whose atoms
        are not few are left out). Memoized per state."""
        left = getattr(self, "fact_left", None)
        if left is None:
            return []
        free = self.fact_free["init"]
        key = ("waiting", tuple(sorted(self.mutex_held.items())), left["init"], free)
        got = self._mutex_memo.get(key)
        if got is not None:
            return got
        out = []
        written = set(self.mutex_held.values())
        for names, want in left["init"]:
            preds = [want] if want is not None else [p for p in self.preds if len(self.preds[p]) == len(names)]
            atoms = []
            for p in preds:
                if p not in self.preds:
                    continue
                cands = self._candidates("init", p)
                if len(cands) != len(names):
                    continue
                options = [[c for c in cands[j] if self._fname(c) == names[j]] for j in range(len(names))]
                atoms += [(p,) + combo for combo in itertools.product(*options)]
            ok = [a for a in atoms if a not in written and not self._clashes(a)]
            if ok:
                out.append(ok)
        for want in free:  # a clause that names nothing: only a nullary predicate's one atom is few
            if want is not None and want in self.preds and not self.preds[want]:
                if not self._clashes((want,)):
                    out.append([(want,)])
        self._mutex_memo[key] = out
        return out

    def _mutex_ok(self, pred: str, args) -> bool:
        """May the atom ``(pred args...)`` be written in ``:init`` now: it breaks no group beside the
        atoms written, and every clause still waiting that has an atom keeping the groups keeps one
        beside it (unless it could be the clause this atom stands for)?"""
        if not self.mutex:
            return True
        atom = (pred,) + tuple(args)
        if self._clashes(atom):
            return False
        mine = set(self._groups_of(atom))
        if not mine:
            return True
        for options in self._mutex_waiting():
            if atom in options:
                continue
            if not any(not (mine & set(self._groups_of(o))) for o in options):
                return False
        return True

    def _mutex_path(self, pred: str, prefix: list[str], conj) -> bool:
        """Without the statement's facts on ``:init``: can ``(pred prefix...)`` still end as an atom not
        yet written that keeps the groups?"""
        cands = self._candidates("init", pred)
        rest = [cands[j] for j in range(len(prefix), len(cands))]
        used = conj.used if conj is not None and conj.used else set()
        return any((False, pred, tuple(prefix) + combo) not in used and self._mutex_ok(pred, list(prefix) + list(combo))
                   for combo in itertools.product(*rest))

    def _mutex_written(self, pred: str, args) -> None:
        """An atom of ``:init`` closed: its groups are held."""
        if not self.mutex:
            return
        atom = (pred,) + tuple(args)
        gs = self._groups_of(atom)
        if gs:
            self.mutex_held = {**self.mutex_held, **{g: atom for g in gs}}
