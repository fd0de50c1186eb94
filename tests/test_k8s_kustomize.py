"""k8s/ rendered by the real kustomize (``kubectl kustomize``, or the ``kustomize`` binary): both
overlays render, each object once, in the overlay's namespace, with the overlay's images; a broken
kustomization is an error that names the directory and kustomize's reason; a missing binary is an
error that says what to install. (Strict schema validation of the rendered objects is
test_k8s_manifests.py's.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from omtr.k8s.kustomize import KustomizeError, command, render, render_yaml
from omtr.k8s.manifests import OVERLAYS

ROOT = Path(__file__).resolve().parents[1]

if shutil.which("kubectl") is None and shutil.which("kustomize") is None:
    pytest.skip("needs kubectl (with kustomize v5) or kustomize", allow_module_level=True)

CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass", "StorageClass"}


@pytest.mark.parametrize("overlay,namespace", [("dev", "omtr-dev"), ("gpu-cluster", "omtr")])
def test_overlays_render_with_kustomize(overlay, namespace):
    objs = render(ROOT / "k8s" / "overlays" / overlay)
    assert len(objs) >= 20
    ids = [(o["apiVersion"], o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs]
    assert len(set(ids)) == len(ids)  # nothing rendered twice
    for o in objs:
        if o["kind"] not in CLUSTER_SCOPED:
            assert o["metadata"].get("namespace") == namespace, (o["kind"], o["metadata"]["name"])
    kinds = {o["kind"] for o in objs}
    assert {"Deployment", "Service", "NetworkPolicy", "PersistentVolumeClaim"} <= kinds


def test_both_overlays_differ_where_they_should():
    dev, gpu = (render(ROOT / "k8s" / "overlays" / n) for n in OVERLAYS)
    images = lambda objs: {c["image"] for o in objs for c in _containers(o)}  # noqa: E731
    assert images(dev) and images(gpu)
    assert {o["metadata"]["namespace"] for o in dev if "namespace" in o["metadata"]} == {"omtr-dev"}


def _containers(obj):
    spec = obj.get("spec", {})
    for path in (("template", "spec"), ("jobTemplate", "spec", "template", "spec")):
        s = spec
        for p in path:
            s = s.get(p, {}) if isinstance(s, dict) else {}
        yield from s.get("containers", []) if isinstance(s, dict) else []


def test_a_broken_kustomization_names_the_directory_and_the_reason(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources: [missing.yaml]\n")
    with pytest.raises(KustomizeError) as e:
        render(tmp_path)
    assert str(tmp_path) in str(e.value) and "missing.yaml" in str(e.value)
    with pytest.raises(KustomizeError, match="no such directory"):
        render_yaml(tmp_path / "nope")


def test_a_missing_binary_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("OMTR_KUSTOMIZE", str(tmp_path / "no-such-kubectl"))
    with pytest.raises(KustomizeError, match="install kubectl"):
        command(tmp_path)
    monkeypatch.setenv("OMTR_KUSTOMIZE", "kubectl")
    if shutil.which("kubectl"):
        assert command(tmp_path)[1:] == ["kustomize", str(tmp_path)]
