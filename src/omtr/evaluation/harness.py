"""Harness policies: answers fixed in advance, replayed through the episode loop (evaluation only).

* ``oracle`` answers each task with its reference spec. Run through the same loop, extraction,
  planner and checker as any model, it must score 100% success, 100% faithful, 0 drift and one
  planner call per task; anything else is a harness bug.
* ``mutant:<kind>`` answers with the reference passed through one of the faithfulness checker's
  mutators (``omtr.faithfulness.mutators.MUTATORS``); each kind must be reported as its expected
  drift category (or as faithful, for the meaning-preserving kinds). Tasks the mutator cannot
  change (no goal atom to drop, ...) are left out and counted as ``excluded``.
* ``file:PATH`` replays another system's specs: JSON Lines in ``omtr solve --batch`` format,
  ``{"id": TASK_ID, "domain": ..., "problem": ...}``, one line per attempt; a task's attempts are
  checked in file order, at most K of them, and its episode ends at the first success or after its
  last attempt. For a task with a given domain an attempt may leave ``domain`` out.

In the domain-given mode (tasks whose records carry ``domain``) a harness answers with the problem
alone, as a model must there; the loop pairs it with the given domain. ``oracle`` then checks the
reference problem against the given domain; mutators that change only the domain have nothing to
change in this mode (the domain is not the model's to write) and leave such tasks out, noted.

These read references, so they live on the evaluation side; generating policies (the role model,
the baselines) see only the NL task. The loop hands a policy prompts, not tasks: a harness policy
finds the task by its NL text, which the loop's Actor prompt ends with and its Editor prompt starts
with (tasks sharing one NL text are served in task order).
"""

from __future__ import annotations

import json
import random
from collections import defaultdict, deque
from pathlib import Path
from typing import Callable, Iterable, Sequence

from omtr.inference.baselines import read_prompt
from omtr.inference.policy import Generation, Messages, Sampling


class HarnessError(ValueError):
    """A harness policy that cannot be built (unknown mutator, unreadable file, no references)."""


def answer_text(domain: str | None, problem: str) -> str:
    """A spec as a model would write it: two fenced PDDL blocks (only the problem's when the domain is given)."""
    if domain is None:
        return f"```pddl\n{problem.strip()}\n```\n"
    return f"```pddl\n{domain.strip()}\n```\n\n```pddl\n{problem.strip()}\n```\n"


class ReplayPolicy:
    """Fixed attempts per task id, served in order: the Actor gets attempt 0, each Editor turn the next."""

    uses_judge = False

    def __init__(self, name: str, tasks: Iterable, attempts: dict[str, list[tuple[str, str]]], *,
                 answers: dict[str, str] | None = None, notes: dict[str, str] | None = None):
        self.name = name
        self.attempts = {k: v for k, v in attempts.items() if v}
        self.answers = dict(answers or {})  # transfer tasks: the text answer
        self.notes = dict(notes or {})  # id -> why an attempt is what it is (e.g. mutator not applicable)
        self._ids: dict[str, deque[str]] = defaultdict(deque)
        for t in tasks:
            self._ids[t.nl].append(str(t.id))
        self.excluded: dict[str, str] = {}  # id -> why the task is left out of the evaluation
        self._current: dict[str, str] = {}  # nl -> id now being served
        self._turn: dict[str, int] = {}

    def budget_for(self, task_id: str, budget: int) -> int:
        """How many planner calls this task's episode may use: its attempts, at most ``budget``."""
        return max(1, min(budget, len(self.attempts.get(task_id, [])) or 1))

    def _answer(self, role: str, prompt: Messages) -> str:
        turn = read_prompt(role, prompt)
        if role == "actor":
            ids = self._ids.get(turn.nl)
            if not ids:
                return ""
            tid = ids[0]
            ids.rotate(-1)
            self._current[turn.nl], self._turn[tid] = tid, 0
        else:
            tid = self._current.get(turn.nl, "")
            self._turn[tid] = self._turn.get(tid, 0) + 1
        tries = self.attempts.get(tid)
        if not tries:
            return ""
        d, p = tries[min(self._turn[tid], len(tries) - 1)]
        return answer_text(None if turn.domain else d, p)

    def generate(self, role: str, prompts: Sequence[Messages], sampling: Sampling, *,
                 stop_when: Callable[[str], bool] | None = None,
                 domains: Sequence[str | None] | None = None) -> list[Generation]:
        return [Generation(text=self._answer(role, p)) for p in prompts]

    def judge(self, prompts: Sequence[Messages]) -> list[float]:
        return [0.5] * len(prompts)

    def answer(self, task) -> str:
        return self.answers.get(str(task.id), "")


def _gold_answer(task) -> str | None:
    meta = getattr(task, "meta", {}) or {}
    for key in ("answer", "golden_plan"):
        if isinstance(meta.get(key), str):
            return meta[key]
    return None


def oracle(tasks: Sequence) -> ReplayPolicy:
    attempts = {t.id: [(t.reference.domain, t.reference.problem)] for t in tasks if t.reference is not None}
    answers = {t.id: a for t in tasks if (a := _gold_answer(t)) is not None}
    return ReplayPolicy("oracle", tasks, attempts, answers=answers)


def mutant(kind: str, tasks: Sequence, *, seed: int = 0) -> ReplayPolicy:
    from omtr.faithfulness.mutators import MUTATORS

    by_name = {m.name: m for m in MUTATORS}
    if kind not in by_name:
        raise HarnessError(f"unknown mutator {kind!r}; choose from {', '.join(by_name)}")
    mut = by_name[kind]
    attempts, notes = {}, {}
    for t in tasks:
        if t.reference is None:
            continue
        d, p = t.reference.domain, t.reference.problem
        out = mut.fn(d, p, random.Random(f"{seed}:{t.id}:{kind}"))
        if out is None:
            notes[t.id] = f"mutator {kind} does not apply to this task"
            continue
        if getattr(t, "domain", None) and same_text(out[1], p):
            notes[t.id] = f"mutator {kind} changes only the domain, which this task gives (domain-given mode)"
            continue
        attempts[t.id] = [out]
    policy = ReplayPolicy(f"mutant:{kind}", tasks, attempts, notes=notes)
    policy.excluded = dict(notes)  # evaluated without these tasks (counted in metrics.json)
    return policy


def same_text(a: str, b: str) -> bool:
    """Equal after normalising layout, comments and case."""
    from omtr.solver.cache import normalise

    return normalise(a) == normalise(b)


def expected_category(kind: str) -> str:
    """What the checker should report for a mutator: ``faithful`` or a drift category."""
    from omtr.faithfulness.mutators import MUTATORS

    return {m.name: m.expected for m in MUTATORS}[kind]


def from_file(path: str | Path, tasks: Sequence, *, budget: int = 6) -> ReplayPolicy:
    p = Path(path)
    if not p.is_file():
        raise HarnessError(f"file:{p}: no such file")
    known = {str(t.id) for t in tasks}
    given = {str(t.id): t.domain for t in tasks if getattr(t, "domain", None)}
    attempts: dict[str, list[tuple[str, str]]] = defaultdict(list)
    answers: dict[str, str] = {}
    with open(p, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise HarnessError(f"{p}:{n}: not valid JSON ({exc.msg})") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("id"), (str, int)):
                raise HarnessError(f'{p}:{n}: expected {{"id": TASK_ID, "domain": ..., "problem": ...}}')
            tid = str(rec["id"])
            if tid not in known:
                continue  # another task file's attempt
            if isinstance(rec.get("answer"), str):
                answers[tid] = rec["answer"]
                continue
            if rec.get("domain") is None and tid in given:  # the domain-given mode: a problem alone
                rec["domain"] = given[tid]
            if not isinstance(rec.get("domain"), str) or not isinstance(rec.get("problem"), str):
                raise HarnessError(f"{p}:{n}: 'domain' and 'problem' must be strings (PDDL text)"
                                   + ("" if given else "; 'domain' may be left out only for a task with a given domain"))
            if len(attempts[tid]) < budget:
                attempts[tid].append((rec["domain"], rec["problem"]))
    if not attempts and not answers:
        raise HarnessError(f"{p}: no attempt names a task of the task file")
    return ReplayPolicy(f"file:{p}", tasks, dict(attempts), answers=answers)
