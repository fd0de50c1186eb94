"""The main job end to end on the `micro` profile (a random tiny model: the plumbing, not the
learning): a parent run with nested step runs passing artifacts, validated episode logs, a
registered version with the untrained model's metrics as `baseline.*` tags, which the gate refuses
(micro learns nothing in one update, so it does not beat the model it started from) until it is
forced to `champion`; then a run without the baseline step whose identical steps are reused and
whose new version is placed by the promotion rule; then a run that reuses the baseline evaluation."""

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
    assert {k[len("metric."):] for k in v1.tags if k.startswith("metric.")} == \
        {k[len("baseline."):] for k in v1.tags if k.startswith("baseline.")}
    assert float(v1.tags["baseline.faithful"]) == 0.0 and float(v1.tags["baseline.calls"]) == 2.0
    # trained or not, micro solves nothing: the version does not beat its baseline and is refused
    assert not first["promote"]["promoted"]
    assert "faithful success 0 does not beat the untrained model's 0 (baseline.faithful)" in first["promote"]["reason"]
    assert alias(client, "champion") is None and alias(client, "challenger") == "1"
    assert json.loads(v1.tags["omtr.promotion"])["baseline"]["faithful"] == 0.0
    forced = subprocess.run([sys.executable, "-m", "omtr", "promote", "--name", NAME, "--version", "1", "--force"],
                            env=_env(uri), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert forced.returncode == 0 and "forced (the rule said no: faithful success 0 does not beat" in forced.stdout
    assert alias(client, "champion") == "1"

    # Second run, without the baseline step: one planner call per validation task. Tasks and
    # training are identical (reused); evaluation, registration and promotion run again; the new
    # version, with no baseline, ties on faithful and solver success and wins on fewer calls.
    second = _pipeline(tmp_path, uri, "--eval-budget", "1", "--steps", "prepare,train,evaluate,validate,register,promote")
    assert second["prepare"]["skipped"] and second["train"]["skipped"]
    assert second["prepare"]["run_id"] == steps["prepare"].info.run_id
    assert not second["evaluate"]["skipped"] and second["register"]["version"] == "2"
    assert "evaluate-baseline" not in second and not second["register"]["baseline"]
    assert second["promote"]["promoted"] and "fewer" in second["promote"]["reason"]
    assert str(client.get_model_version_by_alias(NAME, "champion").version) == "2"
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
    assert "does not beat the untrained model's" in third["promote"]["reason"]
    assert alias(client, "champion") == "2"


def alias(client, name):
    try:
        return str(client.get_model_version_by_alias(NAME, name).version)
    except mlflow.exceptions.MlflowException:
        return None


def test_a_killed_main_job_resumes_training_from_its_checkpoint(tmp_path):
    """SIGKILL the whole main job (process group) once training has written its first checkpoint;
    the re-run reuses the finished tasks step, reopens the same training run (no second one) and
    continues from the checkpoint instead of starting over, then finishes the chain."""
    import signal
    import time

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    for k in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "omtr", "pipeline", "--profile", "micro", "--n-train", "4", "--n-val", "2",
           "--max-new-tokens", "16", "--bootstrap", "50", "--name", NAME, "--work", str(tmp_path / "work"),
           "--experiment", "resume-test",
           "--set", "cycles=2", "--set", "updates_per_cycle=2"]  # a checkpoint after update 2 of 4
    log = open(tmp_path / "first.log", "w")
    p = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 600
    try:
        while not list((tmp_path / "work").glob("train-*/checkpoints/latest")):
            assert p.poll() is None, "the job ended before its first checkpoint: " + (tmp_path / "first.log").read_text()[-2000:]
            assert time.time() < deadline, "no checkpoint within 10 minutes"
            time.sleep(0.2)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        log.close()
    assert p.returncode == -signal.SIGKILL
    r = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "[prepare] reused: same parameters, inputs and source" in r.stdout
    assert "[train] continuing unfinished run" in r.stdout and "[train] resuming from the checkpoint" in r.stdout
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    exp = client.get_experiment_by_name("resume-test").experiment_id
    trains = [r for r in client.search_runs([exp], "tags.`omtr.step` = 'train'")]
    assert len(trains) == 1 and trains[0].info.status == "FINISHED", "one training run, reopened and finished"
    metrics = [json.loads(line) for line in
               next((tmp_path / "work").glob("train-*/metrics.jsonl")).read_text().splitlines() if line.strip()]
    updates = [m["update"] for m in metrics]
    assert updates == sorted(set(updates)) and updates[-1] == 4, "every update once, none repeated from the start"
    import re

    resumed = re.search(r"resumed from \S+: update (\d+) of 4", r.stdout + r.stderr)
    assert resumed and int(resumed.group(1)) >= 2, "training continued from the first cycle's checkpoint"
    # the chain finished: version 1 registered with its baseline (micro does not beat it, so no champion)
    v1 = client.get_model_version(NAME, "1")
    assert "baseline.faithful" in v1.tags and json.loads(v1.tags["omtr.promotion"])["promote"] is False
