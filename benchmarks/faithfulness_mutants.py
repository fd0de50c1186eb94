"""The faithfulness checker's mutation suite and timings, printed as tables.

For every family (BlocksWorld, Mystery BlocksWorld, Logistics, Gripper) and both reference
sources (PlanBench files and ``omtr.tasks.generators``), every mutator of
``omtr.faithfulness.mutators`` is applied to N references and checked against the original.
Prints the confusion table per family (expected label x the checker's first finding), the
verdict accuracy (target 100%) and first-category accuracy (target >= 95%), then the time to
check one faithful pair: a BlocksWorld instance and the largest PlanBench Logistics instance
(by object count), each against its fully renamed and reordered copy.

    python benchmarks/faithfulness_mutants.py               # 10 references per family and source
    python benchmarks/faithfulness_mutants.py --n 25 --seed 3 --source planbench
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

from omtr.faithfulness import check
from omtr.paths import benchmarks_dir, planbench_family
from omtr.faithfulness.mutators import (
    FAMILIES,
    accuracy,
    format_table,
    rename_all,
    reorder,
    run_suite,
)


def _time_pair(d: str, p: str, repeats: int) -> tuple[float, float]:
    gd, gp = reorder(*rename_all(d, p, random.Random(1)), random.Random(2))
    assert check((d, p), (gd, gp)).faithful
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        check((d, p), (gd, gp))
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts), max(ts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10, help="references per family and source (default 10)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--source", choices=["planbench", "generators", "both"], default="both")
    ap.add_argument("--repeats", type=int, default=20, help="timing repetitions (default 20)")
    args = ap.parse_args(argv)

    ok = True
    for source in (["planbench", "generators"] if args.source == "both" else [args.source]):
        rows = run_suite(FAMILIES, n_per_family=args.n, seed=args.seed, source=source)
        print(f"### source: {source}")
        print(format_table(rows))
        for fam, a in accuracy(rows).items():
            ok &= a["verdict_accuracy"] == 1.0 and a["first_category_accuracy"] >= 0.95
        print()

    root = benchmarks_dir(required=True)
    bw_d, bw_files = planbench_family("blocksworld", root)
    bw_p = bw_files[0].read_text()  # instance-1
    med, worst = _time_pair(bw_d, bw_p, args.repeats)
    print(f"BlocksWorld instance-1 vs renamed copy: median {med:.2f} ms, max {worst:.2f} ms")
    with open(root / "planbench" / "plan_generation" / "logistics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    big = max(rows, key=lambda r: r["n_objects"])
    ld = (root / big["domain_pddl_path"]).read_text()
    lp = (root / big["problem_pddl_path"]).read_text()
    med, worst = _time_pair(ld, lp, args.repeats)
    print(f"largest PlanBench Logistics ({big['problem_pddl_path'].rsplit('/', 1)[1]}, {big['n_objects']} objects) "
          f"vs renamed copy: median {med:.2f} ms, max {worst:.2f} ms")
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
