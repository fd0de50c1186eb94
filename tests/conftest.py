import os
import uuid
from pathlib import Path

import pytest

# Every process this test session starts inherits this tag, so leak checks look only at our own
# planner processes even on a machine where other solver runs are going on.
TAG = f"omtr-test-{uuid.uuid4().hex}"
os.environ["OMTR_TEST_TAG"] = TAG


def _benchmarks() -> Path:
    env = os.environ.get("OMTR_BENCHMARKS")
    root = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "benchmarks"
    return root


@pytest.fixture(scope="session")
def benchmarks() -> Path:
    root = _benchmarks()
    if not (root / "planbench").is_dir():
        pytest.fail(f"PlanBench data not found at {root}; set OMTR_BENCHMARKS")
    return root


def planner_processes() -> list[int]:
    """PIDs of live Fast Downward search or VAL processes started by this test session."""
    from omtr.solver.proc import search_binary, validate_binary

    targets = (search_binary(), validate_binary())
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\x00")[0].decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if argv0 not in targets or state == "Z":
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                mine = TAG.encode() in f.read()
        except OSError:
            continue
        if mine:
            pids.append(int(entry))
    return pids


@pytest.fixture(autouse=True)
def _no_mlflow_environment_leaks():
    """MLflow's fluent API writes the active experiment (and runs launched by ``mlflow run`` the
    run) into ``os.environ``, where every later subprocess would inherit it and log into a store
    it does not belong to. Each test starts and ends with the MLflow variables it found."""
    before = {k: v for k, v in os.environ.items() if k.startswith("MLFLOW_")}
    yield
    for k in [k for k in os.environ if k.startswith("MLFLOW_")]:
        if k not in before:
            del os.environ[k]
    os.environ.update(before)


@pytest.fixture()
def sqlite_registry(tmp_path, monkeypatch):
    """A fresh SQLite tracking store and model registry for this test: (uri, MlflowClient), with the
    environment and mlflow's globals pointing at it and no run or experiment id inherited."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)  # mlflow.set_experiment sets it
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return uri, mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
