"""The PyTorchJob for multi-node training (omtr.k8s.trainjob, `omtr k8s train-job`): the body, its
strict validation against the pinned Training Operator schema, the launch script (run for real
under /bin/sh with a stand-in torchrun), and create/watch.

No Kubernetes API server can run on these machines: create and watch are tested against
FakeCustomObjectsApi below, a fake of kubernetes.client.CustomObjectsApi that stores the created
object and plays back a list of job statuses; ApiException is the real client's exception."""

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
    TrainJobError, TrainJobFailed, TrainJobInvalid, TrainJobSpec, TrainJobTimeout, build_pytorchjob, validate_pytorchjob,
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
