"""Episode rollout on the role model: batched episodes vs one ``generate`` call per episode.

    python benchmarks/rollout.py                        # SmolLM2 (small), 2 Gripper + 2 BlocksWorld tasks, K=2
    python benchmarks/rollout.py --n 8 --budget 6 --max-new-tokens 768 --out rollout.json   # omtr infer's settings
    python benchmarks/rollout.py --model micro --n 2 --max-new-tokens 32 --no-grammar-compare   # a smoke run
    python benchmarks/rollout.py --engines --max-new-tokens 64 --episodes 32 --out engines.json   # hf vs fast

Tasks are generated (seeded): ``--n`` Gripper tasks with 1-2 balls and ``--n`` BlocksWorld tasks
with 2-3 blocks. The same tasks, sampling settings (greedy by default, as ``omtr infer``) and
planner budget ``K`` run two ways in one process, on one model and one solver pool with the
result cache off (a repeated spec is planned again, as it would be the first time):

``batched``     the episode loop as it is: all unfinished episodes waiting for the same role are
                generated in one call, and their specs go to the planner asynchronously while the
                Judge scores and the model generates the next batch;
``sequential``  one episode at a time (``run_episodes([task])``): every ``generate`` call holds one
                sequence and the planner's answer is waited for before the next step.

Then, unless ``--no-grammar-compare``, one Actor call over all tasks with the grammar off: the
same prompts and token limit, to put the grammar's cost per token beside its mask time.

For each mode the benchmark reports wall time, new tokens, tokens/s (end to end and while
generating), episodes/min, and where the time goes: prefill, decode and grammar masks (from the
``timings`` each :class:`~omtr.policy.Generation` returns, once per ``generate`` call),
the Judge, and the planner: its busy time (inside ``solve_many``) and the part of it the loop
waited for (wall time not spent generating or judging). Per-step trace times (``solve_ms``,
``at_ms``) and outcomes (success or category of each step) come along. One JSON object goes to
stdout (and ``--out``); a short table goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


class Recorder:
    """A :class:`~omtr.policy.Policy` proxy that records each ``generate``/``judge`` call."""

    def __init__(self, policy):
        self.policy = policy
        self.calls: list[dict] = []
        self.judge_calls: list[dict] = []

    def generate(self, role, prompts, sampling, *, stop_when=None, **kw):
        t = time.perf_counter()
        gens = self.policy.generate(role, prompts, sampling, stop_when=stop_when, **kw)
        wall = 1000 * (time.perf_counter() - t)
        tm = gens[0].timings if gens else {}
        # prefill_ms and grammar_ms are per call (the same on every Generation of the call);
        # decode_ms is per sequence (until it stopped), so the call's decode loop is the longest.
        self.calls.append({
            "role": role, "batch": len(prompts), "wall_ms": wall,
            "prefill_ms": tm.get("prefill_ms", 0.0), "grammar_ms": tm.get("grammar_ms", 0.0),
            "decode_loop_ms": max((g.timings.get("decode_ms", 0.0) for g in gens), default=0.0),
            "prompt_tokens": sum(g.prompt_tokens for g in gens),
            "new_tokens": sum(len(g.token_ids) for g in gens),
            "steps": max((len(g.token_ids) for g in gens), default=0),
            "finish": [g.finish_reason for g in gens],
        })
        return gens

    def judge(self, prompts):
        t = time.perf_counter()
        scores = self.policy.judge(prompts)
        self.judge_calls.append({"batch": len(prompts), "wall_ms": 1000 * (time.perf_counter() - t)})
        return scores


class TimedEnv:
    """The solver pool, with the time spent inside each ``solve_many`` recorded (the planner's busy time)."""

    def __init__(self, env):
        self.env = env
        self.calls: list[dict] = []

    def solve_many(self, specs):
        t = time.perf_counter()
        verdicts = self.env.solve_many(specs)
        self.calls.append({"specs": len(specs), "wall_ms": 1000 * (time.perf_counter() - t)})
        return verdicts


def _outcome(verdict) -> str:
    return "success" if verdict.success else (verdict.category.value if verdict.category else "unknown")


def _lint_outcome(text: str) -> str:
    """What lint says of an answer (no planner): its category, or ``lint_ok``."""
    from omtr.inference.extract import extract_spec
    from omtr.solver.lint import lint

    ex = extract_spec(text)
    if not ex.ok:
        return "syntax"  # nothing to extract is a syntax verdict
    err = lint(ex.domain, ex.problem).error
    return err.category.value if err else "lint_ok"


def _count(xs) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in xs:
        out[x] = out.get(x, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def measure(name: str, run, policy, env) -> dict:
    """Run ``run(recorder, timed_env) -> episodes`` and account for its time."""
    rec, tenv = Recorder(policy), TimedEnv(env)
    cpu0, t0 = time.process_time(), time.perf_counter()
    episodes = run(rec, tenv)
    wall_ms = 1000 * (time.perf_counter() - t0)
    cpu_s = time.process_time() - cpu0
    gen_ms = sum(c["wall_ms"] for c in rec.calls)
    prefill = sum(c["prefill_ms"] for c in rec.calls)
    grammar = sum(c["grammar_ms"] for c in rec.calls)
    judge_ms = sum(c["wall_ms"] for c in rec.judge_calls)
    planner_busy = sum(c["wall_ms"] for c in tenv.calls)
    new_tokens = sum(c["new_tokens"] for c in rec.calls)
    steps = [s for e in episodes for s in e.steps]
    n = len(episodes)
    # What is left of the wall time once generation and the Judge are taken out: the loop waiting
    # for the planner, plus extraction and bookkeeping (small). Planner time not in it overlapped.
    waited = max(0.0, wall_ms - gen_ms - judge_ms)
    return {
        "mode": name,
        "episodes": n,
        "wall_s": round(wall_ms / 1000, 2),
        "process_cpu_s": round(cpu_s, 2),
        "episodes_per_min": round(60_000 * n / wall_ms, 2) if wall_ms else None,
        "new_tokens": new_tokens,
        "prompt_tokens": sum(c["prompt_tokens"] for c in rec.calls),
        "tokens_per_s": round(1000 * new_tokens / wall_ms, 2) if wall_ms else None,
        "tokens_per_s_generating": round(1000 * new_tokens / gen_ms, 2) if gen_ms else None,
        "generate_calls": len(rec.calls),
        "mean_batch": round(sum(c["batch"] for c in rec.calls) / len(rec.calls), 2) if rec.calls else 0,
        "planner_calls": len(steps),
        "planner_runs": sum(c["specs"] for c in tenv.calls),  # specs that reached the planner
        "solved": sum(e.success for e in episodes),
        "time_s": {
            "generate": round(gen_ms / 1000, 2),
            "prefill": round(prefill / 1000, 2),
            "grammar_masks": round(grammar / 1000, 2),
            "decode": round((gen_ms - prefill - grammar) / 1000, 2),  # forward passes + sampling + stop checks
            "judge": round(judge_ms / 1000, 2),
            "planner_busy": round(planner_busy / 1000, 2),
            "planner_waited": round(waited / 1000, 2),
            "planner_overlapped": round(max(0.0, planner_busy - waited) / 1000, 2),
        },
        "share_of_wall": {
            k: round(v / wall_ms, 3) for k, v in
            (("prefill", prefill), ("decode", gen_ms - prefill - grammar), ("grammar_masks", grammar),
             ("judge", judge_ms), ("planner_waited", waited))
        } if wall_ms else {},
        "grammar_ms_per_token": round(grammar / new_tokens, 3) if new_tokens else None,
        "finish": _count(f for c in rec.calls for f in c["finish"]),
        "first_outcomes": _count(_outcome(e.steps[0].verdict) for e in episodes if e.steps),
        "final_outcomes": _count(_outcome(e.steps[-1].verdict) for e in episodes if e.steps),
        "step_solve_ms_mean": round(sum(s.times.get("solve_ms", 0.0) for s in steps if "solve_ms" in s.times)
                                    / max(1, sum("solve_ms" in s.times for s in steps)), 1),
        "calls": [{k: (round(v, 1) if isinstance(v, float) else v) for k, v in c.items() if k != "finish"}
                  for c in rec.calls],
        "texts": [[s.text for s in e.steps] for e in episodes],
    }


def grammar_compare(model, tasks, sampling, batched: dict | None) -> dict:
    """The Actor's call over all tasks with the grammar on (the batched run's first call, when there
    is one) and off (same prompts, same token limit). Without the grammar SmolLM2 repeats itself to
    the limit, so the two calls write different amounts; compare per-token figures."""
    from omtr.inference.extract import spec_complete
    from omtr.inference.prompts import actor_messages

    prompts = [actor_messages(t.for_training()) for t in tasks]
    row = {}
    for on in (True, False):
        first = batched["calls"][0] if (on and batched and batched["calls"]) else None
        if first is not None and first["role"] == "actor" and first["batch"] == len(tasks):
            wall, pre, gm, new, steps = (first["wall_ms"], first["prefill_ms"], first["grammar_ms"],
                                         first["new_tokens"], first["steps"])
        else:
            print(f"[rollout] Actor call, grammar {'on' if on else 'off'} ...", file=sys.stderr, flush=True)
            rec = Recorder(model)
            gens = rec.generate("actor", prompts, sampling, stop_when=spec_complete, grammar=on)
            c = rec.calls[0]
            wall, pre, gm, new, steps = c["wall_ms"], c["prefill_ms"], c["grammar_ms"], c["new_tokens"], c["steps"]
            row["lint_" + ("on" if on else "off")] = _count(_lint_outcome(g.text) for g in gens)
        row["on" if on else "off"] = {
            "wall_s": round(wall / 1000, 2), "new_tokens": new, "decode_steps": steps,
            "prefill_s": round(pre / 1000, 2), "grammar_masks_s": round(gm / 1000, 3),
            "grammar_ms_per_token": round(gm / new, 3) if new else None,
            "decode_ms_per_token": round((wall - pre - gm) / new, 2) if new else None,
            "tokens_per_s": round(1000 * new / wall, 2) if wall else None,
        }
    on, off = row["on"], row["off"]
    row["mask_share_of_generate"] = round(on["grammar_masks_s"] / on["wall_s"], 4) if on["wall_s"] else None
    return row


def engine_compare(model, args) -> dict:
    """hf vs fast side by side: one Actor call per (engine, constraint, batch) on BlocksWorld prompts
    (greedy), then a sampled call for the engine-vs-policy KL, and --episodes greedy episodes per
    engine for episodes/min and outcome agreement."""
    import torch

    from omtr.inference.episode import run_episodes
    from omtr.inference.extract import problem_complete, spec_complete
    from omtr.inference.prompts import actor_messages
    from omtr.policy import Sampling
    from omtr.rollout import make_engine
    from omtr.solver import SolverPool
    from omtr.tasks.generators import generate

    tasks = generate("blocksworld", max(args.batches), args.seed, min_objects=2, max_objects=3, verify=False)
    ep_tasks = []
    if args.episodes:  # drawn first: a request the generator cannot meet fails before the timed part
        half = args.episodes // 2
        ep_tasks = generate("blocksworld", args.episodes - half, args.seed + 1, min_objects=2, max_objects=4,
                            verify=False)
        ep_tasks += generate("gripper", half, args.seed + 1, min_objects=1, max_objects=3, verify=False)
        if args.given_domain:
            ep_tasks = [t.with_given_domain() for t in ep_tasks]
    prompts = [actor_messages(t.for_training()) for t in tasks]
    hf = make_engine("hf", model)
    t0 = time.perf_counter()
    fast = make_engine("fast", model)
    fast_build = time.perf_counter() - t0
    backbone = sum(p.numel() * p.element_size() for n, p in model.base_model.named_parameters() if "lora_" not in n)
    out = {"threads": torch.get_num_threads(), "max_new_tokens": args.max_new_tokens, "rows": [],
           "fast_build_s": round(fast_build, 2), "refresh_s": round(min(fast.refresh() for _ in range(2)), 2),
           "memory_mb": {"hf": 0.0, "fast": round(fast.memory_bytes() / 2**20, 1),
                         "fp32_backbone": round(backbone / 2**20, 1)}}
    greedy = Sampling(greedy=True, max_new_tokens=args.max_new_tokens)
    for constraint in ("plain", "scoped"):
        for B in args.batches:
            for name, eng in (("hf", hf), ("fast", fast)):
                eng.generate("actor", prompts[:1], Sampling(greedy=True, max_new_tokens=2), constraint=constraint)
                t = time.perf_counter()
                gens = eng.generate("actor", prompts[:B], greedy, stop_when=spec_complete, constraint=constraint)
                wall = time.perf_counter() - t
                new = sum(len(g.token_ids) for g in gens)
                steps = max(len(g.token_ids) for g in gens)
                pre = gens[0].timings["prefill_ms"] / 1000
                row = {"engine": name, "constraint": constraint, "batch": B, "prefill_s": round(pre, 2),
                       "decode_ms_per_step": round(1000 * (wall - pre) / steps, 1),
                       "new_tokens_per_s": round(new / wall, 1), "new_tokens": new}
                out["rows"].append(row)
                print(f"[rollout] {row}", file=sys.stderr, flush=True)
    # A batch that mixes families (each prompt with its family's demonstration and given domain)
    # shares only the system message: the fast engine generates it in groups, one per family;
    # side by side, the same batch as one group.
    mixed = [t.with_given_domain() for t in generate("blocksworld", max(args.batches) // 2, args.seed + 2, min_objects=3,
                                                     max_objects=4, verify=False)]
    mixed += [t.with_given_domain() for t in generate("gripper", max(args.batches) // 2, args.seed + 2, min_objects=2,
                                                      max_objects=3, verify=False)]
    mixed_prompts = [actor_messages(t.for_training()) for t in mixed]
    mixed_domains = [t.domain for t in mixed]
    grouped = fast._groups
    for name, split in (("grouped", True), ("one batch", False)):
        if not split:
            fast._groups = lambda seqs, n: [list(range(len(seqs)))]
        t = time.perf_counter()
        gens = fast.generate("actor", mixed_prompts, greedy, stop_when=problem_complete, constraint="scoped",
                             domains=mixed_domains)
        wall = time.perf_counter() - t
        fast._groups = grouped
        row = {"mixed_families": name, "batch": len(mixed), "groups": fast.last_groups, "wall_s": round(wall, 1),
               "prefill_s": round(sum({g.timings["prefill_ms"] for g in gens}) / 1000, 2),
               "new_tokens_per_s": round(sum(len(g.token_ids) for g in gens) / wall, 1)}
        out["rows"].append(row)
        print(f"[rollout] {row}", file=sys.stderr, flush=True)
    sampled = Sampling(greedy=False, temperature=0.7, top_p=1.0, max_new_tokens=args.max_new_tokens, seed=1)
    gens = fast.generate("actor", prompts[:args.batches[0]], sampled, stop_when=spec_complete, constraint="plain")
    with torch.no_grad():
        lp, mask = model.token_logprobs("actor", prompts[:args.batches[0]], [g.token_ids for g in gens],
                                        temperature=0.7, constraint="plain")
    diff = sum(e - p for g, row in zip(gens, lp.tolist()) for e, p in zip(g.logprobs, row))
    out["engine_kl"] = round(diff / int(mask.sum()), 4)
    if ep_tasks:
        from omtr.config import SolverConfig

        outcomes, episodes = {}, {}
        with SolverPool(1, SolverConfig(cache=False)) as pool:
            for name, eng in (("hf", hf), ("fast", fast)):
                t = time.perf_counter()
                eps = run_episodes(ep_tasks, eng, pool, budget=args.budget, sampling=greedy, judge=False,
                                   batch_size=args.batches[0])
                wall = time.perf_counter() - t
                out[f"episodes_per_min_{name}"] = round(60 * len(eps) / wall, 2)
                outcomes[name] = [_outcome(e.steps[-1].verdict) for e in eps]
                episodes[name] = eps
        out["outcomes_differ"] = sum(a != b for a, b in zip(outcomes["hf"], outcomes["fast"]))
        out["outcome_tasks"] = len(ep_tasks)
        out["outcome_mode"] = "given" if args.given_domain else "full"
        out["differing"] = [{"task": t.id, "hf": a, "fast": b,
                             "hf_text": ea.steps[-1].text if ea.steps else "",
                             "fast_text": eb.steps[-1].text if eb.steps else ""}
                            for t, a, b, ea, eb in zip(ep_tasks, outcomes["hf"], outcomes["fast"],
                                                       episodes["hf"], episodes["fast"]) if a != b]
        out["outcomes"] = outcomes
    return out


def make_tasks(n: int, seed: int) -> list:
    from omtr.tasks.generators import generate

    tasks = generate("gripper", n, seed, min_objects=1, max_objects=2, verify=False)
    tasks += generate("blocksworld", n, seed, min_objects=2, max_objects=3, verify=False)
    return tasks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small", help="profile or model directory (default small)")
    ap.add_argument("--n", type=int, default=2, help="tasks per family (Gripper 1-2 balls, BlocksWorld 2-3 blocks; default 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=int, default=2, help="planner calls per episode, K (default 2: Actor + one repair)")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="token limit per answer (default 256)")
    ap.add_argument("--sample", action="store_true", help="sample at temperature 0.7 (seeded) instead of greedy")
    ap.add_argument("--no-judge", action="store_true", help="skip the Judge")
    ap.add_argument("--modes", default="batched,sequential", help="comma-separated: batched, sequential")
    ap.add_argument("--no-grammar-compare", action="store_true", help="skip the grammar-off Actor call")
    ap.add_argument("--workers", type=int, default=1, help="solver worker processes (default 1)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--keep-texts", action="store_true", help="keep every step's text in the JSON")
    ap.add_argument("--engines", action="store_true",
                    help="instead: rollout engines hf vs fast side by side (grammar plain and scoped, --batches)")
    ap.add_argument("--batches", type=lambda v: [int(x) for x in v.split(",")], default=[8, 16],
                    help="with --engines: batch sizes (default 8,16)")
    ap.add_argument("--episodes", type=int, default=0,
                    help="with --engines: greedy episodes per engine, half BlocksWorld (2-4 blocks), half Gripper "
                         "(1-3 balls): episodes/min and outcome agreement")
    ap.add_argument("--given-domain", action="store_true",
                    help="with --engines --episodes: the episodes' tasks give the reference domain (the Actor writes the problem)")
    args = ap.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from omtr.config import SolverConfig
    from omtr.inference.episode import run_episodes
    from omtr.model import load_model
    from omtr.policy import Sampling
    from omtr.solver import SolverPool

    tasks = make_tasks(args.n, args.seed)
    t0 = time.perf_counter()
    model = load_model(args.model)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    model.grammar  # compile outside the timed runs
    grammar_compile_s = time.perf_counter() - t0
    if args.engines:
        res = engine_compare(model, args)
        text = json.dumps(res, indent=2)
        print(text)
        if args.out:
            open(args.out, "w").write(text + "\n")
        return
    sampling = (Sampling(greedy=False, temperature=0.7, max_new_tokens=args.max_new_tokens, seed=args.seed)
                if args.sample else Sampling(greedy=True, max_new_tokens=args.max_new_tokens))
    judge = not args.no_judge
    result = {
        "model": args.model, "tasks": len(tasks), "families": _count(t.family for t in tasks),
        "budget": args.budget, "max_new_tokens": args.max_new_tokens, "greedy": sampling.greedy,
        "grammar": bool(model.cfg.grammar), "judge": judge, "solver_workers": args.workers,
        "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "load_s": round(load_s, 2),
        "grammar_compile_s": round(grammar_compile_s, 2), "loadavg_start": list(os.getloadavg()),
        "modes": {},
    }
    cfg = SolverConfig(cache=False)
    with SolverPool(args.workers, cfg) as pool:
        from omtr.solver.examples import BW_DOMAIN, BW_PROBLEM

        pool.solve_many([(BW_DOMAIN, BW_PROBLEM)])  # warm the worker outside the timed runs
        runs = {
            "batched": lambda rec, env: run_episodes(tasks, rec, env, budget=args.budget, sampling=sampling,
                                                     judge=judge),
            "sequential": lambda rec, env: [ep for t in tasks for ep in
                                            run_episodes([t], rec, env, budget=args.budget, sampling=sampling,
                                                         judge=judge)],
        }
        for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
            if mode not in runs:
                ap.error(f"unknown mode {mode!r}; choose batched, sequential")
            print(f"[rollout] {mode} ...", file=sys.stderr, flush=True)
            result["modes"][mode] = measure(mode, runs[mode], model, pool)
    b, s = result["modes"].get("batched"), result["modes"].get("sequential")
    if b and s:
        result["batched_over_sequential"] = {
            "episodes_per_min": round(b["episodes_per_min"] / s["episodes_per_min"], 2),
            "tokens_per_s": round(b["tokens_per_s"] / s["tokens_per_s"], 2),
            "same_first_texts": sum(x[0] == y[0] for x, y in zip(b["texts"], s["texts"])),
        }
    if not args.no_grammar_compare:
        result["grammar_compare"] = grammar_compare(model, tasks, sampling, result["modes"].get("batched"))
    result["loadavg_end"] = list(os.getloadavg())
    if not args.keep_texts:
        for m in result["modes"].values():
            m.pop("texts", None)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    _table(result)


def _table(r: dict) -> None:
    lines = [f"{'mode':<11} {'wall s':>7} {'ep/min':>7} {'tok/s':>6} {'prefill':>8} {'decode':>7} "
             f"{'grammar':>8} {'judge':>6} {'plan busy':>9} {'plan wait':>9}"]
    for name, m in r["modes"].items():
        t = m["time_s"]
        lines.append(f"{name:<11} {m['wall_s']:>7} {m['episodes_per_min']:>7} {m['tokens_per_s']:>6} "
                     f"{t['prefill']:>8} {t['decode']:>7} {t['grammar_masks']:>8} {t['judge']:>6} "
                     f"{t['planner_busy']:>9} {t['planner_waited']:>9}")
    print("\n".join(lines), file=sys.stderr)


if __name__ == "__main__":
    main()
