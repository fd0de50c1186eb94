"""The environment E(y) with the real Fast Downward and VAL binaries."""

import random

import pytest

from omtr.config import ConfigError, SolverConfig
from omtr.paths import planbench_family
from omtr.pddl.categories import Category
from omtr.solver import SolverPool, solve, solve_many, validate_plan
from omtr.solver.examples import BW_DOMAIN, BW_PROBLEM, MALFORMED, VALID

FAMILIES = ("blocksworld", "mystery_blocksworld", "logistics")


@pytest.fixture(scope="module")
def pool():
    with SolverPool(2, SolverConfig(time_limit_s=30)) as p:
        yield p


def test_planbench_sample_solved_with_val_valid_plans(benchmarks, pool):
    rng = random.Random(7)
    specs, names = [], []
    for fam in FAMILIES:
        domain, files = planbench_family(fam, benchmarks)
        for path in rng.sample(files, 20):
            specs.append((domain, path.read_text()))
            names.append(f"{fam}/{path.name}")
    verdicts = pool.solve_many(specs)
    assert len(verdicts) == 60
    for name, (d, p), v in zip(names, specs, verdicts):
        assert v.success, f"{name}: {v.category} {v.message}"
        assert v.category is None and v.plan and v.plan_length == len(v.plan)
        assert v.stage == "done" and v.exit_code == 0
        assert {"translate_ms", "search_ms", "validate_ms"} <= set(v.timings)
        # An independent VAL run on the returned plan agrees.
        assert validate_plan(d, p, v.plan).valid, name


def test_valid_examples_succeed(pool):
    for ex, v in zip(VALID, pool.solve_many([(e.domain, e.problem) for e in VALID])):
        assert v.success, (ex.name, v.message)


@pytest.mark.parametrize("ex", MALFORMED, ids=lambda e: e.name)
def test_malformed_spec_gets_its_category_and_names_the_culprit(ex, pool):
    v = pool.solve(ex.domain, ex.problem)
    assert not v.success
    assert v.category == Category(ex.category), v.message
    assert ex.mentions in v.message, v.message
    assert not v.plan


def test_every_category_has_three_distinct_handwritten_specs():
    per = {}
    for ex in MALFORMED:
        per.setdefault(ex.category, set()).add((ex.domain, ex.problem))
    assert set(per) == {c.value for c in Category}
    assert all(len(v) >= 3 for v in per.values()), {k: len(v) for k, v in per.items()}


def test_lint_rejects_without_starting_a_planner(pool):
    # An arity mismatch Fast Downward itself would not report as such.
    bad = BW_DOMAIN.replace("(clear ?y) (holding ?x))", "(clear ?y ?x) (holding ?x))")
    v = pool.solve(bad, BW_PROBLEM)
    assert v.category == Category.PREDICATE_SCHEMA and "`clear`" in v.message
    assert v.stage == "lint" and "translate_ms" not in v.timings and "search_ms" not in v.timings
    assert v.timings["lint_ms"] < 1000


def test_goal_already_true_is_a_warning_not_a_failure(pool):
    prob = BW_PROBLEM.replace("(and (on a b) (on b c))", "(and (on c a) (clear b))")
    v = pool.solve(BW_DOMAIN, prob)
    assert v.success and v.plan == [] and v.plan_length == 0
    assert any("already true" in w for w in v.warnings)


def test_configurable_search_string(pool):
    cfg = SolverConfig(search="astar(lmcut())", time_limit_s=30)
    v = pool.solve(BW_DOMAIN, BW_PROBLEM, cfg)
    assert v.success and v.plan_length == 6  # lmcut is admissible: optimal plan


def test_unknown_search_is_a_verdict_not_a_crash(pool):
    v = pool.solve(BW_DOMAIN, BW_PROBLEM, SolverConfig(search="nosuchsearch()", cache=False))
    assert not v.success and v.category is not None and v.message


def test_validate_plan_rejects_a_wrong_plan():
    check = validate_plan(BW_DOMAIN, BW_PROBLEM, ["(pick-up a)"])
    assert not check.valid and check.message
    good = solve(BW_DOMAIN, BW_PROBLEM)
    assert validate_plan(BW_DOMAIN, BW_PROBLEM, good.plan).valid


def test_config_rejects_impossible_values():
    with pytest.raises(ConfigError, match="time_limit_s"):
        SolverConfig(time_limit_s=0)
    with pytest.raises(ConfigError, match="memory_limit_mb"):
        SolverConfig(memory_limit_mb=1)
    assert SolverConfig().time_limit_s == 60 and SolverConfig().search == "lama-first"


def test_solve_many_keeps_order_and_agrees_across_worker_counts():
    specs = [(e.domain, e.problem) for e in VALID + MALFORMED]
    cfg = SolverConfig(cache=False, time_limit_s=30)
    one = solve_many(specs, workers=1, config=cfg)
    two = solve_many(specs, workers=2, config=cfg)
    assert [(v.success, v.category) for v in one] == [(v.success, v.category) for v in two]
    assert [v.success for v in one[:2]] == [True, True]


def test_validate_plan_names_unknown_actions_and_wrong_arity():
    check = validate_plan(BW_DOMAIN, BW_PROBLEM, ["(fly c a)"])
    assert not check.valid and "`fly`" in check.message
    check = validate_plan(BW_DOMAIN, BW_PROBLEM, ["(pick-up a b)"])
    assert not check.valid and "`pick-up` takes 1" in check.message


def test_missing_typing_requirement_is_a_warning(pool):
    from omtr.solver.examples import GRIPPER_DOMAIN, GRIPPER_PROBLEM

    d = GRIPPER_DOMAIN.replace("(:requirements :strips :typing)", "(:requirements :strips)")
    v = pool.solve(d, GRIPPER_PROBLEM)
    assert v.success and any(":typing" in w for w in v.warnings)
