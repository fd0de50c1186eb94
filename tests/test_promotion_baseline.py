"""The baseline gate on a real SQLite registry: `omtr register` writes the untrained model's metrics
as `baseline.*` tags beside `metric.*` (from a metrics.json or from the evaluation run that holds
one), and `omtr promote` refuses a version whose faithful success is not above its baseline, says
why with both numbers, and still promotes it with `--force`; a version that beats its baseline, or
has none, goes on to the rule. Also the main job's `evaluate-baseline` key: the start model and the
evaluation's settings, not the training's.

Promotion tests create versions directly with their tags (the rule reads only tags); the register
test logs a real `micro` model directory, three times (about half a minute on 2 cores)."""

from __future__ import annotations

import json
import logging

import pytest

mlflow = pytest.importorskip("mlflow")

from omtr.cli import main  # noqa: E402
from omtr.tracking.pipeline import PipelineConfig, baseline_params, for_profile, start_point  # noqa: E402
from omtr.tracking.registry import (  # noqa: E402
    BASELINE_PREFIX, CHALLENGER, CHAMPION, Scores, decide, metric_tags, promote)

NAME = "omtr-role-model-baseline-test"


@pytest.fixture()
def registry(sqlite_registry, tmp_path):
    uri, client = sqlite_registry

    def add(faithful, success=0.5, calls=2.0, baseline=None) -> str:
        """A version with its evaluation tags and, given ``baseline`` (faithful, success), baseline tags."""
        try:
            client.get_registered_model(NAME)
        except mlflow.exceptions.MlflowException:
            client.create_registered_model(NAME)
        mv = client.create_model_version(NAME, source=str(tmp_path / "m"))
        tags = metric_tags({"faithful": faithful, "success": success, "calls": calls})
        if baseline is not None:
            tags.update(metric_tags({"faithful": baseline[0], "success": baseline[1], "calls": calls}, BASELINE_PREFIX))
        for k, v in tags.items():
            client.set_model_version_tag(NAME, mv.version, k, v)
        client.set_registered_model_alias(NAME, CHALLENGER, mv.version)
        return str(mv.version)

    yield uri, client, add
    while mlflow.active_run():
        mlflow.end_run()
    mlflow.tracking.fluent._active_experiment_id = None
    mlflow.set_tracking_uri(None)


def alias(client, a):
    try:
        return str(client.get_model_version_by_alias(NAME, a).version)
    except mlflow.exceptions.MlflowException:
        return None


def decision_tag(client, version) -> dict:
    return json.loads(client.get_model_version(NAME, version).tags["omtr.promotion"])


# ---------------------------------------------------------------------------------- register


def _metrics(faithful, success, calls, *, task_set="ts-1", budget=2):
    return {"faithful": faithful, "success": success, "calls": calls, "drift": 0.0, "tasks": 4,
            "overall": {"faithful": {"ci": [0.0, faithful]}, "success": {"ci": [0.0, success]}},
            "provenance": {"model": {"spec": "micro", "profile": "micro"}, "budget": budget,
                           "tasks": {"task_set": task_set, "count": 4}, "eval": {"seed": 0, "max_new_tokens": 16}}}


def test_register_writes_baseline_tags_from_a_metrics_file_or_a_run(registry, tmp_path, capsys, caplog):
    pytest.importorskip("torch")
    from omtr.model import build_model

    uri, client, _ = registry
    model_dir = build_model("micro").save(tmp_path / "model")
    (tmp_path / "metrics.json").write_text(json.dumps(_metrics(0.5, 0.75, 1.5)))
    base = _metrics(0.25, 0.5, 2.0)
    (tmp_path / "baseline.json").write_text(json.dumps(base))
    common = ["register", "--model-dir", str(model_dir), "--name", NAME, "--metrics", str(tmp_path / "metrics.json")]

    # from a metrics.json
    assert main([*common, "--baseline-metrics", str(tmp_path / "baseline.json"), "--json", str(tmp_path / "v.json")]) == 0
    v1 = json.loads((tmp_path / "v.json").read_text())["version"]
    tags = client.get_model_version(NAME, v1).tags
    metric = {k[len("metric."):]: v for k, v in tags.items() if k.startswith("metric.")}
    baseline = {k[len("baseline."):]: v for k, v in tags.items() if k.startswith("baseline.")}
    assert set(baseline) == set(metric)  # the same names beside each other
    assert float(baseline["faithful"]) == 0.25 and float(metric["faithful"]) == 0.5
    assert float(baseline["success"]) == 0.5 and float(baseline["calls"]) == 2.0
    assert float(baseline["faithful_ci_high"]) == 0.25
    assert tags["omtr.baseline_model"] == "micro" and "omtr.baseline_run_id" not in tags
    assert "baseline (the untrained model): faithful 0.25" in capsys.readouterr().out

    # from the evaluation run that holds it (omtr evaluate --track logs metrics.json at the run's root)
    mlflow.set_experiment("baseline-eval")
    with mlflow.start_run() as run:
        mlflow.log_dict(base, "metrics.json")
    assert main([*common, "--baseline-run", run.info.run_id, "--json", str(tmp_path / "v.json")]) == 0
    v2 = json.loads((tmp_path / "v.json").read_text())["version"]
    tags = client.get_model_version(NAME, v2).tags
    assert float(tags["baseline.faithful"]) == 0.25 and tags["omtr.baseline_run_id"] == run.info.run_id

    # without one: no baseline tags, and the log says so
    caplog.set_level(logging.INFO, logger="omtr.registry")
    assert main([*common, "--json", str(tmp_path / "v.json")]) == 0
    v3 = json.loads((tmp_path / "v.json").read_text())["version"]
    assert not any(k.startswith("baseline.") for k in client.get_model_version(NAME, v3).tags)
    assert "no baseline given" in capsys.readouterr().out
    assert any("no baseline given" in r.getMessage() for r in caplog.records)


def test_register_refuses_a_baseline_from_other_tasks_or_settings(registry, tmp_path, capsys):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "omtr-model.json").write_text("{}")  # refused before the model is read
    (tmp_path / "metrics.json").write_text(json.dumps(_metrics(0.5, 0.75, 1.5)))
    common = ["register", "--model-dir", str(tmp_path / "model"), "--name", NAME,
              "--metrics", str(tmp_path / "metrics.json"), "--baseline-metrics", str(tmp_path / "b.json")]
    (tmp_path / "b.json").write_text(json.dumps(_metrics(0.25, 0.5, 2.0, task_set="ts-2")))
    assert main(common) == 2
    assert "baseline was evaluated with another task set" in capsys.readouterr().err
    (tmp_path / "b.json").write_text(json.dumps(_metrics(0.25, 0.5, 2.0, budget=6)))
    assert main(common) == 2
    assert "another budget than the version (2 vs 6)" in capsys.readouterr().err
    assert main([*common[:-2], "--baseline-run", "no-such-run"]) == 2
    assert "--baseline-run: baseline run no-such-run" in capsys.readouterr().err


# ---------------------------------------------------------------------------------- promote


def test_promote_refuses_a_version_that_does_not_beat_its_baseline(registry, capsys):
    uri, client, add = registry
    v = add(0.25, baseline=(0.25, 0.5))  # tied with the untrained model: not strictly better
    assert main(["promote", "--name", NAME, "--version", v]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"{NAME} version {v} not promoted: faithful success 0.25 against the untrained model's 0.25 "
                   "(baseline.faithful), paired difference unknown (registered without per-task records: register "
                   "with both evaluations' traces.jsonl to get it): a tie is no improvement: version "
                   f"{v} is not more faithful than the model training started from (use --force to promote it anyway)"]
    assert alias(client, CHAMPION) is None and alias(client, CHALLENGER) == v  # even with no champion yet
    tag = decision_tag(client, v)
    assert tag["promote"] is False and tag["baseline"]["faithful"] == 0.25 and tag["challenger"]["faithful"] == 0.25
    assert "a tie is no improvement" in tag["baseline_check"] and tag["paired"] is None

    worse = add(0.1, baseline=(0.3, 0.5))
    assert main(["promote", "--name", NAME, "--version", worse]) == 1
    assert "faithful success 0.1 against the untrained model's 0.3 (baseline.faithful)" in capsys.readouterr().out


def test_force_promotes_a_version_that_does_not_beat_its_baseline(registry, capsys):
    uri, client, add = registry
    v = add(0.2, baseline=(0.4, 0.5))
    assert main(["promote", "--name", NAME, "--version", v, "--force"]) == 0
    out = capsys.readouterr().out
    assert f"version {v} is now champion: forced (the rule said no: faithful success 0.2 against the " \
           "untrained model's 0.4" in out
    assert alias(client, CHAMPION) == v and alias(client, CHALLENGER) is None
    tag = decision_tag(client, v)
    assert tag["promote"] is True and tag["reason"].startswith("forced") and tag["baseline"]["faithful"] == 0.4


def test_a_version_that_beats_its_baseline_goes_on_to_the_rule(registry, capsys):
    uri, client, add = registry
    v1 = add(0.5, baseline=(0.25, 0.5))
    assert main(["promote", "--name", NAME, "--version", v1]) == 0
    out = capsys.readouterr().out
    assert f"version {v1} is now champion: there is no champion yet (baseline gate: faithful success 0.5 against " \
           "the untrained model's 0.25 (baseline.faithful), paired difference unknown" in out
    tag = decision_tag(client, v1)
    assert tag["promote"] and tag["baseline_check"].endswith(": higher")
    # beating the baseline is necessary, not sufficient: the champion still has to be beaten
    v2 = add(0.4, baseline=(0.25, 0.5))
    d = promote(NAME, v2)
    assert not d.promote and "vs champion" in d.reason and "lower" in d.reason
    v3 = add(0.75, baseline=(0.25, 0.5))
    assert promote(NAME, v3).promote and alias(client, CHAMPION) == v3


def test_a_version_without_baseline_is_promoted_as_before_and_says_so(registry, capsys, caplog):
    uri, client, add = registry
    caplog.set_level(logging.INFO, logger="omtr.registry")
    v1 = add(0.0)
    assert main(["promote", "--name", NAME, "--version", v1]) == 0
    out = capsys.readouterr().out
    assert f"no baseline recorded for version {v1} (no baseline.faithful tag): the rule alone decides" in out
    assert f"version {v1} is now champion: there is no champion yet" in out
    assert any("no baseline recorded" in r.getMessage() for r in caplog.records)
    tag = decision_tag(client, v1)
    assert tag["baseline"] is None and "no baseline recorded" in tag["baseline_check"]


def test_the_gate_compares_faithful_success_only():
    b = Scores("b", 0.3, 0.5, 1.0)
    d = decide(Scores("2", 0.3, 0.5, 1.0), None, "point", b)
    assert not d.promote and "faithful success 0.3 against the untrained model's 0.3" in d.reason
    # solving more (and with fewer calls) without being more faithful: no promotion, under either rule
    for rule in ("point", "ci"):
        d = decide(Scores("2", 0.3, 1.0, 0.5, 0.1, 0.5), None, rule, b)
        assert not d.promote, rule
    d = decide(Scores("2", 0.3, 1.0, 0.5), None, "point", b)
    assert "planner success 1 against 0.5 does not count" in d.baseline_check
    assert not decide(Scores("2", 0.29, 1.0, 1.0), None, "point", b).promote
    assert decide(Scores("2", 0.31, 0.0, 9.0), None, "point", b).promote  # more faithful, though it solves less
    # a version with a baseline but no faithful-success metric is refused, not waved through
    d = decide(Scores("2", None, None, None), None, "point", b)
    assert not d.promote and "has no faithful-success metric (metric.faithful)" in d.reason
    assert not decide(Scores("1", 0.0, 0.0, 1.0), Scores("1", 0.0, 0.0, 1.0), "point", b).reason.startswith("faithful")


# ---------------------------------------------------------------------------------- the main job's step


def test_the_baseline_is_the_model_training_starts_from_with_its_decoding():
    assert start_point(for_profile(PipelineConfig(profile="micro"))) == ("micro", "off")  # micro trains grammar-free
    assert start_point(PipelineConfig(profile="small")) == ("small", "")  # the model's own constraint
    assert start_point(PipelineConfig(profile="small", train_set=("decoding=plain",))) == ("small", "plain")
    assert start_point(PipelineConfig(profile="small", model="runs/x/model")) == ("runs/x/model", "")
    assert start_point(PipelineConfig(profile="paper", train_set=("grammar=true",))) == ("paper", "scoped")


def test_the_baseline_key_follows_the_start_and_the_evaluation_not_the_training():
    base = for_profile(PipelineConfig(profile="micro"))
    same = baseline_params(base, "k")
    from dataclasses import replace

    assert baseline_params(replace(base, train_set=("lr=0.01", "cycles=3")), "k") == same
    assert baseline_params(replace(base, name="other", rule="ci", serve_budget=2), "k") == same
    for changed in (replace(base, eval_budget=1), replace(base, eval_max_new_tokens=8), replace(base, seed=1),
                    replace(base, model="runs/x/model"), replace(base, train_set=("decoding=plain",))):
        assert baseline_params(changed, "k") != same
    assert baseline_params(base, "other-tasks") != same


def test_a_version_that_solves_more_without_being_more_faithful_is_refused(registry, capsys):
    """Equal faithful success and every task solved: refused (the planner's verdict alone is no
    improvement), and the line says both faithful rates."""
    uri, client, add = registry
    v = add(0.5, success=1.0, baseline=(0.5, 0.75))
    assert main(["promote", "--name", NAME, "--version", v]) == 1
    out = capsys.readouterr().out
    assert (f"version {v} not promoted: faithful success 0.5 against the untrained model's 0.5 (baseline.faithful)"
            in out)
    assert "planner success 1 against 0.75 does not count" in out
    assert alias(client, CHAMPION) is None and alias(client, CHALLENGER) == v
