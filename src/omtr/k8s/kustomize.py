"""A small kustomize renderer for the kustomizations under ``k8s/``.

No kustomize binary can be installed on the machines this project is developed on, so the CI checks
render the overlays with this module. It implements the subset of kustomize that ``k8s/`` uses, with
kustomize's semantics, so that ``kubectl apply -k k8s/overlays/NAME`` gives the same objects:

- ``resources``: YAML files (one or more documents) and directories holding a kustomization;
- ``namespace``: set on every namespaced object (cluster-scoped kinds are left alone);
- ``labels``: ``pairs`` added to ``metadata.labels`` (``includeSelectors: true`` is refused, as it
  would rewrite selectors; ``includeTemplates: true`` also labels pod templates of the workload kinds);
- ``images``: ``name`` matched against every ``containers``/``initContainers`` image at any depth
  (custom resources included, CustomResourceDefinitions skipped: kustomize's legacy image walk),
  with ``newName``, ``newTag`` and ``digest``;
- ``patches``: a ``path`` or an inline ``patch``, with an optional ``target`` (``kind``, ``name``,
  ``group``, ``version``, ``namespace``). A patch that is a YAML list is a JSON 6902 patch (``add``,
  ``remove``, ``replace``, ``test``); otherwise it is a strategic merge patch, matched by its own
  kind and name when no target is given;
- ``configMapGenerator`` / ``secretGenerator`` with ``literals`` and ``files``, only with
  ``disableNameSuffixHash: true`` (in ``options`` or ``generatorOptions``): the hash suffix and the
  rewriting of references to it are not implemented, and asking for them is an error.

Anything else in a kustomization is an error that names the field, never silently ignored.

Strategic merge follows the Kubernetes patch strategies of the fields ``k8s/`` patches: lists of
containers, init containers, env, volumes, ports and image pull secrets merge by ``name``
(``containerPort`` for ports), volume mounts by ``mountPath``; every other list is replaced; a
``null`` value deletes a key; ``$patch: delete`` in a list item removes the item. Objects of kinds
outside Kubernetes' own API groups (custom resources such as PyTorchJob) have no patch strategies,
so their lists are replaced, as kustomize does (JSON merge patch).
"""

from __future__ import annotations

import base64
import copy
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")

SUPPORTED_FIELDS = {
    "apiVersion", "kind", "resources", "namespace", "labels", "images", "patches",
    "configMapGenerator", "secretGenerator", "generatorOptions",
}

CLUSTER_SCOPED = {
    "Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "PersistentVolume",
    "StorageClass", "PriorityClass", "Node", "APIService", "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration", "IngressClass", "RuntimeClass", "CSIDriver", "VolumeAttachment",
}

# kustomize's legacy output order: these kinds first (in this order), everything else after, by
# kind then name.
ORDER_FIRST = [
    "Namespace", "ResourceQuota", "StorageClass", "CustomResourceDefinition", "ServiceAccount",
    "PodSecurityPolicy", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ConfigMap",
    "Secret", "Endpoints", "Service", "LimitRange", "PriorityClass", "PersistentVolume",
    "PersistentVolumeClaim", "Deployment", "StatefulSet", "CronJob", "PodDisruptionBudget",
]
ORDER_LAST = ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]

# Patch merge keys of the lists k8s/ patches (Kubernetes' patchMergeKey for these fields).
MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name", "env": "name",
    "volumes": "name", "imagePullSecrets": "name", "volumeMounts": "mountPath", "ports": "containerPort",
}

WORKLOAD_TEMPLATES = {
    "Deployment": ("spec", "template"), "StatefulSet": ("spec", "template"), "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"), "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


class KustomizeError(ValueError):
    """A kustomization this renderer cannot build; the message names the file and the field."""


def _yaml():
    import yaml

    return yaml


def find_kustomization(directory: Path) -> Path:
    for name in KUSTOMIZATION_FILES:
        if (directory / name).is_file():
            return directory / name
    raise KustomizeError(f"{directory}: no kustomization.yaml in it; a directory in resources must hold one")


def load_documents(path: Path) -> list[dict]:
    """Every non-empty YAML document of a file, each checked to be a Kubernetes object."""
    try:
        docs = [d for d in _yaml().safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    except _yaml().YAMLError as exc:
        raise KustomizeError(f"{path}: not valid YAML ({exc})") from None
    for d in docs:
        if not isinstance(d, dict) or not {"apiVersion", "kind"} <= d.keys() or "name" not in d.get("metadata", {}):
            raise KustomizeError(f"{path}: every document must be an object with apiVersion, kind and metadata.name")
    return docs


def render(directory: str | Path) -> list[dict]:
    """The objects a kustomization directory builds, in kustomize's output order."""
    objs = _build(Path(directory).resolve(), stack=())
    return sorted(objs, key=_order_key)


def render_yaml(directory: str | Path) -> str:
    """``render`` as one multi-document YAML stream (what ``kustomize build`` prints)."""
    yaml = _yaml()
    return "---\n".join(yaml.safe_dump(o, sort_keys=False, default_flow_style=False) for o in render(directory))


def _order_key(obj: dict) -> tuple:
    kind = obj["kind"]
    if kind in ORDER_FIRST:
        rank = ORDER_FIRST.index(kind)
    elif kind in ORDER_LAST:
        rank = len(ORDER_FIRST) + 1 + ORDER_LAST.index(kind)
    else:
        rank = len(ORDER_FIRST)
    return (rank, kind, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def _ident(obj: dict) -> tuple[str, str, str, str]:
    group = obj["apiVersion"].rpartition("/")[0]
    return (group, obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def _build(directory: Path, stack: tuple[Path, ...]) -> list[dict]:
    if directory in stack:
        raise KustomizeError(f"{directory}: resources form a cycle ({' -> '.join(map(str, stack + (directory,)))})")
    kfile = find_kustomization(directory)
    try:
        k = _yaml().safe_load(kfile.read_text(encoding="utf-8")) or {}
    except _yaml().YAMLError as exc:
        raise KustomizeError(f"{kfile}: not valid YAML ({exc})") from None
    unknown = set(k) - SUPPORTED_FIELDS
    if unknown:
        raise KustomizeError(f"{kfile}: field(s) {sorted(unknown)} are not supported by omtr's renderer; "
                             f"use only {sorted(SUPPORTED_FIELDS - {'apiVersion', 'kind'})}")
    objs: list[dict] = []
    for entry in k.get("resources") or []:
        path = (directory / entry).resolve()
        if path.is_dir():
            objs.extend(_build(path, stack + (directory,)))
        elif path.is_file():
            objs.extend(load_documents(path))
        else:
            raise KustomizeError(f"{kfile}: resource {entry!r} is neither a file nor a directory")
    objs.extend(_generate(k, kfile))
    seen: dict[tuple, int] = {}
    for o in objs:
        ident = _ident(o)
        if ident in seen:
            raise KustomizeError(f"{kfile}: {o['kind']}/{o['metadata']['name']} appears twice; "
                                 "each object may come from one resource only")
        seen[ident] = 1
    for n, patch in enumerate(k.get("patches") or []):
        _apply_patch(objs, patch, kfile, n)
    if k.get("namespace"):
        for o in objs:
            if o["kind"] not in CLUSTER_SCOPED:
                o["metadata"]["namespace"] = k["namespace"]
    for n, spec in enumerate(k.get("labels") or []):
        _apply_labels(objs, spec, kfile, n)
    for n, spec in enumerate(k.get("images") or []):
        _apply_image(objs, spec, kfile, n)
    return objs


# ---------------------------------------------------------------------------------- generators
def _generate(k: dict, kfile: Path) -> list[dict]:
    out = []
    global_opts = k.get("generatorOptions") or {}
    for field, kind in (("configMapGenerator", "ConfigMap"), ("secretGenerator", "Secret")):
        for n, gen in enumerate(k.get(field) or []):
            where = f"{kfile}: {field}[{n}]"
            if "name" not in gen:
                raise KustomizeError(f"{where} needs a name")
            extra = set(gen) - {"name", "literals", "files", "options", "type", "namespace"}
            if extra:
                raise KustomizeError(f"{where}: field(s) {sorted(extra)} are not supported; use literals or files")
            opts = {**global_opts, **(gen.get("options") or {})}
            if not opts.get("disableNameSuffixHash"):
                raise KustomizeError(f"{where} ({gen['name']}): name suffix hashes are not implemented by omtr's "
                                     "renderer; set options.disableNameSuffixHash: true")
            data: dict[str, str] = {}
            for lit in gen.get("literals") or []:
                key, sep, value = str(lit).partition("=")
                if not sep or not key:
                    raise KustomizeError(f"{where}: literal {lit!r} is not KEY=VALUE")
                data[key] = value
            for f in gen.get("files") or []:
                key, sep, rel = str(f).partition("=")
                rel = rel if sep else key
                key = key if sep else Path(rel).name
                path = kfile.parent / rel
                if not path.is_file():
                    raise KustomizeError(f"{where}: file {rel!r} not found next to {kfile.name}")
                data[key] = path.read_text(encoding="utf-8")
            meta: dict[str, Any] = {"name": gen["name"]}
            if gen.get("namespace"):
                meta["namespace"] = gen["namespace"]
            for key in ("labels", "annotations"):
                if opts.get(key):
                    meta[key] = dict(opts[key])
            obj: dict[str, Any] = {"apiVersion": "v1", "kind": kind, "metadata": meta}
            if kind == "Secret":
                obj["type"] = gen.get("type", "Opaque")
                obj["data"] = {key: base64.b64encode(v.encode()).decode() for key, v in sorted(data.items())}
            else:
                obj["data"] = dict(sorted(data.items()))
            out.append(obj)
    return out


# ---------------------------------------------------------------------------------- transformers
def _apply_labels(objs: list[dict], spec: dict, kfile: Path, n: int) -> None:
    where = f"{kfile}: labels[{n}]"
    if set(spec) - {"pairs", "includeSelectors", "includeTemplates"}:
        raise KustomizeError(f"{where}: only pairs, includeSelectors and includeTemplates are supported")
    if spec.get("includeSelectors"):
        raise KustomizeError(f"{where}: includeSelectors: true is not supported (it rewrites selectors); "
                             "label selectors explicitly in the resources")
    pairs = {str(a): str(b) for a, b in (spec.get("pairs") or {}).items()}
    for o in objs:
        o["metadata"].setdefault("labels", {}).update(pairs)
        if spec.get("includeTemplates") and o["kind"] in WORKLOAD_TEMPLATES:
            node = o
            for key in WORKLOAD_TEMPLATES[o["kind"]]:
                node = node.setdefault(key, {})
            node.setdefault("metadata", {}).setdefault("labels", {}).update(pairs)


def split_image(image: str) -> tuple[str, str | None, str | None]:
    """(name, tag, digest) of an image reference; a registry port is not a tag."""
    name, _, digest = image.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    tag = None
    if colon > slash:
        name, tag = name[:colon], name[colon + 1:]
    return name, tag, digest or None


def _apply_image(objs: list[dict], spec: dict, kfile: Path, n: int) -> None:
    where = f"{kfile}: images[{n}]"
    if "name" not in spec or set(spec) - {"name", "newName", "newTag", "digest"}:
        raise KustomizeError(f"{where}: needs name, and only newName, newTag and digest are supported")

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("containers", "initContainers") and isinstance(value, list):
                    for c in value:
                        if isinstance(c, dict) and isinstance(c.get("image"), str):
                            c["image"] = _retag(c["image"], spec)
                visit(value)
        elif isinstance(node, list):
            for item in node:
                visit(item)

    for o in objs:
        if o["kind"] != "CustomResourceDefinition":
            visit(o)


def _retag(image: str, spec: dict) -> str:
    name, tag, digest = split_image(image)
    if name != spec["name"]:
        return image
    name = spec.get("newName", name)
    if spec.get("digest"):
        return f"{name}@{spec['digest']}"
    if spec.get("newTag") is not None:
        return f"{name}:{spec['newTag']}"
    return f"{name}:{tag}" if tag else (f"{name}@{digest}" if digest else name)


# ---------------------------------------------------------------------------------- patches
def _is_builtin(api_version: str) -> bool:
    group = api_version.rpartition("/")[0]
    return "." not in group or group.endswith(".k8s.io")


def _matches(obj: dict, target: dict) -> bool:
    group, _, version = obj["apiVersion"].rpartition("/")
    checks = {"kind": obj["kind"], "name": obj["metadata"]["name"], "group": group, "version": version,
              "namespace": obj["metadata"].get("namespace", "")}
    return all(checks[k] == v for k, v in target.items())


def _apply_patch(objs: list[dict], entry: dict, kfile: Path, n: int) -> None:
    where = f"{kfile}: patches[{n}]"
    if set(entry) - {"path", "patch", "target"} or ("path" in entry) == ("patch" in entry):
        raise KustomizeError(f"{where}: give exactly one of path or patch, and optionally target")
    target = entry.get("target") or {}
    if set(target) - {"kind", "name", "group", "version", "namespace"}:
        raise KustomizeError(f"{where}: target may select by kind, name, group, version and namespace only")
    if "path" in entry:
        path = kfile.parent / entry["path"]
        if not path.is_file():
            raise KustomizeError(f"{where}: patch file {entry['path']!r} not found")
        text = path.read_text(encoding="utf-8")
    else:
        text = entry["patch"]
    try:
        body = _yaml().safe_load(text)
    except _yaml().YAMLError as exc:
        raise KustomizeError(f"{where}: not valid YAML ({exc})") from None
    if isinstance(body, list):  # JSON 6902
        if not target:
            raise KustomizeError(f"{where}: a JSON 6902 patch needs a target")
        hits = [o for o in objs if _matches(o, target)]
        if not hits:
            raise KustomizeError(f"{where}: no object matches target {target}")
        for o in hits:
            for op in body:
                _json6902(o, op, where)
        return
    if not isinstance(body, dict):
        raise KustomizeError(f"{where}: a patch is a strategic merge object or a JSON 6902 list")
    if not target:
        meta = body.get("metadata") or {}
        if "kind" not in body or "name" not in meta:
            raise KustomizeError(f"{where}: a strategic merge patch without target needs kind and metadata.name")
        target = {"kind": body["kind"], "name": meta["name"]}
    hits = [o for o in objs if _matches(o, target)]
    if not hits:
        raise KustomizeError(f"{where}: no object matches {target}")
    for o in hits:
        patch = copy.deepcopy(body)
        if "metadata" in patch and "name" in patch["metadata"] and entry.get("target"):
            patch["metadata"] = {k: v for k, v in patch["metadata"].items() if k != "name"}
        merged = strategic_merge(o, patch, builtin=_is_builtin(o["apiVersion"]))
        o.clear()
        o.update(merged)


def strategic_merge(base: Any, patch: Any, *, builtin: bool = True, field: str = "") -> Any:
    """``patch`` merged into ``base`` (neither is modified)."""
    if isinstance(patch, dict) and isinstance(base, dict):
        if patch.get("$patch") == "replace":
            return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
        out = copy.deepcopy(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = strategic_merge(out[key], value, builtin=builtin, field=key)
            else:
                out[key] = _strip_directives(value)
        return out
    if isinstance(patch, list) and isinstance(base, list) and builtin and field in MERGE_KEYS:
        key = MERGE_KEYS[field]
        if not all(isinstance(i, dict) and key in i for i in base + patch):
            return _strip_directives(patch)
        out = [copy.deepcopy(i) for i in base]
        for item in patch:
            idx = next((j for j, b in enumerate(out) if b[key] == item[key]), None)
            if item.get("$patch") == "delete":
                if idx is not None:
                    out.pop(idx)
            elif idx is None:
                out.append(_strip_directives(item))
            else:
                out[idx] = strategic_merge(out[idx], item, builtin=builtin, field="")
        return out
    return _strip_directives(patch)


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if k != "$patch" and v is not None}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value if not (isinstance(v, dict) and v.get("$patch") == "delete")]
    return copy.deepcopy(value)


def _pointer(path: str, where: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise KustomizeError(f"{where}: JSON pointer {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _json6902(obj: dict, op: dict, where: str) -> None:
    kind = op.get("op")
    if kind not in ("add", "remove", "replace", "test"):
        raise KustomizeError(f"{where}: JSON 6902 op {kind!r} is not supported (add, remove, replace, test)")
    parts = _pointer(op.get("path", ""), where)
    if not parts:
        raise KustomizeError(f"{where}: a JSON 6902 op on the whole object is not supported")
    parent: Any = obj
    for p in parts[:-1]:
        try:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        except (KeyError, IndexError, ValueError):
            raise KustomizeError(f"{where}: path {op['path']} does not exist in {obj['kind']}/{obj['metadata']['name']}") from None
    last = parts[-1]
    value = copy.deepcopy(op.get("value"))
    missing = KustomizeError(f"{where}: path {op['path']} does not exist in {obj['kind']}/{obj['metadata']['name']}")
    if isinstance(parent, list):
        if last == "-" and kind == "add":
            parent.append(value)
            return
        try:
            i = int(last)
        except ValueError:
            raise missing from None
        if kind == "add":
            if not 0 <= i <= len(parent):
                raise missing
            parent.insert(i, value)
        elif not 0 <= i < len(parent):
            raise missing
        elif kind == "remove":
            parent.pop(i)
        elif kind == "replace":
            parent[i] = value
        elif parent[i] != value:
            raise KustomizeError(f"{where}: test failed at {op['path']}: {parent[i]!r} != {value!r}")
        return
    if not isinstance(parent, dict):
        raise missing
    if kind == "add":
        parent[last] = value
    elif last not in parent:
        raise missing
    elif kind == "remove":
        del parent[last]
    elif kind == "replace":
        parent[last] = value
    elif parent[last] != value:
        raise KustomizeError(f"{where}: test failed at {op['path']}: {parent[last]!r} != {value!r}")
