"""The declarations rule (``scope``): a spec names only what it has declared, with the types it declared.

What a domain declares (:class:`Declared`, from a given domain or from the answer's own), the type
table (:class:`Types`: a subtype fits where its parent is needed), and the tracker's queries over
them (:class:`DeclarationsRule`): the terms an atom's argument may be, whether a literal is left to
write in a conjunction, whether a typed list (parameters, ``:objects``) can still end so that some
predicate is fillable, which parents a type may take without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .frames import ATOM, CONJ, EQ, FORMULA, INIT, NOT, OBJECTS, PARAMS, TYPES, Frame

ROOT_TYPE = "object"


@dataclass
class Declared:
    """What a domain declares, as the tracker needs it (shared, never mutated after parsing)."""

    name: str | None = None
    flags: frozenset = frozenset()
    types: dict = field(default_factory=dict)  # type -> tuple of parents
    predicates: dict = field(default_factory=dict)  # name -> tuple of argument types
    constants: dict = field(default_factory=dict)  # name -> type
    actions: frozenset = frozenset()
    fluents: frozenset = frozenset()  # predicates some action's effect changes (the others are static)
    invariants: tuple = ()  # the domain's mutex invariants (given_declarations(..., invariants=True))
    # its invariants without parameters or nullary atom (Gripper's "at most one at-robby ?r", Depots'
    # clear ?x): not used unless the statement's reading says the thing they count is in one place
    loose_invariants: tuple = ()


def declared_from_domain(text: str) -> Declared:
    """The declarations of a given domain (PDDL text), read with omtr's own reader.

    Raises :class:`omtr.pddl.model.SpecError` for a domain that does not parse."""
    from omtr.pddl.model import atoms_of, parse_domain

    dom = parse_domain(text)
    preds = {p: tuple(t for _, t in args) for p, args in dom.predicates.items()}
    fluents = {atom[0] for act in dom.actions.values() for atom, _, _ in atoms_of(act.effect, effect=True)}
    return Declared(name=dom.name.lower(), flags=frozenset(dom.requirements), types=dict(dom.types),
                    predicates=preds, constants=dict(dom.constants), actions=frozenset(dom.actions),
                    fluents=frozenset(fluents))


class GivenDomainError(ValueError):
    """A given domain (an input of the task) that cannot be read: the user's input error."""


_GIVEN_CACHE: dict[str, Declared] = {}


def given_declarations(text: str, *, invariants: bool = False) -> Declared:
    """:func:`declared_from_domain`, cached by text, with a clear error for a broken domain.
    ``invariants``: with the domain's mutex invariants, for the ``init_invariants`` rule
    (:mod:`.invariants`; the translator runs once per domain text)."""
    if invariants:
        from dataclasses import replace

        from .invariants import given_invariants, given_loose_invariants

        base = given_declarations(text)
        key = ("invariants", text)
        got = _GIVEN_CACHE.get(key)
        if got is None:
            got = _GIVEN_CACHE[key] = replace(base, invariants=given_invariants(text),
                                              loose_invariants=given_loose_invariants(text))
        return got
    got = _GIVEN_CACHE.get(text)
    if got is None:
        from omtr.pddl.model import SpecError

        try:
            got = declared_from_domain(text)
        except SpecError as exc:
            raise GivenDomainError(f"the given domain does not parse: {exc}; fix the task's `domain` field") from None
        if len(_GIVEN_CACHE) > 256:
            _GIVEN_CACHE.clear()
        _GIVEN_CACHE[text] = got
    return got


class Types:
    """Subtype queries over a type table (``either:a:b`` types fit through any member)."""

    def __init__(self, table: dict):
        self.table = table
        self._anc: dict[str, frozenset] = {}

    def ancestors(self, t: str) -> frozenset:
        got = self._anc.get(t)
        if got is None:
            out, queue = {t}, [t]
            while queue:
                for p in self.table.get(queue.pop(), ()):
                    if p not in out:
                        out.add(p)
                        queue.append(p)
            out.add(ROOT_TYPE)
            got = self._anc[t] = frozenset(out)
        return got

    def fits(self, t: str, need: str) -> bool:
        if need == ROOT_TYPE or t == need:
            return True
        if t.startswith("either:"):
            return all(self.fits(m, need) for m in t.split(":")[1:])
        if need.startswith("either:"):
            return any(self.fits(t, m) for m in need.split(":")[1:])
        return need in self.ancestors(t)


class DeclarationsRule:
    """The declarations rule's queries, over the tracker's tables (``flags``, ``types``,
    ``type_items``, ``preds``, ``constants``, ``params``, ``objects``) and its frames."""

    # ------------------------------------------------------------------ flags

    @property
    def typing(self) -> bool:
        return bool({":typing", ":adl"} & self.flags)

    @property
    def negation(self) -> bool:
        return bool({":negative-preconditions", ":adl"} & self.flags)

    @property
    def equality(self) -> bool:
        return bool({":equality", ":adl"} & self.flags)

    # ------------------------------------------------------------------ types

    def _typeq(self) -> Types:
        if self._tq is None:
            self._tq = Types(self.types)
        return self._tq

    def _declared_types(self) -> set[str]:
        out = set(self.type_items) | {ROOT_TYPE}
        for parents in self.types.values():
            out.update(p for p in parents if not p.startswith("either:"))
        return {t for t in out if len(t) <= self.name_len}

    def _fits(self, name: str) -> bool:
        return len(name) <= self.name_len

    # ------------------------------------------------------------------ what an atom may name

    def _terms(self, ctx: str) -> dict[str, str]:
        """Names an atom's argument may be, with their types."""
        if ctx in ("pre", "eff"):
            return {**self.params, **self.constants}
        return {**self.objects, **self.constants}

    def _candidates(self, ctx: str, pred: str) -> list[list[str]]:
        """Per argument of ``pred``: the terms that fit it in context ``ctx``."""
        key = (ctx, pred)
        got = self._cands.get(key)
        if got is None:
            tq, terms = self._typeq(), self._terms(ctx)
            longest = self.name_len + 1  # a ?variable has one character more than a name
            got = [[n for n, t in terms.items() if tq.fits(t, need) and len(n) <= longest] for need in self.preds[pred]]
            if self.__dict__.get("_owned") is None:
                self._cands[key] = got
        return got

    def _room(self, conj: Frame | None, neg: bool, pred: str, prefix: list[str], ctx: str) -> bool:
        """Is there a literal ``(pred prefix...)`` (negated or not) not yet written in ``conj``?"""
        cands = self._candidates(ctx, pred)
        total = 1
        for c in cands[len(prefix):]:
            total *= len(c)
            if total == 0:
                return False
        if conj is None or not conj.used:
            return True
        n = len(prefix)
        used = sum(1 for (un, up, ua) in conj.used if un == neg and up == pred and list(ua[:n]) == prefix)
        return used < total

    def _conj_of(self, f: Frame) -> Frame | None:
        # the atom's conjunction is the frame below it (or two below, under a `not`)
        for g in reversed(self.stack[:-1]):
            if g.kind in (CONJ, INIT):
                return g
            if g.kind not in (NOT, FORMULA, ATOM, EQ):
                return None
        return None

    # ------------------------------------------------------------------ typed lists

    def _params_viable(self, f: Frame, group_type: str | None = None, closing: bool = False,
                       adding: int = 0) -> bool:
        """Can this parameter list still end so that some predicate is fillable (the effect needs
        a literal)? ``group_type``: the type the waiting group is about to get. Each parameter
        still to come may cover one argument type."""
        tq = self._typeq()
        types = [t for i, t in f.items.items() if i not in f.group] + list(self.constants.values())
        group = bool(f.group) or adding > 0
        flexible = group and group_type is None and not closing and self.typing
        if group and not flexible:
            types.append(group_type or ROOT_TYPE)
        slots = 0 if closing else self.list_limit[f.kind] - len(f.items) - adding + (1 if flexible else 0)
        for args in self.preds.values():
            missing = {need for need in args if not any(tq.fits(t, need) for t in types)}
            if len(missing) <= slots:
                return True
        return False

    def _dash_ok(self, f: Frame) -> bool:
        if not self.typing or not f.group:
            return False
        if f.kind == TYPES:
            return self._forward_room(f) > 0 or bool(self._parent_words(f))
        if f.kind in (PARAMS, OBJECTS):
            return any(self._params_viable(f, t) for t in self._declared_types())
        return bool(self._declared_types())

    def _parent_words(self, f: Frame) -> set[str]:
        """Types frame: the parents the waiting group may take among those declared or named."""
        bad = self._bad_parents(f)
        return {t for t in (self.type_items | set(f.items) | {ROOT_TYPE}) - bad if len(t) <= self.name_len}

    def _pending_parents(self, f: Frame) -> set[str]:
        return {p for p in f.items.values() if p != ROOT_TYPE and p not in f.items and p not in self.type_items}

    def _forward_room(self, f: Frame) -> int:
        """Types frame: how many parents not yet declared may still be named (each must be
        declared later in the same list, within the grammar's bound)."""
        return self.list_limit[TYPES] - len(f.items) - len(self._pending_parents(f))

    def _bad_parents(self, f: Frame) -> set[str]:
        """Parents the current group may not take: itself, or a type below one of its members."""
        group = set(f.group)
        table = {**self.types, **{i: (p,) for i, p in f.items.items() if i not in group}}
        tq = Types(table)
        names = self._declared_types() | set(table)
        return group | {t for t in names if group & tq.ancestors(t)}
