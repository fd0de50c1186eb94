"""The fast engine's prefill and Judge scoring, its attention paths side by side, in one process.

    python benchmarks/engine_prefill.py --out docs/results/engine-prefill-DATE.json
    python benchmarks/engine_prefill.py --count 4 --reps 1            # a smoke run
    python benchmarks/engine_prefill.py --tasks my-tasks.jsonl --max-new-tokens 256

The sample is ``benchmarks/evaluate_profile.py``'s (``--count`` PlanBench tasks, domain given,
``--seed`` 5519). The `small` policy is loaded once; two fast engines are built over it, the same
but for the rows' prefill attention: ``split`` (the default: the segment's prefix and each row's
own tokens in two flash passes merged by log-sum-exp) and ``masked`` (``split_attention=False``:
one masked pass over ``[prefix; own keys]`` per segment). The Actor's answers are generated once
(greedy, the split engine), so that both engines' Judge sees the same prompts (task, given domain,
answer, checks: what ``omtr evaluate`` scores).

Then, ``--reps`` times, the engines in turn (alternating, the prefix cache cleared before each
measure): the Actor's prefill of all the prompts as one batch (``generate`` of one token: the
prefill and a single decode step) and the Judge's scoring of all the answers. Reported: seconds
each (best and all), the ratio masked/split, prompt tokens computed, the largest difference of the
Judge's scores between the engines and whether the first tokens agree. One JSON object to stdout
and ``--out``. Measure alone on the machine: two processes' threads on two cores halve each other.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger("engine_prefill")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", help="a task file (default: evaluate_profile's PlanBench sample)")
    ap.add_argument("--count", type=int, default=18, help="sample size (default 18)")
    ap.add_argument("--seed", type=int, default=5519, help="the sample's draw (default 5519)")
    ap.add_argument("--model", default="small", help="model profile or folder (default small)")
    ap.add_argument("--reps", type=int, default=2, help="measures of each engine (default 2)")
    ap.add_argument("--max-new-tokens", type=int, default=512, help="the Actor's answers (default 512)")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch

    from evaluate_profile import build_sample

    from omtr.inference.loading import load_policy
    from omtr.inference.prompts import actor_messages, given_domain, judge_messages
    from omtr.policy import Sampling
    from omtr.rollout import make_engine
    from omtr.tasks.records import load_tasks

    if args.tasks:
        path = Path(args.tasks)
    else:
        path = Path(tempfile.mkdtemp(prefix="engine_prefill_")) / "tasks.jsonl"
        build_sample(path, args.count, args.seed, "seeded")
    tasks = load_tasks(path)
    policy = load_policy(args.model, engine="hf")
    engines = {"split": make_engine("fast", policy), "masked": make_engine("fast", policy, split_attention=False)}
    prompts = [actor_messages(t) for t in tasks]
    domains = [given_domain(t) for t in tasks]
    t0 = time.perf_counter()
    answers = engines["split"].generate("actor", prompts, Sampling(greedy=True, max_new_tokens=args.max_new_tokens),
                                        domains=domains)
    log.info("answers: %d tokens in %.1f s", sum(len(a.token_ids) for a in answers), time.perf_counter() - t0)
    judge_prompts = [judge_messages(t, a.text, checks=True) for t, a in zip(tasks, answers)]
    one = Sampling(greedy=True, max_new_tokens=1)
    runs: dict = {n: {"prefill_s": [], "judge_s": [], "computed_tokens": {}} for n in engines}
    scores, firsts = {}, {}
    for rep in range(args.reps):
        for name in (("split", "masked") if rep % 2 == 0 else ("masked", "split")):
            e = engines[name]
            for what in ("prefill", "judge"):
                e.prefix_cache.clear()
                e.reset_stats()
                t = time.perf_counter()
                if what == "prefill":
                    firsts[name] = [g.token_ids for g in e.generate("actor", prompts, one, domains=domains)]
                else:
                    scores[name] = e.judge(judge_prompts)
                runs[name][f"{what}_s"].append(round(time.perf_counter() - t, 2))
                runs[name]["computed_tokens"][what] = e.prefill_stats["computed_tokens"]
            log.info("[%s] rep %d: prefill %.1f s, judge %.1f s", name, rep, runs[name]["prefill_s"][-1],
                     runs[name]["judge_s"][-1])
    for r in runs.values():
        r["prefill_best_s"], r["judge_best_s"] = min(r["prefill_s"]), min(r["judge_s"])
    result = {
        "benchmark": "engine_prefill", "date": time.strftime("%Y-%m-%d"), "model": args.model, "cores": os.cpu_count(),
        "threads": torch.get_num_threads(), "tasks": len(tasks), "sample": str(path),
        "prefill_wide": engines["split"].prefill_wide, "runs": runs,
        "masked_over_split": {w: round(runs["masked"][f"{w}_best_s"] / runs["split"][f"{w}_best_s"], 2)
                              for w in ("prefill", "judge")},
        "judge_scores_max_abs_diff": max(abs(a - b) for a, b in zip(scores["split"], scores["masked"])),
        "first_tokens_equal": sum(a == b for a, b in zip(firsts["split"], firsts["masked"])),
    }
    text = json.dumps(result, indent=2) + "\n"
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
