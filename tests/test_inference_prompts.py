"""The roles' prompts: hand-written demonstrations, no reference text, compact, importable for training."""

import ast
import json
from pathlib import Path

import pytest

from omtr.inference import prompts as P
from omtr.inference.episode import run_episodes
from omtr.inference.scripted import ScriptedPolicy
from omtr.solver import solve_many
from omtr.tasks.generators import generate

FAMILIES = ("blocksworld", "mystery_blocksworld", "logistics", "gripper")
SRC = Path(__file__).resolve().parents[1] / "src" / "omtr"


@pytest.fixture(scope="module")
def tasks():
    out = []
    for fam in FAMILIES:
        out += generate(fam, 3, seed=5, verify=False, min_objects=2, max_objects=4)
    return out


def _reference_lines(task) -> set[str]:
    """Distinctive lines of a task's reference (long enough not to be generic PDDL)."""
    lines = set()
    for text in (task.reference.domain, task.reference.problem):
        lines |= {ln.strip() for ln in text.splitlines() if len(ln.strip()) > 25}
    # the header lines every typed STRIPS family shares are not evidence of copying
    return {ln for ln in lines if not ln.startswith(("(:requirements", "(:types"))}


def test_every_known_family_has_its_demonstration_and_others_the_generic_one():
    for fam in FAMILIES:
        assert P.demo_for(fam) is P.DEMOS[fam] and P.demo_for(fam.upper()) is P.DEMOS[fam]
    assert P.demo_for(None) is P.GENERIC and P.demo_for("kitchen") is P.GENERIC


def test_demonstrations_are_solved_by_the_planner():
    demos = [*P.DEMOS.values(), P.GENERIC]
    for demo, v in zip(demos, solve_many([(d.domain, d.problem) for d in demos])):
        assert v.success, (demo.problem, v.category, v.message)


def test_demonstrations_are_not_generator_references(tasks):
    for t in tasks:
        demo = P.demo_for(t.family)
        assert demo.domain.strip() != t.reference.domain.strip()
        assert demo.problem.strip() != t.reference.problem.strip()
        shared = _reference_lines(t) & {ln.strip() for ln in demo.answer.splitlines()}
        assert not shared, (t.family, shared)
        assert demo.nl != t.nl


def test_prompts_never_contain_reference_text(tasks):
    spec = "(define (domain d))\n\n(define (problem p))"
    for t in tasks:
        for messages in (P.actor_messages(t), P.judge_messages(t, spec),
                         P.editor_messages(t, spec, "syntax", "missing ')'")):
            blob = "\n".join(m["content"] for m in messages)
            assert t.nl in blob
            assert t.reference.domain not in blob and t.reference.problem not in blob
            assert not (_reference_lines(t) & {ln.strip() for ln in blob.splitlines()}), t.id
            assert "reference_plan" not in blob and str(t.meta.get("reference_plan")) not in blob


def test_the_loop_shows_no_reference_text_to_the_policy(tasks):
    """Evaluation tasks (with references) handed to the loop: every prompt it builds is clean."""

    class NoPlanner:
        def solve_many(self, specs):
            raise AssertionError("no spec should reach the planner")

    policy = ScriptedPolicy({})  # answers nothing: every step is an extraction failure
    eps = run_episodes(tasks, policy, NoPlanner(), budget=2)
    assert all(e.planner_calls == 2 for e in eps)
    contents = [m["content"] for _, batch in policy.calls for msgs in batch for m in msgs]
    contents += [json.dumps(e.to_json()) for e in eps]
    blob = "\n".join(contents)
    lines = {ln.strip() for ln in blob.splitlines()}
    for t in tasks:
        assert t.reference.domain not in blob and t.reference.problem not in blob
        assert not (_reference_lines(t) & lines), t.id


def test_message_shapes():
    class T:
        nl, family = "Move the box to the shelf.", None

    actor = P.actor_messages(T())
    assert [m["role"] for m in actor] == ["system", "user", "assistant", "user"]
    assert actor[-1]["content"] == T.nl and actor[2]["content"] == P.GENERIC.answer
    editor = P.editor_messages(T(), "(define ...)", "predicate_schema", "undeclared predicate `holdin`")
    assert [m["role"] for m in editor] == ["system", "user"]
    assert "(predicate_schema): undeclared predicate `holdin`" in editor[-1]["content"]
    judge = P.judge_messages(T(), "(define ...)")
    assert judge[-1]["content"].startswith("Task:\n" + T.nl)
    assert P.spec_text(None, None, "x" * 10_000).endswith("(cut)")
    assert P.spec_text(None, None, "  ") == "(empty answer)"


def test_one_shot_overhead_is_small():
    """System prompt + demonstration, at about 4 characters a token, stays well under 900 tokens."""
    for fam, demo in [*P.DEMOS.items(), ("generic", P.GENERIC)]:
        chars = len(P.SYSTEM) + len(demo.nl) + len(demo.answer)
        assert chars / 4 < 650, (fam, chars)


def _task_imports(path: Path) -> list[str]:
    bad = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            mods = [node.module]
            if node.module in ("omtr.tasks", "omtr"):
                mods = [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        else:
            continue
        bad += [f"{path.name}: {m}" for m in mods if m.startswith("omtr.tasks") and m != "omtr.tasks.training"]
    return bad


def test_inference_imports_tasks_only_through_the_training_module():
    bad = [b for py in sorted((SRC / "inference").rglob("*.py")) for b in _task_imports(py)]
    assert not bad, bad


def test_what_a_family_shares_comes_before_the_tasks_statement():
    """For every role and both modes, two tasks of one family (same description and given domain,
    other statements) have prompts that agree up to the statement: the rollout engine's prefix
    cache then computes the family's part once."""
    import os

    from omtr.tasks.records import TrainingTask

    desc = "I move blocks with one hand, one at a time, as the rules say.\n[STATEMENT]\n"
    domain = "(define (domain blocks) (:predicates (on ?x ?y)))"
    for given in (None, domain):
        a = TrainingTask("a", "blocksworld", None, desc + "As initial conditions I have that, the red block is clear.",
                         domain=given)
        b = TrainingTask("b", "blocksworld", None, desc + "As initial conditions I have that, the blue block is clear.",
                         domain=given)
        for make in (P.actor_messages, lambda t: P.judge_messages(t, "(define ...)"),
                     lambda t: P.editor_messages(t, "(define ...)", "syntax", "missing ')'")):
            ta = "\n".join(m["content"] for m in make(a))
            tb = "\n".join(m["content"] for m in make(b))
            common = len(os.path.commonprefix([ta, tb]))
            assert ta[:common].endswith("As initial conditions I have that, the ")
            if given:
                assert ta.index(domain) < ta.rindex("[STATEMENT]"), "the given domain before the statement"
    actor = P.actor_messages(a)[-1]["content"]
    assert P.split_given(actor) == (a.nl, domain)
    assert P.split_given(f"{a.nl}{P.GIVEN_MARK}{domain}\n\nWrite the problem (define (problem ...)) for this domain.") \
        == (a.nl, domain), "a turn in the former order is still read"
