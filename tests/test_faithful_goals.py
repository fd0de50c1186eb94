"""Goals read by what they require (issue 14): implied and redundant atoms, symmetric goals,
goal edits blamed on the goal, and an undecided comparison that is never faithful."""

from __future__ import annotations

import random
import re

import pytest

from omtr.faithfulness import check, normalize
from omtr.faithfulness import goals as goals_mod
from omtr.faithfulness.goals import GoalSemantics, implied_literals
from omtr.faithfulness.mutators import GRIPPER_DOMAIN, drop_goal_atom, rename_all, reorder


def _bw_domain(benchmarks) -> str:
    return (benchmarks / "planbench" / "instances" / "blocksworld" / "generated_domain.pddl").read_text()


def _bw(init: str, goal: str, objects="a b c d") -> str:
    return f"(define (problem t) (:domain blocksworld-4ops) (:objects {objects}) (:init {init}) (:goal (and {goal})))"


BW_TABLE = "(handempty) (ontable a) (ontable b) (ontable c) (ontable d) (clear a) (clear b) (clear c) (clear d)"
TOWER = "(on a b) (on b c) (on c d) (ontable d)"


def _gripper(goal: str) -> str:
    return ("(define (problem g) (:domain gripper-strips) (:objects r0 r1 b0 b1 left right)\n"
            "(:init (room r0) (room r1) (ball b0) (ball b1) (gripper left) (gripper right) (free left) (free right)"
            " (at-robby r0) (at b0 r0) (at b1 r1))\n"
            f"(:goal (and {goal})))")


def test_full_tower_implies_clear_top_and_empty_hand(benchmarks):
    d = _bw_domain(benchmarks)
    ref = (d, _bw(BW_TABLE, TOWER))
    for extra in ("(clear a)", "(handempty)", "(clear a) (handempty)", "(not (holding d)) (not (clear b))"):
        report = check(ref, (d, _bw(BW_TABLE, TOWER + " " + extra)))
        assert report.faithful, (extra, report.findings)
        assert any("same reachable states" in n for n in report.notes)
    # (on-table d) under the full tower is redundant (acyclicity: exact reasoning on 4 blocks)
    report = check(ref, (d, _bw(BW_TABLE, "(on a b) (on b c) (on c d)")))
    assert report.faithful, report.findings
    # but a partial tower does not imply the empty hand, and dropping a real atom is weakening
    partial = (d, _bw(BW_TABLE, "(on a b)"))
    assert check(partial, (d, _bw(BW_TABLE, "(on a b) (handempty)"))).categories == ["goal_strengthened"]
    assert check(ref, (d, _bw(BW_TABLE, "(on a b) (on b c) (ontable d)"))).categories == ["goal_weakened"]


def test_all_balls_placed_implies_free_grippers_and_swapped_rooms_are_goal_drift():
    ref = (GRIPPER_DOMAIN, _gripper("(at b0 r1) (at b1 r0)"))
    implied = (GRIPPER_DOMAIN, _gripper("(at b0 r1) (at b1 r0) (free left) (free right)"))
    assert check(ref, implied).faithful
    assert check(implied, ref).faithful  # dropping the redundant atoms is not weakening
    swapped = (GRIPPER_DOMAIN, _gripper("(at b0 r0) (at b1 r1)"))
    assert ref[1].split("(:goal")[0] == swapped[1].split("(:goal")[0]  # init byte-identical
    for gen in (swapped, rename_all(*swapped, random.Random(3)), reorder(*rename_all(*swapped, random.Random(4)), random.Random(5))):
        report = check(ref, gen)
        assert report.categories == ["goal_changed"], report.findings
        assert "init_changed" not in report.categories


def test_symmetric_goals_are_equivalent_and_the_mapping_shows_the_symmetry(benchmarks):
    d = _bw_domain(benchmarks)
    init = "(handempty) (ontable a) (ontable b) (ontable c) (clear a) (clear b) (clear c)"
    ref = (d, _bw(init, "(on a b)", "a b c"))
    gen = (d, _bw(init, "(on c b) (not (clear b))", "a b c"))  # symmetric, and an implied atom
    report = check(ref, gen)
    assert report.faithful, report.findings
    assert report.mapping["objects"]["a"] == "c"
    assert check(ref, (d, _bw(init, "(on b a)", "a b c"))).faithful  # exchanging a and b
    # with b on c from the start, b and c are no longer interchangeable
    init2 = "(handempty) (ontable a) (on b c) (ontable c) (clear a) (clear b)"
    ref2 = (d, _bw(init2, "(on a b)", "a b c"))
    assert check(ref2, (d, _bw(init2, "(on a b) (not (clear b))", "a b c"))).faithful
    assert check(ref2, (d, _bw(init2, "(on a c)", "a b c"))).categories == ["goal_changed"]


def test_invariants_decide_large_logistics_and_witnesses_refute(benchmarks):
    base = benchmarks / "planbench" / "instances" / "logistics"
    d = (base / "generated_domain.pddl").read_text()
    p = (base / "generated_basic" / "instance-177.pddl").read_text()  # 24 objects: no enumeration
    spec = normalize(d, p)
    sem = GoalSemantics(spec, (d, p))
    assert sem.states() is None  # above the exact cut-off
    plus, minus = implied_literals(spec, (d, p))
    assert ("in", ("p0", "t0")) in minus and not plus
    gen = p.replace("(at p0 l1-1)", "(at p0 l1-1) (not (in p0 t0)) (not (at p0 l0-0))")
    report = check((d, p), (d.replace("(:requirements", "(:requirements :negative-preconditions"), gen))
    assert report.faithful, report.findings
    assert any("invariants" in n for n in report.notes)
    dropped = drop_goal_atom(d, p, random.Random(0))
    report = check((d, p), dropped)
    assert report.categories == ["goal_weakened"] and "witness" in report.findings[0].detail


def test_undecided_is_its_own_finding_and_never_faithful(benchmarks, monkeypatch):
    base = benchmarks / "planbench" / "instances" / "logistics"
    d = (base / "generated_domain.pddl").read_text()
    p = (base / "generated_basic" / "instance-177.pddl").read_text()
    monkeypatch.setattr(goals_mod, "WITNESS_EVALS", 0)
    monkeypatch.setattr(goals_mod, "_CACHE", {})
    # p0 starts at l0-1; its goal is l1-1; the init satisfies neither goal, and no search may run
    gen = re.sub(r"\(at p0 l1-1\)", "", p)
    report = check((d, p), (d, gen))
    assert not report.faithful
    assert report.categories == ["goal_undecided"], report.findings
    assert "(at p0 l1-1)" in report.findings[0].detail


def test_goal_reasoning_is_cached_per_reference(benchmarks):
    d = _bw_domain(benchmarks)
    ref = (d, _bw(BW_TABLE, TOWER))
    check(ref, (d, _bw(BW_TABLE, TOWER + " (clear a)")))
    sem = goals_mod.semantics_for(normalize(*ref), ref)
    assert sem._exact_tried or sem._groups is not None  # built by the first check, reused now


@pytest.mark.parametrize("goal,status", [("(at b0 r1) (at b1 r0)", "equivalent"),
                                         ("(at b0 r1)", "weakened"),
                                         ("(at b0 r1) (at b1 r0) (at-robby r1)", "strengthened")])
def test_exact_statuses(goal, status):
    text = _gripper("(at b0 r1) (at b1 r0) (free left)")
    spec = normalize(GRIPPER_DOMAIN, text)
    gen = normalize(GRIPPER_DOMAIN, _gripper(goal))
    v = GoalSemantics(spec, (GRIPPER_DOMAIN, text)).compare(spec.goal, gen.goal)
    assert v.status == status
