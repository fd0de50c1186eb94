"""The fleet's HTTP API on loopback: bad input gets a clear 4xx and the server stays up; tokens;
idempotent retries; the client's splitting, errors and config; `omtr solve --batch` on the fleet."""

import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from fleet_helpers import Server, comparable, free_port, mixed_specs
from omtr.config import ConfigError, FleetConfig, ServiceConfig
from omtr.solver import solve_many
from omtr.solver.client import FleetClient, FleetRequestError, FleetUnavailable
from omtr.solver.examples import BW_DOMAIN, BW_PROBLEM

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fleet-api")
    with Server(tmp, "--workers", "1", "--max-batch-specs", "8", "--queue-specs", "64", "--max-body-mb", "0.25",
                env={"OMTR_SOLVER_TOKEN": TOKEN}) as s:
        yield s


def _one(sid="a"):
    return {"id": sid, "domain": BW_DOMAIN, "problem": BW_PROBLEM}


def _post(server, body, headers=AUTH, **kw):
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    return httpx.post(server.url + "/v1/solve", content=body, headers=headers, timeout=60, **kw)


def test_health_ready_info_and_metrics(server):
    assert httpx.get(server.url + "/healthz").json() == {"status": "ok"}
    assert httpx.get(server.url + "/readyz").json()["status"] == "ready"
    info = httpx.get(server.url + "/v1/info").json()
    assert info["max_batch_specs"] == 8 and info["max_body_bytes"] == 256 * 1024
    m = server.metrics()
    assert m["omtr_solver_workers"] == 1 and m["omtr_solver_ready"] == 1


BAD = [
    ("garbage JSON", b"{not json", 400, "bad_json", "not valid JSON"),
    ("not an object", [1, 2], 422, "bad_request", "must be a JSON object"),
    ("specs not a list", {"specs": "x"}, 422, "bad_request", "'specs' must be a list"),
    ("empty specs", {"specs": []}, 422, "bad_request", "'specs' is empty"),
    ("unknown top-level field", {"specs": [_one()], "verbose": True}, 422, "bad_request", "unknown field"),
    ("domain is a number", {"specs": [{"id": "a", "domain": 3, "problem": "x"}]}, 422, "bad_request",
     "specs[0].domain must be a string"),
    ("problem missing", {"specs": [{"id": "a", "domain": "x"}]}, 422, "bad_request", "specs[0].problem"),
    ("id is a list", {"specs": [{"id": [1], "domain": "x", "problem": "y"}]}, 422, "bad_request", "specs[0].id"),
    ("duplicate ids", {"specs": [_one("a"), _one("a")]}, 422, "bad_request", "appears twice"),
    ("bad base64", {"specs": [{"id": "a", "domain": "!!", "problem": "eA==", "encoding": "base64"}]}, 422,
     "bad_request", "not valid base64"),
    ("config: unknown key", {"specs": [_one()], "config": {"cache_dir": "/tmp"}}, 422, "bad_request",
     "server-only"),
    ("config: wrong type", {"specs": [_one()], "config": {"time_limit_s": "fast"}}, 422, "bad_request",
     "config.time_limit_s has the wrong type"),
    ("config: above the server's limit", {"specs": [_one()], "config": {"time_limit_s": 3600}}, 422, "bad_request",
     "above this server's limit"),
    ("config: impossible", {"specs": [_one()], "config": {"memory_limit_mb": 1}}, 422, "bad_request",
     "too small"),
    ("too many specs", {"specs": [_one(str(i)) for i in range(9)]}, 413, "too_many_specs", "at most 8"),
    ("oversized body", {"specs": [{"id": "a", "domain": "x" * 300_000, "problem": "y"}]}, 413, "too_large",
     "at most 262144"),
]


@pytest.mark.parametrize("name,body,status,reason,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_a_clear_4xx_and_the_server_stays_up(server, name, body, status, reason, words):
    before = server.metrics().get(f'omtr_solver_rejected_requests_total{{reason="{reason}"}}', 0)
    r = _post(server, body)
    assert r.status_code == status, r.text
    assert r.json()["reason"] == reason and words in r.json()["error"], r.json()
    assert server.metrics()[f'omtr_solver_rejected_requests_total{{reason="{reason}"}}'] == before + 1
    ok = _post(server, {"specs": [_one()]})
    assert ok.status_code == 200 and ok.json()["verdicts"][0]["success"] is True


def test_oversized_chunked_body_without_length_is_refused(server):
    def chunks():
        for _ in range(40):
            yield b"x" * 10_000

    r = _post(server, chunks())  # no Content-Length: the server counts while it reads
    assert r.status_code == 413 and "over 262144 bytes" in r.json()["error"]
    assert httpx.get(server.url + "/healthz").status_code == 200


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}],
                         ids=["missing", "wrong", "no scheme"])
def test_token_is_required(server, headers):
    r = _post(server, {"specs": [_one()]}, headers=headers)
    assert r.status_code == 401 and "bearer token" in r.json()["error"]
    assert r.headers["www-authenticate"].startswith("Bearer")


def test_a_retried_batch_is_answered_without_verifying_again(server):
    body = {"specs": [{"id": "r1", "domain": BW_DOMAIN, "problem": BW_PROBLEM.replace("bw-3", "bw-retry")}],
            "config": {"cache": False}}
    headers = {**AUTH, "Idempotency-Key": "batch-42"}
    first = _post(server, body, headers=headers)
    calls = server.metrics()["omtr_solver_calls_total"]
    again = _post(server, body, headers=headers)
    assert again.status_code == 200 and again.headers.get("x-omtr-replay") == "1"
    assert again.json() == first.json()
    assert server.metrics()["omtr_solver_calls_total"] == calls  # not verified twice
    other = _post(server, {"specs": [_one("other")]}, headers=headers)
    assert other.status_code == 422 and "different batch" in other.json()["error"]


def test_a_retry_while_the_first_try_runs_waits_for_it(server, benchmarks):
    from fleet_helpers import hard_specs

    import threading

    specs = hard_specs(benchmarks, 3)  # about 1 s each: the first try is still running when the retry comes
    body = {"specs": [{"id": f"h{i}", "domain": d, "problem": p} for i, (d, p) in enumerate(specs)],
            "config": {"time_limit_s": 1, "search": "astar(blind())", "memory_limit_mb": 1000}}
    headers = {**AUTH, "Idempotency-Key": "running-batch"}
    calls = server.metrics()["omtr_solver_calls_total"]
    first: dict = {}
    t = threading.Thread(target=lambda: first.setdefault("r", _post(server, body, headers=headers)))
    t.start()
    deadline = time.monotonic() + 30
    while server.metrics()["omtr_solver_inflight_requests"] < 1:
        assert time.monotonic() < deadline, "the first try never started"
        time.sleep(0.02)
    retry = _post(server, body, headers=headers)
    t.join(60)
    assert first["r"].status_code == 200 and retry.status_code == 200
    assert retry.headers.get("x-omtr-replay") == "1" and retry.json() == first["r"].json()
    assert server.metrics()["omtr_solver_calls_total"] == calls + 3  # verified once


def test_client_matches_local_pool_and_splits_to_server_limits(server):
    specs = mixed_specs(20, seed=1) + [(BW_DOMAIN.encode(), BW_PROBLEM.encode()), (b"\xff\xfe(define", b"(x")]
    before = server.metrics()['omtr_solver_requests_total{code="200"}']
    with FleetClient(url=server.url, token=TOKEN, batch_specs=64) as client:
        got = client.solve_many(specs)
        assert client.stats["requests"] == 3  # 22 specs, the server takes 8 per request
    assert server.metrics()['omtr_solver_requests_total{code="200"}'] == before + 3
    want = solve_many(specs)
    assert [comparable(v) for v in got] == [comparable(v) for v in want]


def test_client_sends_its_config(server):
    from omtr.config import SolverConfig

    cfg = SolverConfig(search="astar(blind())", validate=False, cache=False)
    with FleetClient(url=server.url, token=TOKEN) as client:
        (v,) = client.solve_many([(BW_DOMAIN, BW_PROBLEM)], config=cfg)
    assert v.success and comparable(v) == comparable(solve_many([(BW_DOMAIN, BW_PROBLEM)], config=cfg)[0])


def test_refused_batch_raises_and_names_the_specs(server):
    with FleetClient(url=server.url, token="wrong", retries=0) as client:
        with pytest.raises(FleetRequestError) as exc:
            client.solve_many([(BW_DOMAIN, BW_PROBLEM)] * 3, ids=["x1", "x2", "x3"])
    assert exc.value.status == 401 and exc.value.unverified == ["x1", "x2", "x3"]
    assert "x1, x2, x3" in str(exc.value) and "bearer token" in str(exc.value)


def test_unreachable_fleet_names_unverified_specs_and_makes_up_nothing():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with FleetClient(url=url, retries=2, backoff_s=0.01, max_backoff_s=0.05, connect_timeout_s=1) as client:
        with pytest.raises(FleetUnavailable) as exc:
            client.solve_many([(BW_DOMAIN, BW_PROBLEM)] * 2)
    assert "could not be reached" in str(exc.value) and url in str(exc.value)


def test_unreachable_during_a_batch_names_unverified_specs(server, tmp_path):
    with Server(tmp_path, "--workers", "1", env={"OMTR_SOLVER_TOKEN": TOKEN}) as other:
        client = FleetClient(url=other.url, token=TOKEN, retries=1, backoff_s=0.01, max_backoff_s=0.05,
                             connect_timeout_s=1)
        client.info()  # limits known; then the fleet goes away
    with client, pytest.raises(FleetUnavailable) as exc:
        client.solve_many([(BW_DOMAIN, BW_PROBLEM)] * 3, ids=["u1", "u2", "u3"])
    assert exc.value.unverified == ["u1", "u2", "u3"] and exc.value.verdicts == [None, None, None]
    assert "3 of 3 spec(s) were not verified" in str(exc.value) and "u1, u2, u3" in str(exc.value)


def test_cli_solve_batch_uses_the_fleet_when_a_url_is_set(server, tmp_path):
    specs = tmp_path / "specs.jsonl"
    out = tmp_path / "verdicts.jsonl"
    with open(specs, "w") as f:
        for i, (d, p) in enumerate(mixed_specs(6, seed=2)):
            f.write(json.dumps({"id": f"s{i}", "domain": d, "problem": p}) + "\n")
    before = server.metrics()["omtr_solver_calls_total"]
    env = {**os.environ, "OMTR_SOLVER_URL": server.url, "OMTR_SOLVER_TOKEN": TOKEN}
    r = subprocess.run([sys.executable, "-m", "omtr", "solve", "--batch", str(specs), "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["id"] for row in rows] == [f"s{i}" for i in range(6)]
    assert server.metrics()["omtr_solver_calls_total"] == before + 6


def test_fleet_config_rejects_what_cannot_work(tmp_path):
    with pytest.raises(ConfigError, match="http://HOST:PORT"):
        FleetConfig(url="127.0.0.1:8600")
    with pytest.raises(ConfigError, match="concurrency"):
        FleetConfig(concurrency=0)
    with pytest.raises(ConfigError, match="queue_specs"):
        ServiceConfig(max_batch_specs=100, queue_specs=10)
    assert FleetConfig.from_env({}).url is None
    tok = tmp_path / "tok"
    tok.write_text("abc\n")
    cfg = FleetConfig.from_env({"OMTR_SOLVER_URL": "http://h:1", "OMTR_SOLVER_TOKEN_FILE": str(tok)})
    assert cfg.url == "http://h:1" and cfg.token == "abc"
    with pytest.raises(ConfigError, match="cannot read"):
        FleetConfig.from_env({"OMTR_SOLVER_TOKEN_FILE": str(tmp_path / "missing")})


def test_start_up_does_not_import_the_fleet_libraries():
    code = ("import sys, omtr.cli; omtr.cli.build_parser(); "
            "print(sorted(m for m in ('fastapi','uvicorn','prometheus_client','httpx') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "omtr", "solver", "serve", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--workers" in r.stdout and "examples:" in r.stdout


def test_cli_ping_prints_the_fleets_limits(server):
    r = subprocess.run([sys.executable, "-m", "omtr", "solver", "ping", "--url", server.url],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["max_batch_specs"] == 8
    r = subprocess.run([sys.executable, "-m", "omtr", "solver", "ping", "--url", "localhost:1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "http://HOST:PORT" in r.stderr
