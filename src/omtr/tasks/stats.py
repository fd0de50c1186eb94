"""Statistics of a task file: counts per family and split, object and plan-length histograms."""

from __future__ import annotations

from collections import Counter
from typing import Iterable

from omtr.tasks.records import Task


def compute_stats(tasks: Iterable[Task]) -> dict:
    tasks = list(tasks)
    by_family: dict[str, Counter] = {}
    objects: dict[str, Counter] = {}
    plans: dict[str, Counter] = {}
    with_ref = 0
    for t in tasks:
        fam = t.family or "(none)"
        by_family.setdefault(fam, Counter())[t.split or "(none)"] += 1
        if isinstance(t.meta.get("n_objects"), int):
            objects.setdefault(fam, Counter())[t.meta["n_objects"]] += 1
        if isinstance(t.meta.get("plan_length"), int):
            plans.setdefault(fam, Counter())[t.meta["plan_length"]] += 1
        with_ref += t.reference is not None
    return {
        "tasks": len(tasks),
        "with_reference": with_ref,
        "counts": {f: dict(sorted(c.items())) for f, c in sorted(by_family.items())},
        "objects": {f: {str(k): v for k, v in sorted(c.items())} for f, c in sorted(objects.items())},
        "plan_length": {f: {str(k): v for k, v in sorted(c.items())} for f, c in sorted(plans.items())},
    }


def _histogram(title: str, hist: dict[str, int], width: int = 40) -> list[str]:
    if not hist:
        return []
    top = max(hist.values())
    lines = [f"  {title}:"]
    for k, v in hist.items():
        lines.append(f"    {k:>4} | {'#' * max(1, round(width * v / top)):<{width}} {v}")
    return lines


def format_stats(stats: dict) -> str:
    lines = [f"{stats['tasks']} tasks, {stats['with_reference']} with reference PDDL"]
    for fam, counts in stats["counts"].items():
        split_txt = ", ".join(f"{s}: {n}" for s, n in counts.items())
        lines.append(f"{fam}: {sum(counts.values())} ({split_txt})")
        lines += _histogram("objects", stats["objects"].get(fam, {}))
        lines += _histogram("plan length", stats["plan_length"].get(fam, {}))
    return "\n".join(lines)


def plot_stats(stats: dict, path: str) -> None:
    """Bar charts of object counts and plan lengths per family (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = list(stats["counts"])
    fig, axes = plt.subplots(2, max(1, len(fams)), figsize=(4 * max(1, len(fams)), 6), squeeze=False)
    for j, fam in enumerate(fams):
        for i, (key, label) in enumerate((("objects", "objects"), ("plan_length", "plan length"))):
            hist = stats[key].get(fam, {})
            ax = axes[i][j]
            ax.bar([int(k) for k in hist], list(hist.values()))
            ax.set_title(f"{fam}: {label}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
