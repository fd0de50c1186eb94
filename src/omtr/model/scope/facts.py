"""The statement's facts rule (``statement_facts``, with ``statement_predicates``): the atoms of ``:init`` and the goal.

With the statement's names come its *facts* (:class:`omtr.statement.StatementNames`): each clause's
names in order ("the blue block is on top of the orange block": blue, orange). An atom of ``:init``
or the goal over the statement's names stands for one clause of its part not yet used, its
arguments naming the clause's names in that order; an atom over none of the names (over no
argument, or over objects of the problem's own: ``(handempty)``, ``(free left)``) stands for one of
the part's clauses that name nothing ("the hand is empty"); ``:init``, the goal and its ``and``
close only when no clause is left that an atom could still be written for, a goal with more than
one clause is an ``and``, and ``:objects`` closes only when it has objects of its own enough for
the clauses without names (or is full). The predicates rule: a clause whose words name one of the
domain's predicates takes only an atom of it; the others stay the model's choice. The static facts
``:init`` may hold beside the clauses are :mod:`.statics`'.
"""

from __future__ import annotations

import itertools
from collections import Counter

from omtr.statement import _norm

from .frames import CONJ, INIT, Frame, Reject


class FactsRule:
    """The facts rule's state (``fact_names``, ``fact_left``, ``fact_free``) and its checks."""

    def _init_facts(self, objects) -> None:
        """The statement's facts (``objects.facts``), only with the names rule in force: per part,
        the clauses no atom stands for yet."""
        facts = getattr(objects, "facts", None) if self.required else None
        self.fact_names = frozenset(_norm(o) for o in self.required) if facts else frozenset()
        # per part, the clauses no atom stands for yet: (key, predicate) for those with names, a
        # predicate for each that names nothing (None: any; the predicates rule binds them below)
        self.fact_left = {"init": tuple((k, None) for k in facts[0]),
                          "goal": tuple((k, None) for k in facts[1])} if facts else None
        free = getattr(objects, "nameless", (0, 0)) if facts else (0, 0)
        self.fact_free = {"init": (None,) * free[0], "goal": (None,) * free[1]}
        self._statement = objects if facts and getattr(objects, "predicates", False) else None
        reading = getattr(objects, "reading", None)
        self._reading = reading if facts else None  # for the types its clauses give (names._type_claims)
        self._nameless_init = reading.nameless[0] if reading is not None else 0
        # the parts the facts bind: both, or in plain English the goal alone, whose clauses' atoms
        # :init may then not hold (a goal that already holds asks for nothing)
        self.fact_parts = tuple(getattr(reading, "fact_parts", ("init", "goal"))) if facts else ()
        # plain English: :init is open (its English is never complete) but holds an atom for each of
        # its sure clauses, and none a goal clause stands for
        self.open_init = facts is not None and getattr(reading, "layout", "") == "plain"
        self._reading_parts = self.fact_parts
        if self.open_init:
            self._open_init_clauses()

    def _bind_predicates(self) -> None:
        """The predicates rule: once the domain's predicates are known (given, or when the answer's
        problem begins), each clause whose words name one predicate
        (:func:`omtr.statement.clause_predicate`) takes only an atom of that predicate."""
        if self._statement is None or self.fact_left is None:
            return
        bound = self._statement.clause_facts(self.preds)
        self._use_single(self.preds)  # "the robot is in room r1": at most one at-robby (.invariants)
        self.fact_left = {part: bound[part][0] for part in ("init", "goal")}
        self.fact_free = {part: bound[part][1] for part in ("init", "goal")}
        if self.open_init:
            self._open_init_clauses()
        # The predicates the statement's own clauses name: facts the English states one by one
        # ("location_0_0 is an airport"), so none of them is a static fact it left out.
        self.stated = frozenset(p for part in bound.values() for p in
                                [e[1] for e in part[0]] + list(part[1]) if p is not None)

    def _open_init_clauses(self) -> None:
        """Plain English: the :init clauses an atom must stand for are those over two names ("b sits
        on c") and those over one whose words name the predicate ("z is on the table": ``ontable``);
        a clause of one name whose predicate is not known is dropped (not sure what it says)."""
        keep = tuple(e for e in self.fact_left["init"] if len(e[0]) == 2 or e[1] is not None)
        self.fact_left = {**self.fact_left, "init": keep}
        # a clause that names nothing stays where its words name a predicate of no argument ("the hand
        # is empty": (handempty)); the others are dropped
        nullary = tuple(p for p in self.fact_free["init"] if p is not None and p in self.preds and not self.preds[p])
        self.fact_free = {**self.fact_free, "init": nullary}
        # a goal clause of one name binds only through the predicate its words name ("put b on the
        # table": ontable); where none is named (no such predicate, or the predicates rule is off) the
        # goal is not bound at all (any atom over b would do, and none of them is sure)
        self.fact_parts = self._reading_parts
        if any(len(k) == 1 and p is None for k, p in self.fact_left["goal"]):
            self.fact_left = {**self.fact_left, "goal": ()}
            self.fact_free = {**self.fact_free, "goal": ()}
            self.fact_parts = tuple(x for x in self.fact_parts if x != "goal")

    def _goal_clause_atom(self, pred: str, args) -> bool:
        """Plain English (:attr:`open_init`): could the atom ``(pred args...)`` stand for one of the
        goal's clauses? Then ``:init`` may not hold it (the goal would already hold)."""
        if not self.open_init or self.fact_left is None:
            return False
        key = tuple(self._fname(a) for a in args)
        return any(k == key and p in (None, pred) for k, p in self.fact_left["goal"])

    def _open_init_path(self, pred: str, prefix: list[str], conj: Frame | None) -> bool:
        """Plain English: can ``(pred prefix...)`` still end as an :init atom not yet written that no
        goal clause stands for?"""
        cands = self._candidates("init", pred)
        rest = [cands[j] for j in range(len(prefix), len(cands))]
        if not all(rest):
            return (len(prefix) == len(cands) and not self._goal_clause_atom(pred, prefix)
                    and self._mutex_ok(pred, prefix))
        used = conj.used if conj is not None and conj.used else set()
        n = 1
        for r in rest:
            n *= len(r)
            if n > len(used) + len(self.fact_left["goal"]) and not self.mutex:
                return True  # more completions than atoms that could rule them out
        return any((False, pred, tuple(prefix) + combo) not in used
                   and not self._goal_clause_atom(pred, list(prefix) + list(combo))
                   and self._mutex_ok(pred, list(prefix) + list(combo))
                   for combo in itertools.product(*rest))

    def _open_init_written(self, f: Frame) -> None:
        """Plain English: an atom of :init closed: refused if a goal clause stands for it, else it
        uses the :init clause it stands for, if any (other atoms are the model's own)."""
        if self._goal_clause_atom(f.pred, f.args):
            raise Reject
        key = tuple(self._fname(a) for a in f.args)
        if all(k is None for k in key) and f.pred in self.fact_free["init"]:  # "the hand is empty"
            free = list(self.fact_free["init"])
            free.remove(f.pred)
            self.fact_free = {**self.fact_free, "init": tuple(free)}
            return
        left = list(self.fact_left["init"])
        fits = [e for e in left if e[0] == key and e[1] in (None, f.pred)]
        if fits:
            left.remove(next((e for e in fits if e[1] == f.pred), fits[0]))
            self.fact_left = {**self.fact_left, "init": tuple(left)}

    def _fname(self, obj: str) -> str | None:
        """The statement's name an object stands for, or None."""
        n = _norm(obj)
        return n if n in self.fact_names else None

    def _fact_path(self, ctx: str, pred: str, prefix: list[str], conj: Frame | None = None,
                   neg: bool = False) -> bool:
        """Can ``(pred prefix...)`` still end as an atom the facts rule allows in part ``ctx``: one
        over none of the statement's names (``(handempty)``, ``(free left)``) while the part has a
        clause without names for it, or one whose arguments name, in order, the names of a clause
        of the part no atom stands for yet?"""
        if ctx == "init" and self._static_extra(pred, prefix, conj):
            return True  # a static fact the English may leave out (PlanBench's (truck t0), (obj p0))
        if self._free_fits(ctx, pred, prefix, conj, neg):
            return True
        return any(self._key_fits(ctx, pred, entry, prefix, conj, neg) for entry in self.fact_left[ctx])

    def _free_fits(self, ctx: str, pred: str, prefix: list[str], conj: Frame | None, neg: bool = False) -> bool:
        """Can ``(pred prefix...)`` end as an atom over none of the statement's names, not yet in
        ``conj``, for a clause of the part that names nothing and takes ``pred``?"""
        if not any(p is None or p == pred for p in self.fact_free[ctx]):
            return False
        cands = self._candidates(ctx, pred)
        if any(self._fname(a) is not None for a in prefix):
            return False
        rest = [[c for c in cands[j] if self._fname(c) is None] for j in range(len(prefix), len(cands))]
        return all(rest) and self._unwritten(conj, neg, pred, prefix, rest, ctx)

    def _key_fits(self, ctx: str, pred: str, entry: tuple, prefix: list[str], conj: Frame | None,
                  neg: bool = False) -> bool:
        """Can ``(pred prefix...)`` end as an atom not yet in ``conj`` for the clause ``entry`` =
        (key, predicate): its arguments name ``key``'s names in order, and ``pred`` is the
        clause's predicate where its words name one?"""
        key, want = entry
        if want is not None and want != pred:
            return False
        cands = self._candidates(ctx, pred)
        if len(key) != len(cands) or any(self._fname(a) != k for a, k in zip(prefix, key)):
            return False
        rest = [[c for c in cands[j] if self._fname(c) == key[j]] for j in range(len(prefix), len(key))]
        return all(rest) and self._unwritten(conj, neg, pred, prefix, rest, ctx)

    def _unwritten(self, conj: Frame | None, neg: bool, pred: str, prefix: list[str], rest: list[list[str]],
                   ctx: str | None = None) -> bool:
        """Is some literal ``(pred prefix + one of each of rest)`` not yet in ``conj`` (in ``:init``,
        one that keeps the given domain's mutex groups: :mod:`.invariants`)?"""
        mutex = ctx == "init" and bool(self.mutex)
        if (conj is None or not conj.used) and not mutex:
            return True
        used = conj.used if conj is not None and conj.used else set()
        return any((neg, pred, tuple(prefix) + combo) not in used
                   and (not mutex or self._mutex_ok(pred, list(prefix) + list(combo)))
                   for combo in itertools.product(*rest))

    def _fact_written(self, f: Frame) -> None:
        """An atom of ``:init`` or the goal closed: the clause it stands for is used (a static
        fact of ``:init`` that stands for no clause is let be)."""
        key = tuple(self._fname(a) for a in f.args)
        left = list(self.fact_left[f.ctx])
        fits = [e for e in left if e[0] == key and e[1] in (None, f.pred)]
        if self._static_written(f, fits):  # a static fact beside the clauses (.statics)
            return
        if all(k is None for k in key):  # for a clause that names nothing
            free = list(self.fact_free[f.ctx])
            # the clause whose words name this predicate first, else one that takes any
            pick = f.pred if f.pred in free else (None if None in free else False)
            if pick is False:
                raise Reject
            free.remove(pick)
            self.fact_free = {**self.fact_free, f.ctx: tuple(free)}
            return
        if not fits:
            raise Reject
        left.remove(next((e for e in fits if e[1] == f.pred), fits[0]))
        self.fact_left = {**self.fact_left, f.ctx: tuple(left)}

    def _free_short(self, f: Frame) -> bool:
        """Closing ``:objects`` ``f``: would fewer atoms over none of the statement's names be
        possible than ``:init`` has clauses without names ("the left gripper is free" needs an
        object of the problem's own for ``(free left)``)?"""
        need = self._own_needed()
        return need > 0 and self._free_atoms(f.items, need) < need

    def _own_needed(self) -> int:
        """How many clauses of ``:init`` that name nothing need an object of the problem's own: those
        whose predicate takes arguments, or is not known ("the hand is empty" as ``(handempty)``
        needs none)."""
        if self.fact_left is None:  # no facts rule: every clause that names nothing may need one
            return self._nameless_init
        return sum(1 for p in self.fact_free["init"] if p is None or len(self.preds.get(p, ())) > 0)

    def _free_atoms(self, items: dict, cap: int) -> int:
        """How many of ``:init``'s clauses that name nothing (those :meth:`_own_needed` counts) the
        objects ``items`` (name -> type) and the constants give an atom over none of the statement's
        names (counted up to ``cap``). A clause whose words name its predicate ("the left gripper is
        free": ``free``) counts only atoms of that predicate, so a room does not stand in for a
        gripper; one that takes any predicate counts every atom."""
        tq = self._typeq()
        own = [t for o, t in items.items() if self._fname(o) is None] + list(self.constants.values())
        counts: dict[str, int] = {}

        def atoms(p: str) -> int:
            if p not in counts:
                n = 1
                for a in self.preds.get(p, ()):
                    n *= sum(1 for t in own if tq.fits(t, a))
                counts[p] = n
            return counts[p]

        wanted = Counter(self.fact_free["init"]) if self.fact_left is not None else Counter()
        total = 0
        for p, k in wanted.items():
            if p is not None and len(self.preds.get(p, ())) > 0:
                total += min(k, atoms(p))
        anyp = wanted[None] if self.fact_left is not None else self._own_needed()
        if anyp:
            every = 0
            for p in self.preds:
                every += atoms(p)
                if every >= anyp:
                    break
            total += min(anyp, every)
        return min(total, cap)

    def _typing_helps(self, f: Frame, waiting: list[str]) -> bool:
        """Closing a full ``:objects`` ``f`` whose last objects ``waiting`` have no type: would some
        type give the clauses without names more atoms (``ball balls)`` where ``ball balls -
        gripper)`` gives "the left gripper is free" its ``(free ?)``)?"""
        if not self.typing or not waiting or any(self._fname(o) is not None for o in waiting):
            return False
        need = self._own_needed()
        base = {o: t for o, t in f.items.items() if o not in waiting}
        return bool(self._more_atoms(base, waiting, need, self._free_atoms(f.items, need), self._declared_types()))

    def _more_atoms(self, base: dict, group: list[str], need: int, have: int, types) -> set[str]:
        """The types among ``types`` that, given to every object of ``group`` beside ``base``, give
        the clauses without names more than ``have`` atoms (:meth:`_free_atoms`)."""
        return {t for t in types if self._free_atoms({**base, **{o: t for o in group}}, need) > have}

    def _useful_types(self, f: Frame, fit: set[str]) -> set[str]:
        """Types for the waiting group of objects of the problem's own while the clauses without
        names lack objects: those that give them more atoms (all of ``fit`` when none does)."""
        need = self._own_needed()
        if need <= 0 or not f.group or any(self._fname(o) is not None for o in f.group):
            return fit
        base = {o: t for o, t in f.items.items() if o not in f.group}
        have = self._free_atoms(base, need)
        if have >= need:
            return fit
        return self._more_atoms(base, f.group, need, have, fit) or fit

    def _facts_open(self, f: Frame) -> bool:
        """Closing ``f`` (``:init``, the goal or the goal's ``and``): is a clause of its part left
        that some predicate could still be written for?"""
        ctx = "init" if f.kind == INIT else "goal"
        conj = f if f.kind in (CONJ, INIT) else None
        if conj is not None and conj.used is not None and len(conj.used) >= self.part_limit[ctx]:
            return False  # the grammar's bound on the part's atoms is reached: it has to close
        if any(self._key_fits(ctx, p, entry, [], conj) for entry in self.fact_left[ctx]
               for p in self.preds if self._fits(p)):
            return True
        # a clause that names nothing but names its predicate ("harmony") is not dropped either
        return any(p is not None and p in self.preds and self._free_fits(ctx, p, [], conj)
                   for p in self.fact_free[ctx])
