"""``omtr pipeline``: the main job (prepare -> train -> evaluate -> evaluate-baseline -> validate ->
register -> promote),
and ``omtr pipeline compile|submit`` for the Kubeflow pipeline (``pipelines/omtr_pipeline.py``)."""

from __future__ import annotations

from omtr.cli import CliError, add_command

EXAMPLES = """  omtr pipeline                                   # small profile (SmolLM2, CPU): minutes on 2 cores
  omtr pipeline --profile micro                   # the tiny random model: the plumbing in a few minutes
  omtr pipeline --mode full                       # SmolLM2 writes domain and problem (small's default: given)
  omtr pipeline --profile paper --model paper     # the paper's settings on GPUs
  omtr pipeline --rule ci                         # promote only when better beyond the 95% interval
  mlflow run . -e main --env-manager local        # the same, as the MLflow project's main entry point

Kubeflow Pipelines (the same steps as pods, plus deploy; see `omtr pipeline submit --help`):
  omtr pipeline compile --out pipelines/omtr_pipeline.yaml          # the YAML to upload in the Kubeflow UI
  omtr pipeline submit --host https://kubeflow.example.org/pipeline --token-env KF_TOKEN \\
      --param profile=small --param n_train=40 --experiment omtr --wait

Every step is an `omtr` subcommand in a nested MLflow run under one parent run; steps hand their
outputs over as run artifacts. A step whose inputs are identical to a finished one is skipped;
a killed training step continues from its checkpoint (WORK/train-KEY) when run again.
evaluate-baseline evaluates the untrained model (where training starts) on the same validation
tasks (24 by default); the version is registered with its metrics as baseline.* tags and the paired
per-task faithful difference with its 95% interval, and promoted only if its faithful success is
above the untrained model's (--rule point) or the paired interval lies above 0 (--rule ci); planner
success never decides. Leave evaluate-baseline out of --steps to register without a baseline.
Tracking and registry: $MLFLOW_TRACKING_URI, else ./mlruns.db (under `mlflow run`: MLflow's default,
./mlflow.db). Then:
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
    p.add_argument("--family", default="mix",
                   help="task family: mix (default: every generator family, the tasks split evenly), one family, "
                        "or several comma-separated (blocksworld,gripper)")
    p.add_argument("--mode", default="profile", choices=("profile", "given", "full"),
                   help="task mode: given (the family's domain is given, the model writes the problem), full "
                        "(domain and problem); default: the profile's (small: given; micro, paper: full)")
    p.add_argument("--n-train", type=int, default=8, help="training tasks (default 8; paper 1000)")
    p.add_argument("--n-val", type=int, default=24,
                   help="validation tasks, for both the trained and the untrained model (default 24; micro 2; paper 100)")
    p.add_argument("--min-objects", type=int, default=2)
    p.add_argument("--max-objects", type=int, default=4)
    p.add_argument("--val-max-objects", type=int, default=5, metavar="N",
                   help="the validation tasks' largest size (default 5: BlocksWorld's validation split has only 23 "
                        "tasks of 2-4 blocks; 0: --max-objects; micro and paper: 0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", dest="train_set", action="append", default=[], metavar="KEY=VALUE",
                   help="an `omtr train --set` (repeatable)")
    p.add_argument("--eval-budget", type=int, default=2, metavar="K", help="planner calls per validation task (default 2)")
    p.add_argument("--max-new-tokens", type=int, default=448, metavar="N",
                   help="token limit per answer in evaluation and serving (default 448)")
    p.add_argument("--bootstrap", type=int, default=1000, metavar="B")
    p.add_argument("--name", default="omtr-role-model", help="registered model name")
    p.add_argument("--rule", default="point", choices=("point", "ci"), help="promotion rule (default point)")
    p.add_argument("--serve-budget", type=int, default=6, metavar="K", help="planner calls per served task (default 6)")
    p.add_argument("--steps", default=",".join(("prepare", "train", "evaluate", "evaluate-baseline", "validate",
                                                "register", "promote")),
                   help="comma-separated steps to run, in pipeline order (default: all; without evaluate-baseline "
                        "the version is registered without baseline.* tags and promoted by the rule alone)")
    p.add_argument("--work", default=".omtr/pipeline", metavar="DIR", help="working folder (default .omtr/pipeline)")
    p.add_argument("--experiment", default="omtr-main", help="MLflow experiment (default omtr-main)")
    p.set_defaults(handler=run)
    actions = p.add_subparsers(dest="action", metavar="{compile,submit}",
                               title="Kubeflow (without one of these, the main job above runs)")
    c = add_command(actions, "compile", help="compile the Kubeflow pipeline to a YAML package",
                    description="Compile pipelines/omtr_pipeline.py (components in components/) to a pipeline "
                                "package for the Kubeflow UI's upload or `omtr pipeline submit --package`.",
                    examples=COMPILE_EXAMPLES)
    c.add_argument("--out", required=True, metavar="FILE.yaml", help="where the compiled pipeline goes")
    c.add_argument("--source", metavar="FILE.py", help="the pipeline source (default: pipelines/omtr_pipeline.py of the checkout)")
    c.add_argument("--image", metavar="REGISTRY/omtr@sha256:DIGEST",
                   help="the omtr image the steps run on, best by digest (kfp's cache follows the image string); "
                        "default: the project's; a tag's trainer image follows as omtr-trainer-gpu:TAG")
    c.add_argument("--trainer-image", metavar="REGISTRY/omtr-trainer-gpu@sha256:DIGEST",
                   help="the train-job branch's trainer image (default: derived from a tagged --image)")
    c.set_defaults(handler=run_compile)
    s = add_command(actions, "submit", help="compile the Kubeflow pipeline and start a run at a Kubeflow endpoint",
                    description="Compile the pipeline (or take --package), then create a run of it in an "
                                "experiment at the Kubeflow Pipelines API given by --host, with a bearer token.",
                    examples=SUBMIT_EXAMPLES)
    s.add_argument("--host", required=True, metavar="URL", help="the Kubeflow Pipelines API, e.g. https://HOST/pipeline")
    tok = s.add_mutually_exclusive_group()
    tok.add_argument("--token-env", metavar="NAME", help="environment variable that holds the bearer token")
    tok.add_argument("--token-file", metavar="PATH", help="file that holds the bearer token")
    s.add_argument("--experiment", default="omtr", help="Kubeflow experiment (created if missing; default omtr)")
    s.add_argument("--run-name", help="run name (default: pipeline name and time)")
    s.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="a run parameter (repeatable); typed by the pipeline's declaration")
    s.add_argument("--package", metavar="FILE.yaml", help="submit this compiled package instead of compiling")
    s.add_argument("--source", metavar="FILE.py", help="the pipeline source to compile (default: the checkout's)")
    s.add_argument("--image", metavar="REGISTRY/omtr@sha256:DIGEST", help="the omtr image the steps run on (as for compile)")
    s.add_argument("--trainer-image", metavar="IMAGE", help="the trainer image (as for compile)")
    s.add_argument("--namespace", help="Kubeflow profile namespace (multi-user installs)")
    s.add_argument("--service-account", help="Kubernetes ServiceAccount the run's pods use (e.g. omtr-deployer)")
    s.add_argument("--wait", action="store_true", help="wait for the run to finish; exit 1 unless it succeeded")
    s.add_argument("--timeout", type=float, default=24 * 3600, metavar="S", help="with --wait: seconds (default 86400)")
    s.set_defaults(handler=run_submit)


COMPILE_EXAMPLES = """  omtr pipeline compile --out pipelines/omtr_pipeline.yaml     # refresh the committed package
  omtr pipeline compile --out /tmp/omtr.yaml                   # then upload it: Kubeflow UI > Pipelines > Upload pipeline
  omtr pipeline compile --out /tmp/omtr.yaml --image registry.example.com/omtr/omtr:0.1.0   # your registry
  omtr pipeline compile --out /tmp/omtr.yaml --image registry.example.com/omtr/omtr@sha256:DIGEST \
      --trainer-image registry.example.com/omtr/omtr-trainer-gpu@sha256:DIGEST   # pinned: kfp's cache follows it
"""

SUBMIT_EXAMPLES = """  export KF_TOKEN=$(kubectl -n kubeflow create token default-editor)   # or your identity provider's token
  omtr pipeline submit --host https://kubeflow.example.org/pipeline --token-env KF_TOKEN
  omtr pipeline submit --host http://127.0.0.1:8080 --param profile=micro --param n_train=4 --wait
  omtr pipeline submit --host URL --token-file /var/run/secrets/kf/token --param train_on=train-job \\
      --param profile=paper --param train_nodes=2 --param gpus_per_node=8 --service-account omtr-deployer
  omtr pipeline submit --host URL --param train_on=train-job --param train_job_kind=trainjob \\
      --param profile=paper --param train_nodes=2           # the same, as a Kubeflow Trainer v2 TrainJob
  omtr pipeline submit --host URL --package pipelines/omtr_pipeline.yaml --param deploy_mode=dry-run

Run parameters (--param KEY=VALUE): profile, model, mode (profile | given | full: the task mode;
profile, the default, takes the profile's own), train_on (cpu | gpu | train-job),
train_job_kind (pytorchjob | trainjob: the train-job branch's Kubeflow API), train_set
(a JSON list or comma-separated KEY=VALUE for omtr train --set), family, n_train, n_val,
eval_budget, max_new_tokens, solver_url, mlflow_tracking_uri, registry_name, promotion_rule
(point | ci), serving_namespace, serving_deployment, deploy_mode (apply | dry-run), and more:
every one is listed with its default in the compiled YAML's root.inputDefinitions.
Exit status: 0 submitted (with --wait: succeeded), 1 the run failed, 2 usage or endpoint errors.
"""


def run(args) -> int:
    import json

    from dataclasses import replace

    from omtr.tracking.pipeline import STEPS, Pipeline, PipelineConfig, StepFailed, for_profile, task_mode

    steps = tuple(s.strip() for s in args.steps.split(",") if s.strip())
    bad = [s for s in steps if s not in STEPS]
    if bad:
        raise CliError(f"unknown step(s) {bad}; choose from {', '.join(STEPS)}")
    try:
        cfg = for_profile(PipelineConfig(
            profile=args.profile, model="" if args.model.strip("'\"") in ("", "profile") else args.model, family=args.family,
            n_train=args.n_train, n_val=args.n_val,
            min_objects=args.min_objects, max_objects=args.max_objects, val_max_objects=args.val_max_objects,
            seed=args.seed,
            train_set=tuple(args.train_set), eval_budget=args.eval_budget, eval_max_new_tokens=args.max_new_tokens,
            bootstrap=args.bootstrap, name=args.name, rule=args.rule, serve_budget=args.serve_budget))
        cfg = replace(cfg, mode=task_mode(args.profile, args.mode))  # an explicit mode wins over the profile's
    except ValueError as exc:
        raise CliError(str(exc)) from None
    try:
        summary = Pipeline(cfg, args.work, experiment=args.experiment, quiet=args.quiet, steps=steps).run()
    except StepFailed as exc:
        print(f"omtr pipeline: {exc}\nfinished steps are kept: run the same command again to continue")
        return 1
    print(json.dumps(summary, indent=2))
    ev, base, prom = summary.get("evaluate"), summary.get("evaluate-baseline"), summary.get("promote")
    if ev:
        print(f"validation: success {ev.get('success')}, faithful {ev.get('faithful')}, calls {ev.get('calls')}")
    if base:
        print(f"untrained model ({base.get('model')}): success {base.get('success')}, faithful {base.get('faithful')}, "
              f"calls {base.get('calls')}")
    if prom:
        print(f"{cfg.name} version {prom.get('version')}: "
              + ("champion" if prom.get("promoted") else "challenger") + f" ({prom.get('reason')})")
        if prom.get("baseline_check") and prom["baseline_check"] not in (prom.get("reason") or ""):
            print(f"baseline gate: {prom['baseline_check']}")
    return 0


def run_compile(args) -> int:
    import time

    from omtr.k8s.kubeflow import KubeflowError, compile_pipeline

    t0 = time.perf_counter()
    try:
        out = compile_pipeline(args.out, args.source, args.image, args.trainer_image)
    except KubeflowError as exc:
        raise CliError(str(exc)) from None
    print(f"wrote {out} in {time.perf_counter() - t0:.1f} s: upload it in the Kubeflow UI (Pipelines > Upload "
          f"pipeline) or run `omtr pipeline submit --package {out} --host URL`")
    return 0


def run_submit(args) -> int:
    import json
    import tempfile
    from pathlib import Path

    from omtr.k8s import kubeflow as kf

    try:
        token = kf.read_token(args.token_env, args.token_file)
        with tempfile.TemporaryDirectory(prefix="omtr-kfp-") as tmp:
            package = args.package or str(kf.compile_pipeline(Path(tmp) / "omtr_pipeline.yaml", args.source, args.image,
                                                                   args.trainer_image))
            if args.package and not Path(args.package).is_file():
                raise kf.KubeflowError(f"--package {args.package}: no such file")
            params = kf.parse_params(args.param, kf.pipeline_parameters(package))
            res = kf.submit(args.host, package, token=token, params=params, experiment=args.experiment,
                            run_name=args.run_name, namespace=args.namespace,
                            service_account=args.service_account, wait=args.wait, timeout_s=args.timeout)
    except kf.KubeflowError as exc:
        raise CliError(str(exc)) from None
    print(json.dumps(res, indent=2))
    if args.wait and res.get("state") not in ("SUCCEEDED", "V2beta1RuntimeState.SUCCEEDED"):
        print(f"run {res['run_id']} ended {res.get('state')}: see {res['url']}")
        return 1
    return 0
