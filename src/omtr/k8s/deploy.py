"""Roll the serving Deployment to a registered model version (``omtr deploy``).

The serving Deployment (``omtr-serving``, container ``serving``) serves whatever its environment
variable ``MODEL_URI`` names (``models:/omtr-role-model/3``). Rolling it to another version is one
strategic-merge patch of the pod template: that variable, plus the annotation
``omtr.dev/model-version`` so that the change shows in ``kubectl describe`` and in the
ReplicaSet's template. Then the rollout is watched the way ``kubectl rollout status`` does
(observed generation, updated, total and available replicas, ``ProgressDeadlineExceeded``) until
a time-out; on failure the previous ``MODEL_URI`` and annotation are patched back.

Every patch is first applied here to the Deployment it will change (read from the cluster, or from
a manifest file for a dry run without a cluster) and the result is validated offline against the
Kubernetes schemas of :data:`KUBERNETES_VERSION` (1.31, as for all of k8s/) with
``kubernetes-validate --strict``. :func:`strategic_merge` is omtr's only strategic-merge code (the
manifests are rendered by kustomize itself); a test holds it to ``kubectl patch --local``.

``apps`` is a ``kubernetes.client.AppsV1Api`` (or anything with its three methods
``read_namespaced_deployment``, ``read_namespaced_deployment_status``, ``patch_namespaced_deployment``).
"""

from __future__ import annotations

import copy
import json
import logging
import time
from dataclasses import dataclass, field

log = logging.getLogger("omtr.deploy")

# The Kubernetes version whose schemas patched Deployments are validated against: the one every
# manifest of k8s/ targets and is validated for (omtr.k8s.manifests).
from omtr.k8s.trainjob import DEFAULT_K8S_VERSION as KUBERNETES_VERSION  # noqa: E402
ANNOTATION = "omtr.dev/model-version"
ENV_VAR = "MODEL_URI"

# Strategic merge: lists of these fields merge element-wise by the key named (the Kubernetes API's
# patchMergeKey for each); any other list is replaced as a whole.
MERGE_KEYS = {"containers": "name", "initContainers": "name", "env": "name", "volumes": "name",
              "volumeMounts": "mountPath", "ports": "containerPort", "imagePullSecrets": "name",
              "tolerations": None, "conditions": "type"}


@dataclass(frozen=True)
class Target:
    """Which Deployment and container serve the model."""

    namespace: str = "omtr"
    deployment: str = "omtr-serving"
    container: str = "serving"

    def __str__(self) -> str:
        return f"deployment {self.namespace}/{self.deployment}"


class DeployError(Exception):
    """The deploy step cannot go on; the message names the Deployment and what to do."""


class RolloutFailed(DeployError):
    """The rollout did not finish; ``rolled_back`` says whether the previous model was restored."""

    def __init__(self, msg: str, rolled_back: bool):
        super().__init__(msg)
        self.rolled_back = rolled_back


@dataclass
class Result:
    target: str
    model_uri: str
    version: str
    previous_model_uri: str | None
    previous_version: str | None
    patch: dict
    dry_run: bool
    changed: bool
    seconds: float = 0.0
    status: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def model_uri(name: str, version: str) -> str:
    return f"models:/{name}/{version}"


def resolve_version(name: str, version: str | None, alias: str = "champion") -> str:
    """``version`` checked against the registry, or the version that ``alias`` points at."""
    import mlflow
    from mlflow.exceptions import MlflowException

    from omtr.paths import default_tracking_uri

    uri = default_tracking_uri()
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    try:
        if version:
            return str(client.get_model_version(name, str(version)).version)
        return str(client.get_model_version_by_alias(name, alias).version)
    except MlflowException as exc:
        what = f"version {version}" if version else f"alias @{alias}"
        raise DeployError(f"registered model {name} has no {what} in the registry at {uri} "
                          f"({exc.error_code}): register and promote it first, or set MLFLOW_TRACKING_URI") from None


# ---------------------------------------------------------------------------------------- patches


def build_patch(container: str, uri: str | None, version: str | None) -> dict:
    """The strategic-merge patch that sets (or, with None, removes) MODEL_URI and the annotation."""
    env = {"name": ENV_VAR, "value": uri} if uri is not None else {"name": ENV_VAR, "$patch": "delete"}
    return {"spec": {"template": {
        "metadata": {"annotations": {ANNOTATION: version}},
        "spec": {"containers": [{"name": container, "env": [env]}]},
    }}}


def strategic_merge(base, patch):
    """``patch`` applied to ``base`` as a strategic-merge patch (the subset of its rules that the
    deploy patches use: maps merge, ``None`` deletes a key, lists in :data:`MERGE_KEYS` merge by
    their key, an element ``{"$patch": "delete", key: ...}`` removes one, other lists replace)."""
    if not isinstance(base, dict) or not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(base)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict):
            out[k] = strategic_merge(out.get(k) or {}, v)
        elif isinstance(v, list) and MERGE_KEYS.get(k) and isinstance(out.get(k), list):
            out[k] = _merge_list(out[k], v, MERGE_KEYS[k])
        elif isinstance(v, list):
            out[k] = [{x: y for x, y in e.items() if x != "$patch"} if isinstance(e, dict) else e
                      for e in v if not (isinstance(e, dict) and e.get("$patch") == "delete")]
        else:
            out[k] = copy.deepcopy(v)
    return out


def _merge_list(base: list, patch: list, key: str) -> list:
    out = [copy.deepcopy(e) for e in base]
    for item in patch:
        idx = next((i for i, e in enumerate(out) if isinstance(e, dict) and e.get(key) == item.get(key)), None)
        if item.get("$patch") == "delete":
            if idx is not None:
                out.pop(idx)
        elif idx is None:
            out.append(copy.deepcopy(item))
        else:
            out[idx] = strategic_merge(out[idx], item)
    return out


def validate_deployment(obj: dict, version: str = KUBERNETES_VERSION) -> None:
    """Raise DeployError unless ``obj`` is a valid apps/v1 Deployment (strict: no unknown fields)."""
    import kubernetes_validate
    from kubernetes_validate.utils import VersionNotSupportedError

    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except VersionNotSupportedError:
        raise DeployError(f"no Kubernetes {version} schemas in kubernetes-validate "
                          f"(it has up to {kubernetes_validate.latest_version()}): pass another --kubernetes-version") from None
    except kubernetes_validate.ValidationError as exc:
        where = "/".join(str(p) for p in getattr(exc, "path", ())) or "(top level)"
        raise DeployError(f"the patched Deployment {obj.get('metadata', {}).get('name')} fails the Kubernetes "
                          f"{version} schema at {where}: {exc.message}") from None


def current_model(dep: dict, container: str) -> tuple[str | None, str | None]:
    """(MODEL_URI, annotation) of the Deployment's pod template; DeployError if the container is missing
    or MODEL_URI comes from a ``valueFrom`` that a value patch cannot replace."""
    tmpl = dep.get("spec", {}).get("template", {})
    containers = tmpl.get("spec", {}).get("containers", [])
    c = next((c for c in containers if c.get("name") == container), None)
    name = dep.get("metadata", {}).get("name")
    if c is None:
        raise DeployError(f"deployment {name} has no container {container!r} (it has "
                          f"{[x.get('name') for x in containers]}): pass --container")
    env = next((e for e in c.get("env") or [] if e.get("name") == ENV_VAR), None)
    if env is not None and "valueFrom" in env:
        raise DeployError(f"deployment {name}: {ENV_VAR} of container {container} comes from valueFrom; "
                          f"the deploy step sets it as a plain value: change the manifest to `value:`")
    ann = (tmpl.get("metadata") or {}).get("annotations") or {}
    return (env or {}).get("value"), ann.get(ANNOTATION)


def checked_patch(dep: dict, target: Target, uri: str | None, version: str | None,
                  k8s_version: str = KUBERNETES_VERSION) -> dict:
    """The patch for ``dep``, after validating the Deployment it produces."""
    patch = build_patch(target.container, uri, version)
    patched = strategic_merge(dep, patch)
    validate_deployment(_for_validation(patched), k8s_version)
    return patch


def _for_validation(dep: dict) -> dict:
    """What was read from the API minus the server-written parts the schema has no trouble with
    but a manifest would not carry (status, managed fields)."""
    d = copy.deepcopy(dep)
    d.pop("status", None)
    (d.get("metadata") or {}).pop("managedFields", None)
    d.setdefault("apiVersion", "apps/v1")
    d.setdefault("kind", "Deployment")
    return d


# ---------------------------------------------------------------------------------------- rollout


def rollout_state(dep: dict) -> tuple[bool, str | None, str]:
    """(done, failure reason or None, progress message) as ``kubectl rollout status`` judges it."""
    meta, spec, st = dep.get("metadata", {}), dep.get("spec", {}), dep.get("status") or {}
    for c in st.get("conditions") or []:
        if c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded":
            return False, "ProgressDeadlineExceeded", c.get("message") or "progress deadline exceeded"
    if (st.get("observedGeneration") or 0) < (meta.get("generation") or 0):
        return False, None, "waiting for the controller to observe the new generation"
    want = spec.get("replicas", 1)
    updated, total, avail = (st.get(k) or 0 for k in ("updatedReplicas", "replicas", "availableReplicas"))
    if updated < want:
        return False, None, f"{updated} of {want} replicas updated"
    if total > updated:
        return False, None, f"{total - updated} old replicas pending termination"
    if avail < updated:
        return False, None, f"{avail} of {updated} updated replicas available"
    return True, None, f"{avail} of {want} replicas available"


def _as_dict(obj) -> dict:
    if isinstance(obj, dict):
        return obj
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(obj)


def _api_error(exc, target: Target, doing: str) -> DeployError:
    status = getattr(exc, "status", None)
    if status == 404:
        return DeployError(f"{target} not found while {doing}: apply the serving manifests first "
                           f"(kubectl apply -k k8s/overlays/...) or pass --namespace/--deployment")
    if status in (401, 403):
        return DeployError(f"not allowed to {doing} {target} (HTTP {status}): the deploy step's ServiceAccount "
                           f"needs get/patch on deployments in namespace {target.namespace}")
    return DeployError(f"the Kubernetes API failed while {doing} {target}: HTTP {status} {getattr(exc, 'reason', exc)}")


def read(apps, target: Target) -> dict:
    from kubernetes.client.exceptions import ApiException

    try:
        return _as_dict(apps.read_namespaced_deployment(target.deployment, target.namespace))
    except ApiException as exc:
        raise _api_error(exc, target, "reading") from None


def _patch(apps, target: Target, body: dict, *, dry_run: bool = False) -> dict:
    from kubernetes.client.exceptions import ApiException

    kwargs = {"dry_run": "All"} if dry_run else {}
    try:
        return _as_dict(apps.patch_namespaced_deployment(target.deployment, target.namespace, body, **kwargs))
    except ApiException as exc:
        raise _api_error(exc, target, "patching") from None


def wait_rollout(apps, target: Target, *, timeout_s: float, poll_s: float = 2.0, clock=time.monotonic,
                 sleep=time.sleep) -> tuple[bool, str]:
    """Poll the Deployment's status until the rollout is done, fails, or ``timeout_s`` passes."""
    from kubernetes.client.exceptions import ApiException

    deadline = clock() + timeout_s
    msg = "no status read yet"
    while True:
        try:
            dep = _as_dict(apps.read_namespaced_deployment_status(target.deployment, target.namespace))
        except ApiException as exc:
            raise _api_error(exc, target, "watching the rollout of") from None
        done, failed, msg = rollout_state(dep)
        if done:
            return True, msg
        if failed:
            return False, f"{failed}: {msg}"
        log.info("%s: %s", target, msg)
        if clock() >= deadline:
            return False, f"not finished within {timeout_s:g} s ({msg})"
        sleep(poll_s)


def deploy(apps, target: Target, name: str, version: str, *, timeout_s: float = 600, poll_s: float = 2.0,
           dry_run: bool = False, manifest: dict | None = None, k8s_version: str = KUBERNETES_VERSION,
           clock=time.monotonic, sleep=time.sleep) -> Result:
    """Roll ``target`` to ``models:/name/version``: validate, patch, wait, roll back on failure.

    ``dry_run``: validate and return the patch without changing anything (with ``apps`` it is also
    sent to the API server with ``dryRun=All``). ``manifest``: the Deployment to patch when there
    is no API server (dry runs only)."""
    if manifest is not None and not dry_run:
        raise DeployError("a manifest file stands in for the cluster only in a dry run: add --dry-run")
    uri = model_uri(name, version)
    dep = manifest if manifest is not None else read(apps, target)
    prev_uri, prev_version = current_model(dep, target.container)
    patch = checked_patch(dep, target, uri, str(version), k8s_version)
    res = Result(str(target), uri, str(version), prev_uri, prev_version, patch, dry_run, changed=False)
    if dry_run:
        if apps is not None and manifest is None:
            _patch(apps, target, patch, dry_run=True)
        return res
    if prev_uri == uri and prev_version == str(version):
        log.info("%s already serves %s", target, uri)
        done, msg = wait_rollout(apps, target, timeout_s=timeout_s, poll_s=poll_s, clock=clock, sleep=sleep)
        res.status = {"rollout": msg}
        if not done:
            raise RolloutFailed(f"{target} already names {uri} but its rollout is not healthy: {msg}; "
                                f"check it with kubectl -n {target.namespace} describe deployment {target.deployment}",
                                rolled_back=False)
        return res
    back = checked_patch(dep, target, prev_uri, prev_version, k8s_version)  # validated before anything changes
    t0 = clock()
    log.info("%s: %s -> %s", target, prev_uri, uri)
    _patch(apps, target, patch)
    res.changed = True
    done, msg = wait_rollout(apps, target, timeout_s=timeout_s, poll_s=poll_s, clock=clock, sleep=sleep)
    res.seconds = round(clock() - t0, 3)
    res.status = {"rollout": msg}
    if done:
        return res
    log.warning("%s: rollout to %s failed (%s); rolling back to %s", target, uri, msg, prev_uri)
    try:
        _patch(apps, target, back)
    except DeployError as exc:
        raise RolloutFailed(f"{target}: the rollout to {uri} failed ({msg}) and the rollback to {prev_uri} "
                            f"failed too ({exc}); restore it by hand: kubectl -n {target.namespace} rollout undo "
                            f"deployment/{target.deployment}", rolled_back=False) from None
    raise RolloutFailed(f"{target}: the rollout to {uri} failed ({msg}); rolled back to {prev_uri or 'no MODEL_URI'}. "
                        f"See why: kubectl -n {target.namespace} describe deployment {target.deployment}",
                        rolled_back=True)


def deployment_from_manifest(text: str, target: Target) -> dict:
    """The Deployment named ``target.deployment`` among the YAML documents of ``text``."""
    import yaml

    found = []
    for doc in yaml.safe_load_all(text):
        if isinstance(doc, dict) and doc.get("kind") == "Deployment":
            found.append(doc.get("metadata", {}).get("name"))
            if doc.get("metadata", {}).get("name") == target.deployment:
                return doc
    raise DeployError(f"the manifest has no Deployment named {target.deployment} (it has {found or 'none'}): "
                      f"pass --deployment or another --manifest")


def summary(res: Result) -> str:
    if res.dry_run:
        return f"dry run: would roll {res.target} from {res.previous_model_uri} to {res.model_uri}; patch:\n" + \
            json.dumps(res.patch, indent=2)
    if not res.changed:
        return f"{res.target} already serves {res.model_uri}"
    return f"{res.target} now serves {res.model_uri} (was {res.previous_model_uri}; rollout {res.seconds:g} s)"
