"""Figures (PNG), the self-contained ``report.html``, and side-by-side comparisons (HTML, Markdown).

Figures, each titled by what it shows (the paper's counterpart in brackets): ``csr.png`` (CSR(h)
with 95% intervals [Figure 3, left]), ``heatmap.png`` (share of each diagnostic category among
unsolved tasks after each step [Figure 3, right]), ``faithful.png`` (solvability vs faithful
success per set [Figure 4, left]) and ``judge.png`` (Judge score violins for U/D/F over the pooled
candidates [Figure 5, left], when the policy has a Judge). The report embeds them as data URIs, so
the one file can be mailed or attached to an MLflow run and still shows everything.

``compare`` puts several evaluations side by side. It refuses runs over different task sets,
budgets or solver configs (:class:`CompareError`, one line naming the difference), and gives each
difference of rates against the first run with a paired bootstrap 95% interval over the shared
tasks (the same resampled tasks for both runs).
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any, Sequence

from omtr.evaluation.metrics import CATEGORIES, MAX_H, _set_order
from omtr.evaluation.traces import TRACES, read_traces


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _pct(x: float | None, nd: int = 1) -> str:
    return "–" if x is None else f"{100 * x:.{nd}f}"


def _ci(rate: dict | None) -> str:
    if not rate or rate.get("value") is None:
        return "–"
    lo, hi = rate.get("ci") or [None, None]
    if lo is None:
        return _pct(rate["value"])
    return f"{_pct(rate['value'])} [{_pct(lo)}, {_pct(hi)}]"


def figures(metrics: dict, folder: Path, traces: Sequence[dict] | None = None) -> dict[str, str]:
    """Write the PNGs; returns name -> file name (relative to ``folder``'s parent)."""
    plt = _plt()
    folder.mkdir(parents=True, exist_ok=True)
    made: dict[str, str] = {}
    overall = metrics.get("overall")
    if not overall:
        return made
    fams = metrics.get("families") or {}

    # CSR curve
    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=110)
    hs = list(range(MAX_H + 1))
    for label, block, style in [("all", overall, "-o")] + [(f, b, "--.") for f, b in fams.items()]:
        ys = [100 * (c["value"] or 0) for c in block["csr"]]
        line, = ax.plot(hs, ys, style, label=f"{label} (n={block['tasks']})", linewidth=2 if label == "all" else 1)
        if label == "all":
            lo = [100 * (c["ci"][0] or 0) for c in block["csr"]]
            hi = [100 * (c["ci"][1] or 0) for c in block["csr"]]
            ax.fill_between(hs, lo, hi, alpha=0.2, color=line.get_color())
    ax.set_xlabel("repairs h"), ax.set_ylabel("CSR(h) %"), ax.set_ylim(-2, 102)
    ax.set_title("Cumulative success rate within h repairs")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(folder / "csr.png"), plt.close(fig)
    made["csr"] = "figures/csr.png"

    # diagnostic heatmap
    import numpy as np

    grid = np.array([[row["shares"].get(c, 0.0) or 0.0 for row in overall["heatmap"]] for c in CATEGORIES])
    fig, ax = plt.subplots(figsize=(6, 3.4), dpi=110)
    im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=1)
    ax.set_yticks(range(len(CATEGORIES)), CATEGORIES, fontsize=7)
    ax.set_xticks(hs, [f"{h}\n(n={overall['heatmap'][h]['unsolved']})" for h in hs], fontsize=7)
    ax.set_xlabel("after step h (unsolved tasks)")
    ax.set_title("Diagnostic category among unsolved tasks")
    fig.colorbar(im, ax=ax, fraction=0.04)
    fig.tight_layout()
    fig.savefig(folder / "heatmap.png"), plt.close(fig)
    made["heatmap"] = "figures/heatmap.png"

    # solvability vs faithful
    names = list(fams) + ["all"]
    blocks = [fams[f] for f in fams] + [overall]
    fig, ax = plt.subplots(figsize=(max(4.5, 1.1 * len(names) + 2), 3.4), dpi=110)
    x = np.arange(len(names))
    sv = [100 * (b["success"]["value"] or 0) for b in blocks]
    fv = [100 * (b["faithful"]["value"] or 0) for b in blocks]
    ax.bar(x - 0.2, sv, 0.4, label="solvability")
    ax.bar(x + 0.2, fv, 0.4, label="faithful success")
    ax.set_xticks(x, names, fontsize=7, rotation=15)
    ax.set_ylim(0, 105), ax.set_ylabel("%"), ax.legend(fontsize=7)
    ax.set_title("Solvability vs faithful success per set")
    fig.tight_layout()
    fig.savefig(folder / "faithful.png"), plt.close(fig)
    made["faithful"] = "figures/faithful.png"

    # Judge violins over the pooled candidates (every spec an episode wrote)
    if overall.get("judge") and traces is not None:
        from omtr.evaluation.metrics import _group, judge_candidates

        recs = [r for r in traces if r.get("kind", "planning") == "planning"]
        groups: dict[str, list[float]] = {"U": [], "D": [], "F": []}
        for _, score, g in judge_candidates(recs, [_group(r) for r in recs])["pooled"]:
            groups[g].append(score)
        data = [(g, v) for g, v in groups.items() if v]
        if data:
            fig, ax = plt.subplots(figsize=(4.5, 3.2), dpi=110)
            ax.violinplot([v for _, v in data], showmeans=True)
            ax.set_xticks(range(1, len(data) + 1), [f"{g} (n={len(v)})" for g, v in data])
            ax.set_ylim(0, 1), ax.set_ylabel("Judge score")
            ax.set_title("Judge scores of all candidates: unsolved / drift / faithful")
            fig.tight_layout()
            fig.savefig(folder / "judge.png"), plt.close(fig)
            made["judge"] = "figures/judge.png"
    return made


# ------------------------------------------------------------------------------------- HTML

CSS = """body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;margin:8px 0 16px;font-size:13px}th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}.big{font-size:15px}
img{max-width:100%;border:1px solid #eee;margin:6px 0}.figs{display:grid;grid-template-columns:1fr 1fr;gap:12px}
.note{color:#666;font-size:12px}"""


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "") -> str:
    th = "".join(f"<th>{html.escape(str(h))}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _family_rows(metrics: dict) -> list[list[str]]:
    rows = []
    for f, b in (metrics.get("families") or {}).items():
        rows.append([f, b["tasks"], _ci(b["success"]), _ci(b["faithful"]), _ci(b["drift"]), _ci(b["gap"]),
                     b["calls"]["value"]])
    o = metrics.get("overall")
    if o:
        rows.append(["all", o["tasks"], _ci(o["success"]), _ci(o["faithful"]), _ci(o["drift"]), _ci(o["gap"]),
                     o["calls"]["value"]])
    return rows


def _auc(a: dict | None) -> str:
    if not a or a.get("value") is None:
        return "–"
    lo, hi = a.get("ci") or [None, None]
    return f"{a['value']:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None else "")


def _img(out: Path, rel: str) -> str:
    data = base64.b64encode((out / rel).read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(rel)}" src="data:image/png;base64,{data}">'


def render_html(metrics: dict, out: Path) -> str:
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>omtr evaluation: "
             f"{html.escape(str(metrics.get('policy')))}</title><style>{CSS}</style></head><body>"]
    parts.append(f"<h1>omtr evaluation: {html.escape(str(metrics.get('policy')))}</h1>")
    parts.append(_table(["success", "faithful", "drift", "calls", "tasks", "budget K"], [[
        _pct(metrics.get("success")), _pct(metrics.get("faithful")), _pct(metrics.get("drift")),
        metrics.get("calls") if metrics.get("calls") is not None else "–", metrics.get("tasks"), metrics.get("budget")]],
        "big"))
    parts.append("<p class='note'>Rates in %, with bootstrap 95% intervals in brackets. Drift is among solved "
                 "tasks; faithful success and the gap are over tasks with a reference.</p>")
    o = metrics.get("overall")
    if o:
        parts.append("<h2>Success, faithful success, drift and gap per set [Tables 1, 3]</h2>")
        parts.append(_table(["set", "tasks", "success", "faithful", "drift", "gap", "calls"], _family_rows(metrics)))
        avg = metrics.get("paper_average") or {}
        if avg.get("sets") and avg.get("complete"):
            parts.append(f"<p>{html.escape(avg['name'])}: success {_pct(avg['success'])}%, faithful "
                         f"{_pct(avg['faithful'])}%, over {html.escape(', '.join(avg['sets'].values()))}</p>")
        elif avg.get("sets"):
            parts.append(f"<p>{html.escape(avg['name'])}: not reported, missing {html.escape(', '.join(avg['missing']))} "
                         f"(mean over {html.escape(', '.join(avg['sets'].values()))}: success "
                         f"{_pct(avg['partial_success'])}%)</p>")
        parts.append("<h2>Planetarium's rates: parseable, solvable, equivalent</h2>")
        rows = [[f, b["tasks"]] + [_ci(b["planetarium"][k]) for k in ("parseable", "solvable", "equivalent")]
                for f, b in (metrics.get("families") or {}).items()]
        rows.append(["all", o["tasks"]] + [_ci(o["planetarium"][k]) for k in ("parseable", "solvable", "equivalent")])
        parts.append(_table(["set", "tasks", "parseable", "solvable", "equivalent"], rows))
        parts.append("<p class='note'>Over final specs: parseable = the PDDL parses; solvable = a plan VAL "
                     "accepts (success); equivalent = the reference checker finds no drift (faithful success).</p>")
        parts.append("<h2>Cumulative success within h repairs, and the gain of each repair [Figure 3, left]</h2>")
        parts.append(_table(["h"] + [str(c["h"]) for c in o["csr"]],
                            [["CSR(h)"] + [_ci(c) for c in o["csr"]],
                             ["Δ(h)"] + ["–"] + [_pct(d["value"]) for d in o["delta"]]]))
        parts.append("<h2>Drift categories among solved specs [Table 4, right]</h2>")
        dc = o.get("drift_categories") or {}
        parts.append(_table(["category", "count", "share"], [[c, v["count"], _pct(v["share"])] for c, v in dc.items()])
                     if dc else "<p>No drift.</p>")
        parts.append("<h2>Dominant diagnostic among unsolved tasks after each step [Figure 3, right]</h2>")
        parts.append(_table(["h", "unsolved", "dominant"], [[r["h"], r["unsolved"], r["dominant"] or "–"] for r in o["heatmap"]]))
        parts.append("<h2>Planner limits (counted as failed calls)</h2>")
        rows = [[f, b["tasks"]] + [b["limits"][k] for k in ("timed_out", "memory_out", "too_large", "tasks", "final")]
                for f, b in (metrics.get("families") or {}).items()]
        parts.append(_table(["set", "tasks", "time-outs", "memory-outs", "too large", "tasks hit", "final call hit"], rows))
        parts.append(f"<p>Solved final specs identical to their reference (no mapping search): "
                     f"{metrics.get('identical_to_reference', 0)} of {o['success']['k']}.</p>")
        parts.append("<h2>Judge scores by post-hoc group, and F-vs-D AUC [Table 5]</h2>")
        j = o.get("judge")
        if j:
            rows = []
            for pool, label in (("pooled", "all candidates (paper)"), ("actor", "Actor's specs")):
                b = j[pool]
                rows.append([label] + [f"{b[g]['mean']}±{b[g]['sd']} (n={b[g]['n']})" if b[g]["n"] else "–"
                                       for g in ("U", "D", "F")] + [_auc(b["auc"])])
            parts.append(_table(["candidates", "U", "D", "F", "AUC F vs D"], rows))
        else:
            parts.append("<p>This policy has no Judge.</p>")
    t = metrics.get("transfer")
    if t:
        parts.append("<h2>Zero-shot transfer: exact match [Table 1, transfer columns]</h2>")
        rows = [[f, b["tasks"], _ci(b["exact_match"])] for f, b in t["families"].items()]
        rows.append(["all", t["overall"]["tasks"], _ci(t["overall"]["exact_match"])])
        parts.append(_table(["benchmark", "tasks", "exact match"], rows))
    pg = metrics.get("plan_generation")
    if pg:
        parts.append("<h2>Plan generation (PlanBench's protocol): plans VAL accepts on the reference</h2>")
        rows = [[f, b["tasks"], _ci(b["valid"]), b["read"], b["skipped_lines"]] for f, b in pg["families"].items()]
        o2 = pg["overall"]
        rows.append(["all", o2["tasks"], _ci(o2["valid"]), o2["read"], o2["skipped_lines"]])
        parts.append(_table(["set", "tasks", "valid plans", "answers with a plan", "lines skipped"], rows))
    pv = metrics.get("provenance")
    if pv:
        parts.append("<h2>Provenance</h2>")
        parts.append(_table(["field", "value"], [[k, json.dumps(v, sort_keys=True)] for k, v in pv.items()]))
    figs = metrics.get("figures") or {}
    if figs:
        parts.append("<h2>Figures</h2><div class='figs'>")
        parts.extend(_img(out, rel) for rel in figs.values() if (out / rel).exists())
        parts.append("</div>")
    tm = metrics.get("timing") or {}
    if tm:
        parts.append("<h2>Time</h2>" + _table(list(tm), [[tm[k] for k in tm]]))
    parts.append("</body></html>")
    return "".join(parts)


def write_report(metrics: dict, out: Path) -> Path:
    path = out / "report.html"
    path.write_text(render_html(metrics, out), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------- compare

class CompareError(ValueError):
    """Evaluations that cannot be compared (other tasks, budget or solver config); one line says which."""


def load_metrics(folder: str | Path) -> dict:
    p = Path(folder) / "metrics.json"
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no metrics.json (is {folder} an `omtr evaluate` output folder?)")
    return json.loads(p.read_text(encoding="utf-8"))


def check_comparable(runs: Sequence[tuple[str, dict]]) -> None:
    """Refuse runs over different task sets, budgets or solver configs (folder, metrics) pairs."""
    for folder, m in runs:
        if not m.get("provenance"):
            raise CompareError(f"{folder}: metrics.json has no provenance (an older omtr wrote it); rerun the "
                               "evaluation to compare it")
    (fa, ma), rest = runs[0], runs[1:]
    pa = ma["provenance"]
    for fb, mb in rest:
        pb = mb["provenance"]
        ta, tb = pa.get("tasks") or {}, pb.get("tasks") or {}
        if ta.get("task_set") != tb.get("task_set"):
            raise CompareError(f"{fa} and {fb} were run on different task sets ({ta.get('count')} vs {tb.get('count')} "
                               "tasks, or the same ids with other text); compare runs over the same tasks")
        if pa.get("budget") != pb.get("budget"):
            raise CompareError(f"{fa} and {fb} have different budgets (K={pa.get('budget')} vs K={pb.get('budget')}); "
                               "compare runs under the same budget")
        sa, sb = pa.get("solver") or {}, pb.get("solver") or {}
        if sa != sb:
            diff = ", ".join(f"{k} {sa.get(k)!r} vs {sb.get(k)!r}" for k in sorted(set(sa) | set(sb)) if sa.get(k) != sb.get(k))
            raise CompareError(f"{fa} and {fb} have different solver configs ({diff}); compare runs under the same "
                               "solver config")


def _diff(d: dict, pct: bool = True) -> str:
    if d.get("diff") is None:
        return "–"
    f = (lambda x: f"{100 * x:+.1f}") if pct else (lambda x: f"{x:+.2f}")
    lo, hi = d.get("ci") or [None, None]
    return f(d["diff"]) + (f" [{f(lo)}, {f(hi)}]" if lo is not None else "")


def comparison_tables(runs: Sequence[tuple[str, dict]], differences: Sequence[tuple[str, dict]] = ()
                      ) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) for each table, one row per run; ``differences`` are (name, paired
    differences against the first run)."""
    fams = sorted({f for _, m in runs for f in (m.get("families") or {})}, key=_set_order)
    tables = []
    rows = []
    for name, m in runs:
        fb = m.get("families") or {}
        rows.append([name] + [_pct(fb[f]["success"]["value"]) if f in fb else "–" for f in fams]
                    + [_pct((m.get("paper_average") or {}).get("success")), _pct(m.get("success")),
                       str(m.get("calls") if m.get("calls") is not None else "–")])
    tables.append(("Success per set (%)", ["run"] + fams + ["paper avg (BW, MBW, Log., Gripper)", "all", "calls"], rows))
    rows = [[name, _pct(m.get("success")), _pct(m.get("faithful")), _pct(m.get("drift")),
             _pct(((m.get("overall") or {}).get("gap") or {}).get("value")),
             str(m.get("identical_to_reference", "–"))] for name, m in runs]
    tables.append(("Solvability, faithful success, drift, gap (%)",
                   ["run", "solvability", "faithful", "drift", "gap", "identical to reference"], rows))
    rows = [[name] + [_pct((((m.get("overall") or {}).get("planetarium") or {}).get(k) or {}).get("value"))
                      for k in ("parseable", "solvable", "equivalent")] for name, m in runs]
    tables.append(("Planetarium's rates (%)", ["run", "parseable", "solvable", "equivalent"], rows))
    rows = [[name] + [_pct(c["value"]) for c in ((m.get("overall") or {}).get("csr") or [])] for name, m in runs]
    tables.append(("Cumulative success within h repairs, CSR(h) (%)", ["run"] + [f"h={h}" for h in range(MAX_H + 1)], rows))
    rows = []
    for name, m in runs:
        j = (m.get("overall") or {}).get("judge")
        if not j:
            rows.append([name] + ["–"] * 5)
            continue
        rows.append([name] + [f"{j[g]['mean']}±{j[g]['sd']}" if j[g]["n"] else "–" for g in ("U", "D", "F")]
                    + [_auc((j.get("pooled") or {}).get("auc")), _auc((j.get("actor") or {}).get("auc"))])
    tables.append(("Judge scores of all candidates (mean±sd) and F-vs-D AUC",
                   ["run", "U", "D", "F", "AUC (all candidates)", "AUC (Actor's specs)"], rows))
    rows = [[name] + [str(((m.get("limits") or {}).get(k, "–"))) for k in ("timed_out", "memory_out", "too_large")]
            for name, m in runs]
    tables.append(("Planner limits (failed calls)", ["run", "time-outs", "memory-outs", "too large"], rows))
    if any(m.get("transfer") for _, m in runs):
        tf = sorted({f for _, m in runs for f in ((m.get("transfer") or {}).get("families") or {})})
        rows = [[name] + [_pct((((m.get("transfer") or {}).get("families") or {}).get(f) or {}).get("exact_match", {}).get("value"))
                          for f in tf] for name, m in runs]
        tables.append(("Transfer exact match (%)", ["run"] + tf, rows))
    if differences:
        from omtr.evaluation.metrics import PAIRED_RATES

        base = runs[0][0]
        n = differences[0][1]["shared"]
        if n:
            rows = [[name] + [_diff(d[k], pct=k != "calls") for k in PAIRED_RATES] for name, d in differences]
            tables.append((f"Differences against {base}: points, paired bootstrap 95% over {n} shared tasks",
                           ["run"] + [f"Δ {k}" for k in PAIRED_RATES], rows))
        if any("plan_valid" in d for _, d in differences):
            rows = [[name, _diff(d["plan_valid"]) if "plan_valid" in d else "–",
                     str((d.get("plan_valid") or {}).get("shared", 0))] for name, d in differences]
            tables.append((f"Plan generation: difference of VAL-valid plans against {base} (points, paired bootstrap 95%)",
                           ["run", "Δ valid plans", "shared tasks"], rows))
    if any(m.get("plan_generation") for _, m in runs):
        rows = [[name, _pct((((m.get("plan_generation") or {}).get("overall") or {}).get("valid") or {}).get("value"))]
                for name, m in runs]
        tables.append(("Plan generation: VAL-valid plans (%)", ["run", "valid plans"], rows))
    return tables


def compare(folders: Sequence[str | Path], *, names: Sequence[str] | None = None, bootstrap: int = 1000,
            seed: int = 0) -> tuple[str, str]:
    """(HTML, Markdown) of several evaluations side by side; raises :class:`CompareError` for runs
    that cannot be compared."""
    from omtr.evaluation.metrics import paired_differences

    loaded = [(str(f), load_metrics(f)) for f in folders]
    check_comparable(loaded)
    runs = [(names[i] if names and i < len(names) else str(m.get("policy") or Path(f).name), m)
            for i, (f, m) in enumerate(loaded)]
    differences = []
    if len(folders) > 1:
        base = read_traces(Path(folders[0]) / TRACES)
        for (name, _), f in zip(runs[1:], folders[1:]):
            other = read_traces(Path(f) / TRACES)
            differences.append((name, paired_differences(base, other, bootstrap=bootstrap, seed=seed)))
    tables = comparison_tables(runs, differences)
    md = ["# omtr evaluation: comparison", ""]
    h = [f"<!doctype html><html><head><meta charset='utf-8'><title>omtr comparison</title><style>{CSS}</style></head>"
         "<body><h1>omtr evaluation: comparison</h1>"]
    for title, head, rows in tables:
        md += [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        md += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows] + [""]
        h.append(f"<h2>{html.escape(title)}</h2>" + _table(head, rows))
    h.append("</body></html>")
    return "".join(h), "\n".join(md)
