"""End to end with real models, a real HTTP server and a real browser (slow).

* the OpenAI-compatible backend against a FastAPI/uvicorn server on loopback that serves the
  ``micro`` model (keys, grammar passthrough, an evaluation through it);
* every baseline and the ``model`` policy on a local model, through ``omtr evaluate``;
* report.html opened in Debian's headless Chromium: tables and images must render.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time

import pytest

from omtr.cli import main
from omtr.evaluation.run import EvalConfig, evaluate
from omtr.inference.backends import BackendAuthError, OpenAIBackend, OpenAIConfig, make_backend
from omtr.inference.registry import make_policy
from omtr.paths import free_port
from omtr.policy import Sampling
from omtr.solver import SolverPool
from omtr.tasks.generators import generate
from omtr.tasks.records import write_tasks

pytestmark = pytest.mark.slow

try:  # the fleet extra; FastAPI resolves the handler's annotation from this module's globals
    import fastapi
    import uvicorn
    from fastapi import Request
except ImportError:  # pragma: no cover
    fastapi = uvicorn = Request = None


@pytest.fixture(scope="module")
def micro():
    return make_backend("hf:micro")


@pytest.fixture(scope="module")
def tasks():
    return generate("gripper", 2, 1, verify=False)


@pytest.fixture(scope="module")
def llm_server(micro):
    """An OpenAI-compatible chat endpoint serving the micro model (grammar honoured, bearer key)."""
    if fastapi is None:
        pytest.skip("fastapi/uvicorn not installed (pip install -e '.[fleet]')")
    app = fastapi.FastAPI()
    lock = threading.Lock()
    seen: list[dict] = []

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        if request.headers.get("authorization") != "Bearer test-key":
            return fastapi.responses.JSONResponse({"error": {"message": "invalid api key"}}, status_code=401)
        body = await request.json()
        seen.append(body)
        s = Sampling(greedy=body.get("temperature", 0) == 0, temperature=body.get("temperature") or 0.7,
                     max_new_tokens=int(body.get("max_tokens", 64)), seed=body.get("seed"))
        with lock:  # one generation at a time, as a single-GPU server would
            [g] = micro.chat([body["messages"]], s, grammar="grammar" in body)
        return {"id": "x", "object": "chat.completion", "model": body.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": g.text},
                             "finish_reason": g.finish_reason}],
                "usage": {"prompt_tokens": g.prompt_tokens, "completion_tokens": len(g.token_ids)}}

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    yield f"http://127.0.0.1:{port}/v1", seen
    server.should_exit = True
    thread.join(10)


def test_openai_backend_against_a_real_server_serving_a_local_model(llm_server, tasks, tmp_path, monkeypatch):
    url, seen = llm_server
    monkeypatch.setenv("OMTR_TEST_LLM_KEY", "wrong")
    with pytest.raises(BackendAuthError, match="401: invalid api key"):
        OpenAIBackend(OpenAIConfig(url=url, key_env="OMTR_TEST_LLM_KEY")).chat([[{"role": "user", "content": "x"}]],
                                                                              Sampling(max_new_tokens=4))
    monkeypatch.setenv("OMTR_TEST_LLM_KEY", "test-key")
    be = OpenAIBackend(OpenAIConfig(url=url, model="micro", key_env="OMTR_TEST_LLM_KEY", grammar="llamacpp",
                                    max_concurrency=2))
    [g] = be.chat([[{"role": "user", "content": "Write PDDL."}]], Sampling(max_new_tokens=24), grammar=True)
    assert g.text.startswith("(define (domain ")  # the server constrained its output with omtr's grammar
    assert seen[-1]["grammar"].startswith("root ::=")

    # a baseline evaluated through the HTTP backend, end to end
    with SolverPool(1) as pool:
        policy = make_policy("cot", tasks=tasks, backend=be, budget=2)
        m = evaluate(tasks, policy, tmp_path, env=pool, policy_name="cot@openai",
                     config=EvalConfig(budget=2, max_new_tokens=24, bootstrap=100, figures=False))
    recs = [json.loads(x) for x in (tmp_path / "traces.jsonl").read_text().splitlines()]
    assert len(recs) == 2 and all(1 <= r["planner_calls"] <= 2 for r in recs)
    assert 0.0 <= m["success"] <= 1.0 and m["episode_log"]["valid"]
    assert len(seen) >= 3


@pytest.mark.parametrize("name", ["tot", "llm+p", "self-refine"])
def test_each_baseline_runs_end_to_end_on_a_local_model(name, micro, tasks, tmp_path):
    with SolverPool(1) as pool:
        policy = make_policy(name, tasks=tasks, backend=micro, budget=2)
        m = evaluate(tasks, policy, tmp_path, env=pool, policy_name=name,
                     config=EvalConfig(budget=2, max_new_tokens=24, bootstrap=100, figures=False))
    assert m["tasks"] == 2 and m["episode_log"]["valid"] and 1.0 <= m["calls"] <= 2.0


def test_cli_cot_and_model_policies_on_micro(tasks, tmp_path, capsys):
    tf = tmp_path / "tasks.jsonl"
    write_tasks(tf, tasks)
    for policy, extra in (("CoT", ["--backend", "hf:micro"]), ("model", ["--model", "micro"])):
        out = tmp_path / policy
        rc = main(["-q", "evaluate", "--policy", policy, *extra, "--tasks", str(tf), "--budget", "2",
                   "--max-new-tokens", "24", "--bootstrap", "100", "--out", str(out)])
        assert rc == 0
        m = json.loads((out / "metrics.json").read_text())
        assert list(m)[:4] == ["success", "faithful", "drift", "calls"] and m["tasks"] == 2
        assert (out / "report.html").is_file() and (out / "figures" / "csr.png").is_file()
    m = json.loads((tmp_path / "model" / "metrics.json").read_text())
    j = m["overall"]["judge"]
    assert sum(j["actor"][g]["n"] for g in "UDF") == 2  # one Actor spec per task
    # the paper's pool: every spec written, the Editor's scored as each episode ended
    assert sum(j[g]["n"] for g in "UDF") == m["overall"]["calls"]["total"] and j["unscored_steps"] == 0
    assert (tmp_path / "model" / "figures" / "judge.png").is_file()


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
CHECK = """<script>window.addEventListener('load', () => {
  const imgs = [...document.images];
  const r = {tables: document.querySelectorAll('table').length, rows: document.querySelectorAll('tr').length,
             images: imgs.length, drawn: imgs.filter(i => i.complete && i.naturalWidth > 100 && i.width > 100).length};
  const p = document.createElement('pre'); p.id = 'omtr-check'; p.textContent = JSON.stringify(r);
  document.body.appendChild(p);
});</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_report_renders_in_headless_chromium(tmp_path):
    tasks = generate("blocksworld", 4, 2, verify=False) + generate("gripper", 3, 2, verify=False)
    out = tmp_path / "eval"
    with SolverPool(1) as pool:
        evaluate(tasks, make_policy("mutant:drop_goal_atom", tasks=tasks), out, env=pool, policy_name="mutant",
                 config=EvalConfig(bootstrap=200))
    html = (out / "report.html").read_text()
    assert "src=\"figures/" not in html and html.count("data:image/png;base64,") == 3  # self-contained
    probe = tmp_path / "probe.html"
    probe.write_text(html.replace("</body>", CHECK + "</body>"))
    profile = tmp_path / "profile"
    dom = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=5000", "--dump-dom",
                          probe.as_uri()], capture_output=True, text=True, timeout=120)
    start = dom.stdout.find('id="omtr-check">')
    assert start > 0, dom.stderr[-2000:]
    result = json.loads(dom.stdout[start + len('id="omtr-check">'):].split("</pre>")[0])
    assert result["tables"] == html.count("<table") >= 6 and result["rows"] == html.count("<tr>") >= 15, result
    assert result["images"] == 3 and result["drawn"] == 3, result  # every figure decoded and laid out
    shot = tmp_path / "report.png"
    subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--window-size=1200,2600",
                    f"--screenshot={shot}", (out / "report.html").as_uri()], capture_output=True, timeout=120)
    assert shot.stat().st_size > 50_000  # a page with tables and three plots, not a blank one
    keep = __import__("os").environ.get("OMTR_KEEP_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)


def test_evaluation_is_logged_to_mlflow(tmp_path, monkeypatch, capsys):
    import mlflow

    tf = tmp_path / "tasks.jsonl"
    write_tasks(tf, generate("gripper", 2, 7, verify=False))
    uri = f"sqlite:///{tmp_path / 'ml.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    assert main(["-q", "evaluate", "--policy", "oracle", "--tasks", str(tf), "--workers", "1", "--bootstrap", "50",
                 "--out", str(tmp_path / "eval")]) == 0
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["omtr-evaluate"])
    assert len(runs) == 1 and runs["metrics.success"][0] == 1.0 and runs["params.policy"][0] == "oracle"
    arts = {a.path for a in mlflow.MlflowClient().list_artifacts(runs.run_id[0])}
    assert {"metrics.json", "report.html", "traces.jsonl", "figures"} <= arts
