"""The omtr Kubeflow pipeline: prepare -> train -> evaluate (and evaluate-baseline) -> validate -> register ->
promote -> deploy: the main job's steps (``omtr pipeline``), plus the roll-out of a new champion.

Compile:  omtr pipeline compile --out pipelines/omtr_pipeline.yaml   (the committed YAML beside this file)
Submit:   omtr pipeline submit --host https://KUBEFLOW/pipeline --token-env KF_TOKEN --param profile=small

Where training runs is the run parameter ``train_on``:
- ``cpu``: ``omtr train`` in the step's pod on the CPU pool (the small and micro profiles);
- ``gpu``: ``omtr train`` in a pod on the A100 pool: node selector, toleration and one
  ``nvidia.com/gpu`` (kfp-kubernetes), the profile's model on ``cuda``;
- ``train-job``: ``omtr k8s train-job --wait`` creates and watches a multi-node job running
  DeepSpeed (the paper profile); the step itself stays on a small CPU pod. The run parameter
  ``train_job_kind`` picks the job's API: ``pytorchjob`` (Kubeflow Training Operator, the default)
  or ``trainjob`` (Kubeflow Trainer v2, on the ClusterTrainingRuntime omtr-torch-distributed).
Pod settings are fixed at compile time, so each place is its own task in a ``dsl.If/Elif``
branch, and the steps after training are one sub-pipeline called in each branch with that branch's
model; the first step rejects any other ``train_on`` (and any unknown profile, promotion rule or
deploy mode) before work starts. (Routing one model out of the branches with ``dsl.OneOf`` would compile, but kfp 2.17's
local runner cannot execute it, and the pipeline must run locally end to end.)

Per step, deliberately (:data:`STEPS`): retries only where a step is idempotent (tasks generation,
training, whose retried launcher watches the job it created, evaluation against the fleet),
never for validation (bad data stays bad), registration, promotion or deploy (each would act twice);
caching where outputs are a function of the inputs (tasks, training, evaluation, validation),
never for registry and cluster changes; requests and limits sized to the work; and time-outs
twice over: inside the component (a wall clock on the `omtr` child process, which every backend
honours) and on the pod (``activeDeadlineSeconds`` via kfp-kubernetes, a little longer).

It gates like the main job. The run parameter ``mode`` (given: each task carries its family's
domain and the model writes the problem; full: domain and problem; profile, the default: the
profile's own, small given, micro and paper full) reaches the prepare step, which resolves it as
``omtr pipeline --mode`` does. ``evaluate-baseline`` evaluates the model training starts from (the
profile's model or ``model``, with the decoding training gives it) on the same validation tasks
with the same budget, token limit, bootstrap and seed as ``evaluate``; it needs nothing from
training, so on a cluster it runs beside it. Both evaluations run on ``n_val`` validation tasks
(24 by default, reaching ``val_max_objects`` objects). ``register`` writes the baseline's metrics
as ``baseline.*`` tags and the paired per-task faithful difference with its 95% interval, and
``promote`` runs ``omtr promote``, the command the main job's promote step runs: a version whose
faithful success does not beat the untrained model's (a tie, or more planner success alone, is
refused) stays ``challenger`` and nothing is deployed.
"""

import sys
from pathlib import Path

from kfp import dsl, kubernetes

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the components/ package beside pipelines/

from components import steps  # noqa: E402
from omtr.k8s.trainjob import JOB_KINDS  # noqa: E402
from omtr.tracking.pipeline import MODES  # noqa: E402 - the task modes, as `omtr pipeline --mode` takes them

PIPELINE_NAME = "omtr"

# Where the cluster's services are (k8s/ base, namespace omtr).
MLFLOW_URI = "http://omtr-mlflow.omtr.svc.cluster.local:5000"
SOLVER_URL = "http://omtr-solver.omtr.svc.cluster.local:8600"
# The fleet's bearer token: a Secret with key `token` in the namespace the run's pods run in (the
# same Secret k8s/base mounts into the fleet, the serving pods and the training jobs). Every task that
# calls the fleet gets it as OMTR_SOLVER_TOKEN (kfp-kubernetes use_secret_as_env); a missing Secret
# stops the pod at start with an event that names it, not with a 401 an hour into evaluation.
SOLVER_TOKEN_SECRET, SOLVER_TOKEN_KEY, SOLVER_TOKEN_ENV = "omtr-solver-token", "token", "OMTR_SOLVER_TOKEN"
TRAINER_IMAGE = steps.OMTR_IMAGE.replace("/omtr:", "/omtr-trainer-gpu:")  # docker/trainer-gpu.Dockerfile

# The A100 pool as k8s/ knows it (the training jobs' affinity and tolerations): nodes labelled
# omtr.dev/pool=a100 and tainted for GPU work.
GPU_NODE_SELECTOR = ("omtr.dev/pool", "a100")
GPU_TOLERATIONS = ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                   {"key": "omtr.dev/pool", "operator": "Equal", "value": "a100", "effect": "NoSchedule"})
GPU_RESOURCE = "nvidia.com/gpu"
# Pod labels: k8s/base/network-policies.yaml lets pods with these components (in a namespace
# labelled omtr.dev/solver-clients=true, where the pipeline's pods run) reach the solver fleet.
COMPONENT_LABEL = "app.kubernetes.io/component"
# The volume that the train-job step and the training job's pods share (tasks in, model out).
CHECKPOINT_PVC, CHECKPOINT_MOUNT = "omtr-checkpoints", "/checkpoints"


# Per-step settings: retries, caching, CPU and memory (request, limit), time-out in seconds (the
# component's own; the pod's deadline is that plus POD_GRACE_S; None: a run parameter decides),
# the pod's component label where a NetworkPolicy asks for one.
STEPS = {
    "prepare": {"retries": 2, "cache": True, "cpu": ("1", "2"), "memory": ("2Gi", "4Gi"), "timeout_s": 1800},
    "train-cpu": {"component": "trainer", "retries": 1, "cache": True, "cpu": ("4", "8"), "memory": ("16Gi", "24Gi"), "timeout_s": None},
    "train-gpu": {"component": "trainer", "retries": 1, "cache": True, "cpu": ("8", "16"), "memory": ("64Gi", "96Gi"), "timeout_s": None,
                  "gpus": 1},
    "train-job": {"retries": 1, "cache": True, "cpu": ("250m", "1"), "memory": ("512Mi", "1Gi"), "timeout_s": None},
    "evaluate": {"component": "evaluator", "retries": 2, "cache": True, "cpu": ("4", "8"), "memory": ("16Gi", "24Gi"), "timeout_s": 4 * 3600},
    "evaluate-baseline": {"component": "evaluator", "retries": 2, "cache": True, "cpu": ("4", "8"), "memory": ("16Gi", "24Gi"),
                          "timeout_s": 4 * 3600},
    "validate": {"retries": 0, "cache": True, "cpu": ("1", "2"), "memory": ("2Gi", "4Gi"), "timeout_s": 1800},
    "register": {"retries": 0, "cache": False, "cpu": ("1", "2"), "memory": ("4Gi", "8Gi"), "timeout_s": 1800},
    "promote": {"retries": 0, "cache": False, "cpu": ("250m", "1"), "memory": ("512Mi", "1Gi"), "timeout_s": 600},
    "deploy": {"retries": 0, "cache": False, "cpu": ("250m", "500m"), "memory": ("256Mi", "512Mi"), "timeout_s": None},
}
TRAIN_ON = ("cpu", "gpu", "train-job")
TRAIN_JOB_KINDS = JOB_KINDS  # the train-job branch: a PyTorchJob or a TrainJob (omtr k8s train-job --kind)
POD_GRACE_S = 300
TRAIN_POD_DEADLINE_S = 7 * 24 * 3600  # the pod's cap whatever train_timeout_s says
DEPLOY_POD_DEADLINE_S = 3600


def _settle(task, step: str, *, pod_deadline_s: int | None = None):
    """Apply STEPS[step] to a task: display name, retries, caching, resources, pod deadline."""
    s = STEPS[step]
    task.set_display_name(step)
    if s["retries"]:
        task.set_retry(num_retries=s["retries"], backoff_duration="60s", backoff_factor=2.0)
    task.set_caching_options(enable_caching=s["cache"])
    task.set_cpu_request(s["cpu"][0]).set_cpu_limit(s["cpu"][1])
    task.set_memory_request(s["memory"][0]).set_memory_limit(s["memory"][1])
    deadline = pod_deadline_s or (s["timeout_s"] + POD_GRACE_S)
    kubernetes.set_timeout(task, deadline)
    kubernetes.add_pod_label(task, "app.kubernetes.io/name", "omtr")
    if s.get("component"):
        kubernetes.add_pod_label(task, COMPONENT_LABEL, s["component"])
    return task


@dsl.pipeline(name="omtr-after-training",
              description="evaluate -> validate episode logs -> register -> promote -> deploy when champion moved")
def after_training(trained: dsl.Input[dsl.Model], episodes: dsl.Input[dsl.Dataset], val_tasks: dsl.Input[dsl.Dataset],
                   baseline: dsl.Input[dsl.Dataset], eval_budget: int, max_new_tokens: int, bootstrap: int, seed: int, solver_url: str,
                   mlflow_tracking_uri: str, registry_name: str, serve_budget: int, promotion_rule: str,
                   serving_namespace: str, serving_deployment: str, deploy_mode: str, serving_manifest: str,
                   deploy_timeout_s: int, solver_token_secret: str):
    ev = _settle(steps.evaluate(budget=eval_budget, max_new_tokens=max_new_tokens, bootstrap=bootstrap, seed=seed,
                                solver_url=solver_url, mlflow_tracking_uri=mlflow_tracking_uri,
                                timeout_s=STEPS["evaluate"]["timeout_s"], val_tasks=val_tasks, trained=trained),
                 "evaluate")
    kubernetes.use_secret_as_env(ev, secret_name=solver_token_secret,
                                 secret_key_to_env={SOLVER_TOKEN_KEY: SOLVER_TOKEN_ENV})
    va = _settle(steps.validate_episodes(timeout_s=STEPS["validate"]["timeout_s"], episodes=episodes,
                                         evaluation=ev.outputs["evaluation"]), "validate")
    reg = _settle(steps.register(name=registry_name, serve_budget=serve_budget, max_new_tokens=max_new_tokens,
                                 mlflow_tracking_uri=mlflow_tracking_uri, timeout_s=STEPS["register"]["timeout_s"],
                                 trained=trained, evaluation=ev.outputs["evaluation"], baseline=baseline), "register")
    reg.after(va)  # only validated data is registered
    pro = _settle(steps.promote(name=registry_name, version=reg.outputs["version"], rule=promotion_rule,
                                mlflow_tracking_uri=mlflow_tracking_uri, timeout_s=STEPS["promote"]["timeout_s"]),
                  "promote")
    with dsl.If(pro.outputs["Output"] == True, name="champion-moved"):  # noqa: E712 - a pipeline expression
        _settle(steps.deploy(name=registry_name, version=reg.outputs["version"], namespace=serving_namespace,
                             deployment=serving_deployment, mode=deploy_mode, manifest=serving_manifest,
                             mlflow_tracking_uri=mlflow_tracking_uri, timeout_s=deploy_timeout_s), "deploy",
                pod_deadline_s=DEPLOY_POD_DEADLINE_S)


@dsl.pipeline(name=PIPELINE_NAME,
              description=("omtr: generate tasks, train the Actor/Judge/Editor model, evaluate it against the "
                           "solver fleet beside the untrained model it started from, validate the episode logs, "
                           "register it in MLflow, promote it when it beats the untrained model and the champion, "
                           "and roll the serving Deployment to it when it becomes champion."))
def omtr_pipeline(
    profile: str = "small",
    model: str = "profile",
    mode: str = "profile",
    train_on: str = "cpu",
    train_set: list = [],  # noqa: B006 - a pipeline parameter's default, never mutated
    train_timeout_s: int = 6 * 3600,
    family: str = "mix",
    n_train: int = 8,
    n_val: int = 24,
    min_objects: int = 2,
    max_objects: int = 4,
    val_max_objects: int = 5,
    seed: int = 0,
    eval_budget: int = 2,
    max_new_tokens: int = 448,
    bootstrap: int = 1000,
    solver_url: str = SOLVER_URL,
    solver_token_secret: str = SOLVER_TOKEN_SECRET,
    mlflow_tracking_uri: str = MLFLOW_URI,
    registry_name: str = "omtr-role-model",
    serve_budget: int = 6,
    promotion_rule: str = "point",
    serving_namespace: str = "omtr",
    serving_deployment: str = "omtr-serving",
    deploy_mode: str = "apply",
    serving_manifest: str = "",
    deploy_timeout_s: int = 900,
    trainer_image: str = TRAINER_IMAGE,
    train_nodes: int = 1,
    gpus_per_node: int = 8,
    train_namespace: str = "omtr",
    train_job_kind: str = "pytorchjob",
):
    choices = {"train_on": [train_on, list(TRAIN_ON)], "profile": [profile, ["small", "micro", "paper"]],
               "mode": [mode, list(MODES)],
               "train_job_kind": [train_job_kind, list(TRAIN_JOB_KINDS)],
               "promotion_rule": [promotion_rule, ["point", "ci"]], "deploy_mode": [deploy_mode, ["apply", "dry-run"]]}
    prep = _settle(steps.prepare_tasks(profile=profile, mode=mode, family=family, n_train=n_train, n_val=n_val, min_objects=min_objects,
                                       max_objects=max_objects, val_max_objects=val_max_objects, seed=seed, timeout_s=STEPS["prepare"]["timeout_s"],
                                       choices=choices), "prepare")
    # the untrained model on the same validation tasks and settings: the promotion gate's baseline
    base = _settle(steps.evaluate_baseline(profile=profile, model=model, train_set=train_set, budget=eval_budget,
                                           max_new_tokens=max_new_tokens, bootstrap=bootstrap, seed=seed,
                                           solver_url=solver_url, mlflow_tracking_uri=mlflow_tracking_uri,
                                           timeout_s=STEPS["evaluate-baseline"]["timeout_s"],
                                           val_tasks=prep.outputs["val_tasks"]), "evaluate-baseline")
    kubernetes.use_secret_as_env(base, secret_name=solver_token_secret,
                                 secret_key_to_env={SOLVER_TOKEN_KEY: SOLVER_TOKEN_ENV})
    rest = dict(val_tasks=prep.outputs["val_tasks"], baseline=base.outputs["evaluation"], eval_budget=eval_budget, max_new_tokens=max_new_tokens,
                bootstrap=bootstrap, seed=seed, solver_url=solver_url, mlflow_tracking_uri=mlflow_tracking_uri,
                registry_name=registry_name, serve_budget=serve_budget, promotion_rule=promotion_rule,
                serving_namespace=serving_namespace, serving_deployment=serving_deployment, deploy_mode=deploy_mode,
                serving_manifest=serving_manifest, deploy_timeout_s=deploy_timeout_s,
                solver_token_secret=solver_token_secret)

    with dsl.If(train_on == "cpu", name="train-on-cpu"):
        tr = _settle(steps.train(profile=profile, model=model, train_set=train_set, device="",
                                 mlflow_tracking_uri=mlflow_tracking_uri, timeout_s=train_timeout_s,
                                 train_tasks=prep.outputs["train_tasks"]), "train-cpu",
                     pod_deadline_s=TRAIN_POD_DEADLINE_S)
        after_training(trained=tr.outputs["trained"], episodes=tr.outputs["episodes"], **rest)

    with dsl.Elif(train_on == "gpu", name="train-on-gpu"):
        tr = _settle(steps.train(profile=profile, model=model, train_set=train_set, device="cuda",
                                 mlflow_tracking_uri=mlflow_tracking_uri, timeout_s=train_timeout_s,
                                 train_tasks=prep.outputs["train_tasks"]), "train-gpu",
                     pod_deadline_s=TRAIN_POD_DEADLINE_S)
        tr.set_accelerator_type(GPU_RESOURCE).set_accelerator_limit(STEPS["train-gpu"]["gpus"])
        kubernetes.add_node_selector(tr, *GPU_NODE_SELECTOR)
        for tol in GPU_TOLERATIONS:
            kubernetes.add_toleration(tr, **tol)
        kubernetes.empty_dir_mount(tr, volume_name="dshm", mount_path="/dev/shm", medium="Memory")
        after_training(trained=tr.outputs["trained"], episodes=tr.outputs["episodes"], **rest)

    with dsl.Elif(train_on == "train-job", name="train-as-job"):
        tr = _settle(steps.train_job(profile=profile, trainer_image=trainer_image, nodes=train_nodes,
                                     gpus_per_node=gpus_per_node, namespace=train_namespace, job_kind=train_job_kind,
                                     shared_dir=CHECKPOINT_MOUNT, mlflow_tracking_uri=mlflow_tracking_uri, solver_url=solver_url,
                                     timeout_s=train_timeout_s, train_tasks=prep.outputs["train_tasks"]),
                     "train-job", pod_deadline_s=TRAIN_POD_DEADLINE_S)
        kubernetes.mount_pvc(tr, pvc_name=CHECKPOINT_PVC, mount_path=CHECKPOINT_MOUNT)
        after_training(trained=tr.outputs["trained"], episodes=tr.outputs["episodes"], **rest)


def compile_to(path: str) -> None:
    """Write the pipeline spec (the YAML committed beside this file) to ``path``."""
    from kfp import compiler

    compiler.Compiler().compile(omtr_pipeline, package_path=str(path))


if __name__ == "__main__":
    compile_to(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).with_suffix(".yaml")))
