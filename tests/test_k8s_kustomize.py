"""omtr's kustomize renderer (omtr.k8s.kustomize) on small kustomizations: each feature k8s/ uses,
with kustomize's semantics, and an error for everything it does not implement."""

from __future__ import annotations

import base64
import textwrap

import pytest

from omtr.k8s.kustomize import KustomizeError, render, render_yaml, split_image, strategic_merge

DEPLOY = """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
        - name: app
          image: omtr:0.1.0
          args: ["a", "b"]
          env:
            - {name: A, value: "1"}
            - {name: B, value: "2"}
          volumeMounts:
            - {name: tmp, mountPath: /tmp}
        - name: side
          image: busybox:1.36
      volumes:
        - name: tmp
          emptyDir: {}
"""


def write(root, files: dict[str, str]):
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip())
    return root


def by_name(objs, kind, name):
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def test_resources_namespace_labels_and_order(tmp_path):
    write(tmp_path, {
        "base/kustomization.yaml": """
            resources: [deploy.yaml, more.yaml]
            labels:
              - pairs: {app.kubernetes.io/part-of: omtr}
                includeSelectors: false
        """,
        "base/deploy.yaml": DEPLOY,
        "base/more.yaml": """
            apiVersion: v1
            kind: Service
            metadata: {name: web}
            spec: {selector: {app: web}, ports: [{port: 80}]}
            ---
            apiVersion: rbac.authorization.k8s.io/v1
            kind: ClusterRole
            metadata: {name: reader}
            rules: []
        """,
        "ov/kustomization.yaml": """
            namespace: team
            resources: [ns.yaml, ../base]
            labels:
              - pairs: {env: dev}
                includeTemplates: true
        """,
        "ov/ns.yaml": "apiVersion: v1\nkind: Namespace\nmetadata: {name: team}\n",
    })
    objs = render(tmp_path / "ov")
    assert [o["kind"] for o in objs] == ["Namespace", "ClusterRole", "Service", "Deployment"]
    dep = by_name(objs, "Deployment", "web")
    assert dep["metadata"]["namespace"] == "team"
    assert "namespace" not in by_name(objs, "ClusterRole", "reader")["metadata"]  # cluster-scoped
    assert "namespace" not in by_name(objs, "Namespace", "team")["metadata"]
    assert dep["metadata"]["labels"] == {"app.kubernetes.io/part-of": "omtr", "env": "dev"}
    assert dep["spec"]["selector"] == {"matchLabels": {"app": "web"}}  # selectors untouched
    assert dep["spec"]["template"]["metadata"]["labels"] == {"app": "web", "env": "dev"}  # includeTemplates
    assert "kind: Deployment" in render_yaml(tmp_path / "ov")


def test_strategic_merge_patch_merges_containers_env_and_mounts_by_key(tmp_path):
    write(tmp_path, {
        "kustomization.yaml": """
            resources: [deploy.yaml]
            patches:
              - path: patch.yaml
              - patch: |-
                  apiVersion: apps/v1
                  kind: Deployment
                  metadata: {name: web}
                  spec:
                    template:
                      spec:
                        containers:
                          - name: side
                            $patch: delete
        """,
        "deploy.yaml": DEPLOY,
        "patch.yaml": """
            apiVersion: apps/v1
            kind: Deployment
            metadata: {name: web}
            spec:
              replicas: 3
              template:
                spec:
                  containers:
                    - name: app
                      args: ["c"]
                      env:
                        - {name: B, value: "20"}
                        - {name: C, value: "3"}
                      volumeMounts:
                        - {name: cache, mountPath: /cache}
                  volumes:
                    - name: tmp
                      emptyDir: null
                      secret: {secretName: s}
        """,
    })
    dep = render(tmp_path)[0]
    assert dep["spec"]["replicas"] == 3
    (app,) = dep["spec"]["template"]["spec"]["containers"]  # side was deleted
    assert app["image"] == "omtr:0.1.0"  # untouched fields stay
    assert app["args"] == ["c"]  # a list without merge key is replaced
    assert app["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "20"}, {"name": "C", "value": "3"}]
    assert [m["mountPath"] for m in app["volumeMounts"]] == ["/tmp", "/cache"]
    assert dep["spec"]["template"]["spec"]["volumes"] == [{"name": "tmp", "secret": {"secretName": "s"}}]  # null deletes


def test_custom_resources_have_no_merge_keys_and_images_reach_nested_containers(tmp_path):
    write(tmp_path, {
        "kustomization.yaml": """
            resources: [job.yaml]
            images:
              - {name: trainer, newName: reg.example:5000/omtr/trainer, newTag: "2.0"}
            patches:
              - patch: |-
                  apiVersion: kubeflow.org/v1
                  kind: PyTorchJob
                  metadata: {name: t}
                  spec:
                    pytorchReplicaSpecs:
                      Master:
                        template:
                          spec:
                            containers:
                              - name: pytorch
                                image: trainer:1.0
        """,
        "job.yaml": """
            apiVersion: kubeflow.org/v1
            kind: PyTorchJob
            metadata: {name: t}
            spec:
              pytorchReplicaSpecs:
                Master:
                  replicas: 1
                  template:
                    spec:
                      containers:
                        - {name: pytorch, image: trainer:0.9, args: [x]}
                        - {name: other, image: other:1}
        """,
    })
    job = render(tmp_path)[0]
    master = job["spec"]["pytorchReplicaSpecs"]["Master"]
    assert master["replicas"] == 1
    # JSON merge patch semantics for a custom resource: the list is replaced, not merged by name.
    assert master["template"]["spec"]["containers"] == [{"name": "pytorch", "image": "reg.example:5000/omtr/trainer:2.0"}]


@pytest.mark.parametrize("image, spec, expected", [
    ("omtr:0.1.0", {"name": "omtr", "newTag": "0.2.0"}, "omtr:0.2.0"),
    ("omtr", {"name": "omtr", "newName": "reg.io/x/omtr"}, "reg.io/x/omtr"),
    ("omtr:0.1.0", {"name": "omtr", "newName": "reg.io/x/omtr"}, "reg.io/x/omtr:0.1.0"),
    ("omtr:0.1.0", {"name": "omtr", "digest": "sha256:" + "a" * 64}, "omtr@sha256:" + "a" * 64),
    ("other:0.1.0", {"name": "omtr", "newTag": "9"}, "other:0.1.0"),
    ("reg:5000/omtr", {"name": "reg:5000/omtr", "newTag": "1"}, "reg:5000/omtr:1"),
])
def test_images(tmp_path, image, spec, expected):
    import yaml

    write(tmp_path, {
        "kustomization.yaml": yaml.safe_dump({"resources": ["pod.yaml"], "images": [spec]}),
        "pod.yaml": f"apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  containers: [{{name: c, image: '{image}'}}]\n"
                    f"  initContainers: [{{name: i, image: '{image}'}}]\n",
    })
    pod = render(tmp_path)[0]
    assert pod["spec"]["containers"][0]["image"] == expected and pod["spec"]["initContainers"][0]["image"] == expected


def test_split_image():
    assert split_image("reg:5000/a/b:1.2@sha256:ff") == ("reg:5000/a/b", "1.2", "sha256:ff")
    assert split_image("reg:5000/a/b") == ("reg:5000/a/b", None, None)


def test_json6902_patches(tmp_path):
    write(tmp_path, {
        "kustomization.yaml": """
            resources: [deploy.yaml]
            patches:
              - target: {kind: Deployment, name: web}
                patch: |-
                  - {op: test, path: /spec/template/spec/containers/0/name, value: app}
                  - {op: replace, path: /spec/template/spec/containers/0/image, value: "omtr:9"}
                  - {op: add, path: /spec/template/spec/containers/0/args/-, value: z}
                  - {op: add, path: /metadata/annotations, value: {a~b: c}}
                  - {op: remove, path: /spec/template/spec/containers/1}
        """,
        "deploy.yaml": DEPLOY,
    })
    dep = render(tmp_path)[0]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "omtr:9" and c["args"] == ["a", "b", "z"] and dep["metadata"]["annotations"] == {"a~b": "c"}


def test_generators(tmp_path):
    write(tmp_path, {
        "kustomization.yaml": """
            generatorOptions:
              disableNameSuffixHash: true
            configMapGenerator:
              - name: cfg
                literals: [a=1, b=x=y]
                files: [conf.txt, renamed=conf.txt]
            secretGenerator:
              - name: tok
                literals: [token=placeholder]
        """,
        "conf.txt": "hello\n",
    })
    objs = render(tmp_path)
    cm, sec = by_name(objs, "ConfigMap", "cfg"), by_name(objs, "Secret", "tok")
    assert cm["data"] == {"a": "1", "b": "x=y", "conf.txt": "hello\n", "renamed": "hello\n"}
    assert sec["type"] == "Opaque" and base64.b64decode(sec["data"]["token"]) == b"placeholder"


@pytest.mark.parametrize("kustomization, files, message", [
    ("resources: [missing.yaml]", {}, "neither a file nor a directory"),
    ("commonLabels: {a: b}", {}, "not supported"),
    ("nameSuffix: -x", {}, "not supported"),
    ("secretGenerator: [{name: s, literals: [a=b]}]", {}, "disableNameSuffixHash"),
    ("resources: [d.yaml, d2.yaml]", {"d.yaml": DEPLOY, "d2.yaml": DEPLOY}, "appears twice"),
    ("resources: [d.yaml]\nlabels: [{pairs: {a: b}, includeSelectors: true}]", {"d.yaml": DEPLOY}, "includeSelectors"),
    ("resources: [d.yaml]\npatches: [{patch: '{apiVersion: v1, kind: Service, metadata: {name: nope}}'}]",
     {"d.yaml": DEPLOY}, "no object matches"),
    ("resources: [d.yaml]\npatches: [{target: {kind: Deployment}, patch: '- {op: replace, path: /spec/nope/x, value: 1}'}]",
     {"d.yaml": DEPLOY}, "does not exist"),
    ("resources: [d.yaml]\npatches: [{target: {kind: Deployment}, patch: '- {op: test, path: /spec/template/spec/containers/0/name, value: x}'}]",
     {"d.yaml": DEPLOY}, "test failed"),
    ("resources: [d.yaml]\npatches: [{target: {kind: Deployment}, patch: '- {op: move, from: /a, path: /b}'}]",
     {"d.yaml": DEPLOY}, "not supported"),
    ("resources: [bad.yaml]", {"bad.yaml": "kind: Thing\n"}, "apiVersion, kind and metadata.name"),
    ("resources: [.]", {}, "cycle"),
])
def test_errors_name_the_problem(tmp_path, kustomization, files, message):
    write(tmp_path, {"kustomization.yaml": kustomization, **files})
    with pytest.raises(KustomizeError, match=message):
        render(tmp_path)


def test_a_directory_without_kustomization_is_an_error(tmp_path):
    (tmp_path / "sub").mkdir()
    write(tmp_path, {"kustomization.yaml": "resources: [sub]"})
    with pytest.raises(KustomizeError, match="no kustomization.yaml"):
        render(tmp_path)


def test_strategic_merge_function_does_not_modify_its_inputs():
    base = {"spec": {"containers": [{"name": "a", "image": "x"}]}}
    patch = {"spec": {"containers": [{"name": "a", "image": "y"}, {"name": "b", "image": "z"}]}}
    out = strategic_merge(base, patch)
    assert [c["image"] for c in out["spec"]["containers"]] == ["y", "z"]
    assert base == {"spec": {"containers": [{"name": "a", "image": "x"}]}}
