"""``omtr faithful`` end to end (subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def _omtr(*args, cwd=None):
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-m", "omtr", "-q", "faithful", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd, env=env)


@pytest.fixture()
def files(tmp_path, benchmarks):
    base = benchmarks / "planbench" / "instances" / "blocksworld"
    d = (base / "generated_domain.pddl").read_text()
    p = (base / "generated_basic" / "instance-1.pddl").read_text()  # b on c; goal (on c b)
    tasks = tmp_path / "tasks.jsonl"
    recs = [
        {"id": "bw-1", "family": "blocksworld", "split": "test", "nl": "stack c on b",
         "reference": {"domain": d, "problem": p}, "meta": {}},
        {"id": "noref", "family": "blocksworld", "split": "test", "nl": "no reference here", "meta": {}},
    ]
    tasks.write_text("".join(json.dumps(r) + "\n" for r in recs))
    # the generated spec: everything renamed (Mystery-style names)
    gd = (d.replace("clear", "province").replace("ontable", "planet").replace("handempty", "harmony")
          .replace("holding", "pain").replace("(on ", "(craves ").replace("pick-up", "attack")
          .replace("put-down", "succumb").replace("unstack", "feast").replace("stack", "overcome"))
    gp = (p.replace("clear", "province").replace("ontable", "planet").replace("handempty", "harmony")
          .replace("(on ", "(craves "))
    (tmp_path / "d.pddl").write_text(gd)
    (tmp_path / "p.pddl").write_text(gp)
    (tmp_path / "weak.pddl").write_text(gp.replace("(craves c b)", ""))
    (tmp_path / "plan.txt").write_text("(feast b c)\n(succumb b)\n(attack c)\n(overcome c b)\n; cost = 4\n")
    (tmp_path / "badplan.txt").write_text("(attack c)\n")
    (tmp_path / "garbage.pddl").write_bytes(os.urandom(256))
    return tmp_path


def test_cli_faithful_with_plan(files):
    r = _omtr("--tasks", str(files / "tasks.jsonl"), "--task-id", "bw-1", "--domain", str(files / "d.pddl"),
              "--problem", str(files / "p.pddl"), "--plan", str(files / "plan.txt"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["faithful"] is True and out["findings"] == []
    assert out["mapping"]["predicates"]["on"]["name"] == "craves"
    assert out["mapping"]["actions"]["stack"]["name"] == "overcome"
    assert out["plan"]["valid"] is True and out["task_id"] == "bw-1"


def test_cli_unfaithful_and_garbage_exit_zero(files):
    common = ["--tasks", str(files / "tasks.jsonl"), "--task-id", "bw-1", "--domain", str(files / "d.pddl")]
    r = _omtr(*common, "--problem", str(files / "weak.pddl"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["faithful"] is False and out["findings"][0]["category"] == "goal_weakened"
    r = _omtr(*common, "--problem", str(files / "p.pddl"), "--plan", str(files / "badplan.txt"))
    assert json.loads(r.stdout)["findings"][0]["category"] == "plan_invalid_under_reference"
    r = _omtr("--tasks", str(files / "tasks.jsonl"), "--task-id", "bw-1", "--domain", str(files / "garbage.pddl"),
              "--problem", str(files / "garbage.pddl"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["findings"][0]["category"] == "unmappable"


def test_cli_usage_errors(files):
    base = ["--tasks", str(files / "tasks.jsonl"), "--domain", str(files / "d.pddl"), "--problem", str(files / "p.pddl")]
    r = _omtr(*base, "--task-id", "nope")
    assert r.returncode == 2 and "nope" in r.stderr
    r = _omtr(*base, "--task-id", "noref")
    assert r.returncode == 2 and "reference" in r.stderr
    r = _omtr("--tasks", str(files / "missing.jsonl"), "--task-id", "bw-1", "--domain", str(files / "d.pddl"),
              "--problem", str(files / "p.pddl"))
    assert r.returncode == 2 and "missing.jsonl" in r.stderr
    r = _omtr(*base[:2], "--task-id", "bw-1", "--domain", str(files / "nofile.pddl"), "--problem", str(files / "p.pddl"))
    assert r.returncode == 2 and "nofile.pddl" in r.stderr


def test_cli_help_lists_examples():
    r = subprocess.run([sys.executable, "-m", "omtr", "faithful", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--task-id" in r.stdout and "examples" in r.stdout
