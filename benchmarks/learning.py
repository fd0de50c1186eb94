"""Does RL from planner feedback lift SmolLM2 on held-out tasks? The small-model recipe, measured.

    python benchmarks/learning.py --mode given --minutes 30 --results docs/results   # the domain-given proof
    python benchmarks/learning.py --mode full --minutes 60 --results docs/results    # domain and problem
    python benchmarks/learning.py --mode given --minutes 3 --eval 4 --pass-k 0 --budgets 1   # a smoke run

Tasks are generated: BlocksWorld and Gripper, training tasks from ``--seed`` and held-out tasks from
another seed and the generator's ``test`` split (disjoint instance signatures, never trained on),
sizes ``--min-objects``..``--max-objects``. ``--mode given`` gives each task the family's domain
(the Actor writes the problem); ``--mode full`` asks for both.

The held-out tasks are evaluated before training and after each condition (``--conditions``, outcome
scores of ``omtr.rl.rewards``: ``supported``, the default and the small profile's, pays a solved spec
with a plan only when its initial state breaks none of the given domain's mutex invariants;
``nontrivial`` is the paper's ``binary`` except that a solved spec with an empty plan scores 0;
``binary``, ``grounded`` and ``shaped`` can be asked for), each condition
starting from the same initial weights and training for ``--minutes`` of wall time (or
``--updates``) with the ``small`` training profile's recipe (``omtr.rl.config``: group advantages
over ``samples_per_task`` samples at temperature 0.7, dynamic sampling, the gated Judge term, a
curriculum by object count), through ``omtr.rl.trainer.Trainer``, the code ``omtr train`` runs.

During training, ``--probe`` tasks of a third draw (disjoint from both) are graded every
``--probe-every`` updates (``omtr.evaluation.probe``: greedy faithful success, drift, the Judge's AUC
between faithful and unfaithful specs), and the collapse guards (the largest semantic cluster's share
of a task's samples, clusters per task, how often a task's largest cluster changes) are logged per
update; both are in the curve. The probe's numbers are never fed to training.

Evaluation, per held-out task: greedy at each budget in ``--budgets`` (1: the Actor's spec alone;
6: the Actor and up to 5 Editor repairs) and pass@k (``--pass-k`` samples at 0.7, budget 1). Each
answer is graded ``faithful`` (the checker finds it equivalent to the reference), ``unfaithful``
(solved with a plan, another task), ``empty`` (solved with an empty plan: the goal holds in the
spec's own initial state) or its failure's category, and three rates are reported: ``success`` (the
paper's planner success: any of the three solved grades), ``nontrivial`` (solved with a plan) and
``faithful``, plus ``drift`` (unfaithful over solved with a plan) and the Judge's AUC between the
faithful and unfaithful pass@k samples. An untrained SmolLM2 "solves" nearly every domain-given task with a degenerate spec,
which is why planner success alone says little here. Reported: the rates with 95% bootstrap
intervals over tasks, the paired gain (after - before) with its bootstrap interval, grades, the
training curve, seconds; the mean ``grounding`` of the greedy answers (how well each problem's
atoms line up with the facts its task states, :mod:`omtr.rl.grounding`, from the English and the
spec alone) and the first budget's answers; ``OUT/learning.json``, ``OUT/learning_curve.png``
(copied to ``--results`` as ``learning-<mode>-<date>.*``) and each condition's trained model in
``OUT/<condition>/model`` (usable as ``omtr infer --model``). Reference PDDL is used only to generate tasks, in
the given mode as the given domain, and by the checker when grading held-out answers; the trainer
reads the training file through ``omtr.tasks.training`` and never sees a reference.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import random
import shutil
import tempfile
import time
from pathlib import Path

CATS = ("success", "syntax", "object_type", "predicate_schema", "precondition_effect", "goal_constraint",
        "unreachable_search")
FAMILIES = {"blocksworld": "blocks", "gripper": "balls"}
log = logging.getLogger("omtr.learning")


def bootstrap_ci(xs: list[float], n: int = 4000, seed: int = 0) -> list[float]:
    """[mean, low, high]: the mean and a 95% percentile-bootstrap interval over ``xs``."""
    if not xs:
        return [float("nan")] * 3
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(xs) for _ in xs) / len(xs) for _ in range(n))
    return [round(sum(xs) / len(xs), 4), round(means[int(0.025 * n)], 4), round(means[int(0.975 * n) - 1], 4)]


def make_tasks(args, out: Path):
    """Write the training and held-out task files; returns their TrainingTask lists."""
    from omtr.tasks.generators import generate
    from omtr.tasks.records import write_tasks
    from omtr.tasks.training import load_training_tasks

    families = args.families.split(",")
    train, test = [], []
    for k, fam in enumerate(families):
        kw = dict(min_objects=args.min_objects, max_objects=args.max_objects, verify=False)
        train += generate(fam, -(-args.train // len(families)), args.seed + k, split="train", **kw)
        test += generate(fam, -(-args.eval // len(families)), args.seed + 1000 + k, split="test", **kw)
    seen = {t.meta.get("signature") for t in train}
    test = [t for t in test if t.meta.get("signature") not in seen]
    # The probe's tasks: another held-out draw, disjoint from both (graded during training, so not
    # the tasks the final figures are measured on).
    probe = []
    for k, fam in enumerate(families if args.probe else []):
        probe += generate(fam, -(-args.probe // len(families)), args.seed + 2000 + k, split="test", **kw)
    seen |= {t.meta.get("signature") for t in test}
    probe = [t for t in probe if t.meta.get("signature") not in seen]
    if args.mode == "given":
        train, test = [t.with_given_domain() for t in train], [t.with_given_domain() for t in test]
        probe = [t.with_given_domain() for t in probe]
    args.probe_tasks = probe
    # PlanBench's own text (BlocksWorld and Mystery), domain given: never trained on, graded before and after.
    args.pb_tasks = []
    if args.planbench:
        from omtr.tasks.planbench import import_planbench
        from omtr.tasks.planbench_data import shipped_root

        rng = random.Random(args.seed)
        for fam in ("blocksworld", "mystery_blocksworld"):
            pool = import_planbench(shipped_root(), [fam])
            args.pb_tasks += [t.with_given_domain() for t in rng.sample(pool, min(args.planbench, len(pool)))]
    write_tasks(out / "train.jsonl", train)
    write_tasks(out / "test.jsonl", test)
    # The trainer and the policies see the tasks through omtr.tasks.training (no reference); the
    # held-out references stay here, for the faithfulness check of evaluation.
    return load_training_tasks(out / "train.jsonl"), load_training_tasks(out / "test.jsonl"), test


def grade(task, ep) -> str:
    """``faithful``, ``unfaithful`` (solved with a plan, not the task), ``empty`` (solved with an
    empty plan: the goal holds in the spec's own initial state) or the failure's category."""
    from omtr.evaluation.run import faithfulness
    from omtr.rl.rewards import outcome

    f = ep.final
    if f is None:
        return "syntax"
    o = outcome(f.verdict)
    if o != "success":
        return o
    if not f.verdict.plan:
        return "empty"
    rep = faithfulness(task, {"success": True, "domain": f.domain, "problem": f.problem, "plan": f.verdict.plan})
    return "faithful" if rep.get("faithful") else "unfaithful"


SOLVED = ("faithful", "unfaithful", "empty")  # the planner's success, whatever the spec asks for
MEASURES = {  # what counts as a success for each reported rate
    "success": SOLVED,  # the paper's planner success
    "nontrivial": ("faithful", "unfaithful"),  # solved with a plan of at least one action
    "faithful": ("faithful",),  # the checker: equivalent to the reference (evaluation only)
}


def evaluate(model, tasks, refs, pool, args) -> dict:
    """Per held-out task: the greedy outcome at each budget, and pass@k (k samples at 0.7, budget 1),
    graded by :func:`grade` (``refs``: the same tasks with their references, for the checker)."""
    from omtr.inference.episode import run_episodes
    from omtr.policy import Sampling
    from omtr.rl.grounding import grounding_score
    from omtr.rollout import make_engine

    model.eval()
    engine = make_engine(args.eval_engine, model)
    out: dict = {"tasks": [t.id for t in tasks]}
    t0 = time.time()
    for b in args.budgets:
        eps = run_episodes(tasks, engine, pool, budget=b, judge=False, batch_size=args.eval_batch,
                           sampling=Sampling(greedy=True, max_new_tokens=args.max_new_tokens))
        out[f"b{b}"] = [grade(r, e) for r, e in zip(refs, eps)]
        out[f"b{b}_calls"] = sum(e.planner_calls for e in eps)
        # How well each final problem lines up with the facts its task states (omtr.rl.grounding:
        # the English and the spec only), and the greedy answers themselves, for reading.
        answers = [e.final.problem if e.final else None for e in eps]
        out[f"b{b}_grounding"] = [grounding_score(t.nl, a) for t, a in zip(tasks, answers)]
        if b == args.budgets[0]:
            out["answers"] = answers
        g = out[f"b{b}"]
        log.info("  budget %d: %d/%d solved (%d with an empty plan), %d faithful", b, sum(x in SOLVED for x in g),
                 len(tasks), g.count("empty"), g.count("faithful"))
    if args.pb_tasks:
        pb = args.pb_tasks
        eps = run_episodes([t.for_training() for t in pb], engine, pool, budget=1, judge=False,
                           batch_size=args.eval_batch, sampling=Sampling(greedy=True, max_new_tokens=args.planbench_tokens))
        out["planbench_tasks"] = [t.id for t in pb]
        out["planbench"] = [grade(t, e) for t, e in zip(pb, eps)]
        g = out["planbench"]
        log.info("  PlanBench (BlocksWorld, Mystery), budget 1: %d/%d solved, %d faithful", sum(x in SOLVED for x in g),
                 len(pb), g.count("faithful"))
    if args.pass_k:
        reps = [t for t in tasks for _ in range(args.pass_k)]
        eps = run_episodes(reps, engine, pool, budget=1, judge=True, batch_size=args.eval_batch,
                           sampling=Sampling(greedy=False, temperature=0.7, max_new_tokens=args.max_new_tokens,
                                             seed=args.seed + 99))
        grades = [grade(refs[i // args.pass_k], e) for i, e in enumerate(eps)]
        out["samples"] = grades
        # The Judge between faithful (F) and solved-but-unfaithful (D) samples: the paper's H.9 pool.
        from omtr.telemetry import binary_auc

        fd = [(e.judge_score, g == "faithful") for e, g in zip(eps, grades)
              if e.judge_score is not None and g in ("faithful", "unfaithful")]
        out["sample_judge_scores"] = [e.judge_score for e in eps]
        out["judge_auc_fd"] = binary_auc([s for s, _ in fd], [y for _, y in fd]) if fd else None
        for name, ok in MEASURES.items():
            wins = [g in ok for g in grades]
            out[f"pass_k_{name}"] = [any(wins[i * args.pass_k:(i + 1) * args.pass_k]) for i in range(len(tasks))]
            out[f"sample_{name}"] = sum(wins) / max(1, len(wins))
        log.info("  pass@%d: %d/%d tasks solved, %d with a plan, %d faithful; of the samples %.2f solved, %.2f with "
                 "a plan, %.2f faithful", args.pass_k, sum(out["pass_k_success"]), len(tasks),
                 sum(out["pass_k_nontrivial"]), sum(out["pass_k_faithful"]), out["sample_success"],
                 out["sample_nontrivial"], out["sample_faithful"])
    out["seconds"] = round(time.time() - t0, 1)
    return out


def summarise(ev: dict, args) -> dict:
    s: dict = {"seconds": ev["seconds"]}
    for b in args.budgets:
        xs = ev[f"b{b}"]
        s[f"b{b}"] = {name: bootstrap_ci([float(o in ok) for o in xs]) for name, ok in MEASURES.items()}
        s[f"b{b}"]["grades"] = {c: xs.count(c) for c in SOLVED + CATS[1:] if xs.count(c)}
        s[f"b{b}"]["calls"] = ev[f"b{b}_calls"]
        if f"b{b}_grounding" in ev:
            s[f"b{b}"]["grounding"] = bootstrap_ci([x for x in ev[f"b{b}_grounding"] if x is not None])
    if "pass_k_success" in ev:
        s[f"pass@{args.pass_k}"] = {name: bootstrap_ci([float(x) for x in ev[f"pass_k_{name}"]]) for name in MEASURES}
        s["samples"] = {name: round(ev[f"sample_{name}"], 4) for name in MEASURES}
        s["judge_auc_fd"] = ev.get("judge_auc_fd")
        g = ev["samples"]
        if g.count("faithful") + g.count("unfaithful"):
            s["samples"]["drift"] = round(g.count("unfaithful") / (g.count("faithful") + g.count("unfaithful")), 4)
    if "planbench" in ev:
        xs = ev["planbench"]
        s["planbench"] = {name: bootstrap_ci([float(o in ok) for o in xs]) for name, ok in MEASURES.items()}
        s["planbench"]["grades"] = {c: xs.count(c) for c in SOLVED + CATS[1:] if xs.count(c)}
        for fam in ("blocksworld", "mystery"):
            fx = [o for t, o in zip(ev["planbench_tasks"], xs) if fam in t and (fam != "blocksworld" or "mystery" not in t)]
            s["planbench"][fam] = {name: bootstrap_ci([float(o in ok) for o in fx]) for name, ok in MEASURES.items()}
    for b in args.budgets:
        xs = ev[f"b{b}"]
        solved = xs.count("faithful") + xs.count("unfaithful")
        s[f"b{b}"]["drift"] = round(xs.count("unfaithful") / solved, 4) if solved else None
    return s


def paired(before: dict, after: dict, args) -> dict:
    """after - before per task (0/1 for each measure), with a paired bootstrap interval."""
    out: dict = {}
    for b in args.budgets:
        out[f"b{b}"] = {name: bootstrap_ci([float(a in ok) - float(o in ok) for o, a in zip(before[f"b{b}"], after[f"b{b}"])])
                        for name, ok in MEASURES.items()}
        gb, ga = before.get(f"b{b}_grounding"), after.get(f"b{b}_grounding")
        if gb and ga:
            out[f"b{b}"]["grounding"] = bootstrap_ci([a - o for o, a in zip(gb, ga) if a is not None and o is not None])
    if "planbench" in before and "planbench" in after:
        out["planbench"] = {name: bootstrap_ci([float(a in ok) - float(o in ok) for o, a in
                                                zip(before["planbench"], after["planbench"])]) for name, ok in MEASURES.items()}
    if "pass_k_success" in before and "pass_k_success" in after:  # pass@k on both sides (an --reuse-before run may skip it)
        out[f"pass@{args.pass_k}"] = {name: bootstrap_ci([float(a) - float(o) for o, a in
                                                          zip(before[f"pass_k_{name}"], after[f"pass_k_{name}"])])
                                      for name in MEASURES}
    return out


CURVE_KEYS = ("update", "success_rate", "actor_success_rate", "mean_ladder_actor", "reward_actor",
              "groups_with_signal", "groups_rolled_out", "curriculum_cap", "judge_gate_open", "judge_gate_auc",
              "actor_clip_frac", "actor_kl", "grad_norm", "engine_kl", "rollout_s", "reference_s", "update_s",
              "rollout_tokens_per_s", "top_cluster_share", "clusters_per_task", "top_cluster_changed",
              "probe_faithful", "probe_success", "probe_nontrivial", "probe_drift", "probe_judge_auc_fd")


def train(model, init: dict, tasks, pool, cond: str, args, out: Path):
    """One condition from the initial weights; returns (trainer, seconds, stopped)."""
    import torch

    from omtr.rl.config import train_profile
    from omtr.rl.trainer import Trainer

    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in init:
                p.copy_(init[n])
    cfg = train_profile("small").replace(
        cycles=1, updates_per_cycle=args.updates, reward=cond, max_new_tokens=args.max_new_tokens,
        mlflow=False, save_model_every_cycle=False, seed=args.seed, experiment="omtr-learning",
        **dict(kv for kv in args.set))
    t0 = time.time()
    probe = None
    if args.probe:  # the evaluation side's held-out curve: the probe's tasks are graded, never trained on
        from omtr.evaluation.probe import FaithfulProbe

        probe = FaithfulProbe(args.probe_tasks[:args.probe], max_new_tokens=args.max_new_tokens,
                              batch_size=args.eval_batch)
    tr = Trainer(cfg, tasks, out / cond, model=model, env=pool, quiet=True, probe=probe,
                 probe_every=args.probe_every)
    deadline = t0 + 60 * args.minutes if args.minutes else float("inf")
    status = "paused"
    while status == "paused" and time.time() < deadline:
        status = tr.run(max_updates=1)
        h = tr.history[-1] if tr.history else {}
        log.info("  %s update %d: rollout success %.2f, reward %.2f, groups with signal %s/%s, top cluster %.2f, "
                 "probe faithful %s, %.0f s so far", cond, tr.update, h.get("success_rate", float("nan")),
                 h.get("reward_actor", float("nan")), h.get("groups_with_signal", "-"), h.get("groups_rolled_out", "-"),
                 h.get("top_cluster_share", float("nan")), h.get("probe_faithful", "-"), time.time() - t0)
    return tr, round(time.time() - t0, 1), status == "stopped"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("given", "full"), default="given",
                    help="given: the domain is given, the Actor writes the problem; full: domain and problem")
    ap.add_argument("--families", default="blocksworld,gripper")
    ap.add_argument("--min-objects", type=int, default=2)
    ap.add_argument("--max-objects", type=int, default=5)
    ap.add_argument("--train", type=int, default=48, help="training tasks (split over the families)")
    ap.add_argument("--eval", type=int, default=32, help="held-out tasks (split over the families)")
    ap.add_argument("--minutes", type=float, default=30.0, help="training wall time per condition (0: --updates)")
    ap.add_argument("--updates", type=int, default=200, help="updates per condition at most")
    ap.add_argument("--planbench", type=int, default=8,
                    help="PlanBench tasks per family (BlocksWorld, Mystery BlocksWorld; domain given) graded before and "
                         "after training, never trained on (0: none)")
    ap.add_argument("--planbench-tokens", type=int, default=448, help="token limit of a PlanBench answer")
    ap.add_argument("--probe", type=int, default=8,
                    help="held-out probe tasks graded during training (the first N of a separate held-out draw; 0: none)")
    ap.add_argument("--probe-every", type=int, default=4, help="probe every K updates (and after the last)")
    ap.add_argument("--conditions", default="supported",
                    help="rewards to train with, each from the start ('' : evaluate the untrained model only)")
    ap.add_argument("--budgets", type=lambda v: [int(x) for x in v.split(",")], default=[1, 6],
                    help="greedy evaluation budgets (planner calls per task; default 1,6)")
    ap.add_argument("--pass-k", type=int, default=8, help="samples per task for pass@k (0: skip)")
    ap.add_argument("--max-new-tokens", type=int, default=0, help="token limit of an answer (0: 192 given, 448 full)")
    ap.add_argument("--eval-engine", default="fast",
                    help="engine of the evaluation (fast: what the served model uses on CPU, default; hf: the policy's own "
                         "generate, slower)")
    ap.add_argument("--eval-batch", type=int, default=16)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    type=lambda kv: (kv.split("=", 1)[0], json.loads(kv.split("=", 1)[1])),
                    help="override a field of the small training profile (JSON value), e.g. --set lr=3e-4")
    ap.add_argument("--model-set", action="append", default=[], metavar="KEY=VALUE",
                    type=lambda kv: (kv.split("=", 1)[0], json.loads(kv.split("=", 1)[1])),
                    help="override a field of the small model profile (JSON value), e.g. --model-set "
                         "statement_objects=false (the statement's names not required as objects)")
    ap.add_argument("--reuse-before", metavar="JSON",
                    help="take the untrained model's evaluation from an earlier run's learning.json (same tasks, "
                         "same settings) instead of evaluating it again")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=2000)
    ap.add_argument("--out", default=None, help="output folder (default: a temporary one)")
    ap.add_argument("--results", default=None, help="also copy learning.json and the PNG here, named by mode and date")
    args = ap.parse_args()
    if not args.max_new_tokens:
        args.max_new_tokens = 192 if args.mode == "given" else 448
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("omtr.rl").setLevel(logging.WARNING)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from omtr.config import SolverConfig
    from omtr.model import build_model
    from omtr.solver import SolverPool

    out = Path(args.out or tempfile.mkdtemp(prefix="omtr-learning-"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    train_tasks, test_tasks, test_refs = make_tasks(args, out)
    log.info("%d training and %d held-out tasks (%s mode) in %s", len(train_tasks), len(test_tasks), args.mode, out)
    if args.model_set:
        import dataclasses

        from omtr.config import model_profile

        model = build_model(dataclasses.replace(model_profile("small"), **dict(args.model_set)))
    else:
        model = build_model("small")
    init = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    settings = {k: v for k, v in vars(args).items() if k not in ("set", "model_set", "probe_tasks", "pb_tasks")} | {
        "set": dict(args.set), "model_set": dict(args.model_set), "out": str(out),
        "probe_tasks": [t.id for t in args.probe_tasks]} | {"pb_tasks": [t.id for t in args.pb_tasks]}
    result: dict = {"settings": settings, "conditions": {}}

    def save():
        (out / "learning.json").write_text(json.dumps(result, indent=2) + "\n")

    with SolverPool(1, SolverConfig(time_limit_s=20.0, memory_limit_mb=2048)) as pool:
        if args.reuse_before:  # the same tasks and starting weights were evaluated by an earlier run
            prev = json.loads(Path(args.reuse_before).read_text())["before_outcomes"]
            if prev["tasks"] != [t.id for t in test_tasks]:
                raise SystemExit(f"{args.reuse_before}: its held-out tasks are not these; drop --reuse-before")
            before = prev
            log.info("held-out tasks before training: reused from %s", args.reuse_before)
        else:
            log.info("held-out tasks before training:")
            before = evaluate(model, test_tasks, test_refs, pool, args)
        result["before"] = summarise(before, args)
        result["before_outcomes"] = before
        save()  # kept if the run is cut short
        for cond in [c for c in args.conditions.split(",") if c]:
            log.info("training with the %s reward", cond)
            tr, secs, stopped = train(model, init, train_tasks, pool, cond, args, out)
            tr.save_model()  # OUT/<condition>/model: usable as `omtr infer --model`
            log.info("held-out tasks after %d updates (%s):", tr.update, cond)
            after = evaluate(model, test_tasks, test_refs, pool, args)
            result["conditions"][cond] = {
                "updates": tr.update, "train_seconds": secs, "episodes": tr.episodes_done,
                "planner_calls": tr.planner_calls, "after": summarise(after, args), "gain": paired(before, after, args),
                "outcomes": after, "curve": [{k: h.get(k) for k in CURVE_KEYS if k in h} for h in tr.history]}
            save()
            if stopped:
                break
    result["seconds"] = round(time.time() - t0, 1)
    save()
    plot(result, args, out / "learning_curve.png")
    if args.results:
        dest = Path(args.results)
        dest.mkdir(parents=True, exist_ok=True)
        stem = f"learning-{args.mode}-{datetime.date.today().isoformat()}"
        shutil.copy(out / "learning.json", dest / f"{stem}.json")
        shutil.copy(out / "learning_curve.png", dest / f"{stem}.png")
    print(json.dumps({k: v for k, v in result.items() if k != "before_outcomes"} | {
        "conditions": {c: {k: v for k, v in r.items() if k not in ("outcomes", "curve")}
                       for c, r in result["conditions"].items()}}, indent=2))


def plot(result: dict, args, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(15, 3.8))
    for cond, r in result["conditions"].items():
        xs = [c["update"] for c in r["curve"]]
        ax[0].plot(xs, [c.get("success_rate") for c in r["curve"]], marker="o", label=f"{cond}: rollout success")
        ax[0].plot(xs, [c.get("mean_ladder_actor") for c in r["curve"]], ls="--", label=f"{cond}: Actor ladder")
        ax[0].plot(xs, [c.get("reward_actor") for c in r["curve"]], ls=":", label=f"{cond}: Actor reward")
    ax[0].set_xlabel("update")
    ax[0].set_ylim(0, 1.05)
    ax[0].set_title(f"training rollouts ({args.mode} mode)")
    ax[0].legend(fontsize=7)
    metrics = [(f"b{b}", name) for b in args.budgets for name in MEASURES]
    metrics += [(f"pass@{args.pass_k}", name) for name in MEASURES] if args.pass_k else []
    names = ["before"] + list(result["conditions"])
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        s = result["before"] if name == "before" else result["conditions"][name]["after"]
        vals = [s[m][measure] for m, measure in metrics]
        xs = [j + i * width for j in range(len(metrics))]
        ax[1].bar(xs, [v[0] for v in vals], width, label=name,
                  yerr=[[v[0] - v[1] for v in vals], [v[2] - v[0] for v in vals]], capsize=3)
    ax[1].set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(metrics))])
    ax[1].set_xticklabels([f"{m}\n{measure}" for m, measure in metrics], fontsize=7)
    ax[1].set_ylim(0, 1.05)
    ax[1].set_title(f"held-out success, {len(result['before_outcomes']['tasks'])} tasks (95% CI)")
    ax[1].legend(fontsize=7)
    for cond, r in result["conditions"].items():  # the held-out probe and the collapse guards
        pts = [(c["update"], c["probe_faithful"]) for c in r["curve"] if c.get("probe_faithful") is not None]
        if pts:
            ax[2].plot(*zip(*pts), marker="o", label=f"{cond}: probe faithful (held out)")
        pts = [(c["update"], c["probe_drift"]) for c in r["curve"] if c.get("probe_drift") is not None]
        if pts:
            ax[2].plot(*zip(*pts), marker="x", ls="--", label=f"{cond}: probe drift")
        pts = [(c["update"], c["top_cluster_share"]) for c in r["curve"] if c.get("top_cluster_share") is not None]
        if pts:
            ax[2].plot(*zip(*pts), ls=":", label=f"{cond}: top cluster share")
    ax[2].set_xlabel("update")
    ax[2].set_ylim(0, 1.05)
    ax[2].set_title("held-out probe and collapse guards")
    ax[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    main()
