"""The evaluation metrics on hand-built trace records (numbers worked out by hand)."""

from __future__ import annotations

import pytest

from omtr.evaluation.metrics import Bootstrap, compute_metrics, paper_average, weighted_auc
from omtr.faithfulness.separation import auc


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
    avg = m["paper_average"]  # only two of the paper's four domains are in RECS
    assert avg["sets"] == {"blocksworld": "blocksworld", "logistics": "logistics"}
    assert avg["missing"] == ["mystery_blocksworld", "gripper"] and not avg["complete"]
    assert avg["success"] is None and avg["partial_success"] == pytest.approx((1.0 + 0.5) / 2)
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
    j = compute_metrics(RECS, bootstrap=0)["overall"]["judge"]["actor"]
    # the Actor's spec: a F, c D; b, d, e failed at step 0 -> U
    assert (j["U"]["n"], j["D"]["n"], j["F"]["n"]) == (3, 1, 1)
    assert j["U"]["mean"] == pytest.approx(0.2)
    assert j["auc"]["value"] == 1.0


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


def _block(success, faithful=None):
    return {"success": {"value": success}, "faithful": {"value": faithful}}


def test_paper_average_is_over_the_papers_four_domains():
    """BlocksWorld, Mystery BlocksWorld, Logistics, Gripper; PlanBench's main configuration before a
    generated set of the same family; Depots and the 3-block configurations on their own only."""
    table = {
        "planbench/blocksworld": _block(0.8, 0.6), "planbench/blocksworld_3": _block(0.1, 0.1),
        "blocksworld": _block(0.0, 0.0), "planbench/mystery_blocksworld": _block(0.4, 0.2),
        "planbench/logistics": _block(0.2, 0.2), "gripper": _block(0.6, 0.5), "planbench/depots": _block(1.0, 1.0),
    }
    avg = paper_average(table)
    assert avg["complete"] and avg["missing"] == []
    assert avg["sets"] == {"blocksworld": "planbench/blocksworld", "mystery_blocksworld": "planbench/mystery_blocksworld",
                           "logistics": "planbench/logistics", "gripper": "gripper"}
    assert avg["success"] == pytest.approx((0.8 + 0.4 + 0.2 + 0.6) / 4)
    assert avg["faithful"] == pytest.approx((0.6 + 0.2 + 0.2 + 0.5) / 4)
    assert "Gripper" in avg["name"]
    assert avg["partial_success"] == avg["success"]
    del table["planbench/blocksworld"]  # then the generated BlocksWorld set stands in
    assert paper_average(table)["sets"]["blocksworld"] == "blocksworld"
    del table["gripper"]
    assert paper_average(table)["success"] is None and paper_average(table)["missing"] == ["gripper"]


def test_planbench_configurations_and_generated_tasks_stay_apart():
    recs = [dict(_ep("p1", "blocksworld", [None]), set="planbench/blocksworld"),
            dict(_ep("p2", "blocksworld", ["syntax"]), set="planbench/blocksworld_3"),
            dict(_ep("g1", "blocksworld", [None], drift="goal_weakened")),
            dict(_ep("d1", "depots", [None]), set="planbench/depots")]
    m = compute_metrics(recs, bootstrap=0)
    assert list(m["families"]) == ["planbench/blocksworld", "planbench/blocksworld_3", "blocksworld", "planbench/depots"]
    assert m["families"]["planbench/blocksworld_3"]["success"]["value"] == 0.0
    assert m["families"]["blocksworld"]["drift"]["value"] == 1.0
    assert all(b["family"] in ("blocksworld", "depots") for b in m["families"].values())


def _scored(id_, steps, *, drift=None):
    """An episode whose steps are (category or None for success, Judge score)."""
    r = _ep(id_, "gripper", [c for c, _ in steps], drift=drift)
    for st, (_, score) in zip(r["steps"], steps):
        st["judge_score"] = score
    r["judge_score"] = steps[0][1]
    return r


def test_pooled_judge_auc_matches_a_hand_computed_one():
    recs = [
        _scored("a", [(None, 0.9)]),                                  # Actor F 0.9
        _scored("b", [("syntax", 0.5), (None, 0.7)]),                 # U 0.5, Editor F 0.7
        _scored("c", [(None, 0.8)], drift="goal_weakened"),           # Actor D 0.8
        _scored("d", [("syntax", 0.3), (None, 0.75)], drift="object_missing"),  # U 0.3, Editor D 0.75
        _scored("e", [("syntax", 0.1), ("syntax", 0.2)]),            # U 0.1, U 0.2
    ]
    j = compute_metrics(recs, bootstrap=500, seed=3)["overall"]["judge"]
    # pooled F = {0.9, 0.7}, D = {0.8, 0.75}: pairs (0.9>0.8, 0.9>0.75, 0.7<0.8, 0.7<0.75) -> 2/4
    assert (j["pooled"]["F"]["n"], j["pooled"]["D"]["n"], j["pooled"]["U"]["n"]) == (2, 2, 4)
    assert j["pooled"]["auc"]["value"] == 0.5 == j["auc_f_vs_d"]
    assert j["pooled"]["U"]["mean"] == pytest.approx((0.5 + 0.3 + 0.1 + 0.2) / 4)
    # the Actor alone: F = {0.9}, D = {0.8} -> 1.0; b, d, e's Actor specs are U
    assert j["actor"]["auc"]["value"] == 1.0 and j["actor"]["U"]["n"] == 3
    lo, hi = j["auc_ci"]
    assert 0.0 <= lo <= 0.5 <= hi <= 1.0 and lo < hi
    assert j["unscored_steps"] == 0


def test_weighted_auc_agrees_with_the_rank_statistic():
    import numpy as np

    rng = np.random.default_rng(0)
    pos, neg = rng.integers(0, 5, 12).astype(float), rng.integers(0, 5, 9).astype(float)  # many ties
    got = weighted_auc(pos, np.ones(12), neg, np.ones(9))
    assert got == pytest.approx(auc(list(pos), list(neg)))
    w = rng.integers(0, 3, 12).astype(float)
    assert weighted_auc(pos, w, neg, np.ones(9)) == pytest.approx(auc(list(np.repeat(pos, w.astype(int))), list(neg)))


def test_limits_planetarium_rates_and_identical_specs():
    limit = {"success": False, "category": "unreachable_search", "timed_out": True}
    r1 = _ep("a", "gripper", ["syntax", "object_type", None])               # final parses, solved
    r1["faithful"]["identical"] = True
    r2 = _ep("b", "gripper", ["syntax", "syntax"])                          # never parses
    r3 = _ep("c", "gripper", ["syntax", None], drift="goal_weakened")        # solved, drifts
    r4 = _ep("d", "gripper", ["syntax", "syntax"])
    r4["steps"][0]["verdict"] = dict(limit)
    r4["steps"][1]["verdict"] = dict(limit)                                 # parses, timed out twice
    r5 = _ep("e", "depots", [None])
    r5["steps"][0]["verdict"] = {"success": False, "category": "unreachable_search", "memory_out": True}
    r5.update(success=False, actor_success=False, faithful={"reference": True, "checked": False})
    m = compute_metrics([r1, r2, r3, r4, r5], bootstrap=0)
    g = m["families"]["gripper"]
    assert g["limits"] == {"timed_out": 2, "memory_out": 0, "too_large": 0, "calls": 2, "tasks": 1, "final": 1}
    assert m["families"]["depots"]["limits"]["memory_out"] == 1 and m["limits"]["calls"] == 3
    pl = g["planetarium"]
    assert (pl["parseable"]["value"], pl["solvable"]["value"], pl["equivalent"]["value"]) == (0.75, 0.5, 0.25)
    assert m["identical_to_reference"] == 1 and m["overall"]["calls"]["total"] == 3 + 2 + 2 + 2 + 1
