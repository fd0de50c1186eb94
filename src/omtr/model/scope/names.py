"""The statement's names rule (``statement_objects``): the objects the task's English names, and none it never names.

The problem's ``:objects`` declares the statement's names first (:func:`omtr.statement.statement_objects`:
"the red block", ``ball_1``, ``room_2``), each once, and cannot close while one is missing; a name
that holds a declared type's name as a part (``ball_1``) shares its group with no such name of
another type, and the group takes that type or one below it (``ball_1 ball_2 - ball``); so does a
name the plain English gives a class noun that is a declared type ("ball b1": ``b1 - ball``). Where the
reading is sure the statement names every object, the problem's own objects are words of the task's
text, no more of them than the clauses that name nothing need (:mod:`.facts`).
"""

from __future__ import annotations

import re

from omtr.statement import _norm, name_parts, type_claims

from .declarations import ROOT_TYPE
from .frames import Frame

_NAME = re.compile(r"[a-z][a-z0-9_-]*")


def _names_type(obj: str, typ: str) -> bool:
    """Does the object's name hold the type's as a part (``ball_1``: ball; ``truck-0``: truck)?"""
    return typ in name_parts(obj)


class NamesRule:
    """The names rule's state (``required``, ``extra_words``) and its queries on ``:objects``."""

    def _init_names(self, objects, max_objects: int) -> None:
        """``required``: the statement's names ``objects``, unless they would not fit the grammar's
        bound ``max_objects``. ``extra_words``: the words the problem's own objects may be, where the
        reading is sure the statement names every object (None: any name within the grammar's bound)."""
        names = objects if getattr(objects, "require", True) else ()  # False: names that only size the bounds
        req = tuple(dict.fromkeys(o for o in (names or ()) if _NAME.fullmatch(o) and len(o) <= self.name_len
                                  and o not in self.constants))
        self.required = req if len(req) <= max_objects else ()
        self.extra_words = getattr(objects, "extra_words", None) if self.required else None
        # plain English: the noun the English gives a name ("ball b1", "two pallets, pa and pb"),
        # which, where it is a declared type, is the name's type as a part of its spelling is
        reading = getattr(objects, "reading", None)
        nouns = dict(getattr(reading, "nouns", ()) or ()) if self.required else {}
        self.name_nouns = {o: nouns[n] for o in self.required if (n := o.replace("_", "").replace("-", "")) in nouns}

    def _object_words(self, f: Frame, banned: set[str]) -> set[str] | None:
        """The words that may come next in ``:objects`` ``f`` (besides ``banned``), or None for any
        new name: the statement's missing names first, grouped by the type they name; then, where
        the reading is sure the statement names every object, only words of the task's text, as
        many as the clauses that name nothing need."""
        missing = self._missing_objects(f)
        if missing:  # the statement's names come first, grouped by the type they name
            fits = [o for o in missing if len(self._group_types(f, o)) <= 1 and self._claims_fit(f, o)]
            return set(fits) | ({"-"} if self._dash_ok(f) else set())
        if self.extra_words is not None:  # no object the English never names
            own = set()
            # objects of its own start a group of their own (typed for the clauses they serve)
            mixed = self.typing and any(o in self.required for o in f.group)
            if not mixed and self._own_objects(f) < self._own_needed():
                own = {w for w in self.extra_words if _NAME.fullmatch(w) and len(w) <= self.name_len} - banned
            return own | ({"-"} if self._dash_ok(f) else set())
        return None

    def _object_types(self, f: Frame, fit: set[str]) -> set[str]:
        """The types among ``fit`` that the waiting group of ``:objects`` ``f`` may take: the one its
        statement's names name or one below it; for objects of the problem's own, those that give
        the clauses without names atoms (:meth:`_useful_types`)."""
        named = self._subtypes(self._group_types(f)) & fit
        if not named and self.fact_left is not None:
            return self._useful_types(f, fit)
        got = named or fit
        told = {t for t in got if all(self._claim_allows(o, t) for o in f.group)}
        return told or got  # never a dead end: where nothing fits, the rule stands aside

    # ------------------------------------------------------------------ types the English gives

    def _type_claims(self) -> dict[str, frozenset]:
        """The types the statement's clauses give its names, by the type's own name: a one-name
        :init clause of a sure reading whose words name a declared type and no predicate
        ("location_0_0 is an airport" in a typed domain), as ``{type: names}``. Such a type (or one
        below it) goes to those names only, and each of them takes it. Empty without typing, the
        facts rule or such a clause."""
        n = (len(self.type_items), len(self.preds))
        got = self.__dict__.get("_claims")
        if got is not None and got[0] == n:
            return got[1]
        reading = getattr(self, "_reading", None)
        out = {}
        if self.typing and self.required and self.fact_left is not None and reading is not None:
            out = type_claims(reading.init, self._declared_types() - {ROOT_TYPE}, self.preds)
        self._claims = (n, out)
        return out

    def _claim_allows(self, obj: str, typ: str) -> bool:
        """May the statement's name ``obj`` take type ``typ``: each type a clause gives it is ``typ``
        or above it, and no type the clauses give other names only is?"""
        claims = self._type_claims()
        if not claims or obj not in self.required:
            return True
        tq, me = self._typeq(), _norm(obj)
        return all(tq.fits(typ, t) == (me in names) for t, names in claims.items()
                   if tq.fits(typ, t) or me in names)

    def _claims_fit(self, f: Frame, extra: str | None = None) -> bool:
        """Is there a type the waiting group of ``:objects`` ``f`` (with ``extra``) may take under
        the clauses' types and the types its names name (:meth:`_group_types`)? A name that no type
        fits alone (its clause's type and its own name's disagree) is left to the model."""
        if not self._type_claims():
            return True
        group = f.group + ([extra] if extra else [])
        named = self._subtypes(self._group_types(f, extra)) or (self._declared_types() - {ROOT_TYPE})
        if any(all(self._claim_allows(o, t) for o in group) for t in named):
            return True
        return len(group) == 1 and not self._claim_satisfiable(group[0])

    def _claim_satisfiable(self, obj: str) -> bool:
        """Does some type both fit the clauses' types for ``obj`` and the type its name names?"""
        named = self._subtypes({t for t in self._declared_types() - {ROOT_TYPE} if _names_type(obj, t)})
        return any(self._claim_allows(obj, t) for t in (named or self._declared_types() - {ROOT_TYPE}))

    def _claims_untyped(self, items: dict) -> bool:
        """Does a name of ``items`` (name -> type) lack a type the statement's clauses give it?"""
        return bool(self._type_claims()) and any(not self._claim_allows(o, t) and self._claim_satisfiable(o)
                                                 for o, t in items.items())

    def _group_types(self, f: Frame, extra: str | None = None) -> set[str]:
        """The declared types that the statement's names in the waiting group (and ``extra``) name."""
        if not self.typing:
            return set()
        types = self._declared_types() - {ROOT_TYPE}
        out = set()
        for o in f.group + ([extra] if extra else []):
            if o in self.required:
                out |= {t for t in types if _names_type(o, t) or self.name_nouns.get(o) == t}
        return out

    def _subtypes(self, types: set[str]) -> set[str]:
        """``types`` and every declared type below one of them (``location_0_0`` may be an
        ``airport`` when airports are locations)."""
        if not types:
            return set()
        tq = self._typeq()
        return {t for t in self._declared_types() if any(tq.fits(t, n) for n in types)}

    def _missing_objects(self, f: Frame) -> list[str]:
        return [o for o in self.required if o not in f.items and o not in self.constants] if self.required else []

    def _own_objects(self, f: Frame) -> int:
        """Objects of the problem's own declared so far in ``:objects`` ``f``."""
        return sum(1 for o in f.items if o not in self.required)
