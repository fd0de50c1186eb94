"""The statement rules on the model: success, faithful success and which rules applied, before and after.

    python benchmarks/statement_rules.py --out docs/results/statement-rules.json \
        --variant after=. --variant before=/tmp/before        # a worktree of the earlier commit

Builds one task sample (``--per-family`` PlanBench tasks of every family, drawn with ``--seed``, and
``--generated`` tasks of every generator family, test split, seed ``--seed``; domain-given, or with
``--mode full`` the model writes the domain too), then
runs ``omtr evaluate --policy model`` (untrained model, greedy, the fast engine) once per variant:
``NAME=DIR`` runs the ``omtr`` whose sources are in ``DIR/src`` on the same tasks, and
``NAME=DIR@MODEL`` runs it with another model (a trained model's directory) instead of ``--model``. With
``--budget 6`` one run gives both budgets: the Actor's step is the budget-1 answer (greedy), so
success and faithful success at budget 1 are read from each episode's first step. Prints, per
family and variant, success and faithful success at budget 1 and at the budget, drift, and the
rule sets the episodes ran under, the checker's categories of the solved-but-unfaithful answers,
and the Judge's AUC between faithful and solved-but-unfaithful Actor answers (pooled over the
families, with a bootstrap interval), and writes them as JSON.

``--judge-pool DIR...`` runs no model: it pools the solved Actor answers of evaluations already run
(their ``traces.jsonl``) by the same model under different decoders, since scoped decoding leaves
almost no solved-but-unfaithful answer and the statement's names alone leave almost no faithful one,
and reports the Judge's AUC between faithful and solved-but-unfaithful answers over the pool and
within tasks (pairs of one task only: what choosing among a task's answers needs):

    python benchmarks/statement_rules.py --judge-pool out/trained-b1-... out/trained-names-b1-... --out pool.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

PLANBENCH = ("blocksworld", "mystery_blocksworld", "logistics", "depots")
GENERATED = ("blocksworld", "mystery_blocksworld", "gripper", "logistics")


def build_tasks(path: Path, per_family: int, generated: int, seed: int, families=PLANBENCH,
                generated_families=GENERATED, mode: str = "domain-given") -> list[str]:
    from omtr.tasks.generators import generate
    from omtr.tasks.planbench import import_planbench
    from omtr.tasks.planbench_data import shipped_root

    rng = random.Random(seed)
    rows = []
    for fam in PLANBENCH:  # every family draws, so a family's tasks are the same whichever are kept
        pool = import_planbench(shipped_root(), [fam])
        drawn = rng.sample(pool, min(per_family, len(pool)))
        if fam not in families:
            continue
        for t in drawn:
            rows.append({**t.to_json(), "domain": t.reference.domain} if mode == "domain-given" else t.to_json())
    for fam in GENERATED:
        if generated <= 0 or fam not in generated_families:
            continue
        for t in generate(fam, generated, seed, split="test", min_objects=2, max_objects=4, verify=False):
            d = t.to_json()
            d["id"] = "gen-" + d["id"]
            rows.append({**d, "domain": t.reference.domain} if mode == "domain-given" else d)
    with path.open("w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    return [r["id"] for r in rows]


def summarise(traces: Path) -> dict:
    out: dict = {}
    judged: list[tuple[float, bool]] = []  # the Judge's score of each solved Actor answer, and whether it is faithful
    for line in traces.read_text().splitlines():
        r = json.loads(line)
        if r.get("kind", "planning") != "planning":
            continue
        fam = ("generated/" if r["id"].startswith("gen-") else "planbench/") + (r.get("family") or "none")
        s = out.setdefault(fam, Counter())
        steps = r.get("steps") or []
        faithful = bool((r.get("faithful") or {}).get("faithful"))
        first_ok = bool(steps) and bool((steps[0].get("verdict") or {}).get("success"))
        s["tasks"] += 1
        s["success_b1"] += first_ok
        s["faithful_b1"] += first_ok and r.get("planner_calls") == 1 and faithful
        s["success"] += bool(r.get("success"))
        s["faithful"] += bool(r.get("success")) and faithful
        s["calls"] += int(r.get("planner_calls") or 0)
        s["rules:" + (r.get("rules") or "(not recorded)")] += 1
        if first_ok and not faithful:
            for c in (r.get("faithful") or {}).get("categories") or ["(none given)"]:
                s["cat:" + c] += 1
        if first_ok and steps[0].get("judge_score") is not None:
            judged.append((float(steps[0]["judge_score"]), faithful))
    res = {}
    for fam, s in sorted(out.items()):
        n = s["tasks"]
        res[fam] = {"tasks": n, **{k: s[k] for k in ("success_b1", "faithful_b1", "success", "faithful", "calls")},
                    "drift": round(1 - s["faithful"] / s["success"], 3) if s["success"] else None,
                    "rules": {k[6:]: v for k, v in s.items() if k.startswith("rules:")},
                    "unfaithful_categories": {k[4:]: v for k, v in s.items() if k.startswith("cat:")}}
    tot = Counter()
    for v in res.values():
        tot.update({k: v[k] for k in ("tasks", "success_b1", "faithful_b1", "success", "faithful", "calls")})
    res["all"] = dict(tot)
    res["judge_auc_fd"] = judge_auc(judged)
    return res


def judge_auc(pairs: list[tuple[float, bool]], boot: int = 1000, seed: int = 0) -> dict:
    """AUC of the Judge's score between faithful (positive) and solved-but-unfaithful answers, with
    a seeded bootstrap 95% interval over the answers; None where either side is empty."""
    pos = [s for s, f in pairs if f]
    neg = [s for s, f in pairs if not f]

    def auc(p, n):
        if not p or not n:
            return None
        return sum((a > b) + 0.5 * (a == b) for a in p for b in n) / (len(p) * len(n))

    point = auc(pos, neg)
    if point is None:
        return {"auc": None, "faithful": len(pos), "unfaithful": len(neg)}
    rng = random.Random(seed)
    draws = sorted(x for x in (auc([rng.choice(pos) for _ in pos], [rng.choice(neg) for _ in neg])
                               for _ in range(boot)) if x is not None)
    return {"auc": round(point, 3), "low": round(draws[int(0.025 * len(draws))], 3),
            "high": round(draws[int(0.975 * len(draws)) - 1], 3), "faithful": len(pos), "unfaithful": len(neg)}


def judged_answers(traces: Path) -> list[tuple[str, float, bool]]:
    """``(task id, the Judge's score, faithful)`` for each solved Actor answer (first step) of an
    evaluation's traces that carries a Judge score."""
    out = []
    for line in traces.read_text().splitlines():
        r = json.loads(line)
        steps = r.get("steps") or []
        if r.get("kind", "planning") != "planning" or not steps:
            continue
        if (steps[0].get("verdict") or {}).get("success") and steps[0].get("judge_score") is not None:
            out.append((r["id"], float(steps[0]["judge_score"]), bool((r.get("faithful") or {}).get("faithful"))))
    return out


def judge_pool(dirs: list[str]) -> dict:
    """The Judge's AUC over the solved answers of several evaluations of one model (module doc)."""
    answers = [a for d in dirs for a in judged_answers(Path(d) / "traces.jsonl")]
    by_task: dict[str, list] = {}
    for tid, score, faithful in answers:
        by_task.setdefault(tid, []).append((score, faithful))
    pairs = wins = 0.0
    for got in by_task.values():
        for sf, f in got:
            for sd, d in got:
                if f and not d:
                    pairs += 1
                    wins += (sf > sd) + 0.5 * (sf == sd)
    return {"evaluations": dirs, "pooled": judge_auc([(s, f) for _, s, f in answers]),
            "within_task": {"auc": round(wins / pairs, 3) if pairs else None, "pairs": int(pairs),
                            "tasks": sum(1 for g in by_task.values() if {f for _, f in g} == {True, False})}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=DIR",
                    help="a variant: the omtr in DIR/src (repeatable; default after=.)")
    ap.add_argument("--per-family", type=int, default=20, help="PlanBench tasks per family")
    ap.add_argument("--generated", type=int, default=8, help="generated tasks per generator family")
    ap.add_argument("--seed", type=int, default=5519, help="sample seed (not a seed any rule was tuned on; 3401 was looked at)")
    ap.add_argument("--budget", type=int, default=1)
    ap.add_argument("--families", default=",".join(PLANBENCH), help="PlanBench families (comma-separated)")
    ap.add_argument("--generated-families", default=",".join(GENERATED), help="generator families (comma-separated)")
    ap.add_argument("--mode", choices=("domain-given", "full"), default="domain-given",
                    help="domain-given (the reference's domain comes with each task) or full (the model writes it)")
    ap.add_argument("--decoding", choices=("scoped", "plain", "off"),
                    help="the decoding constraint (default: the model's, scoped); plain gives the Judge "
                         "solved-but-unfaithful answers to tell apart where scoped decoding leaves none")
    ap.add_argument("--model", default="small")
    ap.add_argument("--work", default="out/statement-rules", help="folder for the task file and the evaluations")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--judge-pool", nargs="+", metavar="DIR",
                    help="no model run: the Judge's AUC over these evaluations' solved answers (module doc)")
    args = ap.parse_args(argv)
    if args.judge_pool:
        res = judge_pool(args.judge_pool)
        print(f"Judge AUC faithful vs solved-but-unfaithful: pooled {res['pooled']}; within tasks {res['within_task']}")
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
        return 0
    variants = [v.split("=", 1) for v in (args.variant or ["after=."])]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    fams = tuple(args.families.split(","))
    full = "-full" if args.mode == "full" else ""
    tasks = work / f"tasks-{args.seed}-{'-'.join(fams)}-{args.generated}{full}.jsonl"
    # a family's draw does not depend on the others: the same tasks as in a run over all families
    gfams = tuple(args.generated_families.split(","))
    if gfams != GENERATED:
        tasks = tasks.with_name(tasks.stem + "-" + "-".join(gfams) + ".jsonl")
    ids = build_tasks(tasks, args.per_family, args.generated, args.seed, fams, gfams, args.mode)
    results = {"model": args.model, "budget": args.budget, "seed": args.seed, "per_family": args.per_family,
               "generated_per_family": args.generated, "tasks": len(ids), "mode": args.mode,
               "decoding": f"greedy, fast engine, {args.decoding or 'scoped'}", "variants": {}}
    for name, src in variants:
        src, _, model = src.partition("@")
        model = model or args.model
        dec = f"-{args.decoding}" if args.decoding else ""
        out = work / f"{name}-b{args.budget}-{'-'.join(fams)}-{args.generated}{full}{dec}"
        env = dict(os.environ, PYTHONPATH=str(Path(src).resolve() / "src"))
        cmd = [sys.executable, "-m", "omtr", "evaluate", "--policy", "model", "--model", model,
               "--engine", "fast", "--budget", str(args.budget), "--tasks", str(tasks), "--out", str(out),
               "--no-report", "--bootstrap", "200", "--workers", "1", "--overwrite"]
        if args.decoding:
            cmd += ["--decoding", args.decoding]
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, check=True)
        secs = time.perf_counter() - t0
        summary = summarise(out / "traces.jsonl")
        results["variants"][name] = {"src": src, "model": model, "seconds": round(secs, 1), "families": summary}
        print(f"== {name} ({secs:.0f} s)  Judge AUC faithful vs solved-but-unfaithful: {summary['judge_auc_fd']}")
        for fam, s in summary.items():
            if fam in ("all", "judge_auc_fd"):
                continue
            print(f"  {fam:34s} n={s['tasks']:3d}  b1 success {s['success_b1']:3d} faithful {s['faithful_b1']:3d}  "
                  f"b{args.budget} success {s['success']:3d} faithful {s['faithful']:3d}  rules {s['rules']}")
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
