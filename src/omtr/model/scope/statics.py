"""The static facts rule: ``:init`` may hold static facts the statement leaves out, beside its clauses.

A static predicate is one no action's effect changes: the domain's structure, which a statement may
leave out (PlanBench's Logistics never states ``(truck t0)`` or ``(obj p0)``). Part of the facts
rule (:mod:`.facts`), in force with it: unary, one per object, the one the object's name holds
where it holds one, never of a predicate the statement's own clauses name, and only while
``:init`` keeps room for every clause left.
"""

from __future__ import annotations

from omtr.statement import name_parts

from .frames import Frame


class StaticsRule:
    """The static facts rule's state (``static_extra``, ``stated``) and its checks."""

    def _init_statics(self) -> None:
        self.static_extra: frozenset = frozenset()  # objects with a static fact beyond the clauses
        self.stated: frozenset = frozenset()  # predicates the statement's clauses name (_bind_predicates)

    def _static(self, pred: str) -> bool:
        """Is ``pred`` static: declared, and changed by no action's effect (known once the domain is
        written, or from the given domain)? Static facts are the domain's structure, which a
        statement may leave out (PlanBench's Logistics never states ``(truck t0)`` or ``(obj p0)``):
        the facts rule lets ``:init`` hold them beside the statement's clauses."""
        return self.domain_done and pred in self.preds and pred not in self.fluents

    def _static_extra(self, pred: str, prefix: list[str], conj: Frame | None) -> bool:
        """May ``(pred prefix...)`` be a static fact of ``:init`` beyond the statement's clauses? Only
        a unary one (what an untyped domain says instead of a type: ``(truck truck_0)``), at most one
        per object, the one its name holds where it holds one (:meth:`_named_static`), of a
        predicate none of the statement's clauses names (PlanBench states each airport, "location_0_0
        is an airport", so ``(airport package_0)`` is no fact it left out), and while ``:init`` keeps
        room under the grammar's bound for an atom per clause left."""
        if not self._static(pred) or len(self.preds[pred]) != 1 or pred in self.stated:
            return False
        used = len(conj.used) if conj is not None and conj.used else 0
        if used + len(self.fact_left["init"]) + len(self.fact_free["init"]) >= self.part_limit["init"]:
            return False
        if prefix:
            return (prefix[0] not in self.static_extra and self._named_static(pred, prefix[0])
                    and self._mutex_ok(pred, prefix))
        free = [c for c in self._candidates("init", pred)[0]
                if c not in self.static_extra and self._named_static(pred, c)]
        return bool(free) and self._unwritten(conj, False, pred, [], [free], "init")

    def _named_static(self, pred: str, obj: str) -> bool:
        """An object whose name holds a unary static predicate's name as a part (``truck_0``:
        truck) takes that one, as a group named after a type takes the type; others take any
        predicate no declared object's name holds (``package_0`` takes ``obj``, not ``truck``:
        that one belongs to the trucks)."""
        named = [p for p in name_parts(obj) if p != pred and p in self.preds and len(self.preds[p]) == 1
                 and self._static(p)]
        if named:
            return pred in name_parts(obj)
        return pred in name_parts(obj) or pred not in self._claimed_statics()

    def _claimed_statics(self) -> frozenset:
        """The unary static predicates some declared object's name holds as a part."""
        n = len(self.objects)
        got = self.__dict__.get("_claimed")
        if got is None or got[0] != n:
            parts = {p for o in self.objects for p in name_parts(o)}
            got = (n, frozenset(p for p in parts if p in self.preds and len(self.preds[p]) == 1 and self._static(p)))
            self._claimed = got
        return got[1]

    def _static_written(self, f: Frame, fits: list) -> bool:
        """An atom of ``:init`` or the goal closed, with ``fits`` the clauses it could stand for: is
        it a static fact beside the clauses, as :meth:`_fact_path` allows it (then recorded)? One
        that stands for no clause, or the one its name holds ((location location_0_0)), so that a
        clause over the same name ("location_0_0 is an airport") keeps its own atom."""
        if (f.ctx == "init" and len(f.args) == 1
                and (not fits or f.pred in name_parts(f.args[0]))
                and self._static_extra(f.pred, f.args, self._conj_of(f))):
            self.static_extra = self.static_extra | {f.args[0]}
            return True
        return False
