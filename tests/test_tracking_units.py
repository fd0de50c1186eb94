"""Fast checks of the serving input rules and the pipeline's content keys (no model, no server)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("mlflow")

from mlflow.exceptions import MlflowException  # noqa: E402

from omtr.tracking.pipeline import PipelineConfig, _key, for_profile  # noqa: E402
from omtr.tracking.pyfunc import ServingLimits, signature, tasks_from_input  # noqa: E402

LIM = ServingLimits(max_tasks=3, max_task_chars=20)


D = "(define (domain d) (:predicates (p)))"


@pytest.mark.parametrize("given, expected", [
    ("stack a on b", [("stack a on b", None, None)]),
    (["t1", "t2"], [("t1", None, None), ("t2", None, None)]),
    (pd.DataFrame({"task": ["t1"], "family": ["gripper"]}), [("t1", "gripper", None)]),
    (pd.DataFrame({0: ["t1", "t2"]}), [("t1", None, None), ("t2", None, None)]),
    (pd.Series(["t1"]), [("t1", None, None)]),
    (np.array(["t1", "t2"]), [("t1", None, None), ("t2", None, None)]),
    ({"task": ["t1"]}, [("t1", None, None)]),
    # the domain-given mode: records with a domain, or a domain column
    ([{"task": "t1", "domain": D}, {"task": "t2"}], [("t1", None, D), ("t2", None, None)]),
    ([{"task": np.array("t1"), "domain": np.array(D)}], [("t1", None, D)]),  # as MLflow parses "inputs"
    (np.array([np.array({"task": "t1", "domain": D}, dtype=object)], dtype=object), [("t1", None, D)]),
    (pd.DataFrame({"task": ["t1", "t2"], "domain": [D, None]}), [("t1", None, D), ("t2", None, None)]),
    ({"task": ["t1"], "domain": [D]}, [("t1", None, D)]),
    # what the typed schema hands predict: all three columns, NaN where a record left a key out and
    # the text "None" where "inputs" carried a JSON null (MLflow's cast); both mean absent
    (pd.DataFrame({"task": ["t1", "t2", "t3"], "family": ["gripper", float("nan"), "None"],
                   "domain": [float("nan"), D, "None"]}),
     [("t1", "gripper", None), ("t2", None, D), ("t3", None, None)]),
    ({"task": ["t1", "t2"], "family": ["gripper", None]}, [("t1", "gripper", None), ("t2", None, None)]),
])
def test_accepted_inputs(given, expected):
    assert tasks_from_input(given, LIM) == expected


@pytest.mark.parametrize("given, words", [
    ([], "no tasks"),
    (pd.DataFrame({"task": []}), "no tasks"),
    ([""], "task 0 is empty"),
    (["ok", "   "], "task 1 is empty"),
    (["x" * 21], "21 characters, at most 20"),
    (["a", "b", "c", "d"], "too many tasks: 4 in one request, at most 3"),
    ([1], "task 0 is a number, not text"),
    (pd.DataFrame({0: [1.5]}), "a number, not text"),
    ([{"nested": 1}], "task 0 has keys ['nested']; send {'task': '...'}"),
    ([{"task": "t1", "domain": 3}], "task 0: domain must be PDDL text"),
    ({"task": ["t1", "t2"], "domain": [D]}, "2 tasks but 1 domains"),
    (pd.DataFrame({"a": ["x"], "b": ["y"]}), "send one column named 'task'"),
    ({"other": ["x"]}, "send {'task': [...]}"),
    (42, "tasks must be text"),
    (["12"], "task 0 is '12', which has no words"),  # a number MLflow cast to the string column
    (pd.DataFrame({"task": ["t1"], "family": ["chess"]}), "family 'chess', which this model does not know"),
    (pd.DataFrame({"task": ["t1"], "domain": ["x" * 100_001]}), "task 0: its domain has 100001 characters, at most 100000"),
    (pd.DataFrame({"task": ["None"]}), "task 0 is null"),  # {"task": null} as MLflow hands it over
    ({"task": ["t1", "t2"], "family": ["gripper"]}, "2 tasks but 1 families"),
])
def test_rejected_inputs_say_why(given, words):
    with pytest.raises(MlflowException) as e:
        tasks_from_input(given, LIM)
    assert e.value.error_code == "INVALID_PARAMETER_VALUE"  # the scoring server answers 400
    assert words in e.value.message


def test_limits_and_signature():
    with pytest.raises(ValueError, match="budget must be at least 1"):
        ServingLimits(budget=0)
    with pytest.raises(ValueError, match="fleet_retries"):
        ServingLimits(fleet_retries=-1)
    sig = signature()
    assert [(c.name, c.required) for c in sig.inputs.inputs] == [("task", True), ("family", False), ("domain", False)]
    assert [c.name for c in sig.outputs.inputs][:3] == ["task", "domain", "problem"]
    assert {p.name for p in sig.params.params} == {"budget", "max_new_tokens", "select", "abstain", "library"}
    outputs = {c.name for c in sig.outputs.inputs}
    assert {"support", "support_reasons", "domain_source", "domain_reason"} <= outputs  # every answer's verdict


def test_content_keys_and_profiles():
    a = {"family": "blocksworld", "n": 8}
    assert _key("prepare", a) == _key("prepare", dict(reversed(list(a.items()))))  # order does not matter
    assert _key("prepare", a) != _key("prepare", {**a, "n": 9}) != _key("train", a)
    micro = for_profile(PipelineConfig(profile="micro"))
    assert micro.n_train == 4 and micro.eval_max_new_tokens == 24
    assert for_profile(PipelineConfig(profile="micro", n_train=6)).n_train == 6  # explicit values win
    assert for_profile(PipelineConfig(profile="paper")).eval_budget == 6
    with pytest.raises(ValueError, match="unknown promotion rule"):
        PipelineConfig(rule="best")
    # the task mode: small gives the family's domain, micro and paper ask for domain and problem
    assert PipelineConfig().mode == "given" and micro.mode == "full"
    assert for_profile(PipelineConfig(profile="paper")).mode == "full"
    with pytest.raises(ValueError, match="unknown task mode"):
        PipelineConfig(mode="half")
    # the run parameter `mode` (main job and Kubeflow pipeline): an explicit mode wins, `profile` takes the profile's
    from omtr.tracking.pipeline import task_mode

    assert [task_mode(p) for p in ("small", "micro", "paper")] == ["given", "full", "full"]
    assert task_mode("micro", "given") == "given" and task_mode("small", "full") == "full"
    with pytest.raises(ValueError, match="unknown task mode 'half'"):
        task_mode("small", "half")


def test_the_main_jobs_prepare_step_writes_tasks_in_its_mode(tmp_path):
    """`omtr pipeline --mode given` generates tasks that carry the family's domain (the Actor writes
    problems), `--mode full` tasks carry none, and the mode is part of the step's key (the full-mode
    run does not reuse the given-mode one)."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlruns.db'}"
    for mode in ("given", "full"):
        r = subprocess.run([sys.executable, "-m", "omtr", "-q", "pipeline", "--profile", "micro", "--mode", mode,
                            "--n-train", "1", "--n-val", "1", "--min-objects", "3", "--max-objects", "4",
                            "--steps", "prepare", "--work", str(tmp_path / "work"), "--experiment", "mode-test"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        summary = json.loads(r.stdout[r.stdout.index("{"): r.stdout.rindex("}") + 1])
        assert not summary["prepare"]["skipped"], mode
    recs = {f.parent.name: [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
            for f in (tmp_path / "work").glob("prepare-*/train.jsonl")}
    assert len(recs) == 2 and sorted(bool(r[0].get("domain")) for r in recs.values()) == [False, True]


class _BrokenPlanner:
    """A serving environment whose planner cannot run (what ``_Env`` gives when the local workers die
    or Fast Downward is not installed on the endpoint)."""

    def __init__(self, exc: BaseException):
        self.exc = exc

    def solve_many(self, specs):
        raise self.exc


def _served_with(env):
    from omtr.inference.scripted import ScriptedPolicy
    from omtr.solver.examples import BW_DOMAIN, BW_PROBLEM
    from omtr.tracking.pyfunc import RoleModelPyfunc

    py = RoleModelPyfunc()
    py.limits, py.metrics, py.env = ServingLimits(budget=1, max_new_tokens=64), None, env
    py.model = ScriptedPolicy({"Put a on b.": [f"```pddl\n{BW_DOMAIN}```\n```pddl\n{BW_PROBLEM}```"]})
    return py


@pytest.mark.parametrize("make_exc, words", [
    (lambda: __import__("omtr.solver.proc", fromlist=["ToolMissing"]).ToolMissing("fast-downward not found"),
     "the local planner cannot run on this endpoint (fast-downward not found)"),
    (lambda: __import__("concurrent.futures.process", fromlist=["BrokenProcessPool"]).BrokenProcessPool("worker died"),
     "the local planner cannot run on this endpoint (worker died)"),
])
def test_a_local_planner_outage_is_503_and_other_errors_are_not(make_exc, words):
    """A local planner that cannot run (Fast Downward missing, the worker pool broken) is the
    endpoint's fault, not the request's: 503 with a sentence; any other error is not dressed up as one."""
    py = _served_with(_BrokenPlanner(make_exc()))
    with pytest.raises(MlflowException) as e:
        py.predict(None, {"task": ["Put a on b."]})
    assert e.value.get_http_status_code() == 503, e.value.message
    assert words in e.value.message and "the request was fine" in e.value.message
    with pytest.raises(KeyError):  # a bug stays a bug (MLflow's 500), not an outage
        _served_with(_BrokenPlanner(KeyError("x"))).predict(None, {"task": ["Put a on b."]})
