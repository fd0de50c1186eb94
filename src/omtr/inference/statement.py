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
    return list(out.values()) or None
