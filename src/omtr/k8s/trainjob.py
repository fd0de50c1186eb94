"""Multi-node training on Kubernetes: a Kubeflow Training Operator PyTorchJob that runs
``omtr train`` under DeepSpeed on every node, built from a few parameters, validated against the
pinned PyTorchJob schema, created and watched through the ``kubernetes`` client.

The job has one Master and ``nodes - 1`` Worker pods (container ``pytorch``, the name the operator
looks for, with the port ``pytorchjob-port`` it reads MASTER_PORT from). Each pod runs ``torchrun``
with ``--nnodes`` and ``--nproc_per_node`` fixed here, the node rank from the operator (RANK, or
PET_NODE_RANK where the operator sets it) and the Master's address; torchrun starts one
``omtr train`` process per GPU, and the trainer's DeepSpeed engine joins the process group from
torchrun's environment. The run directory lives on a ReadWriteMany checkpoint volume; the pods
restart OnFailure, and a restarted pod resumes: when ``OUT/checkpoints/latest`` exists the command
is ``omtr train --tasks T --out OUT --resume`` (the saved config, the last checkpoint), else a fresh
``--profile P --set deepspeed=CONFIG`` run.

The same run can be a Kubeflow Trainer v2 ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``) instead:
:func:`build_trainjob` refers by ``runtimeRef`` to a ClusterTrainingRuntime (:func:`build_training_runtime`,
committed in the gpu-cluster overlay as ``omtr-torch-distributed``) that holds what every omtr run
shares (the ``node`` replicated job and container, service account, security contexts, /tmp), and
sets the rest per run: the image, the torchrun command, env and resources per node through
``spec.trainer``; the pool placement, /dev/shm, the checkpoint claim, the solver token and the
run's pod labels through ``spec.podTemplateOverrides``. The Trainer's torch plugin sets
PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT, which the TrainJob's launch script reads.
Both kinds are validated against pinned CRD schemas (``src/omtr/data/k8s/``, each file's header
names its source) and created and watched the same way (:func:`create`, :func:`wait`).
"""

from __future__ import annotations

import copy
import json
import logging
import re
import shlex
import time
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL, KIND = "kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"
SCHEMA_FILE = "kubeflow.org_pytorchjobs.v1.schema.yaml"
# Kubeflow Trainer v2
TRAINER_GROUP, TRAINER_VERSION = "trainer.kubeflow.org", "v1alpha1"
TRAINJOB_KIND, TRAINJOB_PLURAL = "TrainJob", "trainjobs"
TRAINJOB_SCHEMA_FILE = "trainer.kubeflow.org_trainjobs.v1alpha1.schema.yaml"
RUNTIME_SCHEMA_FILE = "trainer.kubeflow.org_clustertrainingruntimes.v1alpha1.schema.yaml"
CLUSTER_RUNTIME_KIND, RUNTIME_KIND = "ClusterTrainingRuntime", "TrainingRuntime"
RUNTIME_KINDS = (CLUSTER_RUNTIME_KIND, RUNTIME_KIND)
RUNTIME_NAME = "omtr-torch-distributed"  # not torch-distributed: that name is Kubeflow's own default runtime
TRAINER_NODE = "node"  # the replicated job and container that the Trainer's torch plugin drives
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"  # marks the job spec.trainer applies to
JOB_KINDS = ("pytorchjob", "trainjob")  # what `omtr k8s train-job --kind` and the pipeline accept
DEFAULT_K8S_VERSION = "1.31"
UID = 10001  # the images' user (docker/*.Dockerfile) and every manifest's runAsUser
MASTER_PORT = 23456


class TrainJobError(RuntimeError):
    """The job could not be built, created or finished; the message says what to do."""


class TrainJobInvalid(TrainJobError):
    """The body does not match its kind's pinned schema (PyTorchJob, TrainJob, a training runtime)."""


class TrainJobFailed(TrainJobError):
    """The operator reports the job Failed."""


class TrainJobTimeout(TrainJobError):
    """The job did not finish within the time-out."""


@dataclass(frozen=True)
class TrainJobSpec:
    """Parameters of one multi-node training run."""

    image: str = field(metadata={"help": "GPU trainer image (docker/trainer-gpu.Dockerfile), e.g. REGISTRY/omtr-trainer-gpu:0.1.0"})
    tasks: str = field(metadata={"help": "training tasks JSONL, a path inside the pods (on the checkpoint volume)"})
    out: str = field(metadata={"help": "run directory inside the pods, on the checkpoint volume"})
    namespace: str = "omtr"
    name: str = ""
    profile: str = "paper"
    nodes: int = 2
    gpus_per_node: int = 8
    mlflow_uri: str | None = "http://omtr-mlflow:5000"
    solver_url: str | None = "http://omtr-solver:8600"
    deepspeed: str = "/opt/omtr/configs/deepspeed/zero2_bf16.json"  # ZeRO-3 is refused across ranks
    checkpoint_pvc: str = "omtr-checkpoints"
    checkpoint_mount: str = "/checkpoints"
    node_pool_label: str = "omtr.dev/pool=a100"
    cpu_per_gpu: int = 6
    memory_per_gpu_gi: int = 60
    shm_gi: int = 0  # 0: a quarter of the pod's memory, at most 64 GiB
    hf_token_secret: str = "omtr-hf-token"
    suspend: bool = False
    backoff_limit: int = 10  # the PyTorchJob's runPolicy; a TrainJob's runtime sets its Jobs' backoffLimit
    runtime: str = RUNTIME_NAME  # TrainJob only: the training runtime it refers to
    runtime_kind: str = CLUSTER_RUNTIME_KIND  # TrainJob only: ClusterTrainingRuntime or TrainingRuntime

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise TrainJobError(f"nodes must be at least 1, got {self.nodes}")
        if not 1 <= self.gpus_per_node <= 16:
            raise TrainJobError(f"gpus_per_node must be 1..16, got {self.gpus_per_node}")
        if not self.image:
            raise TrainJobError("an image is required: the GPU trainer image, e.g. REGISTRY/omtr-trainer-gpu:0.1.0")
        for what, path in (("tasks", self.tasks), ("out", self.out)):
            if not path.startswith("/"):
                raise TrainJobError(f"{what} must be an absolute path inside the pods (on {self.checkpoint_mount}), got {path!r}")
        if not self.out.startswith(self.checkpoint_mount.rstrip("/") + "/"):
            raise TrainJobError(f"out {self.out!r} must lie on the checkpoint volume ({self.checkpoint_mount}/...) "
                                "so that a restarted pod finds its checkpoints")
        if "=" not in self.node_pool_label:
            raise TrainJobError(f"node_pool_label must be KEY=VALUE, got {self.node_pool_label!r}")
        if self.shm_gi < 0 or self.shm_gi >= self.memory_per_gpu_gi * self.gpus_per_node:
            raise TrainJobError("shm_gi counts against the pod's memory limit; make it smaller than memory_per_gpu_gi x gpus_per_node")
        if self.runtime_kind not in RUNTIME_KINDS:
            raise TrainJobError(f"runtime_kind must be one of {', '.join(RUNTIME_KINDS)}, got {self.runtime_kind!r}")
        if not self.runtime:
            raise TrainJobError("runtime (the training runtime a TrainJob refers to) must not be empty")

    @property
    def shm_size_gi(self) -> int:
        return self.shm_gi or max(1, min(64, self.memory_per_gpu_gi * self.gpus_per_node // 4))

    @property
    def job_name(self) -> str:
        return self.name or f"omtr-train-{self.profile}"


# Where torchrun's node rank and rendezvous address come from: the Training Operator sets RANK
# (PET_NODE_RANK in newer releases), MASTER_ADDR and MASTER_PORT; the Trainer's torch plugin sets PET_*.
RENDEZVOUS = {
    "pytorchjob": '--node_rank="${PET_NODE_RANK:-$RANK}" --master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" ',
    "trainjob": '--node_rank="$PET_NODE_RANK" --master_addr="$PET_MASTER_ADDR" --master_port="$PET_MASTER_PORT" ',
}


def launch_script(spec: TrainJobSpec, kind: str = "pytorchjob") -> str:
    """The shell command every pod runs: torchrun over ``omtr train``, resuming when a checkpoint exists.
    ``kind`` (pytorchjob or trainjob) picks the environment the rendezvous is read from."""
    if kind not in RENDEZVOUS:
        raise TrainJobError(f"kind must be one of {', '.join(JOB_KINDS)}, got {kind!r}")
    q = shlex.quote
    out = spec.out.rstrip("/")
    return "\n".join([
        "set -eu",
        f"if [ -f {q(out + '/checkpoints/latest')} ]; then",
        "  set -- --resume",
        "else",
        f"  set -- --profile {q(spec.profile)} --set deepspeed={q(spec.deepspeed)}",
        "fi",
        f"exec torchrun --nnodes={spec.nodes} --nproc_per_node={spec.gpus_per_node} "
        + RENDEZVOUS[kind] +
        f'-m omtr train --tasks {q(spec.tasks)} --out {q(out)} "$@"',
    ])


# ---------------------------------------------------------------------------------- pod parts
# Each part of the training pod once; the PyTorchJob puts them all into its pod template, the
# TrainJob splits them between its runtime (what every run shares) and its overrides (per run).
SECURITY_CONTEXT = {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]}}
POD_SECURITY_CONTEXT = {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "fsGroup": UID,
                        "seccompProfile": {"type": "RuntimeDefault"}}
SERVICE_ACCOUNT = "omtr-workload"
OMTR_LABELS = {"app.kubernetes.io/name": "omtr", "app.kubernetes.io/component": "trainer",
               "app.kubernetes.io/part-of": "omtr"}  # k8s/base/network-policies.yaml admits these to the fleet
TMP_VOLUME = {"name": "tmp", "emptyDir": {"sizeLimit": "50Gi"}}
TMP_MOUNT = {"name": "tmp", "mountPath": "/tmp"}


def _pod_labels(spec: TrainJobSpec) -> dict:
    return {**OMTR_LABELS, "omtr.dev/run": spec.job_name}


def _env(spec: TrainJobSpec) -> list[dict]:
    env = [
        {"name": "OMP_NUM_THREADS", "value": "1"},
        {"name": "HOME", "value": "/tmp"},
        {"name": "OMTR_CACHE", "value": f"{spec.checkpoint_mount}/.cache/omtr"},
        {"name": "HF_HOME", "value": f"{spec.checkpoint_mount}/.cache/huggingface"},
        {"name": "TRITON_CACHE_DIR", "value": "/tmp/triton"},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": spec.hf_token_secret, "key": "token", "optional": True}}},
    ]
    if spec.mlflow_uri:
        env.append({"name": "MLFLOW_TRACKING_URI", "value": spec.mlflow_uri})
    if spec.solver_url:
        env += [{"name": "OMTR_SOLVER_URL", "value": spec.solver_url},
                {"name": "OMTR_SOLVER_TOKEN_FILE", "value": "/var/run/secrets/omtr/solver/token"}]
    return env


def _run_volumes(spec: TrainJobSpec) -> tuple[list[dict], list[dict]]:
    """(volumes, mounts) that depend on the run: /dev/shm's size, the checkpoint claim, the solver token.
    /tmp (TMP_VOLUME) is the same for every run and not among them."""
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "checkpoints", "mountPath": spec.checkpoint_mount}]
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{spec.shm_size_gi}Gi"}},
               {"name": "checkpoints", "persistentVolumeClaim": {"claimName": spec.checkpoint_pvc}}]
    if spec.solver_url:
        mounts.append({"name": "solver-token", "mountPath": "/var/run/secrets/omtr/solver", "readOnly": True})
        volumes.append({"name": "solver-token", "secret": {"secretName": "omtr-solver-token", "defaultMode": 0o440}})
    return volumes, mounts


def _resources(gpus: int, cpu_per_gpu: int, memory_per_gpu_gi: int) -> dict:
    cpu, mem = cpu_per_gpu * gpus, memory_per_gpu_gi * gpus
    return {"requests": {"cpu": str(cpu), "memory": f"{mem}Gi", "nvidia.com/gpu": str(gpus)},
            "limits": {"cpu": str(cpu), "memory": f"{mem}Gi", "nvidia.com/gpu": str(gpus)}}


def _placement(spec: TrainJobSpec) -> tuple[dict, list[dict]]:
    """(affinity, tolerations): required node affinity to the GPU pool, its taint and the GPU taint tolerated."""
    key, _, value = spec.node_pool_label.partition("=")
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}]}}}
    tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                   {"key": key, "operator": "Equal", "value": value, "effect": "NoSchedule"}]
    return affinity, tolerations


def _pod_template(spec: TrainJobSpec) -> dict:
    run_volumes, run_mounts = _run_volumes(spec)
    mounts = [run_mounts[0], TMP_MOUNT, *run_mounts[1:]]  # dshm, tmp, checkpoints[, solver-token]
    volumes = [run_volumes[0], TMP_VOLUME, *run_volumes[1:]]
    affinity, tolerations = _placement(spec)
    container = {
        "name": "pytorch",  # the Training Operator finds the training container by this name
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", launch_script(spec)],
        "ports": [{"name": "pytorchjob-port", "containerPort": MASTER_PORT, "protocol": "TCP"}],
        "env": _env(spec),
        "resources": _resources(spec.gpus_per_node, spec.cpu_per_gpu, spec.memory_per_gpu_gi),
        "securityContext": copy.deepcopy(SECURITY_CONTEXT),
        "volumeMounts": copy.deepcopy(mounts),
    }
    return {
        "metadata": {"labels": _pod_labels(spec)},
        "spec": {
            "serviceAccountName": SERVICE_ACCOUNT,
            "automountServiceAccountToken": False,
            "securityContext": copy.deepcopy(POD_SECURITY_CONTEXT),
            "affinity": affinity,
            "tolerations": tolerations,
            "containers": [container],
            "volumes": copy.deepcopy(volumes),
        },
    }


def _job_metadata(spec: TrainJobSpec) -> dict:
    return {
        "name": spec.job_name,
        "namespace": spec.namespace,
        "labels": dict(OMTR_LABELS),
        "annotations": {"omtr.dev/profile": spec.profile, "omtr.dev/tasks": spec.tasks, "omtr.dev/out": spec.out},
    }


def build_pytorchjob(spec: TrainJobSpec) -> dict:
    """The PyTorchJob body for ``spec`` (validated: a TrainJobInvalid names the bad field)."""
    replica = {"restartPolicy": "OnFailure", "template": _pod_template(spec)}
    replicas = {"Master": {"replicas": 1, **copy.deepcopy(replica)}}
    if spec.nodes > 1:
        replicas["Worker"] = {"replicas": spec.nodes - 1, **copy.deepcopy(replica)}
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": _job_metadata(spec),
        "spec": {
            "runPolicy": {"backoffLimit": spec.backoff_limit, "cleanPodPolicy": "Running", "suspend": spec.suspend},
            "pytorchReplicaSpecs": replicas,
        },
    }
    validate_pytorchjob(body)
    return body


def build_trainjob(spec: TrainJobSpec) -> dict:
    """The Kubeflow Trainer v2 TrainJob body for ``spec``: the same run as :func:`build_pytorchjob`
    (image, torchrun over ``omtr train`` resuming from the last checkpoint, env, GPUs, pool
    placement, /dev/shm, the checkpoint claim) on the runtime ``spec.runtime`` (validated)."""
    volumes, mounts = _run_volumes(spec)
    affinity, tolerations = _placement(spec)
    body = {
        "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
        "kind": TRAINJOB_KIND,
        "metadata": _job_metadata(spec),
        "spec": {
            "runtimeRef": {"apiGroup": TRAINER_GROUP, "kind": spec.runtime_kind, "name": spec.runtime},
            "suspend": spec.suspend,
            "trainer": {
                "image": spec.image,
                "command": ["/bin/sh", "-c", launch_script(spec, "trainjob")],
                "env": _env(spec),
                "numNodes": spec.nodes,
                "numProcPerNode": spec.gpus_per_node,
                "resourcesPerNode": _resources(spec.gpus_per_node, spec.cpu_per_gpu, spec.memory_per_gpu_gi),
            },
            # Per-run pod settings for the runtime's `node` job. Env of the `node` container can only
            # come through spec.trainer (the Trainer refuses it here); its volume mounts can.
            "podTemplateOverrides": [{
                "targetJobs": [{"name": TRAINER_NODE}],
                "metadata": {"labels": _pod_labels(spec)},
                "spec": {
                    "affinity": affinity,
                    "tolerations": tolerations,
                    "volumes": volumes,
                    "containers": [{"name": TRAINER_NODE, "volumeMounts": mounts}],
                },
            }],
        },
    }
    validate_trainjob(body)
    return body


def build_job(spec: TrainJobSpec, kind: str = "pytorchjob") -> dict:
    """The job body of ``kind`` (pytorchjob or trainjob) for ``spec``, validated."""
    if kind == "pytorchjob":
        return build_pytorchjob(spec)
    if kind == "trainjob":
        return build_trainjob(spec)
    raise TrainJobError(f"kind must be one of {', '.join(JOB_KINDS)}, got {kind!r}")


def build_training_runtime(name: str = RUNTIME_NAME, *, image: str = "omtr-trainer-gpu:0.1.0",
                           kind: str = CLUSTER_RUNTIME_KIND, namespace: str = "omtr", backoff_limit: int = 10,
                           gpus_per_node: int = 8, cpu_per_gpu: int = 6, memory_per_gpu_gi: int = 60) -> dict:
    """The training runtime omtr's TrainJobs refer to: a torch runtime (the Trainer's torch plugin sets
    the PET_* rendezvous environment) with one replicated job ``node`` whose container ``node`` runs
    as omtr's non-root user with a read-only root filesystem and a /tmp volume, under the
    token-less service account; restarts in place (OnFailure), so a restarted pod resumes from its
    checkpoint. Image and resources are defaults that every TrainJob overrides (spec.trainer);
    placement, /dev/shm and the checkpoint claim come with each TrainJob. ``kind``
    ClusterTrainingRuntime (cluster-wide; ``namespace`` unused) or TrainingRuntime (in ``namespace``)."""
    if kind not in RUNTIME_KINDS:
        raise TrainJobError(f"kind must be one of {', '.join(RUNTIME_KINDS)}, got {kind!r}")
    metadata: dict = {"name": name, "labels": {**OMTR_LABELS, "trainer.kubeflow.org/framework": "torch"}}
    if kind == RUNTIME_KIND:
        metadata["namespace"] = namespace
    container = {
        "name": TRAINER_NODE,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "resources": _resources(gpus_per_node, cpu_per_gpu, memory_per_gpu_gi),
        "securityContext": copy.deepcopy(SECURITY_CONTEXT),
        "volumeMounts": [dict(TMP_MOUNT)],
    }
    pod = {
        "metadata": {"labels": dict(OMTR_LABELS)},
        "spec": {
            "serviceAccountName": SERVICE_ACCOUNT,
            "automountServiceAccountToken": False,
            "securityContext": copy.deepcopy(POD_SECURITY_CONTEXT),
            "restartPolicy": "OnFailure",
            "containers": [container],
            "volumes": [copy.deepcopy(TMP_VOLUME)],
        },
    }
    body = {
        "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
        "kind": kind,
        "metadata": metadata,
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {"spec": {"replicatedJobs": [{
                "name": TRAINER_NODE,
                "template": {
                    "metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
                    "spec": {"backoffLimit": backoff_limit, "template": pod},
                },
            }]}},
        },
    }
    validate_training_runtime(body)
    return body


# ---------------------------------------------------------------------------------- schema
@dataclass(frozen=True)
class Resource:
    """A custom resource omtr builds, with the pinned schema it is validated against."""

    group: str
    version: str
    kind: str
    plural: str
    schema_file: str
    namespaced: bool = True
    done: str = ""  # the condition type that means finished successfully
    operator: str = ""  # what serves it, for messages
    logs_label: str = ""  # the pod label that selects a job's pods

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


RESOURCES = {r.kind: r for r in (
    Resource(GROUP, VERSION, KIND, PLURAL, SCHEMA_FILE, done="Succeeded",
             operator="the Kubeflow Training Operator", logs_label="training.kubeflow.org/job-name"),
    Resource(TRAINER_GROUP, TRAINER_VERSION, TRAINJOB_KIND, TRAINJOB_PLURAL, TRAINJOB_SCHEMA_FILE, done="Complete",
             operator="Kubeflow Trainer v2", logs_label="jobset.sigs.k8s.io/jobset-name"),
    Resource(TRAINER_GROUP, TRAINER_VERSION, CLUSTER_RUNTIME_KIND, "clustertrainingruntimes", RUNTIME_SCHEMA_FILE,
             namespaced=False, operator="Kubeflow Trainer v2"),
    Resource(TRAINER_GROUP, TRAINER_VERSION, RUNTIME_KIND, "trainingruntimes", RUNTIME_SCHEMA_FILE,
             operator="Kubeflow Trainer v2"),
)}
# The CEL rules of the pinned schemas that JSON Schema cannot run and that concern a new object,
# checked by hand: (kind, what the rule says, check of the body).
_RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
CEL_RULES = (
    (TRAINJOB_KIND, "metadata.name must match RFC 1035 DNS label format",
     lambda b: bool(_RFC1035.match(str((b.get("metadata") or {}).get("name", ""))))),
    (TRAINJOB_KIND, "metadata.name must be no more than 63 characters",
     lambda b: len(str((b.get("metadata") or {}).get("name", ""))) <= 63),
)


def _strict(node: Any) -> Any:
    """Reject unknown fields where the schema allows nothing else: an object schema that lists
    properties, or lists none (the API server prunes, strict validation refuses, every field of it)."""
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if (("properties" in out or out.get("type") == "object") and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


def _resolve_markers(node: Any) -> Any:
    if isinstance(node, dict):
        if "x-omtr-kubernetes-definition" in node:
            return {"$ref": f"/api/_definitions.json#/$defs/{node['x-omtr-kubernetes-definition']}"}
        return {k: _resolve_markers(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve_markers(v) for v in node]
    return node


def vendored_schema(schema_file: str = SCHEMA_FILE) -> dict:
    """A pinned openAPIV3Schema as stored (see the file's header for its source); by default the PyTorchJob's."""
    import yaml

    text = resources.files("omtr").joinpath("data", "k8s", schema_file).read_text(encoding="utf-8")
    return yaml.safe_load(text)


@lru_cache(maxsize=16)
def _validator(k8s_version: str, kind: str = KIND):
    import jsonschema
    from kubernetes_validate.utils import schema_contents
    from referencing import Registry, Resource as RefResource

    res = RESOURCES[kind]
    schema = _resolve_markers(_strict(vendored_schema(res.schema_file)))
    schema["properties"]["metadata"] = {"$ref": "/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://kubernetes.io/api/{res.plural}.{res.group}/{res.version}"  # "/api/_definitions.json" resolves beside it
    version = [v for v in _k8s_versions() if _mm(v) <= _mm(k8s_version)]
    if not version:
        raise TrainJobError(f"Kubernetes {k8s_version} is older than every schema kubernetes-validate ships")
    defs = schema_contents(f"kubernetes-json-schema/v{version[-1]}-local-strict/_definitions.json", version[-1])
    registry = RefResource.from_contents(defs) @ Registry()
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _k8s_versions() -> list[str]:
    from kubernetes_validate.utils import all_versions

    return all_versions()


def _mm(v: str) -> tuple[int, int]:
    major, minor = v.lstrip("v").split(".")[:2]
    return int(major), int(minor)


def validate_custom_object(body: dict, k8s_version: str = DEFAULT_K8S_VERSION, *, kinds: tuple[str, ...] | None = None) -> None:
    """Raise TrainJobInvalid listing every place where ``body`` breaks its kind's pinned schema
    (strict: unknown fields are errors, embedded Kubernetes types such as the pod spec are checked
    against kubernetes-validate's strict schemas for ``k8s_version``). ``kinds``: the kinds accepted
    here (default: every kind of RESOURCES); any other kind, or a wrong apiVersion, is refused."""
    kind = body.get("kind")
    allowed = kinds or tuple(RESOURCES)
    if kind not in allowed:
        raise TrainJobInvalid(f"kind {kind!r} (apiVersion {body.get('apiVersion')!r}) is not one of "
                              f"{', '.join(allowed)}: no pinned schema for it")
    res = RESOURCES[kind]
    if body.get("apiVersion") != res.api_version:
        raise TrainJobInvalid(f"not a {kind} {res.api_version}: apiVersion={body.get('apiVersion')!r} kind={kind!r}")
    errors = sorted(_validator(k8s_version, kind).iter_errors(body), key=lambda e: list(e.absolute_path))
    lines = [f"  {'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors[:20]]
    cel = [f"  metadata.name: {message}" for k, message, ok in CEL_RULES if k == kind and not ok(body)]
    if errors or cel:
        raise TrainJobInvalid(f"{kind} {body.get('metadata', {}).get('name', '?')} does not match the pinned "
                              f"schema ({len(errors) + len(cel)} error(s)):\n" + "\n".join(lines + cel))


def validate_pytorchjob(body: dict, k8s_version: str = DEFAULT_K8S_VERSION) -> None:
    """Raise TrainJobInvalid listing every place where ``body`` breaks the pinned PyTorchJob schema
    (strict: unknown fields are errors, the pod template is checked as a core/v1 PodSpec)."""
    validate_custom_object(body, k8s_version, kinds=(KIND,))


def validate_trainjob(body: dict, k8s_version: str = DEFAULT_K8S_VERSION) -> None:
    """Raise TrainJobInvalid listing every place where ``body`` breaks the pinned TrainJob schema."""
    validate_custom_object(body, k8s_version, kinds=(TRAINJOB_KIND,))


def validate_training_runtime(body: dict, k8s_version: str = DEFAULT_K8S_VERSION) -> None:
    """Raise TrainJobInvalid listing every place where a ClusterTrainingRuntime or TrainingRuntime
    breaks the pinned runtime schema (its replicated jobs checked as batch/v1 JobSpecs)."""
    validate_custom_object(body, k8s_version, kinds=RUNTIME_KINDS)


# ---------------------------------------------------------------------------------- API server
def custom_objects_api():
    """A CustomObjectsApi from the in-cluster service account, else from the kubeconfig."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, FileNotFoundError) as exc:
            raise TrainJobError(f"no Kubernetes credentials: not in a pod and no usable kubeconfig ({exc}); "
                                "set KUBECONFIG or run inside the cluster") from None
    return client.CustomObjectsApi()


def _api_message(exc) -> str:
    """The API server's own sentence from an ApiException (a webhook's refusal, say), else ''."""
    try:
        return str(json.loads(exc.body or "{}").get("message", "")).strip()
    except (TypeError, ValueError, AttributeError):
        return ""


def create(body: dict, api) -> dict:
    """Create the job (a PyTorchJob or a TrainJob); when one of that name exists already (a retried
    pipeline step), keep it."""
    from kubernetes.client.exceptions import ApiException

    res = RESOURCES[body["kind"]]
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    try:
        created = api.create_namespaced_custom_object(res.group, res.version, ns, res.plural, body)
        log.info("created %s %s/%s", res.kind, ns, name)
        return created
    except ApiException as exc:
        if exc.status == 409:
            log.warning("%s %s/%s exists already: watching it instead of creating a new one "
                        "(delete it first to start over: kubectl -n %s delete %s %s)",
                        res.kind, ns, name, ns, res.kind.lower(), name)
            return api.get_namespaced_custom_object(res.group, res.version, ns, res.plural, name)
        if exc.status == 404:
            raise TrainJobError(f"the API server has no {res.plural}.{res.group}/{res.version} in namespace {ns}: install "
                                f"{res.operator} and create the namespace") from None
        if exc.status == 403:
            raise TrainJobError(f"forbidden to create {res.plural}.{res.group} in {ns}: grant this service account "
                                f"create/get on {res.plural} (Role omtr-trainjob-launcher in k8s/base/rbac.yaml)") from None
        if exc.status in (400, 422):
            hint = ""
            if res.kind == TRAINJOB_KIND:
                ref = body["spec"]["runtimeRef"]
                hint = (f"; check that {ref.get('kind', CLUSTER_RUNTIME_KIND)} {ref['name']} exists "
                        f"(kubectl apply -k k8s/overlays/gpu-cluster creates {CLUSTER_RUNTIME_KIND} {RUNTIME_NAME})")
            raise TrainJobError(f"the API server refused {res.kind} {ns}/{name}: HTTP {exc.status} "
                                f"{_api_message(exc) or exc.reason}{hint}") from None
        raise TrainJobError(f"creating {res.kind} {ns}/{name} failed: HTTP {exc.status} {exc.reason}") from None


def job_state(obj: dict, kind: str | None = None) -> tuple[str, str]:
    """(state, message) from the job's status conditions; ('Pending', '') before there are any.

    PyTorchJob: the last condition that is True (Created, Running, Restarting, Succeeded, Failed).
    TrainJob: its conditions are a map by type, not a history, so by precedence: Failed, then
    Complete, then Suspended, then Created (the JobSet exists: running)."""
    kind = kind or obj.get("kind") or KIND
    conds = [c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
    if not conds:
        return "Pending", ""
    if kind == TRAINJOB_KIND:
        by_type = {c.get("type"): c for c in conds}
        last = next((by_type[t] for t in ("Failed", "Complete", "Suspended", "Created") if t in by_type), conds[-1])
    else:
        last = conds[-1]
    return last.get("type", "Unknown"), f"{last.get('reason', '')}: {last.get('message', '')}".strip(": ")


def wait(api, namespace: str, name: str, *, timeout_s: float, poll_s: float = 15.0, kind: str = KIND,
         clock=time.monotonic, sleep=time.sleep) -> dict:
    """Poll the job until it finished (PyTorchJob: Succeeded; TrainJob: Complete); TrainJobFailed on
    Failed, TrainJobTimeout after ``timeout_s``."""
    res = RESOURCES[kind]
    deadline = clock() + timeout_s
    seen = None
    while True:
        obj = api.get_namespaced_custom_object(res.group, res.version, namespace, res.plural, name)
        state, message = job_state(obj, kind)
        if state != seen:
            log.info("%s %s/%s: %s %s", kind, namespace, name, state, message)
            seen = state
        if state == res.done:
            return obj
        if state == "Failed":
            raise TrainJobFailed(f"{kind} {namespace}/{name} failed ({message or 'no message'}); see "
                                 f"kubectl -n {namespace} logs -l {res.logs_label}={name} --tail=200")
        if clock() >= deadline:
            raise TrainJobTimeout(f"{kind} {namespace}/{name} did not finish within {timeout_s:.0f} s (state {state}); "
                                  f"it keeps running: watch it with kubectl -n {namespace} get {kind.lower()} {name}, or "
                                  "delete it")
        sleep(min(poll_s, max(0.0, deadline - clock())))


def to_yaml(body: dict) -> str:
    import yaml

    return yaml.safe_dump(json.loads(json.dumps(body)), sort_keys=False, default_flow_style=False)
