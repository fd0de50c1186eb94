"""Peak memory and seconds of one training update, by phase, with the log-probability paths side by side.

    python benchmarks/update_memory.py --tasks T.jsonl --out docs/results/update-memory-2026-12-04.json
    python benchmarks/update_memory.py --batch batch.json --paths lean --chunk 256   # phases only, one path
    python benchmarks/update_memory.py --tasks T.jsonl --save-batch batch.json --paths none   # rollout only

The small training profile (SmolLM2-135M, LoRA on every linear layer, the fast int8 rollout engine,
the grammar with scope rules), as ``omtr train`` runs it. Each part runs in a fresh child process,
so that one part's freed memory (which the allocator may keep) does not hide or inflate another's:

1. **rollout** (one child): the trainer's first task, ``samples_per_task`` (8) samples at the
   training temperature through the episode loop (fast engine, planner, Judge), rewarded and given
   group advantages as the trainer does. The batch (prompts, tokens, the engine's log-probs,
   advantages, the Judge's labelled specs) is saved, so every path below sees the same one. A
   group whose rewards all agree has zero advantages: they are then replaced by +-1 (marked in the
   output) so that the PPO loss has a gradient; its memory and time do not depend on them.
2. **phases** (one child per path: ``old`` is ``logprob_chunk=0`` and
   ``activation_checkpointing=false``, as before: the whole micro-batch's [B, L, V] logits and
   every decoder layer's activations kept; ``chunked`` the log-probabilities a chunk of positions
   at a time (the model's ``logprob_chunk`` or ``--chunk``), activations still kept; ``lean`` the
   defaults, chunks and activation checkpointing): the trainer built as ``omtr train`` builds it, the rollout engine refreshed (its int8 weights held as in training),
   then the trainer's own methods on the saved batch:
   ``old_logprobs`` (:meth:`UpdateMixin._recompute_old`, no gradients),
   ``ppo_loss`` (:meth:`UpdateMixin._ppo_loss` of each Actor micro-batch and its backward),
   ``judge_loss`` (``judge_scores`` of the Judge's micro-batch, ``judge_loss`` and its backward),
   ``step`` (the optimizer step). ``bf16`` is ``lean`` under ``update_dtype=bf16`` (a bf16 autocast
   of the old-log-prob pass and the update; fp32 where the CPU lacks native bf16). ``old``,
   ``chunked``, ``lean`` and ``bf16`` keep the earlier micro-batches of 8 and a separate
   old-log-prob pass for every step; ``default`` is the profile as it is (micro-batches of 4 cut
   by completion length, the first minibatch's old log-probs taken in the PPO phase from its own
   forward pass, ``update_dtype=auto``, a prompt prefix computed once per optimizer step).
   ``fp32`` is the default with ``update_dtype=fp32``; ``prefix_each`` the default with
   ``prompt_prefix_once=false`` (a prompt prefix per micro-batch); ``filed`` is ``old`` without ``lean_memory`` (the
   update as issue 42 found it: no release after the rollout, glibc's own mmap threshold); ``padded`` the default with
   ``pack_rows=false`` (left-padded rows, every path before packing); ``judge4`` the default with
   the Judge's micro-batches of 4; ``heap1`` the default with ``lean_heap_mb=1`` (every block of
   1 MiB or more of the passes that train on pages of its own); ``nothp`` the default with
   ``huge_pages=false`` (each child asks for huge pages as ``omtr train`` does, before torch loads); ``ckpt50``, ``ckpt25`` and ``nockpt`` fewer checkpointed layers. The PPO micro-batches and the Judge's each run inside the
   trainer's prefix block (:meth:`UpdateMixin._prefix_block`), as one optimizer step's do.

Memory is the process's resident set (RSS, ``/proc/self/statm``) sampled every ``--interval-ms``
milliseconds by a thread (torch's CPU kernels release the GIL, so the sampler runs during them);
each phase reports its RSS at the start and its peak, and each child its ``ru_maxrss``. torch's
own allocator statistics do not cover CPU tensors and tracemalloc does not see them at all.
The children also report the values (old log-probs, PPO and Judge losses, the gradient's norm)
and save the gradients; the parent reports their largest differences from the ``old`` path and
the gradients' cosine (and ``bf16`` against ``lean``, the effect of the format alone). Where the policy's recomputed
old log-prob of a sampled token is -inf (its replayed mask refuses a token the engine sampled),
the engine's value stands in for it, so that the loss and the gradient are finite; their count
is reported (``nonfinite_old_logprobs``). One JSON object to stdout and ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


class RssSampler:
    """Peak RSS per phase, from a sampling thread."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self.peak = rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mb())
            time.sleep(self.interval_s)

    def phase(self, name: str, report: dict):
        sampler = self

        class _Phase:
            def __enter__(self):
                self.start_rss = rss_mb()
                sampler.peak = self.start_rss
                self.t0 = time.perf_counter()
                return self

            def __exit__(self, *exc):
                secs = time.perf_counter() - self.t0
                peak = max(sampler.peak, rss_mb())
                report[name] = {"seconds": round(secs, 2), "rss_start_mb": round(self.start_rss),
                                "rss_peak_mb": round(peak), "rss_end_mb": round(rss_mb()),
                                **report.get(name, {})}
                return False

        return _Phase()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _maxrss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# path -> training settings over the profile's; a key missing: the profile's own. `old` is the update
# as it was when issue 42 was filed; `default` is the profile as it is now.
_EARLIER = {"micro_batch_size": 8, "judge_micro_batch_size": None, "reuse_first_logprobs": False,
            "update_dtype": "fp32", "prompt_prefix_once": False, "fused_adapters": False, "pack_rows": False,
            "lean_heap_mb": 1, "huge_pages": False}
PATHS = {"old": {**_EARLIER, "logprob_chunk": 0, "activation_checkpointing": False},
         # ``old`` without lean_memory (which came after issue 42 was filed): glibc's own mmap threshold
         "filed": {**_EARLIER, "logprob_chunk": 0, "activation_checkpointing": False, "lean_memory": False},
         "chunked": {**_EARLIER, "activation_checkpointing": False},
         "lean": dict(_EARLIER),
         "bf16": {**_EARLIER, "update_dtype": "bf16"},
         "default": {},
         # the default with fewer decoder layers recomputing their activations (ModelConfig.checkpoint_layers)
         "ckpt50": {"checkpoint_layers": 0.5},
         "ckpt25": {"checkpoint_layers": 0.25},
         "nockpt": {"activation_checkpointing": False},
         # the default in fp32 (update_dtype=fp32): on CPUs whose bf16 products are slower than fp32
         "fp32": {"update_dtype": "fp32"},
         # the default with each micro-batch computing its prompt prefix (before 2026-12-07)
         "prefix_each": {"prompt_prefix_once": False},
         # the default with left-padded rows (pack_rows=false; before 2026-12-07's second stop)
         "padded": {"pack_rows": False},
         # the default with the Judge's micro-batches of 4 (packed rows pad nothing)
         "judge4": {"judge_micro_batch_size": 4},
         # the default with every block of 1 MiB or more on pages of its own in the passes that train
         # (lean_heap_mb=1; before 2026-12-07's third stop)
         "heap1": {"lean_heap_mb": 1},
         # the default with 4 KiB pages for torch's large blocks (huge_pages=false)
         "nothp": {"huge_pages": False}}


def _trainer(args, tmp: str, settings: dict):
    from omtr.rl.config import train_profile
    from omtr.rl.trainer import Trainer
    from omtr.tasks.training import load_training_tasks

    cfg = train_profile(args.profile).replace(**settings).with_overrides(list(args.set or [])).replace(
        mlflow=False, torch_threads=args.threads or None)
    if args.chunk is not None and cfg.logprob_chunk != 0:
        cfg = cfg.replace(logprob_chunk=args.chunk)
    tasks = load_training_tasks(args.tasks) if args.tasks else None
    if tasks is None:  # the phases need no task records: any one for the Trainer's checks
        from omtr.tasks.generators import generate

        tasks = [t.for_training() for t in generate("blocksworld", 1, 0, min_objects=2, max_objects=2, verify=False)]
    return Trainer(cfg, tasks, tmp, quiet=True)


# ---------------------------------------------------------------------------------------- children

def child_rollout(args) -> dict:
    from omtr.config import EpisodeConfig
    from omtr.inference.episode import run_episodes
    from omtr.policy import Sampling
    from omtr.rl.steps import rewarded_items

    sampler = RssSampler(args.interval_ms / 1000)
    report: dict = {"rss_after_imports_mb": round(rss_mb())}
    with tempfile.TemporaryDirectory() as tmp:
        with sampler.phase("build", report):
            tr = _trainer(args, tmp, {})
        cfg = tr.cfg
        task = tr.batch_tasks(0)[0]
        tasks = [task] * cfg.samples_per_task
        with tr._environment() as env:
            with sampler.phase("engine_refresh", report):
                policy, _ = tr._rollout_policy()
            sampling = Sampling(greedy=False, temperature=cfg.temperature, top_p=cfg.top_p,
                                max_new_tokens=cfg.max_new_tokens, seed=cfg.seed * 7919 + 1)
            with sampler.phase("rollout", report):
                eps = run_episodes(tasks, policy, env, config=EpisodeConfig(max_repairs=cfg.max_repairs),
                                   budget=cfg.budget, sampling=sampling, batch_size=cfg.rollout_batch_size,
                                   judge=cfg.use_judge)
        items, judge_items = rewarded_items(eps, 0, cfg, tr.score, 0, judge_term=False)
        tr._advantages(items)
    sampler.close()
    train = [it for it in items if it.advantage is not None and it.tokens]
    substituted = all(abs(it.advantage) < 1e-12 for it in train)
    if substituted:
        for k, it in enumerate(train):
            it.advantage = 1.0 if k % 2 == 0 else -1.0
    batch = {
        "task": str(task.id),
        "advantages_substituted": substituted,
        "items": [{"ep": it.ep, "group": list(it.group), "role": it.role, "step": it.step, "prompt": it.prompt,
                   "tokens": it.tokens, "old_logprobs": it.old_logprobs, "outcome": it.outcome,
                   "limited": it.limited, "judge_score": it.judge_score, "reward": it.reward,
                   "advantage": it.advantage, "domain": it.domain, "objects": it.objects} for it in train],
        "judge_items": [{"prompt": j.prompt, "label": j.label} for j in judge_items[: cfg.judge_items_per_update or None]],
    }
    Path(args.batch).write_text(json.dumps(batch))
    report["maxrss_mb"] = round(_maxrss_mb())
    report["outcomes"] = [it.outcome for it in train]
    report["completion_tokens"] = [len(it.tokens) for it in train]
    return report


def child_phases(args) -> dict:
    import torch

    from omtr.rl import losses as L
    from omtr.rl.steps import JudgeItem, StepItem, _chunks

    sampler = RssSampler(args.interval_ms / 1000)
    report: dict = {"rss_after_imports_mb": round(rss_mb())}
    data = json.loads(Path(args.batch).read_text())
    with tempfile.TemporaryDirectory() as tmp:
        with sampler.phase("build", report):
            tr = _trainer(args, tmp, PATHS[args.path])
        cfg = tr.cfg
        model = tr.models["actor"]
        report["logprob_chunk"] = model.cfg.logprob_chunk
        report["activation_checkpointing"] = model.cfg.activation_checkpointing
        report["update_dtype"] = tr.update_dtype
        report["micro_batch_size"] = cfg.micro_batch_size
        report["reuse_first_logprobs"] = cfg.reuse_first_logprobs
        with sampler.phase("engine_refresh", report):
            tr._rollout_policy()  # the fast engine's int8 weights, held through the update as in training
        report["lean_memory"] = cfg.lean_memory
        report["lean_heap_mb"] = cfg.lean_heap_mb
        report["huge_pages"] = os.environ.get("THP_MEM_ALLOC_ENABLE") == "1"
        lean = contextlib.ExitStack()
        if cfg.lean_memory:  # as the trainer does after a rollout and around the passes that train
            from omtr.rl.memory import mmap_threshold

            with sampler.phase("release", report):
                tr._release_rollout_memory()
            lean.enter_context(mmap_threshold())
        items = [StepItem(**{**d, "group": tuple(d["group"])}) for d in data["items"]]
        if args.cut:  # the first --cut tokens of each completion (a prefix replays under the same masks)
            for it in items:
                it.tokens, it.old_logprobs = it.tokens[:args.cut], it.old_logprobs[:args.cut]
        judge = [JudgeItem(d["prompt"], d["label"], k) for k, d in enumerate(data["judge_items"])]
        prompt_tokens = [len(p) for p in model.encode_prompts([it.prompt for it in items])]
        report["batch"] = {"rows": len(items), "prompt_tokens": prompt_tokens,
                           "completion_tokens": [len(it.tokens) for it in items],
                           "judge_prompts": len(judge),
                           "judge_prompt_tokens": [len(p) for p in model.encode_prompts([j.prompt for j in judge])]}
        with sampler.phase("old_logprobs", report):
            if not tr.exact_rollout:  # with reuse_first_logprobs, the first minibatch's are left to the PPO phase
                tr._recompute_old(items)
        report["old_logprobs"]["left_to_first_step"] = sum(it.old_pending for it in items)
        for m in tr.distinct:
            m.train()
        tr.backend.zero_grad()
        values: dict = {}
        ppo = {"forward_s": 0.0, "backward_s": 0.0}
        # as one optimizer step's micro-batches (their prefix block; under lean_memory a heap trimmed after each)
        with sampler.phase("ppo_loss", report), tr._prefix_block(), tr._micro_heap() as trim:
            chunks = _chunks([it for it in items if it.role == "actor"], cfg.micro_batch_size)
            for c in chunks:
                t0 = time.perf_counter()
                with tr._precision():
                    loss, st = tr._ppo_loss("actor", c)
                t1 = time.perf_counter()
                tr.backend.backward(loss * cfg.actor_weight * len(c) / len(items), last=False)
                trim()
                ppo["forward_s"] += t1 - t0
                ppo["backward_s"] += time.perf_counter() - t1
                values.setdefault("ppo_loss", []).append(loss.item())
        report["ppo_loss"].update({k: round(v, 2) for k, v in ppo.items()})
        # the policy's old log-probs, those the first step took from its own forward pass included
        values["old_logprobs"] = [list(it.old_logprobs) for it in items]
        report["nonfinite_old_logprobs"] = sum(not math.isfinite(x) for it in items for x in it.old_logprobs)
        report["engine_kl"] = tr._engine_kl() if not tr.exact_rollout else None
        report["ppo_loss"]["micro_batches"] = len(chunks)
        params = [p for m in tr.distinct for p in m.parameters() if p.requires_grad]
        values["ppo_grad_norm"] = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params if p.grad is not None)))
        if args.grads:  # the PPO gradient, for the parent's cosine between paths
            torch.save(torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel())
                                  for p in params]), f"{args.grads}.{args.path}.ppo.pt")
        if judge and cfg.use_judge:
            jm = tr.models["judge"]
            with sampler.phase("judge_loss", report), tr._prefix_block(), tr._micro_heap() as trim:
                for c in _chunks(judge, cfg.judge_micro_batch_size or cfg.micro_batch_size):
                    t0 = time.perf_counter()
                    with tr._precision():
                        s = jm.judge_scores([j.prompt for j in c])
                    loss, _, _ = L.judge_loss(s, torch.tensor([float(j.label) for j in c]), cfg.band_weight)
                    t1 = time.perf_counter()
                    tr.backend.backward(loss * cfg.judge_weight * len(c) / len(judge), last=True)
                    trim()  # as the trainer does (lean_memory)
                    report.setdefault("judge_loss", {})
                    report["judge_loss"]["forward_s"] = round(report["judge_loss"].get("forward_s", 0) + t1 - t0, 2)
                    report["judge_loss"]["backward_s"] = round(report["judge_loss"].get("backward_s", 0)
                                                               + time.perf_counter() - t1, 2)
                    values.setdefault("judge_loss", []).append(loss.item())
        if args.grads:  # the PPO and Judge gradient together (clipped by the step: taken before it)
            torch.save(torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel())
                                  for p in params]), f"{args.grads}.{args.path}.all.pt")
        with sampler.phase("step", report):
            values["grad_norm"] = float(tr.backend.step())
        lean.close()
    sampler.close()
    report["maxrss_mb"] = round(_maxrss_mb())
    report["values"] = values
    return report


# ---------------------------------------------------------------------------------------- parent

def _run_child(argv: list[str]) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    try:
        proc = subprocess.run([sys.executable, __file__, *argv, "--child-out", out], text=True)
        if proc.returncode:
            raise SystemExit(f"child {' '.join(argv)} failed with status {proc.returncode}")
        return json.loads(Path(out).read_text())
    finally:
        os.unlink(out)


def _cosine(grads: str, a: str, b: str, which: str) -> float | None:
    import torch

    try:
        x, y = (torch.load(f"{grads}.{p}.{which}.pt").double() for p in (a, b))
    except FileNotFoundError:
        return None
    return float(torch.nn.functional.cosine_similarity(x, y, dim=0))


def _diffs(a: dict, b: dict, grads: str | None = None, pa: str = "", pb: str = "") -> dict:
    va, vb = a["values"], b["values"]
    pairs = [(x, y) for ra, rb in zip(va["old_logprobs"], vb["old_logprobs"]) for x, y in zip(ra, rb)
             if math.isfinite(x) and math.isfinite(y)]  # a token both paths' masks refuse is -inf in each
    old = max((abs(x - y) for x, y in pairs), default=0.0)
    out = {"old_logprobs_max_abs": old,
           "ppo_loss_max_abs": max(abs(x - y) for x, y in zip(va.get("ppo_loss", [0]), vb.get("ppo_loss", [0]))),
           "ppo_grad_norm_rel": abs(va["ppo_grad_norm"] - vb["ppo_grad_norm"]) / max(va["ppo_grad_norm"], 1e-30)}
    if "judge_loss" in va and "judge_loss" in vb:
        out["judge_loss_max_abs"] = max(abs(x - y) for x, y in zip(va["judge_loss"], vb["judge_loss"]))
    mean_abs = [abs(x - y) for x, y in pairs]
    out["old_logprobs_mean_abs"] = sum(mean_abs) / max(1, len(mean_abs))
    if grads:
        out["ppo_grad_cosine"] = _cosine(grads, pa, pb, "ppo")
        out["grad_cosine"] = _cosine(grads, pa, pb, "all")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="small", help="training profile (default small)")
    ap.add_argument("--tasks", help="training task records (omtr tasks generate); the rollout takes the first "
                                    "task of the trainer's first batch (default: 32 generated BlocksWorld tasks, "
                                    "2-4 blocks, seed 0)")
    ap.add_argument("--batch", help="a batch saved by an earlier run (--save-batch): skip the rollout")
    ap.add_argument("--save-batch", help="keep the rollout's batch in this file")
    ap.add_argument("--paths", default="old,default",
                    help="paths, in order: old (the update when issue 42 was filed: logprob_chunk=0, no activation "
                         "checkpointing, fp32, micro-batches of 8, a separate old-log-prob pass for every step), "
                         "chunked (chunks only), lean (chunks and checkpointing, fp32), bf16 (lean under "
                         "update_dtype=bf16), default (the profile as it is: micro-batches of 4 cut by length, the "
                         "first minibatch's old log-probs from its own pass, update_dtype=auto, packed rows), padded "
                         "(the default with left-padded rows), judge4, fp32, prefix_each, ckpt50, ckpt25, nockpt; "
                         "'none' for the "
                         "rollout alone (default old,default)")
    ap.add_argument("--chunk", type=int, default=None, help="logprob_chunk of the chunked path (default: the model's)")
    ap.add_argument("--cut", type=int, default=0,
                    help="keep the first N tokens of each completion (the old path needs ~20 GB for completions "
                         "of ~900 tokens; default 0: whole)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    ap.add_argument("--interval-ms", type=float, default=5.0, help="RSS sampling interval (default 5 ms)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a training setting for every path, as omtr train --set takes it "
                         "(e.g. --set micro_batch_size=4); repeatable")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--child", choices=("rollout", "phases"), help=argparse.SUPPRESS)
    ap.add_argument("--path", choices=tuple(PATHS), help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--grads", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        import logging

        from omtr.rl.config import train_profile
        from omtr.rl.memory import ask_huge_pages

        logging.basicConfig(level=logging.WARNING)
        settings = PATHS[args.path] if args.child == "phases" else {}
        # as omtr train does, before torch is imported (its allocator reads the setting once)
        ask_huge_pages(train_profile(args.profile).replace(**settings).with_overrides(list(args.set)).huge_pages)
        rep = child_rollout(args) if args.child == "rollout" else child_phases(args)
        Path(args.child_out).write_text(json.dumps(rep))
        return

    common = ["--profile", args.profile, "--threads", str(args.threads), "--interval-ms", str(args.interval_ms),
              "--cut", str(args.cut),
              *(x for kv in args.set for x in ("--set", kv))]
    out: dict = {"benchmark": "update_memory", "profile": args.profile, "settings": args.set, "cut": args.cut,
                 "threads": args.threads or None,
                 "date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(),
                 "memory": "peak RSS sampled every %g ms by a thread, each part in a fresh process" % args.interval_ms}
    tmpdir = tempfile.TemporaryDirectory()
    tasks = args.tasks
    batch = args.batch
    if batch is None:
        if tasks is None:
            tasks = str(Path(tmpdir.name) / "tasks.jsonl")
            subprocess.run([sys.executable, "-m", "omtr", "tasks", "generate", "--family", "blocksworld", "--n", "32",
                            "--min-objects", "2", "--max-objects", "4", "--seed", "0", "--split", "train",
                            "--out", tasks], check=True, capture_output=True)
        batch = args.save_batch or str(Path(tmpdir.name) / "batch.json")
        print("rollout ...", file=sys.stderr)
        out["rollout"] = _run_child(["--child", "rollout", "--tasks", tasks, "--batch", batch, *common])
        print(json.dumps({k: out["rollout"][k] for k in ("rollout", "maxrss_mb")}), file=sys.stderr)
    out["batch_file"] = args.batch
    out["advantages_substituted"] = json.loads(Path(batch).read_text()).get("advantages_substituted")
    out["paths"] = {}
    grads = str(Path(tmpdir.name) / "grad")
    for path in [p for p in args.paths.split(",") if p and p != "none"]:
        print(f"phases, {path} path ...", file=sys.stderr)
        argv = ["--child", "phases", "--path", path, "--batch", batch, "--grads", grads, *common]
        if args.chunk is not None:
            argv += ["--chunk", str(args.chunk)]
        rep = _run_child(argv)
        out["paths"][path] = rep
        print(json.dumps({k: rep[k] for k in ("old_logprobs", "ppo_loss", "maxrss_mb") if k in rep}), file=sys.stderr)
    p = out["paths"]
    if "old" in p:
        out["differences_from_old"] = {path: _diffs(p["old"], p[path], grads, "old", path) for path in p if path != "old"}
    if "lean" in p and "bf16" in p:
        out["bf16_vs_lean"] = _diffs(p["lean"], p["bf16"], grads, "lean", "bf16")
    out["summary"] = {ph: {path: {"rss_peak_mb": p[path][ph]["rss_peak_mb"], "seconds": p[path][ph]["seconds"]}
                           for path in p if ph in p[path]}
                      for ph in ("old_logprobs", "ppo_loss", "judge_loss", "step")}
    out["summary"]["process_maxrss_mb"] = {path: p[path]["maxrss_mb"] for path in p}
    # the update as the trainer times it: the PPO and Judge losses with their backward passes, the step
    upd = {path: round(sum(p[path].get(ph, {}).get("seconds", 0.0) for ph in ("ppo_loss", "judge_loss", "step")), 2)
           for path in p}
    out["summary"]["update_s"] = upd
    if "old" in upd:
        out["summary"]["update_speedup_vs_old"] = {path: round(upd["old"] / upd[path], 2) for path in upd if upd[path]}
        # with the old-log-prob pass, which the default path shortens (its first minibatch's are in the PPO phase)
        whole = {path: round(upd[path] + p[path]["old_logprobs"]["seconds"], 2) for path in p}
        out["summary"]["old_logprobs_and_update_s"] = whole
        out["summary"]["old_logprobs_and_update_speedup_vs_old"] = {path: round(whole["old"] / whole[path], 2)
                                                                    for path in whole if whole[path]}
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    tmpdir.cleanup()


if __name__ == "__main__":
    main()
