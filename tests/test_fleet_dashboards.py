"""The dashboards name only metrics the code exports, are built from dashboards/build.py, and cover
what operators need; the Judge's numbers (AUC, calibration) are right on hand-checked cases."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from omtr.solver.metrics import FleetMetrics, exported_names
from omtr.telemetry import METRICS, TrainingTelemetry, binary_auc, expected_calibration_error

DASHBOARDS = Path(__file__).resolve().parents[1] / "dashboards"

# PromQL words that are not metric names.
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
             "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords or labels."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    e = re.sub(r"\{[^}]*\}", "", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)  # ranges
    e = re.sub(r"\b(by|without)\s*\([^)]*\)", "", e)  # grouping: `sum by (le) (x)` -> `sum (x)`
    e = re.sub(r"\b(on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", e)  # matching label lists
    names = set()
    for m in re.finditer(r"(?<![\w.])[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        word = m.group(0)
        if word.lower() in _KEYWORDS or e[m.end():].lstrip().startswith("("):
            continue
        names.add(word)
    return names


def exprs(path: Path) -> list[str]:
    doc = json.loads(path.read_text())
    return [t["expr"] for p in doc["panels"] for t in p["targets"]]


def test_the_name_reader_sees_every_metric_and_nothing_else():
    e = ('histogram_quantile(0.95, sum by (le, pod) (rate(a_bucket{job="x",le!="1"}[5m]))) / ignoring(category) '
         'group_left sum(rate(b_total[$__rate_interval])) + on(instance) c and bool d offset 5m')
    assert metric_names(e) == {"a_bucket", "b_total", "c", "d"}


def test_committed_dashboards_are_what_build_py_makes():
    r = subprocess.run([sys.executable, str(DASHBOARDS / "build.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("name,exported", [
    ("solver-fleet.json", lambda: exported_names(FleetMetrics().registry)),
    ("training.json", lambda: exported_names(TrainingTelemetry().registry)),
])
def test_no_dashboard_names_a_metric_the_code_does_not_export(name, exported):
    names = set().union(*(metric_names(e) for e in exprs(DASHBOARDS / name)))
    assert names, "no metric found"
    assert names <= exported(), sorted(names - exported())


def test_dashboards_cover_what_operators_need():
    fleet = " | ".join(p["title"].lower() for p in json.loads((DASHBOARDS / "solver-fleet.json").read_text())["panels"])
    for word in ("throughput", "latency", "categor", "cache", "time-outs", "queue", "pods"):
        assert word in fleet, word
    train = " | ".join(p["title"].lower() for p in json.loads((DASHBOARDS / "training.json").read_text())["panels"])
    for word in ("reward", "success rate", "category share", "judge", "auc", "calibration", "kl", "tokens"):
        assert word in train, word


def test_telemetry_names_are_the_documented_ones():
    doc = (DASHBOARDS / "README.md").read_text()
    exported = exported_names(TrainingTelemetry().registry)
    for name in METRICS:
        assert name in doc, f"{name} is not documented in dashboards/README.md"
        assert name in exported or f"{name}_total" in exported


def test_telemetry_rejects_unknown_roles_and_outcomes():
    tel = TrainingTelemetry()
    with pytest.raises(ValueError, match="unknown role"):
        tel.record(step=1, rewards={"critic": 1.0})
    with pytest.raises(ValueError, match="unknown outcome"):
        tel.record(step=1, categories={"success": 1, "typo": 2})


def test_binary_auc():
    assert binary_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75  # sklearn's example
    assert binary_auc([0.5, 0.5], [0, 1]) == 0.5  # a tie counts half
    assert binary_auc([0.9, 0.1], [1, 0]) == 1.0 and binary_auc([0.9, 0.1], [0, 1]) == 0.0
    assert binary_auc([0.3, 0.6], [1, 1]) is None


def test_expected_calibration_error():
    assert expected_calibration_error([0.0, 1.0], [0, 1]) == 0.0
    # bin 0.2-0.3: mean 0.25, accuracy 1/2 -> 0.25 x 2/4; bin 0.9-1.0: mean 0.95, accuracy 1 -> 0.05 x 2/4
    assert expected_calibration_error([0.2, 0.3 - 1e-9, 0.9, 1.0], [1, 0, 1, 1]) == pytest.approx(0.15)
    assert expected_calibration_error([], []) is None
    with pytest.raises(ValueError):
        expected_calibration_error([1.5], [1])
