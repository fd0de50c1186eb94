"""Figures (PNG), the self-contained ``report.html``, and side-by-side comparisons (HTML, Markdown).

Figures: ``csr.png`` (CSR(h) with 95% intervals, Figure 3), ``heatmap.png`` (share of each
diagnostic category among unsolved tasks after each step, Figure 4), ``faithful.png``
(solvability vs faithful success per family, Figure 5) and ``judge.png`` (Judge score violins for
U/D/F, when the policy has a Judge). The report embeds them as data URIs, so the one file can be
mailed or attached to an MLflow run and still shows everything.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any, Sequence

from omtr.evaluation.metrics import CATEGORIES, MAX_H, PLANBENCH_FAMILIES


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
    ax.set_title("Cumulative success within h repairs")
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
    ax.set_title("Solvability vs faithful success")
    fig.tight_layout()
    fig.savefig(folder / "faithful.png"), plt.close(fig)
    made["faithful"] = "figures/faithful.png"

    # Judge violins
    if overall.get("judge") and traces is not None:
        groups: dict[str, list[float]] = {"U": [], "D": [], "F": []}
        for r in traces:
            s = r.get("judge_score")
            if s is None or r.get("kind", "planning") != "planning":
                continue
            f = r.get("faithful") or {}
            g = "U" if not r.get("actor_success") else ("F" if f.get("faithful") else "D" if f.get("checked") else None)
            if g:
                groups[g].append(float(s))
        data = [(g, v) for g, v in groups.items() if v]
        if data:
            fig, ax = plt.subplots(figsize=(4.5, 3.2), dpi=110)
            ax.violinplot([v for _, v in data], showmeans=True)
            ax.set_xticks(range(1, len(data) + 1), [f"{g} (n={len(v)})" for g, v in data])
            ax.set_ylim(0, 1), ax.set_ylabel("Judge score")
            ax.set_title("Judge scores: unsolved / drift / faithful")
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
        parts.append("<h2>Success per family (Tables 1, 3)</h2>")
        parts.append(_table(["family", "tasks", "success", "faithful", "drift", "gap", "calls"], _family_rows(metrics)))
        avg = metrics.get("planbench_average") or {}
        if avg.get("families"):
            parts.append(f"<p>PlanBench average over {', '.join(avg['families'])}: success {_pct(avg['success'])}%, "
                         f"faithful {_pct(avg['faithful'])}%</p>")
        parts.append("<h2>Repair dynamics (Table 2)</h2>")
        parts.append(_table(["h"] + [str(c["h"]) for c in o["csr"]],
                            [["CSR(h)"] + [_ci(c) for c in o["csr"]],
                             ["Δ(h)"] + ["–"] + [_pct(d["value"]) for d in o["delta"]]]))
        parts.append("<h2>Drift categories among solved specs (Table 4)</h2>")
        dc = o.get("drift_categories") or {}
        parts.append(_table(["category", "count", "share"], [[c, v["count"], _pct(v["share"])] for c, v in dc.items()])
                     if dc else "<p>No drift.</p>")
        parts.append("<h2>Dominant diagnostic after each step (Figure 4)</h2>")
        parts.append(_table(["h", "unsolved", "dominant"], [[r["h"], r["unsolved"], r["dominant"] or "–"] for r in o["heatmap"]]))
        parts.append("<h2>Judge (Table 5)</h2>")
        j = o.get("judge")
        if j:
            parts.append(_table(["group", "n", "mean", "sd"], [[g, j[g]["n"], j[g]["mean"], j[g]["sd"]] for g in ("U", "D", "F")]))
            parts.append(f"<p>D-vs-F AUC: {j['auc_f_vs_d'] if j['auc_f_vs_d'] is not None else '–'}</p>")
        else:
            parts.append("<p>This policy has no Judge.</p>")
    t = metrics.get("transfer")
    if t:
        parts.append("<h2>Transfer: exact match (Tables 8, 9)</h2>")
        rows = [[f, b["tasks"], _ci(b["exact_match"])] for f, b in t["families"].items()]
        rows.append(["all", t["overall"]["tasks"], _ci(t["overall"]["exact_match"])])
        parts.append(_table(["benchmark", "tasks", "exact match"], rows))
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

def load_metrics(folder: str | Path) -> dict:
    p = Path(folder) / "metrics.json"
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no metrics.json (is {folder} an `omtr evaluate` output folder?)")
    return json.loads(p.read_text(encoding="utf-8"))


def comparison_tables(runs: Sequence[tuple[str, dict]]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) for each of the paper's tables, one row per run."""
    fams = sorted({f for _, m in runs for f in (m.get("families") or {})},
                  key=lambda f: (f not in PLANBENCH_FAMILIES, PLANBENCH_FAMILIES.index(f) if f in PLANBENCH_FAMILIES else 0, f))
    tables = []
    rows = []
    for name, m in runs:
        fb = m.get("families") or {}
        rows.append([name] + [_pct(fb[f]["success"]["value"]) if f in fb else "–" for f in fams]
                    + [_pct((m.get("planbench_average") or {}).get("success")), _pct(m.get("success")),
                       str(m.get("calls") if m.get("calls") is not None else "–")])
    tables.append(("Success per family (%)", ["run"] + fams + ["PlanBench avg", "all", "calls"], rows))
    rows = [[name, _pct(m.get("success")), _pct(m.get("faithful")), _pct(m.get("drift")),
             _pct(((m.get("overall") or {}).get("gap") or {}).get("value"))] for name, m in runs]
    tables.append(("Solvability, faithful success, drift (%)", ["run", "solvability", "faithful", "drift", "gap"], rows))
    rows = [[name] + [_pct(c["value"]) for c in ((m.get("overall") or {}).get("csr") or [])] for name, m in runs]
    tables.append(("CSR(h) (%)", ["run"] + [f"h={h}" for h in range(MAX_H + 1)], rows))
    rows = []
    for name, m in runs:
        j = (m.get("overall") or {}).get("judge")
        rows.append([name] + ([f"{j[g]['mean']}±{j[g]['sd']}" if j[g]["n"] else "–" for g in ("U", "D", "F")]
                              + [str(j["auc_f_vs_d"]) if j["auc_f_vs_d"] is not None else "–"] if j else ["–"] * 4))
    tables.append(("Judge scores (mean±sd) and D-vs-F AUC", ["run", "U", "D", "F", "AUC"], rows))
    if any(m.get("transfer") for _, m in runs):
        tf = sorted({f for _, m in runs for f in ((m.get("transfer") or {}).get("families") or {})})
        rows = [[name] + [_pct((((m.get("transfer") or {}).get("families") or {}).get(f) or {}).get("exact_match", {}).get("value"))
                          for f in tf] for name, m in runs]
        tables.append(("Transfer exact match (%)", ["run"] + tf, rows))
    return tables


def compare(folders: Sequence[str | Path], *, names: Sequence[str] | None = None) -> tuple[str, str]:
    """(HTML, Markdown) of several evaluations side by side."""
    runs = []
    for i, f in enumerate(folders):
        m = load_metrics(f)
        runs.append((names[i] if names and i < len(names) else str(m.get("policy") or Path(f).name), m))
    tables = comparison_tables(runs)
    md = ["# omtr evaluation: comparison", ""]
    h = [f"<!doctype html><html><head><meta charset='utf-8'><title>omtr comparison</title><style>{CSS}</style></head>"
         "<body><h1>omtr evaluation: comparison</h1>"]
    for title, head, rows in tables:
        md += [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        md += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows] + [""]
        h.append(f"<h2>{html.escape(title)}</h2>" + _table(head, rows))
    h.append("</body></html>")
    return "".join(h), "\n".join(md)
