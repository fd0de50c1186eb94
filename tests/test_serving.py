"""The registered role model served for real: `mlflow models serve -m models:/NAME@champion`.

The model is built from the `micro` profile (a random ~1M-parameter Qwen2 with its own tokenizer):
its answers are not good PDDL, but the path is the one SmolLM2 or the paper's model takes —
model files logged as artifacts, registration with metric tags, promotion to `champion`, the
scoring server loading it from the registry, the Actor -> planner -> Editor loop per request,
400s for bad requests while the server stays up. A pretrained LM is not needed to prove that.

The server runs with MLflow's uv environment manager: it builds the model's own environment from
the logged requirements alone (omtr's wheel from the model, everything else pinned, from wheels)
in a fresh MLflow env root, so nothing of this checkout's venv is used. uv takes pip's find-links
(``UV_FIND_LINKS``) so that torch resolves to the CPU build on the machine's disk. Building that
environment is the slow part of this test (see the report printed at the end).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import shutil

import pytest

from omtr.paths import free_port

mlflow = pytest.importorskip("mlflow")
pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

NAME = "omtr-role-model-serving-test"


def _post(url: str, body, *, raw: bytes | None = None, timeout: float = 300):
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        text = e.read().decode(errors="replace")
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, {"message": text}


@pytest.fixture()
def registered(tmp_path, monkeypatch):
    """A micro model registered and promoted to champion in a fresh SQLite registry."""
    from omtr.model import build_model
    from omtr.tracking.pyfunc import ServingLimits
    from omtr.tracking.registry import CHAMPION, promote, register

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    model_dir = build_model("micro").save(tmp_path / "model")
    limits = ServingLimits(max_tasks=3, max_task_chars=500, budget=2, max_new_tokens=16, time_limit_s=10)
    metrics = {"success": 0.0, "faithful": 0.0, "calls": 2.0, "overall": {"faithful": {"ci": [0.0, 0.0]}}}
    info = register(str(model_dir), name=NAME, metrics=metrics, train_run_id="train-run", eval_run_id="eval-run",
                    limits=limits, tracking_uri=uri)
    assert promote(NAME, info["version"], tracking_uri=uri).promote
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    mv = client.get_model_version_by_alias(NAME, CHAMPION)
    assert mv.tags["metric.faithful"] == "0.0" and mv.tags["omtr.eval_run_id"] == "eval-run"
    assert mv.tags["omtr.train_run_id"] == "train-run"
    # the logged model holds the model directory's files, not a pickled model object
    local = Path(mlflow.artifacts.download_artifacts(f"models:/{NAME}@{CHAMPION}", tracking_uri=uri))
    files = {p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()}
    assert any(f.endswith("omtr-model.json") for f in files)
    assert any(f.endswith("adapters/actor.safetensors") for f in files)
    assert any(f.startswith("serving_input_example") or f.startswith("input_example") for f in files)
    yield uri, info
    while mlflow.active_run():
        mlflow.end_run()
    mlflow.tracking.fluent._active_experiment_id = None
    mlflow.set_tracking_uri(None)


def _uv_env(tmp_path: Path, bin_dir: str) -> dict:
    """The environment for `mlflow models serve --env-manager uv`: a fresh env root, pip's find-links
    for uv, no Python downloads (the machine's 3.11 is the model's)."""
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
           "MLFLOW_ENV_ROOT": str(tmp_path / "mlflow-envs"), "UV_PYTHON_DOWNLOADS": "never"}
    links = os.environ.get("UV_FIND_LINKS") or os.environ.get("PIP_FIND_LINKS")
    if links:
        env["UV_FIND_LINKS"] = links
    return env


def test_serve_champion_answers_tasks_and_rejects_bad_requests(registered, tmp_path):
    uri, info = registered
    port = free_port()
    bin_dir = str(Path(sys.executable).parent)  # `mlflow models serve` execs uv from here
    if shutil.which("uv", path=bin_dir) is None and shutil.which("uv") is None:
        pytest.skip("uv is not installed: pip install uv (the dev extra carries it)")
    env = {**_uv_env(tmp_path, bin_dir), "MLFLOW_TRACKING_URI": uri}
    env.pop("MLFLOW_RUN_ID", None)
    log = open(tmp_path / "serve.log", "wb")
    t0 = time.monotonic()
    proc = subprocess.Popen([os.path.join(bin_dir, "mlflow"), "models", "serve", "-m", f"models:/{NAME}@champion",
                             "--env-manager", "uv", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(base + "/ping", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() - t0 < 900, "server not ready in 900 s:\n" + (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(0.5)
        ready_s = time.monotonic() - t0
        # the server runs in the environment uv built, not in this venv
        envs = list((tmp_path / "mlflow-envs").rglob("site-packages/omtr"))
        assert envs, "no omtr in the built environment"

        tasks = ["There are two blocks, a and b, on the table. Put a on b.",
                 "Three balls are in room A. Carry all of them to room B."]
        t1 = time.monotonic()
        status, body = _post(base + "/invocations", {"inputs": {"task": tasks}})
        request_s = time.monotonic() - t1
        assert status == 200, body
        preds = body["predictions"]
        assert len(preds) == 2
        for task, p in zip(tasks, preds):
            assert p["task"] == task
            assert set(p) >= {"domain", "problem", "plan", "success", "judge_score", "planner_calls", "repair_trace"}
            assert isinstance(p["success"], bool) and 1 <= p["planner_calls"] <= 2
            assert p["judge_score"] is None or 0.0 <= p["judge_score"] <= 1.0
            trace = json.loads(p["repair_trace"])
            assert [s["role"] for s in trace][0] == "actor" and len(trace) == p["planner_calls"]
            assert all(s["role"] == "editor" for s in trace[1:])
            assert p["success"] == trace[-1]["success"]
        # a DataFrame column works too
        status, body = _post(base + "/invocations", {"dataframe_split": {"columns": ["task"], "data": [[tasks[0]]]}})
        assert status == 200 and len(body["predictions"]) == 1

        bad = [
            ({"inputs": {"task": []}}, "no tasks"),
            ({"inputs": {"task": [""]}}, "empty"),
            ({"inputs": {"task": ["x" * 501]}}, "at most 500"),
            ({"inputs": {"task": [1, 2]}}, "no words"),
            ({"inputs": [{"nested": "dict"}]}, "task"),
            ({"inputs": ["a plain list"]}, "missing inputs ['task']"),
            ({"inputs": {"task": ["a task"] * 4}}, "too many tasks"),
        ]
        for req, words in bad:
            status, body = _post(base + "/invocations", req)
            assert 400 <= status < 500, (req, status, body)
            assert words in body.get("message", ""), (req, body)
        status, body = _post(base + "/invocations", None, raw=b"{not json")
        assert 400 <= status < 500
        # still up and answering
        status, body = _post(base + "/invocations", {"inputs": {"task": [tasks[0]]}})
        assert status == 200 and len(body["predictions"]) == 1
        # the domain-given mode: the task comes with its domain, the model writes only the problem
        from omtr.inference.prompts import DEMOS

        domain = DEMOS["blocksworld"].domain
        status, body = _post(base + "/invocations", {"inputs": [{"task": tasks[0], "domain": domain}]})
        assert status == 200, body
        (p,) = body["predictions"]
        assert p["task"] == tasks[0] and p["domain"] == domain  # the given domain is the answer's
        trace = json.loads(p["repair_trace"])
        assert trace and all(s["domain"] == domain for s in trace)
        assert all("(define (domain" not in s["problem"] for s in trace)
        # a given domain that does not lint is the caller's error, named with its task
        broken = domain.replace("(:predicates (clear ?b)", "(:predicates")
        status, body = _post(base + "/invocations", {"inputs": [{"task": tasks[0], "domain": broken}]})
        assert status == 400 and "task 0: its given domain does not lint" in body["message"], body
        # columns: a null domain leaves that task to the model (MLflow's schema keeps the domain column)
        status, body = _post(base + "/invocations", {"inputs": {"task": [tasks[0], tasks[1]], "domain": [domain, None]}})
        assert status == 200, body
        given, free = body["predictions"]
        assert given["domain"] == domain and free["domain"] != domain
        print(f"uv-served model: environment built and server ready in {ready_s:.0f} s, "
              f"a 2-task request answered in {request_s:.1f} s")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
