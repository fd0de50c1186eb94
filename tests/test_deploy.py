"""``omtr deploy``: rolling the serving Deployment to a model version, with rollback.

No Kubernetes API server can run here, so :class:`FakeApps` stands in for ``AppsV1Api``: it keeps
one Deployment (the real k8s/base/serving.yaml), answers with the client's real ``V1Deployment``
objects, applies patches, and plays the Deployment controller by a script (healthy, stuck,
progress deadline exceeded). Everything else is real: the patch bodies, their strategic merge into
the Deployment, the strict Kubernetes-schema validation, the rollout judgement, the rollback, the
MLflow registry (SQLite) and the command line."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("kubernetes")
pytest.importorskip("kubernetes_validate")
yaml = pytest.importorskip("yaml")

from kubernetes.client import ApiClient  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

from omtr.k8s import deploy as d  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SERVING = ROOT / "k8s" / "base" / "serving.yaml"
TARGET = d.Target("omtr", "omtr-serving", "serving")


def serving_deployment() -> dict:
    dep = d.deployment_from_manifest(SERVING.read_text(), TARGET)
    dep = copy.deepcopy(dep)
    dep["metadata"].update({"namespace": "omtr", "generation": 1, "resourceVersion": "100", "uid": "u-1"})
    n = dep["spec"]["replicas"]
    dep["status"] = {"observedGeneration": 1, "replicas": n, "updatedReplicas": n, "availableReplicas": n,
                     "readyReplicas": n}
    return dep


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


class FakeApps:
    """A stand-in for AppsV1Api (no API server here): one Deployment, a scripted controller."""

    def __init__(self, dep: dict | None, behaviour: str = "healthy", settle_reads: int = 2):
        self.dep, self.behaviour, self.settle_reads = dep, behaviour, settle_reads
        self.patches: list[dict] = []
        self.reads_since_patch = 0
        self._api = ApiClient()

    def _obj(self):
        return self._api._ApiClient__deserialize(copy.deepcopy(self.dep), "V1Deployment")

    def _missing(self):
        if self.dep is None:
            raise ApiException(status=404, reason="Not Found")

    def read_namespaced_deployment(self, name, namespace):
        self._missing()
        assert (name, namespace) == (TARGET.deployment, TARGET.namespace)
        return self._obj()

    def patch_namespaced_deployment(self, name, namespace, body, **kw):
        self._missing()
        assert isinstance(body, dict)  # the client sends a dict as a strategic-merge patch
        self.patches.append({"body": copy.deepcopy(body), **kw})
        if kw.get("dry_run"):
            return self._obj()
        self.dep = d.strategic_merge(self.dep, body)
        self.dep["metadata"]["generation"] += 1
        self.reads_since_patch = 0
        n = self.dep["spec"]["replicas"]
        # the controller has not looked yet: old pods all still there
        self.dep["status"].update({"updatedReplicas": 0, "replicas": n, "availableReplicas": n})
        return self._obj()

    def read_namespaced_deployment_status(self, name, namespace):
        self._missing()
        self.reads_since_patch += 1
        st, gen, n = self.dep["status"], self.dep["metadata"]["generation"], self.dep["spec"]["replicas"]
        st["observedGeneration"] = gen
        rolled_back = len([p for p in self.patches if not p.get("dry_run")]) > 1
        if self.behaviour == "healthy" or rolled_back:
            if self.reads_since_patch >= self.settle_reads:
                st.update({"updatedReplicas": n, "replicas": n, "availableReplicas": n})
            else:
                st.update({"updatedReplicas": 1, "replicas": n + 1, "availableReplicas": n})
        elif self.behaviour == "stuck":  # the new pod never becomes ready (a bad model URI, say)
            st.update({"updatedReplicas": 1, "replicas": n + 1, "availableReplicas": n})
        elif self.behaviour == "deadline":
            st.update({"updatedReplicas": 1, "replicas": n + 1, "availableReplicas": n})
            if self.reads_since_patch >= 2:
                st["conditions"] = [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                                     "message": 'ReplicaSet "omtr-serving-7c9" has timed out progressing.'}]
        return self._obj()


def _template(dep: dict) -> tuple[str | None, str | None]:
    return d.current_model(dep, "serving")


def test_rollout_succeeds_and_patch_is_schema_valid():
    apps, clock = FakeApps(serving_deployment()), Clock()
    res = d.deploy(apps, TARGET, "omtr-role-model", "7", timeout_s=60, poll_s=1, clock=clock, sleep=clock.sleep)
    assert res.changed and res.model_uri == "models:/omtr-role-model/7"
    assert res.previous_model_uri == "models:/omtr-role-model@champion" and res.previous_version == "champion"
    assert len(apps.patches) == 1
    assert apps.patches[0]["body"] == {"spec": {"template": {
        "metadata": {"annotations": {"omtr.dev/model-version": "7"}},
        "spec": {"containers": [{"name": "serving", "env": [{"name": "MODEL_URI", "value": "models:/omtr-role-model/7"}]}]}}}}
    assert _template(apps.dep) == ("models:/omtr-role-model/7", "7")
    env = {e["name"]: e.get("value") for e in apps.dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MLFLOW_TRACKING_URI"] == "http://omtr-mlflow:5000"  # the other variables are kept
    assert "available" in res.status["rollout"]
    d.validate_deployment(d._for_validation(apps.dep))  # the result is a valid Deployment, strictly


def test_rollout_time_out_rolls_back():
    apps, clock = FakeApps(serving_deployment(), "stuck"), Clock()
    with pytest.raises(d.RolloutFailed) as err:
        d.deploy(apps, TARGET, "omtr-role-model", "8", timeout_s=30, poll_s=5, clock=clock, sleep=clock.sleep)
    assert err.value.rolled_back
    msg = str(err.value)
    assert "models:/omtr-role-model/8" in msg and "not finished within 30 s" in msg
    assert "rolled back to models:/omtr-role-model@champion" in msg and "kubectl -n omtr describe" in msg
    assert len(apps.patches) == 2
    back = apps.patches[1]["body"]["spec"]["template"]
    assert back["metadata"]["annotations"] == {"omtr.dev/model-version": "champion"}
    assert back["spec"]["containers"][0]["env"] == [{"name": "MODEL_URI", "value": "models:/omtr-role-model@champion"}]
    assert _template(apps.dep) == ("models:/omtr-role-model@champion", "champion")
    assert 30 <= clock.t <= 40  # gave up at the time-out, not before


def test_progress_deadline_exceeded_rolls_back_at_once():
    apps, clock = FakeApps(serving_deployment(), "deadline"), Clock()
    with pytest.raises(d.RolloutFailed, match="ProgressDeadlineExceeded") as err:
        d.deploy(apps, TARGET, "omtr-role-model", "9", timeout_s=600, poll_s=2, clock=clock, sleep=clock.sleep)
    assert err.value.rolled_back and clock.t < 600
    assert _template(apps.dep) == ("models:/omtr-role-model@champion", "champion")


def test_rollback_removes_what_was_not_there_before():
    dep = serving_deployment()
    tmpl = dep["spec"]["template"]
    del tmpl["metadata"]["annotations"]
    c = tmpl["spec"]["containers"][0]
    c["env"] = [e for e in c["env"] if e["name"] != "MODEL_URI"]
    c["args"] = [a for a in c["args"] if "MODEL_URI" not in a] + ["--model-uri=models:/omtr-role-model@champion"]
    apps, clock = FakeApps(dep, "stuck"), Clock()
    with pytest.raises(d.RolloutFailed):
        d.deploy(apps, TARGET, "omtr-role-model", "3", timeout_s=10, poll_s=5, clock=clock, sleep=clock.sleep)
    back = apps.patches[1]["body"]["spec"]["template"]
    assert back["metadata"]["annotations"] == {"omtr.dev/model-version": None}
    assert back["spec"]["containers"][0]["env"] == [{"name": "MODEL_URI", "$patch": "delete"}]
    assert _template(apps.dep) == (None, None)
    assert "annotations" not in apps.dep["spec"]["template"]["metadata"] or \
        "omtr.dev/model-version" not in apps.dep["spec"]["template"]["metadata"]["annotations"]


def test_missing_deployment_is_a_clear_error():
    with pytest.raises(d.DeployError) as err:
        d.deploy(FakeApps(None), TARGET, "omtr-role-model", "7", timeout_s=10)
    msg = str(err.value)
    assert "deployment omtr/omtr-serving not found" in msg and "apply the serving manifests" in msg


def test_missing_container_and_value_from_are_clear_errors():
    dep = serving_deployment()
    with pytest.raises(d.DeployError, match=r"has no container 'model'.*\['serving'\].*--container"):
        d.deploy(FakeApps(dep), d.Target("omtr", "omtr-serving", "model"), "omtr-role-model", "7", timeout_s=10)
    env = dep["spec"]["template"]["spec"]["containers"][0]["env"]
    env[0] = {"name": "MODEL_URI", "valueFrom": {"configMapKeyRef": {"name": "m", "key": "uri"}}}
    apps = FakeApps(dep)
    with pytest.raises(d.DeployError, match="valueFrom"):
        d.deploy(apps, TARGET, "omtr-role-model", "7", timeout_s=10)
    assert apps.patches == []


def test_a_patch_that_yields_an_invalid_deployment_is_never_sent():
    # a manifest with a misspelt field (what --dry-run --manifest checks without a cluster): strict fails
    dep = serving_deployment()
    dep["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(d.DeployError, match=r"fails the Kubernetes 1\.31 schema"):
        d.deploy(None, TARGET, "omtr-role-model", "7", timeout_s=10, dry_run=True, manifest=dep)
    # a patch body whose annotation is not a string: the API would refuse it; it is caught before
    with pytest.raises(d.DeployError, match="omtr.dev~1model-version|model-version"):
        d.checked_patch(serving_deployment(), TARGET, "models:/omtr-role-model/7", 7)
    apps = FakeApps(serving_deployment())
    with pytest.raises(d.DeployError, match="no Kubernetes 9.99 schemas"):
        d.deploy(apps, TARGET, "omtr-role-model", "7", timeout_s=10, k8s_version="9.99")
    assert apps.patches == []


def test_dry_run_sends_a_server_side_dry_run_only():
    apps = FakeApps(serving_deployment())
    res = d.deploy(apps, TARGET, "omtr-role-model", "7", timeout_s=10, dry_run=True)
    assert res.dry_run and not res.changed
    assert [p.get("dry_run") for p in apps.patches] == ["All"]
    assert _template(apps.dep) == ("models:/omtr-role-model@champion", "champion")


def test_already_serving_is_not_patched_again():
    dep = serving_deployment()
    apps, clock = FakeApps(dep), Clock()
    d.deploy(apps, TARGET, "omtr-role-model", "7", timeout_s=60, poll_s=1, clock=clock, sleep=clock.sleep)
    res = d.deploy(apps, TARGET, "omtr-role-model", "7", timeout_s=60, poll_s=1, clock=clock, sleep=clock.sleep)
    assert not res.changed and len(apps.patches) == 1


def test_strategic_merge_rules():
    base = {"a": {"x": 1, "y": 2}, "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}], "args": ["p"]}
    out = d.strategic_merge(base, {"a": {"y": None, "z": 3}, "args": ["q"],
                                   "env": [{"name": "B", "value": "3"}, {"name": "C", "value": "4"},
                                           {"name": "A", "$patch": "delete"}]})
    assert out == {"a": {"x": 1, "z": 3}, "args": ["q"], "env": [{"name": "B", "value": "3"}, {"name": "C", "value": "4"}]}
    assert base["env"][0] == {"name": "A", "value": "1"}  # the input is left alone


def _registry_with_version(tmp_path) -> str:
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model("omtr-role-model")
    v = client.create_model_version("omtr-role-model", source=str(tmp_path))
    client.set_registered_model_alias("omtr-role-model", "champion", v.version)
    return uri


def _omtr(tmp_path, *args, uri):
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "KUBECONFIG": str(tmp_path / "no-kubeconfig")}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return subprocess.run([sys.executable, "-m", "omtr", "deploy", *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


def test_cli_dry_run_on_the_manifest_resolves_champion(tmp_path):
    uri = _registry_with_version(tmp_path)
    out = tmp_path / "rollout.json"
    r = _omtr(tmp_path, "--dry-run", "--manifest", str(SERVING), "--json", str(out), uri=uri)
    assert r.returncode == 0, r.stderr
    assert "would roll deployment omtr/omtr-serving from models:/omtr-role-model@champion to models:/omtr-role-model/1" in r.stdout
    res = json.loads(out.read_text())
    assert res["version"] == "1" and res["dry_run"] and not res["changed"]

    r = _omtr(tmp_path, "--version", "5", "--dry-run", "--manifest", str(SERVING), uri=uri)
    assert r.returncode == 2 and "has no version 5" in r.stderr and "register and promote it first" in r.stderr
    r = _omtr(tmp_path, "--version", "1", uri=uri)  # no cluster configured
    assert r.returncode == 2 and "no Kubernetes configuration" in r.stderr and "--dry-run --manifest" in r.stderr
    r = _omtr(tmp_path, "--version", "1", "--manifest", str(SERVING), uri=uri)
    assert r.returncode == 2 and "add --dry-run" in r.stderr


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (its strategic merge is the reference)")
@pytest.mark.parametrize("uri,version", [("models:/omtr-role-model/7", "7"), (None, None)])
def test_strategic_merge_matches_kubectl(tmp_path, uri, version):
    """omtr's one strategic-merge path gives what `kubectl patch --local --type strategic` gives for
    the deploy step's patches (set MODEL_URI and the annotation; remove them again), on the serving
    Deployment of k8s/base with a MODEL_URI already set."""
    import yaml

    base_text = (Path(__file__).resolve().parents[1] / "k8s" / "base" / "serving.yaml").read_text()
    dep = next(o for o in yaml.safe_load_all(base_text) if o and o["kind"] == "Deployment")
    dep = d.strategic_merge(dep, d.build_patch("serving", "models:/omtr-role-model/6", "6"))
    (tmp_path / "dep.yaml").write_text(yaml.safe_dump(dep))
    patch = d.build_patch("serving", uri, version)
    r = subprocess.run(["kubectl", "patch", "--local", "-f", str(tmp_path / "dep.yaml"), "--type", "strategic",
                        "-p", json.dumps(patch), "-o", "json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert d.strategic_merge(dep, patch) == json.loads(r.stdout)
