"""The paired faithful difference the registry promotes on (issue 35, part 4).

The per-task faithful grade comes from an evaluation's traces.jsonl records; the trained and the
untrained model's grades are paired by task id, and the mean difference trained - untrained gets a
seeded paired bootstrap 95% interval. The figures here are worked out by hand: with the per-task
differences [1, 0, 0, 0], a resample's mean is k/4 with k ~ Binomial(4, 1/4), so P(0) = 0.32 puts the
2.5th percentile at 0 and P(k >= 3) = 0.051 > 0.025 > P(4) = 0.004 puts the 97.5th at 0.75.

`omtr register` is run on a real `micro` model directory and a real SQLite registry (a few seconds
per version), with the records beside each metrics.json as `omtr evaluate` writes them."""

from __future__ import annotations

import json

import pytest

mlflow = pytest.importorskip("mlflow")

from omtr.cli import main  # noqa: E402
from omtr.tracking.registry import (  # noqa: E402
    CHALLENGER, CHAMPION, Paired, PromotionError, Scores, decide, faithful_grades, paired_faithful)

NAME = "omtr-role-model-paired-test"


def rec(tid, solved, faithful, *, reference=True, kind="planning"):
    """One traces.jsonl line as `omtr evaluate` writes it (the fields the grade reads)."""
    return {"id": tid, "kind": kind, "success": solved, "planner_calls": 1,
            "faithful": {"reference": reference, "checked": bool(solved and reference), "faithful": faithful}}


def records(grades, solved=None):
    """Records with these 0/1 faithful grades; ``solved`` (default: the faithful ones) adds solved
    tasks whose spec drifts from the reference."""
    solved = solved if solved is not None else grades
    return [rec(f"t{i:02d}", bool(s), bool(g)) for i, (g, s) in enumerate(zip(grades, solved))]


# ---------------------------------------------------------------------------------- the grade and the interval


def test_the_per_task_grade_is_solved_and_faithful_to_the_reference():
    recs = [rec("a", True, True), rec("b", True, False), rec("c", False, None), rec("d", True, True, reference=False),
            {"id": "x", "kind": "transfer", "correct": True}, rec("e", False, False)]
    # d has no reference (no faithful grade), x is a transfer answer: both left out, as metrics.json does
    assert faithful_grades(recs) == {"a": 1, "b": 0, "c": 0, "e": 0}
    with pytest.raises(PromotionError, match="record 1 is not an evaluation record"):
        faithful_grades([{"success": True}], what="t.jsonl")


def test_paired_difference_and_interval_by_hand():
    p = paired_faithful(records([1, 0, 0, 0]), records([0, 0, 0, 0]))
    assert (p.diff, p.low, p.high, p.tasks, p.trained, p.untrained) == (0.25, 0.0, 0.75, 4, 0.25, 0.0)
    assert paired_faithful(records([1, 0, 0, 0]), records([0, 0, 0, 0])) == p  # seeded: the same every time
    # pairing is by task id, not by line order
    assert paired_faithful(list(reversed(records([1, 0, 0, 0]))), records([0, 0, 0, 0])) == p
    # every task the same on both sides: the difference is 0 exactly, and so is its interval
    same = paired_faithful(records([1, 1, 0, 0]), records([1, 1, 0, 0]))
    assert (same.diff, same.low, same.high) == (0.0, 0.0, 0.0)
    # the trained model faithful on every task, the untrained on none
    all_up = paired_faithful(records([1] * 5), records([0] * 5))
    assert (all_up.diff, all_up.low, all_up.high) == (1.0, 1.0, 1.0)


def test_paired_interval_on_24_tasks_decides_the_ci_gate():
    base = [1] * 4 + [0] * 20
    # four more faithful tasks, none lost: P(a resample holds no gain) = (20/24)^24 = 0.013 < 0.025
    up = paired_faithful(records([1] * 8 + [0] * 16), records(base))
    assert up.tasks == 24 and up.diff == pytest.approx(4 / 24, abs=1e-6) and up.low > 0
    # four gained, two lost: +2/24 on the point, but the interval reaches below 0
    mixed = paired_faithful(records([0, 0, 1, 1] + [1] * 4 + [0] * 16), records(base))
    assert mixed.diff == pytest.approx(2 / 24, abs=1e-6) and mixed.low < 0 < mixed.high
    b = Scores("b", 4 / 24, 0.5, 1.0)
    for paired, point, ci in ((up, True, True), (mixed, True, False)):
        c = Scores("2", round(4 / 24 + paired.diff, 6), 0.5, 1.0)
        assert decide(c, None, "point", b, paired).promote is point
        d = decide(c, None, "ci", b, paired)
        assert d.promote is ci
        assert ("lower end is above 0" if ci else "lower end is not above 0") in d.baseline_check


def test_records_of_other_tasks_do_not_pair():
    with pytest.raises(PromotionError, match=r"not evaluated on the same tasks \(4 vs 3 graded tasks; only the "
                                             r"trained model's: 1 t03"):
        paired_faithful(records([1, 0, 0, 0]), records([0, 0, 0]))
    with pytest.raises(PromotionError, match="no task with a reference"):
        paired_faithful([rec("a", True, True, reference=False)], [rec("a", True, True, reference=False)])


# ---------------------------------------------------------------------------------- register and promote


@pytest.fixture()
def registry(sqlite_registry, tmp_path):
    pytest.importorskip("torch")
    from omtr.model import build_model

    uri, client = sqlite_registry
    model_dir = build_model("micro").save(tmp_path / "model")
    yield client, model_dir
    while mlflow.active_run():
        mlflow.end_run()
    mlflow.tracking.fluent._active_experiment_id = None
    mlflow.set_tracking_uri(None)


def evaluation(folder, grades, solved=None, *, traces=True):
    """An evaluation folder as `omtr evaluate` leaves it: metrics.json and (given) traces.jsonl."""
    folder.mkdir(parents=True, exist_ok=True)
    recs = records(grades, solved)
    n = len(recs)
    s = solved if solved is not None else grades
    metrics = {"faithful": round(sum(grades) / n, 4), "success": round(sum(map(bool, s)) / n, 4), "calls": 1.0,
               "drift": 0.0, "tasks": n, "overall": {"faithful": {"ci": [0.0, 1.0]}, "success": {"ci": [0.0, 1.0]}},
               "provenance": {"model": {"spec": "micro"}, "budget": 2, "tasks": {"task_set": "ts", "count": n},
                              "eval": {"seed": 0, "max_new_tokens": 16}}}
    (folder / "metrics.json").write_text(json.dumps(metrics))
    if traces:
        (folder / "traces.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return folder / "metrics.json"


def register_cmd(model_dir, trained, untrained, *extra):
    return ["register", "--model-dir", str(model_dir), "--name", NAME, "--metrics", str(trained),
            "--baseline-metrics", str(untrained), *extra]


def test_register_tags_the_paired_difference_and_promote_prints_it(registry, tmp_path, capsys):
    client, model_dir = registry
    base = [1] * 4 + [0] * 20
    trained = evaluation(tmp_path / "trained", [1] * 8 + [0] * 16)
    untrained = evaluation(tmp_path / "untrained", base)
    assert main(register_cmd(model_dir, trained, untrained, "--json", str(tmp_path / "v.json"))) == 0
    out = capsys.readouterr().out
    v = json.loads((tmp_path / "v.json").read_text())["version"]
    tags = client.get_model_version(NAME, v).tags
    want = paired_faithful(records([1] * 8 + [0] * 16), records(base))
    assert float(tags["baseline.faithful_diff"]) == want.diff == pytest.approx(1 / 6, abs=1e-6)
    assert float(tags["baseline.faithful_diff_low"]) == want.low > 0
    assert float(tags["baseline.faithful_diff_high"]) == want.high
    assert tags["baseline.paired_tasks"] == "24" and tags["baseline.paired_bootstrap"] == "10000"
    assert Paired.from_tags(tags) == want
    assert "faithful success 0.333333 (trained) vs 0.166667 (untrained): paired difference +0.167" in out

    assert main(["promote", "--name", NAME, "--version", v, "--rule", "ci"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line == (f"{NAME} version {v} is now champion: there is no champion yet (baseline gate: rule ci: faithful "
                    "success 0.3333 against the untrained model's 0.1667 (baseline.faithful), paired difference "
                    f"+0.167, 95% interval [{want.low:+.3f}, {want.high:+.3f}] over 24 paired tasks: the interval's "
                    "lower end is above 0)")
    tag = json.loads(client.get_model_version(NAME, v).tags["omtr.promotion"])
    assert tag["paired"]["diff"] == want.diff and tag["paired"]["tasks"] == 24


def test_more_solved_but_not_more_faithful_is_refused_with_the_paired_line(registry, tmp_path, capsys):
    """The hack the gate exists for: the trained model solves every task, yet writes no more
    faithful specs than the untrained one (the same 6 of 24)."""
    client, model_dir = registry
    grades = [1] * 6 + [0] * 18
    trained = evaluation(tmp_path / "trained", grades, solved=[1] * 24)
    untrained = evaluation(tmp_path / "untrained", grades, solved=[1] * 6 + [0] * 18)
    assert main(register_cmd(model_dir, trained, untrained, "--json", str(tmp_path / "v.json"))) == 0
    v = json.loads((tmp_path / "v.json").read_text())["version"]
    capsys.readouterr()
    for rule in ("point", "ci"):
        assert main(["promote", "--name", NAME, "--version", v, "--rule", rule]) == 1
        line = capsys.readouterr().out.strip()
        assert "\n" not in line
        assert line.startswith(f"{NAME} version {v} not promoted: ")
        assert "faithful success 0.25 against the untrained model's 0.25 (baseline.faithful)" in line
        assert "paired difference +0.000, 95% interval [+0.000, +0.000] over 24 paired tasks" in line
        if rule == "point":
            assert "a tie is no improvement (planner success 1 against 0.25 does not count" in line
    assert alias(client, CHAMPION) is None and alias(client, CHALLENGER) == v


def test_without_records_the_difference_is_unknown_point_still_applies_ci_refuses(registry, tmp_path, capsys):
    client, model_dir = registry
    trained = evaluation(tmp_path / "trained", [1] * 8 + [0] * 16, traces=False)
    untrained = evaluation(tmp_path / "untrained", [1] * 4 + [0] * 20)
    assert main(register_cmd(model_dir, trained, untrained, "--json", str(tmp_path / "v.json"))) == 0
    out = capsys.readouterr().out
    assert "paired difference unknown: no per-task records (traces.jsonl) of the trained model" in out
    v = json.loads((tmp_path / "v.json").read_text())["version"]
    assert not any(k.startswith("baseline.faithful_diff") for k in client.get_model_version(NAME, v).tags)
    assert main(["promote", "--name", NAME, "--version", v, "--rule", "ci"]) == 1
    line = capsys.readouterr().out.strip()
    assert "paired difference unknown (registered without per-task records" in line
    assert "the ci gate needs the paired interval" in line
    assert main(["promote", "--name", NAME, "--version", v]) == 0  # rule point: 0.333 > 0.167
    assert alias(client, CHAMPION) == v


def test_register_refuses_records_that_are_not_the_metrics_evaluation(registry, tmp_path, capsys):
    client, model_dir = registry
    trained = evaluation(tmp_path / "trained", [1] * 8 + [0] * 16)
    untrained = evaluation(tmp_path / "untrained", [1] * 4 + [0] * 20)
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps(r) + "\n" for r in records([1] * 12 + [0] * 12)))
    assert main(register_cmd(model_dir, trained, untrained, "--traces", str(other))) == 2
    err = capsys.readouterr().err
    assert "the trained model's per-task records give faithful success 0.5 over 24 tasks, but its metrics.json " \
           "says 0.3333" in err
    short = tmp_path / "short.jsonl"
    # the same faithful rate (2 of 12 is 4 of 24), but only half the tasks: they cannot be paired
    short.write_text("".join(json.dumps(r) + "\n" for r in records([1] * 2 + [0] * 10)))
    assert main(register_cmd(model_dir, trained, untrained, "--baseline-traces", str(short))) == 2
    assert "not evaluated on the same tasks (24 vs 12 graded tasks" in capsys.readouterr().err
    assert main(register_cmd(model_dir, trained, untrained, "--traces", str(tmp_path / "missing.jsonl"))) == 2
    assert "--traces: " in capsys.readouterr().err and not client.search_model_versions(f"name='{NAME}'")


def alias(client, a):
    try:
        return str(client.get_model_version_by_alias(NAME, a).version)
    except mlflow.exceptions.MlflowException:
        return None


# ---------------------------------------------------------------------------------- the main job's sample


def test_the_main_job_validates_both_models_on_24_tasks_by_default():
    from pathlib import Path

    import yaml

    from omtr.cli import build_parser
    from omtr.tracking.pipeline import PipelineConfig, for_profile

    small = for_profile(PipelineConfig())
    assert small.n_val == 24 and small.val_objects == 5 and small.max_objects == 4  # training sizes stay 2-4
    micro = for_profile(PipelineConfig(profile="micro"))
    assert micro.n_val == 2 and micro.val_objects == micro.max_objects  # the tests' tiny job
    assert for_profile(PipelineConfig(profile="paper")).val_objects == 6
    with pytest.raises(ValueError, match="val_max_objects"):
        PipelineConfig(val_max_objects=1)
    main_entry = yaml.safe_load((Path(__file__).resolve().parents[1] / "MLproject").read_text())["entry_points"]["main"]
    assert main_entry["parameters"]["n_val"]["default"] == 24
    assert main_entry["parameters"]["val_max_objects"]["default"] == 5
    assert "--val-max-objects {val_max_objects}" in main_entry["command"]
    args = build_parser().parse_args(["pipeline"])
    assert args.n_val == 24 and args.val_max_objects == 5
