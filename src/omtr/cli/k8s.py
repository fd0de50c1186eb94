"""``omtr k8s ...``: the Kubernetes manifests (render, validate) and multi-node training jobs."""

from __future__ import annotations

import sys

from omtr.cli import CliError, add_command


def register(subparsers) -> None:
    parser = add_command(
        subparsers, "k8s",
        help="Kubernetes: render and validate k8s/ overlays, run multi-node training as a PyTorchJob or TrainJob",
        description="The manifests under k8s/ (a kustomize base and the overlays dev and gpu-cluster) and the "
                    "multi-node job that trains the paper profile on the A100 pool: a Kubeflow Training "
                    "Operator PyTorchJob (kubeflow.org/v1) or a Kubeflow Trainer v2 TrainJob "
                    "(trainer.kubeflow.org/v1alpha1) on omtr's training runtime.",
        examples="""  omtr k8s render dev | kubectl apply -f -          # what `kubectl apply -k k8s/overlays/dev` applies
  omtr k8s validate                                   # every overlay, strict, offline
  omtr k8s train-job --image REG/omtr-trainer-gpu:0.1.0 --profile paper --tasks /checkpoints/tasks/train.jsonl \\
      --out /checkpoints/runs/paper-1 --nodes 2 --gpus-per-node 8 --namespace omtr --dry-run
  omtr k8s train-job --kind trainjob --image REG/omtr-trainer-gpu:0.1.0 --tasks /checkpoints/tasks/train.jsonl \\
      --out /checkpoints/runs/paper-1 --nodes 2 --dry-run     # the same run as a Kubeflow Trainer v2 TrainJob
  omtr k8s training-runtime                           # the ClusterTrainingRuntime such TrainJobs refer to
""",
    )
    sub = parser.add_subparsers(dest="k8s_command", metavar="SUBCOMMAND")
    parser.set_defaults(handler=lambda args: (parser.print_help(), 2)[1])
    _register_render(sub)
    _register_validate(sub)
    _register_train_job(sub)
    _register_training_runtime(sub)


def _register_render(sub) -> None:
    p = add_command(
        sub, "render",
        help="print an overlay's objects as YAML (kustomize build)",
        description="Render a kustomization under k8s/ with the real kustomize (`kubectl kustomize`, or "
                    "`kustomize build` where that binary is installed; OMTR_KUSTOMIZE picks one): the objects "
                    "`kubectl apply -k` sends. No cluster is needed.",
        examples="""  omtr k8s render dev
  omtr k8s render gpu-cluster --out rendered.yaml
  omtr k8s render k8s/base
""",
    )
    p.add_argument("overlay", metavar="OVERLAY", help="dev, gpu-cluster, or a kustomization directory")
    p.add_argument("--out", metavar="FILE", help="write the YAML here instead of stdout")
    p.set_defaults(handler=_render)


def _register_validate(sub) -> None:
    from omtr.k8s.trainjob import DEFAULT_K8S_VERSION

    p = add_command(
        sub, "validate",
        help="render overlays and validate every object offline (strict schemas)",
        description="Validate every rendered object against the Kubernetes schemas with kubernetes-validate "
                    "(strict: unknown fields are errors), PyTorchJobs against the pinned Training Operator "
                    "schema, TrainJobs and (Cluster)TrainingRuntimes against the pinned Kubeflow Trainer v2 "
                    "schemas. Exit 0 when all are valid, 1 otherwise (each error printed).",
        examples=f"""  omtr k8s validate                            # dev and gpu-cluster, Kubernetes {DEFAULT_K8S_VERSION}
  omtr k8s validate gpu-cluster --k8s-version 1.33
""",
    )
    p.add_argument("overlays", nargs="*", metavar="OVERLAY", help="overlays (default: dev gpu-cluster)")
    p.add_argument("--k8s-version", default=DEFAULT_K8S_VERSION,
                   help=f"Kubernetes version of the schemas (default {DEFAULT_K8S_VERSION})")
    p.set_defaults(handler=_validate)


def _register_train_job(sub) -> None:
    from dataclasses import MISSING, fields

    from omtr.k8s.trainjob import CLUSTER_RUNTIME_KIND, JOB_KINDS, RUNTIME_KINDS, TrainJobSpec

    d = {f.name: f.default for f in fields(TrainJobSpec) if f.default is not MISSING}
    p = add_command(
        sub, "train-job",
        help="train on the A100 pool: create (and watch) a PyTorchJob or TrainJob running omtr train under DeepSpeed",
        description="Build the multi-node training job (torchrun over `omtr train` with DeepSpeed on every node, "
                    "GPUs, /dev/shm, the checkpoint volume, restarts that resume from the last checkpoint), "
                    "validate it against its pinned schema, then create it in the cluster (in-cluster service "
                    "account or kubeconfig) and, with --wait, watch it to the end. --kind picks the API: "
                    "pytorchjob (default), a Kubeflow Training Operator PyTorchJob (kubeflow.org/v1, one Master "
                    "+ nodes-1 Workers); trainjob, a Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1) "
                    "on the training runtime --runtime (default the ClusterTrainingRuntime omtr-torch-distributed "
                    "that k8s/overlays/gpu-cluster applies; `omtr k8s training-runtime` prints it), watched until "
                    "its Complete or Failed condition. Exit 0 created/succeeded, 1 failed or timed out, 2 usage. "
                    "A job of that name that exists already is watched, not created again (a retried pipeline step).",
        examples="""  omtr k8s train-job --image REG/omtr-trainer-gpu:0.1.0 --profile paper \\
      --tasks /checkpoints/tasks/train.jsonl --out /checkpoints/runs/paper-1 \\
      --nodes 2 --gpus-per-node 8 --namespace omtr --dry-run        # print the validated PyTorchJob
  omtr k8s train-job --image REG/omtr-trainer-gpu:0.1.0 --profile paper \\
      --tasks /checkpoints/tasks/train.jsonl --out /checkpoints/runs/paper-1 \\
      --nodes 2 --gpus-per-node 8 --namespace omtr --mlflow-uri http://omtr-mlflow:5000 --wait --timeout 172800
  omtr k8s train-job --kind trainjob --image REG/omtr-trainer-gpu:0.1.0 --profile paper \\
      --tasks /checkpoints/tasks/train.jsonl --out /checkpoints/runs/paper-1 \\
      --nodes 2 --gpus-per-node 8 --namespace omtr --wait    # the same run as a Kubeflow Trainer v2 TrainJob
  omtr k8s train-job --kind trainjob --runtime omtr-torch-distributed --runtime-kind TrainingRuntime ... \\
      --dry-run                                               # refer to a namespaced TrainingRuntime instead

--tasks and --out are paths inside the pods, on the checkpoint volume (--checkpoint-pvc, mounted at
/checkpoints); put the task file there first. A TrainJob needs Kubeflow Trainer v2 and its runtime in
the cluster (kubectl apply -k k8s/overlays/gpu-cluster creates ClusterTrainingRuntime omtr-torch-distributed).
""",
    )
    p.add_argument("--kind", choices=JOB_KINDS, default="pytorchjob",
                   help="pytorchjob: Kubeflow Training Operator PyTorchJob (default); trainjob: Kubeflow Trainer v2 TrainJob")
    p.add_argument("--image", required=True, help="GPU trainer image (docker/trainer-gpu.Dockerfile)")
    p.add_argument("--profile", default=d["profile"], help=f"training profile (default {d['profile']})")
    p.add_argument("--tasks", required=True, metavar="PATH", help="training tasks JSONL, a path inside the pods")
    p.add_argument("--out", required=True, metavar="DIR", help="run directory inside the pods (on the checkpoint volume)")
    p.add_argument("--nodes", type=int, default=d["nodes"],
                   help=f"nodes (pods): PyTorchJob one Master + Workers, TrainJob numNodes (default {d['nodes']})")
    p.add_argument("--gpus-per-node", type=int, default=d["gpus_per_node"],
                   help=f"GPUs per node, one training process each (default {d['gpus_per_node']})")
    p.add_argument("--namespace", default=d["namespace"], help=f"namespace (default {d['namespace']})")
    p.add_argument("--name", default="", help="job name (default omtr-train-PROFILE)")
    p.add_argument("--mlflow-uri", default=d["mlflow_uri"], help=f"MLFLOW_TRACKING_URI of the pods (default {d['mlflow_uri']}; '' for none)")
    p.add_argument("--solver-url", default=d["solver_url"], help=f"OMTR_SOLVER_URL of the pods (default {d['solver_url']}; '' for none)")
    p.add_argument("--deepspeed", default=d["deepspeed"], help=f"DeepSpeed config inside the image (default {d['deepspeed']})")
    p.add_argument("--checkpoint-pvc", default=d["checkpoint_pvc"],
                   help=f"ReadWriteMany claim mounted at /checkpoints (default {d['checkpoint_pvc']})")
    p.add_argument("--node-pool", default=d["node_pool_label"], metavar="KEY=VALUE",
                   help=f"node label of the GPU pool: required node affinity and a toleration (default {d['node_pool_label']})")
    p.add_argument("--cpu-per-gpu", type=int, default=d["cpu_per_gpu"], help=f"CPU cores per GPU (default {d['cpu_per_gpu']})")
    p.add_argument("--memory-per-gpu", type=int, default=d["memory_per_gpu_gi"], metavar="GI",
                   help=f"memory per GPU in GiB (default {d['memory_per_gpu_gi']})")
    p.add_argument("--shm", type=int, default=d["shm_gi"], metavar="GI", help="/dev/shm size in GiB (default: a quarter of the pod's memory, at most 64)")
    p.add_argument("--runtime", default=d["runtime"], metavar="NAME",
                   help=f"--kind trainjob: the training runtime the TrainJob refers to (default {d['runtime']})")
    p.add_argument("--runtime-kind", choices=RUNTIME_KINDS, default=CLUSTER_RUNTIME_KIND,
                   help=f"--kind trainjob: {CLUSTER_RUNTIME_KIND} (cluster-wide, default) or TrainingRuntime (in --namespace)")
    p.add_argument("--suspend", action="store_true", help="create the job suspended (runPolicy.suspend / spec.suspend)")
    p.add_argument("--dry-run", action="store_true", help="print the validated body as YAML; touch no cluster")
    p.add_argument("--wait", action="store_true", help="watch the job until it succeeds or fails")
    p.add_argument("--timeout", type=float, default=7 * 86400, metavar="S", help="with --wait: give up after S seconds (default 7 days)")
    p.add_argument("--poll", type=float, default=30.0, metavar="S", help="with --wait: seconds between status checks (default 30)")
    p.set_defaults(handler=_train_job)


def _register_training_runtime(sub) -> None:
    from omtr.k8s.trainjob import CLUSTER_RUNTIME_KIND, RUNTIME_KINDS, RUNTIME_NAME

    p = add_command(
        sub, "training-runtime",
        help="print the Kubeflow Trainer v2 training runtime that `train-job --kind trainjob` refers to",
        description="Print, validated against the pinned schema, the ClusterTrainingRuntime (or namespaced "
                    "TrainingRuntime) that omtr's TrainJobs run on: a torch runtime with one replicated job "
                    "`node`, non-root with a read-only root filesystem, /tmp, the token-less service account, "
                    "restarts in place. k8s/overlays/gpu-cluster/clustertrainingruntime.yaml is its output "
                    "with the defaults (a test keeps it current). No cluster is needed.",
        examples=f"""  omtr k8s training-runtime                                   # ClusterTrainingRuntime {RUNTIME_NAME}
  omtr k8s training-runtime --image REG/omtr-trainer-gpu:0.1.0 | kubectl apply -f -
  omtr k8s training-runtime --kind TrainingRuntime --namespace omtr --out runtime.yaml
""",
    )
    p.add_argument("--name", default=RUNTIME_NAME, help=f"runtime name (default {RUNTIME_NAME})")
    p.add_argument("--image", default="omtr-trainer-gpu:0.1.0",
                   help="the node container's default image; every TrainJob sets its own (default omtr-trainer-gpu:0.1.0, "
                        "which the gpu-cluster overlay points at its registry)")
    p.add_argument("--kind", choices=RUNTIME_KINDS, default=CLUSTER_RUNTIME_KIND, help=f"default {CLUSTER_RUNTIME_KIND}")
    p.add_argument("--namespace", default="omtr", help="TrainingRuntime only: its namespace (default omtr)")
    p.add_argument("--out", metavar="FILE", help="write the YAML here instead of stdout")
    p.set_defaults(handler=_training_runtime)


def _render(args) -> int:
    from omtr.k8s.kustomize import KustomizeError, render_yaml
    from omtr.k8s.manifests import overlay_dir

    try:
        text = render_yaml(overlay_dir(args.overlay))
    except (KustomizeError, FileNotFoundError) as exc:
        raise CliError(str(exc)) from None
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


def _validate(args) -> int:
    import time

    from omtr.k8s.kustomize import KustomizeError
    from omtr.k8s.manifests import OVERLAYS, render_overlay, validate_objects

    bad = 0
    for name in args.overlays or OVERLAYS:
        t0 = time.perf_counter()
        try:
            objs = render_overlay(name)
        except (KustomizeError, FileNotFoundError) as exc:
            raise CliError(str(exc)) from None
        errors = validate_objects(objs, args.k8s_version)
        for e in errors:
            print(f"{name}: {e}")
        bad += len(errors)
        print(f"{name}: {len(objs)} objects, {len(errors)} invalid (Kubernetes {args.k8s_version}, "
              f"{time.perf_counter() - t0:.1f} s)")
    return 1 if bad else 0


def _train_job(args) -> int:
    from omtr.k8s import trainjob

    try:
        spec = trainjob.TrainJobSpec(
            image=args.image, tasks=args.tasks, out=args.out, namespace=args.namespace, name=args.name,
            profile=args.profile, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
            mlflow_uri=args.mlflow_uri or None, solver_url=args.solver_url or None, deepspeed=args.deepspeed,
            checkpoint_pvc=args.checkpoint_pvc, node_pool_label=args.node_pool, cpu_per_gpu=args.cpu_per_gpu,
            memory_per_gpu_gi=args.memory_per_gpu, shm_gi=args.shm, suspend=args.suspend,
            runtime=args.runtime, runtime_kind=args.runtime_kind)
        body = trainjob.build_job(spec, args.kind)
    except trainjob.TrainJobError as exc:
        raise CliError(str(exc)) from None
    if args.dry_run:
        sys.stdout.write(trainjob.to_yaml(body))
        return 0
    res = trainjob.RESOURCES[body["kind"]]
    where = f"{res.kind.lower()} {spec.namespace}/{spec.job_name}"
    try:
        api = trainjob.custom_objects_api()
        trainjob.create(body, api)
        print(f"{where}: created")
        if args.wait:
            trainjob.wait(api, spec.namespace, spec.job_name, timeout_s=args.timeout, poll_s=args.poll, kind=res.kind)
            print(f"{where}: {res.done}")
    except (trainjob.TrainJobFailed, trainjob.TrainJobTimeout) as exc:
        print(f"omtr k8s train-job: {exc}", file=sys.stderr)
        return 1
    except trainjob.TrainJobError as exc:
        raise CliError(str(exc)) from None
    return 0


def _training_runtime(args) -> int:
    from omtr.k8s import trainjob

    try:
        body = trainjob.build_training_runtime(args.name, image=args.image, kind=args.kind, namespace=args.namespace)
    except trainjob.TrainJobError as exc:
        raise CliError(str(exc)) from None
    text = trainjob.to_yaml(body)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0
