"""The manifests under k8s/: both overlays render, every object passes strict offline validation
(kubernetes-validate, Kubernetes 1.31; PyTorchJob against the pinned Training Operator schema, the
ClusterTrainingRuntime against the pinned Kubeflow Trainer v2 schema), and
the properties the cluster relies on hold on the rendered objects: security settings on every
workload, the fleet's NetworkPolicy, resources, probes, the fleet's memory, the serving contract."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from omtr.config import SolverConfig
from omtr.k8s.manifests import OVERLAYS, render_overlay, validate_object, validate_objects

ROOT = Path(__file__).resolve().parents[1]
K8S_VERSION = "1.31"
NAMESPACES = {"dev": "omtr-dev", "gpu-cluster": "omtr"}
SOLVER_CLIENTS = {"trainer", "evaluator", "serving"}
# Containers allowed a writable root filesystem, each with the reason. None today: every image
# writes only to its emptyDir/PVC mounts (/tmp, caches, data). Add an entry here, with its reason,
# before relaxing readOnlyRootFilesystem anywhere.
WRITABLE_ROOT_FS: dict[tuple[str, str], str] = {}
# Kinds that run pods, and where their pod templates are.
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "PyTorchJob", "Pod",
                  "TrainJob", "ClusterTrainingRuntime", "TrainingRuntime"}
# Cluster-scoped kinds. kustomize's namespace transformer sets metadata.namespace on custom kinds
# whatever their scope (it cannot know it); the API server clears it on cluster-scoped objects.
CLUSTER_SCOPED = {"Namespace", "ClusterTrainingRuntime"}
LONG_RUNNING = {"Deployment", "StatefulSet", "DaemonSet"}


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request):
    return request.param, render_overlay(str(ROOT / "k8s" / "overlays" / request.param))


def pod_templates(obj):
    """(label, pod template) pairs of a workload."""
    kind, spec = obj["kind"], obj.get("spec", {})
    if kind == "Pod":
        return [(obj["metadata"]["name"], obj)]
    if kind == "CronJob":
        return [(obj["metadata"]["name"], spec["jobTemplate"]["spec"]["template"])]
    if kind == "PyTorchJob":
        return [(f"{obj['metadata']['name']}/{r}", t["template"]) for r, t in spec["pytorchReplicaSpecs"].items()]
    if kind in ("ClusterTrainingRuntime", "TrainingRuntime"):
        return [(f"{obj['metadata']['name']}/{j['name']}", j["template"]["spec"]["template"])
                for j in spec["template"]["spec"]["replicatedJobs"]]
    if kind == "TrainJob":
        return []  # its pods come from the runtime it refers to (with overrides: tests/test_k8s_trainjob.py)
    return [(obj["metadata"]["name"], spec["template"])]


def workloads(objs):
    return [o for o in objs if o["kind"] in WORKLOAD_KINDS]


def containers(template):
    spec = template["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def find(objs, kind, name):
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def mib(quantity: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti)?", quantity)
    assert m, f"unexpected memory quantity {quantity}"
    return float(m.group(1)) * {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 ** 2, None: 1 / 2 ** 20}[m.group(2)]


# ------------------------------------------------------------------------------ validation
def test_every_rendered_object_is_valid_strict(overlay):
    name, objs = overlay
    t0 = time.perf_counter()
    errors = validate_objects(objs, K8S_VERSION)
    assert not errors, "\n".join(errors)
    assert len(objs) >= 25
    kinds = {o["kind"] for o in objs}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Job", "StatefulSet",
            "NetworkPolicy", "ServiceAccount", "Role", "RoleBinding", "PersistentVolumeClaim", "Namespace"} <= kinds
    print(f"{name}: {len(objs)} objects validated in {time.perf_counter() - t0:.2f} s")


def test_validation_is_strict_and_fails_on_bad_objects(overlay):
    name, objs = overlay
    dep = find(objs, "Deployment", "omtr-solver")
    import copy

    typo = copy.deepcopy(dep)
    typo["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = typo["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    assert "readinesProbe" in validate_object(typo, K8S_VERSION)
    wrong_type = copy.deepcopy(dep)
    wrong_type["spec"]["replicas"] = "two"
    assert validate_object(wrong_type, K8S_VERSION)
    unknown_kind = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": {"name": "x"}}
    assert "no schema" in validate_object(unknown_kind, K8S_VERSION)
    # the custom resources against their pinned schemas, strictly, and only at the pinned version
    pinned = [o for o in objs if o["kind"] in ("PyTorchJob", "ClusterTrainingRuntime")]
    assert {o["kind"] for o in pinned} == ({"PyTorchJob", "ClusterTrainingRuntime"} if name == "gpu-cluster" else set())
    for obj in pinned:
        typo = copy.deepcopy(obj)
        (_, t), *_ = pod_templates(typo)
        t["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
        assert "imagePullPolicyy" in validate_object(typo, K8S_VERSION)
        wrong_type = copy.deepcopy(obj)
        (_, t), *_ = pod_templates(wrong_type)
        t["spec"]["automountServiceAccountToken"] = "no"
        assert "automountServiceAccountToken" in validate_object(wrong_type, K8S_VERSION)
        other_version = {**obj, "apiVersion": obj["apiVersion"].rsplit("/", 1)[0] + "/v9"}
        assert "no schema" in validate_object(other_version, K8S_VERSION)
    trainer_kind = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "OptimizationJob", "metadata": {"name": "x"}}
    assert "no schema" in validate_object(trainer_kind, K8S_VERSION)


def test_everything_lands_in_the_overlay_namespace(overlay):
    name, objs = overlay
    ns = NAMESPACES[name]
    assert find(objs, "Namespace", ns)["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for o in objs:
        if o["kind"] not in CLUSTER_SCOPED:
            assert o["metadata"].get("namespace") == ns, f"{o['kind']}/{o['metadata']['name']} outside {ns}"
        assert o["metadata"]["labels"]["omtr.dev/env"] == name


# ------------------------------------------------------------------------------ security
def test_every_workload_is_secure_by_default(overlay):
    _, objs = overlay
    checked = 0
    for obj in workloads(objs):
        for label, template in pod_templates(obj):
            pod = template["spec"]
            psc = pod.get("securityContext", {})
            assert pod.get("automountServiceAccountToken") is False, f"{label}: automountServiceAccountToken"
            for c in containers(template):
                csc = c.get("securityContext", {})
                where = f"{obj['kind']} {label} container {c['name']}"
                assert csc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True, f"{where}: runAsNonRoot"
                assert csc.get("runAsUser", psc.get("runAsUser", 0)) > 0, f"{where}: runAsUser must be non-zero"
                assert csc.get("allowPrivilegeEscalation") is False, f"{where}: allowPrivilegeEscalation"
                assert csc.get("privileged") in (None, False), f"{where}: privileged"
                assert csc.get("capabilities", {}).get("drop") == ["ALL"], f"{where}: capabilities.drop [ALL]"
                assert not csc.get("capabilities", {}).get("add"), f"{where}: adds capabilities"
                seccomp = csc.get("seccompProfile", psc.get("seccompProfile", {}))
                assert seccomp.get("type") == "RuntimeDefault", f"{where}: seccompProfile RuntimeDefault"
                if (obj["metadata"]["name"], c["name"]) not in WRITABLE_ROOT_FS:
                    assert csc.get("readOnlyRootFilesystem") is True, f"{where}: readOnlyRootFilesystem"
                checked += 1
            assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
            assert not any("hostPath" in v for v in pod.get("volumes", [])), f"{label}: hostPath volume"
    assert checked >= 5  # solver, re-verification, PostgreSQL, MLflow, serving (+ the trainer replicas)


def test_images_are_pinned(overlay):
    _, objs = overlay
    for obj in workloads(objs):
        for label, template in pod_templates(obj):
            for c in containers(template):
                image = c["image"]
                assert "@sha256:" in image or re.search(r":[\w.-]+$", image.rsplit("/", 1)[-1]), f"{label}: {image} has no tag"
                assert not image.endswith(":latest"), f"{label}: {image} uses latest"


def test_every_container_has_requests_and_limits(overlay):
    _, objs = overlay
    for obj in workloads(objs):
        for label, template in pod_templates(obj):
            for c in containers(template):
                res = c.get("resources", {})
                for kind in ("requests", "limits"):
                    for r in ("cpu", "memory"):
                        assert r in res.get(kind, {}), f"{label}/{c['name']}: no {kind}.{r}"
                assert mib(res["requests"]["memory"]) <= mib(res["limits"]["memory"])


def test_long_running_containers_have_probes(overlay):
    _, objs = overlay
    for obj in workloads(objs):
        if obj["kind"] not in LONG_RUNNING:
            continue
        for label, template in pod_templates(obj):
            for c in template["spec"]["containers"]:
                assert "readinessProbe" in c and "livenessProbe" in c, f"{label}/{c['name']}: readiness and liveness"


# ------------------------------------------------------------------------------ network policy
def _selects(selector: dict, labels: dict) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        value, present = labels.get(e["key"]), e["key"] in labels
        ok = {"In": present and value in e.get("values", []), "NotIn": not present or value not in e.get("values", []),
              "Exists": present, "DoesNotExist": not present}[e["operator"]]
        if not ok:
            return False
    return True


def _admits(policies, target_labels, source_labels, source_ns_labels, same_namespace, port):
    """Whether any policy selecting the target admits the source on that port (Kubernetes' semantics:
    the union of all policies that select the pod; none selecting it admits everything)."""
    selecting = [p for p in policies if _selects(p["spec"]["podSelector"], target_labels)
                 and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])]
    if not selecting:
        return True
    for p in selecting:
        for rule in p["spec"].get("ingress") or []:
            if rule.get("ports") and not any(pt.get("port") == port for pt in rule["ports"]):
                continue
            peers = rule.get("from")
            if not peers:
                return True
            for peer in peers:
                ns_sel, pod_sel = peer.get("namespaceSelector"), peer.get("podSelector")
                ns_ok = _selects(ns_sel, source_ns_labels) if ns_sel is not None else same_namespace
                pod_ok = _selects(pod_sel, source_labels) if pod_sel is not None else True
                if ns_ok and pod_ok:
                    return True
    return False


def test_only_trainer_evaluator_and_serving_pods_reach_the_fleet(overlay):
    name, objs = overlay
    ns = NAMESPACES[name]
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    fleet = find(objs, "Deployment", "omtr-solver")["spec"]["template"]["metadata"]["labels"]
    port = 8600
    own_ns = {"kubernetes.io/metadata.name": ns}
    # Every pod the overlay runs: the clients get in, the others do not.
    for obj in workloads(objs):
        for label, template in pod_templates(obj):
            labels = template["metadata"]["labels"]
            expected = labels.get("app.kubernetes.io/component") in SOLVER_CLIENTS
            assert _admits(policies, fleet, labels, own_ns, True, port) is expected, label
    assert {t["metadata"]["labels"]["app.kubernetes.io/component"] for o in workloads(objs)
            for _, t in pod_templates(o)} >= ({"evaluator", "serving", "trainer"} if name == "gpu-cluster" else {"evaluator", "serving"})
    # A pod with no omtr labels, anywhere, is refused; so is a client in an unlabelled namespace.
    assert not _admits(policies, fleet, {"app": "x"}, own_ns, True, port)
    client = {"app.kubernetes.io/component": "evaluator"}
    assert not _admits(policies, fleet, client, {"kubernetes.io/metadata.name": "other"}, False, port)
    # Kubeflow Pipelines' namespace, once labelled, may send its trainer and evaluator steps.
    kfp = {"kubernetes.io/metadata.name": "kubeflow", "omtr.dev/solver-clients": "true"}
    assert _admits(policies, fleet, client, kfp, False, port)
    assert not _admits(policies, fleet, {"app.kubernetes.io/component": "mlflow"}, kfp, False, port)
    # The one documented exception: Prometheus in the monitoring namespace scrapes /metrics.
    assert _admits(policies, fleet, {"app.kubernetes.io/name": "prometheus"},
                   {"kubernetes.io/metadata.name": "monitoring"}, False, port)
    # Default deny: a pod no other policy selects gets nothing.
    assert not _admits(policies, {"app": "unknown"}, client, own_ns, True, 1234)
    # PostgreSQL only from the MLflow server.
    pg = find(objs, "StatefulSet", "omtr-postgres")["spec"]["template"]["metadata"]["labels"]
    mlflow = find(objs, "Deployment", "omtr-mlflow")["spec"]["template"]["metadata"]["labels"]
    assert _admits(policies, pg, mlflow, own_ns, True, 5432)
    assert not _admits(policies, pg, fleet, own_ns, True, 5432)


# ------------------------------------------------------------------------------ the fleet
def test_fleet_resources_match_the_planner_memory_limit(overlay):
    _, objs = overlay
    dep = find(objs, "Deployment", "omtr-solver")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    args = dict(a.split("=", 1) for a in c["args"] if a.startswith("--") and "=" in a)
    workers = int(args["--workers"])
    per_planner = int(args.get("--memory-limit", SolverConfig().memory_limit_mb))
    need = workers * per_planner + 512  # the server, the translator, the cache
    limit, request = mib(c["resources"]["limits"]["memory"]), mib(c["resources"]["requests"]["memory"])
    assert limit >= need, f"{workers} workers x {per_planner} MiB need {need} MiB, the limit is {limit} MiB"
    assert request == limit, "memory requests = limits: the scheduler must reserve what the planners may use"
    assert float(c["resources"]["requests"]["cpu"].rstrip("m")) / (1000 if c["resources"]["requests"]["cpu"].endswith("m") else 1) <= workers
    # Probes on the service's own endpoints, scrape annotations on its metrics port.
    service_src = (ROOT / "src" / "omtr" / "solver" / "service.py").read_text()
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        assert c[probe]["httpGet"]["path"] == path and f'@app.get("{path}")' in service_src
    assert '@app.get("/metrics")' in service_src
    ann = dep["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/path"] == "/metrics"
    assert ann["prometheus.io/port"] == str(c["ports"][0]["containerPort"]) == args["--port"]
    assert args["--host"] == "0.0.0.0"
    # SIGTERM drains for --drain-timeout; the kubelet must wait longer than that.
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > float(args["--drain-timeout"])
    hpa = find(objs, "HorizontalPodAutoscaler", "omtr-solver")
    assert hpa["apiVersion"] == "autoscaling/v2" and hpa["spec"]["scaleTargetRef"]["name"] == "omtr-solver"
    assert hpa["spec"]["minReplicas"] <= dep["spec"]["replicas"] <= hpa["spec"]["maxReplicas"]
    pdb = find(objs, "PodDisruptionBudget", "omtr-solver")
    svc = find(objs, "Service", "omtr-solver")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert _selects(pdb["spec"]["selector"], pod_labels) and _selects({"matchLabels": svc["spec"]["selector"]}, pod_labels)


def test_overlays_size_the_fleet(overlay):
    name, objs = overlay
    dep = find(objs, "Deployment", "omtr-solver")
    if name == "dev":
        assert dep["spec"]["replicas"] == 1
        assert "nodeSelector" not in dep["spec"]["template"]["spec"]
    else:
        assert dep["spec"]["replicas"] >= 4
        assert dep["spec"]["template"]["spec"]["nodeSelector"] == {"omtr.dev/pool": "cpu"}


# ------------------------------------------------------------------------------ jobs
def test_reverification_is_an_indexed_job_in_shards(overlay):
    _, objs = overlay
    job = find(objs, "Job", "omtr-reverify")
    spec = job["spec"]
    (c,) = spec["template"]["spec"]["containers"]
    assert spec["completionMode"] == "Indexed" and spec["suspend"] is True
    shard = next(a for a in c["args"] if a.startswith("--shard="))
    assert shard == f"--shard=$(SHARD_INDEX)/{spec['completions']}" and spec["parallelism"] == spec["completions"]
    assert any(a.startswith("--out=") and "$(SHARD_INDEX)" in a for a in c["args"]) and "--resume" in c["args"]
    env = {e["name"]: e for e in c["env"]}
    assert env["SHARD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert env["OMTR_SOLVER_URL"]["value"] == "http://omtr-solver:8600"
    assert spec["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "evaluator"


def test_gpu_cluster_trains_on_the_a100_pool():
    objs = render_overlay(str(ROOT / "k8s" / "overlays" / "gpu-cluster"))
    job = find(objs, "PyTorchJob", "omtr-train-paper")
    assert job["spec"]["runPolicy"]["suspend"] is True
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        assert replica["restartPolicy"] == "OnFailure"
        pod = replica["template"]["spec"]
        (c,) = pod["containers"]
        assert c["image"].startswith("registry.example.com/omtr/omtr-trainer-gpu:")
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms[0]["matchExpressions"][0] == {"key": "omtr.dev/pool", "operator": "In", "values": ["a100"]}
        assert {t["key"] for t in pod["tolerations"]} == {"nvidia.com/gpu", "omtr.dev/pool"}
        shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
        assert shm["emptyDir"]["medium"] == "Memory"
        claim = next(v for v in pod["volumes"] if v["name"] == "checkpoints")["persistentVolumeClaim"]["claimName"]
        assert find(objs, "PersistentVolumeClaim", claim)["spec"]["accessModes"] == ["ReadWriteMany"]
        assert "--resume" in c["command"][-1]


def test_gpu_cluster_carries_the_training_runtime_of_the_trainjobs():
    """The ClusterTrainingRuntime that `omtr k8s train-job --kind trainjob` refers to is in the
    overlay, on the overlay's trainer image, shaped the way the Trainer's torch plugin drives it."""
    from omtr.k8s.trainjob import TrainJobSpec, build_trainjob

    objs = render_overlay(str(ROOT / "k8s" / "overlays" / "gpu-cluster"))
    ref = build_trainjob(TrainJobSpec(image="i:1", tasks="/checkpoints/t.jsonl", out="/checkpoints/r"))["spec"]["runtimeRef"]
    runtime = find(objs, ref["kind"], ref["name"])
    assert runtime["apiVersion"] == ref["apiGroup"] + "/v1alpha1"
    assert runtime["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "torch" and "torch" in runtime["spec"]["mlPolicy"]
    (job,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert job["name"] == "node" and job["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"] == "trainer"
    pod = job["template"]["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    assert c["name"] == "node" and c["image"].startswith("registry.example.com/omtr/omtr-trainer-gpu:")
    assert pod["spec"]["restartPolicy"] == "OnFailure" and pod["spec"]["serviceAccountName"] == "omtr-workload"


# ------------------------------------------------------------------------------ MLflow and serving
def test_mlflow_server_on_postgresql_with_proxied_artifacts(overlay):
    _, objs = overlay
    dep = find(objs, "Deployment", "omtr-mlflow")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    assert args[0] == "server" and "--serve-artifacts" in args and "--workers=1" in args
    store = next(a for a in args if a.startswith("--backend-store-uri="))
    assert store.startswith("--backend-store-uri=postgresql+psycopg2://$(POSTGRES_USER):$(POSTGRES_PASSWORD)@omtr-postgres:5432/")
    dest = next(a for a in args if a.startswith("--artifacts-destination=")).split("=", 1)[1]
    mount = next(m for m in c["volumeMounts"] if dest.startswith(m["mountPath"]))
    vol = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    find(objs, "PersistentVolumeClaim", vol["persistentVolumeClaim"]["claimName"])
    pg = find(objs, "StatefulSet", "omtr-postgres")
    assert pg["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    find(objs, "Service", "omtr-postgres")


def test_serving_deployment_contract_for_the_deploy_step(overlay):
    """The names the deploy step patches: Deployment omtr-serving, container serving, env MODEL_URI,
    pod template annotation omtr.dev/model-version."""
    _, objs = overlay
    dep = find(objs, "Deployment", "omtr-serving")
    template = dep["spec"]["template"]
    (c,) = template["spec"]["containers"]
    assert c["name"] == "serving"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["MODEL_URI"] == "models:/omtr-role-model@champion"
    assert "omtr.dev/model-version" in template["metadata"]["annotations"]
    assert c["command"] == ["mlflow"] and c["args"][:2] == ["models", "serve"]
    assert "--model-uri=$(MODEL_URI)" in c["args"] and "--env-manager=local" in c["args"] and "--host=0.0.0.0" in c["args"]
    assert int(env["MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT"]) >= 600
    assert env["MLFLOW_TRACKING_URI"] == "http://omtr-mlflow:5000"
    assert c["readinessProbe"]["httpGet"]["path"] == "/ping" and c["livenessProbe"]["httpGet"]["path"] in ("/ping", "/health")
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


# ------------------------------------------------------------------------------ secrets and RBAC
def _secret_refs(objs):
    names = set()
    for obj in workloads(objs):
        for _, template in pod_templates(obj):
            for v in template["spec"].get("volumes", []):
                if "secret" in v:
                    names.add(v["secret"]["secretName"])
            for c in containers(template):
                for e in c.get("env", []):
                    ref = e.get("valueFrom", {}).get("secretKeyRef")
                    if ref and not ref.get("optional"):
                        names.add(ref["name"])
    return names


def test_secrets_are_placeholders_in_dev_and_documented_for_real_clusters(overlay):
    name, objs = overlay
    refs = _secret_refs(objs)
    assert refs == {"omtr-solver-token", "omtr-postgres"}
    secrets = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Secret"}
    if name == "dev":
        import base64

        assert set(secrets) == refs
        for s in secrets.values():
            for key, value in s["data"].items():
                if key != "username":
                    assert base64.b64decode(value).decode() == "dev-only-not-a-secret"
    else:
        assert not secrets, "no Secret values in the gpu-cluster overlay: create them with kubectl"
        readme = (ROOT / "k8s" / "README.md").read_text()
        for s in refs | {"omtr-hf-token"}:
            assert f"kubectl -n omtr create secret generic {s}" in readme


def test_deployer_and_pipeline_have_least_privilege_in_the_namespace(overlay):
    name, objs = overlay
    roles = {o["metadata"]["name"]: {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in o["rules"]}
             for o in objs if o["kind"] == "Role"}
    assert roles == {
        "omtr-deployer": {(("apps",), ("deployments",)): {"get", "list", "watch", "patch"},
                          (("apps",), ("replicasets",)): {"get", "list"}},
        "omtr-trainjob-launcher": {(("kubeflow.org",), ("pytorchjobs",)): {"create", "get", "list", "watch"},
                                   (("trainer.kubeflow.org",), ("trainjobs",)): {"create", "get", "list", "watch"}},
    }
    assert not any(o["kind"] in ("ClusterRole", "ClusterRoleBinding") for o in objs)
    bindings = {o["metadata"]["name"]: o for o in objs if o["kind"] == "RoleBinding"}
    runner = [{"kind": "ServiceAccount", "name": "pipeline-runner", "namespace": "kubeflow"}]
    expected = {"omtr-deployer": ("omtr-deployer", [{"kind": "ServiceAccount", "name": "omtr-deployer", "namespace": NAMESPACES[name]}]),
                "omtr-pipeline-deployer": ("omtr-deployer", runner),
                "omtr-pipeline-trainjob-launcher": ("omtr-trainjob-launcher", runner)}
    assert set(bindings) == set(expected)
    for b, (role, subjects) in expected.items():
        assert bindings[b]["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role}
        assert bindings[b]["subjects"] == subjects
    find(objs, "ServiceAccount", "omtr-deployer")
    assert find(objs, "ServiceAccount", "omtr-workload")["automountServiceAccountToken"] is False
