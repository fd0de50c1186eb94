"""`omtr solve --batch --shard I/N` and `--shard-count N` (index from JOB_COMPLETION_INDEX): the
re-verification Indexed Job's pods split one evaluation set so that every line is verified once."""

from __future__ import annotations

import json

import pytest

from omtr.cli import main
from omtr.solver.examples import BW_DOMAIN, BW_PROBLEM


def _batch(tmp_path):
    lines = []
    for i in range(7):
        if i == 3:
            lines.append("this line is not JSON")
        else:
            # Only spec 0 plans for real; the rest have a field of the wrong type (an input verdict, no planner).
            domain = BW_DOMAIN if i == 0 else 1
            lines.append(json.dumps({"id": f"s{i}", "domain": domain, "problem": BW_PROBLEM}))
        if i == 4:
            lines.append("")  # blank lines take no position
    path = tmp_path / "specs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _ids(path):
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def test_shards_cover_every_line_once_in_order(tmp_path):
    specs = _batch(tmp_path)
    seen = []
    for index in range(3):
        out = tmp_path / f"v{index}.jsonl"
        assert main(["-q", "solve", "--batch", str(specs), "--out", str(out), "--shard", f"{index}/3"]) == 0
        seen.append(_ids(out))
    # Non-blank lines at positions 0..6; position 3 is the malformed line (reported by its line number, 4).
    assert sorted(seen[0]) == ["line-4", "s0", "s6"] and sorted(seen[1]) == ["s1", "s4"] and sorted(seen[2]) == ["s2", "s5"]
    every = sorted(i for ids in seen for i in ids)
    whole = tmp_path / "all.jsonl"
    assert main(["-q", "solve", "--batch", str(specs), "--out", str(whole)]) == 0
    assert every == sorted(_ids(whole)) and len(every) == 7
    s0 = next(json.loads(line) for line in (tmp_path / "v0.jsonl").read_text().splitlines() if '"s0"' in line)
    assert s0["success"] is True


def test_shard_count_takes_the_index_from_the_indexed_job(tmp_path, monkeypatch):
    specs = _batch(tmp_path)
    out = tmp_path / "v.jsonl"
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "2")
    assert main(["-q", "solve", "--batch", str(specs), "--out", str(out), "--shard-count", "3"]) == 0
    assert sorted(_ids(out)) == ["s2", "s5"]
    # A restarted pod continues its shard.
    assert main(["-q", "solve", "--batch", str(specs), "--out", str(out), "--shard-count", "3", "--resume"]) == 0
    assert sorted(_ids(out)) == ["s2", "s5"]


@pytest.mark.parametrize("argv, env, message", [
    (["--shard", "3/3"], None, "index 0..2"),
    (["--shard", "a/b"], None, "INDEX/COUNT"),
    (["--shard", "1"], None, "INDEX/COUNT"),
    (["--shard", "0/2", "--shard-count", "3"], None, "disagree"),
    (["--shard-count", "2"], None, "JOB_COMPLETION_INDEX"),
    (["--shard-count", "2"], "x", "not a number"),
])
def test_bad_shards_are_usage_errors(tmp_path, monkeypatch, capsys, argv, env, message):
    specs = _batch(tmp_path)
    monkeypatch.delenv("JOB_COMPLETION_INDEX", raising=False)
    if env is not None:
        monkeypatch.setenv("JOB_COMPLETION_INDEX", env)
    assert main(["solve", "--batch", str(specs), "--out", str(tmp_path / "v.jsonl"), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "v.jsonl").exists()


def test_help_shows_the_shard_examples(capsys):
    with pytest.raises(SystemExit):
        main(["solve", "--help"])
    text = capsys.readouterr().out
    assert "--shard 0/4" in text and "JOB_COMPLETION_INDEX" in text and "--resume   # continue a stopped batch" in text
