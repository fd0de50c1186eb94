"""The fast engine's prefix cache, side by side in one run: ``omtr evaluate`` with the cache on and off.

    python benchmarks/prefix_cache.py --per-family 3 --out docs/results/prefix-cache-DATE.json

A PlanBench sample of every family shipped with omtr (BlocksWorld, Mystery BlocksWorld, Logistics,
Depots: the first ``--per-family`` tasks of each, the domain given), the untrained model of the
``small`` profile (SmolLM2), ``--engine fast``, greedy, ``--budget 1`` by default. Each run is its
own process (``/usr/bin/time -v`` gives its peak memory):

- ``off``: ``--prefix-cache off`` (no computation shared between different prompts);
- ``on``: ``--prefix-cache on`` (the default);
- ``on_old_order``: the cache on with the prompts in their former order (the task's English first,
  the given domain and the request after it), to measure that putting what a family shares first
  does not make the untrained model's outcomes worse (the former prompt functions are restated
  below, for this run only);
- ``before`` (with ``--before-src DIR``: the ``src`` folder of a checkout of the version before the
  cache, e.g. ``git worktree add /tmp/before 92e07eb``): the same command on that version's engine
  (its prompt order, no ``--prefix-cache``), for the figure the issue started from;
- ``served``: the served model (the pyfunc's ``predict`` in-process, fast engine, budget 1): three
  requests of one task each, the same family, domain given; the first pays the family's prefill,
  the second and third only their statement's (with the cache off for comparison).

Per run: whole-command time, time to the first new token, prompt tokens computed and found in
the cache, peak memory, where the time went (generation, Judge, planner, checker, report), and
the outcomes; then whether ``on`` and ``off`` gave identical greedy outcomes (every step's text,
verdict and Judge score). One JSON object to ``--out`` and stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FAMILIES = ("blocksworld", "mystery_blocksworld", "logistics", "depots")


# ----------------------------------------------------------------------------- the former prompt order

def former_order() -> None:
    """Put the prompts back in their order before issue 37: the task's English first, the given
    domain after it (Actor: then the request; Judge and Editor: the domain after the task)."""
    from omtr.inference import prompts as P

    mark = "\n\nGiven domain:\n"
    ask = "\n\nWrite the problem (define (problem ...)) for this domain."

    def with_domain(nl, domain):
        return f"{nl}{mark}{domain.strip()}{ask}"

    def judge_messages(task, spec):
        domain = P.given_domain(task)
        if domain is None:
            return original_judge(task, spec)
        return [{"role": "system", "content": P.SYSTEM_JUDGE},
                {"role": "user", "content": f"Task:\n{task.nl}{mark}{domain.strip()}\n\nPDDL problem:\n{spec}\n\n"
                                            "Will the planner accept this PDDL?"}]

    original_judge = P.judge_messages
    P.with_domain = with_domain
    P.judge_messages = judge_messages
    # the Editor does not run at budget 1


# ----------------------------------------------------------------------------- child processes

def child_evaluate(argv: list[str], order: str) -> int:
    if order == "old":
        former_order()
    from omtr.cli import main

    return main(argv)


def child_served(tasks_file: str, cache: str, out: str, budget: int) -> None:
    """Three requests of one family, one task each (domain given), through the pyfunc in-process."""
    import torch

    torch.set_num_threads(2)
    from omtr.model import build_model
    from omtr.rollout import make_engine
    from omtr.tasks.records import load_tasks
    from omtr.tracking.pyfunc import EXAMPLE_TASK, RoleModelPyfunc, ServingLimits

    tasks = [t for t in load_tasks(tasks_file) if t.family == "blocksworld"][:3]
    limits = ServingLimits(engine="fast", prefix_cache=cache == "on")
    pf = RoleModelPyfunc()
    pf.limits, pf.env, pf.metrics = limits, None, None
    pf.model = make_engine("fast", build_model("small"), prefix_cache=cache == "on")
    pf.predict(None, {"task": [EXAMPLE_TASK]}, {"budget": 1, "max_new_tokens": 4})  # starts the solver pool
    rows = []
    for t in tasks:
        pf.model.reset_stats()
        t0 = time.perf_counter()
        ans = pf.predict(None, {"task": [t.nl], "domain": [t.domain]}, {"budget": budget})
        row = ans.iloc[0].to_dict()
        rows.append({"id": t.id, "seconds": round(time.perf_counter() - t0, 2),
                     "first_token_s": pf.model.cache_report()["first_token_s"],
                     "computed_tokens": pf.model.prefill_stats["computed_tokens"],
                     "cached_tokens": pf.model.prefill_stats["cached_tokens"],
                     "success": bool(row.get("success")), "planner_calls": int(row.get("planner_calls") or 0)})
        print(f"[served {cache}] {rows[-1]}", flush=True)
    Path(out).write_text(json.dumps({"cache": cache, "budget": budget, "requests": rows}, indent=2) + "\n")


# ----------------------------------------------------------------------------- the parent

def timed(cmd: list[str], log_path: Path, env: dict | None = None) -> tuple[int, float, float]:
    """Run ``cmd`` under /usr/bin/time -v; (exit code, wall seconds, peak RSS MiB)."""
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        rc = subprocess.call(["/usr/bin/time", "-v", *cmd], stdout=log, stderr=subprocess.STDOUT, env=env)
    wall = time.perf_counter() - t0
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", log_path.read_text())
    return rc, wall, (int(m.group(1)) / 1024 if m else float("nan"))


def traces(folder: Path) -> dict[str, dict]:
    out = {}
    for line in (folder / "traces.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out[rec["id"]] = rec
    return out


def outcome_key(rec: dict) -> list:
    return [(s["text"], s["verdict"].get("success"), s["verdict"].get("category"), s.get("judge_score"))
            for s in rec["steps"]]


def first_prefill_s(folder: Path) -> float:
    """The prefill of the first batch the loop generated (its Actor steps carry it)."""
    steps = [r["steps"][0] for r in traces(folder).values() if r["steps"]]
    first = min(steps, key=lambda s: (s.get("times") or {}).get("at_ms", 0.0))
    return (first.get("times") or {}).get("prefill_ms", 0.0) / 1000


def where_time_went(folder: Path, metrics: dict) -> dict:
    """Seconds by part: the Actor's generation (prefill, decode), the Judge, the planner, the checker,
    the report (from metrics.json's timing and the traces' step times)."""
    recs = list(traces(folder).values())
    steps = [s for r in recs for s in r["steps"]]
    batches: dict[float, dict] = {}
    for s in steps:  # one generate call per batch: its times are the batch's
        t = s.get("times") or {}
        b = batches.setdefault(t.get("generate_ms", 0.0), {})
        b["generate_ms"] = t.get("generate_ms", 0.0)
        b["prefill_ms"] = t.get("prefill_ms", 0.0)
        b["decode_ms"] = max(b.get("decode_ms", 0.0), t.get("decode_ms", 0.0))
        b["judge_ms"] = t.get("judge_ms", 0.0)
    tm = metrics.get("timing", {})
    return {
        "load_policy_s": tm.get("load_policy_s"),
        "actor_generate_s": round(sum(b["generate_ms"] for b in batches.values()) / 1000, 1),
        "actor_prefill_s": round(sum(b["prefill_ms"] for b in batches.values()) / 1000, 1),
        "actor_decode_s": round(sum(b["decode_ms"] for b in batches.values()) / 1000, 1),
        "judge_s": round(sum(b["judge_ms"] for b in batches.values()) / 1000, 1),
        # the planner's worker time (lint, translate, search, VAL), in parallel with the Judge
        "planner_worker_s": tm.get("solver_total_s"),
        "checker_s": tm.get("faithfulness_s"),
        "report_s": round(sum(tm.get(k, 0.0) for k in ("metrics_s", "episode_log_s", "figures_s")), 1),
        "loop_s": tm.get("loop_s"),
        "total_s": tm.get("total_s"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-family", type=int, default=3, help="PlanBench tasks per family (default 3)")
    ap.add_argument("--budget", type=int, default=1, help="planner calls per task (default 1: the Actor's spec)")
    ap.add_argument("--runs", default="off,on,on_old_order,served", help="which runs, comma-separated")
    ap.add_argument("--out", default=None, help="JSON result file")
    ap.add_argument("--before-src", default=None, help="src/ of the version before the cache (the run 'before')")
    ap.add_argument("--work", default=None, help="working folder (default: a temporary one)")
    ap.add_argument("--child", choices=("evaluate", "served"), help=argparse.SUPPRESS)
    ap.add_argument("--order", default="new", help=argparse.SUPPRESS)
    ap.add_argument("--cache", default="on", help=argparse.SUPPRESS)
    ap.add_argument("--tasks", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args()
    if args.child == "evaluate":
        sys.exit(child_evaluate(rest[1:] if rest[:1] == ["--"] else rest, args.order))
    if args.child == "served":
        child_served(args.tasks, args.cache, args.child_out, args.budget)
        return

    from omtr.tasks.planbench import import_planbench
    from omtr.tasks.planbench_data import shipped_root
    from omtr.tasks.records import write_tasks

    work = Path(args.work or tempfile.mkdtemp(prefix="omtr-prefix-cache-"))
    work.mkdir(parents=True, exist_ok=True)
    sample = []
    for fam in FAMILIES:
        sample += [t.with_given_domain() for t in import_planbench(shipped_root(), [fam])[: args.per_family]]
    tasks_file = work / "tasks.jsonl"
    write_tasks(tasks_file, sample)
    me = [sys.executable, os.path.abspath(__file__)]
    result: dict = {"benchmark": "prefix_cache", "date": time.strftime("%Y-%m-%d"), "model": "small (SmolLM2-135M, untrained)",
                    "engine": "fast", "budget": args.budget, "per_family": args.per_family,
                    "families": {f: sum(t.family == f for t in sample) for f in FAMILIES}, "tasks": len(sample),
                    "mode": "domain-given", "cores": os.cpu_count(), "runs": {}}
    runs = [r for r in args.runs.split(",") if r]
    for name in runs:
        if name == "served":
            continue
        cache = "off" if name == "off" else "on"
        order = "old" if name.endswith("old_order") else "new"
        out = work / name
        cmd = [*me, "--child", "evaluate", "--order", order, "--", "--quiet", "evaluate", "--policy", "model",
               "--model", "small", "--engine", "fast", "--tasks", str(tasks_file), "--out", str(out), "--overwrite",
               "--budget", str(args.budget), "--prefix-cache", cache, "--bootstrap", "200", "--workers", "2"]
        env = None
        if name == "before":
            if not args.before_src:
                raise SystemExit("the run 'before' needs --before-src")
            env = {**os.environ, "PYTHONPATH": os.path.abspath(args.before_src)}
            cmd = [sys.executable, "-m", "omtr", *cmd[cmd.index("--") + 1:cmd.index("--prefix-cache")],
                   "--bootstrap", "200", "--workers", "2"]
            cache, order = "none (the version before)", "before"
        print(f"[prefix-cache] {name} ...", flush=True)
        rc, wall, rss = timed(cmd, work / f"{name}.log", env)
        if rc != 0:
            print((work / f"{name}.log").read_text()[-3000:], file=sys.stderr)
            raise SystemExit(f"run {name} failed ({rc})")
        m = json.loads((out / "metrics.json").read_text())
        cache_rep = m.get("prefix_cache") or {}
        tm = m.get("timing", {})
        row = {
            "prefix_cache": cache,
            "prompt_order": {"new": "shared first", "old": "former (task first)", "before": "former (task first)"}[order],
            "command_s": round(wall, 1), "peak_rss_mib": round(rss),
            # the command's start to the end of the first batch's prefill (the versions alike: from the
            # timing in metrics.json and the traces)
            "first_token_s": round(sum(tm.get(k) or 0 for k in ("load_tasks_s", "load_policy_s", "start_solver_s"))
                                   + first_prefill_s(out), 1),
            "first_token_after_load_s": cache_rep.get("first_token_s"),
            "prefill_tokens_computed": cache_rep.get("computed_tokens"),
            "prefill_tokens_cached": cache_rep.get("cached_tokens"),
            "prefill_s": cache_rep.get("prefill_s"),
            "cache_blocks": cache_rep.get("blocks"), "cache_mb": cache_rep.get("mb"),
            "time": where_time_went(out, m),
            "success": m.get("success"), "faithful": m.get("faithful"),
            "outcomes": {"solved": sum(bool(r.get("success")) for r in traces(out).values()),
                         "faithful": sum(bool((r.get("faithful") or {}).get("faithful")) for r in traces(out).values()),
                         "tasks": len(traces(out))},
        }
        result["runs"][name] = row
        print(f"[prefix-cache] {name}: {json.dumps(row)}", flush=True)
    if "on" in result["runs"] and "off" in result["runs"]:
        on, off = traces(work / "on"), traces(work / "off")
        same = [i for i in off if i in on and outcome_key(on[i]) == outcome_key(off[i])]
        result["identical_greedy_outcomes"] = {"tasks": len(off), "identical": len(same),
                                               "differ": sorted(set(off) - set(same))}
        a, b = result["runs"]["off"], result["runs"]["on"]
        result["speedup"] = {"command": round(a["command_s"] / b["command_s"], 2),
                             "first_token": round(a["first_token_s"] / max(b["first_token_s"], 1e-9), 2),
                             "prefill_tokens": round(a["prefill_tokens_computed"] / max(b["prefill_tokens_computed"], 1), 2)}
    if "served" in runs:
        served = {}
        for cache in ("on", "off"):
            out = work / f"served-{cache}.json"
            cmd = [*me, "--child", "served", "--tasks", str(tasks_file), "--cache", cache, "--child-out", str(out),
                   "--budget", str(args.budget)]
            print(f"[prefix-cache] served, cache {cache} ...", flush=True)
            rc, wall, rss = timed(cmd, work / f"served-{cache}.log")
            if rc != 0:
                print((work / f"served-{cache}.log").read_text()[-3000:], file=sys.stderr)
                raise SystemExit(f"served run ({cache}) failed ({rc})")
            served[cache] = {**json.loads(out.read_text()), "peak_rss_mib": round(rss)}
        result["served"] = served
    text = json.dumps(result, indent=2) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
