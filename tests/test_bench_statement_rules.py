"""The statement-rules benchmark's task sample: both modes draw the same tasks, and only the
domain-given one hands the model the reference's domain."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_statement_rules", ROOT / "benchmarks" / "statement_rules.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
