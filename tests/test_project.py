"""The main job and the MLflow project, against a real SQLite tracking store."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _env(tmp_path):
    env = dict(os.environ)
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlruns.db'}"
    env.pop("CI", None)
    return env


def _runs(tmp_path, experiment):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns.db'}")
    exp = mlflow.get_experiment_by_name(experiment)
    assert exp is not None, "the experiment was not created"
    return mlflow.search_runs([exp.experiment_id], output_format="list")


@pytest.mark.slow
def test_demo_logs_metrics_and_artifacts_to_mlflow(tmp_path):
    r = subprocess.run([sys.executable, "-m", "omtr", "demo", "--n", "4", "--out", str(tmp_path / "out"),
                        "--experiment", "t-demo"], capture_output=True, text=True, cwd=tmp_path, env=_env(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    from omtr.solver.examples import ALL

    assert f"hand-written specs with the expected category: {len(ALL)}/{len(ALL)}" in r.stdout
    (run,) = _runs(tmp_path, "t-demo")
    m = run.data.metrics
    assert m["handwritten_category_accuracy"] == 1.0
    for fam in ("blocksworld", "mystery_blocksworld", "logistics"):
        assert m[f"success_rate_{fam}"] == 1.0
    assert m["calls_per_s_warm_cache"] > m["calls_per_s_cold"]
    assert run.data.params["search"] == "lama-first"
    import mlflow

    files = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id)}
    assert {"verdicts.jsonl", "categories.png"} <= files


@pytest.mark.slow
def test_mlflow_run_demo_entry_point(tmp_path):
    mlflow_bin = Path(sys.executable).parent / "mlflow"
    if not mlflow_bin.exists():
        mlflow_bin = shutil.which("mlflow")
    env = _env(tmp_path)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    r = subprocess.run([str(mlflow_bin), "run", str(REPO), "-e", "demo", "--env-manager", "local",
                        "--experiment-name", "t-project", "-P", "n=2", "-P", "workers=1"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert r.returncode == 0, (r.stdout[-1500:], r.stderr[-3000:])
    runs = _runs(tmp_path, "t-project")
    assert any(run.data.metrics.get("handwritten_category_accuracy") == 1.0 for run in runs)
