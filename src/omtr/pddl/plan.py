"""One tolerant reader of plan steps, for every place a plan comes from.

Plans reach omtr in several shapes: the planner's plan file (``(pick-up a)`` per line and a
``; cost = ...`` comment), the task generators' step lists, plans pasted by users or written by a
model (numbered lists, bullets, code fences, ``pick-up(a, b)``, upper case, several steps on one
line) and timed plans (``0.001: (move a b) [1.000]``). :func:`read_plan` turns any of them into
:class:`PlanStep` values; :func:`format_step` writes the canonical ``(name arg ...)`` form.

With ``bare=True`` a line without parentheses counts as a step when it looks like one (``pick-up
a``, ``3. stack a b``, ``- unstack c a``); the planner's own files are read with ``bare=False`` so
that only parenthesised steps count. Lines that are not steps (prose, headers, fences, comments)
are skipped, never an error.
"""

from __future__ import annotations

import re
from typing import Iterable, NamedTuple

# A step in parentheses: no nested parentheses inside.
_PAREN = re.compile(r"\(([^()]*)\)")
# Timed-plan prefix "0.001:" (a decimal number and a colon) and duration suffix "[1.000]".
_TIME = re.compile(r"^\s*(\d+\.\d*|\d*\.\d+)\s*:\s*")
_DURATION = re.compile(r"\[\s*[\d.]+\s*\]")
# List markers in front of a step: "1.", "1)", "12:", "step 3:", "-", "*", "•".
_MARKER = re.compile(r"^\s*(?:(?:step\s*)?\d+\s*[.:)]\s*|[-*\u2022]\s+)", re.IGNORECASE)
# A bare step: a name followed by zero or more arguments, nothing else.
_BARE = re.compile(r"^([A-Za-z][\w\-]*)((?:\s+[\w\-]+)*)\s*$")
# Function-call style: name(a, b)
_CALL = re.compile(r"^([A-Za-z][\w\-]*)\s*\(([^()]*)\)\s*$")
_SKIP_WORDS = frozenset({"plan", "end", "solution", "```", "[plan]", "[plan end]"})


class PlanStep(NamedTuple):
    """One ground action: its name, its arguments and, in timed plans, its start time."""

    name: str
    args: tuple[str, ...] = ()
    time: float | None = None

    def __str__(self) -> str:
        return format_step(self.name, self.args)


def format_step(name: str, args: Iterable[str] = ()) -> str:
    """The canonical text of a step: ``(name a b)``."""
    return "(" + " ".join([name, *args]) + ")"


def _tokens(body: str, lower: bool) -> list[str]:
    toks = body.replace(",", " ").split()
    return [t.lower() for t in toks] if lower else toks


def read_line(line: str, *, bare: bool = True, lower: bool = True) -> list[PlanStep]:
    """The steps on one line of plan text (none when the line is not a step)."""
    line = line.split(";", 1)[0]
    if not line.strip():
        return []
    time = None
    m = _TIME.match(line)
    if m:
        time = float(m.group(1))
        line = line[m.end():]
    line = _DURATION.sub(" ", line)
    unmarked = _MARKER.sub("", line, count=1).strip()
    call = _CALL.match(unmarked)  # "pick-up(a, b)": the name stands outside the parentheses
    if call:
        name = call.group(1).lower() if lower else call.group(1)
        return [PlanStep(name, tuple(_tokens(call.group(2), lower)), time)]
    groups = _PAREN.findall(line)
    if groups:
        out = []
        for body in groups:
            toks = _tokens(body, lower)
            if toks:
                out.append(PlanStep(toks[0], tuple(toks[1:]), time))
        return out
    if not bare:
        return []
    text = unmarked.strip("`").strip()
    if not text or text.lower() in _SKIP_WORDS:
        return []
    m = _BARE.match(text)
    if not m:
        return []
    toks = _tokens(text, lower)
    return [PlanStep(toks[0], tuple(toks[1:]), time)]


def read_plan(plan: str | Iterable[str], *, bare: bool = True, lower: bool = True) -> list[PlanStep]:
    """Every step of a plan given as text or as a list of step strings, in order."""
    lines = plan.splitlines() if isinstance(plan, str) else [str(s) for s in plan]
    steps: list[PlanStep] = []
    for line in lines:
        steps.extend(read_line(line, bare=bare, lower=lower))
    return steps


def read_plan_file(path: str, *, bare: bool = False) -> list[str]:
    """The steps of a plan file as canonical strings (the planner's own output: ``bare=False``)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return [str(s) for s in read_plan(f.read(), bare=bare)]


def parse_step(step: str) -> PlanStep | None:
    """One step string such as ``(stack a b)`` or ``stack a b``; None when it is not a step."""
    steps = read_line(step)
    return steps[0] if len(steps) == 1 else None
