"""The pipeline's steps as kfp v2 lightweight Python components, each running one `omtr` subcommand.

They hold no logic of their own: each turns its typed inputs into an `omtr` command line, runs it
through :func:`omtr.k8s.step.run_omtr` (a child process with a wall clock: the time-out every
backend honours, the local runner included), and hands the files it wrote on as typed artifacts.
They run on the omtr image (``OMTR_IMAGE``), which carries omtr with its ``pipelines`` extra and so
kfp itself: nothing is pip-installed at run time (``install_kfp_package=False``), and kfp's local
``SubprocessRunner(use_venv=False)`` runs the same functions in this environment.

Environment: every component gets the MLflow URI as a parameter (empty: the image's default, a
SQLite file in the pod) and passes it on as ``MLFLOW_TRACKING_URI``.
"""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Metrics, Model, Output

import omtr

# The omtr image of this version (docker/: the CPU image; the trainer image is a pipeline parameter).
OMTR_IMAGE = f"ghcr.io/omtr/omtr:{omtr.__version__}"


@dsl.component(base_image=OMTR_IMAGE, install_kfp_package=False)
def prepare_tasks(profile: str, mode: str, family: str, n_train: int, n_val: int, min_objects: int, max_objects: int,
                  val_max_objects: int, seed: int, timeout_s: int, choices: dict, train_tasks: Output[Dataset],
                  val_tasks: Output[Dataset]):
    """`omtr tasks generate`: the training and validation splits (disjoint by task signature), in the
    task mode ``mode`` (given: each task carries the family's domain; full; profile: the profile's
    own, as `omtr pipeline --mode profile` resolves it). The validation tasks reach
    ``val_max_objects`` objects (0: ``max_objects``), as `omtr pipeline --val-max-objects` does.

    First, so that a mistyped run parameter fails before anything costly: ``choices`` maps each
    parameter with a closed set of values to ``[value, [allowed...]]``."""
    from omtr.k8s.step import run_omtr

    for param, (value, allowed) in sorted(choices.items()):
        if value not in allowed:
            raise ValueError(f"run parameter {param}={value!r} is not one of {allowed}: set it to one of them")

    from omtr.tracking.pipeline import task_mode

    mode = task_mode(profile, mode)
    for split, n, hi, out in (("train", n_train, max_objects, train_tasks),
                              ("val", n_val, val_max_objects or max_objects, val_tasks)):
        run_omtr(["tasks", "generate", "--family", family, "--n", n, "--seed", seed, "--split", split,
                  "--min-objects", min_objects, "--max-objects", hi, "--out", out.path]
                 + (["--given-domain"] if mode == "given" else []), timeout_s=timeout_s)
        out.metadata.update({"split": split, "tasks": n, "family": family, "seed": seed, "mode": mode})


@dsl.component(base_image=OMTR_IMAGE, install_kfp_package=False)
def train(profile: str, model: str, train_set: list, device: str, mlflow_tracking_uri: str, timeout_s: int,
          train_tasks: Input[Dataset], trained: Output[Model], episodes: Output[Dataset]):
    """`omtr train` in this pod (small and micro profiles on CPU, or one GPU): the model directory and
    the validated episode logs. ``model`` "" or "profile": the profile's own model."""
    import json
    import os
    import shutil
    import tempfile

    from omtr.k8s.step import run_omtr

    work = tempfile.mkdtemp(prefix="omtr-train-")
    args = ["train", "--tasks", train_tasks.path, "--out", work, "--profile", profile]
    if model not in ("", "profile"):
        args += ["--model", model]
    for kv in [*train_set, *([f"device={device}"] if device else []), "save_model_every_cycle=true"]:
        args += ["--set", kv]
    run_omtr(args, timeout_s=timeout_s, env={"MLFLOW_TRACKING_URI": mlflow_tracking_uri})
    shutil.copytree(os.path.join(work, "model"), trained.path, dirs_exist_ok=True)
    shutil.copytree(os.path.join(work, "episodes"), episodes.path, dirs_exist_ok=True)
    trained.metadata.update({"profile": profile})
    run_file = os.path.join(work, "mlflow_run.json")  # absent when the profile does not track (micro)
    if os.path.isfile(run_file):
        with open(run_file, encoding="utf-8") as f:
            trained.metadata["mlflow_run_id"] = json.load(f)["run_id"]


@dsl.component(base_image=OMTR_IMAGE, install_kfp_package=False)
def train_job(profile: str, trainer_image: str, nodes: int, gpus_per_node: int, namespace: str, job_kind: str,
              shared_dir: str, mlflow_tracking_uri: str, solver_url: str, timeout_s: int, train_tasks: Input[Dataset],
              trained: Output[Model], episodes: Output[Dataset]):
    """`omtr k8s train-job --wait`: multi-node DeepSpeed training on the GPU pool (the paper profile),
    created and watched from this CPU pod, as a Kubeflow Training Operator PyTorchJob
    (``job_kind`` pytorchjob) or a Kubeflow Trainer v2 TrainJob on the ClusterTrainingRuntime
    omtr-torch-distributed (``job_kind`` trainjob). The tasks go to, and the run directory comes
    back from, the checkpoint volume mounted at ``shared_dir`` in both; the run directory and the
    job's name are keyed by the tasks and settings (and the kind, for a TrainJob): a retried step
    watches the job it created (``omtr k8s train-job`` keeps an existing job of that name), and a
    rerun of a stopped job resumes from its checkpoints."""
    import hashlib
    import os
    import shutil

    from omtr.k8s.step import run_omtr

    with open(train_tasks.path, "rb") as f:
        data = f.read()
    if job_kind not in ("pytorchjob", "trainjob"):
        raise ValueError(f"train_job_kind {job_kind!r}: choose pytorchjob or trainjob")
    settings = f"|{profile}|{nodes}|{gpus_per_node}|{trainer_image}" + ("" if job_kind == "pytorchjob" else f"|{job_kind}")
    key = hashlib.sha256(data + settings.encode()).hexdigest()[:12]
    run_dir = os.path.join(shared_dir, f"train-{key}")
    os.makedirs(run_dir, exist_ok=True)
    tasks = os.path.join(run_dir, "train.jsonl")
    with open(tasks, "wb") as f:
        f.write(data)
    out = os.path.join(run_dir, "run")
    args = ["k8s", "train-job", "--kind", job_kind, "--image", trainer_image, "--profile", profile, "--tasks", tasks, "--out", out,
            "--nodes", nodes, "--gpus-per-node", gpus_per_node, "--namespace", namespace, "--name", f"omtr-train-{key}",
            "--mlflow-uri", mlflow_tracking_uri, "--solver-url", solver_url, "--wait", "--timeout", timeout_s]
    run_omtr(args, timeout_s=timeout_s + 120)
    shutil.copytree(os.path.join(out, "model"), trained.path, dirs_exist_ok=True)
    shutil.copytree(os.path.join(out, "episodes"), episodes.path, dirs_exist_ok=True)
    trained.metadata.update({"profile": profile, "run_dir": out})


@dsl.component(base_image=OMTR_IMAGE, install_kfp_package=False)
def evaluate(budget: int, max_new_tokens: int, bootstrap: int, seed: int, solver_url: str, mlflow_tracking_uri: str,
             timeout_s: int, val_tasks: Input[Dataset], trained: Input[Model], metrics: Output[Metrics],
             report: Output[HTML], evaluation: Output[Dataset]):
    """`omtr evaluate --policy model` on the validation split, the specs verified by the solver fleet
    at ``solver_url`` (empty: local solver workers in this pod)."""
    import json
    import os
    import shutil

    from omtr.k8s.step import run_omtr

    run_omtr(["evaluate", "--policy", "model", "--model", trained.path, "--tasks", val_tasks.path,
              "--out", evaluation.path, "--budget", budget, "--max-new-tokens", max_new_tokens, "--fit-statement",
              "--bootstrap", bootstrap, "--seed", seed, "--overwrite", "--track"],
             timeout_s=timeout_s, env={"OMTR_SOLVER_URL": solver_url, "MLFLOW_TRACKING_URI": mlflow_tracking_uri})
    with open(os.path.join(evaluation.path, "metrics.json"), encoding="utf-8") as f:
        m = json.load(f)
    for k in ("success", "faithful", "drift", "calls", "tasks"):
        if isinstance(m.get(k), (int, float)):
            metrics.log_metric(k, float(m[k]))
    shutil.copyfile(os.path.join(evaluation.path, "report.html"), report.path)
    evaluation.metadata.update({"solver": solver_url or "local workers", "budget": budget})


@dsl.component(base_image=OMTR_IMAGE, install_kfp_package=False)
def evaluate_baseline(profile: str, model: str, train_set: list, budget: int, max_new_tokens: int, bootstrap: int,
                      seed: int, solver_url: str, mlflow_tracking_uri: str, timeout_s: int, val_tasks: Input[Dataset],
                      metrics: Output[Metrics], report: Output[HTML], evaluation: Output[Dataset]):
    """`omtr evaluate --policy model` of the untrained model (where training starts: the profile's
    model or ``model``, with the decoding training gives it, resolved as the main job's
    evaluate-baseline step resolves it) on the same validation tasks, with the same budget, token
    limit, bootstrap and seed as ``evaluate``. ``register`` writes its metrics as ``baseline.*``
    tags, which the promotion gate compares the trained version with."""
    import json
    import os
    import shutil

    from omtr.k8s.step import run_omtr
    from omtr.tracking.pipeline import PipelineConfig, start_point

    start, decoding = start_point(PipelineConfig(profile=profile, model="" if model in ("", "profile") else model,
                                                 train_set=tuple(train_set)))
    run_omtr(["evaluate", "--policy", "model", "--model", start, "--tasks", val_tasks.path,
              "--out", evaluation.path, "--budget", budget, "--max-new-tokens", max_new_tokens, "--fit-statement",
              "--bootstrap", bootstrap, "--seed", seed, "--overwrite", "--track",
              *(["--decoding", decoding] if decoding else [])],
             timeout_s=timeout_s, env={"OMTR_SOLVER_URL": solver_url, "MLFLOW_TRACKING_URI": mlflow_tracking_uri})
    with open(os.path.join(evaluation.path, "metrics.json"), encoding="utf-8") as f:
        m = json.load(f)
    for k in ("success", "faithful", "drift", "calls", "tasks"):
        if isinstance(m.get(k), (int, float)):
            metrics.log_metric(k, float(m[k]))
    shutil.copyfile(os.path.join(evaluation.path, "report.html"), report.path)
    evaluation.metadata.update({"model": start, "decoding": decoding, "solver": solver_url or "local workers",
                                "budget": budget})


@dsl.component(base_image=OMTR_IMAGE, install_kfp_package=False)
def validate_episodes(timeout_s: int, episodes: Input[Dataset], evaluation: Input[Dataset],
                      reports: Output[Dataset], summary: Output[Metrics]):
    """`omtr validate-episodes` on every episode log of training and evaluation. Bad data fails the
    task (and so the run) after every log was checked; the reports say which rows."""
    import glob
    import os

    from omtr.k8s.step import StepError, run_omtr

    logs = sorted(glob.glob(os.path.join(episodes.path, "**", "*.parquet"), recursive=True))
    logs.append(os.path.join(evaluation.path, "episodes.parquet"))
    os.makedirs(reports.path, exist_ok=True)
    failed = []
    for i, f in enumerate(logs):
        out = os.path.join(reports.path, f"{i:03d}-{os.path.basename(f)}.json")
        if run_omtr(["validate-episodes", f, "--json", out], timeout_s=timeout_s, ok=(0, 1)):
            failed.append(f)
    summary.log_metric("logs_checked", len(logs))
    summary.log_metric("logs_failed", len(failed))
    if failed:
        raise StepError(f"{len(failed)} of {len(logs)} episode logs failed validation: {failed}")


@dsl.component(base_image=OMTR_IMAGE, install_kfp_package=False)
def register(name: str, serve_budget: int, max_new_tokens: int, mlflow_tracking_uri: str, timeout_s: int,
             trained: Input[Model], evaluation: Input[Dataset],
             baseline: Input[Dataset]) -> NamedTuple("Registered", version=str, model_uri=str):
    """`omtr register`: a new version of ``name`` (alias challenger) with the evaluation's metrics as
    ``metric.*`` tags and the untrained model's (``baseline``, the evaluate-baseline step's output)
    as ``baseline.*`` tags, with the paired per-task faithful difference (trained - untrained) and
    its 95% interval from both evaluations' traces.jsonl; `omtr register` refuses a baseline from
    other tasks or settings."""
    import json
    import os
    import tempfile
    from collections import namedtuple

    from omtr.k8s.step import run_omtr

    out = os.path.join(tempfile.mkdtemp(prefix="omtr-register-"), "version.json")
    args = ["register", "--model-dir", trained.path, "--name", name, "--metrics",
            os.path.join(evaluation.path, "metrics.json"), "--budget", serve_budget,
            "--max-new-tokens", max_new_tokens, "--json", out,
            "--baseline-metrics", os.path.join(baseline.path, "metrics.json"),
            "--traces", os.path.join(evaluation.path, "traces.jsonl"),
            "--baseline-traces", os.path.join(baseline.path, "traces.jsonl")]
    if trained.metadata.get("mlflow_run_id"):
        args += ["--train-run", trained.metadata["mlflow_run_id"]]
    run_omtr(args, timeout_s=timeout_s, env={"MLFLOW_TRACKING_URI": mlflow_tracking_uri})
    with open(out, encoding="utf-8") as f:
        r = json.load(f)
    return namedtuple("Registered", ["version", "model_uri"])(str(r["version"]), r["model_uri"])


@dsl.component(base_image=OMTR_IMAGE, install_kfp_package=False)
def promote(name: str, version: str, rule: str, mlflow_tracking_uri: str, timeout_s: int,
            decision: Output[Dataset]) -> bool:
    """`omtr promote`: move `champion` to ``version`` if it passes the baseline gate on faithful
    success alone (rule point: above the untrained model's ``baseline.faithful``; rule ci: the paired
    interval of the per-task difference above 0; a tie, or more planner success alone, is refused)
    and then beats the champion's faithful success by ``rule``: the same command, and so the same
    gate, as the main job's promote step. Returns
    whether the champion moved; a refusal is an outcome, not a failure (the deploy step then does
    not run). ``decision``: the rule's inputs and reason as JSON. (One unnamed output on purpose:
    kfp 2.17's local runner resolves only ``Output`` in a condition inside a sub-pipeline.)"""
    import json

    from omtr.k8s.step import run_omtr

    rc = run_omtr(["promote", "--name", name, "--version", version, "--rule", rule, "--json", decision.path],
                  timeout_s=timeout_s, ok=(0, 1), env={"MLFLOW_TRACKING_URI": mlflow_tracking_uri})
    with open(decision.path, encoding="utf-8") as f:
        reason = str(json.load(f).get("reason", ""))
    decision.metadata.update({"version": version, "promoted": rc == 0, "reason": reason})
    return rc == 0


@dsl.component(base_image=OMTR_IMAGE, install_kfp_package=False)
def deploy(name: str, version: str, namespace: str, deployment: str, mode: str, manifest: str,
           mlflow_tracking_uri: str, timeout_s: int, rollout: Output[Dataset]):
    """`omtr deploy`: roll the serving Deployment to ``models:/name/version`` and wait for it, rolling
    back on failure. ``mode`` apply (the cluster) or dry-run (validate and print the patch; with
    ``manifest``, a Deployment YAML file that stands in for the cluster)."""
    from omtr.k8s.step import run_omtr

    if mode not in ("apply", "dry-run"):
        raise ValueError(f"deploy_mode {mode!r}: choose apply or dry-run")
    args = ["deploy", "--name", name, "--version", version, "--namespace", namespace, "--deployment", deployment,
            "--timeout", timeout_s, "--json", rollout.path]
    if mode == "dry-run":
        args += ["--dry-run", *(["--manifest", manifest] if manifest else [])]
    run_omtr(args, timeout_s=timeout_s + 120, env={"MLFLOW_TRACKING_URI": mlflow_tracking_uri})
    rollout.metadata.update({"model_uri": f"models:/{name}/{version}", "mode": mode})
