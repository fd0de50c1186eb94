"""A real Prometheus (Debian's package, started here on loopback) scrapes a fleet pod and a trainer's
telemetry endpoint; every query of both dashboards returns data after some traffic."""

import json
import math
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from fleet_helpers import Server, free_port, hard_specs, mixed_specs
from omtr.config import SolverConfig
from omtr.solver.client import FleetClient
from omtr.telemetry import TrainingTelemetry

DASHBOARDS = Path(__file__).resolve().parents[1] / "dashboards"


class Prometheus:
    def __init__(self, tmp: Path, targets: dict[str, int]):
        binary = shutil.which("prometheus")
        if not binary:
            pytest.fail("prometheus is not installed: apt-get install -y prometheus (.ci/run does it)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        jobs = "".join(f"  - job_name: {job}\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
                       for job, port in targets.items())
        (tmp / "prometheus.yml").write_text(
            f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n{jobs}")
        self.log = open(tmp / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self._wait(lambda: httpx.get(self.url + "/-/ready", timeout=2).status_code == 200, "Prometheus to be ready")

    def _wait(self, cond, what, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "prometheus exited"
            try:
                if cond():
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}")

    def query(self, expr: str) -> list:
        r = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=10)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def _has_data(result: list) -> bool:
    return any(not math.isnan(float(s["value"][1])) for s in result)


@pytest.mark.slow
def test_every_dashboard_query_returns_data_from_a_real_prometheus(tmp_path, benchmarks):
    tel = TrainingTelemetry(run_id="t")
    tel_port = free_port()
    tel.serve(tel_port)
    server = Server(tmp_path, "--workers", "1").start()
    prom = Prometheus(tmp_path, {"omtr-solver": server.port, "omtr-train": tel_port})
    try:
        # both targets scraped at least once before any traffic, so rates see it begin
        prom._wait(lambda: prom.query("omtr_solver_ready == 1") and prom.query("omtr_train_step"), "first scrapes")
        tel.record(step=1, rewards={"actor": 0.2, "judge": 0.7, "editor": 0.1}, success_rate=0.25,
                   categories={"success": 1, "syntax": 2, "unreachable_search": 1}, judge_auc=0.6, judge_ece=0.1,
                   kl={"actor": 0.01, "editor": 0.02}, tokens_per_s=200.0, episodes=4, planner_calls=9)
        specs = mixed_specs(30, seed=50)
        with FleetClient(url=server.url, batch_specs=8) as client:
            client.solve_many(specs)
            client.solve_many(specs[:8])  # repeats: cache hits
            client.solve_many(hard_specs(benchmarks, 1),  # a time-out
                              config=SolverConfig(time_limit_s=1, search="astar(blind())", memory_limit_mb=1000))
        httpx.post(server.url + "/v1/solve", content=b"garbage")  # a rejected request
        tel.record(step=2, episodes=4, planner_calls=7)
        total = server.metrics()["omtr_solver_calls_total"]
        prom._wait(lambda: [float(s["value"][1]) for s in prom.query("omtr_solver_calls_total")] == [total]
                   and [float(s["value"][1]) for s in prom.query("omtr_train_step")] == [2.0], "the traffic")
        time.sleep(2)  # a couple more scrapes
        empty = []
        for name in ("solver-fleet.json", "training.json"):
            doc = json.loads((DASHBOARDS / name).read_text())
            for panel in doc["panels"]:
                for target in panel["targets"]:
                    expr = target["expr"].replace("$__rate_interval", "1m")
                    if not _has_data(prom.query(expr)):
                        empty.append(f"{name} / {panel['title']}: {expr}")
        assert not empty, "queries without data:\n" + "\n".join(empty)
        # and the numbers are the pod's own
        assert float(prom.query('sum(omtr_solver_verdicts_total{category="success"})')[0]["value"][1]) > 0
        assert float(prom.query("omtr_solver_timeouts_total")[0]["value"][1]) == 1
        assert float(prom.query("omtr_solver_cache_hits_total")[0]["value"][1]) >= 8
    finally:
        prom.stop()
        server.stop()
        tel.close()


def test_training_telemetry_push_reaches_a_real_pushgateway(tmp_path):
    binary = shutil.which("prometheus-pushgateway")
    if not binary:
        pytest.fail("prometheus-pushgateway is not installed: apt-get install -y prometheus-pushgateway (.ci/run does it)")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(tmp_path / "pushgateway.log", "w") as log:
        proc = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(url + "/-/ready", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline and proc.poll() is None, "pushgateway did not start"
                time.sleep(0.1)
            tel = TrainingTelemetry(run_id="run-7")
            tel.record(step=3, rewards={"actor": 0.5}, judge_auc=0.75, episodes=8)
            tel.push(url)
            text = httpx.get(url + "/metrics", timeout=5).text
            assert 'omtr_train_step{instance="",job="omtr-train",run_id="run-7"} 3' in text
            assert 'omtr_train_reward{instance="",job="omtr-train",role="actor",run_id="run-7"} 0.5' in text
            assert 'omtr_train_episodes_total{instance="",job="omtr-train",run_id="run-7"} 8' in text
        finally:
            proc.terminate()
            proc.wait(30)
