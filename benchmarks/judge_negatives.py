"""Does a Judge trained on negatives made from the Actor's own specs separate faithful answers?

Issue 41, section 2's third candidate: the Judge learns, from the Actor's own solved specs that the
supported reward pays in full (positives) and mutants of them (``omtr.rl.negatives``: an atom under
another predicate, an object the English never names, an atom left out; negatives), what changes a
spec's meaning, with no reference anywhere in its training data.

1. **Training data, annotation-free.** Generated tasks of the generator families (train split,
   domain given); the small profile's Actor answers each greedily (fast engine, the decoder's rules
   on); the planner and the supported reward label them; ``rewarded_items`` (the trainer's own code
   path, ``judge_negatives=K``) adds K mutants of each positive as negatives.
2. **Training.** ``L_J`` alone (``Trainer.judge_step``: the Judge head and the LoRA adapters of the
   shared backbone), ``--epochs`` passes in shuffled mini-batches.
3. **Held-out measurement, before and after**, on data the Judge never saw:
   * the solved samples of the 2026-12-03 pool (``docs/results/faithfulness-signals-2026-12-03-
     rescored.json``: PlanBench BlocksWorld and Mystery, generated BlocksWorld and Gripper; graded F or
     D by the checker against the reference, which only this evaluation reads): AUC between F and D,
     pooled and within task, with a bootstrap interval over tasks;
   * mutants of test-split references of every generator family and PlanBench family (spelled as the
     English spells them): AUC between the reference and its mutants.

``--loose N`` adds the third kind of training item, also annotation-free: N answers of each
training task decoded under the statement's names rule alone (``statement_facts``,
``statement_predicates`` and ``init_invariants`` off for that rollout: the first greedy, the rest
sampled at the training temperature), labelled by the planner and the supported reward like the
others. These are the Actor's own solved-but-unsupported answers that the full rules never let it
write. ``--pool-tasks FILE --pool-dirs DIR...`` rescores the solved first-step answers of
evaluations already run (``benchmarks/statement_rules.py``'s folders: scoped decoding and the names
rule alone on the same held-out tasks) with this Judge before and after, faithful against
solved-but-unfaithful (the checker's grade, which only this measurement reads), pooled and within
task. ``--save-model DIR`` keeps the trained model. ``--judge-checks off`` builds every Judge prompt as the
paper does (task and spec only); by default they show the annotation-free checks against the spec
(``ModelConfig.judge_checks``), as every door of omtr builds them. ``--save-items FILE`` keeps the
training items (each Judge prompt and its label) and ``--items FILE`` trains on them without a rollout;
``--measure-epochs`` measures after every epoch.

The JSON holds the settings, each phase's seconds and every score.

Usage::

    python benchmarks/judge_negatives.py --out docs/results/judge-negatives-2026-12-05.json
    python benchmarks/judge_negatives.py --model micro --train-per-family 1 --epochs 1 --out /tmp/j.json  # smoke
    python benchmarks/judge_negatives.py --negatives 0 --loose 2 --pool '' --heldout-per-family 0 \
        --pool-tasks out/statement-rules/tasks-....jsonl --pool-dirs out/statement-rules/scoped-b1-... \
        out/statement-rules/names-b1-... --out judge-loose.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import random
import time
from pathlib import Path

import numpy as np

log = logging.getLogger("judge_negatives")

FAMILIES = ("blocksworld", "mystery_blocksworld", "gripper", "logistics")
PLANBENCH = ("blocksworld", "mystery_blocksworld", "logistics", "depots")
POOL = "docs/results/faithfulness-signals-2026-12-03-rescored.json"


def auc_with_ci(pos_by_task: dict, neg_by_task: dict, n_boot: int, seed: int, within: bool) -> dict:
    """AUC (ties half) of positives over negatives, pooled or within task only, with a percentile
    bootstrap over tasks (tasks resampled, their scores travelling with them)."""
    tasks = sorted(set(pos_by_task) | set(neg_by_task))

    def value(sample) -> float | None:
        wins = pairs = 0.0
        if within:
            for t in sample:
                p, n = pos_by_task.get(t, []), neg_by_task.get(t, [])
                wins += sum((a > b) + 0.5 * (a == b) for a in p for b in n)
                pairs += len(p) * len(n)
        else:
            p = [a for t in sample for a in pos_by_task.get(t, [])]
            n = [b for t in sample for b in neg_by_task.get(t, [])]
            wins = sum((a > b) + 0.5 * (a == b) for a in p for b in n)
            pairs = len(p) * len(n)
        return wins / pairs if pairs else None

    v = value(tasks)
    rng = np.random.default_rng(seed)
    boots = [b for b in (value([tasks[i] for i in rng.integers(0, len(tasks), len(tasks))]) for _ in range(n_boot))
             if b is not None]
    ci = [round(float(np.percentile(boots, q)), 4) for q in (2.5, 97.5)] if boots else [None, None]
    return {"value": None if v is None else round(v, 4), "ci": ci, "tasks": len(tasks),
            "positives": sum(len(x) for x in pos_by_task.values()),
            "negatives": sum(len(x) for x in neg_by_task.values())}


def pool_items(path: str, checks: bool = True) -> list[tuple[str, str, list, bool]]:
    """(task id, set, Judge prompt, faithful) for every solved sample of the 2026-12-03 pool."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from faithfulness_signals import build_tasks

    from omtr.inference import prompts as P

    d = json.loads(Path(path).read_text())
    views = {t.id: t.for_training() for t in build_tasks(argparse.Namespace(**d["settings"]))}
    out = []
    for r in d["records"]:
        view = views[r["id"]]
        for s in r["samples"]:
            if s["grade"] in ("F", "D"):
                prompt = P.judge_messages(view, P.spec_text(view.domain, s["problem"], s["problem"], given=True),
                                          checks=checks, domain=view.domain, problem=s["problem"])
                out.append((r["id"], r["set"], prompt, s["grade"] == "F"))
    return out


def evaluation_items(tasks_file: str, dirs: list[str], checks: bool = True) -> list[tuple[str, str, list, bool]]:
    """(task id, set, Judge prompt, faithful) for every solved first-step (Actor) answer in these
    evaluations' traces, the prompt built as the episode loop builds it (the task's given domain,
    its English, the problem)."""
    from types import SimpleNamespace

    from omtr.inference import prompts as P

    tasks = {}
    for line in Path(tasks_file).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            tasks[str(r["id"])] = r
    out = []
    for d in dirs:
        for line in (Path(d) / "traces.jsonl").read_text().splitlines():
            r = json.loads(line)
            steps = r.get("steps") or []
            if r.get("kind", "planning") != "planning" or not steps or not (steps[0].get("verdict") or {}).get("success"):
                continue
            t = tasks[str(r["id"])]
            view = SimpleNamespace(nl=t["nl"], domain=t.get("domain"))
            given = bool(t.get("domain"))
            s0 = steps[0]
            spec = P.spec_text(s0.get("domain"), s0.get("problem"), s0.get("text") or "", given=given)
            family = t.get("family") or "?"
            where = ("generated/" if str(r["id"]).startswith("gen-") else "planbench/") + family
            prompt = P.judge_messages(view, spec, checks=checks, domain=s0.get("domain"), problem=s0.get("problem"))
            out.append((str(r["id"]), where, prompt, bool((r.get("faithful") or {}).get("faithful"))))
    return out


def loose_episodes(tr, tasks, env, n: int, max_new_tokens: int, seed: int):
    """``n`` answers of each task under the statement's names rule alone (the first greedy, the rest
    sampled at the trainer's temperature): the actor's decoder flags are lowered for this rollout
    only and put back after."""
    from omtr.inference.episode import run_episodes
    from omtr.policy import Sampling

    actor = tr.models["actor"]
    kept = actor.cfg
    actor.cfg = kept.replace(statement_facts=False, statement_predicates=False, init_invariants=False)
    try:
        policy, _ = tr._rollout_policy()
        eps = run_episodes(tasks, policy, env, budget=1, judge=False, batch_size=8,
                           sampling=Sampling(greedy=True, max_new_tokens=max_new_tokens, seed=seed))
        if n > 1:
            many = [t for t in tasks for _ in range(n - 1)]
            eps += run_episodes(many, policy, env, budget=1, judge=False, batch_size=8,
                                sampling=Sampling(greedy=False, temperature=tr.cfg.temperature, top_p=tr.cfg.top_p,
                                                  max_new_tokens=max_new_tokens, seed=seed + 1))
    finally:
        actor.cfg = kept
    return eps


def mutant_items(per_family: int, k: int, seed: int, checks: bool = True) -> list[tuple[str, str, list, bool]]:
    """(task id, set, Judge prompt, is the reference) for test-split references and their mutants."""
    from omtr.evaluation.spelling import spelled_problem
    from omtr.inference import prompts as P
    from omtr.rl.negatives import mutants
    from omtr.tasks.generators import generate
    from omtr.tasks.planbench import import_planbench
    from omtr.tasks.planbench_data import shipped_root

    rng = random.Random(seed)
    tasks = []
    for fam in FAMILIES:
        tasks += [(f"generated/{fam}", t) for t in generate(fam, per_family, seed, split="test", verify=False)]
    for fam in PLANBENCH:
        pool = import_planbench(shipped_root(), [fam])
        tasks += [(f"planbench/{fam}", t) for t in rng.sample(pool, per_family)]
    out = []
    for where, t in tasks:
        view = t.with_given_domain().for_training()
        p = spelled_problem(t)
        out.append((t.id, where, P.judge_messages(view, P.spec_text(view.domain, p, p, given=True), checks=checks,
                                                  domain=view.domain, problem=p), True))
        for _, m in mutants(view.domain, p, random.Random(f"{seed}:{t.id}"), k=k):
            out.append((t.id, where, P.judge_messages(view, P.spec_text(view.domain, m, m, given=True), checks=checks,
                                                      domain=view.domain, problem=m), False))
    return out


def measure(model, items, batch: int, n_boot: int, seed: int) -> dict:
    import torch

    model.eval()
    with torch.no_grad():
        scores = model.judge([it[2] for it in items], batch_size=batch)
    res: dict = {"scores": [round(s, 5) for s in scores]}
    sets = sorted({it[1] for it in items})
    for where in ["all", *sets]:
        pos: dict = {}
        neg: dict = {}
        for it, s in zip(items, scores):
            if where == "all" or it[1] == where:
                (pos if it[3] else neg).setdefault(it[0], []).append(s)
        res[where] = {"pooled": auc_with_ci(pos, neg, n_boot, seed, within=False),
                      "within_task": auc_with_ci(pos, neg, n_boot, seed, within=True)}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small", help="profile or model dir (micro: a smoke test of the code)")
    ap.add_argument("--train-per-family", type=int, default=8, help="generated training tasks per family")
    ap.add_argument("--negatives", type=int, default=2, help="mutants per positive (judge_negatives)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4, help="Judge items per optimizer step")
    ap.add_argument("--lr", type=float, default=None, help="learning rate (default: the profile's)")
    ap.add_argument("--heldout-per-family", type=int, default=3, help="test references per family for the mutant AUC")
    ap.add_argument("--pool", default=POOL, help="samples graded F/D for the held-out AUC ('' to skip)")
    ap.add_argument("--loose", type=int, default=0,
                    help="answers per training task under the names rule alone, as more Judge items (module doc)")
    ap.add_argument("--pool-tasks", help="the task file of the --pool-dirs evaluations")
    ap.add_argument("--pool-dirs", nargs="*", default=[], help="evaluations whose solved answers are rescored")
    ap.add_argument("--save-model", help="save the model with the trained Judge here")
    ap.add_argument("--save-items", help="write the training items (Judge prompt, label) as JSON lines here")
    ap.add_argument("--items", help="train on the items an earlier run saved (--save-items) instead of rolling out")
    ap.add_argument("--measure-epochs", action="store_true", help="measure after every epoch, not only the last")
    ap.add_argument("--judge-checks", choices=("on", "off"), default="on",
                    help="the Judge's prompts show the annotation-free checks (ModelConfig.judge_checks; off: the "
                         "paper's (task, spec) prompt), in training and in every measurement")
    ap.add_argument("--max-new-tokens", type=int, default=448)
    ap.add_argument("--seed", type=int, default=4101)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import torch

    from omtr.config import SolverConfig
    from omtr.inference.episode import run_episodes
    from omtr.policy import Sampling
    from omtr.rl.config import train_profile
    from omtr.rl.steps import rewarded_items
    from omtr.rl.trainer import Trainer
    from omtr.solver import SolverPool
    from omtr.tasks.generators import generate

    torch.set_num_threads(args.threads)
    result: dict = {"settings": vars(args), "seconds": {}}
    checks = args.judge_checks == "on"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        out.write_text(json.dumps(result, indent=1) + "\n")

    t0 = time.perf_counter()
    train = []
    for fam in FAMILIES:
        for t in generate(fam, args.train_per_family, args.seed, split="train", min_objects=2, max_objects=4,
                          verify=False):
            train.append(dataclasses.replace(t.with_given_domain(), id="train-" + t.id).for_training())
    # a model directory (a trained model, e.g. the main job's) trains and measures under the small profile
    base = (train_profile("small").replace(model=args.model) if Path(args.model).is_dir()
            else train_profile(args.model))
    cfg = base.replace(judge_negatives=args.negatives, judge_checks=checks, samples_per_task=2, episodes_per_batch=2 * len(train),
                       **({"lr": args.lr} if args.lr else {}))
    evals = {}
    if args.heldout_per_family:
        evals["mutants"] = mutant_items(args.heldout_per_family, max(1, args.negatives), args.seed, checks)
    if args.pool:
        evals["pool"] = pool_items(args.pool, checks)
    if args.pool_dirs:
        evals["evaluations"] = evaluation_items(args.pool_tasks, args.pool_dirs, checks)
    result["eval_items"] = {k: [[it[0], it[1], it[3]] for it in v] for k, v in evals.items()}
    with SolverPool(2, SolverConfig(time_limit_s=20)) as env:
        tr = Trainer(cfg, train, Path(args.out).with_suffix(".run"), env=env, quiet=True)
        judge = tr.models["judge"]
        t = time.perf_counter()
        result["before"] = {k: measure(judge, v, 8, args.bootstrap, args.seed) for k, v in evals.items()}
        result["seconds"]["measure_before"] = round(time.perf_counter() - t, 1)
        log.info("before: %s", {k: v["all"] for k, v in result["before"].items()})
        save()
        if args.items:  # the items of an earlier run (--save-items): no rollout
            from omtr.rl.steps import JudgeItem

            rows = [json.loads(line) for line in Path(args.items).read_text().splitlines() if line.strip()]
            judge_items = [JudgeItem(r["prompt"], bool(r["label"])) for r in rows]
            labels = [j.label for j in judge_items]
            result["training_items"] = {"from": args.items, "positives": sum(labels),
                                        "negatives": len(labels) - sum(labels)}
        else:
            t = time.perf_counter()
            policy, _ = tr._rollout_policy()
            eps = run_episodes(train, policy, env, budget=1, judge=False, batch_size=8,
                               sampling=Sampling(greedy=True, max_new_tokens=args.max_new_tokens, seed=args.seed))
            _, judge_items = rewarded_items(eps, 0, cfg, tr.score, 0, judge_term=False, judge_checks=checks)
            result["seconds"]["rollout"] = round(time.perf_counter() - t, 1)
            labels = [j.label for j in judge_items]
            result["training_items"] = {"tasks": len(train), "solved": sum(e.success for e in eps),
                                        "positives": sum(labels), "negatives": len(labels) - sum(labels)}
            if args.loose:
                t = time.perf_counter()
                leps = loose_episodes(tr, train, env, args.loose, args.max_new_tokens, args.seed)
                _, loose_items = rewarded_items(leps, 0, cfg.replace(judge_negatives=0), tr.score, 0, judge_term=False,
                                                judge_checks=checks)
                result["seconds"]["loose_rollout"] = round(time.perf_counter() - t, 1)
                ll = [j.label for j in loose_items]
                result["training_items"]["loose"] = {"answers": len(leps), "solved": sum(e.success for e in leps),
                                                     "positives": sum(ll), "negatives": len(ll) - sum(ll)}
                judge_items += loose_items
            if args.save_items:
                Path(args.save_items).write_text("".join(json.dumps({"prompt": j.prompt, "label": j.label}) + "\n"
                                                         for j in judge_items))
        log.info("training items: %s", result["training_items"])
        save()
        t = time.perf_counter()
        rng = random.Random(args.seed)
        losses = []
        for epoch in range(args.epochs):
            order = list(range(len(judge_items)))
            rng.shuffle(order)
            for i in range(0, len(order), args.batch):
                chunk = [judge_items[j] for j in order[i:i + args.batch]]
                losses.append(round(tr.judge_step([c.prompt for c in chunk], [c.label for c in chunk]), 5))
                log.info("epoch %d step %d: L_J %.4f, grad norm %.3g", epoch + 1, len(losses), losses[-1],
                         getattr(tr, "last_grad_norm", float("nan")))
            log.info("epoch %d: mean L_J %.4f", epoch + 1, float(np.mean(losses[-(len(order) // args.batch or 1):])))
            if args.measure_epochs and epoch + 1 < args.epochs:
                got = {k: measure(judge, v, 8, args.bootstrap, args.seed) for k, v in evals.items()}
                result.setdefault("epochs", []).append({k: {w: r for w, r in v.items() if w != "scores"}
                                                        for k, v in got.items()})
                log.info("after epoch %d: %s", epoch + 1, {k: v["all"] for k, v in got.items()})
                save()
        result["losses"] = losses
        result["skipped_steps"] = getattr(tr.backend, "skipped_steps", None)
        result["seconds"]["train"] = round(time.perf_counter() - t, 1)
        save()
        t = time.perf_counter()
        result["after"] = {k: measure(judge, v, 8, args.bootstrap, args.seed) for k, v in evals.items()}
        result["seconds"]["measure_after"] = round(time.perf_counter() - t, 1)
        if args.save_model:
            judge.save(args.save_model)
        log.info("after: %s", {k: v["all"] for k, v in result["after"].items()})
    result["seconds"]["total"] = round(time.perf_counter() - t0, 1)
    save()
    for k in evals:
        for where in sorted(result["after"][k]):
            if where == "scores":
                continue
            b, a = result["before"][k][where], result["after"][k][where]
            print(f"{k:8s} {where:34s} pooled {b['pooled']['value']} -> {a['pooled']['value']} {a['pooled']['ci']}  "
                  f"within {b['within_task']['value']} -> {a['within_task']['value']} {a['within_task']['ci']}")


if __name__ == "__main__":
    main()
