"""The main job end to end on the `micro` profile (a random tiny model: the plumbing, not the
learning): a parent run with nested step runs passing artifacts, validated episode logs, a
registered version with `champion`; then a second run whose identical steps are reused and whose
new version is placed by the promotion rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

mlflow = pytest.importorskip("mlflow")
pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

NAME = "omtr-role-model-pipeline-test"


def _pipeline(tmp_path, uri, *extra):
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    for k in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "omtr", "-q", "pipeline", "--profile", "micro", "--n-train", "4", "--n-val", "2",
           "--max-new-tokens", "16", "--bootstrap", "50", "--name", NAME, "--work", str(tmp_path / "work"),
           "--experiment", "main-test", *extra]
    r = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout[r.stdout.index("{"): r.stdout.rindex("}") + 1])


def test_main_chain_nested_runs_registry_and_rule(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)

    first = _pipeline(tmp_path, uri)
    parent = first["parent_run_id"]
    exp = client.get_run(parent).info.experiment_id
    children = client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent}'")
    steps = {r.data.tags["omtr.step"]: r for r in children}
    assert set(steps) == {"prepare", "train", "evaluate", "validate", "register", "promote"}
    assert all(r.info.status == "FINISHED" and r.data.tags.get("omtr.step_done") == "true" for r in children)

    def files(run_id, path=""):
        out = []
        for f in client.list_artifacts(run_id, path):
            out += files(run_id, f.path) if f.is_dir else [f.path]
        return out

    assert {"tasks/train.jsonl", "tasks/val.jsonl"} <= set(files(steps["prepare"].info.run_id))
    train_files = files(steps["train"].info.run_id)
    assert "model/omtr-model.json" in train_files and any(f.startswith("episodes/") and f.endswith(".parquet") for f in train_files)
    eval_files = set(files(steps["evaluate"].info.run_id))
    assert {"report.html", "metrics.json", "episodes.parquet"} <= eval_files
    val = steps["validate"]
    assert val.data.metrics["logs_failed"] == 0 and val.data.metrics["logs_checked"] >= 2
    assert "pipeline.json" in files(parent)

    champion = client.get_model_version_by_alias(NAME, "champion")
    assert str(champion.version) == "1" and first["promote"]["promoted"]
    assert champion.tags["omtr.train_run_id"] == steps["train"].info.run_id
    assert champion.tags["omtr.eval_run_id"] == steps["evaluate"].info.run_id
    assert float(champion.tags["metric.calls"]) == 2.0  # micro never succeeds: every task used its budget

    # Second run: one planner call per validation task. Tasks and training are identical (reused);
    # evaluation, registration and promotion run again; the new version ties on faithful and
    # solver success and wins on fewer calls.
    second = _pipeline(tmp_path, uri, "--eval-budget", "1")
    assert second["prepare"]["skipped"] and second["train"]["skipped"]
    assert second["prepare"]["run_id"] == steps["prepare"].info.run_id
    assert not second["evaluate"]["skipped"] and second["register"]["version"] == "2"
    assert second["promote"]["promoted"] and "fewer" in second["promote"]["reason"]
    assert str(client.get_model_version_by_alias(NAME, "champion").version) == "2"
    children2 = client.search_runs([exp], f"tags.mlflow.parentRunId = '{second['parent_run_id']}'")
    reused = [r for r in children2 if r.data.tags.get("omtr.reused_run")]
    assert {r.data.tags["omtr.step"] for r in reused} == {"prepare", "train"}
    decision = json.loads(client.get_model_version(NAME, "2").tags["omtr.promotion"])
    assert decision["champion"]["version"] == "1" and decision["rule"] == "point"


# A killed main job resuming from its checkpoint: tests/test_pipeline_postgres.py (on a PostgreSQL-backed
# server, so the chain runs once for both).
