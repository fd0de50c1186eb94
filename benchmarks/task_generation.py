"""How long task generation takes, per family, with and without planner verification.

    python benchmarks/task_generation.py             # 1,000 tasks per family
    python benchmarks/task_generation.py --n 200 --workers 2
"""

from __future__ import annotations

import argparse
import time

from omtr.config import SolverConfig
from omtr.tasks.generators import families, generate


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-verify", action="store_true", help="skip the planner-verified runs")
    args = ap.parse_args(argv)
    print(f"{'family':<22}{'tasks':>7}{'no verify (s)':>15}{'tasks/s':>10}{'verify (s)':>12}{'tasks/s':>10}")
    for family in families():
        t0 = time.perf_counter()
        tasks = generate(family, args.n, seed=args.seed, verify=False)
        plain = time.perf_counter() - t0
        line = f"{family:<22}{len(tasks):>7}{plain:>15.2f}{len(tasks) / plain:>10.0f}"
        if not args.no_verify:
            t0 = time.perf_counter()
            tasks = generate(family, args.n, seed=args.seed, verify=True, workers=args.workers,
                             solver_config=SolverConfig(cache=False))
            verified = time.perf_counter() - t0
            line += f"{verified:>12.2f}{len(tasks) / verified:>10.0f}"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
