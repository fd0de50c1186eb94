"""``omtr register``: log a role-model directory as an MLflow pyfunc and register a new version."""

from __future__ import annotations

import logging

from omtr.cli import CliError, add_command

log = logging.getLogger("omtr.register")

EXAMPLES = """  omtr register --model-dir runs/demo/model --metrics eval/model/metrics.json
  omtr register --model-dir runs/demo/model --metrics eval/model/metrics.json --train-run RUN_ID \\
      --eval-run RUN_ID --promote                          # then apply the promotion rule
  omtr register --model-dir runs/micro/model --name my-model --max-tasks 4 --json version.json
  omtr register --model-dir runs/demo/model --metrics eval/model/metrics.json \\
      --baseline-run RUN_ID                                # the untrained model's evaluation run
  omtr register --model-dir runs/demo/model --metrics eval/model/metrics.json \\
      --baseline-metrics eval/untrained/metrics.json       # or its metrics.json
  omtr register --model-dir runs/demo/model --metrics m.json --traces eval/model/traces.jsonl \\
      --baseline-metrics b.json --baseline-traces eval/untrained/traces.jsonl   # records kept elsewhere

The new version gets the alias `challenger`, the evaluation's metrics as tags (metric.faithful,
metric.success, metric.calls, intervals) and links to its training and evaluation runs. With a
baseline (the model training started from, evaluated on the same validation tasks with the same
budget, token limit and seed) it also gets baseline.* tags with the same names, and `omtr promote`
refuses it unless its faithful success is above baseline.faithful (rule point) or the paired
interval below is above 0 (rule ci); without one it is registered without baseline tags and
promotion compares it with the champion only.
The paired difference: both evaluations' per-task records (traces.jsonl, found beside each
metrics.json or in the --eval-run/--baseline-run artifacts, or named by --traces/--baseline-traces)
are paired by task id; the per-task faithful grade (1: solved and no drift from the reference)
gives the mean difference trained - untrained and its 95% paired bootstrap interval (seeded), as
the tags baseline.faithful_diff, baseline.faithful_diff_low/_high and baseline.paired_tasks.
Without the records the difference is unknown: rule point still applies, rule ci refuses.
Serve it: mlflow models serve -m models:/omtr-role-model@champion --env-manager local
Registry: $MLFLOW_TRACKING_URI, else ./mlruns.db.
"""


def register(sub) -> None:
    p = add_command(
        sub, "register",
        help="register a trained role model (MLflow pyfunc) with its evaluation metrics",
        description=("Log a model directory (its files, not a pickled object) as an MLflow pyfunc whose "
                     "predict runs the Actor -> planner -> Editor loop on natural-language tasks, register "
                     "it as a new version, tag it with its evaluation metrics and runs, alias it challenger."),
        examples=EXAMPLES,
    )
    p.add_argument("--model-dir", required=True, metavar="DIR", help="a role-model directory (omtr train's RUN_DIR/model)")
    p.add_argument("--name", default="omtr-role-model", help="registered model name (default omtr-role-model)")
    p.add_argument("--metrics", metavar="metrics.json", help="omtr evaluate's metrics.json for this model")
    p.add_argument("--train-run", metavar="RUN_ID", help="the MLflow run that trained it")
    p.add_argument("--eval-run", metavar="RUN_ID", help="the MLflow run that evaluated it")
    p.add_argument("--baseline-run", metavar="RUN_ID",
                   help="the MLflow run that evaluated the untrained model (the one training started from) on "
                        "the same validation tasks: its metrics.json becomes baseline.* tags")
    p.add_argument("--baseline-metrics", metavar="metrics.json",
                   help="the untrained model's metrics.json (instead of reading it from --baseline-run)")
    p.add_argument("--traces", metavar="traces.jsonl",
                   help="this model's per-task evaluation records (default: traces.jsonl beside --metrics, else the "
                        "--eval-run's artifact)")
    p.add_argument("--baseline-traces", metavar="traces.jsonl",
                   help="the untrained model's per-task records (default: traces.jsonl beside --baseline-metrics, "
                        "else the --baseline-run's artifact)")
    p.add_argument("--bootstrap", type=int, default=10000, metavar="B",
                   help="resamples of the paired interval (default 10000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the paired bootstrap (default 0)")
    p.add_argument("--promote", action="store_true", help="apply the promotion rule after registering")
    p.add_argument("--rule", default="point", choices=("point", "ci"), help="promotion rule (with --promote)")
    p.add_argument("--max-tasks", type=int, default=8, metavar="N", help="tasks per serving request (default 8)")
    p.add_argument("--max-task-chars", type=int, default=4000, metavar="N", help="characters per task (default 4000)")
    p.add_argument("--budget", type=int, default=6, metavar="K", help="planner calls per served task (default 6)")
    p.add_argument("--max-new-tokens", type=int, default=None, metavar="N", help="token limit per served answer")
    p.add_argument("--time-limit", type=float, default=20.0, metavar="S", help="planner CPU limit when serving (default 20)")
    p.add_argument("--json", metavar="FILE", help="also write {name, version, run_id, model_uri[, promotion]} here")
    p.set_defaults(handler=run)


def run(args) -> int:
    import json
    from pathlib import Path

    if not (Path(args.model_dir) / "omtr-model.json").is_file():
        raise CliError(f"--model-dir {args.model_dir}: not an omtr model directory (no omtr-model.json)")
    def read_json(flag: str, path: str):
        try:
            return json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise CliError(f"--{flag} {path}: cannot read ({exc})") from None

    metrics = read_json("metrics", args.metrics) if args.metrics else None
    for flag in ("train_run", "eval_run", "baseline_run", "baseline_metrics", "traces", "baseline_traces"):  # `none` (MLproject's default): absent
        if (getattr(args, flag) or "").strip("'\"").lower() in ("", "none"):
            setattr(args, flag, None)
    from omtr.tracking.pyfunc import ServingLimits
    from omtr.tracking.registry import (
        PromotionError, baseline_from_run, decision_line, paired_text, promote, read_records, records_from_run,
        register)

    baseline = None
    if args.baseline_metrics:
        baseline = read_json("baseline-metrics", args.baseline_metrics)
    elif args.baseline_run:
        try:
            baseline = baseline_from_run(args.baseline_run)
        except PromotionError as exc:
            raise CliError(f"--baseline-run: {exc}") from None

    def records(flag: str, explicit: str | None, metrics_path: str | None, run_id: str | None, what: str):
        """Per-task records: the named file, else traces.jsonl beside the metrics file, else the run's."""
        try:
            if explicit:
                return read_records(explicit)
            if metrics_path and (Path(metrics_path).parent / "traces.jsonl").is_file():
                return read_records(Path(metrics_path).parent / "traces.jsonl")
        except PromotionError as exc:
            raise CliError(f"--{flag}: {exc}") from None
        if run_id:
            try:
                return records_from_run(run_id, what=what)
            except PromotionError as exc:  # a default, not asked for: the difference stays unknown
                log.warning("%s; the paired faithful difference stays unknown", exc)
        return None

    recs = base_recs = None
    if baseline is not None:
        recs = records("traces", args.traces, args.metrics, args.eval_run, "evaluation run")
        base_recs = records("baseline-traces", args.baseline_traces, args.baseline_metrics, args.baseline_run,
                            "baseline run")
    if args.bootstrap < 1:
        raise CliError(f"--bootstrap must be at least 1, got {args.bootstrap}")
    try:
        limits = ServingLimits(max_tasks=args.max_tasks, max_task_chars=args.max_task_chars, budget=args.budget,
                               max_new_tokens=args.max_new_tokens, time_limit_s=args.time_limit)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    try:
        out = register(args.model_dir, name=args.name, metrics=metrics, train_run_id=args.train_run,
                       eval_run_id=args.eval_run, limits=limits, baseline=baseline, baseline_run_id=args.baseline_run,
                       records=recs, baseline_records=base_recs, bootstrap=args.bootstrap, seed=args.seed)
    except PromotionError as exc:
        raise CliError(str(exc)) from None
    print(f"registered {out['name']} version {out['version']} (alias challenger) from run {out['run_id']}")
    if out["baseline"]:
        b = out["baseline"]
        print(f"baseline (the untrained model): faithful {b.get('faithful')}, success {b.get('success')}, "
              f"calls {b.get('calls')} as baseline.* tags")
        if out["paired"]:
            from omtr.tracking.registry import Paired

            print(f"faithful success {out['paired']['trained']} (trained) vs {out['paired']['untrained']} "
                  f"(untrained): {paired_text(Paired(**out['paired']))} as baseline.faithful_diff* tags")
        else:
            missing = " and ".join(w for w, r in (("the trained model", recs), ("the untrained model", base_recs))
                                   if r is None)
            print(f"paired difference unknown: no per-task records (traces.jsonl) of {missing}; pass --traces and "
                  "--baseline-traces to get it (rule point still applies, rule ci will refuse the version)")
    else:
        print("no baseline given (--baseline-run/--baseline-metrics): registered without baseline.* tags; "
              "promotion will not compare it with the model training started from")
    if args.promote:
        try:
            d = promote(args.name, out["version"], rule=args.rule)
        except PromotionError as exc:
            raise CliError(str(exc)) from None
        out["promotion"] = d.to_dict()
        print(decision_line(d, args.name))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0
