"""Judge negatives made from the Actor's own solved specs, without a reference.

The Judge is asked whether a spec states the task. Its training labels come from the planner and
the annotation-free signals (``judge_target``), and where the decoder's rules hold the Actor to the
statement almost every solved spec is also supported: the Judge then sees few negatives, and none
of the kind that matter (a spec the planner accepts that says something else). This module makes
them from a spec that scored in full: the same problem with one change that makes it say something
the English does not, the three kinds of unfaithfulness measured on the untrained model's answers
(docs/results/faithfulness-signals-families-2026-12-05.md):

* ``predicate``: one atom written with another predicate of the same arity of the domain ("planet
  object b" as ``(province b)``);
* ``object``: an object the English never names, two of the problem's names joined
  (``hoist0-hoist2``), declared with the first one's type and given a copy of one of its facts;
* ``drop``: one atom of the initial state or the goal left out (the goal keeps at least one).

A mutant is kept only when it still reads as a problem and differs from the spec. Nothing here
reads a reference: only the spec, its domain, and a seeded ``random.Random``. The planner is not
asked: a mutant may still be solvable (most are), and that is the point: the Judge learns what the
planner cannot see.
"""

from __future__ import annotations

import random
import re
from typing import Sequence

KINDS = ("predicate", "object", "drop")


def _atom(x) -> tuple[str, ...] | None:
    if isinstance(x, list) and x and all(isinstance(a, str) for a in x):
        return tuple(str(a).lower() for a in x)
    return None


def _atom_re(atom: Sequence[str]) -> re.Pattern:
    return re.compile(r"\(\s*" + r"\s+".join(re.escape(a) for a in atom) + r"\s*\)", re.IGNORECASE)


def _span(text: str, key: str) -> tuple[int, int] | None:
    """Where a section (``:init``, ``:goal``, ``:objects``) runs in the text: from its key to its
    closing parenthesis."""
    m = re.search(r"\(\s*" + re.escape(key) + r"\b", text, re.IGNORECASE)
    if not m:
        return None
    depth = 0
    for j in range(m.start(), len(text)):
        if text[j] == "(":
            depth += 1
        elif text[j] == ")":
            depth -= 1
            if depth == 0:
                return m.start(), j + 1
    return None


def _find(text: str, part: str, atom: Sequence[str]) -> re.Match | None:
    span = _span(text, ":init" if part == "init" else ":goal")
    if span is None:
        return None
    m = _atom_re(atom).search(text, span[0], span[1])
    return m


def mutants(domain: str, problem: str, rng: random.Random, k: int = 1,
            kinds: Sequence[str] = KINDS) -> list[tuple[str, str]]:
    """Up to ``k`` mutants of ``problem`` as ``(kind, problem text)``, each of a kind drawn in turn
    from ``kinds`` (shuffled); fewer when a kind does not apply (a domain with one predicate of an
    arity, a problem of one object). Each is the spec's own text with one edit, so its layout is
    the Actor's (the Judge cannot tell a mutant by its spacing). A problem or domain that does not
    read gives none."""
    from omtr.pddl.model import SpecError, conjunction_literals, parse_domain, parse_problem

    try:
        dom = parse_domain(domain)
        prob = parse_problem(problem)
    except (SpecError, RecursionError, ValueError):
        return []
    lits = conjunction_literals(prob.goal)
    if not lits or any(neg for _, neg in lits):
        return []  # only conjunctions of atoms are mutated
    facts = {"init": [a for a in (_atom(x) for x in prob.init) if a],
             "goal": [tuple(str(x).lower() for x in a) for a, _ in lits]}
    objects = {o.lower(): str(t).lower() for o, t in prob.objects.items()}
    arity: dict[int, list[str]] = {}
    for p, args in dom.predicates.items():
        arity.setdefault(len(args), []).append(p.lower())
    order = list(kinds)
    for kind in order:
        if kind not in KINDS:
            raise ValueError(f"unknown mutant kind {kind!r}: one of {', '.join(KINDS)}")
    rng.shuffle(order)
    out: list[tuple[str, str]] = []
    seen = {problem}
    for i in range(3 * k):
        if len(out) >= k:
            break
        kind = order[i % len(order)]
        text = _mutate(kind, problem, objects, facts, arity, rng)
        if text is None or text in seen:
            continue
        try:
            parse_problem(text)
        except (SpecError, RecursionError, ValueError):
            continue
        seen.add(text)
        out.append((kind, text))
    return out


def _mutate(kind, text, objects, facts, arity, rng) -> str | None:
    if kind == "predicate":
        spots = [(part, a) for part in ("init", "goal") for a in facts[part] if len(arity.get(len(a) - 1, [])) > 1]
        if not spots:
            return None
        part, a = rng.choice(spots)
        m = _find(text, part, a)
        if m is None:
            return None
        other = rng.choice([p for p in arity[len(a) - 1] if p != a[0]])
        return text[:m.start()] + "(" + " ".join((other, *a[1:])) + ")" + text[m.end():]
    if kind == "object":
        names = sorted(objects)
        span = _span(text, ":objects")
        if len(names) < 2 or span is None:
            return None
        first, second = rng.sample(names, 2)
        new = f"{first}-{second}"
        if new in objects:
            return None
        m = re.compile(r"(?<![\w-])" + re.escape(first) + r"(?![\w-])", re.IGNORECASE).search(text, *span)
        if m is None:
            return None
        text = text[:m.end()] + " " + new + text[m.end():]  # beside its source: the same type
        own = [a for a in facts["init"] if first in a[1:]]
        if own:
            a = rng.choice(own)
            f = _find(text, "init", a)
            if f is not None:
                copy = "(" + " ".join(new if x == first else x for x in a) + ")"
                text = text[:f.end()] + " " + copy + text[f.end():]
        return text
    if kind == "drop":
        spots = [("init", a) for a in facts["init"]] + ([("goal", a) for a in facts["goal"]]
                                                       if len(facts["goal"]) > 1 else [])
        if not spots:
            return None
        part, a = rng.choice(spots)
        m = _find(text, part, a)
        if m is None:
            return None
        head, tail = text[:m.start()], text[m.end():]
        line_start = head.rfind("\n") + 1
        line_end = tail.find("\n")
        if not head[line_start:].strip() and (line_end == -1 or not tail[:line_end].strip()) and line_end != -1:
            return head[:line_start] + tail[line_end + 1:]  # the atom had its own line: the line goes too
        return (head.rstrip(" ") + (" " if tail[:1] not in (")", "\n", "") else "") + tail.lstrip(" ")
                if head[-1:] == " " else head + tail)
    raise ValueError(f"unknown mutant kind {kind!r}: one of {', '.join(KINDS)}")


__all__ = ["KINDS", "mutants"]
