"""``omtr evaluate --solver-url``: the evaluation verifies its specs on a real solver service
(`omtr solver serve` on loopback), not on local workers: the service counts every call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet_helpers import Server  # noqa: E402


def _omtr(tmp_path, *args, env=None):
    r = subprocess.run([sys.executable, "-m", "omtr", "-q", *args], cwd=tmp_path, capture_output=True, text=True,
                       timeout=240, env={**os.environ, **(env or {})})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return r


def test_oracle_evaluation_on_the_fleet(tmp_path):
    tasks = tmp_path / "val.jsonl"
    _omtr(tmp_path, "tasks", "generate", "--family", "blocksworld", "--n", "3", "--seed", "1", "--min-objects", "2",
          "--max-objects", "3", "--no-verify", "--out", str(tasks))
    with Server(tmp_path) as fleet:
        _omtr(tmp_path, "evaluate", "--policy", "oracle", "--tasks", str(tasks), "--out", str(tmp_path / "ev"),
              "--budget", "1", "--bootstrap", "20", "--no-report", "--workers", "1", "--solver-url", fleet.url,
              env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlruns.db'}"})
        calls = fleet.metrics().get("omtr_solver_calls_total", 0)
    m = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert m["tasks"] == 3 and m["success"] == 1.0
    assert calls == 3  # one call per task, all on the service


@pytest.mark.slow  # the client retries with backoff before it gives up: about half a minute
def test_unreachable_fleet_is_one_clear_line(tmp_path):
    tasks = tmp_path / "val.jsonl"
    _omtr(tmp_path, "tasks", "generate", "--family", "blocksworld", "--n", "1", "--seed", "1", "--min-objects", "2",
          "--max-objects", "3", "--no-verify", "--out", str(tasks))
    r = subprocess.run([sys.executable, "-m", "omtr", "evaluate", "--policy", "oracle", "--tasks", str(tasks),
                        "--out", str(tmp_path / "ev2"), "--budget", "1", "--no-report", "--solver-url",
                        "http://127.0.0.1:9"], cwd=tmp_path, capture_output=True, text=True, timeout=240,
                       env={**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlruns.db'}"})
    assert r.returncode == 2 and "could not be reached" in r.stderr and "Traceback" not in r.stderr
