"""Scoped decoding never forbids the task: conformance over PlanBench's real text and every generator.

For a sample of every PlanBench configuration shipped in omtr and of every generator family, in
the domain-given and the full mode, the task's reference spec with its objects spelled as the
English spells them must be admitted by the decoding constraint the small model runs (the grammar
under its bounds, the scope rules and the statement's rules). ``benchmarks/scope_conformance.py``
runs every task. The checks below also prove that the check can refuse (so an admission means
something), that the reading of real statements is right, and the ``omtr model scope-check``
command with its bad input."""

import json
import random
import re
import subprocess
import sys

import pytest

pytest.importorskip("xgrammar")

from omtr.config import MODEL_PROFILES  # noqa: E402
from omtr.evaluation.spelling import english_names, spelled_problem  # noqa: E402
from omtr.model.grammar import statement_limits  # noqa: E402
from omtr.model.limits import GrammarLimits  # noqa: E402
from omtr.model.scope_check import check_spec  # noqa: E402
from omtr.pddl.model import parse_problem  # noqa: E402
from omtr.statement import RULE_FACTS, RULE_OBJECTS, RULE_PREDICATES, read_statement, statement_objects  # noqa: E402

SMALL = MODEL_PROFILES["small"]
LIMITS = GrammarLimits(**SMALL.grammar_limits)


@pytest.fixture(scope="module")
def planbench():
    from omtr.tasks.planbench import CONFIGS, import_config
    from omtr.tasks.planbench_data import shipped_root

    root = shipped_root()
    return {c: import_config(root, c) for c in CONFIGS}


@pytest.fixture(scope="module")
def generated():
    from omtr.tasks.generators import generate

    return {f: generate(f, 6, 777, min_objects=2, max_objects=5, verify=False)
            for f in ("blocksworld", "mystery_blocksworld", "gripper", "logistics")}


def _check(task, problem, mode="given", **kw):
    kw.setdefault("limits", LIMITS)
    if mode == "given":
        return check_spec(task.nl, problem, given=task.reference.domain, **kw)
    return check_spec(task.nl, problem, domain=task.reference.domain, **kw)


def _sample(tasks, k, seed=11):
    rng = random.Random(seed)
    picked = rng.sample(tasks, min(k, len(tasks)))
    # the largest task of the config too (PlanBench's Logistics: up to 24 objects, 48 initial atoms)
    biggest = max(tasks, key=lambda t: len(t.reference.problem))
    return picked + ([biggest] if biggest not in picked else [])


# ------------------------------------------------------------------ conformance


@pytest.mark.parametrize("mode", ["given", "full"])
def test_every_planbench_configuration_admits_its_reference(planbench, mode):
    refused = []
    for config, tasks in planbench.items():
        for t in _sample(tasks, 6):
            r = _check(t, spelled_problem(t), mode)
            if not r.admitted:
                refused.append((config, t.id, r.rule, r.part, r.at))
            assert r.rules == "scoped+objects+facts+predicates", (t.id, r.rules)  # PlanBench's layout: every rule applies
    assert not refused, refused


@pytest.mark.parametrize("mode", ["given", "full"])
def test_every_generator_family_admits_its_reference(generated, mode):
    for fam, tasks in generated.items():
        for t in tasks:
            r = _check(t, spelled_problem(t), mode)
            assert r.admitted, (fam, t.id, r)


def test_the_largest_logistics_task_needs_bounds_sized_by_its_statement(planbench):
    t = max(planbench["logistics"], key=lambda t: len(parse_problem(t.reference.problem).init))
    prob = parse_problem(t.reference.problem)
    assert len(prob.objects) > LIMITS.objects and len(prob.init) > LIMITS.init  # the profile's bounds alone refuse it
    got = statement_limits(LIMITS, statement_objects(t.nl))
    assert got.objects >= len(prob.objects) and got.init >= len(prob.init)
    assert _check(t, spelled_problem(t)).admitted
    # the same problem over a statement that names nothing is judged under the profile's bounds
    bare = t.nl[:t.nl.rfind("[STATEMENT]")] + "[STATEMENT]\nAs initial conditions I have that, the hand is empty."
    r = check_spec(bare, spelled_problem(t), given=t.reference.domain, limits=LIMITS)
    assert not r.admitted and r.rule == "grammar_limits"


# ------------------------------------------------------------------ the check can refuse


def test_the_check_names_the_rule_that_refuses_and_where(planbench):
    t = planbench["mystery_blocksworld"][4]
    ok = spelled_problem(t)
    assert _check(t, ok).admitted
    # an atom whose arguments are the clause's names in the other order
    m = re.search(r"\(craves (\w+) (\w+)\)", ok)
    swapped = ok[:m.start()] + f"(craves {m.group(2)} {m.group(1)})" + ok[m.end():]
    r = _check(t, swapped)
    assert (r.admitted, r.rule, r.part) == (False, "statement_facts", "problem")
    assert m.start() <= r.at <= m.end()
    # a statement's name missing from :objects
    first = read_statement(t.nl).names[0]
    renamed = re.sub(rf"(?<=[ (]){first}(?=[ )])", "zz", ok)  # the object spelled otherwise
    r = _check(t, renamed)
    assert (r.admitted, r.rule) == (False, "statement_objects"), r
    assert renamed[r.at:].startswith("zz")
    # an undeclared predicate, then broken syntax
    r = _check(t, ok.replace("(:init", "(:init (shiny a)", 1))
    assert (r.admitted, r.rule) == (False, "scope")
    assert ok[:r.at].endswith("(:init (") or ok.replace("(:init", "(:init (shiny a)", 1)[r.at:].startswith("shiny")
    r = _check(t, ok.replace("(:init", "(:init ((", 1))
    assert (r.admitted, r.rule) == (False, "grammar")
    # the problem's domain name must be the given domain's
    r = _check(t, re.sub(r"\(:domain [^)]+\)", "(:domain other)", ok))
    assert (r.admitted, r.rule) == (False, "domain_name")


def test_white_space_comments_case_and_object_order_do_not_matter(planbench):
    t = planbench["logistics"][3]
    ok = spelled_problem(t)
    objs = re.search(r"\(:objects([^)]*)\)", ok, re.S)
    names = objs.group(1).split()
    shuffled = "(:objects " + " ".join(reversed(names)) + ")"
    messy = ("; a comment\n" + ok[:objs.start()] + shuffled + ok[objs.end():]).upper().replace(" ", "  \t")
    assert _check(t, messy).admitted


def test_the_rules_stand_aside_where_the_reading_is_not_sure(planbench):
    t = planbench["blocksworld"][0]
    free = t.nl[:t.nl.rfind("[STATEMENT]")] + "Three blocks are on the table; stack them."
    assert read_statement(free).rules == ()
    r = check_spec(free, spelled_problem(t), given=t.reference.domain, limits=LIMITS)
    assert r.admitted and r.rules == "scoped"  # the grammar and the plain scope rules alone
    head = t.nl[:t.nl.rfind("[STATEMENT]")] + "[STATEMENT]\n"
    # another layout: words that are not the description's could be anything ("stays"): no rule
    other = read_statement(head + "Stack the red block on the blue block; the yellow block stays.")
    assert other.layout == "none" and other.rules == ()
    # identifiers are sure to be names: the names rule alone
    ids = head + "Put block_1 onto block_2, then block_3 stays where it is."
    reading = read_statement(ids)
    assert reading.layout == "statement" and reading.rules == (RULE_OBJECTS,)
    assert reading.names == ("block_1", "block_2", "block_3")
    assert statement_objects(ids).facts is None


# ------------------------------------------------------------------ reading real statements


def test_mystery_names_are_its_one_letter_objects(planbench):
    for t in planbench["mystery_blocksworld"][:40]:
        r = read_statement(t.nl)
        assert r.layout == "planbench" and r.rules == (RULE_OBJECTS, RULE_FACTS, RULE_PREDICATES)
        assert set(r.names) == set(english_names(t).values()), t.id
        init = parse_problem(t.reference.problem).init
        # every atom with arguments is one clause of the statement, in the same order
        atoms = sorted(tuple(str(x) for x in a[1:]) for a in init if len(a) > 1)
        assert sorted(r.facts[0]) == atoms, t.id
        assert r.nameless[0] == sum(1 for a in init if len(a) == 1)  # "harmony"


def test_logistics_names_include_those_its_description_uses_in_examples(planbench):
    t = planbench["logistics"][0]
    described = t.nl[:t.nl.rfind("[STATEMENT]")]
    assert "truck_1" in described and "location_1_1" in described
    r = read_statement(t.nl)
    assert set(r.names) == set(english_names(t).values())
    # the facts are the stated atoms (at, in-city, airport): the type predicates PlanBench never states are not
    prob = parse_problem(t.reference.problem)
    stated = [a for a in prob.init if str(a[0]) in ("at", "in", "in-city", "airport")]
    assert len(r.facts[0]) == len(stated)


@pytest.mark.parametrize("config", ["blocksworld", "depots"])
def test_other_families_read_their_names(planbench, config):
    for t in planbench[config][:30]:
        r = read_statement(t.nl)
        assert set(r.names) == set(english_names(t).values()), t.id


def test_a_text_without_a_statement_is_not_an_error():
    # free English is read by the plain reader (issue 43): its names, no goal it is not sure of
    r = read_statement("Put the red block on the blue block.")
    assert r.layout == "plain" and set(r.names) == {"red", "blue"} and r.why
    r = read_statement("Put the block on the table.")
    assert r.layout == "none" and r.rules == () and r.why
    assert read_statement("") .rules == ()
    assert statement_objects("no statement here") is None


# ------------------------------------------------------------------ the command


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "omtr", "model", "scope-check", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_scope_check_command_writes_a_verdict_per_spec_and_refuses_bad_rows(tmp_path, planbench):
    tasks = [planbench["mystery_blocksworld"][1], planbench["logistics"][1]]
    with (tmp_path / "tasks.jsonl").open("w") as fh:
        for t in tasks:
            fh.write(json.dumps({**t.to_json(), "domain": t.reference.domain}) + "\n")
        fh.write(json.dumps({"id": "plain", "family": None, "split": None, "nl": "Stack the blocks."}) + "\n")
    good = spelled_problem(tasks[0])
    swapped = re.sub(r"\(craves (\w+) (\w+)\)", r"(craves \2 \1)", good, count=1)
    specs = [{"id": tasks[0].id, "problem": good}, {"id": tasks[1].id, "problem": spelled_problem(tasks[1])},
             {"id": tasks[0].id, "problem": swapped}]
    (tmp_path / "specs.jsonl").write_text("".join(json.dumps(s) + "\n" for s in specs))
    p = _cli("--tasks", "tasks.jsonl", "--specs", "specs.jsonl", "--out", "out.jsonl", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rows = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [(r["id"], r["admitted"], r["rule"]) for r in rows] == [
        (tasks[0].id, True, None), (tasks[1].id, True, None), (tasks[0].id, False, "statement_facts")]
    assert isinstance(rows[2]["at"], int) and rows[0]["rules"] == "scoped+objects+facts+predicates"
    # the micro profile's settings (no tighter bounds) admit them too
    p = _cli("--tasks", "tasks.jsonl", "--specs", "specs.jsonl", "--out", "m.jsonl", "--model", "micro", cwd=tmp_path)
    assert p.returncode == 0 and len((tmp_path / "m.jsonl").read_text().splitlines()) == 3
    # a row without a task, a task without a statement: one line naming the row and the file
    (tmp_path / "bad.jsonl").write_text(json.dumps({"id": "nope", "problem": good}) + "\n")
    p = _cli("--tasks", "tasks.jsonl", "--specs", "bad.jsonl", "--out", "x.jsonl", cwd=tmp_path)
    assert p.returncode != 0 and "bad.jsonl:1" in p.stderr and "'nope'" in p.stderr
    assert not (tmp_path / "x.jsonl").exists()
    (tmp_path / "bad.jsonl").write_text(json.dumps({"id": "plain", "problem": good}) + "\n")
    p = _cli("--tasks", "tasks.jsonl", "--specs", "bad.jsonl", "--out", "x.jsonl", cwd=tmp_path)
    assert p.returncode != 0 and "bad.jsonl:1" in p.stderr and "[STATEMENT]" in p.stderr
    p = _cli("--tasks", "tasks.jsonl", "--specs", "specs.jsonl", "--out", "x.jsonl", "--model", "nowhere", cwd=tmp_path)
    assert p.returncode != 0 and "--model nowhere" in p.stderr
