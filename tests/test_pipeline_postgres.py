"""The main job against an MLflow tracking server whose backend store is a real PostgreSQL and whose
artifacts the server serves (`--serve-artifacts`). PostgreSQL (Debian's package) is started by the
test in a temporary folder as a non-root user; the pipeline runs on the `micro` profile (a random
tiny model: the plumbing, not the learning)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
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


def test_main_against_a_postgres_backed_server(tracking_server, tmp_path):
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_server}
    for k in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "omtr", "-q", "pipeline", "--profile", "micro", "--n-train", "4", "--n-val", "2",
           "--max-new-tokens", "16", "--bootstrap", "50", "--name", NAME, "--work", str(tmp_path / "work")]
    r = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads(r.stdout[r.stdout.index("{"): r.stdout.rindex("}") + 1])
    client = mlflow.MlflowClient(tracking_uri=tracking_server, registry_uri=tracking_server)
    parent = client.get_run(summary["parent_run_id"])
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert {c.data.tags["omtr.step"] for c in children} == {"prepare", "train", "evaluate", "evaluate-baseline",
                                                             "validate", "register", "promote"}
    assert parent.info.artifact_uri.startswith("mlflow-artifacts:")  # served by the server, not a local path
    ev = summary["evaluate"]["run_id"]
    assert "report.html" in {f.path for f in client.list_artifacts(ev)}
    # version 1 carries the untrained model's metrics, read from the server; micro does not beat them
    v1 = client.get_model_version(NAME, "1")
    assert v1.tags["omtr.baseline_run_id"] == summary["evaluate-baseline"]["run_id"] and "baseline.faithful" in v1.tags
    assert not summary["promote"]["promoted"] and "does not beat the untrained model's" in summary["promote"]["reason"]
    assert str(client.get_model_version_by_alias(NAME, "challenger").version) == "1"
    # nothing was written to a local store: the runs live in PostgreSQL
    assert not (tmp_path / "mlruns.db").exists()
