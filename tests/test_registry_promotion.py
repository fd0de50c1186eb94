"""Promotion by aliases on a real SQLite registry: champion, challenger, ties (no tie-breaks), the CI rule,
refusals that say why, forced promotion, and the decision logged to MLflow.

Versions are created directly in the registry with their evaluation tags (the rule reads only
tags), so no model has to be logged here; tests/test_serving.py logs and serves a real one."""

from __future__ import annotations

import json

import pytest

mlflow = pytest.importorskip("mlflow")

from omtr.tracking.registry import (  # noqa: E402
    CHALLENGER, CHAMPION, PromotionError, Scores, decide, metric_tags, promote)

NAME = "omtr-role-model-test"


@pytest.fixture()
def registry(sqlite_registry, tmp_path):
    _, client = sqlite_registry
    client.create_registered_model(NAME)

    def add(faithful=None, success=None, calls=None, ci=None) -> str:
        mv = client.create_model_version(NAME, source=str(tmp_path / "m"))
        metrics = {"faithful": faithful, "success": success, "calls": calls}
        if ci:
            metrics["overall"] = {"faithful": {"ci": list(ci)}}
        for k, v in metric_tags(metrics).items():
            client.set_model_version_tag(NAME, mv.version, k, v)
        client.set_registered_model_alias(NAME, CHALLENGER, mv.version)
        return str(mv.version)

    yield client, add
    while mlflow.active_run():
        mlflow.end_run()
    mlflow.tracking.fluent._active_experiment_id = None
    mlflow.set_tracking_uri(None)


def alias(client, a):
    try:
        return str(client.get_model_version_by_alias(NAME, a).version)
    except mlflow.exceptions.MlflowException:
        return None


def test_first_version_becomes_champion(registry):
    client, add = registry
    v = add(0.5, 0.6, 2.0)
    d = promote(NAME, v)
    assert d.promote and "no champion" in d.reason
    assert alias(client, CHAMPION) == v and alias(client, CHALLENGER) is None
    tag = json.loads(client.get_model_version(NAME, v).tags["omtr.promotion"])
    assert tag["promote"] and tag["rule"] == "point" and tag["champion"] is None


def test_better_faithful_success_wins_and_worse_stays_challenger(registry):
    client, add = registry
    v1 = add(0.5, 0.6, 2.0)
    promote(NAME, v1)
    v2 = add(0.4, 0.9, 1.0)  # better success and calls, but faithful success decides
    d = promote(NAME, v2)
    assert not d.promote and "lower" in d.reason and "0.4" in d.reason and "0.5" in d.reason
    assert alias(client, CHAMPION) == v1 and alias(client, CHALLENGER) == v2
    v3 = add(0.75, 0.1, 5.0)
    d = promote(NAME, v3)
    assert d.promote and "higher" in d.reason
    assert alias(client, CHAMPION) == v3 and alias(client, CHALLENGER) is None  # it held challenger; now champion


@pytest.mark.parametrize("new, word", [
    ((0.5, 0.7, 3.0), "planner success 0.7 vs its 0.6 does not decide"),  # tie on faithful, better success
    ((0.5, 0.5, 1.0), "planner success 0.5 vs its 0.6 does not decide"),  # tie on faithful, worse success
    ((0.5, 0.6, 1.5), "tied with champion"),                             # tie on both, fewer calls
    ((0.5, 0.6, 2.0), "tied with champion"),                             # full tie
])
def test_a_tie_on_faithful_success_keeps_the_champion(registry, new, word):
    """Planner success and calls are no tie-break: only more faithful success promotes."""
    client, add = registry
    v1 = add(0.5, 0.6, 2.0)
    promote(NAME, v1)
    v2 = add(*new)
    d = promote(NAME, v2)
    assert not d.promote and word in d.reason and "a tie is no promotion, the champion stays" in d.reason
    assert alias(client, CHAMPION) == v1 and alias(client, CHALLENGER) == v2


def test_solving_more_without_being_more_faithful_is_not_promoted_over_the_champion(registry):
    client, add = registry
    v1 = add(0.25, 0.25, 2.0)
    promote(NAME, v1)
    v2 = add(0.25, 1.0, 1.0)  # every task solved, fewer calls, not one more faithful spec
    d = promote(NAME, v2)
    assert not d.promote and alias(client, CHAMPION) == v1
    assert d.reason.startswith(f"faithful success tied with champion {v1} at 0.25")


def test_ci_rule_needs_the_interval_above_the_champion(registry):
    client, add = registry
    v1 = add(0.5, 0.6, 2.0, ci=(0.3, 0.7))
    promote(NAME, v1, rule="ci")
    v2 = add(0.7, 0.8, 2.0, ci=(0.45, 0.9))  # better point estimate, but within noise
    d = promote(NAME, v2, rule="ci")
    assert not d.promote and "rule ci" in d.reason and "0.45" in d.reason
    assert alias(client, CHAMPION) == v1
    v3 = add(0.9, 0.9, 2.0, ci=(0.6, 1.0))
    assert promote(NAME, v3, rule="ci").promote
    v4 = add(0.95, 0.9, 2.0)  # no interval: the ci rule cannot say
    d = promote(NAME, v4, rule="ci")
    assert not d.promote and "no confidence interval" in d.reason


def test_force_and_refusals(registry):
    client, add = registry
    v1 = add(0.5, 0.6, 2.0)
    promote(NAME, v1)
    d = promote(NAME, v1)
    assert not d.promote and "already the champion" in d.reason
    v2 = add(0.1, 0.1, 6.0)
    d = promote(NAME, v2, force=True)
    assert d.promote and d.reason.startswith("forced (the rule said no: ")
    assert alias(client, CHAMPION) == v2
    v3 = add()  # no metrics at all
    d = promote(NAME, v3)
    assert not d.promote and "no faithful-success metric" in d.reason
    with pytest.raises(PromotionError, match="no version 99"):
        promote(NAME, 99)
    with pytest.raises(PromotionError, match="unknown rule"):
        decide(Scores("1", 1, 1, 1), None, rule="best")


def test_decision_is_logged_to_the_active_run(registry):
    client, add = registry
    v1 = add(0.5, 0.6, 2.0)
    mlflow.set_experiment("promote-test")
    with mlflow.start_run() as run:
        promote(NAME, v1)
    r = client.get_run(run.info.run_id)
    assert r.data.params["promotion.rule"] == "point" and r.data.params["promotion.champion_before"] == "none"
    assert r.data.tags["promotion.promoted"] == "true"
    path = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="promotion.json")
    assert json.load(open(path))["challenger"]["faithful"] == 0.5


def test_promote_cli_exit_status_and_message(registry, capsys):
    from omtr.cli import main

    client, add = registry
    v1 = add(0.5, 0.6, 2.0)
    assert main(["promote", "--name", NAME, "--version", v1]) == 0
    v2 = add(0.2, 0.6, 2.0)
    assert main(["promote", "--name", NAME, "--version", v2]) == 1
    out = capsys.readouterr().out
    assert f"version {v2} not promoted: faithful success 0.2 vs champion {v1}'s 0.5: lower" in out
    assert main(["promote", "--name", NAME, "--version", "42"]) == 2
