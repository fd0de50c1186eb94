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
* ``judge``: the Judge's scores, mean ± sd over U (unsolved), D (solved, drifting) and F (solved,
  faithful), and the F-vs-D AUC with a bootstrap interval, on two candidate pools: ``pooled`` (the
  paper's, appendix H.9: every spec the episode wrote — the Actor's, the Editor's intermediate
  repairs and the final one — each once) and ``actor`` (the Actor's spec only). The top-level
  ``U``/``D``/``F``/``auc_f_vs_d`` are the pooled figures.
* ``limits``: planner calls ended by a limit (CPU time, memory, omtr's input size). They count as
  failed calls, as in the paper, and are reported apart so a time-out is never mistaken for a
  wrong spec.
* ``planetarium``: Planetarium's three rates over the final specs: ``parseable`` (the PDDL parses),
  ``solvable`` (the planner finds a plan VAL accepts: ``success``) and ``equivalent`` (the
  reference checker finds no drift: faithful success), each over all tasks.
* ``identical_to_reference``: solved final specs equal to the task's reference up to layout,
  comments and case (judged faithful without the checker's mapping search).
* ``transfer``: exact match per transfer benchmark, scored by the task suite's scorers.
* ``plan_generation`` (``plan:`` policies, PlanBench's protocol): the share of answers whose plan VAL
  accepts on the reference domain and problem, per set.

Tasks are grouped into *sets*: a PlanBench configuration (``planbench/blocksworld``,
``planbench/blocksworld_3``, ...) or, for generated tasks, the family (``gripper``); a PlanBench
configuration and generated tasks of the same family are never merged. ``paper_average`` is the
paper's "Avg.": the mean over its four domains, BlocksWorld, Mystery BlocksWorld, Logistics and
Gripper (each read from PlanBench's main configuration when present, else the generated family);
every set, Depots included, is also reported on its own under ``families``.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Iterable, Sequence

import numpy as np

from omtr.faithfulness.separation import auc, mean_sd
from omtr.pddl.categories import Category

PAPER_DOMAINS = ("blocksworld", "mystery_blocksworld", "logistics", "gripper")
# where each of the paper's domains is read from: the first set present wins
PAPER_SETS = {
    "blocksworld": ("planbench/blocksworld", "blocksworld"),
    "mystery_blocksworld": ("planbench/mystery_blocksworld", "mystery_blocksworld"),
    "logistics": ("planbench/logistics", "logistics"),
    "gripper": ("gripper",),
}
PAPER_AVERAGE_NAME = "paper average (BlocksWorld, Mystery BlocksWorld, Logistics, Gripper)"
# display order of sets: the paper's domains first, then Depots, then anything else
FAMILY_ORDER = ("blocksworld", "mystery_blocksworld", "logistics", "gripper", "depots")
LIMITS = ("timed_out", "memory_out", "too_large")
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


def final_index(rec: dict) -> int:
    """The index of the step a record answers with: the last one, or under ``--select`` the chosen
    candidate (``selection.selected``), which need not be the last drawn."""
    steps = rec.get("steps") or []
    sel = rec.get("selection")
    if isinstance(sel, dict) and isinstance(sel.get("selected"), int) and 0 <= sel["selected"] < len(steps):
        return sel["selected"]
    return len(steps) - 1


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
    # planner successes apart from supported ones (omtr.faithfulness.support): a trivial or unsupported
    # success is counted as what it is, never folded into "success" silently
    block["supported"] = bs.rate([bool(r.get("success")) and r.get("support") == "supported" for r in recs])
    block["support"] = dict(Counter(r.get("support") or "unknown" for r in recs if r.get("success")).most_common())
    block["domain_sources"] = dict(Counter(str(r.get("domain_source") or "written").split(":")[0]
                                           for r in recs).most_common())
    # which decoding rules the episodes ran under (omtr.model.scope_check.rules_label), counted
    block["rules"] = dict(Counter(r.get("rules") or "off" for r in recs).most_common())

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
    block["final_categories"] = dict(Counter(_cat(r["steps"][final_index(r)]) for r in recs if r.get("steps")).most_common())

    block["identical_to_reference"] = sum(bool((r.get("faithful") or {}).get("identical")) for r in recs)
    block["limits"] = limits_block(recs)
    block["planetarium"] = {
        "parseable": bs.rate([_parseable(r) for r in recs]),
        "solvable": block["success"],
        "equivalent": block["faithful"],
    }
    block["judge"] = judge_block(recs, groups, bs)
    return block


def _parseable(rec: dict) -> bool:
    """Planetarium's "parseable": the final spec was found and parses (any verdict but ``syntax``)."""
    steps = rec.get("steps") or []
    if not steps:
        return False
    v = steps[final_index(rec)].get("verdict") or {}
    return bool(v.get("success")) or (v.get("category") not in (None, "syntax"))


def limits_block(recs: Sequence[dict]) -> dict[str, Any]:
    """Planner calls a limit ended (each still a failed call), and the tasks they touched."""
    out: dict[str, Any] = {k: 0 for k in LIMITS}
    tasks = final = 0
    for r in recs:
        steps = r.get("steps") or []
        hit = [any((s.get("verdict") or {}).get(k) for k in LIMITS) for s in steps]
        for s in steps:
            for k in LIMITS:
                out[k] += bool((s.get("verdict") or {}).get(k))
        tasks += any(hit)
        final += bool(hit and hit[final_index(r)])
    out["calls"] = sum(out[k] for k in LIMITS)
    out["tasks"], out["final"] = tasks, final  # tasks with any limited call; tasks whose last call was one
    return out


def judge_candidates(recs: Sequence[dict], groups: Sequence[str]) -> dict[str, list[tuple[int, float, str]]]:
    """(task index, Judge score, group) per scored candidate: ``actor`` and ``pooled`` pools.

    Within an episode only the last spec can be solved (the loop stops at the first success), so
    every earlier spec is U and the last is U, D or F as the task's final spec. Under ``--select``
    the answer is the chosen candidate (:func:`final_index`); another solved candidate was never
    graded, so it is left out. A step without a score (a policy that scores only the Actor's spec)
    is left out of the pooled pool."""
    actor: list[tuple[int, float, str]] = []
    pooled: list[tuple[int, float, str]] = []
    for i, (r, g) in enumerate(zip(recs, groups)):
        steps = r.get("steps") or []
        last = final_index(r)
        for j, st in enumerate(steps):
            score = st.get("judge_score")
            if score is None and j == 0:
                score = r.get("judge_score")
            if score is None:
                continue
            solved = bool((st.get("verdict") or {}).get("success"))
            if solved and j != last:
                continue  # a solved candidate --select did not answer with: not graded
            cg = (g if j == last else "U") if solved else "U"
            if cg in ("U", "D", "F"):
                pooled.append((i, float(score), cg))
                if j == 0:
                    actor.append((i, float(score), cg))
        if not steps and r.get("judge_score") is not None:
            actor.append((i, float(r["judge_score"]), "U"))
            pooled.append((i, float(r["judge_score"]), "U"))
    return {"actor": actor, "pooled": pooled}


def weighted_auc(pos: np.ndarray, pos_w: np.ndarray, neg: np.ndarray, neg_w: np.ndarray) -> float | None:
    """P(a positive scores above a negative), ties one half, each candidate counted ``w`` times."""
    wp, wn = float(pos_w.sum()), float(neg_w.sum())
    if wp <= 0 or wn <= 0:
        return None
    order = np.argsort(neg, kind="stable")
    ns, nw = neg[order], np.concatenate([[0.0], np.cumsum(neg_w[order])])
    lo = nw[np.searchsorted(ns, pos, side="left")]
    hi = nw[np.searchsorted(ns, pos, side="right")]
    return float(((lo + 0.5 * (hi - lo)) * pos_w).sum() / (wp * wn))


def auc_rate(cands: Sequence[tuple[int, float, str]], bs: Bootstrap) -> dict[str, Any]:
    """F-vs-D AUC over candidates with a percentile interval from resampling tasks (candidates
    travel with their task)."""
    f = [(i, s) for i, s, g in cands if g == "F"]
    d = [(i, s) for i, s, g in cands if g == "D"]
    out: dict[str, Any] = {"n_f": len(f), "n_d": len(d)}
    fi, fs = np.array([i for i, _ in f], dtype=int), np.array([s for _, s in f], dtype=float)
    di, ds = np.array([i for i, _ in d], dtype=int), np.array([s for _, s in d], dtype=float)
    value = weighted_auc(fs, np.ones(len(fs)), ds, np.ones(len(ds))) if f and d else None
    out["value"] = _r(value)
    if value is None or bs.idx is None:
        out["ci"] = [None, None]
        return out
    boots = []
    for row in bs.idx:
        counts = np.bincount(row, minlength=bs.n).astype(float)
        a = weighted_auc(fs, counts[fi], ds, counts[di])
        if a is not None:
            boots.append(a)
    out["ci"] = ([_r(float(np.percentile(boots, 2.5))), _r(float(np.percentile(boots, 97.5)))]
                 if boots else [None, None])
    return out


def _judge_pool(cands: Sequence[tuple[int, float, str]], bs: Bootstrap) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for g in ("U", "D", "F"):
        vals = [s for _, s, cg in cands if cg == g]
        m, sd = mean_sd(vals)
        out[g] = {"n": len(vals), "mean": _r(m), "sd": _r(sd)}
    out["auc"] = auc_rate(cands, bs)
    out["candidates"] = len(cands)
    return out


def judge_block(recs: Sequence[dict], groups: Sequence[str], bs: Bootstrap) -> dict[str, Any] | None:
    """The Judge on the paper's pooled candidates and on the Actor's specs alone (None: no scores)."""
    c = judge_candidates(recs, groups)
    if not c["actor"] and not c["pooled"]:
        return None
    pooled, actor = _judge_pool(c["pooled"], bs), _judge_pool(c["actor"], bs)
    out: dict[str, Any] = {g: pooled[g] for g in ("U", "D", "F")}
    out["auc_f_vs_d"] = pooled["auc"]["value"]
    out["auc_ci"] = pooled["auc"]["ci"]
    out["pooled"], out["actor"] = pooled, actor
    out["unscored_steps"] = sum(len(r.get("steps") or []) for r in recs) - len(c["pooled"])
    return out


def paper_average(families: dict[str, dict]) -> dict[str, Any]:
    """The paper's "Avg.": mean success (and faithful success) over its four domains, each read from
    the first of ``PAPER_SETS[domain]`` present in ``families`` (set -> planning block)."""
    sets = {d: next((k for k in PAPER_SETS[d] if k in families), None) for d in PAPER_DOMAINS}
    present = [d for d in PAPER_DOMAINS if sets[d]]

    def mean(key: str) -> float | None:
        vals = [(families[sets[d]].get(key) or {}).get("value") for d in present]
        vals = [v for v in vals if v is not None]
        return _r(sum(vals) / len(vals)) if vals and len(vals) == len(present) else None

    complete = len(present) == len(PAPER_DOMAINS)
    # the paper's figure only when all four domains are there; otherwise the mean over those present,
    # under another name, so a partial mean is never read as the paper's
    return {"name": PAPER_AVERAGE_NAME, "domains": list(PAPER_DOMAINS), "sets": {d: sets[d] for d in present},
            "missing": [d for d in PAPER_DOMAINS if not sets[d]], "complete": complete,
            "success": mean("success") if complete else None, "faithful": mean("faithful") if complete else None,
            "partial_success": mean("success") if present else None,
            "partial_faithful": mean("faithful") if present else None}


def set_key(rec: dict) -> str:
    """The set a trace record is reported under (see the module docstring)."""
    return str(rec.get("set") or rec.get("family") or "none")


def _set_order(key: str) -> tuple:
    fam = key.split("/", 1)[1] if key.startswith("planbench/") else key
    base = next((f for f in FAMILY_ORDER if fam == f or fam.startswith(f + "_")), None)
    return (FAMILY_ORDER.index(base) if base else len(FAMILY_ORDER), not key.startswith("planbench/"), key)


def _mean_ci(bs: Bootstrap, values: Sequence[float]) -> list[float | None]:
    if bs.idx is None or not len(values):
        return [None, None]
    v = np.asarray(values, dtype=float)
    boots = v[bs.idx].mean(1)
    return [_r(float(np.percentile(boots, 2.5)), 3), _r(float(np.percentile(boots, 97.5)), 3)]


def plan_block(recs: Sequence[dict], *, bootstrap: int = 1000, seed: int = 0) -> dict[str, Any]:
    """PlanBench's plan accuracy: the share of answers whose plan VAL accepts on the reference."""
    bs = Bootstrap(len(recs), bootstrap, seed)
    return {"tasks": len(recs), "valid": bs.rate([bool(r.get("valid")) for r in recs]),
            "read": sum(bool(r.get("plan")) for r in recs),
            "skipped_lines": sum(int(r.get("skipped_lines") or 0) for r in recs)}


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
    plans = [r for r in records if r.get("kind") == "plan"]
    out: dict[str, Any] = {}
    overall = planning_block(planning, bootstrap=bootstrap, seed=seed, budget=budget) if planning else None
    out["success"] = overall["success"]["value"] if overall else None
    out["faithful"] = overall["faithful"]["value"] if overall else None
    out["drift"] = overall["drift"]["value"] if overall else None
    out["calls"] = overall["calls"]["value"] if overall else None
    # solved *and* supported (omtr.faithfulness.support), apart from the planner's success
    out["supported"] = overall["supported"]["value"] if overall else None
    out["support"] = overall["support"] if overall else {}
    out["policy"], out["budget"], out["tasks"] = policy, budget, len(records)
    fams: dict[str, list[dict]] = {}
    for r in planning:
        fams.setdefault(set_key(r), []).append(r)
    out["families"] = {}
    for f in sorted(fams, key=_set_order):
        block = planning_block(fams[f], bootstrap=bootstrap, seed=seed, budget=budget)
        block["family"] = fams[f][0].get("family")
        out["families"][f] = block
    out["paper_average"] = paper_average(out["families"])
    out["identical_to_reference"] = overall["identical_to_reference"] if overall else 0
    out["limits"] = overall["limits"] if overall else None
    out["overall"] = overall
    if plans:
        psets: dict[str, list[dict]] = {}
        for r in plans:
            psets.setdefault(set_key(r), []).append(r)
        out["plan_generation"] = {"overall": plan_block(plans, bootstrap=bootstrap, seed=seed),
                                  "families": {f: plan_block(psets[f], bootstrap=bootstrap, seed=seed)
                                               for f in sorted(psets, key=_set_order)}}
    tfam: dict[str, list[dict]] = {}
    for r in transfer:
        tfam.setdefault(r.get("family") or "none", []).append(r)
    out["transfer"] = ({"overall": transfer_block(transfer, bootstrap=bootstrap, seed=seed),
                        "families": {f: transfer_block(rs, bootstrap=bootstrap, seed=seed) for f, rs in sorted(tfam.items())}}
                       if transfer else None)
    return out


def _indicators(recs: Sequence[dict]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per task: (hits, mask) of each rate ``paired_differences`` compares."""
    groups = [_group(r) for r in recs]
    solved = np.array([bool(r.get("success")) for r in recs], dtype=float)
    has_ref = np.array([bool((r.get("faithful") or {}).get("reference")) for r in recs])
    checked = np.array([g in ("D", "F") for g in groups])
    ones = np.ones(len(recs), dtype=bool)
    return {
        "success": (solved, ones),
        "faithful": (np.array([g == "F" for g in groups], dtype=float), has_ref),
        "drift": (np.array([g == "D" for g in groups], dtype=float), checked),
        "parseable": (np.array([_parseable(r) for r in recs], dtype=float), ones),
        "actor_success": (np.array([bool(r.get("actor_success")) for r in recs], dtype=float), ones),
        "calls": (np.array([float(r.get("planner_calls") or 0) for r in recs]), ones),
    }


PAIRED_RATES = ("success", "faithful", "drift", "parseable", "actor_success", "calls")


def paired_differences(a: Sequence[dict], b: Sequence[dict], *, bootstrap: int = 1000,
                       seed: int = 0) -> dict[str, Any]:
    """B minus A for each rate over the planning tasks both runs have, with a paired percentile
    bootstrap 95% interval: each resample draws tasks once and scores both runs on them."""
    ra = {str(r["id"]): r for r in a if r.get("kind", "planning") == "planning"}
    rb = {str(r["id"]): r for r in b if r.get("kind", "planning") == "planning"}
    shared = sorted(set(ra) & set(rb))
    out: dict[str, Any] = {"shared": len(shared), "only_a": len(set(ra) - set(rb)), "only_b": len(set(rb) - set(ra))}
    ia, ib = _indicators([ra[i] for i in shared]), _indicators([rb[i] for i in shared])
    bs = Bootstrap(len(shared), bootstrap, seed)

    def ratio(h: np.ndarray, m: np.ndarray) -> float | None:
        return float(h[m].mean()) if m.any() else None

    for key in PAIRED_RATES:
        (ha, ma), (hb, mb) = ia[key], ib[key]
        va, vb = ratio(ha, ma), ratio(hb, mb)
        d: dict[str, Any] = {"a": _r(va), "b": _r(vb), "diff": _r(vb - va) if va is not None and vb is not None else None,
                             "ci": [None, None]}
        if d["diff"] is not None and bs.idx is not None:
            sa, na = (ha * ma)[bs.idx].sum(1), ma[bs.idx].sum(1)
            sb, nb = (hb * mb)[bs.idx].sum(1), mb[bs.idx].sum(1)
            ok = (na > 0) & (nb > 0)
            diffs = sb[ok] / nb[ok] - sa[ok] / na[ok]
            if len(diffs):
                d["ci"] = [_r(float(np.percentile(diffs, 2.5))), _r(float(np.percentile(diffs, 97.5)))]
        out[key] = d
    pa = {str(r["id"]): r for r in a if r.get("kind") == "plan"}
    pb = {str(r["id"]): r for r in b if r.get("kind") == "plan"}
    pshared = sorted(set(pa) & set(pb))
    if pshared:  # plan-generation runs: VAL-valid plans, paired the same way
        ha = np.array([bool(pa[i].get("valid")) for i in pshared], dtype=float)
        hb = np.array([bool(pb[i].get("valid")) for i in pshared], dtype=float)
        pbs = Bootstrap(len(pshared), bootstrap, seed)
        d = {"a": _r(float(ha.mean())), "b": _r(float(hb.mean())), "diff": _r(float(hb.mean() - ha.mean())),
             "ci": [None, None], "shared": len(pshared)}
        if pbs.idx is not None:
            diffs = hb[pbs.idx].mean(1) - ha[pbs.idx].mean(1)
            d["ci"] = [_r(float(np.percentile(diffs, 2.5))), _r(float(np.percentile(diffs, 97.5)))]
        out["plan_valid"] = d
    return out
