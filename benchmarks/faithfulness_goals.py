"""Goals compared by the states they accept: agreement with the exact oracle, and timings.

1. Held-out goal pairs on small tasks of the four families (``omtr.faithfulness.oracle``):
   implied literals added, redundant ones dropped, symmetries of the initial state, strengthening,
   weakening, swapped goal targets, unrelated goals; half of the generated specs fully renamed.
   Prints, per family and per kind, how often the checker agrees with the brute-force oracle,
   how often it called a non-equivalent pair faithful (must be 0), how often it was undecided and
   how often a goal edit was blamed on something other than the goal (must be 0).
2. Time per check on PlanBench BlocksWorld instance-1 and the largest PlanBench Logistics
   instance, for a renamed copy and for goal mutants: ``cold`` is the first check of a reference
   (Fast Downward's invariant synthesis, grounding and state enumeration included), ``warm`` the
   median of later checks against the same reference (what an evaluation run sees).

    python benchmarks/faithfulness_goals.py                 # 2 seeds x 6 tasks per family
    python benchmarks/faithfulness_goals.py --seeds 5 --tasks 8 --repeats 20
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import Counter, defaultdict

from omtr.faithfulness import check
from omtr.faithfulness import goals
from omtr.faithfulness.mutators import MUTATORS, rename_all
from omtr.faithfulness.oracle import FAMILIES, held_out_pairs
from omtr.paths import benchmarks_dir, planbench_family


def agreement(root, seeds: int, tasks: int) -> bool:
    ok = True
    by_kind: dict[str, Counter] = defaultdict(Counter)
    for family in FAMILIES:
        c = Counter()
        for seed in range(seeds):
            for n, (d, pa, pb, kind, same) in enumerate(held_out_pairs(family, root, 1000 + seed, tasks)):
                gen = (d, pb) if n % 2 else rename_all(d, pb, random.Random(n))
                r = check((d, pa), gen)
                row = {"pairs": 1, "equivalent": int(same), "agree": int(r.faithful == same),
                       "false_faithful": int(r.faithful and not same),
                       "undecided": int("goal_undecided" in r.categories),
                       "not_blamed_on_goal": int(not same and not (r.first_category or "").startswith("goal_"))}
                c.update(row)
                by_kind[kind].update(row)
        print(f"{family:14s} {c['agree']}/{c['pairs']} agree with the oracle ({c['equivalent']} equivalent), "
              f"false faithful {c['false_faithful']}, undecided {c['undecided']}, "
              f"drift not blamed on the goal {c['not_blamed_on_goal']}")
        ok &= c["agree"] == c["pairs"] and not c["false_faithful"] and not c["not_blamed_on_goal"]
    for kind, c in sorted(by_kind.items()):
        print(f"  {kind:18s} {c['agree']}/{c['pairs']} agree ({c['equivalent']} equivalent)")
    return ok


def _time(ref, gen, repeats: int) -> tuple[float, float, str]:
    goals._CACHE.clear()
    goals._INVARIANTS.clear()
    t = time.perf_counter()
    r = check(ref, gen)
    cold = (time.perf_counter() - t) * 1e3
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        check(ref, gen)
        ts.append((time.perf_counter() - t) * 1e3)
    verdict = "faithful" if r.faithful else r.first_category
    return cold, statistics.median(ts), verdict


def timings(root, repeats: int) -> None:
    by_name = {m.name: m for m in MUTATORS}
    bw_d, bw_files = planbench_family("blocksworld", root)
    bw_files = sorted(bw_files, key=lambda f: int(f.stem.rsplit("-", 1)[1]))[:30]  # instance-1 first
    bw = (bw_d, bw_files[0].read_text())
    with open(root / "planbench" / "plan_generation" / "logistics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    big = max(rows, key=lambda r: r["n_objects"])
    lg = ((root / big["domain_pddl_path"]).read_text(), (root / big["problem_pddl_path"]).read_text())
    label = {"BlocksWorld instance-1 (or the next instance the mutator applies to)": bw,
             f"Logistics {big['problem_pddl_path'].rsplit('/', 1)[1]} ({big['n_objects']} objects)": lg}
    spare = {"BlocksWorld instance-1 (or the next instance the mutator applies to)": [f.read_text() for f in bw_files[1:]]}
    kinds = ["rename_all", "add_implied_goal_atoms", "drop_redundant_goal_atoms", "symmetric_goal",
             "drop_goal_atom", "add_goal_atom", "swap_goal_targets", "rename+swap_goal_targets"]
    for name, (d, p) in label.items():
        print(f"== {name}: ms per check (cold = first check of the reference, warm = median of {repeats})")
        for kind in kinds:
            mut = by_name[kind]
            out = None
            for p2 in [p, *spare.get(name, [])]:
                for k in range(10):
                    out = mut.fn(d, p2, random.Random(k))
                    if out is not None:
                        break
                if out is not None:
                    break
            if out is None:
                print(f"  {kind:26s} does not apply")
                continue
            ref, gen = ((out, (d, p2)) if mut.reverse else ((d, p2), out))
            cold, warm, verdict = _time(ref, gen, repeats)
            print(f"  {kind:26s} cold {cold:7.1f}  warm {warm:6.1f}  -> {verdict}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--tasks", type=int, default=6, help="initial states per family and seed")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args(argv)
    root = benchmarks_dir(required=True)
    ok = agreement(root, args.seeds, args.tasks)
    timings(root, args.repeats)
    print("oracle agreement: every pair" if ok else "ORACLE DISAGREEMENT")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
