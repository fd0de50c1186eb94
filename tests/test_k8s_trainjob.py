"""The multi-node training job (omtr.k8s.trainjob, `omtr k8s train-job`), as a Kubeflow Training
Operator PyTorchJob and as a Kubeflow Trainer v2 TrainJob with its ClusterTrainingRuntime: the
bodies, their strict validation against the pinned CRD schemas, the launch script (run for real
under /bin/sh with a stand-in torchrun), and create/watch.

No Kubernetes API server can run on these machines: create and watch are tested against
FakeCustomObjectsApi below, a fake of kubernetes.client.CustomObjectsApi that stores the created
object and plays back a list of job statuses; ApiException is the real client's exception. Nor can
Kubeflow Trainer run here: what it makes of a TrainJob and its runtime (the pod) is modelled by
effective_pod below, from the Trainer's documented override rules, and compared with the PyTorchJob's pod."""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from omtr.cli import main
from omtr.k8s import trainjob
from omtr.k8s.trainjob import (
    TrainJobError, TrainJobFailed, TrainJobInvalid, TrainJobSpec, TrainJobTimeout, build_pytorchjob, build_trainjob,
    build_training_runtime, validate_custom_object, validate_pytorchjob, validate_trainjob, validate_training_runtime,
)

ROOT = Path(__file__).resolve().parents[1]
SPEC = TrainJobSpec(image="reg.example/omtr-trainer-gpu:0.1.0", tasks="/checkpoints/tasks/train.jsonl",
                    out="/checkpoints/runs/paper-1", nodes=3, gpus_per_node=8, namespace="omtr",
                    mlflow_uri="http://omtr-mlflow:5000")


def pods(body):
    return {r: s["template"]["spec"] for r, s in body["spec"]["pytorchReplicaSpecs"].items()}


def test_body_has_master_workers_gpus_shm_checkpoints_and_pool_placement():
    body = build_pytorchjob(SPEC)
    reps = body["spec"]["pytorchReplicaSpecs"]
    assert body["apiVersion"] == "kubeflow.org/v1" and body["kind"] == "PyTorchJob"
    assert body["metadata"] == {**body["metadata"], "name": "omtr-train-paper", "namespace": "omtr"}
    assert reps["Master"]["replicas"] == 1 and reps["Worker"]["replicas"] == 2
    for name, pod in pods(body).items():
        assert reps[name]["restartPolicy"] == "OnFailure"
        (c,) = pod["containers"]
        assert c["name"] == "pytorch" and c["ports"] == [{"name": "pytorchjob-port", "containerPort": 23456, "protocol": "TCP"}]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == c["resources"]["requests"]["nvidia.com/gpu"] == "8"
        vols = {v["name"]: v for v in pod["volumes"]}
        assert vols["dshm"]["emptyDir"]["medium"] == "Memory"
        assert vols["checkpoints"]["persistentVolumeClaim"]["claimName"] == "omtr-checkpoints"
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert mounts["dshm"] == "/dev/shm" and mounts["checkpoints"] == "/checkpoints"
        expr = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"]
        assert expr == [{"key": "omtr.dev/pool", "operator": "In", "values": ["a100"]}]
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["MLFLOW_TRACKING_URI"] == "http://omtr-mlflow:5000" and env["OMTR_SOLVER_URL"] == "http://omtr-solver:8600"
        assert pod["securityContext"]["runAsUser"] == trainjob.UID and c["securityContext"]["readOnlyRootFilesystem"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert "--nnodes=3 --nproc_per_node=8" in c["command"][-1]
    one = build_pytorchjob(TrainJobSpec(image="i:1", tasks="/checkpoints/t.jsonl", out="/checkpoints/r", nodes=1, gpus_per_node=1))
    assert set(one["spec"]["pytorchReplicaSpecs"]) == {"Master"}


def test_validation_is_strict():
    body = build_pytorchjob(SPEC)
    for path, value, field in [
        (("spec",), {"runPolicyy": {}}, "runPolicyy"),
        (("spec", "runPolicy"), {"backoffLimitt": 1}, "backoffLimitt"),
        (("spec", "pytorchReplicaSpecs", "Worker"), {"replicaz": 1}, "replicaz"),
        (("spec", "pytorchReplicaSpecs", "Worker", "template", "spec"), {"tolerationz": []}, "tolerationz"),
        (("metadata",), {"lables": {}}, "lables"),
    ]:
        bad = copy.deepcopy(body)
        node = bad
        for key in path:
            node = node[key]
        node.update(value)
        with pytest.raises(TrainJobInvalid, match=field):
            validate_pytorchjob(bad)
    bad = copy.deepcopy(body)
    bad["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "two"
    with pytest.raises(TrainJobInvalid, match="replicas"):
        validate_pytorchjob(bad)
    bad = copy.deepcopy(body)
    bad["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = [1]
    with pytest.raises(TrainJobInvalid, match="cpu"):
        validate_pytorchjob(bad)
    bad = copy.deepcopy(body)
    del bad["spec"]["pytorchReplicaSpecs"]
    with pytest.raises(TrainJobInvalid, match="pytorchReplicaSpecs"):
        validate_pytorchjob(bad)


def test_vendored_schema_names_its_source_and_commit():
    text = (ROOT / "src" / "omtr" / "data" / "k8s" / trainjob.SCHEMA_FILE).read_text()
    assert "kubeflow/training-operator" in text and "manifests/base/crds/kubeflow.org_pytorchjobs.yaml" in text
    assert "c20bf65e03b85543c0b2ff25b14c7e335cce34f9" in text
    schema = trainjob.vendored_schema()
    spec = schema["properties"]["spec"]["properties"]
    assert {"elasticPolicy", "nprocPerNode", "pytorchReplicaSpecs", "runPolicy"} == set(spec)
    replica = spec["pytorchReplicaSpecs"]["additionalProperties"]["properties"]
    assert set(replica) == {"replicas", "restartPolicy", "template"}


@pytest.mark.parametrize("kw, message", [
    ({"nodes": 0}, "nodes"), ({"gpus_per_node": 0}, "gpus_per_node"), ({"tasks": "t.jsonl"}, "absolute"),
    ({"out": "/elsewhere/run"}, "checkpoint volume"), ({"node_pool_label": "a100"}, "KEY=VALUE"), ({"image": ""}, "image"),
])
def test_bad_parameters_are_refused_with_a_reason(kw, message):
    args = {"image": "i:1", "tasks": "/checkpoints/t.jsonl", "out": "/checkpoints/r", **kw}
    with pytest.raises(TrainJobError, match=message):
        TrainJobSpec(**args)


def _run_launch(tmp_path, spec):
    """Run the pod's command under /bin/sh with a torchrun that records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "torchrun"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done > "$RECORD"\n')
    fake.chmod(0o755)
    record = tmp_path / "argv.txt"
    command = build_pytorchjob(spec)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"]
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD": str(record), "RANK": "2",
           "MASTER_ADDR": "omtr-train-paper-master-0", "MASTER_PORT": "23456"}
    subprocess.run(command, env=env, check=True, timeout=30)
    return record.read_text().split("\n")[:-1]


def test_launch_starts_fresh_then_resumes_from_the_last_checkpoint(tmp_path):
    mount = tmp_path / "ckpt"
    spec = TrainJobSpec(image="i:1", tasks=f"{mount}/tasks/t.jsonl", out=f"{mount}/runs/r1", nodes=2,
                        gpus_per_node=4, checkpoint_mount=str(mount))
    argv = _run_launch(tmp_path, spec)
    assert argv[:5] == ["--nnodes=2", "--nproc_per_node=4", "--node_rank=2", "--master_addr=omtr-train-paper-master-0",
                        "--master_port=23456"]
    assert argv[5:] == ["-m", "omtr", "train", "--tasks", f"{mount}/tasks/t.jsonl", "--out", f"{mount}/runs/r1",
                        "--profile", "paper", "--set", "deepspeed=/opt/omtr/configs/deepspeed/zero2_bf16.json"]
    (mount / "runs" / "r1" / "checkpoints").mkdir(parents=True)
    (mount / "runs" / "r1" / "checkpoints" / "latest").write_text("update-000004")
    argv = _run_launch(tmp_path, spec)
    assert argv[5:] == ["-m", "omtr", "train", "--tasks", f"{mount}/tasks/t.jsonl", "--out", f"{mount}/runs/r1", "--resume"]


def test_committed_gpu_cluster_job_is_current():
    committed = yaml.safe_load((ROOT / "k8s" / "overlays" / "gpu-cluster" / "pytorchjob-paper.yaml").read_text())
    expected = build_pytorchjob(TrainJobSpec(image="omtr-trainer-gpu:0.1.0", profile="paper", tasks="/checkpoints/tasks/train.jsonl",
                                             out="/checkpoints/runs/paper", nodes=2, gpus_per_node=8, namespace="omtr", suspend=True))
    assert committed == expected, "regenerate k8s/overlays/gpu-cluster/pytorchjob-paper.yaml (command in its header)"


# ------------------------------------------------------------------------------ create and watch
class FakeCustomObjectsApi:
    """Stands in for kubernetes.client.CustomObjectsApi (no API server here): create stores the
    body, get returns it with the next status of `statuses` (the last one repeats)."""

    def __init__(self, statuses=(), create_error=None):
        self.objects: dict[tuple, dict] = {}
        self.statuses = list(statuses)
        self.create_error = create_error
        self.calls: list[tuple] = []

    def create_namespaced_custom_object(self, group, version, namespace, plural, body):
        self.calls.append(("create", group, version, namespace, plural))
        if self.create_error:
            raise self.create_error
        key = (group, version, namespace, plural, body["metadata"]["name"])
        self.objects[key] = copy.deepcopy(body)
        return body

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        self.calls.append(("get", group, version, namespace, plural, name))
        obj = copy.deepcopy(self.objects[(group, version, namespace, plural, name)])
        if self.statuses:
            obj["status"] = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return obj


def cond(*types, failed_message=None):
    out = [{"type": t, "status": "False" if i < len(types) - 1 else "True", "reason": f"PyTorchJob{t}",
            "message": failed_message if t == "Failed" and failed_message else f"job is {t.lower()}"}
           for i, t in enumerate(types)]
    return {"conditions": out}


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def test_create_then_watch_to_success():
    api = FakeCustomObjectsApi([{}, cond("Created"), cond("Created", "Running"), cond("Created", "Running", "Succeeded")])
    body = build_pytorchjob(SPEC)
    trainjob.create(body, api)
    assert api.calls[0] == ("create", "kubeflow.org", "v1", "omtr", "pytorchjobs")
    clock = Clock()
    done = trainjob.wait(api, "omtr", "omtr-train-paper", timeout_s=3600, poll_s=10, clock=clock, sleep=clock.sleep)
    assert trainjob.job_state(done)[0] == "Succeeded" and clock.t == 30


def test_watch_reports_failure_with_the_operator_message():
    api = FakeCustomObjectsApi([cond("Created", "Running"), cond("Created", "Running", "Failed", failed_message="Master exited 1")])
    trainjob.create(build_pytorchjob(SPEC), api)
    clock = Clock()
    with pytest.raises(TrainJobFailed, match="Master exited 1.*kubectl -n omtr logs"):
        trainjob.wait(api, "omtr", "omtr-train-paper", timeout_s=3600, poll_s=5, clock=clock, sleep=clock.sleep)


def test_watch_times_out():
    api = FakeCustomObjectsApi([cond("Created", "Running")])
    trainjob.create(build_pytorchjob(SPEC), api)
    clock = Clock()
    with pytest.raises(TrainJobTimeout, match="within 100 s"):
        trainjob.wait(api, "omtr", "omtr-train-paper", timeout_s=100, poll_s=30, clock=clock, sleep=clock.sleep)
    assert clock.t == 100


def test_an_existing_job_is_watched_not_recreated_and_other_errors_say_what_to_do():
    api = FakeCustomObjectsApi([cond("Created", "Running", "Succeeded")], create_error=ApiException(status=409, reason="AlreadyExists"))
    body = build_pytorchjob(SPEC)
    api.objects[("kubeflow.org", "v1", "omtr", "pytorchjobs", "omtr-train-paper")] = body
    assert trainjob.create(body, api)["metadata"]["name"] == "omtr-train-paper"
    assert api.calls[-1][0] == "get"
    for status, message in ((404, "install the Kubeflow Training Operator"), (403, "grant"), (500, "HTTP 500")):
        with pytest.raises(TrainJobError, match=message):
            trainjob.create(body, FakeCustomObjectsApi(create_error=ApiException(status=status, reason="x")))


# ------------------------------------------------------------------------------ the command line
ARGS = ["k8s", "train-job", "--image", "reg/omtr-trainer-gpu:0.1.0", "--profile", "paper", "--tasks",
        "/checkpoints/tasks/train.jsonl", "--out", "/checkpoints/runs/p", "--nodes", "2", "--gpus-per-node", "8",
        "--namespace", "omtr", "--mlflow-uri", "http://omtr-mlflow:5000"]


def test_cli_dry_run_prints_the_validated_body(capsys):
    assert main([*ARGS, "--dry-run"]) == 0
    body = yaml.safe_load(capsys.readouterr().out)
    validate_pytorchjob(body)
    assert body["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1


def test_cli_creates_and_waits_through_the_client(monkeypatch, capsys):
    api = FakeCustomObjectsApi([cond("Created", "Running", "Succeeded")])
    monkeypatch.setattr(trainjob, "custom_objects_api", lambda: api)
    assert main([*ARGS, "--wait", "--timeout", "60", "--poll", "0"]) == 0
    assert "Succeeded" in capsys.readouterr().out
    api = FakeCustomObjectsApi([cond("Created", "Failed")])
    monkeypatch.setattr(trainjob, "custom_objects_api", lambda: api)
    assert main([*ARGS, "--wait", "--timeout", "60", "--poll", "0"]) == 1
    assert "failed" in capsys.readouterr().err


def test_cli_usage_errors_and_help(capsys):
    assert main([*ARGS[:-6], "--nodes", "0", "--dry-run"]) == 2
    assert "nodes must be at least 1" in capsys.readouterr().err
    for argv in (["k8s", "--help"], ["k8s", "train-job", "--help"], ["k8s", "render", "--help"], ["k8s", "validate", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        assert "examples:" in capsys.readouterr().out


def test_cli_render_and_validate(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "dev.yaml"
    assert main(["k8s", "render", "dev", "--out", str(out)]) == 0
    objs = list(yaml.safe_load_all(out.read_text()))
    assert any(o["kind"] == "Deployment" and o["metadata"]["name"] == "omtr-serving" for o in objs)
    assert main(["k8s", "validate"]) == 0
    text = capsys.readouterr().out
    assert "dev: " in text and "gpu-cluster: " in text and "0 invalid" in text
    assert main(["k8s", "render", "nowhere"]) == 2


# ============================================================================== Kubeflow Trainer v2
def effective_pod(tj: dict, runtime: dict) -> dict:
    """The pod template Kubeflow Trainer builds for the TrainJob's `node` job from the runtime, as far
    as omtr uses the API: spec.trainer's image, command and resourcesPerNode replace the runtime
    container's, its env is added to it; the override (targetJobs [node]) adds its labels, its
    volumes and the container's volumeMounts (merged by name: none of them is in the runtime) and
    sets affinity and tolerations."""
    (rj,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert rj["name"] == trainjob.TRAINER_NODE and rj["template"]["metadata"]["labels"][trainjob.ANCESTOR_LABEL] == "trainer"
    pod = copy.deepcopy(rj["template"]["spec"]["template"])
    (c,) = pod["spec"]["containers"]
    assert c["name"] == trainjob.TRAINER_NODE
    tr = tj["spec"]["trainer"]
    c.update(image=tr["image"], command=tr["command"], resources=tr["resourcesPerNode"], env=c.get("env", []) + tr["env"])
    (ov,) = tj["spec"]["podTemplateOverrides"]
    assert ov["targetJobs"] == [{"name": trainjob.TRAINER_NODE}]
    pod["metadata"]["labels"].update(ov["metadata"]["labels"])
    o = ov["spec"]
    assert not {v["name"] for v in pod["spec"]["volumes"]} & {v["name"] for v in o["volumes"]}
    pod["spec"].update(affinity=o["affinity"], tolerations=pod["spec"].get("tolerations", []) + o["tolerations"],
                       volumes=pod["spec"]["volumes"] + o["volumes"])
    (co,) = o["containers"]
    assert co["name"] == c["name"] and set(co) == {"name", "volumeMounts"}  # env of `node` only via spec.trainer
    c["volumeMounts"] = c["volumeMounts"] + co["volumeMounts"]
    return pod


def _by_name(items):
    return sorted(items, key=lambda x: x["name"])


@pytest.mark.parametrize("spec", [SPEC, TrainJobSpec(image="i:1", tasks="/checkpoints/t.jsonl", out="/checkpoints/r", nodes=1,
                                                     gpus_per_node=2, solver_url=None, mlflow_uri=None,
                                                     node_pool_label="pool=h100", shm_gi=20, checkpoint_pvc="ck")])
def test_trainjob_is_the_same_run_as_the_pytorchjob(spec):
    import kubernetes_validate

    tj, pj = build_trainjob(spec), build_pytorchjob(spec)
    assert tj["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and tj["kind"] == "TrainJob"
    assert tj["metadata"] == pj["metadata"]
    assert tj["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                        "name": "omtr-torch-distributed"}
    assert tj["spec"]["trainer"]["numNodes"] == spec.nodes and tj["spec"]["trainer"]["numProcPerNode"] == spec.gpus_per_node
    assert tj["spec"]["suspend"] is False

    runtime = build_training_runtime(image="ignored:0")
    pod = effective_pod(tj, runtime)
    want = pj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    assert pod["metadata"]["labels"] == want["metadata"]["labels"]
    for key in ("serviceAccountName", "automountServiceAccountToken", "securityContext", "affinity", "tolerations"):
        assert pod["spec"][key] == want["spec"][key], key
    assert _by_name(pod["spec"]["volumes"]) == _by_name(want["spec"]["volumes"])
    assert pod["spec"]["restartPolicy"] == pj["spec"]["pytorchReplicaSpecs"]["Master"]["restartPolicy"] == "OnFailure"
    (c,), (w,) = pod["spec"]["containers"], want["spec"]["containers"]
    for key in ("image", "imagePullPolicy", "env", "resources", "securityContext"):
        assert c[key] == w[key], key
    assert _by_name(c["volumeMounts"]) == _by_name(w["volumeMounts"])
    # the same command, reading the rendezvous from the Trainer's PET_* variables
    assert c["command"][:2] == w["command"][:2] == ["/bin/sh", "-c"]
    assert c["command"][2] == w["command"][2].replace(trainjob.RENDEZVOUS["pytorchjob"], trainjob.RENDEZVOUS["trainjob"])
    assert '"$PET_MASTER_ADDR"' in c["command"][2] and "$RANK" not in c["command"][2]
    # and the pod Kubernetes gets is a valid pod
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": pod["metadata"]["labels"]},
                                  "spec": pod["spec"]}, trainjob.DEFAULT_K8S_VERSION, strict=True)


def test_trainjob_on_another_runtime_and_suspended():
    tj = build_trainjob(TrainJobSpec(image="i:1", tasks="/checkpoints/t.jsonl", out="/checkpoints/r", runtime="mine",
                                     runtime_kind="TrainingRuntime", suspend=True))
    assert tj["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime", "name": "mine"}
    assert tj["spec"]["suspend"] is True
    with pytest.raises(TrainJobError, match="runtime_kind"):
        TrainJobSpec(image="i:1", tasks="/checkpoints/t.jsonl", out="/checkpoints/r", runtime_kind="Runtime")
    with pytest.raises(TrainJobError, match="kind must be one of pytorchjob, trainjob"):
        trainjob.build_job(SPEC, "mpijob")


def _mutated(body, path, update):
    bad = copy.deepcopy(body)
    node = bad
    for key in path:
        node = node[key]
    node.update(update)
    return bad


def test_trainjob_validation_is_strict():
    body = build_trainjob(SPEC)
    validate_trainjob(body)
    ov = ("spec", "podTemplateOverrides", 0, "spec")
    for path, value, field in [
        (("spec",), {"runtimeReff": {}}, "runtimeReff"),
        (("spec", "runtimeRef"), {"nam": "x"}, "nam"),
        (("spec", "trainer"), {"numNode": 2}, "numNode"),
        (("spec", "trainer", "env", 0), {"valu": "1"}, "valu"),
        (("spec", "trainer", "resourcesPerNode"), {"limit": {}}, "limit"),
        (ov, {"tolerationz": []}, "tolerationz"),
        ((*ov, "volumes", 0), {"emptyDirr": {}}, "emptyDirr"),
        ((*ov, "containers", 0), {"volumeMount": []}, "volumeMount"),
        ((*ov, "affinity", "nodeAffinity"), {"requiredDuringScheduling": {}}, "requiredDuringScheduling"),
        (("spec", "podTemplateOverrides", 0), {"targetJob": []}, "targetJob"),
        (("metadata",), {"lables": {}}, "lables"),
    ]:
        with pytest.raises(TrainJobInvalid, match=field):
            validate_trainjob(_mutated(body, path, value))
    for path, value, field in [
        (("spec", "trainer"), {"numNodes": "two"}, "numNodes"),
        (("spec",), {"suspend": "yes"}, "suspend"),
        (("spec", "trainer"), {"command": "/bin/sh -c x"}, "command"),
        (("spec", "trainer", "resourcesPerNode", "limits"), {"cpu": [1]}, "cpu"),
        (("spec", "runtimeRef"), {"name": ""}, "name"),
    ]:
        with pytest.raises(TrainJobInvalid, match=field):
            validate_trainjob(_mutated(body, path, value))
    bad = copy.deepcopy(body)
    del bad["spec"]["runtimeRef"]
    with pytest.raises(TrainJobInvalid, match="runtimeRef"):
        validate_trainjob(bad)
    bad = copy.deepcopy(body)
    del bad["spec"]["podTemplateOverrides"][0]["targetJobs"]
    with pytest.raises(TrainJobInvalid, match="targetJobs"):
        validate_trainjob(bad)
    # the CEL rules on the name, checked by hand
    with pytest.raises(TrainJobInvalid, match="RFC 1035"):
        validate_trainjob(_mutated(body, ("metadata",), {"name": "9-omtr"}))
    with pytest.raises(TrainJobInvalid, match="63 characters"):
        validate_trainjob(_mutated(body, ("metadata",), {"name": "omtr-" + "x" * 60}))
    # an unknown kind, or the right kind at the wrong API version, has no schema here
    for kind, api_version in (("TrainJobs", "trainer.kubeflow.org/v1alpha1"), ("MPIJob", "kubeflow.org/v1"),
                              ("TrainJob", "kubeflow.org/v1"), ("PyTorchJob", "kubeflow.org/v1")):
        with pytest.raises(TrainJobInvalid, match="not a TrainJob|not one of"):
            validate_trainjob({**body, "kind": kind, "apiVersion": api_version})
    with pytest.raises(TrainJobInvalid, match="no pinned schema"):
        validate_custom_object({**body, "kind": "OptimizationJob"})
    with pytest.raises(TrainJobInvalid, match="not one of PyTorchJob"):
        validate_pytorchjob(body)


def test_training_runtime_validates_strictly():
    cluster = build_training_runtime()
    validate_training_runtime(cluster)
    assert cluster["kind"] == "ClusterTrainingRuntime" and "namespace" not in cluster["metadata"]
    assert cluster["spec"]["mlPolicy"] == {"numNodes": 1, "torch": {}}
    ns = build_training_runtime(kind="TrainingRuntime", namespace="team-a")
    validate_training_runtime(ns)
    assert ns["metadata"]["namespace"] == "team-a"
    job = ("spec", "template", "spec", "replicatedJobs", 0, "template", "spec")
    for path, value, field in [
        (("spec",), {"mlPolicyy": {}}, "mlPolicyy"),
        (("spec", "mlPolicy", "torch"), {"numProcPerNode": "auto"}, "numProcPerNode"),  # not in the pinned version
        (("spec", "mlPolicy"), {"jax": {"x": 1}}, "'x'"),  # a property-less object accepts only {}
        (("spec", "template", "spec"), {"replicatedJob": []}, "replicatedJob"),
        (job, {"backofLimit": 1}, "backofLimit"),
        ((*job, "template", "spec", "containers", 0), {"imagePullPolicyy": "x"}, "imagePullPolicyy"),
    ]:
        with pytest.raises(TrainJobInvalid, match=field):
            validate_training_runtime(_mutated(cluster, path, value))
    for path, value, field in [
        ((*job,), {"backoffLimit": "ten"}, "backoffLimit"),
        (("spec", "mlPolicy"), {"numNodes": "1"}, "numNodes"),
        (("spec", "template", "spec", "replicatedJobs", 0), {"replicas": 1.5}, "replicas"),
    ]:
        with pytest.raises(TrainJobInvalid, match=field):
            validate_training_runtime(_mutated(cluster, path, value))
    with pytest.raises(TrainJobInvalid, match="not one of ClusterTrainingRuntime, TrainingRuntime"):
        validate_training_runtime({**cluster, "kind": "ClusterTrainingRuntimes"})
    with pytest.raises(TrainJobError, match="kind must be one of"):
        build_training_runtime(kind="Runtime")


def test_vendored_trainer_schemas_name_their_source_and_commit():
    for schema_file, path, commit in (
        (trainjob.TRAINJOB_SCHEMA_FILE, "manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml",
         "9b1edb2f5e6f0d7fb867ee74a1a8e97d2f952b86"),
        (trainjob.RUNTIME_SCHEMA_FILE, "manifests/base/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml",
         "147081432be5e0ca102ef41aebef422396102182"),
    ):
        text = (ROOT / "src" / "omtr" / "data" / "k8s" / schema_file).read_text()
        assert "https://github.com/kubeflow/trainer" in text and path in text and commit in text
        assert "description:" not in text  # removed, as the header says
    spec = trainjob.vendored_schema(trainjob.TRAINJOB_SCHEMA_FILE)["properties"]["spec"]
    assert set(spec["properties"]) == {"annotations", "initializer", "labels", "managedBy", "podTemplateOverrides",
                                       "runtimeRef", "suspend", "trainer"}
    assert spec["required"] == ["runtimeRef"]
    assert set(spec["properties"]["trainer"]["properties"]) == {"args", "command", "env", "image", "numNodes",
                                                                "numProcPerNode", "resourcesPerNode"}
    runtime = trainjob.vendored_schema(trainjob.RUNTIME_SCHEMA_FILE)["properties"]["spec"]["properties"]
    assert set(runtime) == {"mlPolicy", "podGroupPolicy", "template"}
    job = runtime["template"]["properties"]["spec"]["properties"]["replicatedJobs"]["items"]["properties"]["template"]
    assert job["properties"]["spec"] == {"x-omtr-kubernetes-definition": "io.k8s.api.batch.v1.JobSpec"}


def test_trainjob_launch_reads_the_trainers_rendezvous_and_resumes(tmp_path):
    mount = tmp_path / "ckpt"
    spec = TrainJobSpec(image="i:1", tasks=f"{mount}/tasks/t.jsonl", out=f"{mount}/runs/r1", nodes=2,
                        gpus_per_node=4, checkpoint_mount=str(mount))
    command = build_trainjob(spec)["spec"]["trainer"]["command"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done > "$RECORD"\n')
    (bin_dir / "torchrun").chmod(0o755)
    record = tmp_path / "argv.txt"
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD": str(record), "PET_NODE_RANK": "1",
           "PET_MASTER_ADDR": "omtr-train-paper-node-0-0.omtr-train-paper", "PET_MASTER_PORT": "29400"}
    subprocess.run(command, env=env, check=True, timeout=30)
    argv = record.read_text().split("\n")[:-1]
    assert argv[:5] == ["--nnodes=2", "--nproc_per_node=4", "--node_rank=1",
                        "--master_addr=omtr-train-paper-node-0-0.omtr-train-paper", "--master_port=29400"]
    assert argv[5:] == ["-m", "omtr", "train", "--tasks", f"{mount}/tasks/t.jsonl", "--out", f"{mount}/runs/r1",
                        "--profile", "paper", "--set", "deepspeed=/opt/omtr/configs/deepspeed/zero2_bf16.json"]
    (mount / "runs" / "r1" / "checkpoints").mkdir(parents=True)
    (mount / "runs" / "r1" / "checkpoints" / "latest").write_text("update-000004")
    subprocess.run(command, env=env, check=True, timeout=30)
    assert record.read_text().split("\n")[:-1][5:] == ["-m", "omtr", "train", "--tasks", f"{mount}/tasks/t.jsonl",
                                                       "--out", f"{mount}/runs/r1", "--resume"]


def test_committed_gpu_cluster_runtime_is_current():
    committed = yaml.safe_load((ROOT / "k8s" / "overlays" / "gpu-cluster" / "clustertrainingruntime.yaml").read_text())
    assert committed == build_training_runtime(), \
        "regenerate k8s/overlays/gpu-cluster/clustertrainingruntime.yaml (command in its header)"
    assert build_trainjob(SPEC)["spec"]["runtimeRef"]["name"] == committed["metadata"]["name"]


# ------------------------------------------------------------------------------ TrainJob create and watch
def tj_cond(**types):
    """A TrainJob status: conditions keyed by type (a map, not a history), each True or False."""
    return {"conditions": [{"type": t, "status": "True" if on else "False", "reason": f"{t}Reason",
                            "message": f"job {t.lower()}", "lastTransitionTime": "2026-01-01T00:00:00Z"}
                           for t, on in types.items()]}


def test_trainjob_state_by_precedence_not_order():
    assert trainjob.job_state({"kind": "TrainJob"}) == ("Pending", "")
    assert trainjob.job_state({"kind": "TrainJob", "status": tj_cond(Created=True)})[0] == "Created"
    assert trainjob.job_state({"kind": "TrainJob", "status": tj_cond(Complete=True, Created=True)})[0] == "Complete"
    assert trainjob.job_state({"kind": "TrainJob", "status": tj_cond(Suspended=True, Created=True)})[0] == "Suspended"
    assert trainjob.job_state({"kind": "TrainJob", "status": tj_cond(Complete=False, Failed=True)}) == \
        ("Failed", "FailedReason: job failed")
    assert trainjob.job_state({"kind": "TrainJob", "status": tj_cond(Suspended=False, Created=True)})[0] == "Created"


def test_trainjob_create_then_watch_to_complete():
    api = FakeCustomObjectsApi([{}, tj_cond(Created=True), tj_cond(Suspended=False, Created=True),
                                tj_cond(Created=True, Complete=True)])
    trainjob.create(build_trainjob(SPEC), api)
    assert api.calls[0] == ("create", "trainer.kubeflow.org", "v1alpha1", "omtr", "trainjobs")
    clock = Clock()
    done = trainjob.wait(api, "omtr", "omtr-train-paper", kind="TrainJob", timeout_s=3600, poll_s=10,
                         clock=clock, sleep=clock.sleep)
    assert trainjob.job_state(done) == ("Complete", "CompleteReason: job complete") and clock.t == 30
    assert api.calls[-1] == ("get", "trainer.kubeflow.org", "v1alpha1", "omtr", "trainjobs", "omtr-train-paper")


def test_trainjob_watch_reports_failure_and_times_out():
    api = FakeCustomObjectsApi([tj_cond(Created=True), tj_cond(Created=True, Failed=True)])
    trainjob.create(build_trainjob(SPEC), api)
    clock = Clock()
    with pytest.raises(TrainJobFailed, match="job failed.*logs -l jobset.sigs.k8s.io/jobset-name=omtr-train-paper"):
        trainjob.wait(api, "omtr", "omtr-train-paper", kind="TrainJob", timeout_s=3600, poll_s=5, clock=clock, sleep=clock.sleep)
    api = FakeCustomObjectsApi([tj_cond(Suspended=True)])  # a suspended job is waited for, not taken for done
    trainjob.create(build_trainjob(SPEC), api)
    clock = Clock()
    with pytest.raises(TrainJobTimeout, match="within 100 s \\(state Suspended\\).*get trainjob omtr-train-paper"):
        trainjob.wait(api, "omtr", "omtr-train-paper", kind="TrainJob", timeout_s=100, poll_s=30, clock=clock, sleep=clock.sleep)


def test_an_existing_trainjob_is_watched_and_refusals_say_what_to_do():
    body = build_trainjob(SPEC)
    api = FakeCustomObjectsApi([tj_cond(Complete=True)], create_error=ApiException(status=409, reason="AlreadyExists"))
    api.objects[("trainer.kubeflow.org", "v1alpha1", "omtr", "trainjobs", "omtr-train-paper")] = body
    assert trainjob.create(body, api)["kind"] == "TrainJob" and api.calls[-1][0] == "get"
    for status, message in ((404, "install Kubeflow Trainer v2"), (403, "create/get on trainjobs"), (500, "HTTP 500")):
        with pytest.raises(TrainJobError, match=message):
            trainjob.create(body, FakeCustomObjectsApi(create_error=ApiException(status=status, reason="x")))
    refused = ApiException(status=422, reason="Unprocessable Entity")
    refused.body = '{"kind": "Status", "message": "admission webhook denied the request: ClusterTrainingRuntime not found"}'
    with pytest.raises(TrainJobError, match="webhook denied.*ClusterTrainingRuntime not found.*omtr-torch-distributed exists"):
        trainjob.create(body, FakeCustomObjectsApi(create_error=refused))


def test_cli_trainjob_dry_run_and_default_kind(capsys):
    assert main([*ARGS, "--kind", "trainjob", "--dry-run"]) == 0
    body = yaml.safe_load(capsys.readouterr().out)
    validate_trainjob(body)
    assert body["kind"] == "TrainJob" and body["spec"]["trainer"]["numNodes"] == 2
    assert main([*ARGS, "--kind", "trainjob", "--runtime", "team-runtime", "--runtime-kind", "TrainingRuntime", "--dry-run"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime", "name": "team-runtime"}
    assert main([*ARGS, "--dry-run"]) == 0  # the default stays the PyTorchJob
    assert yaml.safe_load(capsys.readouterr().out)["kind"] == "PyTorchJob"
    with pytest.raises(SystemExit) as exc:
        main([*ARGS, "--kind", "mpijob", "--dry-run"])
    assert exc.value.code == 2 and "invalid choice: 'mpijob'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["k8s", "train-job", "--help"])
    help_text = capsys.readouterr().out
    assert "--kind {pytorchjob,trainjob}" in help_text and "--kind trainjob --image" in help_text


def test_cli_creates_and_waits_for_a_trainjob(monkeypatch, capsys):
    api = FakeCustomObjectsApi([tj_cond(Created=True, Complete=True)])
    monkeypatch.setattr(trainjob, "custom_objects_api", lambda: api)
    assert main([*ARGS, "--kind", "trainjob", "--wait", "--timeout", "60", "--poll", "0"]) == 0
    out = capsys.readouterr().out
    assert "trainjob omtr/omtr-train-paper: created" in out and "trainjob omtr/omtr-train-paper: Complete" in out
    assert api.calls[0] == ("create", "trainer.kubeflow.org", "v1alpha1", "omtr", "trainjobs")
    api = FakeCustomObjectsApi([tj_cond(Created=True, Failed=True)])
    monkeypatch.setattr(trainjob, "custom_objects_api", lambda: api)
    assert main([*ARGS, "--kind", "trainjob", "--wait", "--timeout", "60", "--poll", "0"]) == 1
    assert "TrainJob omtr/omtr-train-paper failed" in capsys.readouterr().err


def test_cli_prints_the_training_runtime(tmp_path, capsys):
    assert main(["k8s", "training-runtime"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == build_training_runtime()
    out = tmp_path / "rt.yaml"
    assert main(["k8s", "training-runtime", "--kind", "TrainingRuntime", "--namespace", "team-a",
                 "--image", "reg/omtr-trainer-gpu:0.2.0", "--out", str(out)]) == 0
    body = yaml.safe_load(out.read_text())
    validate_training_runtime(body)
    assert body["kind"] == "TrainingRuntime" and body["metadata"]["namespace"] == "team-a"
    with pytest.raises(SystemExit):
        main(["k8s", "training-runtime", "--help"])
    assert "examples:" in capsys.readouterr().out
