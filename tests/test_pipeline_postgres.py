"""The main job against an MLflow tracking server whose backend store is a real PostgreSQL and whose
artifacts the server serves (`--serve-artifacts`), killed mid-training and run again: the setting
a team's shared server and a pre-empted node give. PostgreSQL (Debian's package) is started by the
test in a temporary folder as a non-root user; the pipeline runs on the `micro` profile (a random
tiny model: the plumbing, not the learning). One test carries both (the store and the resume), so
CI runs the whole chain once for them instead of twice."""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")
pytest.importorskip("psycopg2", reason="psycopg2-binary is needed for a PostgreSQL backend store")

from fleet_helpers import mlflow_tracking_server  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

NAME = "omtr-role-model-pg-test"


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_user(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run as `nobody` then."""
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", "nobody", "--", *cmd]


@pytest.fixture()
def postgres(tmp_path):
    bin_dir = _pg_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (Debian: apt-get install postgresql; .ci/run does it)")
    # a folder `nobody` can reach (pytest's tmp_path sits under a 0700 folder)
    root = Path(tempfile.mkdtemp(prefix="omtr-pg-"))
    os.chmod(root, 0o755)
    data = root / "data"
    data.mkdir()
    if os.geteuid() == 0:
        shutil.chown(data, "nobody", "nogroup")
    port = _port()
    subprocess.run(_as_user([str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "omtr", "--no-sync"]),
                   check=True, capture_output=True, cwd=root)
    subprocess.run(_as_user([str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(data / "log.txt"), "-w", "-o",
                             f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off", "start"]),
                   check=True, capture_output=True, cwd=root)
    try:
        yield f"postgresql+psycopg2://omtr@127.0.0.1:{port}/postgres"  # SQLAlchemy 2.1 defaults to psycopg 3
    finally:
        subprocess.run(_as_user([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture()
def tracking_server(postgres, tmp_path):
    with mlflow_tracking_server(postgres, tmp_path, _port()) as url:
        yield url


def test_a_killed_main_job_on_a_postgres_backed_server_resumes_from_its_checkpoint(tracking_server, tmp_path):
    """SIGKILL the whole main job (process group) once training has written its first checkpoint;
    the re-run reuses the finished tasks step, reopens the same training run (no second one) and
    continues from the checkpoint instead of starting over, then finishes the chain. Every run,
    artifact and model version lives on the server (PostgreSQL rows, served artifacts)."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_server}
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

    client = mlflow.MlflowClient(tracking_uri=tracking_server, registry_uri=tracking_server)
    exp = client.get_experiment_by_name("resume-test").experiment_id
    trains = client.search_runs([exp], "tags.`omtr.step` = 'train'")
    assert len(trains) == 1 and trains[0].info.status == "FINISHED", "one training run, reopened and finished"
    metrics = [json.loads(line) for line in
               next((tmp_path / "work").glob("train-*/metrics.jsonl")).read_text().splitlines() if line.strip()]
    updates = [m["update"] for m in metrics]
    assert updates == sorted(set(updates)) and updates[-1] == 4, "every update once, none repeated from the start"
    resumed = re.search(r"resumed from \S+: update (\d+) of 4", r.stdout + r.stderr)
    assert resumed and int(resumed.group(1)) >= 2, "training continued from the first cycle's checkpoint"

    summary = json.loads(r.stdout[r.stdout.index("{"): r.stdout.rindex("}") + 1])
    parent = client.get_run(summary["parent_run_id"])
    children = client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    # the re-run's steps are its children, but for training: its run is the killed job's, reopened
    assert {c.data.tags["omtr.step"] for c in children} == {"prepare", "evaluate", "evaluate-baseline", "validate",
                                                             "register", "promote"}
    assert parent.info.artifact_uri.startswith("mlflow-artifacts:")  # served by the server, not a local path
    assert "report.html" in {f.path for f in client.list_artifacts(summary["evaluate"]["run_id"])}
    # the chain finished: version 1 registered with its baseline; micro does not beat the model it
    # started from, so the gate leaves it a challenger
    v1 = client.get_model_version(NAME, "1")
    assert v1.tags.get("omtr.baseline_run_id") and "baseline.faithful" in v1.tags
    assert "is not more faithful than the model training started from" in summary["promote"]["reason"]
    assert str(client.get_model_version_by_alias(NAME, "challenger").version) == "1"
    # nothing was written to a local store: the runs live in PostgreSQL
    assert not (tmp_path / "mlruns.db").exists() and not (tmp_path / "mlruns").exists()
