"""What scoped decoding changes on real tasks: categories, success and pass@k, side by side.

    python benchmarks/scoped_decoding.py --full full.jsonl --given given.jsonl --out results.json
    python benchmarks/scoped_decoding.py --full full.jsonl --constraints scoped --samples 0   # greedy only

For each task file (``--full``: the model writes domain and problem; ``--given``: records that carry
their domain, the model writes the problem) and each decoding constraint (plain, scoped), one
process runs the real episode loop (role model, Fast Downward + VAL):

* greedy with a budget of ``--budget`` planner calls (the Actor's step is the budget-1 result);
* ``--samples`` answers per task at temperature 0.7 with a budget of 1: pass@k is the share of
  tasks where at least one of the k samples succeeds (the signal RL has to work with).

Prints one JSON object (and writes it to ``--out`` after every run, so a stopped benchmark keeps
what it measured): per mode and constraint, the Actor's and the final categories, successes at
budget 1 and at the budget, calls per task, pass@k and the scope rules' share of decode time.
Make the task files with ``omtr tasks generate`` (add ``--given-domain`` for the second file).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections import Counter
from pathlib import Path


def _cat(verdict) -> str:
    return "success" if verdict.success else (verdict.category.value if verdict.category else "unknown")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small")
    ap.add_argument("--full", help="task file for the full mode")
    ap.add_argument("--given", help="task file for the domain-given mode (records with 'domain')")
    ap.add_argument("--constraints", default="plain,scoped")
    ap.add_argument("--budget", type=int, default=6)
    ap.add_argument("--samples", type=int, default=8, help="samples per task for pass@k (0: skip)")
    ap.add_argument("--max-new-tokens", type=int, default=448)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--out", default="scoped_decoding.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from omtr.config import SolverConfig
    from omtr.inference.episode import run_episodes
    from omtr.model import load_model
    from omtr.policy import Sampling
    from omtr.solver import SolverPool
    from omtr.tasks.training import load_training_tasks

    model = load_model(args.model)
    base_cfg = model.cfg
    results: dict = {"model": args.model, "budget": args.budget, "samples": args.samples,
                     "max_new_tokens": args.max_new_tokens}
    files = [(m, f) for m, f in (("domain-given", args.given), ("full", args.full)) if f]
    with SolverPool(workers=1, config=SolverConfig(time_limit_s=60)) as pool:
        for mode, path in files:
            tasks = list(load_training_tasks(path))
            for constraint in [c.strip() for c in args.constraints.split(",")]:
                model.cfg = base_cfg.replace(decoding=constraint)
                key = f"{mode}/{constraint}"
                t0 = time.perf_counter()
                greedy = Sampling(greedy=True, max_new_tokens=args.max_new_tokens)
                eps = run_episodes(tasks, model, pool, budget=args.budget, sampling=greedy, batch_size=args.batch_size)
                steps = [s for e in eps for s in e.steps]
                scope_ms = sum(s.times.get("scope_ms", 0.0) for s in steps)
                decode_ms = sum(s.times.get("decode_ms", 0.0) for s in steps)
                row = {
                    "tasks": len(eps),
                    "actor_categories": dict(Counter(_cat(e.steps[0].verdict) for e in eps)),
                    "final_categories": dict(Counter(_cat(e.steps[-1].verdict) for e in eps)),
                    "solved_budget_1": sum(e.steps[0].verdict.success for e in eps),
                    f"solved_budget_{args.budget}": sum(e.success for e in eps),
                    "calls_per_task": round(sum(e.planner_calls for e in eps) / len(eps), 2),
                    "cut_off": sum(s.finish_reason == "length" for s in steps),
                    "syntax_not_cut_off": sum(s.finish_reason != "length" and not s.verdict.success
                                              and _cat(s.verdict) == "syntax" for s in steps),
                    "scope_fallbacks": int(sum(s.times.get("scope_fallbacks", 0.0) for s in steps)),
                    "scope_left": int(sum(s.times.get("scope_left", 0.0) for s in steps)),
                    "scope_ms_per_decode_ms": round(scope_ms / decode_ms, 4) if decode_ms else None,
                    "greedy_wall_s": round(time.perf_counter() - t0, 1),
                    "by_family": {},
                }
                for fam in sorted({e.task.family for e in eps}):
                    fe = [e for e in eps if e.task.family == fam]
                    row["by_family"][fam] = {"tasks": len(fe), "solved_budget_1": sum(e.steps[0].verdict.success for e in fe),
                                             f"solved_budget_{args.budget}": sum(e.success for e in fe)}
                if args.samples:
                    t1 = time.perf_counter()
                    reps = [t for t in tasks for _ in range(args.samples)]
                    samp = Sampling(greedy=False, temperature=0.7, top_p=0.95, max_new_tokens=args.max_new_tokens, seed=7)
                    sep = run_episodes(reps, model, pool, budget=1, sampling=samp, batch_size=args.batch_size, judge=False)
                    hit = {t.id: False for t in tasks}
                    for e in sep:
                        hit[e.task.id] |= e.success
                    row[f"pass@{args.samples}"] = round(sum(hit.values()) / len(hit), 4)
                    row["sample_success_rate"] = round(sum(e.success for e in sep) / len(sep), 4)
                    row["sample_categories"] = dict(Counter(_cat(e.steps[0].verdict) for e in sep))
                    ss = [e.steps[0] for e in sep]
                    row["sample_cut_off"] = sum(s.finish_reason == "length" for s in ss)
                    row["sample_syntax_not_cut_off"] = sum(s.finish_reason != "length" and _cat(s.verdict) == "syntax"
                                                           for s in ss)
                    row["sample_scope_left"] = int(sum(s.times.get("scope_left", 0.0) for s in ss))
                    row["sampling_wall_s"] = round(time.perf_counter() - t1, 1)
                results[key] = row
                Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
                logging.warning("%s: %s", key, json.dumps(row))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
