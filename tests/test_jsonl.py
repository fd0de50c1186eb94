"""The one JSON Lines reader: line-numbered, one-line errors (used by file:, scripted: and faithful)."""

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
