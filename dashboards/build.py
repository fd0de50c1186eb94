"""Build the Grafana dashboards (JSON) from this file: python dashboards/build.py [--check]

Dashboards as code without a dependency: each panel is one line below, the layout and the
Grafana boilerplate are generated. ``--check`` exits 1 when the committed JSON differs from what
this file builds (the tests run it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RATE = "$__rate_interval"
DS = {"type": "prometheus", "uid": "${datasource}"}


def q(expr: str, legend: str = "") -> dict:
    return {"expr": expr, "legendFormat": legend}


def pct(quantile: float, metric: str, legend: str) -> dict:
    return q(f"histogram_quantile({quantile}, sum by (le) (rate({metric}_bucket[{RATE}])))", legend)


def panel(title: str, targets: list[dict], *, kind: str = "timeseries", unit: str = "short", stack: bool = False,
          description: str = "", w: int = 12, h: int = 8) -> dict:
    p = {"type": kind, "title": title, "description": description, "datasource": DS, "w": w, "h": h,
         "fieldConfig": {"defaults": {"unit": unit}, "overrides": []}, "options": {}, "targets": targets}
    if kind == "timeseries":
        p["fieldConfig"]["defaults"]["custom"] = {"stacking": {"mode": "normal" if stack else "none"},
                                                  "fillOpacity": 30 if stack else 10}
        p["options"] = {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}}
    elif kind == "stat":
        p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value"}
    return p


def layout(panels: list[dict]) -> list[dict]:
    """Left to right, wrapping at Grafana's 24 columns; ids in order."""
    x = y = row_h = 0
    out = []
    for n, p in enumerate(panels, 1):
        w, h = p.pop("w"), p.pop("h")
        if x + w > 24:
            x, y, row_h = 0, y + row_h, 0
        p = {"id": n, "gridPos": {"x": x, "y": y, "w": w, "h": h}, **p}
        for i, t in enumerate(p["targets"]):
            t["refId"] = chr(ord("A") + i)
            t["datasource"] = DS
        out.append(p)
        x, row_h = x + w, max(row_h, h)
    return out


def dashboard(uid: str, title: str, description: str, tags: list[str], panels: list[dict]) -> dict:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": tags,
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "utc",
        "templating": {"list": [{"name": "datasource", "label": "Prometheus", "type": "datasource",
                                 "query": "prometheus", "current": {}, "hide": 0}]},
        "annotations": {"list": []},
        "panels": layout(panels),
    }


def fleet() -> dict:
    m = "omtr_solver_"
    panels = [
        panel("Throughput (specs verified / s)", [q(f"sum(rate({m}calls_total[{RATE}]))", "specs/s")],
              unit="ops", description="Verdicts returned by all pods, cache hits included."),
        panel("Requests by status", [q(f"sum by (code) (rate({m}requests_total[{RATE}]))", "{{code}}")],
              unit="reqps", stack=True, description="POST /v1/solve answers; 429 = queue full, 503 = starting/draining."),
        panel("Latency per spec (p50 / p95 / p99)",
              [pct(0.5, f"{m}spec_duration_seconds", "p50"), pct(0.95, f"{m}spec_duration_seconds", "p95"),
               pct(0.99, f"{m}spec_duration_seconds", "p99")], unit="s"),
        panel("Latency per batch (p50 / p95 / p99)",
              [pct(0.5, f"{m}request_duration_seconds", "p50"), pct(0.95, f"{m}request_duration_seconds", "p95"),
               pct(0.99, f"{m}request_duration_seconds", "p99")], unit="s"),
        panel("Verdicts by category", [q(f"sum by (category) (rate({m}verdicts_total[{RATE}]))", "{{category}}")],
              unit="ops", stack=True, description="'success' or one of the six diagnostic categories."),
        panel("Category share", [q(f"sum by (category) (rate({m}verdicts_total[{RATE}])) / ignoring(category) "
                                   f"group_left sum(rate({m}verdicts_total[{RATE}]))", "{{category}}")],
              unit="percentunit", stack=True),
        panel("Cache hit rate", [q(f"sum(rate({m}cache_hits_total[{RATE}])) / sum(rate({m}calls_total[{RATE}]))",
                                   "hit rate")], unit="percentunit", w=8),
        panel("Time-outs and memory-outs", [q(f"sum(rate({m}timeouts_total[{RATE}]))", "time-outs"),
                                            q(f"sum(rate({m}memory_outs_total[{RATE}]))", "memory-outs"),
                                            q(f"sum(rate({m}too_large_total[{RATE}]))", "input too large")],
              unit="ops", w=8, description="Limits, never a proof of unsolvability; not cached."),
        panel("Queue and in-flight", [q(f"sum({m}queue_depth)", "queued specs"),
                                      q(f"sum({m}inflight_specs)", "in-flight specs"),
                                      q(f"sum({m}inflight_requests)", "in-flight batches")], w=8),
        panel("Pods ready", [q(f"sum({m}ready)", "ready")], kind="stat", w=4, h=5),
        panel("Pods", [q(f"count({m}workers)", "pods")], kind="stat", w=4, h=5),
        panel("Solver workers", [q(f"sum({m}workers)", "workers")], kind="stat", w=4, h=5),
        panel("Rejected requests by reason",
              [q(f"sum by (reason) (rate({m}rejected_requests_total[{RATE}]))", "{{reason}}")],
              unit="reqps", stack=True, w=12, h=5),
        panel("Request size (p95 bytes, mean specs)",
              [pct(0.95, f"{m}request_bytes", "p95 bytes"),
               q(f"sum(rate({m}request_specs_sum[{RATE}])) / sum(rate({m}request_specs_count[{RATE}]))",
                 "mean specs / request")], unit="short"),
        panel("Retried and abandoned batches",
              [q(f"sum(rate({m}idempotent_replays_total[{RATE}]))", "replayed (not verified again)"),
               q(f"sum(rate({m}cancelled_requests_total[{RATE}]))", "stopped: client left")], unit="reqps"),
    ]
    return dashboard("omtr-solver-fleet", "omtr solver fleet",
                     "Fast Downward + VAL fleet (omtr solver serve): throughput, latency, categories, cache, "
                     "limits, queue and pods.", ["omtr", "solver"], panels)


def training() -> dict:
    m = "omtr_train_"
    roles = "{{role}}"
    panels = [
        panel("Mean reward per role", [q(f"avg by (role) ({m}reward)", roles)]),
        panel("Success rate (planner-accepted final specs)", [q(f"avg({m}success_rate)", "success rate")],
              unit="percentunit"),
        panel("Category share of final verdicts", [q(f"avg by (category) ({m}category_share)", "{{category}}")],
              unit="percentunit", stack=True),
        panel("Judge: AUC and calibration error (ECE)",
              [q(f"avg({m}judge_auc)", "AUC"), q(f"avg({m}judge_ece)", "ECE")], unit="short"),
        panel("KL to the reference policy", [q(f"avg by (role) ({m}kl)", roles)], w=8),
        panel("Tokens / s", [q(f"sum({m}tokens_per_second)", "tokens/s")], w=8),
        panel("Episodes and planner calls / s", [q(f"sum(rate({m}episodes_total[{RATE}]))", "episodes/s"),
                                                 q(f"sum(rate({m}planner_calls_total[{RATE}]))", "planner calls/s")],
              unit="ops", w=8),
        panel("Step", [q(f"max({m}step)", "step")], kind="stat", w=6, h=5),
    ]
    return dashboard("omtr-training", "omtr training",
                     "What the trainer exports (omtr.telemetry): rewards per role, success rate, category shares, "
                     "Judge calibration and AUC, KL, tokens/s.", ["omtr", "training"], panels)


DASHBOARDS = {"solver-fleet.json": fleet, "training.json": training}


def render(build) -> str:
    return json.dumps(build(), indent=2, sort_keys=False) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a committed dashboard is out of date")
    args = ap.parse_args(argv)
    stale = []
    for name, build in DASHBOARDS.items():
        path = HERE / name
        text = render(build)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"out of date: {', '.join(stale)}; run python dashboards/build.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
