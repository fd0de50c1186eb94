"""``omtr evaluate`` and ``omtr evaluate compare`` from the command line (oracle and mutants: no model)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from omtr.cli import main
from omtr.tasks.generators import generate
from omtr.tasks.records import write_tasks


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("tasks") / "tasks.jsonl"
    write_tasks(p, generate("blocksworld", 3, 5, verify=False) + generate("gripper", 2, 5, verify=False))
    return p


def test_help_is_fast_and_has_examples():
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "omtr", "evaluate", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "omtr evaluate compare" in r.stdout and "--policy oracle" in r.stdout
    assert time.perf_counter() - t < 10
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "omtr", "evaluate", "--help"], capture_output=True,
                       text=True, timeout=60)
    assert "torch" not in r.stderr and "matplotlib" not in r.stderr and "omtr.evaluation" not in r.stderr


def test_oracle_writes_metrics_traces_figures_and_report(task_file, tmp_path, capsys):
    out = tmp_path / "oracle"
    assert main(["-q", "evaluate", "--policy", "oracle", "--tasks", str(task_file), "--workers", "1",
                 "--bootstrap", "100", "--no-episode-log", "--out", str(out)]) == 0  # the log: tests/test_eval_slow.py
    m = json.loads((out / "metrics.json").read_text())
    assert list(m)[:4] == ["success", "faithful", "drift", "calls"]
    assert (m["success"], m["faithful"], m["drift"], m["calls"]) == (1.0, 1.0, 0.0, 1.0)
    assert set(m["families"]) == {"blocksworld", "gripper"}
    assert {"loop_s", "total_s", "solver_translate_s"} <= set(m["timing"])
    for name in ("traces.jsonl", "report.html", "figures/csr.png", "figures/heatmap.png",
                 "figures/faithful.png"):
        assert (out / name).is_file(), name
    printed = capsys.readouterr().out
    assert "success: 100.0%  faithful: 100.0%  drift: 0.0%  calls: 1.0" in printed
    # every trace carries the support verdict; the references the oracle answers with are supported
    traces = [json.loads(x) for x in (out / "traces.jsonl").read_text().splitlines()]
    assert {t["support"] for t in traces} == {"supported"} and all(t["support_reasons"] for t in traces)
    assert m["supported"] == 1.0 and m["support"] == {"supported": 5}
    assert "supported: 100.0% (solved but trivial 0, solved but unsupported 0)" in printed
    assert "Planetarium view: parseable 100.0%  solvable 100.0%  equivalent 100.0%" in printed
    assert "identical to reference: 5" in printed
    # each section is titled by what it shows; the paper's counterpart in brackets is the right one
    report = (out / "report.html").read_text()
    assert "Cumulative success within h repairs, and the gain of each repair [Figure 3, left]" in report
    assert "Dominant diagnostic among unsolved tasks after each step [Figure 3, right]" in report
    assert "(Table 2)" not in report and "(Figure 4)" not in report and "Tables 8, 9" not in report
    assert "Planetarium's rates" in report and "Provenance" in report and "Planner limits" in report
    assert m["provenance"]["tasks"]["file"] == str(task_file) and m["provenance"]["backend"] is None

    # a second run into the same folder must be asked for
    assert main(["-q", "evaluate", "--policy", "oracle", "--tasks", str(task_file), "--out", str(out)]) == 2
    assert "--resume" in capsys.readouterr().err
    assert main(["-q", "evaluate", "--policy", "oracle", "--tasks", str(task_file), "--workers", "1",
                 "--out", str(out), "--resume", "--no-report", "--no-episode-log"]) == 0
    assert json.loads((out / "metrics.json").read_text())["resumed"] == 5


def test_compare_renders_html_and_markdown(task_file, tmp_path, capsys):
    for policy in ("oracle", "mutant:drop_goal_atom"):
        assert main(["-q", "evaluate", "--policy", policy, "--tasks", str(task_file), "--workers", "1",
                     "--no-report", "--no-episode-log", "--bootstrap", "0", "--out", str(tmp_path / policy)]) == 0
    capsys.readouterr()
    assert main(["evaluate", "compare", str(tmp_path / "oracle"), str(tmp_path / "mutant:drop_goal_atom"),
                 "--out", str(tmp_path / "cmp")]) == 0
    md = (tmp_path / "cmp" / "compare.md").read_text()
    html = (tmp_path / "cmp" / "compare.html").read_text()
    assert "| oracle | 100.0 | 100.0 | 0.0 |" in md and "| mutant:drop_goal_atom | 100.0 | 0.0 | 100.0 |" in md
    assert html.count("<table") == 7 and "CSR(h)" in html
    # the mutant loses every faithful success on the same tasks: a paired difference with no spread
    assert "| mutant:drop_goal_atom | +0.0 [+0.0, +0.0] | -100.0 [-100.0, -100.0] | +100.0 [+100.0, +100.0] |" in md
    assert main(["evaluate", "compare", str(tmp_path / "nothing-here")]) == 2
    assert "no metrics.json" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--policy", "gpt-9"], "unknown policy 'gpt-9'"),
    (["--policy", "mutant:nope"], "unknown mutator"),
    (["--policy", "model"], "needs --model"),
    (["--policy", "oracle", "--budget", "0"], "--budget must be at least 1"),
    (["--policy", "cot", "--backend", "openai:localhost:1"], "must start with http"),
])
def test_errors_are_one_line(argv, message, task_file, tmp_path, capsys):
    rc = main(["evaluate", *argv, "--tasks", str(task_file), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1
