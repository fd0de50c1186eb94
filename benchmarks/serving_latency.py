"""Seconds for the served model to answer one task, through the pyfunc's ``predict`` in-process.

    python benchmarks/serving_latency.py                 # small model, fast engine, default budget, 1 thread
    python benchmarks/serving_latency.py --engine hf --threads 2

Two requests, one task each, at the endpoint's default limits (``ServingLimits``: budget 6, the
model's own token limit): a domain-given task (BlocksWorld, the domain sent along) and a
full-mode task (the model writes domain and problem). The solver pool is started by a warm-up
request that is not timed. One JSON object to stdout.
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small", help="profile or model directory (default small)")
    ap.add_argument("--engine", default="auto", help="rollout engine (auto: fast on CPU)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from omtr.model import build_model
    from omtr.rollout import default_engine, make_engine
    from omtr.solver import examples
    from omtr.tracking.pyfunc import EXAMPLE_TASK, RoleModelPyfunc, ServingLimits

    limits = ServingLimits(engine=args.engine)
    model = build_model(args.model)
    engine = default_engine(str(model.device)) if limits.engine == "auto" else limits.engine
    pf = RoleModelPyfunc()
    pf.limits, pf.env, pf.metrics = limits, None, None
    t = time.perf_counter()
    pf.model = model if engine == "hf" else make_engine(engine, model)
    out = {"model": args.model, "engine": engine, "threads": args.threads, "budget": limits.budget,
           "engine_build_s": round(time.perf_counter() - t, 2)}
    pf.predict(None, {"task": [EXAMPLE_TASK]}, {"budget": 1, "max_new_tokens": 4})  # starts the solver pool
    requests = {
        "domain_given": {"task": ["There are three blocks a, b and c on the table. Build the tower a on b on c."],
                         "domain": [examples.BW_DOMAIN]},
        "full": {"task": ["There are three blocks a, b and c on the table. Build the tower a on b on c."]},
    }
    for name, req in requests.items():
        t = time.perf_counter()
        ans = pf.predict(None, req)
        row = ans.iloc[0].to_dict()
        out[name] = {"seconds": round(time.perf_counter() - t, 1),
                     **{k: row[k] for k in ("success", "planner_calls", "final_category") if k in row}}
        print(f"[serving] {name}: {out[name]}", flush=True)
    print(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
