"""The registered role model served over HTTP: environment build, start-up, latency, memory.

    python benchmarks/serving.py                                   # models:/omtr-role-model@champion in ./mlruns.db, uv and local
    python benchmarks/serving.py --model-uri models:/omtr-role-model/1 --env-managers uv --requests 10
    python benchmarks/serving.py --out docs/results/serving-2026-12-03.json

For each environment manager (``uv``: MLflow builds the model's own environment from its logged
requirements in an empty ``MLFLOW_ENV_ROOT``, with an empty uv cache unless ``--warm-uv-cache``;
``local``: the environment this script runs in), it starts ``mlflow models serve -m MODEL_URI``
on loopback and measures:

- ``env_build_s`` (``uv``): from the start until MLflow runs the scoring server's command in the
  environment it built ("=== Running command"): resolving, downloading and installing it;
- ``server_up_s``: until uvicorn's "Started server process" (MLflow loads the model before that);
- ``ready_s``: from the start until ``/ping`` answers 200;
- for a domain-given task (BlocksWorld, the domain sent along) and a full-mode task (the model writes
  domain and problem), at the endpoint's default limits: the first request's latency and the next
  N requests' (median, min, max), each one task, with the answer's success, planner calls and final
  category;
- ``peak_rss_mb``: the peak resident memory of the server's whole process group (the MLflow CLI,
  uvicorn and its worker, the solver pool's processes), sampled every 0.2 s, and the peak of the
  largest single process.

It sets ``MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT`` (default here 900 s) so that no request is cut at
MLflow's default of 60 s; the report's ``max_request_s`` is what a user's time-out must cover.
One JSON object to stdout (and ``--out``). Needs uv on PATH for ``uv`` (the dev extra has it) and,
offline, ``UV_FIND_LINKS`` (taken from ``PIP_FIND_LINKS`` when unset) for the CPU torch.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

TASK = "There are three blocks a, b and c on the table. Build the tower a on b on c."
ENV_READY = "=== Running command"  # MLflow starts the scoring server in the environment it built (uv)
SERVER_STARTED = ("Started server process", "Uvicorn running on", "Application startup complete")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group_rss_kb(pgid: int) -> tuple[int, int]:
    """(sum, max) of VmRSS in kB over the live processes of process group ``pgid`` (from /proc)."""
    total = largest = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[2]) != pgid:  # state, ppid, pgrp
                continue
            for line in Path(f"/proc/{d}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    kb = int(line.split()[1])
                    total += kb
                    largest = max(largest, kb)
                    break
        except (OSError, ValueError):
            continue
    return total, largest


class Server:
    """``mlflow models serve`` in its own process group, its log lines timestamped, its memory sampled."""

    def __init__(self, model_uri: str, env_manager: str, env: dict, log_path: Path):
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.lines: list[tuple[float, str]] = []
        self.peak_kb = self.peak_one_kb = 0
        self._stop = threading.Event()
        mlflow_cli = str(Path(sys.executable).parent / "mlflow")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen([mlflow_cli, "models", "serve", "-m", model_uri, "--env-manager", env_manager,
                                      "--host", "127.0.0.1", "--port", str(self.port)],
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._sample, daemon=True).start()

    def _read(self) -> None:
        with open(self.log_path, "w", encoding="utf-8") as log:
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace").rstrip("\n")
                self.lines.append((time.monotonic() - self.t0, line))
                log.write(f"{time.monotonic() - self.t0:8.1f} {line}\n")
                log.flush()

    def _sample(self) -> None:
        while not self._stop.is_set() and self.proc.poll() is None:
            total, one = _group_rss_kb(self.proc.pid)
            self.peak_kb, self.peak_one_kb = max(self.peak_kb, total), max(self.peak_one_kb, one)
            time.sleep(0.2)

    def wait_ready(self, limit_s: float) -> float:
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.base + "/ping", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - self.t0
            except OSError:
                pass
            if time.monotonic() - self.t0 > limit_s:
                raise RuntimeError(f"not ready in {limit_s:g} s; see {self.log_path}")
            time.sleep(0.25)

    def first(self, *marks: str) -> float | None:
        """When the server's output first held one of ``marks`` (seconds from the start)."""
        for t, line in self.lines:
            if any(s in line for s in marks):
                return t
        return None

    def post(self, body: dict, timeout_s: float) -> tuple[float, int, dict]:
        req = urllib.request.Request(self.base + "/invocations", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                status, text = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read()
        took = time.monotonic() - t
        try:
            return took, status, json.loads(text)
        except ValueError:
            return took, status, {"message": text.decode(errors="replace")[:500]}

    def stop(self) -> None:
        self._stop.set()
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue


def _requests(server: Server, n_next: int, n_next_full: int, timeout_s: float) -> dict:
    from omtr.solver import examples

    bodies = {"domain_given": {"inputs": [{"task": TASK, "domain": examples.BW_DOMAIN}]},
              "full": {"inputs": [{"task": TASK}]}}
    out = {}
    for name, body in bodies.items():
        rows = []
        for i in range(1 + (n_next if name == "domain_given" else n_next_full)):
            took, status, ans = server.post(body, timeout_s)
            pred = (ans.get("predictions") or [{}])[0] if status == 200 else {}
            rows.append({"seconds": round(took, 2), "status": status, "success": pred.get("success"),
                         "planner_calls": pred.get("planner_calls"), "final_category": pred.get("final_category"),
                         **({"message": ans.get("message", "")[:300]} if status != 200 else {})})
            print(f"[serving] {name} #{i}: {rows[-1]}", file=sys.stderr, flush=True)
        nxt = [r["seconds"] for r in rows[1:]]
        out[name] = {"first_s": rows[0]["seconds"],
                     "next": ({"n": len(nxt), "median_s": round(statistics.median(nxt), 2), "min_s": min(nxt),
                               "max_s": max(nxt)} if nxt else None),
                     "requests": rows}
    return out


def measure(model_uri: str, env_manager: str, args, work: Path) -> dict:
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
           "MLFLOW_TRACKING_URI": args.tracking_uri,
           "MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT": str(int(args.request_timeout))}
    for k in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID"):
        env.pop(k, None)
    row: dict = {"env_manager": env_manager}
    if env_manager == "uv":
        if shutil.which("uv", path=env["PATH"]) is None:
            return {**row, "skipped": "uv is not on PATH: pip install uv (the dev extra carries it)"}
        env_root = work / f"env-root-{env_manager}"
        env_root.mkdir(parents=True)  # empty: MLflow builds the model's environment from nothing
        env["MLFLOW_ENV_ROOT"] = str(env_root)
        env["UV_PYTHON_DOWNLOADS"] = "never"
        links = os.environ.get("UV_FIND_LINKS") or os.environ.get("PIP_FIND_LINKS")
        if links:
            env["UV_FIND_LINKS"] = links
        if not args.warm_uv_cache:
            env["UV_CACHE_DIR"] = str(work / "uv-cache")
        row.update({"env_root": "empty", "uv_cache": "warm (the user's)" if args.warm_uv_cache else "empty",
                    "uv_find_links": links or None})
    server = Server(model_uri, env_manager, env, work / f"serve-{env_manager}.log")
    try:
        row["ready_s"] = round(server.wait_ready(args.start_limit), 1)
        built, up = server.first(ENV_READY), server.first(*SERVER_STARTED)
        row["env_build_s"] = round(built, 1) if built is not None else None
        row["server_up_s"] = round(up, 1) if up is not None else None
        if env_manager == "uv":
            root = Path(env["MLFLOW_ENV_ROOT"])
            row["env_size_mb"] = round(sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) / 2**20)
        row.update(_requests(server, args.requests, args.requests if args.full_requests is None else args.full_requests,
                             args.request_timeout))
        row["max_request_s"] = max(r["seconds"] for k in ("domain_given", "full") for r in row[k]["requests"])
    finally:
        server.stop()
        row["peak_rss_mb"] = round(server.peak_kb / 1024)
        row["peak_rss_largest_process_mb"] = round(server.peak_one_kb / 1024)
        row["log"] = str(server.log_path)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-uri", default="models:/omtr-role-model@champion",
                    help="the registered model to serve (default models:/omtr-role-model@champion)")
    ap.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlruns.db"),
                    help="tracking and registry URI (default $MLFLOW_TRACKING_URI or sqlite:///mlruns.db)")
    ap.add_argument("--env-managers", default="uv,local", help="comma-separated: uv, local (default both)")
    ap.add_argument("--requests", type=int, default=10, help="requests after the first, per task (default 10)")
    ap.add_argument("--full-requests", type=int,
                    help="requests after the first for the full-mode task (default: --requests); greedy decoding makes "
                         "them the same work, and one takes minutes at the default budget on 2 cores")
    ap.add_argument("--request-timeout", type=float, default=900.0,
                    help="MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT and the client's time-out, seconds (default 900)")
    ap.add_argument("--start-limit", type=float, default=1800.0, help="give up on /ping after this (default 1800 s)")
    ap.add_argument("--warm-uv-cache", action="store_true", help="use the user's uv cache instead of an empty one")
    ap.add_argument("--work", help="folder for env roots and logs (default: a temporary one, removed)")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()

    import mlflow

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="omtr-serving-"))
    work.mkdir(parents=True, exist_ok=True)
    client = mlflow.MlflowClient(tracking_uri=args.tracking_uri, registry_uri=args.tracking_uri)
    name, ref = args.model_uri[len("models:/"):].split("@" if "@" in args.model_uri else "/", 1)
    mv = client.get_model_version_by_alias(name, ref) if "@" in args.model_uri else client.get_model_version(name, ref)
    out = {"model_uri": args.model_uri, "version": mv.version, "aliases": list(mv.aliases),
           "baseline_model": mv.tags.get("omtr.baseline_model"), "machine": {"cpus": os.cpu_count(),
           "python": platform.python_version(), "load_avg_start": os.getloadavg()},
           "request_timeout_s": args.request_timeout, "task": TASK, "runs": []}
    t0 = time.monotonic()
    try:
        for m in [m.strip() for m in args.env_managers.split(",") if m.strip()]:
            print(f"[serving] {m}: starting", file=sys.stderr, flush=True)
            out["runs"].append(measure(args.model_uri, m, args, work))
            if args.out:  # what is measured so far survives a stop between environment managers
                Path(args.out).write_text(json.dumps(out, indent=2, default=str) + "\n")
    finally:
        out["machine"]["load_avg_end"] = os.getloadavg()
        out["seconds"] = round(time.monotonic() - t0)
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(out, indent=2, default=str)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
