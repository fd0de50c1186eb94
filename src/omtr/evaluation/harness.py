"""Harness policies: answers fixed in advance, replayed through the episode loop (evaluation only).

* ``oracle`` answers each task with its reference spec. Run through the same loop, extraction,
  planner and checker as any model, it must score 100% success, 100% faithful, 0 drift and one
  planner call per task; anything else is a harness bug.
* ``mutant:<kind>`` answers with the reference passed through one of the faithfulness checker's
  mutators (``omtr.faithfulness.mutators.MUTATORS``); each kind must be reported as its expected
  drift category (or as faithful, for the meaning-preserving kinds). Tasks the mutator cannot
  change (no goal atom to drop, ...) are left out and counted as ``excluded``.
* ``file:PATH`` replays another system's specs (the format is in the README, "Outside systems"):
  JSON Lines, one line per attempt, ``{"id": TASK_ID, "domain": ..., "problem": ...}``, a task's
  attempts in file order; at most K are checked and its episode ends at the first success or after
  its last attempt. ``{"id", "answer"}`` answers a transfer task. An attempt may carry
  ``"score"`` (its own verifier's confidence, 0-1), which is scored for the Judge's AUC as omtr's
  Judge would be; in the domain-given mode an attempt may carry only ``problem``. Attempts beyond
  K, lines naming no task of the task file, and tasks with no attempt are warned about and counted
  (``metrics.json`` ``policy_file``).

In the domain-given mode (tasks whose records carry ``domain``) a harness answers with the problem
alone, as a model must there; the loop pairs it with the given domain. ``oracle`` then checks the
reference problem against the given domain; mutators that change only the domain have nothing to
change in this mode (the domain is not the model's to write) and leave such tasks out, noted.

These read references, so they live on the evaluation side; generating policies (the role model,
the baselines) see only the NL task. The loop hands the policy each prompt's task id
(``routes_by_id``), so attempts go to their task by id, never by NL text: tasks that share one NL
text keep their own attempts.
"""

from __future__ import annotations

import logging
import random
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from omtr.jsonl import JsonlError, read_jsonl
from omtr.policy import Generation, Messages, Sampling

log = logging.getLogger(__name__)


class HarnessError(ValueError):
    """A harness policy that cannot be built (unknown mutator, unreadable file, no references)."""


def answer_text(domain: str | None, problem: str) -> str:
    """A spec as a model would write it: two fenced PDDL blocks (only the problem when the domain is given)."""
    if domain is None:
        return f"```pddl\n{problem.strip()}\n```\n"
    return f"```pddl\n{domain.strip()}\n```\n\n```pddl\n{problem.strip()}\n```\n"


class ReplayPolicy:
    """Fixed attempts per task id, served in order: the Actor gets attempt 0, each Editor turn the next."""

    uses_judge = False
    routes_by_id = True  # the episode loop passes task_ids= to generate

    def __init__(self, name: str, tasks: Iterable, attempts: dict[str, list[tuple[str | None, str]]], *,
                 answers: dict[str, str] | None = None, notes: dict[str, str] | None = None,
                 scores: dict[str, list[float | None]] | None = None):
        self.name = name
        self.attempts = {k: v for k, v in attempts.items() if v}
        self.answers = dict(answers or {})  # transfer tasks: the text answer
        self.notes = dict(notes or {})  # id -> why an attempt is what it is (e.g. mutator not applicable)
        self.scores = {k: list(v) for k, v in (scores or {}).items()}  # id -> score per attempt (or None)
        self.known = {str(t.id) for t in tasks}
        self.excluded: dict[str, str] = {}  # id -> why the task is left out of the evaluation
        self.report: dict[str, Any] | None = None  # what a file: policy read (counts, warnings)
        self._turn: dict[str, int] = {}

    def budget_for(self, task_id: str, budget: int) -> int:
        """How many planner calls this task's episode may use: its attempts, at most ``budget``."""
        return max(1, min(budget, len(self.attempts.get(task_id, [])) or 1))

    def _answer(self, role: str, tid: str, *, problem_only: bool = False) -> str:
        self._turn[tid] = 0 if role == "actor" else self._turn.get(tid, 0) + 1
        tries = self.attempts.get(tid)
        if not tries:
            return ""
        d, p = tries[min(self._turn[tid], len(tries) - 1)]
        return answer_text(None if problem_only else d, p)

    def generate(self, role: str, prompts: Sequence[Messages], sampling: Sampling, *,
                 stop_when: Callable[[str], bool] | None = None,
                 domains: Sequence[str | None] | None = None,
                 task_ids: Sequence[str] | None = None) -> list[Generation]:
        if task_ids is None or len(task_ids) != len(prompts):
            raise ValueError(f"{self.name} answers by task id: run it through omtr.inference.episode.run_episodes, "
                             "which passes task_ids=")
        if domains is not None and len(domains) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(domains)} given domains")
        given = list(domains) if domains is not None else [None] * len(prompts)
        # a task with a given domain is answered with the problem alone, as a model must there
        return [Generation(text=self._answer(role, str(t), problem_only=bool(d))) for t, d in zip(task_ids, given)]

    def judge(self, prompts: Sequence[Messages]) -> list[float]:
        return [0.5] * len(prompts)

    def step_scores(self, task_id: str, steps: int) -> list[float | None]:
        """The given score of each attempt the episode used (None where the file gives none)."""
        given = self.scores.get(task_id) or []
        return [given[i] if i < len(given) else None for i in range(steps)]

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


ATTEMPT_FORMAT = '{"id": TASK_ID, "domain": PDDL, "problem": PDDL, "score": 0-1 (optional)}'


def from_file(path: str | Path, tasks: Sequence, *, budget: int = 6) -> ReplayPolicy:
    """Another system's attempts, routed by task id (see the module docstring and the README)."""
    p = Path(path)
    if not p.is_file():
        raise HarnessError(f"file:{p}: no such file")
    known = {str(t.id): t for t in tasks}
    attempts: dict[str, list[tuple[str | None, str]]] = defaultdict(list)
    scores: dict[str, list[float | None]] = defaultdict(list)
    answers: dict[str, str] = {}
    unknown: dict[str, int] = {}
    beyond: dict[str, int] = {}
    try:
        for n, rec in read_jsonl(p, what="attempts file"):
            if not isinstance(rec.get("id"), (str, int)) or isinstance(rec.get("id"), bool):
                raise HarnessError(f"{p}:{n}: no task id; expected {ATTEMPT_FORMAT}")
            tid = str(rec["id"])
            if tid not in known:
                unknown[tid] = unknown.get(tid, 0) + 1
                continue
            if isinstance(rec.get("answer"), str):
                answers[tid] = rec["answer"]
                continue
            domain, problem = rec.get("domain"), rec.get("problem")
            if not isinstance(problem, str) or not (domain is None or isinstance(domain, str)):
                raise HarnessError(f"{p}:{n}: task {tid}: 'problem' (and 'domain', unless the domain is given) must "
                                   f"be PDDL text; expected {ATTEMPT_FORMAT}")
            score = rec.get("score")
            if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))
                                      or not 0.0 <= float(score) <= 1.0):
                raise HarnessError(f"{p}:{n}: task {tid}: 'score' must be a number from 0 to 1, got {score!r}")
            if len(attempts[tid]) >= budget:
                beyond[tid] = beyond.get(tid, 0) + 1
                continue
            attempts[tid].append((domain, problem))
            scores[tid].append(None if score is None else float(score))
    except JsonlError as exc:
        raise HarnessError(str(exc)) from None
    if not attempts and not answers:
        raise HarnessError(f"{p}: no line names a task of the task file (ids such as "
                           f"{', '.join(sorted(known)[:3])}); expected {ATTEMPT_FORMAT}")
    from omtr.evaluation.run import is_transfer

    missing = sorted(t for t, task in known.items() if t not in attempts and t not in answers)
    report = {
        "path": str(p), "attempts": sum(len(v) for v in attempts.values()),
        "tasks_with_attempts": len(attempts), "answers": len(answers),
        "beyond_budget": {"attempts": sum(beyond.values()), "tasks": len(beyond), "ids": sorted(beyond)[:20]},
        "unknown_ids": {"lines": sum(unknown.values()), "ids": sorted(unknown)[:20], "count": len(unknown)},
        "no_attempt": {"count": len(missing), "ids": missing[:20],
                       "transfer": sum(is_transfer(known[t]) for t in missing)},
        "scored_attempts": sum(v is not None for vs in scores.values() for v in vs),
        "problem_only_attempts": sum(d is None for vs in attempts.values() for d, _ in vs),
    }
    if beyond:
        log.warning("%s: %d attempts beyond the budget of %d for %d tasks (e.g. %s) are not checked",
                    p, report["beyond_budget"]["attempts"], budget, len(beyond), sorted(beyond)[0])
    if unknown:
        log.warning("%s: %d lines name %d ids that are not in the task file (e.g. %s); skipped",
                    p, report["unknown_ids"]["lines"], len(unknown), sorted(unknown)[0])
    if missing:
        log.warning("%s: %d tasks have no attempt (e.g. %s); each counts as one failed planner call",
                    p, len(missing), missing[0])
    policy = ReplayPolicy(f"file:{p}", tasks, dict(attempts), answers=answers,
                          scores={k: v for k, v in scores.items() if any(x is not None for x in v)})
    policy.report = report
    return policy
