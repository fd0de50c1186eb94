"""The domain library (issue 43, part 2): shipped domains, a user's folder, the lexical match with its
ambiguity rule, and ``domain_source`` through ``omtr infer`` with the real planner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omtr.cli import main
from omtr.tasks import load_tasks
from omtr.tasks.library import Library, LibraryDomain, attach, load_folder, shipped_library
from omtr.tasks.records import TaskFormatError, given_domain_error
from omtr.tasks.training import TrainingTask

DATA = Path(__file__).resolve().parent / "data" / "handwritten_tasks.jsonl"
BW_PROBLEM = ("(define (problem p) (:domain blocksworld-4ops) (:objects a b) (:init (handempty) (ontable a) "
              "(ontable b) (clear a) (clear b)) (:goal (and (on a b))))")


def test_the_shipped_domains_lint_and_have_descriptions():
    lib = shipped_library()
    assert set(lib.domains) == {"blocksworld", "mystery_blocksworld", "logistics", "depots", "gripper"}
    for d in lib.domains.values():
        assert given_domain_error(d.domain) is None and len(d.description.split()) >= 8


def test_every_handwritten_task_is_matched_to_its_family():
    """The hand-written plain-English tasks (tests/data, each with its reference spec in a library
    domain) are matched to their own family, none to another."""
    tasks = load_tasks(DATA)
    assert len(tasks) >= 20 and {t.meta.get("source") for t in tasks} == {"handwritten"}
    lib = shipped_library()
    got = {t.id: lib.match(t.nl).source for t in tasks}
    assert got == {t.id: f"library:{t.family}" for t in tasks}


def test_english_that_fits_nothing_or_two_domains_equally_runs_in_full_mode_and_says_why():
    lib = shipped_library()
    m = lib.match("Water the three plants on the balcony every morning.")
    assert m.domain is None and m.source == "written" and "no library domain fits" in m.reason
    m = lib.match("Lift the ball.")
    assert m.domain is None and m.source == "written" and m.reason.startswith("ambiguous")
    assert "gripper" in m.reason and "depots" in m.reason
    one = lib.match("Use the hoist to lift the crate onto the pallet.")
    assert one.source == "library:depots"


def test_attach_keeps_a_given_domain_and_turns_a_match_into_the_domain_given_mode():
    lib = shipped_library()
    tasks = [TrainingTask("g", None, None, "Put a on b.", domain=lib.domains["gripper"].domain),
             TrainingTask("m", None, None, "Two blocks a and b are on the table. Stack a on b."),
             TrainingTask("w", None, None, "Water the plants.")]
    g, m, w = attach(tasks, lib)
    assert g.meta["domain_source"] == "given" and g.domain == tasks[0].domain
    assert m.meta["domain_source"] == "library:blocksworld" and m.domain == lib.domains["blocksworld"].domain
    assert w.meta["domain_source"] == "written" and w.domain is None
    off = attach(tasks[1:], None)
    assert [t.meta["domain_source"] for t in off] == ["written", "written"] and off[0].domain is None


def _folder(tmp_path, describe=True, domain=None):
    d = tmp_path / "domains"
    d.mkdir(parents=True)
    (d / "kitchen.pddl").write_text(domain or """(define (domain kitchen)
  (:predicates (raw ?f) (cooked ?f) (on-stove ?f))
  (:action put-on-stove :parameters (?f) :precondition (raw ?f) :effect (on-stove ?f))
  (:action cook :parameters (?f) :precondition (on-stove ?f) :effect (and (cooked ?f) (not (raw ?f)))))""")
    if describe:
        (d / "kitchen.txt").write_text("Food in a kitchen: raw food is put on the stove and cooked.")
    return d


def test_a_users_folder_adds_domains_and_bad_folders_are_named(tmp_path):
    lib = shipped_library().with_domains(load_folder(_folder(tmp_path)))
    m = lib.match("Cook the eggs and the rice on the stove.")
    assert m.source == "library:kitchen"
    with pytest.raises(TaskFormatError, match="no description"):
        load_folder(_folder(tmp_path / "x", describe=False))
    with pytest.raises(TaskFormatError, match="does not lint"):
        load_folder(_folder(tmp_path / "y", domain="(define (domain broken) (:action a :parameters (?x) :effect (nope ?x)))"))


def test_a_library_needs_a_sane_margin():
    with pytest.raises(ValueError, match="margin"):
        Library([], margin=1.5)
    assert Library([LibraryDomain("x", "(define (domain x) (:predicates (p)))", "p things")]).match("p").source == "written"


def _infer(tmp_path, answers, *extra):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "m", "nl": "There are two blocks, a and b, on the table. Put a on b."}) + "\n"
                     + json.dumps({"id": "k", "nl": "Cook the eggs on the stove."}) + "\n")
    ans = tmp_path / "answers.jsonl"
    ans.write_text("".join(json.dumps({"id": i, "texts": [t]}) + "\n" for i, t in answers.items()))
    out = tmp_path / "traces.jsonl"
    rc = main(["-q", "infer", "--model", f"scripted:{ans}", "--tasks", str(tasks), "--out", str(out), "--budget", "1",
               "--workers", "1", "--time-limit", "20", "--overwrite", *extra])
    return rc, {r["id"]: r for r in map(json.loads, out.read_text().splitlines())} if out.exists() else {}


def test_infer_runs_a_matched_task_domain_given_and_says_so(tmp_path, capsys):
    kitchen = "(define (problem k) (:domain kitchen) (:objects eggs) (:init (raw eggs)) (:goal (and (cooked eggs))))"
    rc, rows = _infer(tmp_path, {"m": BW_PROBLEM, "k": kitchen}, "--library", "on", "--domains", str(_folder(tmp_path)))
    assert rc == 0
    assert rows["m"]["domain_source"] == "library:blocksworld" and rows["m"]["mode"] == "domain-given"
    assert rows["m"]["success"] and rows["m"]["support"] == "supported"
    assert rows["m"]["plan"] == ["(pick-up a)", "(stack a b)"]
    assert rows["k"]["domain_source"] == "library:kitchen" and rows["k"]["support"] == "supported"
    assert "domain: library 2" in capsys.readouterr().out
    # off (and auto with a replay): the model's answer is read as a full spec, the domain is written
    rc, rows = _infer(tmp_path, {"m": BW_PROBLEM, "k": kitchen}, "--library", "off")
    assert rc == 0 and rows["m"]["domain_source"] == "written" and not rows["m"]["success"]
    assert main(["-q", "infer", "--model", "scripted:x.jsonl", "--tasks", str(tmp_path / "tasks.jsonl"), "--out",
                 str(tmp_path / "o.jsonl"), "--library", "off", "--domains", str(tmp_path)]) == 2
