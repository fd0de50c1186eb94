"""The paper's evaluation numbers from trace records (Tables 1-5, 8, 9; Figures 3-5).

Input: the lines of ``traces.jsonl`` as written by :mod:`omtr.evaluation.run` — one per task:
planning episodes (``Episode.to_json()`` plus ``faithful``) and transfer answers (``kind:
"transfer"``, ``correct``). Every rate comes with a percentile bootstrap 95% interval over tasks
(``ci: [lo, hi]``, seeded), and everything is given overall and per family with counts.

* ``success`` (solvability): the final spec solved (planner + VAL) within the budget.
* ``faithful``: solved and the checker finds no drift against the reference, over tasks with a
  reference; ``gap`` = solvability - faithful success on those tasks.
* ``drift``: share of solved specs the checker rejects (conditional on success); ``drift_categories``:
  the first finding's category among them.
* ``csr``: CSR(h), the share solved within h repairs (h + 1 planner calls), h = 0..5; ``delta``:
  Δ(h) = CSR(h) - CSR(h-1) for h = 1..5.
* ``calls``: mean planner calls per task.
* ``heatmap``: after each step h, the share of each diagnostic category among tasks still unsolved
  (and the dominant one).
* ``judge``: the Judge's score on the Actor's spec, mean ± sd over U (unsolved), D (solved,
  drifting) and F (solved, faithful), and the F-vs-D AUC (omtr.faithfulness.separation).
* ``transfer``: exact match per transfer benchmark, scored by the task suite's scorers.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Iterable, Sequence

import numpy as np

from omtr.faithfulness.separation import auc, mean_sd
from omtr.spec.categories import Category

PLANBENCH_FAMILIES = ("blocksworld", "mystery_blocksworld", "logistics", "depots")
CATEGORIES = tuple(c.value for c in Category)
MAX_H = 5


class Bootstrap:
    """Resampling indices shared by every rate of one group of tasks (so intervals are comparable)."""

    def __init__(self, n: int, b: int = 1000, seed: int = 0):
        self.n, self.b = n, b
        self.idx = np.random.default_rng(seed).integers(0, n, size=(b, n)) if n and b else None

    def rate(self, hits: Sequence[float], mask: Sequence[bool] | None = None) -> dict[str, Any]:
        """mean(hits[mask]) with its interval; mask selects the denominator (e.g. solved tasks)."""
        h = np.asarray(hits, dtype=float)
        m = np.ones(len(h), dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
        den = int(m.sum())
        value = float(h[m].mean()) if den else None
        out: dict[str, Any] = {"value": _r(value), "n": den, "k": _r(float(h[m].sum())) if den else 0}
        if self.idx is None or not den:
            out["ci"] = [None, None]
            return out
        hs, ms = (h * m)[self.idx].sum(1), m[self.idx].sum(1)
        ok = ms > 0
        boots = hs[ok] / ms[ok]
        out["ci"] = [_r(float(np.percentile(boots, 2.5))), _r(float(np.percentile(boots, 97.5)))] if len(boots) else [None, None]
        return out


def _r(x: float | None, nd: int = 4) -> float | None:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    return round(float(x), nd)


def _cat(step: dict) -> str:
    v = step.get("verdict") or {}
    if v.get("success"):
        return "success"
    return v.get("category") or "unknown"


def _group(rec: dict) -> str:
    if not rec.get("success"):
        return "U"
    f = rec.get("faithful") or {}
    if not f.get("checked"):
        return "S"  # solved, no reference to compare with
    return "F" if f.get("faithful") else "D"


def planning_block(recs: Sequence[dict], *, bootstrap: int = 1000, seed: int = 0, budget: int = 6) -> dict[str, Any]:
    n = len(recs)
    bs = Bootstrap(n, bootstrap, seed)
    solved = [bool(r.get("success")) for r in recs]
    has_ref = [bool((r.get("faithful") or {}).get("reference")) for r in recs]
    groups = [_group(r) for r in recs]
    faithful = [g == "F" for g in groups]
    drift = [g == "D" for g in groups]
    checked = [g in ("D", "F") for g in groups]
    calls = [int(r.get("planner_calls") or 0) for r in recs]
    block: dict[str, Any] = {"tasks": n}
    block["success"] = bs.rate(solved)
    block["solvability"] = block["success"]
    block["faithful"] = bs.rate(faithful, has_ref)
    block["drift"] = bs.rate(drift, checked)
    gap_hits = [float(s) - float(f) for s, f in zip(solved, faithful)]
    block["gap"] = bs.rate(gap_hits, has_ref)
    block["calls"] = {"value": _r(sum(calls) / n) if n else None, "n": n,
                      "ci": _mean_ci(bs, calls), "total": sum(calls)}
    block["actor_success"] = bs.rate([bool(r.get("actor_success")) for r in recs])

    # CSR(h): solved within h repairs
    hmax = min(MAX_H, max(budget - 1, 0))
    csr = []
    for h in range(MAX_H + 1):
        hits = [bool(r.get("success")) and int(r.get("planner_calls") or 0) <= h + 1 for r in recs]
        csr.append(bs.rate(hits) | {"h": h, "within_budget": h <= hmax})
    block["csr"] = csr
    block["delta"] = [{"h": h, "value": _r((csr[h]["value"] or 0) - (csr[h - 1]["value"] or 0)) if n else None}
                      for h in range(1, MAX_H + 1)]

    # drift categories (first finding) among D
    cats = Counter(((r.get("faithful") or {}).get("categories") or ["unknown"])[0] for r, g in zip(recs, groups) if g == "D")
    nd = sum(cats.values())
    block["drift_categories"] = {c: {"count": k, "share": _r(k / nd)} for c, k in cats.most_common()}

    # diagnostic heatmap: category at step h among tasks unsolved after step h
    heat: list[dict[str, Any]] = []
    for h in range(MAX_H + 1):
        counts: Counter = Counter()
        for r in recs:
            steps = r.get("steps") or []
            if len(steps) > h and not (steps[h].get("verdict") or {}).get("success"):
                counts[_cat(steps[h])] += 1
        total = sum(counts.values())
        heat.append({"h": h, "unsolved": total,
                     "shares": {c: _r(counts[c] / total) if total else 0.0 for c in CATEGORIES},
                     "dominant": counts.most_common(1)[0][0] if total else None})
    block["heatmap"] = heat
    block["final_categories"] = dict(Counter(_cat((r.get("steps") or [{}])[-1]) for r in recs if r.get("steps")).most_common())

    # the Judge on the Actor's spec: U if that spec failed; if it succeeded, the episode ended there and
    # the final spec's faithfulness (D or F) is the Actor's
    by: dict[str, list[float]] = {"U": [], "D": [], "F": []}
    for r, g in zip(recs, groups):
        score = r.get("judge_score")
        actor_group = g if r.get("actor_success") else "U"
        if score is not None and actor_group in by:
            by[actor_group].append(float(score))
    if any(by.values()):
        judge: dict[str, Any] = {}
        for g in ("U", "D", "F"):
            m, sd = mean_sd(by[g])
            judge[g] = {"n": len(by[g]), "mean": _r(m), "sd": _r(sd)}
        judge["auc_f_vs_d"] = _r(auc(by["F"], by["D"]))
        block["judge"] = judge
    else:
        block["judge"] = None
    return block


def _mean_ci(bs: Bootstrap, values: Sequence[float]) -> list[float | None]:
    if bs.idx is None or not len(values):
        return [None, None]
    v = np.asarray(values, dtype=float)
    boots = v[bs.idx].mean(1)
    return [_r(float(np.percentile(boots, 2.5)), 3), _r(float(np.percentile(boots, 97.5)), 3)]


def transfer_block(recs: Sequence[dict], *, bootstrap: int = 1000, seed: int = 0) -> dict[str, Any]:
    bs = Bootstrap(len(recs), bootstrap, seed)
    return {"tasks": len(recs), "exact_match": bs.rate([bool(r.get("correct")) for r in recs]),
            "answered": sum(bool(r.get("answered", True)) for r in recs)}


def compute_metrics(records: Iterable[dict], *, bootstrap: int = 1000, seed: int = 0, budget: int = 6,
                    policy: str | None = None) -> dict[str, Any]:
    """metrics.json: top-level success/faithful/drift (fractions) and calls, then blocks."""
    records = list(records)
    planning = [r for r in records if r.get("kind", "planning") == "planning"]
    transfer = [r for r in records if r.get("kind") == "transfer"]
    out: dict[str, Any] = {}
    overall = planning_block(planning, bootstrap=bootstrap, seed=seed, budget=budget) if planning else None
    out["success"] = overall["success"]["value"] if overall else None
    out["faithful"] = overall["faithful"]["value"] if overall else None
    out["drift"] = overall["drift"]["value"] if overall else None
    out["calls"] = overall["calls"]["value"] if overall else None
    out["policy"], out["budget"], out["tasks"] = policy, budget, len(records)
    fams: dict[str, list[dict]] = {}
    for r in planning:
        fams.setdefault(r.get("family") or "none", []).append(r)
    out["families"] = {f: planning_block(rs, bootstrap=bootstrap, seed=seed, budget=budget) for f, rs in sorted(fams.items())}
    pb = [f for f in PLANBENCH_FAMILIES if f in fams]
    out["planbench_average"] = {
        "families": pb,
        "success": _r(sum(out["families"][f]["success"]["value"] for f in pb) / len(pb)) if pb else None,
        "faithful": _r(sum(out["families"][f]["faithful"]["value"] or 0 for f in pb) / len(pb)) if pb else None,
    }
    out["overall"] = overall
    tfam: dict[str, list[dict]] = {}
    for r in transfer:
        tfam.setdefault(r.get("family") or "none", []).append(r)
    out["transfer"] = ({"overall": transfer_block(transfer, bootstrap=bootstrap, seed=seed),
                        "families": {f: transfer_block(rs, bootstrap=bootstrap, seed=seed) for f, rs in sorted(tfam.items())}}
                       if transfer else None)
    return out
