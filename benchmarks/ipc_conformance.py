"""Conformance on a benchmark collection: every task the naive way solves, omtr must solve too.

The collection is laid out like Fast Downward's benchmark repository (downward-benchmarks): one
folder per domain, holding problem files (``p01.pddl``, ``prob01.pddl``, ``instance-1.pddl``, ...)
and either one ``domain.pddl`` or a domain per problem. Domains are found with the planner
driver's own naming rules, in its order: ``domain.pddl``, ``<stem>-domain.pddl``,
``<first 3 characters>-domain.pddl`` (airport), ``domain_<name>``, ``domain-<name>``. A folder
where no problem has a domain is skipped and reported.

From each folder the ``--per-domain`` smallest problem files (by size) are taken, and each task
is solved two ways:

  naive  Fast Downward's driver (``--alias lama-first``, ``--overall-time-limit``) as a fresh
         subprocess, then VAL on its plan; solved = VAL says "Plan valid"
  omtr   omtr.solver.SolverPool (lint, planner, VAL), result cache off

Prints the counts and every task the naive way solves but omtr does not (domain, problem, omtr's
category and message): that list must be empty, and the exit status is 1 when it is not. Tasks
that omtr answers ``too_large`` (its own input size limit) are listed apart; ``--rerun-too-large``
solves them again with the limit raised. The reverse list (omtr solves, naive does not) is shown
too. Benchmark files are read as bytes and never copied anywhere.

    python benchmarks/ipc_conformance.py --root ~/downward-benchmarks
    python benchmarks/ipc_conformance.py --root DIR --per-domain 1 --workers 4 --json out.json
    python benchmarks/ipc_conformance.py --root DIR --domains zenotravel storage 'psr-*'
    python benchmarks/ipc_conformance.py --root DIR --rerun-too-large          # limit raised to 16 MiB
    python benchmarks/ipc_conformance.py --root DIR --max-file-bytes 1000000 --quiet
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import logging
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from omtr.config import SolverConfig
from omtr.progress import Progress
from omtr.solver import SolverPool
from omtr.solver.naive import plain_driver_run

log = logging.getLogger("omtr.ipc_conformance")

RERUN_BYTES = 16 * 1024 * 1024


@dataclass
class Task:
    domain: str  # the folder's name
    problem: str  # the problem file's name
    domain_file: str  # the domain file's name
    problem_bytes: int
    domain_bytes: int
    naive: dict = field(default_factory=dict)
    omtr: dict = field(default_factory=dict)


def is_domain_file(name: str) -> bool:
    stem = name[:-5] if name.endswith(".pddl") else name
    return stem == "domain" or stem.startswith(("domain_", "domain-")) or stem.endswith(("-domain", "_domain"))


def domain_for(problem: Path) -> Path | None:
    """The domain file the planner driver would pick for ``problem`` (its rules, its order)."""
    for name in ("domain.pddl", problem.stem + "-domain" + problem.suffix, problem.name[:3] + "-domain.pddl",
                 "domain_" + problem.name, "domain-" + problem.name):
        path = problem.parent / name
        if path.is_file():
            return path
    return None


def discover(root: Path, per_domain: int, patterns: list[str] | None) -> tuple[list[Task], list[str]]:
    """The tasks to run, and the folders skipped for want of a domain file."""
    tasks, skipped = [], []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if patterns and not any(fnmatch.fnmatch(folder.name, pat) for pat in patterns):
            continue
        problems = [p for p in folder.glob("*.pddl") if p.is_file() and not is_domain_file(p.name)]
        paired = [(p, d) for p in problems if (d := domain_for(p)) is not None]
        if not paired:
            if problems:  # problem files, but none has a domain file the driver would find
                skipped.append(folder.name)
            continue
        paired.sort(key=lambda pd: (pd[0].stat().st_size, pd[0].name))
        for p, d in paired[:per_domain]:
            tasks.append(Task(folder.name, p.name, d.name, p.stat().st_size, d.stat().st_size))
    return tasks, skipped


def files_of(root: Path, t: Task) -> tuple[bytes, bytes]:
    folder = root / t.domain
    return (folder / t.domain_file).read_bytes(), (folder / t.problem).read_bytes()


def run_naive(root: Path, tasks: list[Task], args) -> None:
    bar = Progress(len(tasks), "naive (driver + VAL)", quiet=args.quiet)

    def one(t: Task) -> None:
        d, p = files_of(root, t)
        t0 = time.monotonic()
        r = plain_driver_run(d, p, time_limit_s=args.time_limit, memory_limit_mb=args.memory_limit)
        t.naive = {"solved": r.solved, "planned": r.planned, "wall_s": round(time.monotonic() - t0, 2),
                   "output_tail": r.output[-400:]}
        bar.update()

    with ThreadPoolExecutor(args.workers) as ex:
        list(ex.map(one, tasks))
    bar.close()


def run_omtr(root: Path, tasks: list[Task], cfg: SolverConfig, args, desc: str = "omtr") -> None:
    bar = Progress(len(tasks), desc, quiet=args.quiet)
    with SolverPool(args.workers, cfg) as pool:
        def one(t: Task) -> None:
            d, p = files_of(root, t)
            v = pool.solve(d, p, cfg)
            t.omtr = {"success": v.success, "category": v.category.value if v.category else None,
                      "message": v.message, "stage": v.stage, "too_large": v.too_large,
                      "timed_out": v.timed_out, "memory_out": v.memory_out, "plan_length": v.plan_length,
                      "warnings": v.warnings, "max_file_bytes": cfg.max_file_bytes,
                      "total_ms": round(v.timings.get("total_ms", 0.0), 1)}
            bar.update()

        with ThreadPoolExecutor(args.workers) as ex:
            list(ex.map(one, tasks))
    bar.close()


def one_line(s: str, n: int = 160) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 1] + "…"


def report(tasks: list[Task], skipped: list[str], rerun: list[Task], out=sys.stdout) -> dict:
    naive_ok = [t for t in tasks if t.naive.get("solved")]
    omtr_ok = [t for t in tasks if t.omtr.get("success")]
    too_large = [t for t in tasks if t.omtr.get("too_large")]
    missed = [t for t in naive_ok if not t.omtr.get("success") and not t.omtr.get("too_large")]
    extra = [t for t in omtr_ok if not t.naive.get("solved")]
    domains = sorted({t.domain for t in tasks})

    def w(line: str = "") -> None:
        print(line, file=out)

    w(f"\n{len(tasks)} tasks from {len(domains)} domains"
      + (f" ({len(skipped)} folders without a domain file skipped: {', '.join(skipped)})" if skipped else ""))
    w(f"  {'':32} {'tasks':>6} {'naive':>6} {'omtr':>6}")
    for dom in domains:
        ts = [t for t in tasks if t.domain == dom]
        missed = [t for t in ts if t.naive.get("solved") and not t.omtr.get("success")]
        flag = ("" if not missed else "   <-- omtr misses" if any(not t.omtr.get("too_large") for t in missed)
                else "   (too_large)")
        w(f"  {dom[:32]:32} {len(ts):6} {sum(bool(t.naive.get('solved')) for t in ts):6} "
          f"{sum(bool(t.omtr.get('success')) for t in ts):6}{flag}")
    w(f"  {'total':32} {len(tasks):6} {len(naive_ok):6} {len(omtr_ok):6}")

    w(f"\nnaive solves, omtr does not ({len(missed)}; must be 0):")
    for t in missed:
        o = t.omtr
        limit = " [time limit]" if o.get("timed_out") else " [memory limit]" if o.get("memory_out") else ""
        w(f"  {t.domain}/{t.problem} (domain {t.domain_file}): {o.get('category')}{limit} at "
          f"{o.get('stage')}: {one_line(o.get('message', ''))}")
    w(f"\nomtr solves, naive does not ({len(extra)}):")
    for t in extra:
        w(f"  {t.domain}/{t.problem}: {one_line(t.naive.get('output_tail', ''), 120)}")
    w(f"\ntoo_large under omtr's size limits ({len(too_large)}; a limit, not a verdict on the spec):")
    for t in too_large:
        w(f"  {t.domain}/{t.problem} (domain {t.domain_bytes} B, problem {t.problem_bytes} B): "
          f"{one_line(t.omtr.get('message', ''))}")
    if rerun:
        ok = [t for t in rerun if t.omtr.get("success")]
        w(f"\nrerun of the too_large tasks with max_file_bytes={rerun[0].omtr.get('max_file_bytes')}: "
          f"{len(ok)}/{len(rerun)} solved by omtr")
        for t in rerun:
            o = t.omtr
            status = "solved" if o.get("success") else f"{o.get('category')}: {one_line(o.get('message', ''))}"
            w(f"  {t.domain}/{t.problem}: naive {'solved' if t.naive.get('solved') else 'not solved'}, "
              f"omtr {status}")
    rerun_missed = [t for t in rerun if t.naive.get("solved") and not t.omtr.get("success")]
    return {"tasks": len(tasks), "domains": len(domains), "skipped_folders": skipped,
            "naive_solved": len(naive_ok), "omtr_solved": len(omtr_ok), "too_large": len(too_large),
            "naive_only": [f"{t.domain}/{t.problem}" for t in missed],
            "omtr_only": [f"{t.domain}/{t.problem}" for t in extra],
            "too_large_tasks": [f"{t.domain}/{t.problem}" for t in too_large],
            "rerun_naive_only": [f"{t.domain}/{t.problem}" for t in rerun_missed]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, type=Path, help="a checkout laid out like downward-benchmarks")
    ap.add_argument("--per-domain", type=int, default=2, metavar="N",
                    help="the N smallest problem files (by size) of each domain (default 2)")
    ap.add_argument("--domains", nargs="+", metavar="GLOB", help="only folders matching one of these")
    ap.add_argument("--time-limit", type=float, default=20.0, metavar="S",
                    help="time limit of each way in seconds (default 20)")
    defaults = SolverConfig()
    ap.add_argument("--memory-limit", type=int, default=defaults.memory_limit_mb, metavar="MB",
                    help=f"memory limit of each way in MiB (default: omtr's, {defaults.memory_limit_mb})")
    ap.add_argument("--workers", type=int, default=2, help="tasks run at once, each way (default 2)")
    ap.add_argument("--max-file-bytes", type=int, default=defaults.max_file_bytes, metavar="N",
                    help=f"omtr's input size limit (default: omtr's, {defaults.max_file_bytes})")
    ap.add_argument("--rerun-too-large", type=int, nargs="?", const=RERUN_BYTES, metavar="BYTES",
                    help=f"solve the too_large tasks again with this limit (default {RERUN_BYTES}) and "
                    "the deepest nesting allowed")
    ap.add_argument("--json", type=Path, metavar="OUT", help="write per-task results and the summary here")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    args = ap.parse_args(argv)
    if args.per_domain < 1 or args.workers < 1:
        ap.error("--per-domain and --workers must be at least 1")
    if not args.root.is_dir():
        ap.error(f"--root {args.root}: not a directory")
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s")

    tasks, skipped = discover(args.root, args.per_domain, args.domains)
    if not tasks:
        print(f"no tasks under {args.root} (folders without a domain file: {len(skipped)})", file=sys.stderr)
        return 2
    cfg = SolverConfig(time_limit_s=args.time_limit, memory_limit_mb=args.memory_limit, cache=False,
                       max_file_bytes=args.max_file_bytes)
    run_naive(args.root, tasks, args)
    run_omtr(args.root, tasks, cfg, args)
    rerun: list[Task] = []
    if args.rerun_too_large:
        big = [t for t in tasks if t.omtr.get("too_large")]
        if big:
            rerun = [Task(t.domain, t.problem, t.domain_file, t.problem_bytes, t.domain_bytes, naive=t.naive)
                     for t in big]
            run_omtr(args.root, rerun, cfg.replace(max_file_bytes=args.rerun_too_large, max_nesting=500),
                     args, desc="omtr (too_large rerun)")
    summary = report(tasks, skipped, rerun)
    if args.json:
        args.json.write_text(json.dumps({
            "settings": {"root": str(args.root), "per_domain": args.per_domain, "time_limit_s": args.time_limit,
                         "memory_limit_mb": args.memory_limit, "workers": args.workers,
                         "max_file_bytes": args.max_file_bytes, "rerun_too_large": args.rerun_too_large},
            "summary": summary,
            "tasks": [asdict(t) for t in tasks],
            "rerun": [asdict(t) for t in rerun],
        }, indent=1))
    return 1 if summary["naive_only"] or summary["rerun_naive_only"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
