"""The fast engine's refresh after an optimizer step: everything rebuilt vs reusing what did not change.

    python benchmarks/engine_refresh.py                 # SmolLM2 (small), 1 thread, 3 repeats
    python benchmarks/engine_refresh.py --model micro --repeats 1

An "optimizer step" here is an in-place change of every LoRA tensor and role vector (what
``optimizer.step()`` does to them with the backbone frozen). Then ``refresh(reuse=False)`` (every
linear merged and quantized again, as before reuse existed) and ``refresh()`` (only the linears an
adapter touches) are timed, and the two engines' greedy outputs on one prompt are compared.
One JSON object to stdout.
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small", help="profile or model directory (default small)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--repeats", type=int, default=3, help="optimizer steps + refreshes timed (default 3)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from omtr.model import build_model
    from omtr.policy import Sampling
    from omtr.rollout import make_engine

    model = build_model(args.model)
    t = time.perf_counter()
    engine = make_engine("fast", model)
    build_s = time.perf_counter() - t
    trainable = [p for n, p in model.named_parameters() if p.requires_grad]
    g = torch.Generator().manual_seed(0)
    full, reuse = [], []
    for _ in range(args.repeats):
        with torch.no_grad():  # an optimizer step on the trainable parameters (frozen backbone)
            for p in trainable:
                p.add_(torch.randn(p.shape, generator=g) * 1e-3)
        full.append(engine.refresh(reuse=False))
        with torch.no_grad():
            for p in trainable:
                p.add_(torch.randn(p.shape, generator=g) * 1e-3)
        reuse.append(engine.refresh())
    rebuilt, total = engine.rebuilt, len(engine._built)
    prompt = [[{"role": "user", "content": "Stack b1 on b2."}]]
    greedy = Sampling(greedy=True, max_new_tokens=8)
    a = engine.generate("actor", prompt, greedy, grammar=False)[0]
    engine.refresh(reuse=False)
    b = engine.generate("actor", prompt, greedy, grammar=False)[0]
    print(json.dumps({
        "model": args.model, "threads": args.threads, "build_s": round(build_s, 2),
        "refresh_full_s": round(min(full), 2), "refresh_reuse_s": round(min(reuse), 2),
        "speedup": round(min(full) / min(reuse), 1), "linears_rebuilt": rebuilt, "linears": total,
        "same_output": a.token_ids == b.token_ids and a.logprobs == b.logprobs,
    }, indent=2))


if __name__ == "__main__":
    main()
