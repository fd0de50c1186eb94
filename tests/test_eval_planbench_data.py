"""PlanBench ships inside omtr: read in place, equal byte for byte to the upstream folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omtr.cli import main
from omtr.paths import benchmarks_dir
from omtr.tasks.planbench import import_planbench
from omtr.tasks.planbench_data import MEMBERS, UPSTREAM_COMMIT, data_dir, shipped_root, upstream

BESIDE = benchmarks_dir()


def test_shipped_copy_has_licence_upstream_and_the_needed_files():
    root = shipped_root()
    assert (data_dir() / "LICENSE").read_text().startswith("MIT License")
    assert upstream() == f"karthikv792/LLMs-Planning@{UPSTREAM_COMMIT}"
    assert (root / "LICENSE").read_bytes() == (data_dir() / "LICENSE").read_bytes()
    for m in MEMBERS:
        assert (root / m).exists(), m
    # compressed, about 150 KB for ~2,000 files
    size = (data_dir() / "planbench.tar.xz").stat().st_size if hasattr(data_dir(), "stat") else 0
    assert size == 0 or size < 300_000


def test_import_from_the_shipped_copy_reads_every_family():
    tasks = import_planbench(shipped_root())
    fams = {}
    for t in tasks:
        fams[t.family] = fams.get(t.family, 0) + 1
    assert fams == {"blocksworld": 602, "mystery_blocksworld": 602, "logistics": 286, "depots": 501}
    assert all(t.reference is not None for t in tasks)


@pytest.mark.skipif(BESIDE is None, reason="no PlanBench folder beside the checkout (set OMTR_BENCHMARKS)")
def test_shipped_copy_equals_the_folder_beside_the_checkout_byte_for_byte():
    src = BESIDE / "planbench"
    shipped = dict(shipped_root().walk_files())
    expected = {}
    for m in MEMBERS:
        p = src / m
        for f in (sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p]):
            expected[f.relative_to(src).as_posix()] = f
    assert sorted(shipped) == sorted(expected)
    diff = [name for name, data in shipped.items() if expected[name].read_bytes() != data]
    assert diff == []


def test_import_planbench_without_a_path_uses_the_shipped_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("OMTR_BENCHMARKS", str(tmp_path / "nowhere"))
    out = tmp_path / "pb.jsonl"
    assert main(["-q", "tasks", "import-planbench", "--family", "logistics", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 286 and rows[0]["family"] == "logistics"
    assert "For example" in rows[0]["nl"]  # the prompts' longer Logistics domain text
