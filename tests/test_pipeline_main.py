"""The main job end to end on the `micro` profile (a random tiny model: the plumbing, not the
learning): a parent run with nested step runs passing artifacts, validated episode logs, a
registered version with the untrained model's metrics as `baseline.*` tags, which the gate refuses
(micro learns nothing in one update, so it does not beat the model it started from) until it is
forced to `champion`; then a run without the baseline step whose identical steps are reused and
whose new version ties with the champion and stays challenger; then a run that reuses the baseline evaluation."""

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


def _env(uri):
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    for k in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID"):
        env.pop(k, None)
    return env


def _pipeline(tmp_path, uri, *extra):
    env = _env(uri)
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
    assert set(steps) == {"prepare", "train", "evaluate", "evaluate-baseline", "validate", "register", "promote"}
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

    base = steps["evaluate-baseline"]
    assert {"report.html", "metrics.json", "episodes.parquet"} <= set(files(base.info.run_id))
    assert base.data.params["evaluate-baseline.model"] == "micro"  # the model training started from
    assert base.data.params["evaluate-baseline.decoding"] == "off"  # as micro trains it (grammar=False)

    v1 = client.get_model_version(NAME, "1")
    assert first["register"]["version"] == "1" and first["register"]["baseline"]
    assert v1.tags["omtr.train_run_id"] == steps["train"].info.run_id
    assert v1.tags["omtr.eval_run_id"] == steps["evaluate"].info.run_id
    assert v1.tags["omtr.baseline_run_id"] == base.info.run_id and v1.tags["omtr.baseline_model"] == "micro"
    assert float(v1.tags["metric.calls"]) == 2.0  # micro never succeeds: every task used its budget
    paired = {"faithful_diff", "faithful_diff_low", "faithful_diff_high", "paired_tasks", "paired_bootstrap",
              "paired_seed", "paired_trained", "paired_untrained"}
    assert {k[len("metric."):] for k in v1.tags if k.startswith("metric.")} == \
        {k[len("baseline."):] for k in v1.tags if k.startswith("baseline.")} - paired
    # both evaluations' records, paired on the 2 validation tasks
    assert v1.tags["baseline.paired_tasks"] == "2" and float(v1.tags["baseline.faithful_diff"]) == 0.0
    assert float(v1.tags["baseline.faithful"]) == 0.0 and float(v1.tags["baseline.calls"]) == 2.0
    # trained or not, micro solves nothing: the version does not beat its baseline and is refused
    assert not first["promote"]["promoted"]
    assert ("faithful success 0 against the untrained model's 0 (baseline.faithful), paired difference +0.000, 95% "
            "interval [+0.000, +0.000] over 2 paired tasks: a tie is no improvement") in first["promote"]["reason"]
    assert alias(client, "champion") is None and alias(client, "challenger") == "1"
    assert json.loads(v1.tags["omtr.promotion"])["baseline"]["faithful"] == 0.0
    forced = subprocess.run([sys.executable, "-m", "omtr", "promote", "--name", NAME, "--version", "1", "--force"],
                            env=_env(uri), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert forced.returncode == 0 and "forced (the rule said no: faithful success 0 against" in forced.stdout
    assert alias(client, "champion") == "1"

    # Second run, without the baseline step: one planner call per validation task. Tasks and
    # training are identical (reused); evaluation, registration and promotion run again; the new
    # version, with no baseline, ties with the champion on faithful success: fewer calls do not
    # count, and the champion stays.
    second = _pipeline(tmp_path, uri, "--eval-budget", "1", "--steps", "prepare,train,evaluate,validate,register,promote")
    assert second["prepare"]["skipped"] and second["train"]["skipped"]
    assert second["prepare"]["run_id"] == steps["prepare"].info.run_id
    assert not second["evaluate"]["skipped"] and second["register"]["version"] == "2"
    assert "evaluate-baseline" not in second and not second["register"]["baseline"]
    assert not second["promote"]["promoted"] and "tied with champion 1" in second["promote"]["reason"]
    assert str(client.get_model_version_by_alias(NAME, "champion").version) == "1"
    children2 = client.search_runs([exp], f"tags.mlflow.parentRunId = '{second['parent_run_id']}'")
    reused = [r for r in children2 if r.data.tags.get("omtr.reused_run")]
    assert {r.data.tags["omtr.step"] for r in reused} == {"prepare", "train"}
    v2 = client.get_model_version(NAME, "2")
    assert not any(k.startswith("baseline.") for k in v2.tags)
    decision = json.loads(v2.tags["omtr.promotion"])
    assert decision["champion"]["version"] == "1" and decision["rule"] == "point"
    assert decision["baseline"] is None and "no baseline recorded" in decision["baseline_check"]

    # Third run: the first run's settings but another serving budget. Everything up to registration
    # is reused, the baseline evaluation included; the new version carries the same baseline, and
    # the gate refuses it before the rule compares it with the champion.
    third = _pipeline(tmp_path, uri, "--serve-budget", "3")
    assert third["evaluate-baseline"]["skipped"] and third["evaluate-baseline"]["run_id"] == base.info.run_id
    children3 = client.search_runs([exp], f"tags.mlflow.parentRunId = '{third['parent_run_id']}'")
    assert {r.data.tags["omtr.step"] for r in children3 if r.data.tags.get("omtr.reused_run")} == \
        {"prepare", "train", "evaluate", "evaluate-baseline", "validate"}
    assert third["register"]["version"] == "3" and not third["promote"]["promoted"]
    assert client.get_model_version(NAME, "3").tags["omtr.baseline_run_id"] == base.info.run_id
    assert "is not more faithful than the model training started from" in third["promote"]["reason"]
    assert alias(client, "champion") == "1"


def alias(client, name):
    try:
        return str(client.get_model_version_by_alias(NAME, name).version)
    except mlflow.exceptions.MlflowException:
        return None


# A killed main job resuming from its checkpoint: tests/test_pipeline_postgres.py (on a PostgreSQL-backed
# server, so the chain runs once for both).
