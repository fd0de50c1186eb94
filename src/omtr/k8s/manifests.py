"""The manifests under ``k8s/``: where they are, how an overlay renders, and offline validation.

Every object is checked with kubernetes-validate's strict schemas (unknown fields are errors) for
one Kubernetes version (``DEFAULT_K8S_VERSION``, 1.31); the custom resources those schemas do not
cover against pinned CRD schemas (:mod:`omtr.k8s.trainjob`): PyTorchJob (Kubeflow Training
Operator), TrainJob, ClusterTrainingRuntime and TrainingRuntime (Kubeflow Trainer v2). A kind with
no schema at all is an error, never a silent pass.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omtr.k8s.trainjob import DEFAULT_K8S_VERSION, RESOURCES, TrainJobInvalid, validate_custom_object

log = logging.getLogger(__name__)

OVERLAYS = ("dev", "gpu-cluster")


def k8s_root() -> Path:
    """``k8s/`` of the checkout: under the working directory, else beside the installed sources."""
    here = Path.cwd() / "k8s"
    if (here / "overlays").is_dir():
        return here
    import omtr

    beside = Path(omtr.__file__).resolve().parents[2] / "k8s"
    if (beside / "overlays").is_dir():
        return beside
    raise FileNotFoundError("k8s/ not found: run from the omtr checkout (k8s/overlays/...) or pass a directory")


def overlay_dir(name_or_path: str) -> Path:
    """An overlay by name (``dev``, ``gpu-cluster``) or a kustomization directory by path."""
    p = Path(name_or_path)
    if p.is_dir():
        return p
    if "/" not in name_or_path:
        d = k8s_root() / "overlays" / name_or_path
        if d.is_dir():
            return d
    raise FileNotFoundError(f"{name_or_path}: neither an overlay of k8s/overlays ({', '.join(OVERLAYS)}) "
                            "nor a kustomization directory")


def render_overlay(name_or_path: str) -> list[dict]:
    from omtr.k8s.kustomize import render

    return render(overlay_dir(name_or_path))


def validate_object(obj: dict, k8s_version: str = DEFAULT_K8S_VERSION) -> str | None:
    """None when ``obj`` is valid, else one line naming the object and what is wrong."""
    import kubernetes_validate
    from kubernetes_validate.utils import SchemaNotFoundError, ValidationError

    name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    pinned = RESOURCES.get(obj.get("kind"))
    if pinned and obj.get("apiVersion") == pinned.api_version:
        try:
            validate_custom_object(obj, k8s_version)
        except TrainJobInvalid as exc:
            return str(exc)
        return None
    try:
        kubernetes_validate.validate(obj, k8s_version, strict=True)
    except SchemaNotFoundError:
        return f"{name}: no schema for {obj.get('apiVersion')} {obj.get('kind')} in Kubernetes {k8s_version}; " \
               "vendor its CRD schema (see src/omtr/data/k8s/) before adding such objects"
    except ValidationError as exc:  # a jsonschema error carrying the offending path
        where = ".".join(map(str, exc.absolute_path)) or "(root)"
        return f"{name}: {where}: {exc.message}"
    return None


def validate_objects(objs: list[dict], k8s_version: str = DEFAULT_K8S_VERSION) -> list[str]:
    return [e for e in (validate_object(o, k8s_version) for o in objs) if e]
