"""An evaluation folder's files and its trace file: the one place both the run that writes them
(:mod:`omtr.evaluation.run`) and the report that compares runs (:mod:`omtr.evaluation.report`) read
them from, so neither imports the other for them.

``traces.jsonl`` holds one JSON line per finished task; the last line of a task id wins, and a line
cut short by a kill is dropped (:func:`finished`, when resuming) or skipped (:func:`read_traces`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

TRACES = "traces.jsonl"
METRICS = "metrics.json"
EPISODE_LOG = "episodes.parquet"


def finished(path: Path) -> dict[str, dict]:
    """Records already in a trace file; a last line cut short by a kill is dropped from the file."""
    if not path.exists():
        return {}
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)
    return _records_by_id(path)


def _records_by_id(path: Path) -> dict[str, dict]:
    """Trace records by task id (the last one of an id wins); lines that do not parse are skipped."""
    out: dict[str, dict] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
                out[str(rec["id"])] = rec
            except (ValueError, KeyError, TypeError):
                continue
    return out


def read_traces(path: Path) -> list[dict]:
    """The records of a trace file, read only (a cut-short last line is skipped, not removed)."""
    if not path.exists():
        return []
    return list(_records_by_id(path).values())


def read_records(out: Path, ids: Sequence[str] | None = None) -> list[dict]:
    recs = finished(out / TRACES)
    if ids is None:
        return list(recs.values())
    return [recs[i] for i in ids if i in recs]
