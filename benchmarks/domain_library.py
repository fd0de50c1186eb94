"""The domain library, measured (issue 43, part 3).

1. Matching accuracy per family on held-out English: PlanBench's tasks of its four domains (all of
   them), generated tasks of the four generator families (fresh seeds), and the hand-written
   plain-English tasks of ``tests/data/handwritten_tasks.jsonl``. A task counts as matched when the
   library picks its own family's domain; ``ambiguous`` and ``none`` are the full-mode outcomes.
2. With ``--faithful``: the small model (greedy, budget 1, the fast engine) on the hand-written
   tasks with the library (a matched task runs domain-given with the library's domain) and without
   (every task in the full mode), through ``omtr evaluate``: solved, supported and faithful (the
   checker against each task's reference) per condition, and the README's serving example's answer.

    PYTHONPATH=src python benchmarks/domain_library.py                       # matching only, ~10 s
    PYTHONPATH=src python benchmarks/domain_library.py --faithful --out docs/results/domain-library.json

Results: docs/results/domain-library-*.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HANDWRITTEN = ROOT / "tests" / "data" / "handwritten_tasks.jsonl"
README_TASK = "There are two blocks, a and b, on the table. Put a on b."


def matching(per_family: int, seed: int) -> dict:
    from omtr.tasks import load_tasks
    from omtr.tasks.generators import generate
    from omtr.faithfulness.signals import statement_of
    from omtr.tasks.library import shipped_library
    from omtr.tasks.planbench import import_planbench
    from omtr.tasks.planbench_data import shipped_root

    lib = shipped_library()
    sets = {"planbench": import_planbench(shipped_root()),
            "generated": [t for fam in ("blocksworld", "mystery_blocksworld", "logistics", "gripper")
                          for t in generate(fam, per_family, seed, split="test", verify=False)],
            "handwritten": load_tasks(HANDWRITTEN)}
    # PlanBench's statements alone, without the domain's description before them: the harder case
    sets["planbench_statement"] = [dataclasses.replace(t, nl=statement_of(t.nl)) for t in sets["planbench"]]
    out = {}
    for name, tasks in sets.items():
        fams: dict[str, Counter] = {}
        for t in tasks:
            m = lib.match(t.nl)
            outcome = ("matched" if m.source == f"library:{t.family}" else
                       "ambiguous" if m.reason.startswith("ambiguous") else
                       "none" if m.domain is None else f"wrong:{m.domain.name}")
            fams.setdefault(t.family, Counter())[outcome] += 1
        out[name] = {f: {"tasks": sum(c.values()), "accuracy": round(c["matched"] / sum(c.values()), 4), **dict(c)}
                     for f, c in sorted(fams.items())}
    return out


def _write(path: Path, tasks) -> None:
    from omtr.tasks.records import write_tasks

    write_tasks(path, tasks)


def faithful(args) -> dict:
    """The hand-written tasks through ``omtr evaluate`` with and without the library's domains."""
    from omtr.cli import main
    from omtr.tasks import load_tasks
    from omtr.tasks.library import shipped_library

    tasks = load_tasks(args.tasks)[: args.limit]
    lib = shipped_library()
    with_lib = []
    for t in tasks:
        m = lib.match(t.nl)
        with_lib.append(dataclasses.replace(t, domain=m.domain.domain if m.domain else None))
    out = {}
    with tempfile.TemporaryDirectory(prefix="omtr-domain-library-") as tmp:
        for cond, ts in (("library", with_lib), ("no_library", tasks)):
            if cond not in args.conditions.split(","):
                continue
            f = Path(tmp) / f"{cond}.jsonl"
            _write(f, ts)
            t0 = time.perf_counter()
            argv = ["-q", "evaluate", "--policy", "model", "--model", args.model, "--tasks", str(f), "--out",
                    str(Path(tmp) / cond), "--budget", "1", "--engine", args.engine, "--workers", "1",
                    "--bootstrap", "200", "--no-report", "--no-episode-log", "--batch-size", str(args.batch_size)]
            if args.max_new_tokens:
                argv += ["--max-new-tokens", str(args.max_new_tokens)]
            rc = main(argv)
            wall = time.perf_counter() - t0
            m = json.loads((Path(tmp) / cond / "metrics.json").read_text())
            recs = [json.loads(x) for x in (Path(tmp) / cond / "traces.jsonl").read_text().splitlines()]
            by_id = {r["id"]: r for r in recs}
            out[cond] = {"rc": rc, "tasks": len(ts), "wall_s": round(wall, 1),
                         "solved": sum(bool(r.get("success")) for r in recs),
                         "supported": sum(bool(r.get("success")) and r.get("support") == "supported" for r in recs),
                         "faithful": sum(bool((r.get("faithful") or {}).get("faithful")) for r in recs),
                         "faithful_rate": m["faithful"], "success_rate": m["success"], "supported_rate": m["supported"],
                         "support": m["support"],
                         "supported_and_faithful": sum(r.get("support") == "supported" and r.get("success")
                                                       and bool((r.get("faithful") or {}).get("faithful")) for r in recs),
                         "per_task": {i: {"success": r.get("success"), "support": r.get("support"),
                                          "faithful": bool((r.get("faithful") or {}).get("faithful")),
                                          "reasons": r.get("support_reasons")} for i, r in sorted(by_id.items())}}
            readme = next((r for r in recs if next(t for t in ts if t.id == r["id"]).nl == README_TASK), None)
            if readme is not None:
                out[cond]["readme_example"] = {k: readme.get(k) for k in (
                    "success", "support", "support_reasons", "plan", "domain", "problem")} | {
                    "faithful": bool((readme.get("faithful") or {}).get("faithful"))}
            if args.out:  # each condition as it finishes: a long full-mode run keeps what is done
                partial = Path(args.out).with_suffix(".partial.json")
                partial.write_text(json.dumps(out, indent=2) + "\n")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-family", type=int, default=50, help="generated tasks per generator family")
    ap.add_argument("--seed", type=int, default=4300)
    ap.add_argument("--faithful", action="store_true", help="also run the small model with and without the library")
    ap.add_argument("--model", default="small")
    ap.add_argument("--engine", default="fast")
    ap.add_argument("--tasks", default=str(HANDWRITTEN),
                    help="the hand-written tasks to run with --faithful (the held-out 22 by default; "
                         "tests/data/handwritten_tuning.jsonl is the tuning set)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N hand-written tasks")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--conditions", default="library,no_library", help="which of library, no_library to run")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    t0 = time.perf_counter()
    res = {"benchmark": "domain_library", "date": time.strftime("%Y-%m-%d"),
           "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=ROOT).stdout.strip(),
           "machine": {"cpu_count": __import__("os").cpu_count(), "python": platform.python_version()},
           "tasks": str(Path(args.tasks).resolve().relative_to(ROOT)) if Path(args.tasks).resolve().is_relative_to(ROOT)
           else args.tasks,
           "matching": matching(args.per_family, args.seed)}
    for name, fams in res["matching"].items():
        for fam, b in fams.items():
            extra = ", ".join(f"{k} {v}" for k, v in b.items() if k not in ("tasks", "accuracy", "matched"))
            print(f"match {name:11s} {fam:20s} {b.get('matched', 0):4d}/{b['tasks']:<4d} {100 * b['accuracy']:5.1f}%"
                  + (f"  ({extra})" if extra else ""))
    if args.faithful:
        res["faithful"] = faithful(args)
        for cond, b in res["faithful"].items():
            print(f"{cond:10s}: {b['tasks']} tasks, solved {b['solved']}, supported {b['supported']}, faithful "
                  f"{b['faithful']}, supported and faithful {b['supported_and_faithful']} ({b['wall_s']} s)")
            if "readme_example" in b:
                r = b["readme_example"]
                print(f"  README example: success {r['success']}, support {r['support']}, faithful {r['faithful']}, "
                      f"plan {r['plan']}")
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
        print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
