"""A task statement's own words, read from the English alone (never from a reference).

The task suites state a task in PlanBench's layout: a description of the domain, then a
``[STATEMENT]`` line, then "As initial conditions I have that, ... My goal is to have that ...".
:func:`statement_parts` splits the statement into its *names* (its words that are not words of the
description: colours, ``ball_1``, ``room_2``) and its init and goal clauses;
:func:`statement_objects` gives the names as the statement spells them. The grounding reward
(:mod:`omtr.rl.grounding`) pairs clauses with atoms; scoped decoding
(:class:`omtr.model.scope.ScopeTracker`) makes a problem declare the names as its objects.
"""

from __future__ import annotations

import re

STATEMENT = "[STATEMENT]"
_WORD = re.compile(r"[a-z0-9][a-z0-9_\-]*")
_CLAUSE_SPLIT = re.compile(r",|;|\.(?:\s|$)|\n|\band\b")
_GOAL = re.compile(r"\bgoal\b")
_PART = re.compile(r"[_\-]+|(?<=[a-z])(?=[0-9])")
# The statement's own wording (PlanBench's "As initial conditions I have that, ... My goal is to have
# that ..."), and short function words: never names.
TEMPLATE_WORDS = frozenset(
    "as initial conditions i have that my goal is to the a an of on in at top and are be it its "
    "with by from for".split())


def _norm(word: str) -> str:
    return word.replace("_", "").replace("-", "")


def name_parts(name: str) -> list[str]:
    """A name's parts, split at ``_``/``-`` and before a digit run: ``ball_1`` and ``ball1`` -> ball, 1."""
    return _PART.split(name)


def statement_parts(nl: str) -> tuple[set[str], list[list[str]], list[list[str]]] | None:
    """(names, init clauses, goal clauses) of a task's text: each clause as its list of normalised
    words; None without a ``[STATEMENT]`` line."""
    text = nl.lower()
    cut = text.rfind(STATEMENT.lower())
    if cut < 0:
        return None
    described = {_norm(w) for w in _WORD.findall(text[:cut])}
    stmt = text[cut + len(STATEMENT):]
    m = _GOAL.search(stmt)
    init_text, goal_text = (stmt[:m.start()], stmt[m.end():]) if m else (stmt, "")

    def clauses(part: str) -> list[list[str]]:
        return [[_norm(w) for w in _WORD.findall(c)] for c in _CLAUSE_SPLIT.split(part)]

    words = {_norm(w) for w in _WORD.findall(stmt)}
    names = {w for w in words if w and w not in described and w not in TEMPLATE_WORDS}
    return names, clauses(init_text), clauses(goal_text)


class StatementNames(list):
    """The statement's names (a list, as :func:`statement_objects` spells them) with the
    statement's *facts*: ``facts = (init_keys, goal_keys)``, each key the normalised names of one
    clause in the order the clause gives them (``("blue", "orange")`` for "the blue block is on top
    of the orange block"; clauses without names are left out), or None. Scoped decoding
    (``statement_facts``) makes each ``:init`` and goal atom over the statement's names stand for
    one such clause of its part."""

    facts: tuple | None = None
    nameless: tuple = (0, 0)  # per part, the clauses that name nothing ("the hand is empty")


def clause_keys(names: set[str], clauses: list[list[str]]) -> list[tuple[str, ...]]:
    """Each clause's names in order (normalised); clauses without names are left out."""
    out = []
    for c in clauses:
        k = tuple(w for w in c if w in names)
        if k:
            out.append(k)
    return out


def statement_objects(nl: str) -> list[str] | None:
    """The statement's names (:func:`statement_parts`) as it spells them, lower-cased, in order of
    first use, one spelling per name (``ball_1``, ``room_2``, ``red``): what scoped decoding makes a
    problem declare as its objects (:class:`omtr.model.scope.ScopeTracker`). None without a
    ``[STATEMENT]`` line or without names."""
    parts = statement_parts(nl)
    if parts is None or not parts[0]:
        return None
    names = parts[0]
    text = nl.lower()
    stmt = text[text.rfind(STATEMENT.lower()) + len(STATEMENT):]
    out: dict[str, str] = {}
    for w in _WORD.findall(stmt):
        w = w.strip("-_")
        n = _norm(w)
        if n in names and n not in out and re.fullmatch(r"[a-z][a-z0-9_-]*", w):
            out[n] = w
    if not out:
        return None
    got = StatementNames(out.values())
    got.facts = (tuple(clause_keys(names, parts[1])), tuple(clause_keys(names, parts[2])))
    got.nameless = (nameless_clauses(names, parts[1]), nameless_clauses(names, parts[2]))
    return got


def nameless_clauses(names: set[str], clauses: list[list[str]]) -> int:
    """How many clauses say something (a word beyond the statement's template) without a name:
    "the hand is empty", "the left gripper is free" (when "left" is a word of the description)."""
    return sum(1 for c in clauses if not any(w in names for w in c)
               and any(w and w not in TEMPLATE_WORDS for w in c))
