"""Scoped decoding: a spec may only name what it has declared.

The PDDL grammar (:mod:`omtr.model.grammar`) is context-free: it knows what a predicate *looks*
like, not which predicates exist. :class:`ScopeTracker` reads the answer written so far, one
character at a time, and keeps what the spec has declared: requirement flags, types and their
parents, predicates with their argument types, actions, each action's parameters, objects, and
the literals already written in each conjunction. From that it decides which names may come next:

* a predicate in a precondition, an effect, ``:init`` or ``:goal`` is one the domain declared,
  with exactly its arity (the character after its name says how many arguments follow);
* an argument is one of the action's parameters (in an action) or a declared object or constant
  (in the problem), whose type fits the predicate's parameter (a subtype fits);
* a type in a typed list is a declared type or ``object``;
* nothing is declared twice, no literal repeats inside one conjunction or ``:init``;
* ``-`` (typing), ``(not`` in a precondition or goal and ``(=`` need the flags that allow them;
* a parameter list or ``:objects`` closes only when some predicate can be written with what it
  declared (an action's effect and the goal need at least one literal).

The constraint comes from the answer itself, in the domain-given mode from the given domain, and,
when the caller passes them (``objects``), from the object names the task's statement uses
(:func:`omtr.statement.statement_objects`: "the red block", ``ball_1``, ``room_2``, read from the
English alone, never from a reference): the problem's ``:objects`` declares those names first, each
once, before any name of its own, and cannot close while one is missing; such a name that holds a
declared type's name as a part (``ball_1``) shares its group with no such name of another type, and
the group takes that type (``ball_1 ball_2 - ball``). With those names come the statement's *facts*
(:class:`omtr.statement.StatementNames`, ``statement_facts`` in the model config): each
clause's names in order ("the blue block is on top of the orange block": blue, orange). Then an
atom of ``:init`` or the goal over the statement's names stands for one clause of its part not yet
used, its arguments naming the clause's names in that order; an atom over none of the names (over
no argument, or over objects of the problem's own: ``(handempty)``, ``(free left)``) stands for one
of the part's clauses that name nothing ("the hand is empty"); ``:init``, the goal and its ``and``
close only when no clause is left that an atom could still be written for, a goal with more than
one clause is an ``and``, and ``:objects`` closes only when it has objects of its own enough for the
clauses without names (or is full). The predicates stay the model's choice. Nothing else here
reads the task's text.

How it is applied (:class:`ScopedMask`): xgrammar computes the grammar's token mask; the tracker
then removes the tokens it rejects. Inside a name whose allowed values are a finite set (declared
predicates, parameters, objects, types, flags), the admitted tokens are found by walking the
allowed names through a table of the tokenizer's pieces; elsewhere only the few tokens the
grammar admits that cross a word boundary are simulated character by character.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections import Counter
from dataclasses import dataclass, field

from omtr.model.limits import GrammarLimits
from omtr.statement import _norm, name_parts

log = logging.getLogger("omtr.model")

ROOT_TYPE = "object"
WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-?:=")
SECTION_HEADS = ("domain", "problem", ":requirements", ":types", ":predicates", ":action",
                 ":domain", ":objects", ":init", ":goal")


_NAME = re.compile(r"[a-z][a-z0-9_-]*")


def _names_type(obj: str, typ: str) -> bool:
    """Does the object's name hold the type's as a part (``ball_1``: ball; ``truck-0``: truck)?"""
    return typ in name_parts(obj)


class Reject(Exception):
    """The character just fed makes the answer leave the scope rules."""


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


def declared_from_domain(text: str) -> Declared:
    """The declarations of a given domain (PDDL text), read with omtr's own reader.

    Raises :class:`omtr.pddl.model.SpecError` for a domain that does not parse."""
    from omtr.pddl.model import parse_domain

    from omtr.pddl.model import atoms_of

    dom = parse_domain(text)
    preds = {p: tuple(t for _, t in args) for p, args in dom.predicates.items()}
    fluents = {atom[0] for act in dom.actions.values() for atom, _, _ in atoms_of(act.effect, effect=True)}
    return Declared(name=dom.name.lower(), flags=frozenset(dom.requirements), types=dict(dom.types),
                    predicates=preds, constants=dict(dom.constants), actions=frozenset(dom.actions),
                    fluents=frozenset(fluents))



class GivenDomainError(ValueError):
    """A given domain (an input of the task) that cannot be read: the user's input error."""


_GIVEN_CACHE: dict[str, Declared] = {}


def given_declarations(text: str) -> Declared:
    """:func:`declared_from_domain`, cached by text, with a clear error for a broken domain."""
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


class _Types:
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


# Frame kinds
ROOT, DEFINE, SECTION, HEADER, REQ, TYPES, PREDS, PDECL, ACTION, PARAMS, FORMULA, CONJ, NOT, ATOM, EQ, \
    OBJECTS, INIT, GOAL = range(18)
TYPED = (TYPES, PDECL, PARAMS, OBJECTS)


class _Frame:
    """One open parenthesis. ``ctx`` (formulas): pre, eff, init or goal."""

    __slots__ = ("kind", "ctx", "words", "group", "after_dash", "items", "used", "neg", "pred", "args",
                 "expect", "name")

    def __init__(self, kind: int, ctx: str | None = None):
        self.kind = kind
        self.ctx = ctx
        self.words = 0  # words read in this frame (the head included)
        self.group: list[str] = []  # typed lists: items waiting for their type
        self.after_dash = False
        self.items: dict[str, str] = {}  # typed lists: item -> type (object until a type follows)
        self.used: set | None = None  # conjunctions and :init: literals written
        self.neg = False
        self.pred: str | None = None
        self.args: list[str] = []
        self.expect: str | None = None  # action: the keyword just read
        self.name: str | None = None

    def copy(self) -> "_Frame":
        f = _Frame.__new__(_Frame)
        for s in _Frame.__slots__:
            setattr(f, s, getattr(self, s))
        f.group = list(self.group)
        f.items = dict(self.items)
        f.args = list(self.args)
        if self.used is not None:
            f.used = set(self.used)
        return f


class ScopeTracker:
    """The scope state of one answer. Feed it the text as it is written (:meth:`feed`); ask it
    whether a piece of text may come next (:meth:`admits`).

    ``given``: the declarations of a given domain (domain-given mode: the answer is the problem
    only); ``None``: the answer writes its own domain first. ``objects``: names the problem's
    ``:objects`` must declare before any other (the task statement's names); ignored when they
    would not fit the grammar's bounds."""

    def __init__(self, given: Declared | None = None, *, limits=None, objects=None):
        L = limits or GrammarLimits()
        self.name_len = L.name_len
        # the grammar's bounds on typed lists: a list that is full can only end or take a type
        self.list_limit = {TYPES: L.types, PDECL: L.predicate_args, PARAMS: L.parameters, OBJECTS: L.objects}
        self.given = given is not None
        d = given or Declared()
        self.flags = set(d.flags)
        self.types: dict[str, tuple] = dict(d.types)
        self.type_items: set[str] = set(d.types)
        self.preds: dict[str, tuple] = dict(d.predicates)
        self.constants: dict[str, str] = dict(d.constants)
        self.actions: set[str] = set(d.actions)
        self.fluents: set[str] = set(d.fluents)  # predicates an action's effect changes (see _static)
        self.objects: dict[str, str] = {}
        self.params: dict[str, str] = {}
        self.stack: list[_Frame] = [_Frame(ROOT)]
        self.word = ""
        self.last = ""
        self.domain_done = self.given
        names = objects if getattr(objects, "require", True) else ()  # False: names that only size the bounds
        req = tuple(dict.fromkeys(o for o in (names or ()) if _NAME.fullmatch(o) and len(o) <= self.name_len
                                  and o not in self.constants))
        self.required = req if len(req) <= L.objects else ()
        # The statement's facts (``objects.facts``, omtr.statement.StatementNames): per
        # part, the clause keys no atom stands for yet; only with the objects rule in force.
        facts = getattr(objects, "facts", None) if self.required else None
        self.fact_names = frozenset(_norm(o) for o in self.required) if facts else frozenset()
        # per part, the clauses no atom stands for yet: (key, predicate) for those with names, a
        # predicate for each that names nothing (None: any; the predicates rule binds them below)
        self.fact_left = {"init": tuple((k, None) for k in facts[0]),
                          "goal": tuple((k, None) for k in facts[1])} if facts else None
        free = getattr(objects, "nameless", (0, 0)) if facts else (0, 0)
        self.fact_free = {"init": (None,) * free[0], "goal": (None,) * free[1]}
        self._statement = objects if facts and getattr(objects, "predicates", False) else None
        # The names rule where the reading is sure the statement names every object: the problem's
        # own objects (for clauses that name nothing) are words of the task's text, no more of them
        # than such clauses need; None: any name within the grammar's bound.
        self.extra_words = getattr(objects, "extra_words", None) if self.required else None
        reading = getattr(objects, "reading", None)
        self._nameless_init = reading.nameless[0] if reading is not None else 0
        self.static_extra: frozenset = frozenset()  # objects with a static fact beyond the clauses
        self.stated: frozenset = frozenset()  # predicates the statement's clauses name (_bind_predicates)
        self.part_limit = {"init": L.init, "goal": L.goal}
        self._tq: _Types | None = None
        self._cands: dict = {}
        if self.given:
            self._bind_predicates()

    def _bind_predicates(self) -> None:
        """The predicates rule: once the domain's predicates are known (given, or when the answer's
        problem begins), each clause whose words name one predicate
        (:func:`omtr.statement.clause_predicate`) takes only an atom of that predicate."""
        if self._statement is None or self.fact_left is None:
            return
        bound = self._statement.clause_facts(self.preds)
        self.fact_left = {part: bound[part][0] for part in ("init", "goal")}
        self.fact_free = {part: bound[part][1] for part in ("init", "goal")}
        # The predicates the statement's own clauses name: facts the English states one by one
        # ("location_0_0 is an airport"), so none of them is a static fact it left out.
        self.stated = frozenset(p for part in bound.values() for p in
                                [e[1] for e in part[0]] + list(part[1]) if p is not None)

    # ------------------------------------------------------------------ copying

    def clone(self) -> "ScopeTracker":
        t = ScopeTracker.__new__(ScopeTracker)
        t.__dict__.update(self.__dict__)
        # Tables change only at declarations; frames on the stack are copied when touched.
        t.stack = list(self.stack)
        t._owned = set()
        return t

    def _top(self) -> _Frame:
        """The innermost frame, made private to this tracker before it is changed."""
        owned = self.__dict__.get("_owned")
        f = self.stack[-1]
        if owned is not None and id(f) not in owned:
            f = f.copy()
            self.stack[-1] = f
            owned.add(id(f))
        return f

    def _mutable_tables(self) -> None:
        owned = self.__dict__.get("_owned")
        if owned is None:
            self._tq, self._cands = None, {}
        elif "tables" not in owned:
            owned.add("tables")
            self.flags, self.types, self.type_items = set(self.flags), dict(self.types), set(self.type_items)
            self.preds, self.constants, self.actions = dict(self.preds), dict(self.constants), set(self.actions)
            self.objects, self.params = dict(self.objects), dict(self.params)
            self.fluents = set(self.fluents)
            self._tq, self._cands = None, {}

    # ------------------------------------------------------------------ queries

    @property
    def typing(self) -> bool:
        return bool({":typing", ":adl"} & self.flags)

    @property
    def negation(self) -> bool:
        return bool({":negative-preconditions", ":adl"} & self.flags)

    @property
    def equality(self) -> bool:
        return bool({":equality", ":adl"} & self.flags)

    def _typeq(self) -> _Types:
        if self._tq is None:
            self._tq = _Types(self.types)
        return self._tq

    def _declared_types(self) -> set[str]:
        out = set(self.type_items) | {ROOT_TYPE}
        for parents in self.types.values():
            out.update(p for p in parents if not p.startswith("either:"))
        return {t for t in out if len(t) <= self.name_len}

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

    def _fillable(self, ctx: str, pred: str) -> bool:
        return all(self._candidates(ctx, pred))

    def _room(self, conj: _Frame | None, neg: bool, pred: str, prefix: list[str], ctx: str) -> bool:
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

    def _conj_of(self, f: _Frame) -> _Frame | None:
        # the atom's conjunction is the frame below it (or two below, under a `not`)
        for g in reversed(self.stack[:-1]):
            if g.kind in (CONJ, INIT):
                return g
            if g.kind not in (NOT, FORMULA, ATOM, EQ):
                return None
        return None

    # ------------------------------------------------------------------ what may come next

    def word_constraint(self):
        """``(closed_set, banned_set)`` for the word being written: a finite set of allowed
        words, or (None, banned) when any new name but the banned ones may come; ``None`` when no
        word is due or the word is free."""
        f = self.stack[-1]
        k = f.kind
        if k == SECTION:
            heads = set(SECTION_HEADS)
            if not self.typing:
                heads.discard(":types")
            return heads, None
        if k == REQ:
            return {":strips", ":typing", ":negative-preconditions", ":equality"} - self.flags, None
        if k in TYPED:
            if f.after_dash:
                if k == TYPES:
                    bad = self._bad_parents(f)
                    if self._forward_room(f) > 0:
                        return None, bad
                    return {t for t in (self.type_items | set(f.items) | {ROOT_TYPE}) - bad
                            if len(t) <= self.name_len}, None
                if k in (PARAMS, OBJECTS):
                    fit = {t for t in self._declared_types() if self._params_viable(f, t)}
                    if k == OBJECTS and self.required:
                        named = self._subtypes(self._group_types(f)) & fit
                        if not named and self.fact_left is not None:
                            return self._useful_types(f, fit), None
                        return named or fit, None
                    return fit, None
                return self._declared_types(), None
            if k == PDECL and f.words == 0:
                return None, set(self.preds)
            banned = set(f.items) | set(f.group)
            if k == TYPES:
                if self._forward_room(f) <= 0:  # only the parents named so far may still be declared
                    return (self._pending_parents(f) - banned) | ({"-"} if self._dash_ok(f) else set()), None
                banned |= self.type_items | {ROOT_TYPE}
            elif k == OBJECTS:
                banned |= set(self.constants)
                missing = self._missing_objects(f)
                if missing:  # the statement's names come first, grouped by the type they name
                    fits = [o for o in missing if len(self._group_types(f, o)) <= 1]
                    return set(fits) | ({"-"} if self._dash_ok(f) else set()), None
                if self.extra_words is not None:  # no object the English never names
                    own = set()
                    # objects of its own start a group of their own (typed for the clauses they serve)
                    mixed = self.typing and any(o in self.required for o in f.group)
                    if not mixed and self._own_objects(f) < self._own_needed():
                        own = {w for w in self.extra_words if _NAME.fullmatch(w) and len(w) <= self.name_len} - banned
                    return own | ({"-"} if self._dash_ok(f) else set()), None
            return None, banned
        if k == ACTION and f.words == 0:
            return None, set(self.actions)
        if k == FORMULA:
            return self._heads(f), None
        if k in (ATOM, EQ):
            return set(self._arg_candidates(f) or ()), None
        return None, None

    def _group_types(self, f: _Frame, extra: str | None = None) -> set[str]:
        """The declared types that the statement's names in the waiting group (and ``extra``) name."""
        if not self.typing:
            return set()
        types = self._declared_types() - {ROOT_TYPE}
        out = set()
        for o in f.group + ([extra] if extra else []):
            if o in self.required:
                out |= {t for t in types if _names_type(o, t)}
        return out

    def _subtypes(self, types: set[str]) -> set[str]:
        """``types`` and every declared type below one of them (``location_0_0`` may be an
        ``airport`` when airports are locations)."""
        if not types:
            return set()
        tq = self._typeq()
        return {t for t in self._declared_types() if any(tq.fits(t, n) for n in types)}

    def _missing_objects(self, f: _Frame) -> list[str]:
        return [o for o in self.required if o not in f.items and o not in self.constants] if self.required else []

    def word_due(self) -> bool:
        """Must the next character continue or start a word? (Otherwise spaces or parentheses
        may come.)"""
        if self.word:
            return True
        k = self.stack[-1].kind
        if self.last == "(":
            return k != PARAMS
        if self.last == " " and k == ACTION:
            return self.stack[-1].words == 0
        return self.last == " " and k in (TYPES, PDECL, PARAMS, OBJECTS, ATOM, EQ, REQ, HEADER)

    def _params_viable(self, f: _Frame, group_type: str | None = None, closing: bool = False,
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

    def _dash_ok(self, f: _Frame) -> bool:
        if not self.typing or not f.group:
            return False
        if f.kind == TYPES:
            return self._forward_room(f) > 0 or bool(self.word_constraint_after_dash(f))
        if f.kind in (PARAMS, OBJECTS):
            return any(self._params_viable(f, t) for t in self._declared_types())
        return bool(self._declared_types())

    def word_constraint_after_dash(self, f: _Frame) -> set[str]:
        bad = self._bad_parents(f)
        return {t for t in (self.type_items | set(f.items) | {ROOT_TYPE}) - bad if len(t) <= self.name_len}

    def _pending_parents(self, f: _Frame) -> set[str]:
        return {p for p in f.items.values() if p != ROOT_TYPE and p not in f.items and p not in self.type_items}

    def _forward_room(self, f: _Frame) -> int:
        """Types frame: how many parents not yet declared may still be named (each must be
        declared later in the same list, within the grammar's bound)."""
        return self.list_limit[TYPES] - len(f.items) - len(self._pending_parents(f))

    def _bad_parents(self, f: _Frame) -> set[str]:
        """Parents the current group may not take: itself, or a type below one of its members."""
        group = set(f.group)
        table = {**self.types, **{i: (p,) for i, p in f.items.items() if i not in group}}
        tq = _Types(table)
        names = self._declared_types() | set(table)
        return group | {t for t in names if group & tq.ancestors(t)}

    def _heads(self, f: _Frame) -> set[str]:
        """Words that may open this formula, exactly as the grammar places them, each with a
        literal left to write after it."""
        ctx = f.ctx
        parent = self.stack[-2]
        under_not = parent.kind == NOT
        conj = self._conj_of(f)
        out = {p for p in self.preds if self._room(conj, under_not, p, [], ctx) and self._fits(p)}
        if self.fact_left is not None and ctx in ("init", "goal"):
            out = {p for p in out if self._fact_path(ctx, p, [], conj, under_not)}
        eq = ctx == "pre" and self.equality and bool(self._terms("pre"))
        if eq:
            out.add("=")
        if ctx != "init":
            if parent.kind in (ACTION, GOAL):
                out.add("and")
            if parent.kind == GOAL and self.fact_left is not None and len(self.fact_left["goal"]) > 1:
                return {"and"}  # the goal states more than one fact: one atom alone cannot hold them
            if not under_not and (ctx == "eff" or self.negation):
                if eq or any(self._room(conj, True, p, [], ctx) and self._fits(p) for p in self.preds):
                    out.add("not")
        return out

    def _fits(self, name: str) -> bool:
        return len(name) <= self.name_len

    def admits(self, text: str) -> bool:
        """Would ``text``, written next, keep the answer in scope?"""
        if not text:
            return True
        t = self.clone()
        try:
            for ch in text:
                t.feed(ch)
        except Reject:
            return False
        return True

    # ------------------------------------------------------------------ reading

    def feed_text(self, text: str) -> None:
        for ch in text:
            self.feed(ch)

    def feed(self, ch: str) -> None:
        if ch in WORD_CHARS:
            w = self.word + ch
            self._check_prefix(w)
            self.word = w
        else:
            if self.word:
                w, self.word = self.word, ""
                self._end_word(w, ch)
                if ch == " ":
                    f = self.stack[-1]
                    if (f.kind in TYPED and not f.after_dash and w != "-" and f.group
                            and len(f.items) >= self.list_limit[f.kind] and not self._dash_ok(f)):
                        raise Reject  # a full list: only `- type` could follow, and none fits
                    if f.kind == OBJECTS and self.extra_words is not None and not f.after_dash:
                        closed, _ = self.word_constraint()
                        if closed is not None and not closed:
                            raise Reject  # no object may follow (none the English never names): close here
            if ch == "(":
                self._open()
            elif ch == ")":
                self._close()
        self.last = ch

    # prefix checks: the word written so far must have an allowed completion
    def _check_prefix(self, w: str) -> None:
        f = self.stack[-1]
        k = f.kind
        if k in (ATOM, EQ):
            if f.words == 0 and k == ATOM:
                return
            cands = self._arg_candidates(f)
            if cands is not None and not any(c.startswith(w) for c in cands):
                raise Reject
            return
        if k in TYPED and not f.after_dash and w == "-":
            if not self._dash_ok(f):
                raise Reject
            return
        if len(w) == 1 and k in (PARAMS, OBJECTS) and not f.after_dash and not self._params_viable(f, adding=1):
            raise Reject  # one more item would leave no room for what the effect or goal needs
        closed, banned = self.word_constraint()
        if closed is not None:
            if not any(c.startswith(w) for c in closed):
                raise Reject
        elif banned and len(w) >= self.name_len + (1 if w.startswith("?") else 0) and w in banned:
            raise Reject

    def _arg_candidates(self, f: _Frame) -> list[str] | None:
        if f.kind == EQ:
            return list(self._terms("pre"))
        if f.pred is None:
            return None
        i = len(f.args)
        cands = self._candidates(f.ctx, f.pred)
        if i >= len(cands):
            return []
        conj = self._conj_of(f)
        out = [c for c in cands[i] if self._room(conj, f.neg, f.pred, f.args + [c], f.ctx)]
        if self.fact_left is not None and f.ctx in ("init", "goal"):
            out = [c for c in out if self._fact_path(f.ctx, f.pred, f.args + [c], conj, f.neg)]
        return out

    # ------------------------------------------------------------------ the statement's facts

    def _fname(self, obj: str) -> str | None:
        """The statement's name an object stands for, or None."""
        n = _norm(obj)
        return n if n in self.fact_names else None

    def _fact_path(self, ctx: str, pred: str, prefix: list[str], conj: _Frame | None = None,
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

    def _free_fits(self, ctx: str, pred: str, prefix: list[str], conj: _Frame | None, neg: bool = False) -> bool:
        """Can ``(pred prefix...)`` end as an atom over none of the statement's names, not yet in
        ``conj``, for a clause of the part that names nothing and takes ``pred``?"""
        if not any(p is None or p == pred for p in self.fact_free[ctx]):
            return False
        cands = self._candidates(ctx, pred)
        if any(self._fname(a) is not None for a in prefix):
            return False
        rest = [[c for c in cands[j] if self._fname(c) is None] for j in range(len(prefix), len(cands))]
        return all(rest) and self._unwritten(conj, neg, pred, prefix, rest)

    def _key_fits(self, ctx: str, pred: str, entry: tuple, prefix: list[str], conj: _Frame | None,
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
        return all(rest) and self._unwritten(conj, neg, pred, prefix, rest)

    @staticmethod
    def _unwritten(conj: _Frame | None, neg: bool, pred: str, prefix: list[str], rest: list[list[str]]) -> bool:
        """Is some literal ``(pred prefix + one of each of rest)`` not yet in ``conj``?"""
        if conj is None or not conj.used:
            return True
        return any((neg, pred, tuple(prefix) + combo) not in conj.used for combo in itertools.product(*rest))

    def _static(self, pred: str) -> bool:
        """Is ``pred`` static: declared, and changed by no action's effect (known once the domain is
        written, or from the given domain)? Static facts are the domain's structure, which a
        statement may leave out (PlanBench's Logistics never states ``(truck t0)`` or ``(obj p0)``):
        the facts rule lets ``:init`` hold them beside the statement's clauses."""
        return self.domain_done and pred in self.preds and pred not in self.fluents

    def _static_extra(self, pred: str, prefix: list[str], conj: _Frame | None) -> bool:
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
            return prefix[0] not in self.static_extra and self._named_static(pred, prefix[0])
        free = [c for c in self._candidates("init", pred)[0]
                if c not in self.static_extra and self._named_static(pred, c)]
        return bool(free) and self._unwritten(conj, False, pred, [], [free])

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

    def _fact_written(self, f: _Frame) -> None:
        """An atom of ``:init`` or the goal closed: the clause it stands for is used (a static
        fact of ``:init`` that stands for no clause is let be)."""
        key = tuple(self._fname(a) for a in f.args)
        left = list(self.fact_left[f.ctx])
        fits = [e for e in left if e[0] == key and e[1] in (None, f.pred)]
        # A static fact beside the clauses, as _fact_path allows it: one that stands for no clause, or
        # the one its name holds ((location location_0_0)), so that a clause over the same name
        # ("location_0_0 is an airport") keeps its own atom. Otherwise it stands for a clause.
        if (f.ctx == "init" and len(f.args) == 1
                and (not fits or f.pred in name_parts(f.args[0]))
                and self._static_extra(f.pred, f.args, self._conj_of(f))):
            self.static_extra = self.static_extra | {f.args[0]}
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

    def _free_short(self, f: _Frame) -> bool:
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

    def _own_objects(self, f: _Frame) -> int:
        """Objects of the problem's own declared so far in ``:objects`` ``f``."""
        return sum(1 for o in f.items if o not in self.required)

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

    def _typing_helps(self, f: _Frame, waiting: list[str]) -> bool:
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

    def _useful_types(self, f: _Frame, fit: set[str]) -> set[str]:
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

    def _facts_open(self, f: _Frame) -> bool:
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

    def _end_word(self, w: str, delim: str) -> None:
        f = self._top()
        k = f.kind
        f.words += 1
        if k == ROOT:
            return
        if k == SECTION:
            self._resolve_section(f, w)
            return
        if k == HEADER:
            return
        if k == REQ:
            if w in self.flags:
                raise Reject
            self._mutable_tables()
            self.flags.add(w)
            return
        if k in TYPED:
            self._typed_word(f, w)
            return
        if k == ACTION:
            if f.words == 1:
                if w in self.actions:
                    raise Reject
                self._mutable_tables()
                self.actions.add(w)
                self.params = {}
            else:
                f.expect = w
            return
        if k == FORMULA:
            self._resolve_formula(f, w, delim)
            return
        if k == ATOM:
            cands = self._arg_candidates(f)
            if cands is None or w not in cands:
                raise Reject
            f.args.append(w)
            n = len(self.preds[f.pred])
            if (len(f.args) < n) != (delim == " "):
                raise Reject
            return
        if k == EQ:
            if w not in self._terms("pre"):
                raise Reject
            f.args.append(w)
            if (len(f.args) < 2) != (delim == " "):
                raise Reject
            return

    def _resolve_section(self, f: _Frame, w: str) -> None:
        closed, _ = self.word_constraint()
        if w not in closed:
            raise Reject
        kinds = {"domain": HEADER, "problem": HEADER, ":domain": HEADER, ":requirements": REQ, ":types": TYPES,
                 ":predicates": PREDS, ":action": ACTION, ":objects": OBJECTS, ":init": INIT, ":goal": GOAL}
        f.kind = kinds[w]
        f.name = w
        f.words = 0
        if f.kind == INIT:
            f.used = set()
        if w == "problem":
            self.domain_done = True
            if not self.given:
                self._bind_predicates()
        if f.kind == ACTION:
            f.words = 0

    def _typed_word(self, f: _Frame, w: str) -> None:
        k = f.kind
        if k == PDECL and f.words == 1:  # the predicate's name
            if w in self.preds:
                raise Reject
            f.pred = w
            return
        if w == "-":
            if not self.typing or not f.group:
                raise Reject
            f.after_dash = True
            return
        if f.after_dash:
            if k == TYPES:
                if w in self._bad_parents(f):
                    raise Reject
            else:
                closed, _ = self.word_constraint()
                if w not in closed:
                    raise Reject
            for item in f.group:
                f.items[item] = w
            f.group = []
            f.after_dash = False
            return
        closed, banned = self.word_constraint()
        if (banned and w in banned) or (closed is not None and w not in closed):
            raise Reject
        if k == OBJECTS and w in self.required and len(self._group_types(f, w)) > 1:
            raise Reject  # ball_1 and room_1 in one group: one type for both
        f.group.append(w)
        f.items[w] = ROOT_TYPE
        if k in (PARAMS, OBJECTS) and not self._params_viable(f):
            raise Reject

    def _resolve_formula(self, f: _Frame, w: str, delim: str) -> None:
        heads = self._heads(f)
        if w not in heads:
            raise Reject
        parent = self.stack[-2]
        if w == "and":
            f.kind = CONJ
            f.used = set()
        elif w == "not":
            f.kind = NOT
        elif w == "=":
            f.kind = EQ
        else:
            n = len(self.preds[w])
            if (n > 0) != (delim == " "):
                raise Reject
            f.kind = ATOM
            f.pred = w
            f.neg = parent.kind == NOT
            f.words = 1

    # ------------------------------------------------------------------ parentheses

    def _open(self) -> None:
        top = self.stack[-1]
        k = top.kind
        if k == ROOT:
            self.stack.append(_Frame(DEFINE))
            return
        if k == DEFINE:
            new = _Frame(SECTION)
        elif k == PREDS:
            new = _Frame(PDECL)
        elif k == ACTION:
            if top.expect == ":parameters":
                new = _Frame(PARAMS)
            else:
                new = _Frame(FORMULA, "pre" if top.expect == ":precondition" else "eff")
        elif k in (CONJ, NOT):
            new = _Frame(FORMULA, top.ctx)
        elif k == INIT:
            new = _Frame(FORMULA, "init")
        elif k == GOAL:
            new = _Frame(FORMULA, "goal")
        else:
            new = _Frame(FORMULA, top.ctx)
        self.stack.append(new)
        owned = self.__dict__.get("_owned")
        if owned is not None:
            owned.add(id(new))
        if new.kind == FORMULA and not self._heads(new):
            raise Reject  # nothing is left to write in this formula

    def _close(self) -> None:
        f = self._top()
        k = f.kind
        if k == PARAMS:
            self._finish_typed(f)
            self._mutable_tables()
            if not self._params_viable(f, closing=True):
                raise Reject
            self.params = dict(f.items)
        elif k == PDECL:
            self._finish_typed(f)
            if f.pred is None:
                raise Reject
            self._mutable_tables()
            self.preds[f.pred] = tuple(f.items.values())
        elif k == TYPES:
            self._finish_typed(f)
            if any(p != ROOT_TYPE and p not in f.items and p not in self.type_items for p in f.items.values()):
                raise Reject  # a parent that is never declared itself (VAL rejects types through it)
            self._mutable_tables()
            for item, parent in f.items.items():
                self.types[item] = (parent,)
                self.type_items.add(item)
        elif k == OBJECTS:
            waiting = list(f.group)
            self._finish_typed(f)
            if self._missing_objects(f) or self._group_types(f) or not self._params_viable(f, closing=True):
                raise Reject
            if self.fact_left is not None and self._free_short(f):
                if len(f.items) < self.list_limit[OBJECTS]:
                    raise Reject  # the statement's clauses without names would have no atom to stand for them
                if self._typing_helps(f, waiting):
                    raise Reject  # at the bound the list may close, but its untyped objects take a type first
            self._mutable_tables()
            self.objects = dict(f.items)
        elif k == ATOM:
            if len(f.args) != len(self.preds[f.pred]):
                raise Reject
            if f.ctx == "eff" and f.pred not in self.fluents:
                self._mutable_tables()
                self.fluents.add(f.pred)
            if self.fact_left is not None and f.ctx in ("init", "goal"):
                self._fact_written(f)
            if self._conj_of(f) is not None:
                self._record((f.neg, f.pred, tuple(f.args)))
        elif k == EQ:
            if len(f.args) != 2:
                raise Reject
        elif k == FORMULA:
            raise Reject  # "()" or a head never written: the grammar does not allow it either
        elif self.fact_left is not None and (k in (INIT, GOAL) or (k == CONJ and self.stack[-2].kind == GOAL)):
            if self._facts_open(f):
                raise Reject  # a clause of the statement has no atom yet
        elif k == DEFINE and not self.domain_done:
            self.domain_done = True
        self.stack.pop()

    def _record(self, key) -> None:
        """Add a literal to the conjunction of the atom on top (copying that frame first if it is
        shared with the tracker this one was cloned from)."""
        idx = next(i for i in range(len(self.stack) - 2, -1, -1) if self.stack[i].kind in (CONJ, INIT))
        conj = self.stack[idx]
        owned = self.__dict__.get("_owned")
        if owned is not None and id(conj) not in owned:
            conj = conj.copy()
            owned.add(id(conj))
            self.stack[idx] = conj
        conj.used.add(key)

    def _finish_typed(self, f: _Frame) -> None:
        if f.after_dash:
            raise Reject
