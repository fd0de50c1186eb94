"""Judge separation utilities (paper Table 5) and the drift-category distribution (Table 4b).

Candidates are partitioned into **U** (unsolved), **D** (solved but the checker rejects: drift)
and **F** (solved and faithful). A candidate is anything with ``solved``, ``faithful`` and
``judge_score`` (attributes or mapping keys) and, for D, either ``categories`` (list of finding
categories, first = primary) or ``report`` (a ``FaithfulnessReport`` or its JSON dict).

``auc(pos, neg)`` is the rank statistic (Mann-Whitney U / (n_pos n_neg), ties count one half):
the probability that a random positive scores above a random negative. For the Judge,
``separation(...)["auc_f_vs_d"]`` uses F as positives and D as negatives: 1.0 means the Judge
always ranks faithful solutions above drifting ones, 0.5 means it cannot tell them apart.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Iterable, Mapping, Sequence

GROUPS = ("U", "D", "F")


def _get(c: Any, key: str, default=None):
    if isinstance(c, Mapping):
        return c.get(key, default)
    return getattr(c, key, default)


def group_of(candidate: Any) -> str:
    """'U', 'D' or 'F'. A solved candidate without a faithfulness verdict raises ValueError."""
    if not _get(candidate, "solved"):
        return "U"
    faithful = _get(candidate, "faithful")
    if faithful is None:
        report = _get(candidate, "report")
        faithful = _get(report, "faithful") if report is not None else None
    if faithful is None:
        raise ValueError("a solved candidate needs a faithfulness verdict (faithful or report) to be D or F")
    return "F" if faithful else "D"


def partition(candidates: Iterable[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {g: [] for g in GROUPS}
    for c in candidates:
        out[group_of(c)].append(c)
    return out


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (sd 0 for one value; NaN, NaN for none)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    m = sum(values) / n
    if n == 1:
        return m, 0.0
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))


def auc(positives: Sequence[float], negatives: Sequence[float]) -> float:
    """Area under the ROC curve via average ranks (ties share their rank). NaN if a side is empty."""
    n_pos, n_neg = len(positives), len(negatives)
    if n_pos == 0 or n_neg == 0:
        return math.nan
    pooled = sorted([(float(v), 1) for v in positives] + [(float(v), 0) for v in negatives])
    rank_sum_pos = 0.0
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        avg_rank = (i + j) / 2 + 1  # ranks are 1-based
        rank_sum_pos += avg_rank * sum(1 for k in range(i, j + 1) if pooled[k][1] == 1)
        i = j + 1
    u = rank_sum_pos - n_pos * (n_pos + 1) / 2
    return u / (n_pos * n_neg)


def separation(candidates: Iterable[Any]) -> dict[str, Any]:
    """Judge score mean ± sd per group and AUC of F (positive) vs D."""
    parts = partition(candidates)
    out: dict[str, Any] = {}
    scores = {g: [float(_get(c, "judge_score")) for c in parts[g] if _get(c, "judge_score") is not None] for g in GROUPS}
    for g in GROUPS:
        m, sd = mean_sd(scores[g])
        out[g] = {"n": len(parts[g]), "judge_mean": m, "judge_sd": sd}
    out["auc_f_vs_d"] = auc(scores["F"], scores["D"])
    return out


def primary_category(candidate: Any) -> str:
    """First finding category of a D candidate ('unknown' when none is recorded)."""
    cats = _get(candidate, "categories")
    if not cats:
        report = _get(candidate, "report")
        if report is not None:
            findings = _get(report, "findings") or []
            cats = [(_get(f, "category") if not isinstance(f, str) else f) for f in findings]
    if not cats:
        return "unknown"
    c = cats[0]
    return getattr(c, "value", c)


def drift_distribution(candidates: Iterable[Any]) -> dict[str, Any]:
    """Share of each primary drift category among D candidates: {"n": .., "counts": .., "shares": ..}."""
    d = partition(candidates)["D"]
    counts = Counter(primary_category(c) for c in d)
    n = len(d)
    return {
        "n": n,
        "counts": dict(counts.most_common()),
        "shares": {k: v / n for k, v in counts.most_common()} if n else {},
    }


def drift_rate(candidates: Iterable[Any]) -> float:
    """Share of solver-successful candidates the checker rejects (|D| / (|D| + |F|))."""
    parts = partition(candidates)
    solved = len(parts["D"]) + len(parts["F"])
    return len(parts["D"]) / solved if solved else math.nan
