"""Task records: JSONL round trip, minimal user files, and the training-side leakage guarantee."""

from __future__ import annotations

import ast
import dataclasses
import gc
import json
import pickle
from pathlib import Path

import pytest

from omtr.tasks import (
    MissingReferenceError,
    ReferenceSpec,
    Task,
    TaskFormatError,
    TrainingTask,
    load_tasks,
    load_training_tasks,
    require_reference,
    write_tasks,
)

SRC = Path(__file__).resolve().parents[1] / "src" / "omtr"

# distinctive reference text: if any of it is reachable from a training object, it leaked
DOMAIN_MARK = "zqxleakdomainmarker"
PROBLEM_MARK = "zqxleakproblemmarker"
PLAN_MARK = "zqxleakplanmarker"


def _task(i: int) -> Task:
    return Task(
        id=f"t{i}",
        family="blocksworld",
        split="train",
        nl=f"stack the blocks, task {i}",
        reference=ReferenceSpec(
            f"(define (domain {DOMAIN_MARK}{i}) (:predicates (p)))",
            f"(define (problem {PROBLEM_MARK}{i}) (:domain {DOMAIN_MARK}{i}) (:init) (:goal (p)))",
        ),
        meta={"n_objects": 3, "plan_length": 4, "reference_plan": [f"({PLAN_MARK} a)"], "gold_plan": [f"({PLAN_MARK})"]},
    )


def test_round_trip(tmp_path):
    tasks = [_task(i) for i in range(3)]
    path = tmp_path / "tasks.jsonl"
    assert write_tasks(path, tasks) == 3
    assert load_tasks(path) == tasks
    assert Task.from_json(tasks[0].to_json()) == tasks[0]


def test_minimal_user_file_is_valid_for_training_and_errors_clearly_for_reference(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(
        '{"id": "kitchen-1", "nl": "Put the cups on the shelf."}\n'
        '{"id": "kitchen-2", "nl": "Stack the plates.", "family": "kitchen", "split": "train"}\n'
    )
    training = load_training_tasks(path)
    assert [t.id for t in training] == ["kitchen-1", "kitchen-2"]
    assert training[1].family == "kitchen"
    tasks = load_tasks(path)
    assert tasks[0].reference is None and tasks[0].family is None
    with pytest.raises(MissingReferenceError, match="kitchen-1.*reference"):
        require_reference(tasks[0])
    with pytest.raises(MissingReferenceError, match="training task"):
        require_reference(training[0])
    assert require_reference(_task(1)).domain.startswith("(define")


@pytest.mark.parametrize(
    "line, match",
    [
        ('{"id": "a"}', "'nl' is required"),
        ('{"nl": "x"}', "'id' is required"),
        ('{"id": "a", "nl": "x", "split": "dev"}', "split 'dev'"),
        ('{"id": "a", "nl": "x", "refrence": {}}', "unknown keys"),
        ('{"id": "a", "nl": "x", "reference": {"domain": "d"}}', "'domain' and 'problem'"),
        ("{not json", "not valid JSON"),
    ],
)
def test_bad_records_name_the_line(tmp_path, line, match):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "ok", "nl": "fine"}\n' + line + "\n")
    with pytest.raises(TaskFormatError, match=match) as info:
        load_tasks(path)
    assert "bad.jsonl:2" in str(info.value)


def test_duplicate_ids_rejected(tmp_path):
    path = tmp_path / "dup.jsonl"
    path.write_text('{"id": "a", "nl": "x"}\n{"id": "a", "nl": "y"}\n')
    with pytest.raises(TaskFormatError, match="duplicate"):
        load_training_tasks(path)


# ----------------------------------------------------------------------------- leakage


def _reachable(roots, limit: int = 200_000):
    """Every object reachable from ``roots`` through references (the object graph)."""
    seen: dict[int, object] = {}
    stack = list(roots)
    while stack and len(seen) < limit:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, type) or type(obj).__name__ == "module":
            continue
        seen[id(obj)] = obj
        stack.extend(gc.get_referents(obj))
        if hasattr(type(obj), "__slots__"):
            stack.extend(getattr(obj, s) for s in type(obj).__slots__ if hasattr(obj, s))
    return seen.values()


def test_training_path_cannot_reach_reference_pddl(tmp_path):
    path = tmp_path / "with_refs.jsonl"
    write_tasks(path, [_task(i) for i in range(5)])
    assert DOMAIN_MARK in path.read_text()  # the file does hold references

    training = load_training_tasks(path)
    assert all(type(t) is TrainingTask for t in training)
    # 1. pickled, nothing of the reference or the gold/reference plans is there
    blob = pickle.dumps(training)
    for mark in (DOMAIN_MARK, PROBLEM_MARK, PLAN_MARK, "(define"):
        assert mark.encode() not in blob
    # 2. walking the object graph finds no string holding reference text
    for obj in _reachable(training):
        if isinstance(obj, str):
            assert DOMAIN_MARK not in obj and PROBLEM_MARK not in obj and PLAN_MARK not in obj
    # 3. the projection from an evaluation task drops it the same way
    projected = _task(9).for_training()
    assert PLAN_MARK.encode() not in pickle.dumps(projected) and DOMAIN_MARK.encode() not in pickle.dumps(projected)
    assert projected.meta == {"n_objects": 3, "plan_length": 4}


def test_training_path_cannot_reach_the_reference_problem_when_the_domain_is_given(tmp_path):
    """The domain-given mode: the reference's domain is given as the task's input ``domain`` (so the
    training view holds it, as it holds ``nl``), but the reference problem stays unreachable."""
    domain = "(define (domain givenbw) (:predicates (p)) (:action a :parameters () :precondition (p) :effect (not (p))))"
    tasks = [Task(f"g{i}", "blocksworld", "train", f"task {i}",
                  ReferenceSpec(domain, f"(define (problem {PROBLEM_MARK}{i}) (:domain givenbw) (:init (p)) (:goal (not (p))))"),
                  meta={"gold_plan": [f"({PLAN_MARK})"]}).with_given_domain() for i in range(4)]
    assert all(t.domain == domain for t in tasks)
    path = tmp_path / "given.jsonl"
    write_tasks(path, tasks)
    assert PROBLEM_MARK in path.read_text()
    training = load_training_tasks(path) + [tasks[0].for_training()]
    assert all(type(t) is TrainingTask and t.domain == domain for t in training)
    blob = pickle.dumps(training)
    for mark in (PROBLEM_MARK, PLAN_MARK, "(define (problem"):
        assert mark.encode() not in blob
    for obj in _reachable(training):
        if isinstance(obj, str):
            assert PROBLEM_MARK not in obj and PLAN_MARK not in obj


def test_training_task_cannot_carry_a_reference():
    t = TrainingTask("x", None, None, "some text")
    assert "reference" not in {f.name for f in dataclasses.fields(TrainingTask)}
    assert not hasattr(t, "__dict__")  # slotted: no attribute can be attached
    with pytest.raises((AttributeError, TypeError)):
        t.reference = ReferenceSpec("(define (domain d))", "(define (problem p))")  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        object.__setattr__(t, "reference", "x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.nl = "changed"  # type: ignore[misc]
    with pytest.raises(TypeError):
        TrainingTask("x", None, None, "text", reference=None)  # type: ignore[call-arg]
    with pytest.raises(TaskFormatError, match="not allowed on the training side"):
        TrainingTask("x", None, None, "text", {"gold_plan": ["(a)"]})
    with pytest.raises(TaskFormatError, match="not allowed"):
        TrainingTask("x", None, None, "text", {"source": "(define (domain d))"})


# Packages on the training side (created by later issues). They may import from omtr.tasks only
# through omtr.tasks.training.
TRAINING_PACKAGES = ("rl", "model", "rollout", "inference")
ALLOWED_TASK_IMPORTS = {"omtr.tasks.training"}


def _task_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            mods = [node.module]
            if node.module == "omtr.tasks" or node.module == "omtr":
                mods = [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        else:
            continue
        for m in mods:
            if (m == "omtr.tasks" or m.startswith("omtr.tasks.")) and m not in ALLOWED_TASK_IMPORTS:
                bad.append(f"{path.relative_to(SRC)}:{node.lineno} imports {m}")
    return bad


def test_training_packages_import_tasks_only_through_the_training_module(tmp_path):
    bad = []
    for pkg in TRAINING_PACKAGES:
        for py in sorted((SRC / pkg).rglob("*.py")) if (SRC / pkg).is_dir() else []:
            bad.extend(_task_imports(py))
    assert not bad, "training code must use omtr.tasks.training only:\n" + "\n".join(bad)
    # the scanner itself catches a forbidden import
    probe = SRC / "_probe_never_committed.py"
    try:
        probe.write_text("from omtr.tasks import Task\nimport omtr.tasks.records\nfrom omtr.tasks.training import TrainingTask\n")
        assert len(_task_imports(probe)) == 2
    finally:
        probe.unlink()


def test_training_module_exports_no_reference_types():
    import omtr.tasks.training as training

    assert set(training.__all__) == {"TaskFormatError", "TrainingTask", "load_training_tasks",
                                     "GivenDomainError", "MODES", "task_mode"}
    assert not hasattr(training, "Task") and not hasattr(training, "ReferenceSpec") and not hasattr(training, "load_tasks")


def test_write_is_atomic_and_json_lines(tmp_path):
    path = tmp_path / "sub" / "out.jsonl"
    write_tasks(path, [_task(1).for_training()])
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert rows == [{"id": "t1", "family": "blocksworld", "split": "train", "nl": "stack the blocks, task 1", "meta": {"n_objects": 3, "plan_length": 4}}]
    assert not list(path.parent.glob("*.tmp"))
