"""The fleet under load on loopback (bounded in count and time): nothing lost, duplicated or mixed
up; overload answered with 429s the client absorbs; a killed server retried to completion; SIGTERM
drains; a client that leaves stops its batch and leaves no planner process behind."""

import json
import signal
import threading
import time

import httpx
import pytest

from conftest import planner_processes
from fleet_helpers import Server, comparable, hard_specs, mixed_specs
from omtr.config import SolverConfig
from omtr.solver import solve_many
from omtr.solver.client import FleetClient


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _clients(url: str, parts: list[list], **cfg):
    """One client thread per part; returns (verdicts per part, stats per client)."""
    results: list = [None] * len(parts)
    stats: list = [None] * len(parts)
    errors: list = []

    def run(i):
        try:
            with FleetClient(url=url, **cfg) as client:
                results[i] = client.solve_many(parts[i])
                stats[i] = dict(client.stats)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(parts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    return results, stats


@pytest.mark.slow
def test_concurrent_clients_get_every_verdict_once_and_equal_to_the_local_pool(tmp_path):
    parts = [mixed_specs(40, seed=10 + i) for i in range(4)]
    with Server(tmp_path, "--workers", "2") as server:
        got, _ = _clients(server.url, parts, batch_specs=8, concurrency=2)
        m = server.metrics()
    want = [solve_many(p) for p in parts]
    for g, w in zip(got, want):
        assert [comparable(v) for v in g] == [comparable(v) for v in w]
    assert m["omtr_solver_calls_total"] == 160  # each spec verified (or answered from cache) exactly once
    assert m["omtr_solver_request_specs_sum"] == 160 and m["omtr_solver_request_specs_count"] == 20


@pytest.mark.slow
def test_overload_gives_429s_that_the_client_absorbs(tmp_path):
    parts = [mixed_specs(12, seed=20 + i) for i in range(5)]
    with Server(tmp_path, "--workers", "1", "--max-batch-specs", "4", "--queue-specs", "4", "--no-cache") as server:
        got, stats = _clients(server.url, parts, batch_specs=4, concurrency=2, backoff_s=0.05, max_backoff_s=0.5)
        m = server.metrics()
    assert m['omtr_solver_rejected_requests_total{reason="overload"}'] > 0
    assert sum(s["overloaded"] for s in stats) == m['omtr_solver_requests_total{code="429"}'] > 0
    for g, p in zip(got, parts):
        assert [comparable(v) for v in g] == [comparable(v) for v in solve_many(p)]


@pytest.mark.slow
def test_a_server_killed_mid_batch_is_retried_to_completion_against_a_restarted_one(tmp_path):
    specs = mixed_specs(48, seed=30, valid_share=1.0)
    cfg = SolverConfig(cache=False)
    server = Server(tmp_path, "--workers", "1").start()
    result: dict = {}

    def run():
        with FleetClient(url=server.url, batch_specs=4, concurrency=1, retries=30, backoff_s=0.05,
                         max_backoff_s=0.5) as client:
            result["verdicts"] = client.solve_many(specs, config=cfg)
            result["stats"] = dict(client.stats)

    t = threading.Thread(target=run)
    t.start()
    _wait(lambda: server.metrics()["omtr_solver_calls_total"] >= 8, 60, "the first batches")
    server.proc.kill()  # SIGKILL mid-batch: no drain
    server.proc.wait(10)
    _wait(lambda: planner_processes() == [], 30, "the killed pod's planner processes to go")
    restarted = Server(tmp_path, "--workers", "1", port=server.port).start()
    try:
        t.join(240)
        assert not t.is_alive()
        assert result["stats"]["retries"] >= 1
        assert [comparable(v) for v in result["verdicts"]] == [comparable(v) for v in solve_many(specs, config=cfg)]
        assert restarted.metrics()["omtr_solver_calls_total"] < len(specs)  # the rest only, not all again
    finally:
        restarted.stop()


def test_sigterm_drains_running_batches_then_exits(tmp_path):
    specs = mixed_specs(24, seed=40, valid_share=1.0)
    body = {"specs": [{"id": str(i), "domain": d, "problem": p} for i, (d, p) in enumerate(specs)],
            "config": {"cache": False}}
    server = Server(tmp_path, "--workers", "1").start()
    answer: dict = {}

    def post():
        answer["r"] = httpx.post(server.url + "/v1/solve", content=json.dumps(body), timeout=120)

    t = threading.Thread(target=post)
    t.start()
    _wait(lambda: server.metrics()["omtr_solver_inflight_specs"] > 0, 30, "the batch to start")
    server.signal(signal.SIGTERM)
    t.join(120)
    assert server.proc.wait(60) == 0
    r = answer["r"]
    assert r.status_code == 200 and [v["id"] for v in r.json()["verdicts"]] == [str(i) for i in range(24)]
    assert "draining" in server.log()
    server.stop()


@pytest.mark.slow
def test_a_client_that_leaves_stops_its_batch_and_leaves_no_planner_process(tmp_path, benchmarks):
    specs = hard_specs(benchmarks, 24)  # each hits its 1 s CPU limit
    body = {"specs": [{"id": str(i), "domain": d, "problem": p} for i, (d, p) in enumerate(specs)],
            "config": {"time_limit_s": 1, "search": "astar(blind())", "memory_limit_mb": 1000}}
    with Server(tmp_path, "--workers", "1", "--chunk-specs", "2") as server:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/v1/solve", content=json.dumps(body), timeout=httpx.Timeout(1.5, connect=5))
        _wait(lambda: server.metrics()["omtr_solver_cancelled_requests_total"] == 1, 60, "the batch to stop")
        _wait(lambda: server.metrics()["omtr_solver_inflight_requests"] == 0, 30, "the pod to be idle")
        _wait(lambda: planner_processes() == [], 30, "no planner process")
        m = server.metrics()
        assert m["omtr_solver_calls_total"] < len(specs) and m["omtr_solver_timeouts_total"] >= 1
        assert m["omtr_solver_queue_depth"] == 0 and m["omtr_solver_inflight_specs"] == 0
        assert httpx.get(server.url + "/readyz").status_code == 200
