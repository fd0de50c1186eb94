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
"""

from __future__ import annotations

import copy
import json
import logging
import shlex
import time
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL, KIND = "kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"
SCHEMA_FILE = "kubeflow.org_pytorchjobs.v1.schema.yaml"
DEFAULT_K8S_VERSION = "1.31"
UID = 10001  # the images' user (docker/*.Dockerfile) and every manifest's runAsUser
MASTER_PORT = 23456


class TrainJobError(RuntimeError):
    """The job could not be built, created or finished; the message says what to do."""


class TrainJobInvalid(TrainJobError):
    """The body does not match the PyTorchJob schema."""


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
    backoff_limit: int = 10

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

    @property
    def shm_size_gi(self) -> int:
        return self.shm_gi or max(1, min(64, self.memory_per_gpu_gi * self.gpus_per_node // 4))

    @property
    def job_name(self) -> str:
        return self.name or f"omtr-train-{self.profile}"


def launch_script(spec: TrainJobSpec) -> str:
    """The shell command every pod runs: torchrun over ``omtr train``, resuming when a checkpoint exists."""
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
        '--node_rank="${PET_NODE_RANK:-$RANK}" --master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" '
        f'-m omtr train --tasks {q(spec.tasks)} --out {q(out)} "$@"',
    ])


def _pod_template(spec: TrainJobSpec) -> dict:
    key, _, value = spec.node_pool_label.partition("=")
    labels = {"app.kubernetes.io/name": "omtr", "app.kubernetes.io/component": "trainer",
              "app.kubernetes.io/part-of": "omtr", "omtr.dev/run": spec.job_name}
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
    mounts = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "checkpoints", "mountPath": spec.checkpoint_mount},
    ]
    volumes = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{spec.shm_size_gi}Gi"}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "50Gi"}},
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": spec.checkpoint_pvc}},
    ]
    if spec.solver_url:
        env += [{"name": "OMTR_SOLVER_URL", "value": spec.solver_url},
                {"name": "OMTR_SOLVER_TOKEN_FILE", "value": "/var/run/secrets/omtr/solver/token"}]
        mounts.append({"name": "solver-token", "mountPath": "/var/run/secrets/omtr/solver", "readOnly": True})
        volumes.append({"name": "solver-token", "secret": {"secretName": "omtr-solver-token", "defaultMode": 0o440}})
    gpus, cpu, mem = spec.gpus_per_node, spec.cpu_per_gpu * spec.gpus_per_node, spec.memory_per_gpu_gi * spec.gpus_per_node
    container = {
        "name": "pytorch",  # the Training Operator finds the training container by this name
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", launch_script(spec)],
        "ports": [{"name": "pytorchjob-port", "containerPort": MASTER_PORT, "protocol": "TCP"}],
        "env": env,
        "resources": {
            "requests": {"cpu": str(cpu), "memory": f"{mem}Gi", "nvidia.com/gpu": str(gpus)},
            "limits": {"cpu": str(cpu), "memory": f"{mem}Gi", "nvidia.com/gpu": str(gpus)},
        },
        "securityContext": {
            "runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": mounts,
    }
    return {
        "metadata": {"labels": labels},
        "spec": {
            "serviceAccountName": "omtr-workload",
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "fsGroup": UID,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}]}}},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": key, "operator": "Equal", "value": value, "effect": "NoSchedule"},
            ],
            "containers": [container],
            "volumes": volumes,
        },
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
        "metadata": {
            "name": spec.job_name,
            "namespace": spec.namespace,
            "labels": {"app.kubernetes.io/name": "omtr", "app.kubernetes.io/component": "trainer",
                       "app.kubernetes.io/part-of": "omtr"},
            "annotations": {"omtr.dev/profile": spec.profile, "omtr.dev/tasks": spec.tasks, "omtr.dev/out": spec.out},
        },
        "spec": {
            "runPolicy": {"backoffLimit": spec.backoff_limit, "cleanPodPolicy": "Running", "suspend": spec.suspend},
            "pytorchReplicaSpecs": replicas,
        },
    }
    validate_pytorchjob(body)
    return body


# ---------------------------------------------------------------------------------- schema
def _strict(node: Any) -> Any:
    """Reject unknown fields where the schema lists properties and allows nothing else."""
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if ("properties" in out and "additionalProperties" not in out
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


def vendored_schema() -> dict:
    """The pinned PyTorchJob openAPIV3Schema as stored (see the file's header for its source)."""
    import yaml

    text = resources.files("omtr").joinpath("data", "k8s", SCHEMA_FILE).read_text(encoding="utf-8")
    return yaml.safe_load(text)


@lru_cache(maxsize=4)
def _validator(k8s_version: str):
    import jsonschema
    from kubernetes_validate.utils import schema_contents
    from referencing import Registry, Resource

    schema = _resolve_markers(_strict(vendored_schema()))
    schema["properties"]["metadata"] = {"$ref": "/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://kubernetes.io/api/{PLURAL}.{GROUP}/{VERSION}"  # "/api/_definitions.json" resolves beside it
    version = [v for v in _k8s_versions() if _mm(v) <= _mm(k8s_version)]
    if not version:
        raise TrainJobError(f"Kubernetes {k8s_version} is older than every schema kubernetes-validate ships")
    defs = schema_contents(f"kubernetes-json-schema/v{version[-1]}-local-strict/_definitions.json", version[-1])
    registry = Resource.from_contents(defs) @ Registry()
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _k8s_versions() -> list[str]:
    from kubernetes_validate.utils import all_versions

    return all_versions()


def _mm(v: str) -> tuple[int, int]:
    major, minor = v.lstrip("v").split(".")[:2]
    return int(major), int(minor)


def validate_pytorchjob(body: dict, k8s_version: str = DEFAULT_K8S_VERSION) -> None:
    """Raise TrainJobInvalid listing every place where ``body`` breaks the pinned schema
    (strict: unknown fields are errors, the pod template is checked as a core/v1 PodSpec)."""
    errors = sorted(_validator(k8s_version).iter_errors(body), key=lambda e: list(e.absolute_path))
    if body.get("apiVersion") != f"{GROUP}/{VERSION}" or body.get("kind") != KIND:
        raise TrainJobInvalid(f"not a {KIND} {GROUP}/{VERSION}: apiVersion={body.get('apiVersion')!r} kind={body.get('kind')!r}")
    if errors:
        lines = [f"  {'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors[:20]]
        raise TrainJobInvalid(f"{KIND} {body.get('metadata', {}).get('name', '?')} does not match the pinned "
                              f"schema ({len(errors)} error(s)):\n" + "\n".join(lines))


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


def create(body: dict, api) -> dict:
    """Create the job; when one of that name exists already (a retried pipeline step), keep it."""
    from kubernetes.client.exceptions import ApiException

    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    try:
        created = api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
        log.info("created %s %s/%s", KIND, ns, name)
        return created
    except ApiException as exc:
        if exc.status == 409:
            log.warning("%s %s/%s exists already: watching it instead of creating a new one "
                        "(delete it first to start over: kubectl -n %s delete pytorchjob %s)", KIND, ns, name, ns, name)
            return api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
        if exc.status == 404:
            raise TrainJobError(f"the API server has no {PLURAL}.{GROUP}/{VERSION} in namespace {ns}: install the "
                                "Kubeflow Training Operator and create the namespace") from None
        if exc.status == 403:
            raise TrainJobError(f"forbidden to create {PLURAL}.{GROUP} in {ns}: grant this service account "
                                "create/get on pytorchjobs") from None
        raise TrainJobError(f"creating {KIND} {ns}/{name} failed: HTTP {exc.status} {exc.reason}") from None


def job_state(obj: dict) -> tuple[str, str]:
    """(state, message) from the job's status: the last condition that is True, or ('Pending', '')."""
    conds = [c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
    if not conds:
        return "Pending", ""
    last = conds[-1]
    return last.get("type", "Unknown"), f"{last.get('reason', '')}: {last.get('message', '')}".strip(": ")


def wait(api, namespace: str, name: str, *, timeout_s: float, poll_s: float = 15.0,
         clock=time.monotonic, sleep=time.sleep) -> dict:
    """Poll the job until Succeeded; TrainJobFailed on Failed, TrainJobTimeout after ``timeout_s``."""
    deadline = clock() + timeout_s
    seen = None
    while True:
        obj = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        state, message = job_state(obj)
        if state != seen:
            log.info("%s %s/%s: %s %s", KIND, namespace, name, state, message)
            seen = state
        if state == "Succeeded":
            return obj
        if state == "Failed":
            raise TrainJobFailed(f"{KIND} {namespace}/{name} failed ({message or 'no message'}); see "
                                 f"kubectl -n {namespace} logs -l training.kubeflow.org/job-name={name} --tail=200")
        if clock() >= deadline:
            raise TrainJobTimeout(f"{KIND} {namespace}/{name} did not finish within {timeout_s:.0f} s (state {state}); "
                                  f"it keeps running: watch it with kubectl -n {namespace} get pytorchjob {name}, or "
                                  "delete it")
        sleep(min(poll_s, max(0.0, deadline - clock())))


def to_yaml(body: dict) -> str:
    import yaml

    return yaml.safe_dump(json.loads(json.dumps(body)), sort_keys=False, default_flow_style=False)
