"""The statement-rules benchmark's task sample: both modes draw the same tasks, and only the
domain-given one hands the model the reference's domain."""

from __future__ import annotations

import json
from pathlib import Path

from bench_helpers import load_benchmark  # noqa: E402


def _bench():
    return load_benchmark("statement_rules")


def test_full_mode_draws_the_same_tasks_without_a_domain(tmp_path):
    bench = _bench()
    given = bench.build_tasks(tmp_path / "given.jsonl", 1, 1, 7, mode="domain-given")
    full = bench.build_tasks(tmp_path / "full.jsonl", 1, 1, 7, mode="full")
    assert given == full and len(given) == len(bench.PLANBENCH) + len(bench.GENERATED)
    g_rows = [json.loads(x) for x in (tmp_path / "given.jsonl").read_text().splitlines()]
    f_rows = [json.loads(x) for x in (tmp_path / "full.jsonl").read_text().splitlines()]
    assert all(r["domain"] == r["reference"]["domain"] for r in g_rows)
    assert not any("domain" in r for r in f_rows)
    assert [r["nl"] for r in g_rows] == [r["nl"] for r in f_rows]


def _traces(path: Path, rows) -> Path:
    path.mkdir(parents=True)
    with (path / "traces.jsonl").open("w") as fh:
        for tid, score, solved, faithful in rows:
            fh.write(json.dumps({"id": tid, "kind": "planning", "faithful": {"faithful": faithful},
                                 "steps": [{"verdict": {"success": solved}, "judge_score": score}]}) + "\n")
    return path


def test_judge_pool_mixes_evaluations_and_pairs_within_tasks(tmp_path):
    """Two evaluations of the same tasks (one decoder leaves faithful answers, the other unfaithful
    ones): unsolved answers are left out, the pooled AUC counts every faithful/unfaithful pair, the
    within-task AUC only pairs of one task."""
    bench = _bench()
    a = _traces(tmp_path / "scoped", [("t1", 0.9, True, True), ("t2", 0.2, True, True), ("t3", 0.99, False, False)])
    b = _traces(tmp_path / "names", [("t1", 0.5, True, False), ("t2", 0.1, True, False), ("t3", 0.0, True, True)])
    res = bench.judge_pool([str(a), str(b)])
    # faithful 0.9, 0.2, 0.0 against unfaithful 0.5, 0.1: 3 of 6 pairs ordered
    assert res["pooled"]["auc"] == 0.5 and res["pooled"]["faithful"] == 3 and res["pooled"]["unfaithful"] == 2
    assert res["within_task"] == {"auc": 1.0, "pairs": 2, "tasks": 2}
