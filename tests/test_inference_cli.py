"""``omtr infer`` with scripted answers (``--model scripted:FILE``) and the real planner."""

import json

import pytest

from omtr.cli import main
from omtr.solver.examples import BW_DOMAIN, BW_PROBLEM, MALFORMED

GOOD = f"{BW_DOMAIN}\n{BW_PROBLEM}"
SCHEMA = next(f"{e.domain}\n{e.problem}" for e in MALFORMED if e.name == "schema-undeclared-predicate")


@pytest.fixture
def files(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        json.dumps({"id": "k1", "nl": "Stack a on b and b on c."}) + "\n"
        + json.dumps({"id": "k2", "nl": "Put the blocks in one tower.", "family": "blocksworld",
                      "reference": {"domain": "(define (domain hidden-ref))", "problem": "(define (problem hidden-ref))"}})
        + "\n\n"
        + json.dumps({"id": "k3", "nl": "Something nobody can write."}) + "\n"
    )
    answers = tmp_path / "answers.jsonl"
    answers.write_text(
        json.dumps({"id": "k1", "texts": [GOOD], "score": 0.75}) + "\n"
        + json.dumps({"id": "k2", "texts": ["```pddl\n" + SCHEMA + "\n```", GOOD]}) + "\n"
        + json.dumps({"id": "k3", "texts": ["I cannot do that."]}) + "\n"
    )
    return tasks, answers, tmp_path / "traces.jsonl"


def _infer(tasks, answers, out, *extra):
    return main(["-q", "infer", "--model", f"scripted:{answers}", "--tasks", str(tasks), "--out", str(out),
                 "--workers", "1", "--time-limit", "20", *extra])


def test_infer_writes_traces_and_a_summary(files, capsys):
    tasks, answers, out = files
    assert _infer(tasks, answers, out, "--budget", "3") == 0
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {"k1", "k2", "k3"}
    assert rows["k1"]["success"] and rows["k1"]["planner_calls"] == 1 and rows["k1"]["judge_score"] == 0.75
    assert rows["k2"]["success"] and rows["k2"]["planner_calls"] == 2 and rows["k2"]["repairs"] == 1
    assert rows["k2"]["steps"][0]["verdict"]["category"] == "predicate_schema"
    assert not rows["k3"]["success"] and rows["k3"]["planner_calls"] == 3
    assert rows["k3"]["final_category"] == "syntax" and rows["k3"]["steps"][0]["verdict"]["stage"] == "extract"
    assert "hidden-ref" not in out.read_text()
    text = capsys.readouterr().out
    assert "tasks: 3  solved: 2 (66.7%)  by the Actor: 1  after repair: 1" in text
    assert "planner calls: 6  per task: 2.0" in text
    assert "Actor's specs: predicate_schema 1, success 1, syntax 1" in text
    assert "final specs: success 2, syntax 1" in text


def test_resume_skips_finished_tasks_and_refuses_to_clobber(files, capsys):
    tasks, answers, out = files
    out.write_text(json.dumps({"id": "k1", "success": True}) + "\n" + '{"id": "k2", "succ')  # killed mid-line
    assert _infer(tasks, answers, out) == 2
    assert "exists; pass --resume" in capsys.readouterr().err
    assert _infer(tasks, answers, out, "--resume") == 0
    ids = []
    for line in out.read_text().splitlines():
        try:
            ids.append(json.loads(line)["id"])
        except ValueError:
            pass
    assert sorted(ids) == ["k1", "k2", "k3"]
    assert "skipped (already in" in capsys.readouterr().out
    assert _infer(tasks, answers, out, "--overwrite", "--limit", "1") == 0
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["k1"]


@pytest.mark.parametrize("case, message", [
    ("missing-tasks", "does not exist"),
    ("bad-jsonl", "not valid JSON"),
    ("budget", "--budget must be at least 1"),
    ("missing-answers", "does not exist"),
    ("bad-answers", "expected {\"id\""),
])
def test_bad_input_is_one_clear_line(files, tmp_path, capsys, case, message):
    tasks, answers, out = files
    extra = []
    if case == "missing-tasks":
        tasks = tmp_path / "nope.jsonl"
    elif case == "bad-jsonl":
        tasks.write_text('{"id": "x", "nl": "ok"}\n{not json}\n')
    elif case == "budget":
        extra = ["--budget", "0"]
    elif case == "missing-answers":
        answers = tmp_path / "none.jsonl"
    elif case == "bad-answers":
        answers.write_text('{"id": "k1", "texts": "not a list"}\n')
    assert _infer(tasks, answers, out, *extra) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("omtr infer: error:") and message in err, err


def test_help_has_examples(capsys):
    with pytest.raises(SystemExit):
        main(["infer", "--help"])
    text = capsys.readouterr().out
    assert "examples:" in text and "--model scripted:" in text


TRIVIAL = BW_DOMAIN + "\n" + BW_PROBLEM.replace("(:goal (and (on a b) (on b c)))", "(:goal (and (on c a)))")


def test_every_trace_says_its_support_and_abstain_answers_no_spec(tmp_path, capsys):
    """A solved spec of the stated blocks is supported; a solved spec for English that names none of
    its objects is unsupported; a spec whose goal already holds is trivial (the planner's empty plan).
    The summary counts supported apart from solved; --abstain drops the spec of the last two."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in (
        {"id": "s1", "nl": "Blocks a, b and c: c is on a. Stack a on b and b on c."},
        {"id": "s2", "nl": "Put the crates in one pile."},
        {"id": "s3", "nl": "Blocks a, b and c: c is on a. Leave c on a."})))
    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps({"id": i, "texts": [t]}) + "\n"
                               for i, t in (("s1", GOOD), ("s2", GOOD), ("s3", TRIVIAL))))
    out = tmp_path / "traces.jsonl"
    assert _infer(tasks, answers, out, "--budget", "1") == 0
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert all(r["success"] for r in rows.values())
    assert {i: r["support"] for i, r in rows.items()} == {"s1": "supported", "s2": "unsupported", "s3": "trivial"}
    assert "never mentions" in rows["s2"]["support_reasons"][0] and "empty" in rows["s3"]["support_reasons"][0]
    assert {r["domain_source"] for r in rows.values()} == {"written"}
    text = capsys.readouterr().out
    assert "solved: 3 (100.0%)" in text and "supported: 1 of 3 solved  (trivial 1, unsupported 1)" in text

    out2 = tmp_path / "abstain.jsonl"
    assert _infer(tasks, answers, out2, "--budget", "1", "--abstain") == 0
    rows = {r["id"]: r for r in map(json.loads, out2.read_text().splitlines())}
    assert rows["s1"]["domain"] and not rows["s1"].get("abstained")
    for i in ("s2", "s3"):
        assert rows[i]["abstained"] and rows[i]["domain"] is None and rows[i]["problem"] is None and rows[i]["plan"] == []
        assert rows[i]["steps"][0]["domain"]  # what was tried stays in the steps
    assert "abstained: 2" in capsys.readouterr().out
