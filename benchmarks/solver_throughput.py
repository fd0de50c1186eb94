"""Throughput of the environment, measured side by side in one run.

A fixed, seeded mix of specs — half valid (small PlanBench BlocksWorld, Mystery BlocksWorld and
Logistics instances), half malformed across all six diagnostic categories — solved four ways:

  (a) naive:  one ``fast-downward.py`` driver subprocess per spec, then a VAL subprocess
              (how LLM+P-style code calls the planner)
  (b) omtr, cold cache, 1 worker
  (c) omtr, cold cache, 2 workers
  (d) omtr, warm cache (byte-identical repeats, as in RL sampling)
  (e) omtr, warm cache, the same specs with other comments, case and spacing (informative)
  (f) one spec from the command line, as a whole process: ``omtr solve D P --no-cache`` (lint,
      planner and VAL) against Fast Downward's own driver on the same files, with and without
      VAL after it (median of ``--single-repeat`` interleaved runs, 4-block BlocksWorld)

The pools are started before timing (a worker starts in about 0.2 s); each way runs ``--repeat``
interleaved rounds and the median is reported, since these machines are shared.

Prints calls/s for each and the ratios b/a, c/b, d/a, on the mix and on the valid half alone.
Targets: b/a >= 8 on the mix, >= 4 on valid specs; c/b >= 1.7; d/a >= 100; (f) omtr faster than
the plain driver (ratio driver/omtr > 1).

    python benchmarks/solver_throughput.py            # 40 valid + 40 malformed
    python benchmarks/solver_throughput.py --n 20 --seed 3
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from omtr.config import SolverConfig
from omtr.paths import planbench_family
from omtr.solver import ResultCache, SolverPool
from omtr.solver import proc
from omtr.solver.naive import plain_driver_run
from omtr.solver.examples import MALFORMED

SMALL = ("blocksworld", "mystery_blocksworld", "logistics")


def build_mix(n: int, seed: int):
    rng = random.Random(seed)
    valid = []
    per = -(-n // len(SMALL))
    for family in SMALL:
        domain, files = planbench_family(family)
        files = sorted(files)  # path order, as the published figures were measured
        # "small": the smaller half of the folder by file size
        files = sorted(files, key=lambda p: p.stat().st_size)[: len(files) // 2]
        valid += [(domain, p.read_text()) for p in rng.sample(files, per)]
    valid = valid[:n]
    malformed = [(MALFORMED[i % len(MALFORMED)].domain, MALFORMED[i % len(MALFORMED)].problem) for i in range(n)]
    mix = valid + malformed
    rng.shuffle(mix)
    return mix, valid


def naive(specs, time_limit: float) -> float:
    """LLM+P style: a driver subprocess per spec, then VAL on the plan."""
    t0 = time.perf_counter()
    for domain, problem in specs:
        plain_driver_run(domain, problem, time_limit_s=time_limit)
    return len(specs) / (time.perf_counter() - t0)


def omtr_rate(pool: SolverPool, specs, cfg: SolverConfig) -> tuple[float, list]:
    t0 = time.perf_counter()
    verdicts = pool.solve_many(specs, cfg)
    return len(specs) / (time.perf_counter() - t0), verdicts


def measure(label: str, specs, time_limit: float, repeat: int) -> dict:
    """Median calls/s of each way over ``repeat`` interleaved rounds (the machine may be shared)."""
    cfg = SolverConfig(time_limit_s=time_limit)
    rates: dict[str, list[float]] = {k: [] for k in "abcde"}

    def relaid(round_no: int):
        """The same specs re-laid-out anew each round (comment, case, spacing): only the
        normalised cache key can hit, never the byte-identical one."""
        return [(f"; round {round_no}\n" + d.upper(), p.replace(" ", "  ")) for d, p in specs]

    one, two = SolverPool(1, cfg, cache=None), SolverPool(2, cfg, cache=None)
    cache = ResultCache()
    warm = SolverPool(1, cfg, cache=cache)
    try:
        warm.solve_many(specs, cfg)  # fill the cache
        for round_no in range(repeat):
            rates["a"].append(naive(specs, time_limit))
            b, vb = omtr_rate(one, specs, cfg.replace(cache=False))
            c, vc = omtr_rate(two, specs, cfg.replace(cache=False))
            d, vd = omtr_rate(warm, specs, cfg)
            e, ve = omtr_rate(warm, relaid(round_no), cfg)
            rates["e"].append(e)
            assert all(v.cached for v in ve if v.stage != "lint")
            rates["b"].append(b)
            rates["c"].append(c)
            rates["d"].append(d)
            assert [v.success for v in vb] == [v.success for v in vc] == [v.success for v in vd]
    finally:
        for pool in (one, two, warm):
            pool.close()
    r = {k: statistics.median(v) for k, v in rates.items()}
    solved = sum(v.success for v in vb)
    print(f"\n{label}: {len(specs)} specs ({solved} solved), median of {repeat} rounds")
    print(f"  (a) naive driver + VAL        {r['a']:9.1f} calls/s")
    print(f"  (b) omtr cold, 1 worker       {r['b']:9.1f} calls/s")
    print(f"  (c) omtr cold, 2 workers      {r['c']:9.1f} calls/s")
    print(f"  (d) omtr warm cache           {r['d']:9.1f} calls/s")
    print(f"  (e) warm cache, re-laid-out   {r['e']:9.1f} calls/s  (lint + normalised key; not a target)")
    print(f"  b/a = {r['b'] / r['a']:6.1f}   c/b = {r['c'] / r['b']:5.2f}   d/a = {r['d'] / r['a']:7.0f}")
    return r


def _timed(*argvs, cwd) -> tuple[float, float]:
    """(wall ms, CPU ms of the child processes) for running ``argvs`` one after another."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    for argv in argvs:
        subprocess.run(argv, cwd=cwd, capture_output=True, check=False)
    wall = (time.perf_counter() - t0) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000
    return wall, cpu


def single_call(repeat: int) -> dict:
    """(f): whole-process milliseconds for one BlocksWorld spec, three ways, interleaved.

    Wall time is what a user waits; CPU time (user + system of all processes a way starts) is
    reported beside it because it does not depend on what else the shared machine runs."""
    domain, files = planbench_family("blocksworld")
    problem = min(files, key=lambda f: int(f.stem.split("-")[-1]))  # instance-1: 4 blocks
    omtr_bin = os.path.join(os.path.dirname(sys.executable), "omtr")
    tmp = tempfile.mkdtemp(prefix="single-")
    try:
        d, p = os.path.join(tmp, "domain.pddl"), os.path.join(tmp, "problem.pddl")
        Path(d).write_text(domain)
        Path(p).write_text(problem.read_text())
        plan = os.path.join(tmp, "sas_plan")
        driver = [sys.executable, proc.driver_script(), "--plan-file", plan, "--alias", "lama-first", d, p]
        val = [proc.validate_binary(), d, p, plan]
        ways = {
            "omtr": ([omtr_bin, "-q", "solve", d, p, "--no-cache"],),
            "driver": (driver,),
            "driver+val": (driver, val),
        }
        walls: dict[str, list[float]] = {k: [] for k in ways}
        cpus: dict[str, list[float]] = {k: [] for k in ways}
        for _ in range(repeat):
            for name, argvs in ways.items():
                wall, cpu = _timed(*argvs, cwd=tmp)
                walls[name].append(wall)
                cpus[name].append(cpu)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    w = {k: statistics.median(v) for k, v in walls.items()}
    c = {k: statistics.median(v) for k, v in cpus.items()}
    print(f"\n(f) one spec from the command line ({problem.name}), whole process, median of {repeat}")
    print("                                                 wall ms   CPU ms")
    print(f"  omtr solve --no-cache (lint + planner + VAL)  {w['omtr']:8.0f} {c['omtr']:8.0f}")
    print(f"  fast-downward.py driver, no VAL               {w['driver']:8.0f} {c['driver']:8.0f}")
    print(f"  fast-downward.py driver, then VAL             {w['driver+val']:8.0f} {c['driver+val']:8.0f}")
    print(f"  driver/omtr: wall {w['driver'] / w['omtr']:.2f}, CPU {c['driver'] / c['omtr']:.2f}   "
          f"(driver+VAL)/omtr: wall {w['driver+val'] / w['omtr']:.2f}, CPU {c['driver+val'] / c['omtr']:.2f}")
    return {"wall": w, "cpu": c}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=40, help="valid specs (and as many malformed) in the mix")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds; medians are reported")
    ap.add_argument("--single-repeat", type=int, default=9, help="runs of the single-spec comparison (f)")
    ap.add_argument("--only-single", action="store_true", help="run only the single-spec comparison (f)")
    args = ap.parse_args(argv)
    if args.only_single:
        single_call(args.single_repeat)
        return 0
    mix, valid = build_mix(args.n, args.seed)
    print(f"machine: {os.cpu_count()} cores; Fast Downward {proc.search_binary()}")
    m = measure("mix (half valid, half malformed)", mix, args.time_limit, args.repeat)
    v = measure("valid half alone", valid, args.time_limit, args.repeat)
    print("\ntargets: mix b/a >= 8, valid b/a >= 4, c/b >= 1.7, d/a >= 100")
    print(f"  mix   b/a {m['b'] / m['a']:.1f}  c/b {m['c'] / m['b']:.2f}  d/a {m['d'] / m['a']:.0f}")
    print(f"  valid b/a {v['b'] / v['a']:.1f}  c/b {v['c'] / v['b']:.2f}  d/a {v['d'] / v['a']:.0f}")
    f = single_call(args.single_repeat)
    print(f"  single spec: driver/omtr wall {f['wall']['driver'] / f['wall']['omtr']:.2f}, "
          f"CPU {f['cpu']['driver'] / f['cpu']['omtr']:.2f} (target > 1)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
