"""The reference checker: equivalences, garbage, plan replay, mapping, speed."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from omtr.faithfulness import DriftCategory, check, normalize
from omtr.faithfulness.mutators import (
    GRIPPER_DOMAIN,
    family_specs,
    predicates_to_types,
    rename_all_with_table,
    reorder,
    types_to_predicates,
)


def _planbench(benchmarks: Path, family_dir: str, n: int) -> tuple[str, str]:
    base = benchmarks / "planbench" / "instances" / family_dir
    return (base / "generated_domain.pddl").read_text(), (base / "generated_basic" / f"instance-{n}.pddl").read_text()


def _gold(benchmarks: Path, name: str) -> list[dict]:
    with open(benchmarks / "planbench" / "plan_generation" / f"{name}.jsonl") as f:
        return [json.loads(line) for line in f]


# ----------------------------------------------------------------------------- garbage


GOOD_DOMAIN = "(define (domain x) (:predicates (p ?x)) (:action a :parameters (?x) :effect (p ?x)))"
GOOD_PROBLEM = "(define (problem q) (:domain x) (:objects o) (:init) (:goal (and (p o))))"
GARBAGE = [
    "", "   ", "(", ")", "((((", "))(", "(define)", "(define (domain))", "(define (problem x))",
    "(define (domain x) (:action))", "(define (domain x) (:predicates ?x))", "hello world",
    "(define (domain x)) trailing", "(" * 300 + ")" * 300, "\x00\x01\xff", "(define (domain x) (:bogus 1))",
    "(define (problem q) (:domain x) (:objects a - ) (:init) (:goal (and)))",
    "(define (problem q) (:domain x) (:init (p (q r))) (:goal (p a)))",
    "(define (domain x) (:predicates (p ?x)) (:action a :parameters (?x) :precondition (p (f ?x)) :effect (p ?x)))",
    GOOD_DOMAIN, GOOD_PROBLEM, None, 42, b"(define (domain x))", ["(", ")"],
]


def test_garbage_never_raises_and_is_unmappable(benchmarks):
    ref = _planbench(benchmarks, "blocksworld", 1)
    rng = random.Random(0)
    pool = GARBAGE + [bytes(rng.randrange(256) for _ in range(300)).decode("latin-1") for _ in range(3)]
    for gd in pool:
        for gp in pool:
            report = check(ref, (gd, gp))
            assert report.faithful is False
            assert report.findings, (gd, gp)
            json.dumps(report.to_dict())
    for bad in (None, 5, "text", ("only one",), {"domain": ref[0]}):
        report = check(ref, bad)
        assert not report.faithful and report.first_category == "unmappable"


def test_garbage_reference_is_a_report_too():
    report = check(("(", ")"), (GOOD_DOMAIN, GOOD_PROBLEM))
    assert not report.faithful
    assert report.first_category == "unmappable" and "reference" in report.findings[0].detail


def test_unmappable_names_the_failing_part(benchmarks):
    ref = _planbench(benchmarks, "blocksworld", 1)
    report = check(ref, (GOOD_DOMAIN, GOOD_PROBLEM))
    assert report.categories == ["unmappable"]
    detail = report.findings[0].detail
    assert "action schemas" in detail and "predicates" in detail
    parse = check(ref, ("(define (domain x) (:predicates (p ?x)", GOOD_PROBLEM))
    assert "generated domain: does not parse" in parse.findings[0].detail


# ----------------------------------------------------------------------------- equivalences


def test_typed_generated_gripper_equals_untyped_predicate_version():
    """Declared types == unary static type predicates (ASSUMPTIONS.md)."""
    for sid, d, p in family_specs("gripper", 3, seed=1, source="generators"):
        untyped = types_to_predicates(d, p, random.Random(0))
        assert untyped is not None and ":types" not in untyped[0]
        assert check((d, p), untyped).faithful
        assert check(untyped, (d, p)).faithful


def test_planbench_logistics_type_predicates_equal_a_type_hierarchy(benchmarks):
    d, p = _planbench(benchmarks, "logistics", 17)
    typed = predicates_to_types(d, p, random.Random(0))
    assert typed is not None and "airport - location" in typed[0]
    report = check((d, p), typed)
    assert report.faithful, report.findings
    assert report.mapping["types"]  # type predicates mapped onto declared types


def test_universal_type_added_to_blocksworld_is_faithful_and_noted(benchmarks):
    d, p = _planbench(benchmarks, "blocksworld", 3)
    typed_d = d.replace("(:requirements :strips)", "(:requirements :strips :typing) (:types block)")
    typed_d = typed_d.replace("(?ob)", "(?ob - block)").replace("(?ob ?underob)", "(?ob ?underob - block)")
    typed_p = p.replace(")\n(:init", " - block)\n(:init", 1)
    assert "- block)" in typed_p
    report = check((d, p), (typed_d, typed_p))
    assert report.faithful, report.findings
    assert any("every object" in n for n in report.notes)


def test_unused_predicate_with_facts_is_faithful(benchmarks):
    d, p = _planbench(benchmarks, "blocksworld", 4)
    d2 = d.replace("(on ?x ?y))", "(on ?x ?y) (shiny ?x))")
    p2 = p.replace("(handempty)", "(handempty) (shiny a)")
    assert "shiny" in d2 and "shiny" in p2
    report = check((d, p), (d2, p2))
    assert report.faithful and any("shiny" in n for n in report.notes)


def test_mystery_maps_onto_blocksworld(benchmarks):
    """Mystery BlocksWorld is BlocksWorld with meaningless names: the structure must map."""
    d, _ = _planbench(benchmarks, "blocksworld", 1)
    md, mp = _planbench(benchmarks, "blocksworld/mystery", 1)
    translate = {"province": "clear", "planet": "ontable", "harmony": "handempty", "pain": "holding",
                 "craves": "on"}
    p = mp
    for a, b in translate.items():
        p = p.replace(f"({a} ", f"({b} ").replace(f"({a})", f"({b})")
    p = p.replace("mystery-4ops", "blocksworld-4ops")
    report = check((d, p), (md, mp))
    assert report.faithful, report.findings
    preds = {r: v["name"] for r, v in report.mapping["predicates"].items()}
    assert preds == {v: k for k, v in translate.items()}
    assert report.mapping["actions"]["stack"]["name"] == "overcome"


@pytest.mark.timeout(120)  # a hang guard against exponential tie-breaking, not a speed test
def test_symmetric_objects_are_mapped_exactly(benchmarks):
    """15 interchangeable blocks on the table: ties must not blow up (timings: benchmarks/)."""
    objs = " ".join(f"b{i}" for i in range(15))
    init = " ".join(f"(ontable b{i}) (clear b{i})" for i in range(15))
    goal = "(and (on b0 b1))"
    d, _ = _planbench(benchmarks, "blocksworld", 1)
    p = f"(define (problem big) (:domain blocksworld-4ops) (:objects {objs}) (:init (handempty) {init}) (:goal {goal}))"
    rd, rp, _ = rename_all_with_table(d, p, random.Random(1))
    report = check((d, p), reorder(rd, rp, random.Random(2)))
    assert report.faithful


# ----------------------------------------------------------------------------- findings


def test_argument_order_is_reported_in_mapping(benchmarks):
    d, p = _planbench(benchmarks, "blocksworld", 2)
    swap = lambda t: __import__("re").sub(r"\(on ([^\s()]+) ([^\s()]+)\)", r"(on \2 \1)", t)  # noqa: E731
    report = check((d, p), (swap(d), swap(p)))
    assert report.faithful
    assert report.mapping["predicates"]["on"]["argument_order"] == [1, 0]


def test_findings_are_specific(benchmarks):
    d, p = _planbench(benchmarks, "blocksworld", 5)
    d2 = d.replace("(and (clear ?underob) (holding ?ob))", "(holding ?ob)")
    r = check((d, p), (d2, p))
    assert r.categories == ["precondition_dropped"]
    assert "stack" in r.findings[0].detail and "clear" in r.findings[0].detail
    d3 = d.replace("(:action pick-up", "(:action jump :parameters (?ob) :precondition (clear ?ob) "
                   ":effect (not (clear ?ob)))\n(:action pick-up")
    assert check((d, p), (d3, p)).categories == ["action_extra"]
    d4 = d[: d.index("(:action unstack")] + ")"
    assert "action_missing" in check((d, p), (d4, p)).categories


def test_goal_changed_and_extra_object(benchmarks):
    d, p = _planbench(benchmarks, "blocksworld", 1)  # goal (on c b)
    r = check((d, p), (d, p.replace("(on c b)", "(on b c)")))
    assert r.first_category == "goal_changed"
    p2 = p.replace("(:objects a b c d )", "(:objects a b c d e)").replace("(handempty)", "(handempty) (ontable e) (clear e)")
    assert check((d, p), (d, p2)).categories == ["object_extra"]


# ----------------------------------------------------------------------------- plan replay


def _rename_plan(plan: list[str], table: dict[str, str]) -> list[str]:
    out = []
    for step in plan:
        toks = step.strip("()").split()
        out.append("(" + " ".join(table.get(t, t) for t in toks) + ")")
    return out


@pytest.mark.parametrize("name,family_dir", [("blocksworld", "blocksworld"), ("mystery_blocksworld", "blocksworld/mystery"),
                                             ("logistics", "logistics")])
def test_gold_plans_replay_through_renamed_specs(benchmarks, name, family_dir):
    rows = _gold(benchmarks, name)[:6]
    for row in rows:
        d = (benchmarks / row["domain_pddl_path"]).read_text()
        p = (benchmarks / row["problem_pddl_path"]).read_text()
        rd, rp, table = rename_all_with_table(d, p, random.Random(row["instance_id"]))
        plan = _rename_plan(row["gold_plan"], table)
        report = check((d, p), (rd, rp), plan)
        assert report.faithful, (row["instance_id"], report.findings)
        assert report.plan["valid"] and report.plan["mapped_plan"] == [s.lower() for s in row["gold_plan"]]
        broken = plan[:-1]
        bad = check((d, p), (rd, rp), broken)
        assert bad.categories == ["plan_invalid_under_reference"]
        assert "goal" in bad.findings[0].detail
        repeated = [plan[0], *plan]  # every action here deletes one of its own preconditions
        bad = check((d, p), (rd, rp), repeated)
        assert bad.categories == ["plan_invalid_under_reference"]
        assert "step 2" in bad.findings[0].detail and "not applicable" in bad.findings[0].detail


def test_plan_with_unknown_action_or_object(benchmarks):
    d, p = _planbench(benchmarks, "blocksworld", 1)
    r = check((d, p), (d, p), ["(fly a)"])
    assert r.categories == ["plan_invalid_under_reference"] and "fly" in r.findings[0].detail
    r = check((d, p), (d, p), "(pick-up zz)\n")
    assert r.categories == ["plan_invalid_under_reference"]
    r = check((d, p), (d, p), "; empty plan\n")
    assert r.categories == ["plan_invalid_under_reference"]  # goal not reached


def test_plan_on_unfaithful_spec_replays_in_reference(benchmarks):
    """The classic drift: a dropped precondition lets the planner cheat; replay catches it."""
    d, p = _planbench(benchmarks, "blocksworld", 1)  # b on c, c on the table; goal (on c b)
    cheat = d.replace("(and (clear ?ob) (ontable ?ob) (handempty))", "(and (ontable ?ob) (handempty))")
    assert cheat != d
    r = check((d, p), (cheat, p), ["(pick-up c)", "(stack c b)"])
    assert r.categories == ["precondition_dropped", "plan_invalid_under_reference"]
    assert "(clear c)" in r.findings[1].detail


@pytest.mark.slow
def test_simulator_agrees_with_val(benchmarks):
    from omtr.solver import validate_plan

    rows = _gold(benchmarks, "blocksworld")[:5] + _gold(benchmarks, "logistics")[:5]
    for row in rows:
        d = (benchmarks / row["domain_pddl_path"]).read_text()
        p = (benchmarks / row["problem_pddl_path"]).read_text()
        for plan in (row["gold_plan"], row["gold_plan"][:-1], row["gold_plan"][1:]):
            ours = check((d, p), (d, p), plan).plan["valid"]
            val = validate_plan(d, p, plan).valid
            assert ours == val, (row["instance_id"], plan)
        assert check((d, p), (d, p), row["gold_plan"], validate_with_val=True).plan["by"] == "VAL"


# ----------------------------------------------------------------------------- speed and inputs


def test_repeated_checks_give_the_same_mapping(benchmarks):
    """Timings live in benchmarks/faithfulness_mutants.py; here: determinism."""
    d, p = _planbench(benchmarks, "blocksworld", 7)
    rd, rp, _ = rename_all_with_table(d, p, random.Random(3))
    reports = [check((d, p), (rd, rp)) for _ in range(5)]
    assert all(r.faithful for r in reports)
    assert all(r.mapping == reports[0].mapping for r in reports)


def test_largest_planbench_logistics_renamed_is_faithful(benchmarks):
    rows = _gold(benchmarks, "logistics")
    big = max(rows, key=lambda r: r["n_objects"])
    d = (benchmarks / big["domain_pddl_path"]).read_text()
    p = (benchmarks / big["problem_pddl_path"]).read_text()
    rd, rp, _ = rename_all_with_table(d, p, random.Random(4))
    assert check((d, p), (rd, rp)).faithful


def test_accepts_reference_objects():
    from omtr.tasks.records import ReferenceSpec, Task

    ref = ReferenceSpec(GRIPPER_DOMAIN, family_specs("gripper", 1, 0, source="planbench")[0][2])
    task = Task(id="t1", family="gripper", split="test", nl="move balls", reference=ref)
    for r in (ref, task, {"domain": ref.domain, "problem": ref.problem}, (ref.domain, ref.problem)):
        assert check(r, ref).faithful


def test_normal_form_drops_irrelevant_and_trivial(benchmarks):
    spec = normalize(GRIPPER_DOMAIN, family_specs("gripper", 1, 0, source="planbench")[0][2])
    assert {"room", "ball", "gripper"} <= spec.type_like
    act = spec.actions["pick"]
    assert ("carry", (0, 2)) in act.add and ("at", (0, 1)) in act.dele
    assert DriftCategory("goal_weakened") is DriftCategory.GOAL_WEAKENED


def test_fuzzed_specs_never_reach_the_internal_error_path(benchmarks):
    """Character-level damage to valid specs: always a report, never an internal exception."""
    from omtr.faithfulness.mutators import family_specs

    rng = random.Random(7)
    tokens = ["(", ")", " ", "?", "-", ":", "a", "\n", " (and ", " (not ", " (= ?x ?y)", " (either a b)",
              " (forall (?z) (p ?z))", " - object", " 7"]

    def damage(text):
        chars = list(text)
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(chars))
            op = rng.random()
            if op < 0.3:
                del chars[i]
            elif op < 0.6:
                chars.insert(i, rng.choice(tokens))
            else:
                j = rng.randrange(len(chars))
                chars[i], chars[j] = chars[j], chars[i]
        return "".join(chars)

    for family in ("blocksworld", "logistics", "gripper"):
        for _, d, p in family_specs(family, 2, seed=3, source="planbench"):
            for k in range(40):
                gd, gp = (damage(d), p) if k % 3 == 0 else (d, damage(p)) if k % 3 == 1 else (damage(d), damage(p))
                report = check((d, p), (gd, gp), ["(x y)"] if k % 5 == 0 else None)
                assert not any("checker could not process" in f.detail for f in report.findings), (gd, gp)


def test_arity_misuse_is_a_different_symbol(benchmarks):
    d, p = _planbench(benchmarks, "blocksworld", 1)
    report = check((d, p), (d, p.replace("(on b c)", "(on b)")))
    assert not report.faithful and report.first_category == "init_changed"
    assert "(on b c)" in report.findings[0].detail
    assert any("on/1" in n for n in report.notes)
    assert not any("not declared" in n for n in report.notes)


def test_names_break_ties_between_interchangeable_objects(benchmarks):
    d, p = _planbench(benchmarks, "blocksworld", 1)  # a and d are interchangeable (on the table, clear)
    report = check((d, p), (d, p.replace("(on c b)", "(on c b) (ontable a)")))
    assert report.categories == ["goal_strengthened"]
    assert report.mapping["objects"] == {"a": "a", "b": "b", "c": "c", "d": "d"}
    assert "(ontable a)" in report.findings[0].detail
