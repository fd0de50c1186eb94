"""Does RL from planner feedback move SmolLM2 up the diagnostic ladder? Shaped vs binary reward.

    python benchmarks/learning.py                                  # the default (about an hour on 2 cores)
    python benchmarks/learning.py --updates 2 --episodes 4 --eval 8 --max-new-tokens 160   # a short run

Small generated tasks (BlocksWorld, 2-3 blocks): a train split for RL, a disjoint held-out test
split for evaluation. The held-out tasks are evaluated once before training (the shared starting
point) and after each condition's training, with one greedy Actor answer per task checked by the
real planner (Fast Downward + VAL). For every condition (``shaped``, ``binary``) the model starts
from the same initial weights and trains ``--updates`` updates of ``--episodes`` episodes through
``omtr.rl.trainer.Trainer`` (the same code as ``omtr train``).

Reported (JSON on stdout, and ``OUT/learning.json`` + ``OUT/learning_curve.png``): per condition,
the held-out success rate, mean ladder score (syntax 0 ... success 1) and category shares before
and after, with 95% bootstrap confidence intervals over tasks (and a paired bootstrap CI of the
after - before difference), plus the training curve (per-update mean ladder score and reward).
References are used only to generate the tasks; training reads the train split through
``omtr.tasks.training`` and never sees them.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import tempfile
import time
from pathlib import Path

CATS = ("success", "syntax", "object_type", "predicate_schema", "precondition_effect", "goal_constraint",
        "unreachable_search")


def bootstrap_ci(xs: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Mean and a 95% percentile-bootstrap interval."""
    if not xs:
        return (float("nan"),) * 3
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(xs) for _ in xs) / len(xs) for _ in range(n))
    return sum(xs) / len(xs), means[int(0.025 * n)], means[int(0.975 * n) - 1]


def evaluate(model, tasks, pool, max_new_tokens: int) -> list[str]:
    """One greedy Actor answer per task; returns each answer's outcome (success or a category)."""
    from omtr.inference.episode import run_episodes
    from omtr.inference.policy import Sampling
    from omtr.rl.rewards import outcome

    model.eval()
    eps = run_episodes(tasks, model, pool, budget=1, judge=False,
                       sampling=Sampling(greedy=True, max_new_tokens=max_new_tokens))
    return [outcome(e.steps[0].verdict) for e in eps]


def summary(outcomes: list[str]) -> dict:
    from omtr.rl.rewards import LADDER

    ladder = [LADDER.get(o, 0.0) for o in outcomes]
    out = {"n": len(outcomes), "success": bootstrap_ci([float(o == "success") for o in outcomes]),
           "ladder": bootstrap_ci(ladder), "categories": {c: outcomes.count(c) for c in CATS if outcomes.count(c)}}
    return out


def paired_diff(before: list[str], after: list[str]) -> tuple[float, float, float]:
    from omtr.rl.rewards import LADDER

    d = [LADDER.get(a, 0.0) - LADDER.get(b, 0.0) for a, b in zip(after, before)]
    return bootstrap_ci(d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="blocksworld")
    ap.add_argument("--min-objects", type=int, default=2)
    ap.add_argument("--max-objects", type=int, default=3)
    ap.add_argument("--eval-max-objects", type=int, default=4,
                    help="largest held-out size (the test split of tiny sizes holds few distinct instances)")
    ap.add_argument("--train", type=int, default=16, help="training tasks")
    ap.add_argument("--eval", type=int, default=24, help="held-out tasks")
    ap.add_argument("--updates", type=int, default=12, help="updates per condition")
    ap.add_argument("--episodes", type=int, default=8, help="episodes per update")
    ap.add_argument("--samples", type=int, default=1, help="samples per task (>1 with --advantage group)")
    ap.add_argument("--advantage", default="gae")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-4, help="Adam lr (LoRA on a short run; the paper's 3e-5 is for long runs)")
    ap.add_argument("--editor", action="store_true", help="also train the Editor (one repair per episode)")
    ap.add_argument("--conditions", default="shaped,binary")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="output folder (default: a temporary one)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from omtr.config import SolverConfig
    from omtr.model import build_model
    from omtr.rl.config import train_profile
    from omtr.rl.trainer import Trainer
    from omtr.solver import SolverPool
    from omtr.tasks.generators import generate
    from omtr.tasks.records import write_tasks
    from omtr.tasks.training import load_training_tasks

    out = Path(args.out or tempfile.mkdtemp(prefix="omtr-learning-"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    kw = dict(min_objects=args.min_objects, max_objects=args.max_objects, verify=False)
    train_file, test_file = out / "train.jsonl", out / "test.jsonl"
    write_tasks(train_file, generate(args.family, args.train, args.seed, split="train", **kw))
    write_tasks(test_file, generate(args.family, args.eval, args.seed + 1, split="test",
                                    **(kw | {"max_objects": args.eval_max_objects})))
    train_tasks, test_tasks = load_training_tasks(train_file), load_training_tasks(test_file)

    model = build_model("small")
    init = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    result: dict = {"settings": vars(args) | {"out": str(out)}, "conditions": {}}
    scfg = SolverConfig(time_limit_s=20.0, memory_limit_mb=2048)
    with SolverPool(1, scfg) as pool:
        te = time.time()
        before = evaluate(model, test_tasks, pool, args.max_new_tokens)
        result["before"] = summary(before) | {"seconds": round(time.time() - te, 1)}
        logging.info("held-out before: %s", result["before"])
        (out / "learning.json").write_text(json.dumps(result, indent=2) + "\n")  # kept if the run is cut short
        for cond in args.conditions.split(","):
            with torch.no_grad():
                for n, p in model.named_parameters():
                    if n in init:
                        p.copy_(init[n])
            cfg = train_profile("small").replace(
                cycles=1, updates_per_cycle=args.updates, episodes_per_batch=args.episodes,
                samples_per_task=args.samples, advantage=args.advantage, reward=cond, lr=args.lr,
                max_new_tokens=args.max_new_tokens, use_editor=args.editor, max_repairs=1,
                mlflow=False, save_model_every_cycle=False, seed=args.seed, experiment="omtr-learning")
            tc = time.time()
            tr = Trainer(cfg, train_tasks, out / cond, model=model, env=pool, quiet=True)
            if tr.run() == "stopped":  # SIGTERM: the checkpoint is written; stop here
                break
            train_s = time.time() - tc
            after = evaluate(model, test_tasks, pool, args.max_new_tokens)
            result["conditions"][cond] = {
                "after": summary(after), "ladder_gain": paired_diff(before, after),
                "train_seconds": round(train_s, 1),
                "curve": [{k: h.get(k) for k in ("update", "mean_ladder_actor", "actor_success_rate", "reward_actor",
                                                  "rollout_tokens_per_s", "update_tokens_per_s", "rollout_s",
                                                  "reference_s", "update_s")} for h in tr.history],
            }
            logging.info("%s: %s", cond, result["conditions"][cond]["after"])
            (out / "learning.json").write_text(json.dumps(result, indent=2) + "\n")
    result["seconds"] = round(time.time() - t0, 1)
    (out / "learning.json").write_text(json.dumps(result, indent=2) + "\n")
    _plot(result, out / "learning_curve.png")
    print(json.dumps(result, indent=2))


def _plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(9, 3.4))
    for cond, r in result["conditions"].items():
        xs = [c["update"] for c in r["curve"]]
        ax[0].plot(xs, [c["mean_ladder_actor"] for c in r["curve"]], marker="o", label=f"{cond}: ladder (train)")
        ax[0].plot(xs, [c["actor_success_rate"] for c in r["curve"]], ls="--", label=f"{cond}: success (train)")
    ax[0].set_xlabel("update")
    ax[0].set_title("training rollouts")
    ax[0].legend(fontsize=7)
    names = ["before"] + list(result["conditions"])
    vals = [result["before"]["ladder"]] + [r["after"]["ladder"] for r in result["conditions"].values()]
    ax[1].bar(names, [v[0] for v in vals], yerr=[[v[0] - v[1] for v in vals], [v[2] - v[0] for v in vals]], capsize=4)
    ax[1].set_title("held-out mean ladder score (95% CI)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    main()
