"""`omtr tasks ...` end to end, in process."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from omtr.cli import main
from omtr.tasks.records import load_tasks, load_training_tasks

PLANBENCH = (
    Path(os.environ["OMTR_BENCHMARKS"]) if os.environ.get("OMTR_BENCHMARKS")
    else Path(__file__).resolve().parents[2] / "shared" / "benchmarks"
) / "planbench"


def test_help_has_examples(capsys):
    for cmd in ("generate", "import-planbench", "stats", "transfer", "score"):
        with pytest.raises(SystemExit) as info:
            main(["tasks", cmd, "--help"])
        assert info.value.code == 0
        assert "examples:" in capsys.readouterr().out


def test_generate_mix_splits_the_tasks_evenly_over_every_family_and_interleaves_them(tmp_path):
    from omtr.tasks.generators import families, generate

    out = tmp_path / "mix.jsonl"
    assert main(["-q", "tasks", "generate", "--family", "mix", "--n", "10", "--seed", "4", "--no-verify",
                 "--split", "val", "--given-domain", "--out", str(out)]) == 0
    tasks = load_tasks(out)
    fams = sorted(families())
    assert len(tasks) == 10 and [t.family for t in tasks[:len(fams)]] == fams  # every family in the first turn
    counts = {f: sum(t.family == f for t in tasks) for f in fams}
    assert sorted(counts.values(), reverse=True) == [3, 3, 2, 2]  # 10 over 4: the first two take the remainder
    assert all(t.split == "val" for t in tasks)
    # each family's tasks are the ones it draws alone with that seed
    alone = generate("gripper", counts["gripper"], 4, split="val", verify=False)
    assert [t.id for t in tasks if t.family == "gripper"] == [t.id for t in alone]
    # two named families, and the errors
    two = tmp_path / "two.jsonl"
    assert main(["-q", "tasks", "generate", "--family", "gripper,blocksworld", "--n", "4", "--no-verify",
                 "--out", str(two)]) == 0
    assert [t.family for t in load_tasks(two)] == ["gripper", "blocksworld"] * 2
    assert main(["-q", "tasks", "generate", "--family", "mix", "--n", "4", "--no-verify", "--option", "rooms=3",
                 "--out", str(two)]) == 2
    assert main(["-q", "tasks", "generate", "--family", "gripper,sokoban", "--n", "4", "--no-verify",
                 "--out", str(two)]) == 2


def test_generate_stats_and_training_view(tmp_path, capsys):
    out = tmp_path / "g.jsonl"
    assert main(["-q", "tasks", "generate", "--family", "gripper", "--n", "30", "--seed", "3", "--no-verify",
                 "--option", "rooms=3", "--min-objects", "2", "--max-objects", "4", "--out", str(out)]) == 0
    tasks = load_tasks(out)
    assert len(tasks) == 30 and all(t.reference for t in tasks) and {t.meta["rooms"] for t in tasks} == {3}
    assert all("reference_plan" not in t.meta for t in load_training_tasks(out))
    assert main(["tasks", "stats", str(out), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["tasks"] == 30 and sum(stats["counts"]["gripper"].values()) == 30
    assert main(["tasks", "stats", str(out)]) == 0
    assert "plan length" in capsys.readouterr().out


def test_stats_plot(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "b.jsonl"
    main(["-q", "tasks", "generate", "--family", "blocksworld", "--n", "20", "--no-verify", "--out", str(out)])
    assert main(["-q", "tasks", "stats", str(out), "--plot", str(tmp_path / "s.png")]) == 0
    assert (tmp_path / "s.png").stat().st_size > 1000


def test_usage_errors_exit_2(tmp_path, capsys):
    out = str(tmp_path / "x.jsonl")
    assert main(["tasks", "generate", "--family", "sokoban", "--n", "1", "--out", out]) == 2
    assert "unknown task family" in capsys.readouterr().err
    assert main(["tasks", "generate", "--family", "gripper", "--n", "1", "--option", "rooms", "--out", out]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    assert main(["tasks", "import-planbench", str(tmp_path), "--out", out]) == 2
    assert "LLMs-Planning" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a"}\n')
    assert main(["tasks", "stats", str(bad)]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err


@pytest.mark.skipif(not (PLANBENCH / "configs").is_dir(), reason="PlanBench data not found")
def test_import_planbench(tmp_path):
    out = tmp_path / "pb.jsonl"
    assert main(["-q", "tasks", "import-planbench", str(PLANBENCH), "--family", "blocksworld_3", "--family", "depots", "--out", str(out)]) == 0
    tasks = load_tasks(out)
    assert len(tasks) == 101 + 501 and {t.family for t in tasks} == {"blocksworld", "depots"}


def test_transfer_generate_import_and_score(tmp_path, capsys):
    raw, out = tmp_path / "cal.json", tmp_path / "cal.jsonl"
    assert main(["-q", "tasks", "transfer", "--benchmark", "calendar", "--n", "12", "--seed", "1",
                 "--raw-out", str(raw), "--out", str(out)]) == 0
    again = tmp_path / "again.jsonl"
    assert main(["-q", "tasks", "transfer", "--benchmark", "calendar", "--from", str(raw), "--out", str(again)]) == 0
    tasks = load_tasks(again)
    def strip(t):
        return (t.id, t.nl, {k: v for k, v in t.meta.items() if k != "source"})

    assert [strip(t) for t in tasks] == [strip(t) for t in load_tasks(out)]
    answers = tmp_path / "answers.jsonl"
    with open(answers, "w") as fh:
        for i, t in enumerate(tasks):
            fh.write(json.dumps({"id": t.id, "answer": t.meta["golden_plan"] if i % 2 == 0 else "Monday, 9:00 - 9:01"}) + "\n")
    capsys.readouterr()
    assert main(["tasks", "score", "--tasks", str(again), "--answers", str(answers), "--out", str(tmp_path / "s.jsonl")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["tasks"] == 12 and summary["correct"] == 6
