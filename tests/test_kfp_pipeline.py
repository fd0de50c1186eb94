"""The Kubeflow pipeline's compiled YAML: current with its source, and carrying the per-step settings
(GPU placement of the train step, retries, caching, resources, pod deadlines) the source promises."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
pytest.importorskip("kfp")
pytest.importorskip("kfp.kubernetes")

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "pipelines" / "omtr_pipeline.yaml"


def _docs(path: Path) -> tuple[dict, dict]:
    spec, platform = list(yaml.safe_load_all(path.read_text()))
    return spec, platform


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("kfp") / "omtr_pipeline.yaml"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "omtr", "pipeline", "compile", "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    print(f"compile: {time.perf_counter() - t0:.1f} s")
    return out


def test_committed_yaml_is_current(compiled):
    """Compiling the source again gives the committed YAML: the same documents once parsed.

    Nothing is excluded from the comparison: two compilations of the same source are byte-identical
    with kfp 2.17 (no timestamps), and sdkVersion only changes with kfp itself, which is pinned."""
    new, old = list(yaml.safe_load_all(compiled.read_text())), list(yaml.safe_load_all(COMMITTED.read_text()))
    assert new == old, ("pipelines/omtr_pipeline.yaml is out of date with pipelines/omtr_pipeline.py or components/: "
                        "run `omtr pipeline compile --out pipelines/omtr_pipeline.yaml` and commit it")


def _tasks(spec: dict) -> dict[str, list[dict]]:
    """Every task of every DAG, by its display name, with its executor label attached."""
    out: dict[str, list[dict]] = {}
    for comp in [spec["root"], *spec["components"].values()]:
        for task in comp.get("dag", {}).get("tasks", {}).values():
            ref = spec["components"][task["componentRef"]["name"]]
            out.setdefault(task["taskInfo"]["name"], []).append({**task, "_executor": ref.get("executorLabel")})
    return out


def test_train_step_placement_by_branch():
    spec, platform = _docs(COMMITTED)
    tasks = _tasks(spec)
    execs = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    containers = spec["deploymentSpec"]["executors"]

    # the three places training can run, one branch each, chosen by the run parameter train_on
    conds = {name: tasks[name][0]["triggerPolicy"]["condition"] for name in ("train-on-cpu", "train-on-gpu", "train-as-job")}
    assert "== 'cpu'" in conds["train-on-cpu"] and "== 'gpu'" in conds["train-on-gpu"]
    assert "== 'train-job'" in conds["train-as-job"]

    gpu = tasks["train-gpu"][0]["_executor"]
    k = execs[gpu]
    assert k["nodeSelector"]["labels"] == {"omtr.dev/pool": "a100"}  # the pool k8s/'s PyTorchJob uses
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in k["tolerations"]
    assert {"key": "omtr.dev/pool", "operator": "Equal", "value": "a100", "effect": "NoSchedule"} in k["tolerations"]
    assert k["podMetadata"]["labels"]["app.kubernetes.io/component"] == "trainer"  # the fleet lets it in
    assert k["emptyDirMounts"][0]["mountPath"] == "/dev/shm"
    res = containers[gpu]["container"]["resources"]
    assert res["accelerator"]["resourceType"] == "nvidia.com/gpu" and res["accelerator"]["resourceCount"] == "1"

    cpu = tasks["train-cpu"][0]["_executor"]
    assert "accelerator" not in containers[cpu]["container"]["resources"]
    assert "nodeSelector" not in execs[cpu] and "tolerations" not in execs[cpu]

    job = tasks["train-job"][0]["_executor"]  # the launcher of the PyTorchJob stays on a small CPU pod
    assert "accelerator" not in containers[job]["container"]["resources"]
    assert execs[job]["pvcMount"][0]["mountPath"] == "/checkpoints"
    assert containers[job]["container"]["resources"]["resourceCpuLimit"] == "1"


def test_retries_caching_resources_and_deadlines():
    spec, platform = _docs(COMMITTED)
    tasks = _tasks(spec)
    execs = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    retries = {"prepare": 2, "train-cpu": 1, "train-gpu": 1, "train-job": 1, "evaluate": 2, "evaluate-baseline": 2,
               "validate": 0, "register": 0, "promote": 0, "deploy": 0}
    cached = {"prepare": True, "train-cpu": True, "train-gpu": True, "train-job": True, "evaluate": True,
              "evaluate-baseline": True, "validate": True, "register": False, "promote": False, "deploy": False}
    for step, n in retries.items():
        assert tasks[step], step
        for t in tasks[step]:  # the after-training steps appear once per training branch
            assert t.get("retryPolicy", {}).get("maxRetryCount", 0) == n, step
            assert bool(t.get("cachingOptions", {}).get("enableCache")) is cached[step], step
            res = spec["deploymentSpec"]["executors"][t["_executor"]]["container"]["resources"]
            assert res["resourceCpuRequest"] and res["resourceCpuLimit"], step
            assert res["resourceMemoryRequest"] and res["resourceMemoryLimit"], step
            assert int(execs[t["_executor"]]["activeDeadlineSeconds"]) > 0, step
    # deploy only runs when promote moved the champion
    moved = tasks["champion-moved"]
    assert len(moved) == 3 and all(t["triggerPolicy"]["condition"].endswith("promote-Output'] == true") for t in moved)


def test_fleet_callers_get_the_token_from_the_secret():
    """Every evaluate task (the step that sends specs to the fleet) gets OMTR_SOLVER_TOKEN from the
    Secret the run parameter names, by default the one k8s/base mounts into the fleet itself."""
    spec, platform = _docs(COMMITTED)
    tasks = _tasks(spec)
    execs = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    fleet = (ROOT / "k8s" / "base" / "solver-fleet.yaml").read_text()
    default = spec["root"]["inputDefinitions"]["parameters"]["solver_token_secret"]["defaultValue"]
    assert f"secretName: {default}" in fleet
    assert len(tasks["evaluate"]) == 3  # one per training branch
    assert len(tasks["evaluate-baseline"]) == 1  # needs nothing from training: once, beside it
    for t in tasks["evaluate"] + tasks["evaluate-baseline"]:
        (sec,) = execs[t["_executor"]]["secretAsEnv"]
        assert sec["keyToEnv"] == [{"envVar": "OMTR_SOLVER_TOKEN", "secretKey": "token"}]
        assert sec["secretNameParameter"] == {"componentInputParameter": "solver_token_secret"}
        assert not sec.get("optional")  # a missing Secret stops the pod at start, not with a 401 later
    callers = {t["_executor"] for t in tasks["evaluate"] + tasks["evaluate-baseline"]}
    for name, ex in spec["deploymentSpec"]["executors"].items():
        program = "\n".join(ex["container"]["command"] + ex["container"].get("args", []))
        if "OMTR_SOLVER_URL" in program:
            assert name in callers, name  # any step that points omtr at the fleet carries the token


def test_components_run_omtr_on_the_omtr_image_without_installing_anything():
    spec, _ = _docs(COMMITTED)
    import omtr

    for name, ex in spec["deploymentSpec"]["executors"].items():
        c = ex["container"]
        assert c["image"] == f"ghcr.io/omtr/omtr:{omtr.__version__}", name
        program = "\n".join(c["command"] + c.get("args", []))
        assert "pip install" not in program, name
        assert "run_omtr(" in program, name  # each one runs an omtr subcommand


def test_declared_run_parameters():
    spec, _ = _docs(COMMITTED)
    params = spec["root"]["inputDefinitions"]["parameters"]
    for p in ("profile", "model", "mode", "train_on", "family", "n_train", "n_val", "eval_budget", "mlflow_tracking_uri",
              "solver_url", "registry_name", "promotion_rule", "serving_namespace", "serving_deployment", "deploy_mode"):
        assert p in params, p
    assert params["deploy_mode"]["defaultValue"] == "apply"
    assert params["mode"]["defaultValue"] == "profile"  # the profile's own, as `omtr pipeline --mode profile`
    assert params["n_train"]["parameterType"] == "NUMBER_INTEGER"
    # the promotion gate's sample: 24 validation tasks for each model (BlocksWorld's validation split
    # has 23 tasks of 2-4 blocks, so they reach 5), as `omtr pipeline` and MLproject's main
    assert params["n_val"]["defaultValue"] == 24 and params["val_max_objects"]["defaultValue"] == 5
    assert params["train_set"]["parameterType"] == "LIST"


def test_a_mistyped_choice_fails_the_first_step(tmp_path):
    """The prepare step checks the closed-choice run parameters before any work (run here as the
    plain Python function that the component wraps)."""
    sys.path.insert(0, str(ROOT))
    from components import steps

    fn = steps.prepare_tasks.python_func

    class _Out:
        path, metadata = str(tmp_path / "x.jsonl"), {}

    def prepare(**choices):
        fn(profile="small", mode="profile", family="blocksworld", n_train=1, n_val=1, min_objects=2, max_objects=2,
           val_max_objects=0, seed=0, timeout_s=60, choices=choices, train_tasks=_Out(), val_tasks=_Out())

    with pytest.raises(ValueError, match=r"train_on='gpus' is not one of \['cpu', 'gpu', 'train-job'\]"):
        prepare(train_on=["gpus", ["cpu", "gpu", "train-job"]])
    with pytest.raises(ValueError) as err:
        prepare(mode=["domain-given", ["profile", "given", "full"]])
    assert str(err.value) == ("run parameter mode='domain-given' is not one of ['profile', 'given', 'full']: "
                              "set it to one of them")
    assert not Path(_Out.path).exists()  # refused before any task was written


def test_the_mode_reaches_the_prepare_step_and_the_baseline_reaches_register():
    """The task mode is a run parameter checked by the first step; evaluate-baseline runs on the
    prepare step's validation tasks with evaluate's settings, and every register task gets its output."""
    spec, _ = _docs(COMMITTED)
    tasks = _tasks(spec)
    (prep,) = tasks["prepare"]
    assert prep["inputs"]["parameters"]["mode"] == {"componentInputParameter": "mode"}
    assert "pipelinechannel--mode" in str(prep["inputs"]["parameters"]["choices"])
    (base,) = tasks["evaluate-baseline"]
    assert base["inputs"]["artifacts"]["val_tasks"]["taskOutputArtifact"]["producerTask"] == "prepare-tasks"
    for p in ("budget", "max_new_tokens", "bootstrap", "seed", "profile", "model", "train_set"):
        assert p in base["inputs"]["parameters"], p
    assert len(tasks["register"]) == 3
    for reg in tasks["register"]:
        assert reg["inputs"]["artifacts"]["baseline"] == {"componentInputArtifact": "baseline"}
    program = "\n".join(spec["deploymentSpec"]["executors"][tasks["register"][0]["_executor"]]["container"]["command"])
    assert '"--baseline-metrics"' in program
    assert '"--traces"' in program and '"--baseline-traces"' in program  # the paired faithful difference


def test_compile_for_another_registry_replaces_every_image(tmp_path):
    """`omtr pipeline compile --image` points every step (and the trainer image's default) at the
    cluster's own registry; a malformed image is refused by name."""
    import yaml

    from omtr.k8s.kubeflow import KubeflowError, compile_pipeline

    out = compile_pipeline(tmp_path / "p.yaml", image="registry.example.com/ml/omtr:1.2.3")
    docs = list(yaml.safe_load_all(out.read_text()))
    images = {ex["container"]["image"] for ex in docs[0]["deploymentSpec"]["executors"].values()}
    assert images == {"registry.example.com/ml/omtr:1.2.3"}
    assert docs[0]["root"]["inputDefinitions"]["parameters"]["trainer_image"]["defaultValue"] == \
        "registry.example.com/ml/omtr-trainer-gpu:1.2.3"
    assert "ghcr.io" not in out.read_text()
    with pytest.raises(KubeflowError, match="'omtr latest'"):
        compile_pipeline(tmp_path / "q.yaml", image="omtr latest")


def test_compile_pins_images_by_digest(tmp_path, caplog):
    """Images given by digest land in every executor as given, so kfp's cache key (computed from the
    component spec, image string included) changes with the image's content, not with a tag; a tag
    alone is accepted with a warning that says so."""
    import logging

    import yaml

    from omtr.k8s.kubeflow import KubeflowError, compile_pipeline

    omtr_img = "registry.example.com/ml/omtr@sha256:" + "a" * 64
    trainer = "registry.example.com/ml/omtr-trainer-gpu:2.0@sha256:" + "b" * 64
    with caplog.at_level(logging.WARNING, logger="omtr.kubeflow"):
        out = compile_pipeline(tmp_path / "p.yaml", image=omtr_img, trainer_image=trainer)
    assert not [r for r in caplog.records if "is a tag" in r.getMessage()]
    docs = list(yaml.safe_load_all(out.read_text()))
    assert {ex["container"]["image"] for ex in docs[0]["deploymentSpec"]["executors"].values()} == {omtr_img}
    assert docs[0]["root"]["inputDefinitions"]["parameters"]["trainer_image"]["defaultValue"] == trainer
    assert "ghcr.io" not in out.read_text()
    with caplog.at_level(logging.WARNING, logger="omtr.kubeflow"):
        compile_pipeline(tmp_path / "t.yaml", image="registry.example.com/ml/omtr:latest")
    assert any("is a tag" in r.getMessage() and "digest" in r.getMessage() for r in caplog.records)
    with pytest.raises(KubeflowError, match="64 hex digits"):
        compile_pipeline(tmp_path / "q.yaml", image="registry.example.com/ml/omtr@sha256:abc")


def test_train_job_kind_is_a_run_parameter_passed_to_the_train_job_step():
    """`train_job_kind` (default pytorchjob) reaches the train-job task, whose launcher passes it to
    `omtr k8s train-job --kind`; the first step refuses any other value."""
    spec, _ = _docs(COMMITTED)
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["train_job_kind"] == {"defaultValue": "pytorchjob", "isOptional": True, "parameterType": "STRING"}
    tasks = _tasks(spec)
    (job,) = tasks["train-job"]
    assert job["inputs"]["parameters"]["job_kind"] == {"componentInputParameter": "pipelinechannel--train_job_kind"}
    program = "\n".join(spec["deploymentSpec"]["executors"][job["_executor"]]["container"]["command"])
    assert '"--kind", job_kind' in program
    (prep,) = tasks["prepare"]
    choices = prep["inputs"]["parameters"]["choices"]
    assert "train_job_kind" in str(choices) and "trainjob" in str(choices)


def test_train_job_step_launches_the_kind_asked_for(tmp_path, monkeypatch):
    """The train-job component (its plain Python function, `omtr` stubbed): --kind as given; a
    PyTorchJob keeps the job name and run directory it had before the parameter existed (a retried
    step re-attaches), a TrainJob gets its own; an unknown kind is refused before anything runs."""
    import hashlib
    import os

    sys.path.insert(0, str(ROOT))
    import omtr.k8s.step as step
    from components import steps

    calls = []

    def fake_run_omtr(args, timeout_s, **_):
        args = [str(a) for a in args]
        calls.append(args)
        out = args[args.index("--out") + 1]
        for d in ("model", "episodes"):
            os.makedirs(os.path.join(out, d), exist_ok=True)
        return 0

    monkeypatch.setattr(step, "run_omtr", fake_run_omtr)
    tasks = tmp_path / "train.jsonl"
    tasks.write_text('{"task": "t"}\n')

    class Art:
        def __init__(self, path):
            self.path, self.metadata = str(path), {}

    def launch(kind):
        steps.train_job.python_func(profile="paper", trainer_image="reg/omtr-trainer-gpu:1", nodes=2, gpus_per_node=8,
                                    namespace="omtr", job_kind=kind, shared_dir=str(tmp_path / "ck"), mlflow_tracking_uri="",
                                    solver_url="", timeout_s=60, train_tasks=Art(tasks), trained=Art(tmp_path / f"m-{kind}"),
                                    episodes=Art(tmp_path / f"e-{kind}"))
        return calls[-1]

    pj, tj = launch("pytorchjob"), launch("trainjob")
    assert pj[:4] == ["k8s", "train-job", "--kind", "pytorchjob"] and tj[:4] == ["k8s", "train-job", "--kind", "trainjob"]
    old_key = hashlib.sha256(tasks.read_bytes() + b"|paper|2|8|reg/omtr-trainer-gpu:1").hexdigest()[:12]
    assert pj[pj.index("--name") + 1] == f"omtr-train-{old_key}"
    assert tj[tj.index("--name") + 1] != pj[pj.index("--name") + 1]
    assert tj[tj.index("--out") + 1] != pj[pj.index("--out") + 1]
    with pytest.raises(ValueError, match="train_job_kind 'mpijob'"):
        launch("mpijob")
    assert len(calls) == 2
