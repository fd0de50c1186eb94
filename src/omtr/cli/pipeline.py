"""``omtr pipeline``: the main job (prepare -> train -> evaluate -> validate -> register -> promote)."""

from __future__ import annotations

from omtr.cli import CliError, add_command

EXAMPLES = """  omtr pipeline                                   # small profile (SmolLM2, CPU): minutes on 2 cores
  omtr pipeline --profile micro                   # the tiny random model: the plumbing in a few minutes
  omtr pipeline --profile paper --model paper     # the paper's settings on GPUs
  omtr pipeline --rule ci                         # promote only when better beyond the 95% interval
  mlflow run . -e main --env-manager local        # the same, as the MLflow project's main entry point

Every step is an `omtr` subcommand in a nested MLflow run under one parent run; steps hand their
outputs over as run artifacts. A step whose inputs are identical to a finished one is skipped;
a killed training step continues from its checkpoint (WORK/train-KEY) when run again.
Tracking and registry: $MLFLOW_TRACKING_URI, else ./mlruns.db. Then:
  mlflow ui --backend-store-uri sqlite:///mlruns.db --workers 1
  MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT=600 mlflow models serve -m models:/omtr-role-model@champion --env-manager local --port 5001
"""


def register(sub) -> None:
    p = add_command(
        sub, "pipeline",
        help="the main job: tasks, training, evaluation, validation, registration, promotion",
        description=("Run the whole pipeline as nested MLflow runs, each step one omtr subcommand, with "
                     "content-keyed skipping of finished steps and resumable training."),
        examples=EXAMPLES,
    )
    p.add_argument("--profile", default="small", choices=("small", "micro", "paper"), help="training profile (default small)")
    p.add_argument("--model", default="profile", metavar="DIR|PROFILE",
                   help="model to start from (default `profile`: the training profile's own model)")
    p.add_argument("--family", default="blocksworld", help="task family (default blocksworld)")
    p.add_argument("--n-train", type=int, default=8, help="training tasks (default 8; paper 1000)")
    p.add_argument("--n-val", type=int, default=4, help="validation tasks (default 4; paper 100)")
    p.add_argument("--min-objects", type=int, default=2)
    p.add_argument("--max-objects", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", dest="train_set", action="append", default=[], metavar="KEY=VALUE",
                   help="an `omtr train --set` (repeatable)")
    p.add_argument("--eval-budget", type=int, default=2, metavar="K", help="planner calls per validation task (default 2)")
    p.add_argument("--max-new-tokens", type=int, default=200, metavar="N",
                   help="token limit per answer in evaluation and serving (default 200)")
    p.add_argument("--bootstrap", type=int, default=1000, metavar="B")
    p.add_argument("--name", default="omtr-role-model", help="registered model name")
    p.add_argument("--rule", default="point", choices=("point", "ci"), help="promotion rule (default point)")
    p.add_argument("--serve-budget", type=int, default=6, metavar="K", help="planner calls per served task (default 6)")
    p.add_argument("--steps", default=",".join(("prepare", "train", "evaluate", "validate", "register", "promote")),
                   help="comma-separated steps to run, in pipeline order (default: all)")
    p.add_argument("--work", default=".omtr/pipeline", metavar="DIR", help="working folder (default .omtr/pipeline)")
    p.add_argument("--experiment", default="omtr-main", help="MLflow experiment (default omtr-main)")
    p.set_defaults(handler=run)


def run(args) -> int:
    import json

    from omtr.tracking.pipeline import STEPS, Pipeline, PipelineConfig, StepFailed, for_profile

    steps = tuple(s.strip() for s in args.steps.split(",") if s.strip())
    bad = [s for s in steps if s not in STEPS]
    if bad:
        raise CliError(f"unknown step(s) {bad}; choose from {', '.join(STEPS)}")
    try:
        cfg = for_profile(PipelineConfig(
            profile=args.profile, model="" if args.model.strip("'\"") in ("", "profile") else args.model, family=args.family, n_train=args.n_train, n_val=args.n_val,
            min_objects=args.min_objects, max_objects=args.max_objects, seed=args.seed,
            train_set=tuple(args.train_set), eval_budget=args.eval_budget, eval_max_new_tokens=args.max_new_tokens,
            bootstrap=args.bootstrap, name=args.name, rule=args.rule, serve_budget=args.serve_budget))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    try:
        summary = Pipeline(cfg, args.work, experiment=args.experiment, quiet=args.quiet, steps=steps).run()
    except StepFailed as exc:
        print(f"omtr pipeline: {exc}\nfinished steps are kept: run the same command again to continue")
        return 1
    print(json.dumps(summary, indent=2))
    ev, prom = summary.get("evaluate"), summary.get("promote")
    if ev:
        print(f"validation: success {ev.get('success')}, faithful {ev.get('faithful')}, calls {ev.get('calls')}")
    if prom:
        print(f"{cfg.name} version {prom.get('version')}: "
              + ("champion" if prom.get("promoted") else "challenger") + f" ({prom.get('reason')})")
    return 0
