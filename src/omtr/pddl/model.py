"""Structural model of a PDDL domain and problem, built from the s-expression reader.

The model keeps formulas as s-expressions (``SList``) and records names, arities and types, with
lines, so that lint and the faithfulness checker can reason about them without a planner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from omtr.pddl.categories import Category
from omtr.pddl.sexpr import NestingLimit, SExprError, SList, Sym, read_sexpr, to_text

ROOT_TYPE = "object"


class SpecError(ValueError):
    """A spec that cannot be accepted: category, message (names the element), line."""

    def __init__(self, category: Category, message: str, line: int | None = None, file: str | None = None):
        super().__init__(message)
        self.category = category
        self.message = message
        self.line = line
        self.file = file


class SpecLimitError(SpecError):
    """A spec over one of omtr's own size limits (bytes per file, nesting depth).

    Not a verdict on the PDDL: the planner might accept it. The limits protect training from
    runaway model output; the message names the setting that raises them."""

    def __init__(self, message: str, line: int | None = None, file: str | None = None):
        super().__init__(Category.UNREACHABLE_SEARCH, message, line, file)


@dataclass
class Action:
    name: str
    parameters: list[tuple[str, str]]  # (?var, type)
    precondition: SList | None
    effect: SList | None
    line: int = 0


@dataclass
class Derived:
    """A derived predicate's rule ``(:derived (name ?x - t ...) BODY)``: the head holds wherever
    the body does (Fast Downward compiles these into axioms)."""

    name: str
    parameters: list[tuple[str, str]]
    body: SList
    line: int = 0


@dataclass
class Domain:
    name: str
    requirements: list[str] = field(default_factory=list)
    # type -> its parents in declaration order. A type may be declared under several parents
    # (``area - object`` ... ``area crate - surface``); like Fast Downward and VAL, omtr then makes
    # it a subtype of every one of them.
    types: dict[str, tuple[str, ...]] = field(default_factory=dict)
    constants: dict[str, str] = field(default_factory=dict)  # name -> type
    predicates: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    functions: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    actions: dict[str, Action] = field(default_factory=dict)
    derived: list[Derived] = field(default_factory=list)
    lines: dict[str, int] = field(default_factory=dict)  # "predicate:on" -> line
    typed: bool = False
    notes: list[str] = field(default_factory=list)  # legal but unusual things the reader saw

    def ancestors(self, t: str) -> list[str]:
        """``t`` and every type above it (breadth first, each once), ending with ``object``."""
        out, queue = [t], [t]
        while queue:
            for parent in self.types.get(queue.pop(0), ()):
                if parent not in out:
                    out.append(parent)
                    queue.append(parent)
        if ROOT_TYPE in out:
            out.remove(ROOT_TYPE)
        out.append(ROOT_TYPE)
        return out

    def is_subtype(self, t: str, ancestor: str) -> bool:
        """True if ``t`` equals or descends from ``ancestor`` (``either`` types: any member)."""
        if ancestor == ROOT_TYPE or t == ancestor:
            return True
        if t.startswith("either:"):
            return all(self.is_subtype(m, ancestor) for m in t.split(":")[1:])
        if ancestor.startswith("either:"):
            return any(self.is_subtype(t, m) for m in ancestor.split(":")[1:])
        return ancestor in self.ancestors(t)

    @property
    def derived_predicates(self) -> set[str]:
        """Names of predicates defined by :derived rules."""
        return {d.name for d in self.derived}


@dataclass
class Problem:
    name: str
    domain_name: str
    objects: dict[str, str] = field(default_factory=dict)  # name -> type
    init: list[SList] = field(default_factory=list)  # ground atoms (and numeric (= (f) n))
    goal: SList | None = None
    metric: SList | None = None
    requirements: list[str] = field(default_factory=list)
    lines: dict[str, int] = field(default_factory=dict)


def _line(x) -> int | None:
    return getattr(x, "line", None)


def parse_typed_list(items, what: str, *, allow_vars: bool) -> list[tuple[str, str]]:
    """``a b - t c`` -> [(a, t), (b, t), (c, object)]; ``- (either t u)`` -> 'either:t:u'."""
    out: list[tuple[str, str]] = []
    pending: list[Sym] = []
    i = 0
    while i < len(items):
        tok = items[i]
        if isinstance(tok, list):
            raise SpecError(
                Category.SYNTAX,
                f"{what}: unexpected '(' at line {_line(tok)} in a typed list; write `name - type`",
                _line(tok),
            )
        if tok == "-":
            if i + 1 >= len(items) or not pending:
                raise SpecError(
                    Category.SYNTAX,
                    f"{what}: dangling '-' at line {_line(tok)}; write `name - type`",
                    _line(tok),
                )
            t = items[i + 1]
            if isinstance(t, list):
                if t.head != "either" or len(t) < 2 or any(isinstance(m, list) for m in t[1:]):
                    raise SpecError(
                        Category.SYNTAX, f"{what}: bad type expression at line {_line(t)}", _line(t)
                    )
                tname = "either:" + ":".join(t[1:])
            else:
                tname = str(t)
            out.extend((str(p), tname) for p in pending)
            pending = []
            i += 2
            continue
        is_var = tok.startswith("?")
        if is_var and not allow_vars:
            raise SpecError(
                Category.SYNTAX,
                f"{what}: variable {tok} at line {tok.line} where an object name is expected",
                tok.line,
            )
        if allow_vars and not is_var:
            raise SpecError(
                Category.PREDICATE_SCHEMA,
                f"{what}: parameter `{tok}` at line {tok.line} must start with '?', e.g. ?{tok}",
                tok.line,
            )
        pending.append(tok)
        i += 1
    out.extend((str(p), ROOT_TYPE) for p in pending)
    return out


def _sections(root: SList, kind: str, what: str):
    if not isinstance(root, list) or root.head != "define" or len(root) < 2:
        raise SpecError(
            Category.SYNTAX, f"{what}: must start with (define ({kind} NAME) ...)", _line(root)
        )
    header = root[1]
    if not isinstance(header, list) or header.head != kind or len(header) != 2 or isinstance(header[1], list):
        found = to_text(header)[:60]
        raise SpecError(
            Category.SYNTAX,
            f"{what}: expected ({kind} NAME) after define, found {found} at line {_line(header) or root.line}",
            _line(header) or root.line,
        )
    for sec in root[2:]:
        if not isinstance(sec, list) or not sec or not isinstance(sec[0], str) or not sec[0].startswith(":"):
            raise SpecError(
                Category.SYNTAX,
                f"{what}: expected a section like (:{'predicates' if kind == 'domain' else 'init'} ...) "
                f"at line {_line(sec) or getattr(sec, 'line', '?')}, found {str(sec)[:40]!r}",
                _line(sec),
            )
    return str(header[1]), root[2:]


def _read_root(text: str, what: str, max_depth: int):
    """The s-expression of a domain or problem (``what``); reader errors as the spec's own errors."""
    try:
        return read_sexpr(text, max_depth=max_depth, what=what)
    except NestingLimit as exc:
        raise SpecLimitError(str(exc), exc.line, what) from None
    except SExprError as exc:
        raise SpecError(Category.SYNTAX, str(exc), exc.line, what) from None


def parse_domain(text: str, *, max_depth: int = 64) -> Domain:
    root = _read_root(text, "domain", max_depth)
    name, sections = _sections(root, "domain", "domain")
    dom = Domain(name=name)
    seen_sections: set[str] = set()
    for sec in sections:
        key = sec[0]
        if key != ":action" and key != ":derived":
            if key in seen_sections:
                raise SpecError(
                    Category.SYNTAX, f"domain: section {key} appears twice (line {sec.line}); merge them", sec.line
                )
            seen_sections.add(key)
        if key == ":requirements":
            for r in sec[1:]:
                if isinstance(r, list) or not r.startswith(":"):
                    raise SpecError(
                        Category.SYNTAX,
                        f"domain :requirements (line {sec.line}) may hold only flags like :strips or :typing, "
                        f"found {to_text(r)[:40]}",
                        sec.line,
                    )
            dom.requirements = [str(r) for r in sec[1:]]
            dom.typed = ":typing" in dom.requirements or ":adl" in dom.requirements
        elif key == ":types":
            for t, parent in parse_typed_list(sec[1:], "domain :types", allow_vars=False):
                if t == ROOT_TYPE:
                    continue
                parents = dom.types.get(t, ())
                if parents and parent not in parents:
                    dom.notes.append(
                        f"type `{t}` is declared under several parents ({', '.join(parents + (parent,))}); "
                        "it is a subtype of each of them"
                    )
                if parent not in parents:
                    dom.types[t] = parents + (parent,)
                dom.lines.setdefault(f"type:{t}", sec.line)
            # A parent named only after a dash is a type too, under object, as the planner reads
            # (:types block - thing): declared by that use, with a note (VAL is stricter).
            for parent in dict.fromkeys(p for ps in list(dom.types.values()) for p in ps):
                if parent != ROOT_TYPE and not parent.startswith("either:") and parent not in dom.types:
                    dom.types[parent] = (ROOT_TYPE,)
                    dom.lines.setdefault(f"type:{parent}", sec.line)
                    dom.notes.append(
                        f"type `{parent}` is a parent in :types but is not declared itself; the planner "
                        f"reads it as a subtype of object, VAL fails any type check that passes through it: "
                        f"declare it (`{parent} - object`)"
                    )
        elif key == ":constants":
            for c, t in parse_typed_list(sec[1:], "domain :constants", allow_vars=False):
                dom.constants[c] = t
                dom.lines[f"constant:{c}"] = sec.line
        elif key in (":predicates", ":functions"):
            target = dom.predicates if key == ":predicates" else dom.functions
            items = sec[1:]
            j = 0
            while j < len(items):
                p = items[j]
                if key == ":functions" and p == "-":  # `(f) - number`
                    j += 2
                    continue
                if not isinstance(p, list) or not p or isinstance(p[0], list):
                    raise SpecError(
                        Category.PREDICATE_SCHEMA if key == ":predicates" else Category.SYNTAX,
                        f"domain {key}: expected (name ?arg - type ...) at line {_line(p) or sec.line}, "
                        f"found {str(p)[:40]!r}",
                        _line(p) or sec.line,
                    )
                pname = str(p[0])
                if pname in target:
                    raise SpecError(
                        Category.PREDICATE_SCHEMA,
                        f"{'predicate' if key == ':predicates' else 'function'} `{pname}` is declared twice "
                        f"(lines {dom.lines.get(('predicate:' if key == ':predicates' else 'function:') + pname)} and {p.line})",
                        p.line,
                    )
                target[pname] = parse_typed_list(p[1:], f"{key[1:-1]} `{pname}`", allow_vars=True)
                dom.lines[("predicate:" if key == ":predicates" else "function:") + pname] = p.line
                j += 1
        elif key == ":action":
            act = _parse_action(sec)
            if act.name in dom.actions:  # the planner and VAL keep both; so do plans that use either
                dom.notes.append(
                    f"action `{act.name}` is defined twice (lines {dom.actions[act.name].line} and {act.line}); "
                    "the planner keeps both, omtr's checks read the first: rename one of them"
                )
                continue
            dom.actions[act.name] = act
        elif key == ":derived":
            dom.derived.append(_parse_derived(sec))
        elif key in (":constraints",):
            raise SpecError(
                Category.SYNTAX, f"domain: {key} (line {sec.line}) is not supported by the planner; remove it", sec.line
            )
        else:
            raise SpecError(
                Category.SYNTAX,
                f"domain: unknown section {key} at line {sec.line}; expected :requirements, :types, "
                ":constants, :predicates, :functions or :action",
                sec.line,
            )
    if dom.types:
        dom.typed = True
    return dom


def _parse_action(sec: SList) -> Action:
    if len(sec) < 2 or isinstance(sec[1], list):
        raise SpecError(
            Category.PREDICATE_SCHEMA, f"action at line {sec.line} has no name; write (:action NAME ...)", sec.line
        )
    name = str(sec[1])
    params: list[tuple[str, str]] = []
    pre = eff = None
    seen = set()
    i = 2
    while i < len(sec):
        key = sec[i]
        if isinstance(key, list) or not key.startswith(":"):
            raise SpecError(
                Category.PREDICATE_SCHEMA,
                f"action `{name}` (line {sec.line}) is malformed: expected :parameters, :precondition or :effect, "
                f"found {str(key)[:40]!r} at line {_line(key) or sec.line}",
                _line(key) or sec.line,
            )
        if i + 1 >= len(sec):
            raise SpecError(
                Category.PREDICATE_SCHEMA, f"action `{name}`: {key} at line {key.line} has no value", key.line
            )
        val = sec[i + 1]
        if key in seen:
            raise SpecError(Category.PREDICATE_SCHEMA, f"action `{name}`: {key} given twice", key.line)
        seen.add(key)
        if key == ":parameters":
            if not isinstance(val, list):
                raise SpecError(
                    Category.PREDICATE_SCHEMA,
                    f"action `{name}`: :parameters must be a list like (?x - block), found {val!r}",
                    key.line,
                )
            params = parse_typed_list(val, f"action `{name}` :parameters", allow_vars=True)
            names = [p for p, _ in params]
            dup = {p for p in names if names.count(p) > 1}
            if dup:
                raise SpecError(
                    Category.PREDICATE_SCHEMA,
                    f"action `{name}`: parameter {sorted(dup)[0]} is declared twice",
                    key.line,
                )
        elif key == ":precondition":
            pre = _formula(val, f"action `{name}` :precondition", key.line)
        elif key == ":effect":
            eff = _formula(val, f"action `{name}` :effect", key.line)
        else:
            raise SpecError(
                Category.PREDICATE_SCHEMA,
                f"action `{name}`: unknown key {key} at line {key.line}; use :parameters, :precondition, :effect",
                key.line,
            )
        i += 2
    if eff is None:
        raise SpecError(
            Category.PREDICATE_SCHEMA,
            f"action `{name}` (line {sec.line}) has no :effect; every action must change something",
            sec.line,
        )
    return Action(name=name, parameters=params, precondition=pre, effect=eff, line=sec.line)


def _parse_derived(sec: SList) -> Derived:
    if len(sec) != 3 or not isinstance(sec[1], list) or not sec[1] or isinstance(sec[1][0], list):
        raise SpecError(
            Category.PREDICATE_SCHEMA,
            f"derived predicate at line {sec.line} is malformed; write (:derived (name ?x - type) FORMULA)",
            sec.line,
        )
    head = sec[1]
    name = str(head[0])
    params = parse_typed_list(head[1:], f"derived predicate `{name}`", allow_vars=True)
    return Derived(name=name, parameters=params, body=_formula(sec[2], f"derived predicate `{name}`", sec.line),
                   line=sec.line)


def _formula(val, what: str, line: int) -> SList:
    if not isinstance(val, list):
        raise SpecError(
            Category.SYNTAX, f"{what} at line {line} must be a parenthesised formula, found {val!r}", line
        )
    return val


def parse_problem(text: str, *, max_depth: int = 64) -> Problem:
    root = _read_root(text, "problem", max_depth)
    name, sections = _sections(root, "problem", "problem")
    prob = Problem(name=name, domain_name="")
    seen: set[str] = set()
    for sec in sections:
        key = sec[0]
        if key in seen:
            raise SpecError(
                Category.SYNTAX, f"problem: section {key} appears twice (line {sec.line}); merge them", sec.line
            )
        seen.add(key)
        if key == ":domain":
            if len(sec) != 2 or isinstance(sec[1], list):
                raise SpecError(Category.SYNTAX, f"problem: (:domain NAME) expected at line {sec.line}", sec.line)
            prob.domain_name = str(sec[1])
        elif key == ":objects":
            for o, t in parse_typed_list(sec[1:], "problem :objects", allow_vars=False):
                if o in prob.objects:
                    raise SpecError(
                        Category.OBJECT_TYPE, f"object `{o}` is declared twice in :objects (line {sec.line})", sec.line
                    )
                prob.objects[o] = t
            prob.lines[":objects"] = sec.line
        elif key == ":init":
            for a in sec[1:]:
                if not isinstance(a, list) or not a:
                    raise SpecError(
                        Category.SYNTAX,
                        f"problem :init: expected atoms like (on a b), found {str(a)[:40]!r} at line {_line(a) or sec.line}",
                        _line(a) or sec.line,
                    )
                prob.init.append(a)
            prob.lines[":init"] = sec.line
        elif key == ":goal":
            if len(sec) != 2 or not isinstance(sec[1], list):
                raise SpecError(
                    Category.SYNTAX, f"problem: (:goal FORMULA) expects one formula at line {sec.line}", sec.line
                )
            prob.goal = sec[1]
            prob.lines[":goal"] = sec.line
        elif key == ":metric":
            prob.metric = sec
        elif key == ":requirements":
            prob.requirements = [str(r) for r in sec[1:] if not isinstance(r, list)]
        else:
            raise SpecError(
                Category.SYNTAX,
                f"problem: unknown section {key} at line {sec.line}; expected :domain, :objects, :init, :goal",
                sec.line,
            )
    if not prob.domain_name:
        raise SpecError(Category.SYNTAX, "problem: missing (:domain NAME)", root.line)
    if prob.goal is None:
        raise SpecError(Category.GOAL_CONSTRAINT, "problem: missing (:goal ...); state what must be true at the end", root.line)
    return prob


LOGICAL = {"and", "or", "not", "imply", "exists", "forall", "when"}
COMPARATORS = {"<", ">", "<=", ">="}


def conjunction_literals(f) -> list[tuple[tuple, bool]] | None:
    """The literals of a (nested) conjunction as [(atom, negated)]; None if it holds anything else
    (disjunction, quantifier, implication, conditional effect, numeric comparison)."""
    if not isinstance(f, list) or not f:
        return []
    if f.head == "and":
        out = []
        for g in f[1:]:
            sub = conjunction_literals(g)
            if sub is None:
                return None
            out.extend(sub)
        return out
    if f.head == "not" and len(f) == 2 and isinstance(f[1], list) and f[1].head not in LOGICAL:
        return [(tuple(f[1]), True)]
    if f.head in LOGICAL or f.head in COMPARATORS:
        return None
    return [(tuple(f), False)]


def atoms_of(formula, negated: bool = False, *, effect: bool = False) -> Iterator[tuple[SList, bool, frozenset]]:
    """Yield (atom, negated, quantified-variables) for every atom in a formula.

    Atoms include equality ``(= ?x ?y)``. Numeric effects (increase/decrease/assign) are skipped.
    With ``effect=True`` the formula is read as an effect: the conditions of ``(when C E)`` are
    not effects and are left out (only E's atoms are yielded).
    """
    yield from _walk(formula, negated, frozenset(), effect)


def _walk(f, neg: bool, bound: frozenset, effect: bool = False):
    if not isinstance(f, list) or not f:
        return
    h = f.head
    if h == "and" or h == "or":
        for g in f[1:]:
            yield from _walk(g, neg, bound, effect)
    elif h == "not":
        for g in f[1:]:
            yield from _walk(g, not neg, bound, effect)
    elif h == "imply":
        if len(f) == 3:
            yield from _walk(f[1], not neg, bound, effect)
            yield from _walk(f[2], neg, bound, effect)
    elif h in ("exists", "forall"):
        if len(f) >= 3 and isinstance(f[1], list):
            try:
                vs = frozenset(v for v, _ in parse_typed_list(f[1], h, allow_vars=True))
            except SpecError:
                vs = frozenset()
            for g in f[2:]:
                yield from _walk(g, neg, bound | vs, effect)
    elif h == "when":
        for g in (f[2:] if effect else f[1:]):
            yield from _walk(g, neg, bound, effect)
    elif h in ("increase", "decrease", "assign", "scale-up", "scale-down"):
        return
    elif h is None:
        return
    else:
        yield f, neg, bound
