"""``omtr demo``: the environment on bundled and PlanBench specs, tracked in MLflow.

Today's main job (the full training pipeline replaces it as later steps land): it proves the
planner, VAL, lint, worker pool and cache work on this machine, and records the figures in MLflow.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter

from omtr.cli import CliError, add_command

EXAMPLES = """  omtr demo                                        # SQLite MLflow store ./mlruns.db
  omtr demo --n 60 --workers 2 --out out/demo
  omtr demo --tracking-uri http://mlflow:5000 --experiment omtr-env
  mlflow run . -e main --env-manager local             # the same through MLproject
"""

FAMILIES = ("blocksworld", "mystery_blocksworld", "logistics")  # PlanBench families in the demo


def register(sub) -> None:
    p = add_command(
        sub, "demo",
        help="run the environment on bundled + PlanBench specs and log to MLflow",
        description="Solve hand-written valid/malformed specs and a PlanBench sample; log metrics, "
                    "verdicts and a chart to MLflow.",
        examples=EXAMPLES,
    )
    p.add_argument("--n", type=int, default=30, help="PlanBench instances per family (default 30)")
    p.add_argument("--workers", type=int, default=2, help="solver worker processes (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the PlanBench sample")
    p.add_argument("--time-limit", type=float, default=20.0, help="planner CPU limit per call (default 20 s)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default $MLFLOW_TRACKING_URI or sqlite:///mlruns.db)")
    p.add_argument("--experiment", default="omtr-environment", help="MLflow experiment name")
    p.add_argument("--out", default="out/demo", help="folder for verdicts.jsonl and the chart")
    p.set_defaults(handler=run)


def collect_specs(n: int, seed: int):
    """[(id, source, expected_category, domain, problem)] from the bundled examples and PlanBench."""
    from omtr.paths import benchmarks_dir, planbench_family
    from omtr.solver.examples import ALL

    specs = [(e.name, "handwritten", e.category, e.domain, e.problem) for e in ALL]
    root = benchmarks_dir()
    if root is None:
        return specs, False
    rng = random.Random(seed)
    for fam in FAMILIES:
        domain, files = planbench_family(fam, root)
        for path in sorted(rng.sample(files, min(n, len(files)))):
            specs.append((f"{fam}/{path.stem}", fam, None, domain, path.read_text()))
    return specs, True


def run(args) -> int:
    if args.n < 0 or args.workers < 1:
        raise CliError("--n must be >= 0 and --workers >= 1")
    from omtr.config import SolverConfig
    from omtr.progress import Progress
    from omtr.solver import SolverPool

    cfg = SolverConfig(time_limit_s=args.time_limit)
    specs, have_planbench = collect_specs(args.n, args.seed)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    verdicts = []
    with SolverPool(args.workers, cfg) as pool:
        bar = Progress(len(specs), "demo", quiet=args.quiet)
        for i in range(0, len(specs), 16):
            part = specs[i:i + 16]
            verdicts += pool.solve_many([(d, p) for *_, d, p in part])
            bar.update(len(part))
        bar.close()
        cold_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        again = pool.solve_many([(d, p) for *_, d, p in specs])
        warm_s = time.perf_counter() - t1
    assert all(v.success == w.success for v, w in zip(verdicts, again))

    rows, by_source, cats = [], Counter(), Counter()
    solved, expected_ok, handwritten = Counter(), 0, 0
    for (sid, source, expected, *_), v in zip(specs, verdicts):
        rows.append({"id": sid, "source": source, "expected_category": expected, **v.to_json()})
        by_source[source] += 1
        solved[source] += v.success
        if v.category:
            cats[v.category.value] += 1
        if source == "handwritten":
            handwritten += 1
            expected_ok += (v.category.value if v.category else None) == expected
    metrics = {
        "specs": len(specs),
        "calls_per_s_cold": len(specs) / cold_s,
        "calls_per_s_warm_cache": len(specs) / max(warm_s, 1e-9),
        "handwritten_category_accuracy": expected_ok / max(handwritten, 1),
        "mean_total_ms": sum(v.timings.get("total_ms", 0) for v in verdicts) / len(verdicts),
    }
    for source, count in by_source.items():
        if source != "handwritten":
            metrics[f"success_rate_{source}"] = solved[source] / count
    for cat, count in cats.items():
        metrics[f"category_{cat}"] = count

    verdict_path = os.path.join(args.out, "verdicts.jsonl")
    with open(verdict_path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    chart = _chart(cats, solved, by_source, os.path.join(args.out, "categories.png"))

    import mlflow

    from omtr.tracking import start_run

    with start_run(args.experiment, "environment-demo", args.tracking_uri) as run:
        mlflow.log_params({"search": cfg.search, "time_limit_s": cfg.time_limit_s,
                           "memory_limit_mb": cfg.memory_limit_mb, "workers": args.workers,
                           "planbench_per_family": args.n if have_planbench else 0, "seed": args.seed})
        mlflow.log_metrics(metrics)
        mlflow.log_artifact(verdict_path)
        if chart:
            mlflow.log_artifact(chart)
    print(f"{'source':<22}{'specs':>6}{'solved':>8}")
    for source, count in by_source.items():
        print(f"{source:<22}{count:>6}{solved[source]:>8}")
    print(f"hand-written specs with the expected category: {expected_ok}/{handwritten}")
    print(f"throughput: {metrics['calls_per_s_cold']:.1f} specs/s cold, "
          f"{metrics['calls_per_s_warm_cache']:.0f} specs/s from the cache")
    if not have_planbench:
        print("PlanBench data not found (set OMTR_BENCHMARKS): ran the bundled specs only")
    print(f"MLflow run {run.info.run_id} (experiment id {run.info.experiment_id}); verdicts in {verdict_path}")
    return 0


def _chart(cats: Counter, solved: Counter, by_source: Counter, path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    names = sorted(cats)
    a.barh(names, [cats[n] for n in names], color="#c0504d")
    a.set_title("diagnostic categories of failed specs")
    srcs = [s for s in by_source if s != "handwritten"]
    b.bar(srcs, [solved[s] / by_source[s] for s in srcs], color="#4f81bd")
    b.set_ylim(0, 1.05)
    b.set_title("planner success (VAL-valid) per PlanBench family")
    b.tick_params(axis="x", labelrotation=15)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
