"""Would the model's decoder let it write this spec? (``omtr model scope-check``, the conformance suite)

:func:`check_spec` judges a spec (a problem, and in the full mode its domain) against the decoding
constraint a model runs: the PDDL grammar under the bounds it would decode with for this task
(:meth:`omtr.model.grammar.PddlGrammar.limits_for`), then the scope rules, then the statement's
rules (:class:`omtr.model.scope.ScopeTracker`) as the task's English is read
(:func:`omtr.statement.read_statement`). The spec is judged up to white space,
comments, letter case and the order of the declarations in ``:objects`` (the statement's names
are put first, each with its own type), by feeding its canonical text character by character; a
model whose vocabulary holds every single character (byte-level BPE) can write any text that
passes character by character.

When the spec is refused, the rule that refused it is the first of this ladder that does:

* ``grammar``: the PDDL grammar, with every bound wide open (the text is not in omtr's PDDL subset);
* ``grammar_limits``: the grammar under the bounds the model decodes this task with;
* ``domain_name``: the problem's ``(:domain NAME)`` is not the domain's name (the decoder forces it);
* ``scope``: the scope rules without the statement (undeclared names, wrong arity, a type that does
  not fit, a name declared twice);
* ``statement_objects``: the statement's names as the first objects;
* ``statement_facts``: each ``:init`` / goal atom over the names stands for one clause;
* ``statement_predicates``: a clause whose words name one of the domain's predicates takes an atom
  of it;
* ``init_invariants`` (domain-given mode): no ``:init`` atom breaks one of the given domain's mutex
  invariants (:mod:`omtr.model.scope.invariants`: ``(holding a)`` beside ``(handempty)``).

``at`` is the character offset, in the spec's own text (``part``: problem or domain), of the first
character the refusing rule does not let through.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from omtr.statement import (RULE_FACTS, RULE_OBJECTS, RULE_PREDICATES, Reading, decoder_objects, names_of,
                            read_statement)

_TOKEN = re.compile(r"\(|\)|[^\s()]+")
_WIDE = dict(name_len=64, ws=12, types=64, predicates=64, predicate_args=8, actions=32, parameters=12,
             literals=64, objects=256, init=1024, goal=256, atom_args=8)


@dataclass(frozen=True)
class CheckResult:
    """The verdict on one spec: ``rule`` and ``at`` are None when it is admitted."""

    admitted: bool
    rule: str | None = None
    at: int | None = None
    part: str | None = None
    rules: str = ""  # the rules that applied (:func:`rules_label`)

    def to_json(self, id_: str) -> dict:
        return {"id": id_, "admitted": self.admitted, "rule": self.rule, "at": self.at, "part": self.part,
                "rules": self.rules}


def rules_label(constraint: str, reading: Reading | None, statement_objects: bool = True,
                statement_facts: bool = True, statement_predicates: bool = True) -> str:
    """The decoding rules one answer ran under, as one word: ``off``, ``plain``, ``scoped``,
    ``scoped+objects``, ``scoped+objects+facts`` or ``scoped+objects+facts+predicates`` (what
    traces, episode logs and metrics count)."""
    if constraint != "scoped":
        return constraint
    parts = ["scoped"]
    rules = reading.rules if reading is not None else ()
    if statement_objects and RULE_OBJECTS in rules:
        parts.append(RULE_OBJECTS)
        if statement_facts and RULE_FACTS in rules:
            parts.append(RULE_FACTS)
            if statement_predicates and RULE_PREDICATES in rules:
                parts.append(RULE_PREDICATES)
    return "+".join(parts)


# ------------------------------------------------------------------ canonical text


def _tokens(text: str) -> list[tuple[str, int]]:
    """(token, offset) of a PDDL text, lower-cased, comments dropped."""
    out = []
    for line_start, line in _lines(text):
        code = line.split(";", 1)[0]
        out.extend((m.group(0).lower(), line_start + m.start()) for m in _TOKEN.finditer(code))
    return out


def _lines(text: str):
    pos = 0
    for line in text.splitlines(keepends=True):
        yield pos, line
        pos += len(line)


def _reorder_objects(toks: list[tuple[str, int]], first: list[str]) -> list[tuple[str, int]]:
    """The ``(:objects ...)`` section with the statement's names first (in ``first``'s order), each
    declaration with its own type."""
    for i in range(len(toks) - 1):
        if toks[i][0] == "(" and toks[i + 1][0] == ":objects":
            break
    else:
        return toks
    j = i + 2
    while j < len(toks) and toks[j][0] not in ("(", ")"):
        j += 1
    body = toks[i + 2:j]
    items: list[list] = []  # [(name, off), (type, off) | None]
    waiting: list = []
    k = 0
    while k < len(body):
        tok = body[k]
        if tok[0] == "-" and k + 1 < len(body):
            for w in waiting:
                w[1] = body[k + 1]
            waiting = []
            k += 2
            continue
        item = [tok, None]
        items.append(item)
        waiting.append(item)
        k += 1
    order = {n: r for r, n in enumerate(first)}
    items.sort(key=lambda it: order.get(it[0][0], len(order)))
    new = []
    for name, typ in items:
        new.append(name)
        if typ is not None:
            new.extend([("-", typ[1]), typ])
    return toks[:i + 2] + new + toks[j:]


def canonical(tokens: list[tuple[str, int]]) -> tuple[str, list[int]]:
    """The text the grammar writes for these tokens (one space between words, none after ``(`` or
    before ``)``), and for each of its characters the offset in the source it comes from."""
    out: list[str] = []
    src: list[int] = []
    prev = None
    for tok, off in tokens:
        if prev is not None and prev != "(" and tok != ")":
            out.append(" ")
            src.append(off)
        out.append(tok)
        src.extend(off + k for k in range(len(tok)))
        prev = tok
    return "".join(out), src


# ------------------------------------------------------------------ the check


class _CharGrammars:
    """The PDDL grammar compiled over a vocabulary of single characters (no model needed), per
    bounds and root."""

    _compiled: dict = {}

    @classmethod
    def matcher(cls, limits, problem_only: bool):
        import xgrammar as xgr

        from omtr.model.grammar import pddl_ebnf

        key = (tuple(sorted(limits.__dict__.items())), problem_only)
        got = cls._compiled.get(key)
        if got is None:
            info = xgr.TokenizerInfo([chr(c) for c in range(32, 127)] + ["\n"])
            got = cls._compiled[key] = xgr.GrammarCompiler(info).compile_grammar(
                pddl_ebnf(limits, problem_only=problem_only))
        return xgr.GrammarMatcher(got, terminate_without_stop_token=True)


def _grammar_stop(text: str, limits, problem_only: bool) -> int | None:
    """The offset of the first character the grammar refuses (len(text) when it is incomplete)."""
    m = _CharGrammars.matcher(limits, problem_only)
    if m.accept_string(text):
        return None if m.is_completed() or m.is_terminated() else len(text)
    lo, hi = 0, len(text)  # the longest prefix the grammar takes
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _CharGrammars.matcher(limits, problem_only).accept_string(text[:mid]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _scope_stop(text: str, given, limits, objects) -> int | None:
    from omtr.model.scope import Reject, ScopeTracker

    t = ScopeTracker(given, limits=limits, objects=objects)
    for i, ch in enumerate(text):
        try:
            t.feed(ch)
        except Reject:
            return i
    return None


def check_spec(nl: str, problem: str, *, domain: str | None = None, given: str | None = None,
               constraint: str = "scoped", statement_objects: bool = True, statement_facts: bool = True,
               statement_predicates: bool = True, init_invariants: bool = True, limits=None) -> CheckResult:
    """Is this spec admitted by the decoding constraint for the task ``nl`` (module doc)?

    ``given``: the task's given domain (the domain-given mode: ``problem`` is the whole answer);
    otherwise ``domain`` is the answer's domain, written before the problem. ``limits``: the
    model's configured :class:`omtr.model.limits.GrammarLimits`. Raises
    :class:`omtr.model.scope.GivenDomainError` for a given domain that does not parse."""
    from omtr.model.grammar import decode_limits
    from omtr.model.limits import GrammarLimits
    from omtr.model.scope import given_declarations

    reading = read_statement(nl)
    label = rules_label(constraint, reading, statement_objects, statement_facts, statement_predicates)
    if constraint == "off":
        return CheckResult(True, rules=label)
    limits = limits or GrammarLimits()
    decl = given_declarations(given) if given else None
    # what the decoder is given: the names (with their facts) under scoped decoding; under the plain
    # grammar they only size its bounds
    objects = decoder_objects(names_of(reading), statement_objects and constraint == "scoped",
                              statement_facts, statement_predicates)
    names = list(reading.names) if objects is not None and objects.require else []
    ptoks = _reorder_objects(_tokens(problem), names)
    parts = [("problem", ptoks)]
    if decl is None:
        parts.insert(0, ("domain", _tokens(domain or "")))
    texts = [canonical(t) for _, t in parts]
    text = " ".join(t for t, _ in texts)
    where: list[tuple[str, int]] = []
    for (part, _), (t, src) in zip(parts, texts):
        if where:
            where.append((part, src[0] if src else 0))
        where.extend((part, s) for s in src)

    def result(rule: str, i: int) -> CheckResult:
        if i >= len(where):
            part = parts[-1][0]
            at = len(problem if part == "problem" else domain or "")
        else:
            part, at = where[i]
        return CheckResult(False, rule, at, part, label)

    wide = GrammarLimits(**_WIDE)
    problem_only = decl is not None
    stop = _grammar_stop(text, wide, problem_only)
    if stop is not None:
        return result("grammar", stop)
    bounds = decode_limits(limits, decl, objects)  # as the decoder widens them for this task
    stop = _grammar_stop(text, bounds, problem_only)
    if stop is not None:
        return result("grammar_limits", stop)
    stop = _domain_name_stop(text, decl)
    if stop is not None:
        return result("domain_name", stop)
    if constraint != "scoped":
        return CheckResult(True, rules=label)
    ladder = [("scope", None)]
    if objects is not None and objects.require:
        ladder.append(("statement_objects", objects.view(facts=False)))
        if getattr(objects, "facts", None) is not None:
            if objects.predicates:
                ladder.append(("statement_facts", objects.view(predicates=False)))
            ladder.append(("statement_predicates" if objects.predicates else "statement_facts", objects))
    steps = [(rule, decl, objs) for rule, objs in ladder]
    if decl is not None and init_invariants:
        with_invs = given_declarations(given, invariants=True)
        if with_invs.invariants:  # all the rules above, and the given domain's mutex invariants
            steps.append(("init_invariants", with_invs, ladder[-1][1]))
    for rule, dec, objs in steps:
        stop = _scope_stop(text, dec, bounds, objs)
        if stop is not None:
            return result(rule, stop)
    return CheckResult(True, rules=label)


_PROBLEM_DOMAIN = re.compile(r"\(:domain ([a-z][a-z0-9_-]*)\)")
_DOMAIN_HEAD = re.compile(r"\(define \(domain ([a-z][a-z0-9_-]*)\)")


def _domain_name_stop(text: str, decl) -> int | None:
    want = decl.name if decl is not None else (m.group(1) if (m := _DOMAIN_HEAD.search(text)) else None)
    m = _PROBLEM_DOMAIN.search(text, text.find("(define (problem"))
    if want is None or m is None or m.group(1) == want:
        return None
    return m.start(1)
