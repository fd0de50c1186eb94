"""Zero-shot transfer benchmarks: ProntoQA, NATURAL PLAN Trip Planning and Calendar Scheduling.

Each benchmark offers ``generate(n, seed) -> raw`` (the benchmark's own JSON layout),
``to_tasks(raw, split, source)``, ``load(path, split)`` for the official files and
``score(task, answer) -> bool``. Gold answers live in ``Task.meta`` (evaluation only: they are
not training meta keys, so ``load_training_tasks`` drops them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from omtr.tasks.records import Task
from omtr.tasks.transfer import natural_plan, prontoqa


@dataclass(frozen=True)
class Benchmark:
    name: str
    family: str
    generate: Callable[..., dict]
    to_tasks: Callable[..., list[Task]]
    load: Callable[..., list[Task]]
    score: Callable[[Task, str], bool]


BENCHMARKS: dict[str, Benchmark] = {
    "prontoqa": Benchmark("prontoqa", "prontoqa", prontoqa.generate, prontoqa.to_tasks, prontoqa.load, prontoqa.score),
    "trip": Benchmark(
        "trip",
        "natural_plan_trip",
        natural_plan.generate_trip,
        lambda raw, **kw: natural_plan.to_tasks(raw, "trip", **kw),
        lambda path, **kw: natural_plan.load(path, "trip", **kw),
        natural_plan.score_trip,
    ),
    "calendar": Benchmark(
        "calendar",
        "natural_plan_calendar",
        natural_plan.generate_calendar,
        lambda raw, **kw: natural_plan.to_tasks(raw, "calendar", **kw),
        lambda path, **kw: natural_plan.load(path, "calendar", **kw),
        natural_plan.score_calendar,
    ),
}
_BY_FAMILY = {b.family: b for b in BENCHMARKS.values()}


def score_answers(tasks: list[Task], answers: dict[str, str]) -> tuple[dict, list[dict]]:
    """Accuracy overall and per family; tasks without an answer count as wrong."""
    rows = []
    per: dict[str, list[int]] = {}
    for t in tasks:
        bench = _BY_FAMILY.get(t.family or "")
        if bench is None:
            raise ValueError(f"task {t.id!r}: family {t.family!r} is not a transfer benchmark ({sorted(_BY_FAMILY)})")
        ans = answers.get(t.id)
        ok = ans is not None and bench.score(t, ans)
        rows.append({"id": t.id, "family": t.family, "correct": ok, "answered": ans is not None})
        per.setdefault(t.family, []).append(int(ok))  # type: ignore[arg-type]
    total = sum(r["correct"] for r in rows)
    summary = {
        "tasks": len(rows),
        "correct": total,
        "accuracy": total / len(rows) if rows else 0.0,
        "per_family": {f: {"tasks": len(v), "accuracy": sum(v) / len(v)} for f, v in per.items()},
    }
    return summary, rows
