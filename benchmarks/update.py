"""Forward + backward tokens/s of the PPO update at a training profile's shapes.

    python benchmarks/update.py                          # small profile (SmolLM2), 1 thread
    python benchmarks/update.py --profile micro --repeats 1

One micro-batch as the trainer's update sees it: ``micro_batch_size`` Actor prompts (BlocksWorld
and Gripper, with the demonstration) and completions of up to ``max_new_tokens`` tokens (the
demonstration's answer, so the grammar replays them), ``token_logprobs`` at the rollout
temperature with the profile's constraint, then ``backward`` of their sum into the LoRA and role
parameters. Side by side in one process: ``current`` (``RoleModel.token_logprobs``) and
``padded`` (the earlier post-processing: a left-aligned padded copy of the [B, L, V] logits, a
masked clone, a full log-softmax), with the same prefill. Reports seconds, completion tokens/s,
all tokens/s (prompts included) and the largest difference from the first variant's log-probs.

``--judge``: instead, the Judge's term of one update, ``2 x micro_batch_size`` Judge prompts (two
domain-given tasks, a spec of each per sample) forward and backward, two ways: ``mixed`` as the
batch arrives (the tasks interleaved, no prefix sharing: the earlier ``judge_scores``) and
``alike`` (:func:`omtr.model.batching.alike_chunks`, each task's prompts together, their common
prefix computed once). One JSON object to stdout.
"""

from __future__ import annotations

import argparse
import json
import time


def padded_logprobs(model, role, prompts, comps, temperature, mode):
    """``token_logprobs`` as it was before (for the side-by-side figures)."""
    import torch

    ri = model.use_role(role)
    prompt_ids = model.encode_prompts(prompts)
    L, B = max(len(c) for c in comps), len(comps)
    out, _, _ = model._prefill([p + c for p, c in zip(prompt_ids, comps)], ri, logits_to_keep=L + 1, reuse=False,
                               max_prefix=min(len(p) for p in prompt_ids) - 1)
    logits = out.logits[:, :-1].float() / temperature
    V = logits.shape[-1]
    targets = torch.zeros((B, L), dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.bool)
    padded = logits.new_full((B, L, V), 0.0)
    for b, c in enumerate(comps):
        padded[b, :len(c)] = logits[b, L - len(c):]
        targets[b, :len(c)] = torch.tensor(c)
        mask[b, :len(c)] = True
    if mode != "off":
        padded = model._grammar_replay(padded, comps, mode, None)
    logp = torch.log_softmax(padded, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logp.masked_fill(~mask, 0.0), mask


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="small", help="training profile (default small)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--repeats", type=int, default=2, help="timed repeats per variant, best kept (default 2)")
    ap.add_argument("--judge", action="store_true", help="time the Judge's micro-batches, mixed vs alike prompts")
    args = ap.parse_args()
    if args.judge:
        return judge_batches(args)

    import torch

    torch.set_num_threads(args.threads)
    from omtr.inference.prompts import actor_messages, demo_for
    from omtr.model import build_model
    from omtr.rl.config import train_profile
    from omtr.tasks.generators import generate

    cfg = train_profile(args.profile)
    model = build_model(cfg.model)
    model.train()
    B, T = cfg.micro_batch_size, cfg.max_new_tokens
    tasks = (generate("blocksworld", B, 0, min_objects=2, max_objects=3, verify=False)
             + generate("gripper", B, 0, min_objects=1, max_objects=2, verify=False))[:B]
    prompts = [actor_messages(t.for_training()) for t in tasks]
    comps = []
    for i, t in enumerate(tasks):
        ids = model.tokenizer.encode(demo_for(t.family).answer, add_special_tokens=False)
        comps.append((ids * (1 + T // max(1, len(ids))))[: max(8, T - 37 * i)])
    mode = cfg.decoding or model.cfg.constraint
    if mode != "off":  # the answer repeated may leave the grammar: cut each at its first refusal
        for b, c in enumerate(comps):
            st = model.grammar.state(scoped=mode == "scoped")
            bm = model.grammar.allocate_bitmask(1)
            for j, tok in enumerate(c):
                st.fill(bm, 0)
                if not st.accept(tok, model.pieces[tok]):
                    comps[b] = c[:j]
                    break
    n_new = sum(len(c) for c in comps)
    n_all = n_new + sum(len(p) for p in model.encode_prompts(prompts))
    params = [p for p in model.parameters() if p.requires_grad]
    variants = {
        "padded": lambda: padded_logprobs(model, "actor", prompts, comps, cfg.temperature, mode),
        "current": lambda: model.token_logprobs("actor", prompts, comps, temperature=cfg.temperature, constraint=mode),
    }
    out = {"profile": args.profile, "threads": args.threads, "batch": B, "completion_tokens": n_new,
           "all_tokens": n_all, "constraint": mode, "variants": {}}
    ref = None
    for rep in range(args.repeats):
        for name, fn in variants.items():
            for p in params:
                p.grad = None
            t0 = time.perf_counter()
            lp, mask = fn()
            t1 = time.perf_counter()
            lp[mask].sum().backward()
            t2 = time.perf_counter()
            if ref is None:
                ref = lp.detach()
            row = {"forward_s": round(t1 - t0, 2), "backward_s": round(t2 - t1, 2),
                   "completion_tokens_per_s": round(n_new / (t2 - t0), 1), "all_tokens_per_s": round(n_all / (t2 - t0), 1),
                   "max_abs_diff": float((lp.detach() - ref)[mask].abs().max())}
            best = out["variants"].get(name)
            if best is None or row["completion_tokens_per_s"] > best["completion_tokens_per_s"]:
                out["variants"][name] = row
    v = out["variants"]
    out["speedup"] = round(v["current"]["completion_tokens_per_s"] / v["padded"]["completion_tokens_per_s"], 2)
    print(json.dumps(out, indent=2))


def judge_batches(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    from omtr.inference import prompts as P
    from omtr.model import build_model
    from omtr.model.batching import alike_chunks, prompt_text
    from omtr.rl.config import train_profile
    from omtr.tasks.generators import generate

    cfg = train_profile(args.profile)
    model = build_model(cfg.model)
    model.train()
    n = cfg.micro_batch_size
    tasks = [t.with_given_domain() for t in generate("blocksworld", 2, 0, min_objects=3, max_objects=4, verify=False)]
    prompts = []
    for k in range(n):  # interleaved as a batch arrives: task 0, task 1, task 0, ...
        for t in tasks:
            problem = t.reference.problem  # a benchmark: the reference only stands in for a written spec
            prompts.append(P.judge_messages(t.for_training(), problem[: len(problem) - 9 * k]))
    params = [p for p in model.parameters() if p.requires_grad]
    mixed = [list(range(i, min(i + n, len(prompts)))) for i in range(0, len(prompts), n)]
    alike = alike_chunks([prompt_text(p) for p in prompts], n)
    tokens = sum(len(s) for s in model.encode_prompts(prompts))
    out = {"profile": args.profile, "threads": args.threads, "prompts": len(prompts), "prompt_tokens": tokens,
           "variants": {}}
    scores = {}
    for rep in range(args.repeats):
        for name, chunks, share in (("mixed", mixed, False), ("alike", alike, True)):
            model.share_prefix = share
            for p in params:
                p.grad = None
            t0 = time.perf_counter()
            got = [0.0] * len(prompts)
            for c in chunks:
                s = model.judge_scores([prompts[i] for i in c])
                s.sum().backward()
                for i, v in zip(c, s.tolist()):
                    got[i] = v
            secs = time.perf_counter() - t0
            scores[name] = got
            best = out["variants"].get(name)
            if best is None or secs < best["seconds"]:
                out["variants"][name] = {"chunks": [len(c) for c in chunks], "seconds": round(secs, 2),
                                         "prompt_tokens_per_s": round(tokens / secs, 1)}
    model.share_prefix = True
    out["max_abs_score_diff"] = max(abs(a - b) for a, b in zip(scores["mixed"], scores["alike"]))
    out["speedup"] = round(out["variants"]["mixed"]["seconds"] / out["variants"]["alike"]["seconds"], 2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
