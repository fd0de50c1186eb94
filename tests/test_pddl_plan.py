"""The one tolerant plan-step reader (omtr.pddl.plan) and the places that use it."""

from omtr.pddl.plan import PlanStep, format_step, parse_step, read_plan, read_plan_file


def test_planner_plan_file(tmp_path):
    p = tmp_path / "sas_plan"
    p.write_text("(pick-up b)\n(stack  b a)\n; cost = 2 (unit cost)\n")
    assert read_plan_file(str(p)) == ["(pick-up b)", "(stack b a)"]


def test_free_text_shapes():
    text = """Here is the plan:
```
1. (Pick-Up A)
2) stack(a, b)
- unstack c a
Step 4: put-down c
(pick-up d) (stack d c)
```
[PLAN END]
Then I am done.
"""
    assert [str(s) for s in read_plan(text)] == [
        "(pick-up a)", "(stack a b)", "(unstack c a)", "(put-down c)", "(pick-up d)", "(stack d c)",
    ]


def test_bare_steps_only_when_asked():
    assert read_plan("pick-up a\n(stack a b)\n", bare=False) == [PlanStep("stack", ("a", "b"))]
    assert len(read_plan("pick-up a\n(stack a b)\n")) == 2


def test_timed_plan_keeps_time():
    (step,) = read_plan("0.001: (move r1 r2) [1.000]")
    assert step == PlanStep("move", ("r1", "r2"), 0.001)
    assert str(step) == "(move r1 r2)"


def test_lists_of_steps_and_single_steps():
    assert read_plan(["(a x)", "b y"]) == [PlanStep("a", ("x",)), PlanStep("b", ("y",))]
    assert parse_step("(stack a b)") == PlanStep("stack", ("a", "b"))
    assert parse_step("not a step.") is None
    assert parse_step("") is None
    assert format_step("move", ["a", "b"]) == "(move a b)"
    assert read_plan("(Stack A B)", lower=False) == [PlanStep("Stack", ("A", "B"))]


def test_users_of_the_reader_agree():
    from omtr.faithfulness import parse_plan
    from omtr.tasks.strips import parse_action

    assert parse_plan("1. (stack a b)\nunstack c d") == [["stack", "a", "b"], ["unstack", "c", "d"]]
    assert parse_action("(STACK a b)") == ("stack", ("a", "b"))


def test_unknown_plan_steps_are_named():
    from omtr.solver.examples import BW_DOMAIN
    from omtr.solver.pipeline import _unknown_steps

    assert "fly" in _unknown_steps(BW_DOMAIN, "(pick-up a)\n(fly a b)")
    assert _unknown_steps(BW_DOMAIN, "0.001: (fly a b) [1]") is None  # timed plans: VAL decides
