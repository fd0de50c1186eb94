"""The one JSON Lines reader: line-numbered, one-line errors (used by file:, scripted:, faithful and PlanBench's plan files)."""

from __future__ import annotations

import pytest

from omtr.jsonl import JsonlError, read_jsonl


def test_reads_objects_with_line_numbers_and_skips_blank_lines(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('{"id": 1}\n\n  \n{"id": 2}\n')
    assert list(read_jsonl(p)) == [(1, {"id": 1}), (4, {"id": 2})]


@pytest.mark.parametrize("text, message", [
    ('{"id": 1}\n{"id": x}\n', r"a\.jsonl:2: not valid JSON \(Expecting value at column 8\)"),
    ('{"id": 1}\n[1, 2]\n', r"a\.jsonl:2: expected a JSON object, got list"),
])
def test_errors_name_the_file_and_line(tmp_path, text, message):
    p = tmp_path / "a.jsonl"
    p.write_text(text)
    with pytest.raises(JsonlError, match=message):
        list(read_jsonl(p))


def test_missing_file_and_bad_encoding(tmp_path):
    with pytest.raises(JsonlError, match="no such attempts file"):
        list(read_jsonl(tmp_path / "nope.jsonl", what="attempts file"))
    p = tmp_path / "b.jsonl"
    p.write_bytes(b'{"id": 1}\n{"id": "\xff"}\n')
    with pytest.raises(JsonlError, match=r"b\.jsonl:2: not UTF-8 text"):
        list(read_jsonl(p))


def test_planbench_plan_files_go_through_the_reader(tmp_path):
    """PlanBench's plan files (``plan_generation/<config>.jsonl``): an error names the file and line."""
    import re

    from omtr.tasks.planbench import PlanBenchError, _gold_plans

    (tmp_path / "plan_generation").mkdir()
    f = tmp_path / "plan_generation" / "blocksworld.jsonl"
    f.write_text('{"instance_id": 2, "gold_plan": ["(stack a b)"]}\n\n{"instance_id": 3, "gold_plan": [}\n')
    with pytest.raises(PlanBenchError, match=rf"{re.escape(str(f))}:3: not valid JSON"):
        _gold_plans(tmp_path, "blocksworld")
    f.write_text('{"instance_id": 2, "gold_plan": ["(stack a b)"]}\n{"id": 3}\n')
    with pytest.raises(PlanBenchError, match=rf"{re.escape(str(f))}:2: expected"):
        _gold_plans(tmp_path, "blocksworld")
    f.write_text('{"instance_id": 2, "gold_plan": ["(stack a b)"]}\n')
    assert _gold_plans(tmp_path, "blocksworld") == {2: ["(stack a b)"]}
