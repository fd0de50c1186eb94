"""``omtr infer`` with the real role model on the ``micro`` profile (slow: the model loads and decodes)."""

import json

import pytest

pytestmark = pytest.mark.slow


def test_infer_on_micro_end_to_end(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("omtr.model")
    from omtr.cli import main

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        json.dumps({"id": "g1", "family": "gripper", "nl": "The robot is in room_1 with ball_1. Bring ball_1 to room_2."})
        + "\n" + json.dumps({"id": "u1", "nl": "Open the door, then leave the house."}) + "\n"
    )
    out = tmp_path / "traces.jsonl"
    rc = main(["-q", "infer", "--model", "micro", "--tasks", str(tasks), "--out", str(out), "--budget", "2",
               "--max-new-tokens", "16", "--time-limit", "20"])
    assert rc == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == ["g1", "u1"]
    for r in rows:
        assert 1 <= r["planner_calls"] <= 2 and 0.0 <= r["judge_score"] <= 1.0
        step = r["steps"][0]
        assert step["role"] == "actor" and step["new_tokens"] > 0 and step["prompt_tokens"] > 0
        assert step["verdict"]["category"] or step["verdict"]["success"]
    assert "tasks: 2" in capsys.readouterr().out


def test_load_policy_gives_the_role_model():
    pytest.importorskip("torch")
    pytest.importorskip("omtr.model")
    from omtr.inference.loading import load_policy
    from omtr.inference.policy import Policy

    assert isinstance(load_policy("micro"), Policy)


def test_unknown_model_is_a_clear_error(tmp_path):
    from omtr.inference.loading import load_policy
    from omtr.inference.scripted import PolicyLoadError

    with pytest.raises(PolicyLoadError, match="cannot load model"):
        load_policy(str(tmp_path / "no-such-model"))
