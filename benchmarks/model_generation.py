"""Generation speed of the role model under each decoding constraint: off, plain, scoped.

    python benchmarks/model_generation.py                 # SmolLM2 (small), batch 8, one-shot Actor prompts
    python benchmarks/model_generation.py --model micro --batch 4 --max-new-tokens 128
    python benchmarks/model_generation.py --modes plain,scoped --greedy

Prints one JSON object: load time, prompt length, and per mode the wall time, new tokens, tokens/s,
prefill, grammar and scope milliseconds, the grammar's and the scope rules' shares of decode time
(the scope rules' milliseconds summed over the batch's sequences, over the batch's decode time;
the grammar's include the scope rules'), finish reasons (a sequence stops once its domain and
problem blocks are closed), and lint's category for each output (``lint_ok`` when lint finds nothing; the planner is
not run). The modes run one after the other in one process on the same prompts.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass


@dataclass
class _Task:
    nl: str
    family: str | None = "gripper"


TASKS = [
    "A robot with two grippers is in room a. Balls ball1 and ball2 are in room a. Move both balls to room b.",
    "The robot is in room b. Ball ball1 is in room a. Bring ball1 to room b.",
    "Two rooms, a and b. The robot is in room a with ball1. Put ball1 in room b and return to room a.",
    "Ball ball1 is in room b and ball2 is in room a. The robot starts in room a. Move every ball to room a.",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small", help="profile or model directory (default small)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--modes", default="off,plain,scoped", help="comma-separated decoding constraints: off, plain, scoped")
    ap.add_argument("--greedy", action="store_true", help="greedy decoding (default: temperature 0.7)")
    args = ap.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from omtr.inference.extract import extract_spec, spec_complete
    from omtr.inference.prompts import actor_messages
    from omtr.model import load_model
    from omtr.policy import Sampling
    from omtr.solver.lint import lint

    t0 = time.perf_counter()
    model = load_model(args.model)
    load_s = time.perf_counter() - t0
    prompts = [actor_messages(_Task(TASKS[i % len(TASKS)])) for i in range(args.batch)]
    result = {"model": args.model, "batch": args.batch, "load_s": round(load_s, 2),
              "prompt_tokens": max(len(p) for p in model.encode_prompts(prompts)), "threads": torch.get_num_threads()}
    model.grammar  # compile outside the timed runs
    for mode in [m.strip() for m in args.modes.split(",")]:
        sampling = Sampling(greedy=args.greedy, temperature=0.7, top_p=0.95, max_new_tokens=args.max_new_tokens, seed=0)
        t = time.perf_counter()
        gens = model.generate("actor", prompts, sampling, constraint=mode, stop_when=spec_complete)
        wall = time.perf_counter() - t
        new = sum(len(g.token_ids) for g in gens)
        categories: dict[str, int] = {}
        for g in gens:
            ex = extract_spec(g.text)
            cat = "syntax"  # nothing to extract is a syntax verdict
            if ex.ok:
                err = lint(ex.domain, ex.problem).error
                cat = err.category.value if err else "lint_ok"
            categories[cat] = categories.get(cat, 0) + 1
        tm = gens[0].timings
        decode_ms = max(g.timings["decode_ms"] for g in gens)
        scope_ms = sum(g.timings.get("scope_ms", 0.0) for g in gens)
        result[mode] = {
            "wall_s": round(wall, 2), "new_tokens": new, "tokens_per_s": round(new / wall, 1),
            "prefill_ms": round(tm["prefill_ms"]), "decode_ms": round(decode_ms), "grammar_ms": round(tm["grammar_ms"]),
            "scope_ms": round(scope_ms), "grammar_share_of_decode": round(tm["grammar_ms"] / decode_ms, 3) if decode_ms else None,
            "scope_share_of_decode": round(scope_ms / decode_ms, 3) if decode_ms and scope_ms else None,
            "scope_fallbacks": int(sum(g.timings.get("scope_fallbacks", 0) for g in gens)),
            "scope_left": int(sum(g.timings.get("scope_left", 0) for g in gens)),
            "finish": [g.finish_reason for g in gens], "lint": categories,
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
