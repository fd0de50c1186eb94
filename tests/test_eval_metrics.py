"""The evaluation metrics on hand-built trace records (numbers worked out by hand)."""

from __future__ import annotations

import pytest

from omtr.evaluation.metrics import Bootstrap, compute_metrics


def _ep(id_, family, cats, *, faithful=None, drift=None, judge=None):
    """An episode whose steps end in ``cats`` (None = success)."""
    steps = [{"verdict": {"success": c is None, "category": c}} for c in cats]
    success = cats[-1] is None
    f = {"reference": True, "checked": success}
    if success:
        f.update(faithful=drift is None, categories=[drift] if drift else [])
    return {"id": id_, "family": family, "kind": "planning", "success": success, "actor_success": cats[0] is None,
            "planner_calls": len(cats), "steps": steps, "judge_score": judge, "faithful": f}


RECS = [
    _ep("a", "blocksworld", [None], judge=0.9),                                   # F at h=0
    _ep("b", "blocksworld", ["syntax", None], judge=0.2),                         # F at h=1
    _ep("c", "blocksworld", [None], drift="goal_weakened", judge=0.6),            # D at h=0
    _ep("d", "logistics", ["syntax", "object_type", "syntax", "syntax", "syntax", "syntax"], judge=0.1),  # U
    _ep("e", "logistics", ["predicate_schema", "predicate_schema", None], drift="object_missing", judge=0.3),
    {"id": "t1", "family": "prontoqa", "kind": "transfer", "correct": True},
    {"id": "t2", "family": "prontoqa", "kind": "transfer", "correct": False},
]


def test_top_level_rates_and_calls():
    m = compute_metrics(RECS, bootstrap=0)
    assert m["success"] == 0.8  # 4 of 5 solved
    assert m["faithful"] == 0.4  # a, b
    assert m["drift"] == 0.5  # c, e of 4 solved
    assert m["calls"] == pytest.approx((1 + 2 + 1 + 6 + 3) / 5)
    o = m["overall"]
    assert o["gap"]["value"] == pytest.approx(0.4)
    assert o["drift_categories"] == {"goal_weakened": {"count": 1, "share": 0.5},
                                     "object_missing": {"count": 1, "share": 0.5}}
    assert m["families"]["blocksworld"]["success"]["value"] == 1.0
    assert m["families"]["logistics"]["faithful"]["value"] == 0.0
    assert m["planbench_average"]["success"] == pytest.approx((1.0 + 0.5) / 2)
    assert m["transfer"]["overall"]["exact_match"]["value"] == 0.5


def test_csr_and_marginal_gains():
    o = compute_metrics(RECS, bootstrap=0)["overall"]
    assert [c["value"] for c in o["csr"]] == [0.4, 0.6, 0.8, 0.8, 0.8, 0.8]
    assert [d["value"] for d in o["delta"]] == [0.2, 0.2, 0.0, 0.0, 0.0]


def test_heatmap_counts_unsolved_tasks_after_each_step():
    o = compute_metrics(RECS, bootstrap=0)["overall"]
    h0 = o["heatmap"][0]
    assert h0["unsolved"] == 3 and h0["dominant"] == "syntax"  # b, d: syntax; e: predicate_schema
    assert h0["shares"]["syntax"] == pytest.approx(2 / 3, abs=1e-4)
    h1 = o["heatmap"][1]
    assert h1["unsolved"] == 2 and h1["shares"]["object_type"] == 0.5  # d, e
    assert o["heatmap"][3]["unsolved"] == 1 and o["heatmap"][3]["dominant"] == "syntax"


def test_judge_groups_follow_the_actor_spec():
    j = compute_metrics(RECS, bootstrap=0)["overall"]["judge"]
    # the Actor's spec: a F, c D; b, d, e failed at step 0 -> U
    assert (j["U"]["n"], j["D"]["n"], j["F"]["n"]) == (3, 1, 1)
    assert j["U"]["mean"] == pytest.approx(0.2)
    assert j["auc_f_vs_d"] == 1.0


def test_bootstrap_intervals_bracket_the_rate_and_are_seeded():
    hits = [1] * 30 + [0] * 70
    r = Bootstrap(100, 2000, seed=1).rate(hits)
    assert r["value"] == 0.3 and r["ci"][0] < 0.3 < r["ci"][1]
    assert 0.18 < r["ci"][0] < 0.24 and 0.36 < r["ci"][1] < 0.42
    assert Bootstrap(100, 2000, seed=1).rate(hits) == r
    cond = Bootstrap(4, 500).rate([1, 0, 1, 1], [True, True, False, False])
    assert cond["value"] == 0.5 and cond["n"] == 2
    m = compute_metrics(RECS, bootstrap=300)
    for key in ("success", "faithful", "drift", "gap"):
        lo, hi = m["overall"][key]["ci"]
        assert lo <= m["overall"][key]["value"] <= hi


def test_no_judge_and_empty_inputs():
    recs = [dict(r, judge_score=None) for r in RECS if r.get("kind") == "planning"]
    m = compute_metrics(recs, bootstrap=0)
    assert m["overall"]["judge"] is None and m["transfer"] is None
    empty = compute_metrics([], bootstrap=0)
    assert empty["success"] is None and empty["families"] == {}
