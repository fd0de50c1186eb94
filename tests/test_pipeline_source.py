"""Step reuse that knows the code: the main job's step keys include the source version.

``source_version`` runs real git in a scratch repository (a commit, an uncommitted edit, the same
edit again, a new commit); the pipeline's prepare step runs for real (``omtr tasks generate`` in
nested MLflow runs on a SQLite store) and is reused only when parameters and source both match."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")

pytestmark = pytest.mark.timeout(600)


def _git(repo: Path, *args: str) -> str:
    r = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args], cwd=repo,
                       capture_output=True, text=True, check=True)
    return r.stdout.strip()


def test_source_version_follows_commits_and_uncommitted_changes(tmp_path):
    from omtr.tracking.source import code_hash, describe, source_version

    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "configs.yaml").write_text("lr: 3e-5\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "first")
    clean = source_version(repo)
    assert clean["git_commit"] == _git(repo, "rev-parse", "HEAD") and clean["git_dirty"] is False
    assert clean["git_changes"] is None and clean["code_hash"] == code_hash()
    assert "clean" in describe(clean)

    (repo / "configs.yaml").write_text("lr: 1e-4\n")
    dirty = source_version(repo)
    assert dirty["git_commit"] == clean["git_commit"] and dirty["git_dirty"] is True and dirty["git_changes"]
    assert source_version(repo) == dirty  # the same edits: the same source
    (repo / "notes.txt").write_text("an untracked file counts too\n")
    assert source_version(repo)["git_changes"] != dirty["git_changes"]

    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "second")
    second = source_version(repo)
    assert second["git_commit"] != clean["git_commit"] and second["git_dirty"] is False

    nogit = source_version(tmp_path / "elsewhere" if (tmp_path / "elsewhere").mkdir() is None else tmp_path)
    assert nogit["git_commit"] is None and nogit["code_hash"] == code_hash()
    assert "no git checkout" in describe(nogit)


def test_code_hash_changes_with_any_package_file(tmp_path):
    from omtr.tracking.source import code_hash

    pkg = tmp_path / "omtr"
    (pkg / "data").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "data" / "d.json").write_text("{}\n")
    first = code_hash(pkg)
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    assert code_hash(pkg) == first  # bytecode is not code
    (pkg / "data" / "d.json").write_text('{"k": 1}\n')
    assert code_hash(pkg) != first


def _prepare(tmp_path, uri, source, capsys):
    from omtr.tracking.pipeline import Pipeline, PipelineConfig

    cfg = PipelineConfig(profile="micro", n_train=1, n_val=1, min_objects=2, max_objects=4)
    summary = Pipeline(cfg, tmp_path / "work", experiment="source-test", tracking_uri=uri, steps=("prepare",),
                       source=source).run()
    return summary["prepare"], capsys.readouterr().out


def test_a_step_is_reused_only_on_the_same_source(tmp_path, monkeypatch, capsys):
    for k in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    base = {"omtr_version": "0.1.0", "code_hash": "aaaaaaaaaaaa", "git_commit": "1" * 40, "git_dirty": False,
            "git_changes": None}
    try:
        first, _ = _prepare(tmp_path, uri, base, capsys)
        assert not first["skipped"]

        again, said = _prepare(tmp_path, uri, base, capsys)
        assert again["skipped"] and again["run_id"] == first["run_id"]
        assert "reused: same parameters, inputs and source (commit 1111111111 (clean)" in said

        client = mlflow.MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name("source-test").experiment_id
        (marker,) = client.search_runs([exp], "tags.`omtr.reused_run` = '%s'" % first["run_id"])
        assert first["run_id"] in marker.data.tags["omtr.reuse_reason"]

        for changed in ({**base, "git_commit": "2" * 40},  # a new commit
                        {**base, "git_dirty": True, "git_changes": "bbbbbbbbbbbb"},  # uncommitted edits
                        {**base, "git_commit": None, "git_dirty": None, "code_hash": "cccccccccccc"}):  # no git
            res, said = _prepare(tmp_path, uri, changed, capsys)
            assert not res["skipped"] and res["run_id"] != first["run_id"], changed
            assert "not reusing run " in said and ": same parameters, but it ran on commit " in said
            run = client.get_run(res["run_id"])
            assert run.data.tags["omtr.source.code_hash"] == changed["code_hash"]
    finally:
        while mlflow.active_run():
            mlflow.end_run()
        mlflow.set_tracking_uri(None)
