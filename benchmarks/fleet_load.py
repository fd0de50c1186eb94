"""Load test of the solver fleet on loopback, against the local pool on the same specs.

A seeded mix of specs — real PlanBench instances (BlocksWorld, Mystery BlocksWorld, Logistics)
and malformed specs across the six categories — is sent by several concurrent clients, in
batches, to `omtr solver serve` with 1 and with 2 solver workers, then solved by a local
`SolverPool` with the same workers, from the same number of threads, in the same batches. The
cache is off everywhere (every spec is verified), unless --cache.

Reports for each: throughput (specs/s), client-side batch latency p50/p95/p99, server-side
per-spec latency p50/p95/p99, and the ratio fleet / local pool. Everything runs on 127.0.0.1 and
stops by itself (bounded by --n and --timeout).

    python benchmarks/fleet_load.py                       # 2,000 specs, 4 clients, batches of 16
    python benchmarks/fleet_load.py --n 500 --clients 8 --batch 8 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx

from omtr.config import SolverConfig
from omtr.paths import planbench_family
from omtr.solver import SolverPool
from omtr.solver.client import FleetClient
from omtr.solver.examples import MALFORMED


def build_mix(n: int, seed: int, valid_share: float = 0.5):
    rng = random.Random(seed)
    valid = []
    for family in ("blocksworld", "mystery_blocksworld", "logistics"):
        domain, files = planbench_family(family)
        files = sorted(files, key=lambda p: p.stat().st_size)[: len(files) // 2]  # the smaller half
        valid += [(domain, p.read_text()) for p in files]
    out, malformed = [], 0
    for _ in range(n):
        if rng.random() < valid_share:
            out.append(rng.choice(valid))
        else:
            e = rng.choice(MALFORMED)
            out.append((e.domain, e.problem))
            malformed += 1
    return out, malformed


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))
    return xs[k]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drive(solve_batch, specs, clients: int, batch: int, timeout: float):
    """``clients`` threads, each solving its share in batches; returns (seconds, batch latencies, verdicts)."""
    parts = [specs[i::clients] for i in range(clients)]
    lat: list[float] = []
    verdicts: list = []
    lock = threading.Lock()
    deadline = time.monotonic() + timeout
    errors: list = []

    def run(part):
        try:
            for s in range(0, len(part), batch):
                if time.monotonic() > deadline:
                    raise TimeoutError("the benchmark ran past --timeout")
                t0 = time.perf_counter()
                vs = solve_batch(part[s:s + batch])
                dt = time.perf_counter() - t0
                with lock:
                    lat.append(dt)
                    verdicts.extend(vs)
        except Exception as exc:  # noqa: BLE001 - reported after the join
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in parts]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0, lat, verdicts


def fleet_run(specs, workers: int, args, cfg: SolverConfig) -> dict:
    port = free_port()
    cmd = [sys.executable, "-m", "omtr", "-q", "solver", "serve", "--port", str(port), "--workers", str(workers),
           "--max-batch-specs", str(max(args.batch, 16))]
    if not args.cache:
        cmd.append("--no-cache")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the fleet pod did not become ready")
            time.sleep(0.1)
        clients = [FleetClient(url=url, concurrency=1, batch_specs=args.batch) for _ in range(args.clients)]
        local = threading.local()
        pool_of = iter(clients)
        lock = threading.Lock()

        def solve_batch(batch):
            if not hasattr(local, "client"):
                with lock:
                    local.client = next(pool_of)
            return local.client.solve_many(batch, config=cfg)

        secs, lat, verdicts = drive(solve_batch, specs, args.clients, args.batch, args.timeout)
        for c in clients:
            c.close()
        spec_ms = [v.timings.get("total_ms", 0.0) for v in verdicts]
        return {"specs": len(verdicts), "seconds": secs, "throughput": len(verdicts) / secs,
                "batch_p50_ms": 1000 * pct(lat, 50), "batch_p95_ms": 1000 * pct(lat, 95),
                "batch_p99_ms": 1000 * pct(lat, 99), "spec_p50_ms": pct(spec_ms, 50),
                "spec_p95_ms": pct(spec_ms, 95), "spec_p99_ms": pct(spec_ms, 99),
                "verdicts": [v.category.value if v.category else "success" for v in verdicts]}
    finally:
        proc.terminate()
        proc.wait(60)


def local_run(specs, workers: int, args, cfg: SolverConfig) -> dict:
    with SolverPool(workers, cfg) as pool:
        secs, lat, verdicts = drive(lambda b: pool.solve_many(b, cfg), specs, args.clients, args.batch, args.timeout)
    spec_ms = [v.timings.get("total_ms", 0.0) for v in verdicts]
    return {"specs": len(verdicts), "seconds": secs, "throughput": len(verdicts) / secs,
            "batch_p50_ms": 1000 * pct(lat, 50), "batch_p95_ms": 1000 * pct(lat, 95),
            "batch_p99_ms": 1000 * pct(lat, 99), "spec_p50_ms": pct(spec_ms, 50),
            "spec_p95_ms": pct(spec_ms, 95), "spec_p99_ms": pct(spec_ms, 99),
            "verdicts": [v.category.value if v.category else "success" for v in verdicts]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="specs per run (default 2000)")
    ap.add_argument("--clients", type=int, default=4, help="concurrent clients (default 4)")
    ap.add_argument("--batch", type=int, default=16, help="specs per request (default 16)")
    ap.add_argument("--workers", default="1,2", help="solver worker counts to compare (default 1,2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", action="store_true", help="leave the result cache on (repeats answered from it)")
    ap.add_argument("--timeout", type=float, default=900, help="stop a run that takes longer (seconds)")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = ap.parse_args(argv)
    specs, malformed = build_mix(args.n, args.seed)
    cfg = SolverConfig(cache=args.cache)
    rows = {}
    for w in (int(x) for x in args.workers.split(",")):
        rows[f"fleet, {w} worker(s)"] = fleet = fleet_run(specs, w, args, cfg)
        rows[f"local pool, {w} worker(s)"] = local = local_run(specs, w, args, cfg)
        fleet["ratio_to_local"] = fleet["throughput"] / local["throughput"]
        if sorted(fleet["verdicts"]) != sorted(local["verdicts"]):
            from collections import Counter

            print(f"warning: outcome counts differ between fleet and local pool ({w} worker(s)): "
                  f"{Counter(fleet['verdicts'])} vs {Counter(local['verdicts'])}", file=sys.stderr)
    print(f"{args.n} specs ({malformed} malformed), "
          f"{args.clients} clients, batches of {args.batch}, cache {'on' if args.cache else 'off'}, "
          f"{os.cpu_count()} CPUs")
    print(f"{'':24} {'specs/s':>8} {'vs local':>8} {'batch p50/p95/p99 ms':>24} {'spec p50/p95/p99 ms':>22}")
    for name, r in rows.items():
        ratio = f"{r['ratio_to_local']:.2f}" if "ratio_to_local" in r else ""
        print(f"{name:24} {r['throughput']:8.1f} {ratio:>8} "
              f"{r['batch_p50_ms']:8.0f}{r['batch_p95_ms']:8.0f}{r['batch_p99_ms']:8.0f} "
              f"{r['spec_p50_ms']:7.1f}{r['spec_p95_ms']:7.1f}{r['spec_p99_ms']:8.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({k: {kk: vv for kk, vv in v.items() if kk != "verdicts"} for k, v in rows.items()}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
