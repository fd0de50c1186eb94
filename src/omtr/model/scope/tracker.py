"""The scope tracker: reads the answer one character at a time into frames, and asks the rules what may come next.

:class:`ScopeTracker` keeps the answer's frames (:mod:`.frames`: one per open parenthesis) and its
tables of what was declared, and combines the rules, each in a file named after it:
:mod:`.declarations` (a spec names only what it declared), :mod:`.names` (the statement's names in
``:objects``), :mod:`.facts` (the statement's facts in ``:init`` and the goal, and their
predicates), :mod:`.statics` (static facts beside them). Copy-on-write cloning keeps
:meth:`ScopeTracker.admits` cheap: tables are copied at a declaration, frames when touched.
"""

from __future__ import annotations

from omtr.model.limits import GrammarLimits

from .declarations import ROOT_TYPE, Declared, DeclarationsRule
from .facts import FactsRule
from .invariants import InvariantsRule
from .frames import (ACTION, ATOM, CONJ, DEFINE, EQ, FORMULA, GOAL, HEADER, INIT, NOT, OBJECTS, PARAMS, PDECL,
                     PREDS, REQ, ROOT, SECTION, SECTION_HEADS, TYPED, TYPES, WORD_CHARS, Frame, Reject)
from .names import NamesRule
from .statics import StaticsRule


class ScopeTracker(DeclarationsRule, NamesRule, FactsRule, StaticsRule, InvariantsRule):
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
        self.part_limit = {"init": L.init, "goal": L.goal}
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
        self.stack: list[Frame] = [Frame(ROOT)]
        self.word = ""
        self.last = ""
        self.domain_done = self.given
        self._tq = None  # the type table's queries (declarations._typeq)
        self._cands: dict = {}  # (context, predicate) -> argument candidates (declarations._candidates)
        self._init_names(objects, L.objects)
        self._init_facts(objects)
        self._init_statics()
        self._init_invariants(given)  # the given domain's mutex invariants, where it carries them
        if self.given:
            self._bind_predicates()

    # ------------------------------------------------------------------ copying

    def clone(self) -> "ScopeTracker":
        t = ScopeTracker.__new__(ScopeTracker)
        t.__dict__.update(self.__dict__)
        # Tables change only at declarations; frames on the stack are copied when touched.
        t.stack = list(self.stack)
        t._owned = set()
        return t

    def _top(self) -> Frame:
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
                    if self._forward_room(f) > 0:
                        return None, self._bad_parents(f)
                    return self._parent_words(f), None
                if k in (PARAMS, OBJECTS):
                    fit = {t for t in self._declared_types() if self._params_viable(f, t)}
                    if k == OBJECTS and self.required:
                        return self._object_types(f, fit), None
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
                closed = self._object_words(f, banned)
                if closed is not None:
                    return closed, None
            return None, banned
        if k == ACTION and f.words == 0:
            return None, set(self.actions)
        if k == FORMULA:
            return self._heads(f), None
        if k in (ATOM, EQ):
            return set(self._arg_candidates(f) or ()), None
        return None, None

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

    def _heads(self, f: Frame) -> set[str]:
        """Words that may open this formula, exactly as the grammar places them, each with a
        literal left to write after it."""
        ctx = f.ctx
        parent = self.stack[-2]
        under_not = parent.kind == NOT
        conj = self._conj_of(f)
        out = {p for p in self.preds if self._room(conj, under_not, p, [], ctx) and self._fits(p)}
        if self.fact_left is not None and ctx in self.fact_parts:
            out = {p for p in out if self._fact_path(ctx, p, [], conj, under_not)}
        elif ctx == "init" and self.open_init:
            out = {p for p in out if self._open_init_path(p, [], conj)}
        elif ctx == "init" and self.mutex:
            out = {p for p in out if self._mutex_path(p, [], conj)}
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

    def _arg_candidates(self, f: Frame) -> list[str] | None:
        """The words an atom's next argument may be (None: no predicate yet), each with a literal
        left to write that the statement's facts allow."""
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
        if self.fact_left is not None and f.ctx in self.fact_parts:
            out = [c for c in out if self._fact_path(f.ctx, f.pred, f.args + [c], conj, f.neg)]
        elif f.ctx == "init" and self.open_init:
            out = [c for c in out if self._open_init_path(f.pred, f.args + [c], conj)]
        elif f.ctx == "init" and self.mutex:
            out = [c for c in out if self._mutex_path(f.pred, f.args + [c], conj)]
        return out

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

    def _resolve_section(self, f: Frame, w: str) -> None:
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

    def _typed_word(self, f: Frame, w: str) -> None:
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
        if k == OBJECTS and w in self.required and not self._claims_fit(f, w):
            raise Reject  # an airport and a plain location in one group: the English gives them two types
        f.group.append(w)
        f.items[w] = ROOT_TYPE
        if k in (PARAMS, OBJECTS) and not self._params_viable(f):
            raise Reject

    def _resolve_formula(self, f: Frame, w: str, delim: str) -> None:
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
            self.stack.append(Frame(DEFINE))
            return
        if k == DEFINE:
            new = Frame(SECTION)
        elif k == PREDS:
            new = Frame(PDECL)
        elif k == ACTION:
            if top.expect == ":parameters":
                new = Frame(PARAMS)
            else:
                new = Frame(FORMULA, "pre" if top.expect == ":precondition" else "eff")
        elif k in (CONJ, NOT):
            new = Frame(FORMULA, top.ctx)
        elif k == INIT:
            new = Frame(FORMULA, "init")
        elif k == GOAL:
            new = Frame(FORMULA, "goal")
        else:
            new = Frame(FORMULA, top.ctx)
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
            if self._claims_untyped(f.items):
                raise Reject  # a name without the type its clause gives it ("location_0_0 is an airport")
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
            if self.fact_left is not None and f.ctx in self.fact_parts:
                self._fact_written(f)
            elif f.ctx == "init" and self.open_init:
                self._open_init_written(f)  # plain English: open, but no goal clause's atom
            if f.ctx == "init" and self.mutex:
                if self._clashes((f.pred,) + tuple(f.args)):
                    raise Reject  # (the paths above refuse it first; kept as the rule's last word)
                self._mutex_written(f.pred, f.args)
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

    def _finish_typed(self, f: Frame) -> None:
        if f.after_dash:
            raise Reject
