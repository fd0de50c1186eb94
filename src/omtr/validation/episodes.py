"""Episode logs: one parquet row per role step, and the Great Expectations suite that guards them.

Each training cycle writes its episodes as a log (:func:`write_episode_log`), and the update reads
it only after :func:`validate_episode_log` passed. A log has exactly the columns of
:data:`EPISODE_COLUMNS`, in that order, one row per role step:

- ``actor`` rows: the Actor's spec, ``step`` 0;
- ``editor`` rows: the Editor's repairs, ``step`` 1, 2, ... (the index of the spec in the episode,
  so a step is at most ``K - 1 = 5`` with the paper's budget);
- ``judge`` rows: the Judge's score of the spec at that step (today always the Actor's, step 0);
  ``solver_success`` and ``category`` are that spec's verdict, the Judge's label.

The suite checks: the columns and their types; no nulls outside ``category``, ``judge_score``,
``reward`` and ``advantage``; the value sets of ``role``, ``mode`` (``full`` or ``domain-given``:
whether the model wrote the domain too or was given it), ``support`` (the episode's answer's support
verdict, :mod:`omtr.faithfulness.support`: ``supported``, ``unsupported`` or ``trivial``) and
``category``; ranges (``judge_score``
in [0, 1], ``step`` in [0, 5], counts and times not negative); (episode, role, step) unique within
a (run, cycle); ``solver_success`` exactly when ``category`` is null; and steps without gaps: the
steps of each (run, cycle, episode, role) are consecutive from the role's first step (0 for the
Actor and the Judge, 1 for the Editor). That last check has no built-in expectation: the expected
step of every row (its role's first step plus its dense rank among its group's steps) is computed
into a helper column, ``_expected_step``, and GE checks ``step == _expected_step`` like any other
pair of columns, so every finding comes from one GE result and one report.

pandas, pyarrow and Great Expectations are imported on first use; the GE context, suite and
validation definition are built once per process (and ``max_step``) and reused.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping, NamedTuple

from omtr.pddl.categories import Category

# column -> dtype, in file order. "str" columns are UTF-8 strings in parquet.
EPISODE_COLUMNS: Mapping[str, str] = MappingProxyType({
    "run": "str",              # the training run's name
    "cycle": "int64",          # rollout/update cycle, from 0
    "episode": "int64",        # episode number within the cycle, from 0
    "task_id": "str",
    "family": "str",           # task family; "" when the task has none
    "mode": "str",             # full (the model wrote domain and problem) | domain-given (the problem only)
    "rules": "str",            # the decoding rules the episode ran under: off | plain | scoped | scoped+objects | scoped+objects+facts[+predicates]
    "role": "str",             # actor | editor | judge
    "step": "int64",           # index of the spec in the episode: 0 the Actor's, 1..5 repairs
    "spec_hash": "str",        # hash of the normalised spec; "" when no spec could be extracted
    "tokens": "int64",         # tokens the role generated (0 for the Judge, which generates none)
    "solver_success": "bool",  # the planner's verdict on the step's spec
    "category": "str",         # one of the six categories; null exactly when solver_success
    "timed_out": "bool",       # the verdict came from a time limit, not from the spec
    "judge_score": "float64",  # s_J in [0, 1] on actor and judge rows; null elsewhere
    "reward": "float64",       # filled by the trainer; null until then
    "advantage": "float64",    # filled by the trainer; null until then
    "wall_ms": "float64",      # the step's wall time (its batch's generation + planning, or the Judge's)
    "support": "str",          # the episode's answer's support verdict: supported | unsupported | trivial
})
NULLABLE = frozenset({"category", "judge_score", "reward", "advantage"})
ROLES = ("actor", "editor", "judge")
MODES = ("full", "domain-given")  # omtr.tasks.records.MODES (kept here: the suite reads no task code)
# omtr.model.scope_check.rules_label's values (kept here: the suite reads no model code)
# omtr.faithfulness.support.SUPPORT_VALUES (kept here: the suite reads no checker code)
SUPPORT_VALUES = ("supported", "unsupported", "trivial")
RULE_SETS = ("off", "plain", "scoped", "scoped+objects", "scoped+objects+facts", "scoped+objects+facts+predicates")
FIRST_STEP = MappingProxyType({"actor": 0, "editor": 1, "judge": 0})
CATEGORIES = tuple(c.value for c in Category)
KEY_COLUMNS = ("run", "cycle", "episode", "role", "step")
LOG_FORMAT = "omtr.episode_log/1"  # stored in the parquet schema metadata
HELPER_COLUMN = "_expected_step"

# What GE accepts per dtype: numpy dtype names for typed columns; the Python type name ("str",
# "int", ...) is what GE checks value by value when a column holds Python objects.
_TYPE_LISTS = {
    "str": ["str"],
    "int64": ["int64", "int32", "int"],
    "float64": ["float64", "float32", "float"],
    "bool": ["bool"],
}
_MAX_ROWS_KEPT = 200  # bad row indices kept per failure (the count is always exact)


class EpisodeLogError(ValueError):
    """A log that cannot be written or read (missing keys, wrong Python types, not parquet)."""


class Failure(NamedTuple):
    """One failed expectation: which, on what column, and where."""

    expectation: str  # GE's expectation type, e.g. "expect_column_values_to_be_between"
    column: str  # the column (or "a,b,c" for several; "" for the table)
    rows: list[int]  # 0-based row positions in the log (empty: the whole column or table)
    values: list  # the offending values (a sample), or what GE observed for the column or table
    check: str = ""  # what was expected, in words
    count: int | None = None  # how many rows failed (None: not a per-row check)


@dataclass
class EpisodeValidation:
    """The suite's verdict on one log."""

    success: bool
    failures: list[Failure]
    rows: int
    checks: int
    source: str = "<dataframe>"
    seconds: float = 0.0
    row_keys: dict[int, str] = field(default_factory=dict, repr=False)  # row -> "run=.. cycle=.. ..."

    def describe(self) -> str:
        head = f"episode log {self.source}: {self.rows} rows, {self.checks} checks"
        if self.success:
            return f"{head}: passed"
        lines = [f"{head}: FAILED {len(self.failures)}"]
        for f in self.failures:
            what = f.check or f.expectation
            col = f" [{f.column}]" if f.column else ""
            if f.rows:
                n = f.count if f.count is not None else len(f.rows)
                lines.append(f"- {what}{col}: {n} bad row{'s' if n != 1 else ''} ({f.expectation})")
                for i, row in enumerate(f.rows[:20]):
                    value = f" value {_short(f.values[i])}" if i < len(f.values) else ""
                    lines.append(f"    row {row} ({self.row_keys.get(row, '?')}){value}")
                if len(f.rows) > 20:
                    lines.append(f"    ... and {n - 20} more")
            else:
                observed = f": observed {_short(f.values[0] if len(f.values) == 1 else f.values)}" if f.values else ""
                lines.append(f"- {what}{col}{observed} ({f.expectation})")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "success": self.success, "source": self.source, "rows": self.rows, "checks": self.checks,
            "seconds": round(self.seconds, 3),
            "failures": [
                {**f._asdict(), "values": [_plain(v) for v in f.values],
                 "row_keys": {str(r): self.row_keys[r] for r in f.rows if r in self.row_keys}}
                for f in self.failures
            ],
        }


# ---------------------------------------------------------------------------------------- rows


def spec_hash(domain: str | None, problem: str | None) -> str:
    """16 hex digits of a hash of the spec, normalised for layout, comments and case; "" for no spec."""
    if domain is None or problem is None:
        return ""
    from omtr.solver.cache import normalise

    h = hashlib.sha256()
    for part in (normalise(domain), normalise(problem)):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()[:16]


def rows_from_traces(traces: Iterable, run: str, cycle: int, *, first_episode: int = 0,
                     judge_rows: bool = True) -> list[dict]:
    """Log rows for episodes: ``Episode`` objects from the episode loop or their ``to_json()`` lines.

    Episodes are numbered from ``first_episode`` in the order given. Each step gives an ``actor`` or
    ``editor`` row; a step the Judge scored also gives a ``judge`` row (unless ``judge_rows`` is
    false). ``reward`` and ``advantage`` are left null for the trainer to fill in.
    """
    rows: list[dict] = []
    for n, trace in enumerate(traces):
        ep = trace.to_json() if hasattr(trace, "to_json") else trace
        base = {"run": str(run), "cycle": int(cycle), "episode": first_episode + n,
                "task_id": str(ep["id"]), "family": ep.get("family") or "", "mode": ep.get("mode") or "full",
                "rules": ep.get("rules") or "off", "support": ep.get("support") or "unsupported"}
        for s in ep.get("steps", []):
            verdict = s.get("verdict") or {}
            success = bool(verdict.get("success"))
            category = verdict.get("category")
            category = None if success or category is None else str(getattr(category, "value", category))
            times = s.get("times") or {}
            score = s.get("judge_score")
            common = {**base, "step": int(s["index"]), "spec_hash": spec_hash(s.get("domain"), s.get("problem")),
                      "solver_success": success, "category": category,
                      "timed_out": bool(verdict.get("timed_out")), "reward": None, "advantage": None}
            rows.append({**common, "role": s["role"], "tokens": int(s.get("new_tokens") or 0),
                         "judge_score": None if score is None else float(score),
                         "wall_ms": float(times.get("generate_ms", 0.0)) + float(times.get("solve_ms", 0.0))})
            if judge_rows and score is not None:
                rows.append({**common, "role": "judge", "tokens": 0, "judge_score": float(score),
                             "wall_ms": float(times.get("judge_ms", 0.0))})
    return [{c: r[c] for c in EPISODE_COLUMNS} for r in rows]


# ------------------------------------------------------------------------------ write and read


def _arrow_schema():
    import pyarrow as pa

    types = {"str": pa.string(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_()}
    return pa.schema([pa.field(c, types[t], nullable=True) for c, t in EPISODE_COLUMNS.items()],
                     metadata={b"format": LOG_FORMAT.encode()})


def _python_type_ok(dtype: str, v) -> bool:
    import numpy as np

    if dtype == "str":
        return isinstance(v, str)
    if dtype == "bool":
        return isinstance(v, (bool, np.bool_))
    if isinstance(v, (bool, np.bool_)):  # a bool is an int to Python, never a count or a score here
        return False
    if dtype == "int64":
        return isinstance(v, (int, np.integer))
    return isinstance(v, (int, float, np.integer, np.floating))


def _check_rows(rows: list[dict]) -> list[list]:
    """Columns of the rows (Enum members become their values); EpisodeLogError names a bad row."""
    expected = set(EPISODE_COLUMNS)
    columns: list[list] = [[] for _ in EPISODE_COLUMNS]
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise EpisodeLogError(f"episode log row {i}: expected a dict of columns, got {type(row).__name__}")
        missing = [c for c in EPISODE_COLUMNS if c not in row]
        if missing:
            raise EpisodeLogError(f"episode log row {i}: missing key{'s' if len(missing) > 1 else ''} "
                                  f"{', '.join(map(repr, missing))} (a row has exactly EPISODE_COLUMNS)")
        extra = sorted(map(str, set(row) - expected))
        if extra:
            raise EpisodeLogError(f"episode log row {i}: unexpected key{'s' if len(extra) > 1 else ''} "
                                  f"{', '.join(map(repr, extra))} (a row has exactly EPISODE_COLUMNS)")
        for j, (col, dtype) in enumerate(EPISODE_COLUMNS.items()):
            v = row[col]
            if isinstance(v, enum.Enum):
                v = v.value
            if v is not None and not _python_type_ok(dtype, v):
                raise EpisodeLogError(f"episode log row {i}: key {col!r} = {v!r} ({type(v).__name__}) "
                                      f"is not a {dtype} value")
            columns[j].append(v)
    return columns


def write_episode_log(rows: list[dict], path) -> Path:
    """Write rows as a parquet episode log, atomically: a temporary file in the same folder is
    renamed over ``path`` only once it is complete, so an interrupted write leaves the old file
    (or none) and never half a log. Raises ``EpisodeLogError`` naming the row and key of a row with
    missing or extra keys or a value of the wrong Python type; nulls are written as they are (the
    suite judges them). Returns the path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    rows = list(rows)
    columns = _check_rows(rows)
    schema = _arrow_schema()
    table = pa.Table.from_arrays([pa.array(vals, type=f.type) for vals, f in zip(columns, schema)], schema=schema)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass
    return path


def read_episode_log(path):
    """The log as a pandas DataFrame. ``FileNotFoundError`` if there is no file, ``EpisodeLogError``
    if it is not parquet. Columns are not checked here: that is the suite's job."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    if path.is_dir():
        raise EpisodeLogError(f"{path}: is a directory, expected a parquet file")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise EpisodeLogError(f"{path}: not a parquet file ({str(exc).splitlines()[0][:200]})") from None
    return table.to_pandas()


# ---------------------------------------------------------------------------------- the suite


def _expectations(max_step: int) -> list:
    import great_expectations.expectations as gxe
    from great_expectations.expectations.row_conditions import Column

    def meta(check: str, *involves: str) -> dict:
        return {"check": check, "involves": list(involves)}

    ex = [gxe.ExpectTableColumnsToMatchOrderedList(
        column_list=[*EPISODE_COLUMNS, HELPER_COLUMN],
        meta=meta("the columns are EPISODE_COLUMNS, in order"))]
    for col, dtype in EPISODE_COLUMNS.items():
        ex.append(gxe.ExpectColumnValuesToBeInTypeList(
            column=col, type_list=_TYPE_LISTS[dtype], meta=meta(f"{col} is {dtype}", col)))
    for col in EPISODE_COLUMNS:
        if col not in NULLABLE:
            ex.append(gxe.ExpectColumnValuesToNotBeNull(column=col, meta=meta(f"{col} is never null", col)))
    ex += [
        gxe.ExpectColumnValuesToBeInSet(column="role", value_set=list(ROLES),
                                        meta=meta(f"role is one of {', '.join(ROLES)}", "role")),
        gxe.ExpectColumnValuesToBeInSet(column="mode", value_set=list(MODES),
                                        meta=meta(f"mode is one of {', '.join(MODES)}", "mode")),
        gxe.ExpectColumnValuesToBeInSet(column="rules", value_set=list(RULE_SETS),
                                        meta=meta(f"rules is one of {', '.join(RULE_SETS)}", "rules")),
        gxe.ExpectColumnValuesToBeInSet(column="support", value_set=list(SUPPORT_VALUES),
                                        meta=meta(f"support is one of {', '.join(SUPPORT_VALUES)}", "support")),
        gxe.ExpectColumnValuesToBeInSet(column="category", value_set=list(CATEGORIES),
                                        meta=meta("category is one of the six categories (or null)", "category")),
        gxe.ExpectColumnValuesToBeBetween(column="judge_score", min_value=0.0, max_value=1.0,
                                          meta=meta("judge_score is in [0, 1]", "judge_score")),
        gxe.ExpectColumnValuesToBeBetween(column="step", min_value=0, max_value=max_step,
                                          meta=meta(f"step is between 0 and {max_step}", "step")),
    ]
    for col in ("cycle", "episode", "tokens", "wall_ms"):
        ex.append(gxe.ExpectColumnValuesToBeBetween(column=col, min_value=0, meta=meta(f"{col} is not negative", col)))
    ex += [
        gxe.ExpectCompoundColumnsToBeUnique(
            column_list=list(KEY_COLUMNS), ignore_row_if="never",
            meta=meta("(episode, role, step) is unique within a (run, cycle)", *KEY_COLUMNS)),
        gxe.ExpectColumnValuesToBeNull(
            column="category", row_condition=Column("solver_success") == True,  # noqa: E712 (a GE condition)
            meta=meta("a successful step has no category", "category", "solver_success")),
        gxe.ExpectColumnValuesToNotBeNull(
            column="category", row_condition=Column("solver_success") == False,  # noqa: E712
            meta=meta("a failed step has a category", "category", "solver_success")),
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="step", column_B=HELPER_COLUMN, ignore_row_if="either_value_is_missing",
            meta=meta("the steps of each (run, cycle, episode, role) have no gaps "
                      "(actor and judge from 0, editor from 1)", *KEY_COLUMNS)),
    ]
    for i, e in enumerate(ex):  # GE returns results in its own order; the report keeps the suite's
        e.meta["order"] = i
    return ex


_LOCK = threading.Lock()
_STATE: dict[str, Any] = {}


def _validation_definition(max_step: int):
    """The GE validation definition for ``max_step``, built once per process (GE is slow to load)."""
    key = f"steps_0_{max_step}"
    if key in _STATE:
        return _STATE[key]
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import logging

    gx_log = logging.getLogger("great_expectations")  # its import logs at INFO, line by line
    if gx_log.level == logging.NOTSET or gx_log.level < logging.WARNING:
        gx_log.setLevel(logging.WARNING)
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    ctx = _STATE.get("context")
    if ctx is None:  # in memory only: no docs site, no analytics, no progress bars
        config = DataContextConfig(
            store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
            analytics_enabled=False,
            progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
        )
        ctx = _STATE["context"] = gx.get_context(mode="ephemeral", project_config=config)
    source = ctx.data_sources.add_pandas(f"episode_log_{key}")
    batch = source.add_dataframe_asset("episodes").add_batch_definition_whole_dataframe("whole log")
    suite = ctx.suites.add(gx.ExpectationSuite(name=f"omtr_episode_log_{key}", expectations=_expectations(max_step)))
    vd = ctx.validation_definitions.add(gx.ValidationDefinition(name=f"omtr_episode_log_{key}", data=batch, suite=suite))
    _STATE[key] = vd
    return vd


def _default_max_step() -> int:
    from omtr.config import EpisodeConfig

    return EpisodeConfig().planner_call_budget - 1


def _expected_steps(df):
    """Each row's step if its group's steps had no gaps: the role's first step plus the row's dense
    rank among the steps of its (run, cycle, episode, role). Null where that cannot be computed
    (an unknown role, a non-numeric step, a null key): other checks report those rows."""
    import pandas as pd

    out = pd.Series(float("nan"), index=df.index, dtype="float64")
    keys = ["run", "cycle", "episode", "role"]
    if not set(keys + ["step"]) <= set(df.columns) or df.empty:
        return out
    try:
        step = pd.to_numeric(df["step"], errors="coerce")
        first = df["role"].map(lambda r: FIRST_STEP.get(r) if isinstance(r, str) else None).astype("float64")
        ok = step.notna() & first.notna() & df[keys].notna().all(axis=1)
        if ok.any():
            groups = [df.loc[ok, k].map(str) for k in keys]
            rank = step[ok].groupby(groups).rank(method="dense") - 1
            out[ok] = first[ok] + rank
    except (TypeError, ValueError):  # keys of types that cannot be grouped: the type checks say so
        pass
    return out


def _frame_for_suite(df):
    """A copy GE can check: string-dtype columns become Python objects (GE checks those value by
    value, so a wrong type is reported per row), plus the helper column."""
    import pandas as pd

    frame = df.reset_index(drop=True).copy()
    for col in frame.columns:
        dtype = frame[col].dtype
        if dtype != object and (pd.api.types.is_string_dtype(dtype) or isinstance(dtype, pd.CategoricalDtype)):
            frame[col] = frame[col].astype(object).where(frame[col].notna(), None)
    frame[HELPER_COLUMN] = _expected_steps(frame)
    return frame


def _exception(result) -> str:
    info = result.exception_info or {}
    if info.get("raised_exception"):
        return str(info.get("exception_message") or "error")
    for v in info.values():
        if isinstance(v, dict) and v.get("raised_exception"):
            return str(v.get("exception_message") or "error")
    return ""


def _row_keys(df, rows: Iterable[int]) -> dict[int, str]:
    cols = [c for c in ("run", "cycle", "episode", "task_id", "role", "step") if c in df.columns]
    out = {}
    for r in rows:
        if 0 <= r < len(df):
            out[r] = ", ".join(f"{c}={_short(_plain(df[c].iat[r]))}" for c in cols)
    return out


def _failures(result, df) -> list[Failure]:
    """The failed expectations, in suite order. Findings on a column whose presence or type already
    failed are left out (the first finding says it all; the others only echo it)."""
    columns = set(df.columns)
    found, broken = [], set(EPISODE_COLUMNS) - columns
    for r in sorted(result.results, key=lambda r: (r.expectation_config.meta or {}).get("order", 0)):
        cfg = r.expectation_config
        kw, meta = cfg.kwargs, cfg.meta or {}
        if r.success:
            continue
        involves = set(meta.get("involves", []))
        if involves & broken:
            continue
        column = kw.get("column") or kw.get("column_A") or ",".join(kw.get("column_list", []) or [])
        if column == ",".join([*EPISODE_COLUMNS, HELPER_COLUMN]):
            column = ""
        check = meta.get("check", "")
        res = r.result or {}
        error = _exception(r)
        if cfg.type == "expect_table_columns_to_match_ordered_list":
            missing = [c for c in EPISODE_COLUMNS if c not in columns]
            extra = [c for c in df.columns if c not in EPISODE_COLUMNS]
            parts = ([f"missing {', '.join(missing)}"] if missing else []) + \
                    ([f"unexpected {', '.join(map(str, extra))}"] if extra else [])
            values = parts or [f"order {', '.join(map(str, df.columns))}"]
            found.append(Failure(cfg.type, "", [], values, check, None))
            continue
        if error:
            found.append(Failure(cfg.type, column, [], [f"could not be checked: {error.splitlines()[0][:200]}"], check, None))
            continue
        rows = res.get("unexpected_index_list")
        if rows is None:  # a column-level finding (e.g. the column's dtype)
            found.append(Failure(cfg.type, column, [], [res.get("observed_value")], check, None))
        else:
            rows = [int(i) for i in rows][:_MAX_ROWS_KEPT]
            values = list(res.get("unexpected_list") or res.get("partial_unexpected_list") or [])[:_MAX_ROWS_KEPT]
            if cfg.type == "expect_column_pair_values_to_be_equal":
                values = [f"step {_short(_int(a))}, expected {_short(_int(b))}" for a, b in
                          (v if isinstance(v, (list, tuple)) and len(v) == 2 else (v, None) for v in values)]
            elif cfg.type == "expect_compound_columns_to_be_unique":
                values = [dict(v) if isinstance(v, Mapping) else v for v in values]
            found.append(Failure(cfg.type, column, rows, values, check, int(res.get("unexpected_count") or len(rows))))
        if cfg.type == "expect_column_values_to_be_in_type_list":
            broken |= involves
    return found


def validate_episode_log(log, *, max_step: int | None = None, source: str | None = None) -> EpisodeValidation:
    """Run the suite on a log: a parquet path or a pandas DataFrame (rows are numbered 0.. in order).

    ``max_step`` is the largest step allowed (default: the planner-call budget minus one, 5).
    Raises ``FileNotFoundError`` / ``EpisodeLogError`` for a path that is missing or not parquet;
    everything wrong *inside* a log is a failure in the result, never an exception.
    """
    import pandas as pd

    t0 = time.perf_counter()
    if isinstance(log, pd.DataFrame):
        df, source = log.reset_index(drop=True), source or "<dataframe>"
    else:
        df, source = read_episode_log(log).reset_index(drop=True), source or str(log)
    max_step = _default_max_step() if max_step is None else int(max_step)
    frame = _frame_for_suite(df)
    with _LOCK:  # GE's context is not thread-safe; the definition is shared
        vd = _validation_definition(max_step)
        result = vd.run(batch_parameters={"dataframe": frame}, result_format={"result_format": "COMPLETE"})
        checks = len(vd.suite.expectations)
    failures = _failures(result, df)
    bad_rows = sorted({r for f in failures for r in f.rows})[:_MAX_ROWS_KEPT * 2]
    return EpisodeValidation(success=not failures, failures=failures, rows=len(df), checks=checks,
                             source=source, seconds=time.perf_counter() - t0, row_keys=_row_keys(df, bad_rows))


# ------------------------------------------------------------------------------------- helpers


def _plain(v):
    """A JSON-safe Python value (numpy scalars, NaN, tuples)."""
    if hasattr(v, "item") and not isinstance(v, (list, tuple, dict, str)):
        try:
            v = v.item()
        except (ValueError, AttributeError):
            pass
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


def _int(v):
    v = _plain(v)
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _short(v, limit: int = 80) -> str:
    text = json.dumps(_plain(v), ensure_ascii=False) if not isinstance(v, str) else repr(v)
    return text if len(text) <= limit else text[: limit - 3] + "..."
