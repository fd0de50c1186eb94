"""Shared by the fleet tests: a real `omtr solver serve` process on loopback, and spec mixes."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from omtr.paths import free_port  # noqa: F401 (the fleet tests import it from here)


class Server:
    """``python -m omtr solver serve`` on 127.0.0.1, its output in a log file."""

    def __init__(self, tmp_path: Path, *args: str, port: int | None = None, env: dict | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args, self.env = args, env
        self.log_path = tmp_path / f"server-{self.port}-{time.monotonic_ns()}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, ready: bool = True, timeout: float = 90) -> "Server":
        env = dict(os.environ)
        env.update(self.env or {})
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "omtr", "solver", "serve", "--port", str(self.port),
                                      *self.args], stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL)
        if ready:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"server exited ({self.proc.returncode}):\n{self.log()}"
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"server not ready within {timeout} s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text()[-4000:]
        except OSError:
            return ""

    def metrics(self) -> dict[str, float]:
        """Samples of /metrics as {'name{label="v"}': value} (labels sorted), plus plain names."""
        from prometheus_client.parser import text_string_to_metric_families

        out: dict[str, float] = {}
        text = httpx.get(self.url + "/metrics", timeout=10).text
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return out

    def signal(self, sig=signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 30) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> "Server":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


def mixed_specs(n: int, seed: int = 0, *, valid_share: float = 0.5):
    """``n`` (domain, problem) pairs: small PlanBench instances and malformed specs of all six categories."""
    from omtr.paths import planbench_family
    from omtr.solver.examples import MALFORMED

    rng = random.Random(seed)
    valid = []
    for family in ("blocksworld", "mystery_blocksworld", "logistics"):
        domain, files = planbench_family(family)
        files = sorted(files, key=lambda p: p.stat().st_size)[: max(4, len(files) // 3)]
        valid += [(domain, p.read_text()) for p in files]
    out = []
    for _ in range(n):
        if rng.random() < valid_share:
            out.append(rng.choice(valid))
        else:
            e = rng.choice(MALFORMED)
            out.append((e.domain, e.problem))
    return out


def comparable(v) -> dict:
    """A verdict without what depends on when and where it was computed (timings, cache)."""
    d = v.to_json()
    d.pop("timings")
    d.pop("cached")
    return d


def hard_specs(benchmarks: Path, n: int):
    """``n`` distinct 13-block BlocksWorld specs that blind search cannot finish in 1 s (problem renamed)."""
    inst = benchmarks / "planbench" / "instances" / "blocksworld_hard"
    domain = (inst / "generated_domain.pddl").read_text()
    problem = (inst / "generated" / "instance-110.pddl").read_text()
    head, rest = problem.split("(problem", 1)
    name, tail = rest.strip().split(")", 1)
    return [(domain, f"{head}(problem {name}-v{i}){tail}") for i in range(n)]


@contextlib.contextmanager
def mlflow_tracking_server(backend_store_uri: str, workdir, port: int | None = None):
    """A real `mlflow server` (one worker, artifacts served from WORKDIR/artifacts) on loopback;
    yields its URL once /health answers and stops its process group afterwards."""
    import urllib.request

    port = port or free_port()
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    for k in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID"):
        env.pop(k, None)
    log_path = Path(workdir) / "mlflow-server.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen([os.path.join(bin_dir, "mlflow"), "server", "--backend-store-uri", backend_store_uri,
                             "--serve-artifacts", "--artifacts-destination", str(Path(workdir) / "artifacts"),
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    try:
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() - t0 < 120, "tracking server not ready in 120 s"
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        log.close()
