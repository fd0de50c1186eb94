"""``omtr pipeline submit``: what reaches a Kubeflow Pipelines endpoint, and the errors on the way.

No Kubeflow can run here, so the endpoint is a fake: a small HTTP server in this test that speaks
the few routes of the Kubeflow Pipelines v2beta1 API that a submission uses (healthz, experiments,
runs) and records every request. The client side is real: ``omtr pipeline submit`` compiles the
pipeline and submits it with kfp's own ``kfp.Client``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

pytest.importorskip("kfp")
yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "kf-test-token-123"


class FakeKubeflow:
    """A fake Kubeflow Pipelines API (no real one can run here); ``requests`` records each call."""

    def __init__(self, *, require_token: str | None = TOKEN, run_state: str = "SUCCEEDED"):
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _answer(self, code: int, body: dict):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str):
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                url = urlparse(self.path)
                outer.requests.append({"method": method, "path": url.path, "query": parse_qs(url.query),
                                       "auth": self.headers.get("Authorization"),
                                       "body": json.loads(raw) if raw else None})
                if require_token and self.headers.get("Authorization") != f"Bearer {require_token}":
                    return self._answer(401, {"error": "Unauthorized", "code": 16})
                if url.path == "/apis/v2beta1/healthz":
                    return self._answer(200, {"multi_user": False})
                if url.path == "/apis/v2beta1/experiments" and method == "GET":
                    return self._answer(200, {"experiments": [], "total_size": 0})
                if url.path == "/apis/v2beta1/experiments" and method == "POST":
                    return self._answer(200, {"experiment_id": "exp-1", "display_name": outer.requests[-1]["body"]["display_name"]})
                if url.path == "/apis/v2beta1/runs" and method == "POST":
                    return self._answer(200, {"run_id": "run-1", "experiment_id": "exp-1", "state": "PENDING"})
                if url.path == "/apis/v2beta1/runs/run-1" and method == "GET":
                    return self._answer(200, {"run_id": "run-1", "experiment_id": "exp-1", "state": run_state})
                return self._answer(404, {"error": f"no route {method} {url.path}"})

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def _submit(tmp_path, *args, token: str | None = TOKEN, timeout: float = 120):
    env = {**os.environ, "KF_TOKEN": token or ""}
    return subprocess.run([sys.executable, "-m", "omtr", "pipeline", "submit", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_submit_creates_a_run_with_typed_parameters_and_the_token(tmp_path):
    with FakeKubeflow() as kf:
        r = _submit(tmp_path, "--host", kf.url, "--token-env", "KF_TOKEN", "--experiment", "omtr-ci",
                    "--param", "profile=micro", "--param", "n_train=4", "--param", "train_set=cycles=1,updates_per_cycle=1",
                    "--param", "deploy_mode=dry-run", "--run-name", "ci-run", "--service-account", "omtr-deployer",
                    "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout[r.stdout.index("{"): r.stdout.rindex("}") + 1])
    assert out["run_id"] == "run-1" and out["state"] == "SUCCEEDED" and out["url"].endswith("/#/runs/details/run-1")

    assert all(q["auth"] == f"Bearer {TOKEN}" for q in kf.requests)  # every call carries the token
    routes = [(q["method"], q["path"]) for q in kf.requests]
    assert ("POST", "/apis/v2beta1/experiments") in routes and ("GET", "/apis/v2beta1/runs/run-1") in routes
    exp = next(q for q in kf.requests if q["method"] == "POST" and q["path"] == "/apis/v2beta1/experiments")
    assert exp["body"]["display_name"] == "omtr-ci"
    run = next(q for q in kf.requests if q["method"] == "POST" and q["path"] == "/apis/v2beta1/runs")["body"]
    assert run["display_name"] == "ci-run" and run["experiment_id"] == "exp-1" and run["service_account"] == "omtr-deployer"
    params = run["runtime_config"]["parameters"]
    assert params == {"profile": "micro", "n_train": 4, "train_set": ["cycles=1", "updates_per_cycle=1"],
                      "deploy_mode": "dry-run"}
    # the compiled pipeline itself, with its Kubernetes platform config, the same as the committed YAML
    spec, platform = yaml.safe_load_all((ROOT / "pipelines" / "omtr_pipeline.yaml").read_text())
    assert run["pipeline_spec"] == {"pipeline_spec": spec, "platform_spec": platform}


def test_wrong_token_is_one_clear_line(tmp_path):
    with FakeKubeflow() as kf:
        r = _submit(tmp_path, "--host", kf.url, "--token-env", "KF_TOKEN", token="stale")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"omtr pipeline: error: Kubeflow at {kf.url} refused the request (HTTP 401): pass a valid one with --token-env or --token-file"]
    assert not [q for q in kf.requests if q["path"] == "/apis/v2beta1/runs"]


def test_no_token_where_one_is_needed(tmp_path):
    with FakeKubeflow() as kf:
        r = _submit(tmp_path, "--host", kf.url)
    assert r.returncode == 2 and "it needs a token: --token-env NAME or --token-file PATH" in r.stderr


def test_unreachable_host_and_bad_input(tmp_path):
    r = _submit(tmp_path, "--host", "http://127.0.0.1:9", "--token-env", "KF_TOKEN")
    assert r.returncode == 2 and "Kubeflow at http://127.0.0.1:9 cannot be reached" in r.stderr and "--host" in r.stderr
    assert "Traceback" not in r.stderr
    r = _submit(tmp_path, "--host", "http://127.0.0.1:9", "--token-env", "KF_TOKEN", token="")
    assert r.returncode == 2 and "--token-env KF_TOKEN: the variable is not set or empty" in r.stderr
    r = _submit(tmp_path, "--host", "http://127.0.0.1:9", "--param", "n_trian=4")
    assert r.returncode == 2 and "--param n_trian: the pipeline has no such parameter" in r.stderr
    r = _submit(tmp_path, "--host", "http://127.0.0.1:9", "--token-file", str(tmp_path / "nope"))
    assert r.returncode == 2 and f"--token-file {tmp_path / 'nope'}: cannot read it" in r.stderr


def test_a_failed_run_exits_1(tmp_path):
    with FakeKubeflow(run_state="FAILED") as kf:
        r = _submit(tmp_path, "--host", kf.url, "--token-env", "KF_TOKEN", "--wait",
                    "--package", str(ROOT / "pipelines" / "omtr_pipeline.yaml"))
    assert r.returncode == 1 and "ended FAILED" in r.stdout


def test_pipeline_help_shows_both_the_main_job_and_kubeflow():
    r = subprocess.run([sys.executable, "-m", "omtr", "pipeline", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    assert "--profile" in r.stdout and "{compile,submit}" in r.stdout and "omtr pipeline submit --host" in r.stdout
