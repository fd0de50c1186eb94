"""Episode logs and their Great Expectations suite: real logs pass, each kind of corruption is named
with its rows, writes are atomic, and ``omtr validate-episodes`` exits 0 / 1 / 2."""

import json
import os
import subprocess
import sys

import pytest

from omtr.config import SolverConfig
from omtr.inference.episode import run_episodes
from omtr.inference.scripted import ScriptedPolicy
from omtr.solver import SolverPool
from omtr.solver.examples import BW_DOMAIN, BW_PROBLEM, MALFORMED
from omtr.tasks.training import TrainingTask
from omtr.validation import (
    EPISODE_COLUMNS,
    EpisodeLogError,
    read_episode_log,
    rows_from_traces,
    validate_episode_log,
    write_episode_log,
)

pd = pytest.importorskip("pandas")
pytest.importorskip("great_expectations")

GOOD = f"```pddl\n{BW_DOMAIN}```\n```pddl\n{BW_PROBLEM}```"
BY_NAME = {e.name: e for e in MALFORMED}
SYNTAX, SCHEMA, GOAL = (f"Here:\n{BY_NAME[n].domain}\n{BY_NAME[n].problem}\n" for n in
                        ("syntax-missing-paren", "schema-undeclared-predicate", "goal-undeclared-object"))


@pytest.fixture(scope="module")
def episodes():
    """Three real episodes against the real planner: an Actor success, two repairs to success, and
    a failure that uses the whole budget of 4 calls."""
    tasks = [TrainingTask("t0", None, None, "Put a on b."),
             TrainingTask("t1", "blocksworld", None, "Put a on b, then b on c."),
             TrainingTask("t2", "blocksworld", None, "Put c on a.")]
    policy = ScriptedPolicy.for_tasks(tasks, {"t0": [GOOD], "t1": [SYNTAX, SCHEMA, GOOD], "t2": [SCHEMA, GOAL]},
                                      scores_by_id={"t0": 0.9, "t1": 0.2})
    with SolverPool(1, SolverConfig(time_limit_s=20)) as pool:
        return run_episodes(tasks, policy, pool, budget=4)


@pytest.fixture(scope="module")
def rows(episodes):
    return rows_from_traces(episodes, "run-a", 3)


@pytest.fixture(scope="module")
def log_path(rows, tmp_path_factory):
    return write_episode_log(rows, tmp_path_factory.mktemp("log") / "cycle-0003.parquet")


@pytest.fixture
def log(log_path):
    return read_episode_log(log_path)


def _row(df, episode, role, step) -> int:
    (i,) = df.index[(df.episode == episode) & (df.role == role) & (df.step == step)]
    return int(i)


def _failed(result) -> dict[str, list[int]]:
    return {f.check: f.rows for f in result.failures}


# ------------------------------------------------------------------------------ real logs


def test_rows_from_real_episodes(rows, episodes):
    assert all(list(r) == list(EPISODE_COLUMNS) for r in rows)
    got = [(r["episode"], r["role"], r["step"], r["solver_success"], r["category"]) for r in rows]
    assert got == [
        (0, "actor", 0, True, None), (0, "judge", 0, True, None),
        (1, "actor", 0, False, "syntax"), (1, "judge", 0, False, "syntax"),
        (1, "editor", 1, False, "predicate_schema"), (1, "editor", 2, True, None),
        (2, "actor", 0, False, "predicate_schema"), (2, "judge", 0, False, "predicate_schema"),
        (2, "editor", 1, False, "goal_constraint"), (2, "editor", 2, False, "goal_constraint"),
        (2, "editor", 3, False, "goal_constraint"),
    ]
    by = {(r["episode"], r["role"], r["step"]): r for r in rows}
    assert by[0, "actor", 0]["judge_score"] == by[0, "judge", 0]["judge_score"] == 0.9
    assert by[1, "editor", 1]["judge_score"] is None and by[1, "judge", 0]["tokens"] == 0
    assert by[0, "actor", 0]["family"] == "" and by[1, "actor", 0]["family"] == "blocksworld"
    assert {r["run"] for r in rows} == {"run-a"} and {r["cycle"] for r in rows} == {3}
    assert by[0, "actor", 0]["spec_hash"] == by[1, "editor", 2]["spec_hash"] != ""  # the same spec
    assert by[1, "actor", 0]["spec_hash"] == ""  # no spec could be read from a broken answer
    assert by[0, "actor", 0]["tokens"] > 0 and all(r["reward"] is None for r in rows)
    # trace lines (Episode.to_json()) give the same rows as the episodes themselves
    assert rows_from_traces([e.to_json() for e in episodes], "run-a", 3) == rows
    shifted = rows_from_traces(episodes, "run-a", 3, first_episode=10, judge_rows=False)
    assert [r["episode"] for r in shifted][:2] == [10, 11] and "judge" not in {r["role"] for r in shifted}


def test_a_real_log_passes(log_path, log):
    result = validate_episode_log(log_path)
    assert result.success, result.describe()
    assert result.failures == [] and result.rows == 11 and result.checks >= 20
    assert "passed" in result.describe() and str(log_path) in result.describe()
    assert json.loads(json.dumps(result.to_json()))["success"] is True
    assert list(log.columns) == list(EPISODE_COLUMNS)


def test_a_log_with_rewards_and_a_dataframe_straight_from_rows_pass(rows):
    filled = [{**r, "reward": 1.0 if r["solver_success"] else -0.5, "advantage": 0.25} for r in rows]
    assert validate_episode_log(pd.DataFrame(filled)).success
    assert validate_episode_log(pd.DataFrame(rows)).success  # all-null reward column: object dtype
    assert validate_episode_log(pd.DataFrame(rows), max_step=2).success is False  # step 3 is over 2


# ------------------------------------------------------------------------- corrupted logs


def test_wrong_types_are_named(log):
    log["tokens"] = log["tokens"].astype(str)
    log["cycle"] = log["cycle"].astype(float)
    result = validate_episode_log(log)
    failed = _failed(result)
    assert set(failed) == {"tokens is int64", "cycle is int64"}  # the range checks on them are not echoed
    assert failed["tokens is int64"] == list(range(11))  # value by value: every row
    (cycle,) = [f for f in result.failures if f.column == "cycle"]
    assert cycle.rows == [] and cycle.values == ["float64"]  # a typed column: its dtype
    text = result.describe()
    assert "tokens is int64" in text and "row 0 (run='run-a', cycle=3.0, episode=0" in text and "float64" in text


def test_a_mixed_type_column_names_only_the_bad_rows(log):
    log["judge_score"] = log["judge_score"].astype(object)
    log.loc[4, "judge_score"] = "high"
    assert _failed(validate_episode_log(log)) == {"judge_score is float64": [4]}


def test_an_out_of_range_judge_score(log):
    i = _row(log, 1, "judge", 0)
    log.loc[i, "judge_score"] = 1.5
    result = validate_episode_log(log)
    assert _failed(result) == {"judge_score is in [0, 1]": [i]}
    assert result.failures[0].values == [1.5] and result.failures[0].count == 1
    assert f"row {i} (run='run-a', cycle=3, episode=1, task_id='t1', role='judge', step=0) value 1.5" in result.describe()


def test_duplicate_episode_role_step(log):
    i = _row(log, 2, "editor", 2)
    result = validate_episode_log(pd.concat([log, log.loc[[i]]], ignore_index=True))
    assert _failed(result) == {"(episode, role, step) is unique within a (run, cycle)": [i, 11]}
    # the same (episode, role, step) in another cycle is not a duplicate
    first = log[log.episode == 0]
    assert validate_episode_log(pd.concat([log, first.assign(cycle=4)], ignore_index=True)).success


def test_a_success_row_with_a_category_and_a_failed_row_without_one(log):
    ok, bad = _row(log, 0, "actor", 0), _row(log, 2, "editor", 1)
    log.loc[ok, "category"] = "syntax"
    log.loc[bad, "category"] = None
    assert _failed(validate_episode_log(log)) == {"a successful step has no category": [ok],
                                                  "a failed step has a category": [bad]}


def test_a_gap_in_steps(log):
    i = _row(log, 2, "editor", 3)
    log.loc[i, "step"] = 4  # editor steps 1, 2, 4
    result = validate_episode_log(log)
    check = "the steps of each (run, cycle, episode, role) have no gaps (actor and judge from 0, editor from 1)"
    assert _failed(result) == {check: [i]}
    assert result.failures[0].values == ["step 4, expected 3"]
    log.loc[i, "step"] = 3
    log.loc[_row(log, 1, "editor", 1), "step"] = 0  # an editor step 0 does not exist (the Actor's spec is step 0)
    assert list(_failed(validate_episode_log(log))) == [check]


def test_an_unknown_role_and_category(log):
    i, j = _row(log, 1, "judge", 0), _row(log, 2, "editor", 2)
    log.loc[i, "role"] = "critic"
    log.loc[j, "category"] = "typo"
    assert _failed(validate_episode_log(log)) == {"role is one of actor, editor, judge": [i],
                                                  "category is one of the six categories (or null)": [j]}


def test_out_of_range_step_nulls_and_negative_counts(log):
    log.loc[0, "run"] = None
    log.loc[1, "tokens"] = -1
    log.loc[2, "step"] = 6
    failed = _failed(validate_episode_log(log))
    assert failed["run is never null"] == [0] and failed["tokens is not negative"] == [1]
    assert failed["step is between 0 and 5"] == [2]


def test_missing_extra_and_reordered_columns(log):
    result = validate_episode_log(log.drop(columns=["tokens"]).assign(extra=1))
    (f,) = result.failures  # the checks on the missing column are not echoed
    assert f.check == "the columns are EPISODE_COLUMNS, in order" and f.values == ["missing tokens", "unexpected extra"]
    result = validate_episode_log(log[list(reversed(log.columns))])
    assert [f.check for f in result.failures] == ["the columns are EPISODE_COLUMNS, in order"]


# ------------------------------------------------------------------------------- writing


def test_write_names_the_row_and_key_of_a_bad_row(rows, tmp_path):
    path = tmp_path / "log.parquet"
    bad = [dict(r) for r in rows]
    del bad[3]["tokens"]
    with pytest.raises(EpisodeLogError, match=r"row 3: missing key 'tokens'"):
        write_episode_log(bad, path)
    bad = [dict(r) for r in rows]
    bad[5]["note"] = "x"
    with pytest.raises(EpisodeLogError, match=r"row 5: unexpected key 'note'"):
        write_episode_log(bad, path)
    bad = [dict(r) for r in rows]
    bad[2]["tokens"] = True
    with pytest.raises(EpisodeLogError, match=r"row 2: key 'tokens' = True \(bool\) is not a int64"):
        write_episode_log(bad, path)
    bad = [dict(r) for r in rows]
    bad[1]["step"] = 1.5
    with pytest.raises(EpisodeLogError, match=r"row 1: key 'step' = 1.5"):
        write_episode_log(bad, path)
    assert not path.exists() and os.listdir(tmp_path) == []


def test_write_is_atomic(rows, tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    path = write_episode_log(rows, tmp_path / "log.parquet")
    before = path.read_bytes()

    def killed_midway(table, where, **kw):
        with open(where, "wb") as f:
            f.write(b"PAR1 half a log")
        raise OSError("killed")

    monkeypatch.setattr(pq, "write_table", killed_midway)
    with pytest.raises(OSError, match="killed"):
        write_episode_log(rows[:2], path)
    with pytest.raises(OSError, match="killed"):
        write_episode_log(rows, tmp_path / "new.parquet")
    assert path.read_bytes() == before  # the old log intact
    assert sorted(os.listdir(tmp_path)) == ["log.parquet"]  # no new file, no temporary left behind
    monkeypatch.undo()
    assert len(read_episode_log(write_episode_log(rows[:2], path))) == 2  # a finished write replaces it


def test_the_category_enum_and_nulls_are_written_as_they_are(rows, tmp_path):
    from omtr.pddl.categories import Category

    rows = [dict(r) for r in rows]
    rows[2]["category"] = Category.SYNTAX
    rows[3]["wall_ms"] = None  # the writer keeps it; the suite rejects it
    df = read_episode_log(write_episode_log(rows, tmp_path / "l.parquet"))
    assert df.loc[2, "category"] == "syntax"
    assert _failed(validate_episode_log(df)) == {"wall_ms is never null": [3]}


# --------------------------------------------------------------------------- command line


def test_cli_exit_codes(log_path, rows, tmp_path, capsys):
    from omtr.cli import main

    assert main(["validate-episodes", str(log_path)]) == 0
    assert "passed" in capsys.readouterr().out

    bad = [dict(r) for r in rows]
    bad[6]["judge_score"] = -0.1
    bad_path = write_episode_log(bad, tmp_path / "bad.parquet")
    out_json = tmp_path / "report.json"
    assert main(["validate-episodes", str(bad_path), "--json", str(out_json)]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "judge_score is in [0, 1]" in out and "row 6 (run='run-a', cycle=3, episode=2" in out
    report = json.loads(out_json.read_text())
    assert report["success"] is False and report["failures"][0]["rows"] == [6]

    assert main(["validate-episodes", str(bad_path), "--json", "-"]) == 1
    assert json.loads(capsys.readouterr().out)["failures"][0]["check"] == "judge_score is in [0, 1]"

    assert main(["validate-episodes", str(tmp_path / "missing.parquet")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "notes.parquet").write_text("not parquet")
    assert main(["validate-episodes", str(tmp_path / "notes.parquet")]) == 2
    assert "not a parquet file" in capsys.readouterr().err
    assert main(["validate-episodes", str(tmp_path)]) == 2


def test_cli_and_package_start_without_pandas_or_great_expectations():
    code = ("import sys, omtr.cli, omtr.validation; omtr.cli.build_parser(); "
            "print(sorted(m for m in ('pandas', 'pyarrow', 'great_expectations') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    help_text = subprocess.run([sys.executable, "-m", "omtr", "validate-episodes", "--help"],
                               capture_output=True, text=True, check=True).stdout
    assert "examples:" in help_text and "Exit status" in help_text


# ------------------------------------------------------------------------------ the support verdict


def test_every_row_carries_its_episodes_support_verdict(rows, episodes, log):
    """The episode's answer's support verdict (omtr.faithfulness.support) on each of its rows: the
    failed episode is unsupported; the suite names a row whose verdict is not one of the three."""
    by_ep = {r["episode"]: r["support"] for r in rows}
    assert by_ep == {n: e.support.verdict for n, e in enumerate(episodes)}
    assert by_ep[2] == "unsupported" and set(by_ep.values()) <= {"supported", "unsupported", "trivial"}
    assert not validate_episode_log(log).failures
    i = _row(log, 0, "actor", 0)
    log.loc[i, "support"] = "success"
    assert _failed(validate_episode_log(log)) == {"support is one of supported, unsupported, trivial": [i]}
