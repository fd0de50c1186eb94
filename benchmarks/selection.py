"""``--select invariants`` against greedy at the same planner-call budget, on held-out tasks. Measured.

    flock /tmp/omtr-heavy.lock .venv/bin/python benchmarks/selection.py --out docs/results/select-2026-12-03.json
    .venv/bin/python benchmarks/selection.py --generated 1 --per-family 1 --budget 2 --out /tmp/sel.json  # a tiny run

Tasks, domain given (as ``omtr tasks generate|import-planbench --given-domain``): ``--generated``
generated tasks of each of BlocksWorld and Gripper (seed ``--seed``, test split, 2-4 objects) and
``--per-family`` PlanBench tasks of each of ``--planbench``'s families (drawn with ``--seed``). The
default seed, 5407, was not used to tune anything (the signals were measured on seed 9301).

The untrained model (``--model small``: SmolLM2, the fast engine) runs every task twice through
:func:`omtr.inference.select.run_with_select` at budget ``--budget``:

* ``greedy``: today's loop, the Actor's greedy spec then Editor repairs while it fails;
* ``invariants``: the greedy spec, then Actor samples at 0.7 while the answer is unsolved or breaks
  a mutex invariant of the given domain, the best candidate answered.

Each final spec is graded by the checker against the task's reference (the reference is read here
only for that and for the given domain; the policy sees each task's training view). Reported per
mode: planner success, faithful success, drift, calls per task, overall and per set, each with a
bootstrap interval over tasks, and the paired differences (invariants minus greedy) with a paired
bootstrap interval. ``greedy_actor`` (the greedy run's first spec alone, budget 1) is reported beside
them. The JSON is rewritten after each chunk of tasks, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import random
import time
from pathlib import Path

import numpy as np

GENERATED = ("blocksworld", "gripper")
PLANBENCH = ("blocksworld", "mystery_blocksworld")
MODES = ("greedy", "invariants")
log = logging.getLogger("omtr.bench.select")


def build_tasks(args) -> list:
    """Evaluation tasks (with references), domain given; ``meta["set"]`` names each one's set.
    Round-robin over the sets, so that a run cut short keeps every set."""
    from omtr.tasks.generators import generate
    from omtr.tasks.planbench import import_planbench
    from omtr.tasks.planbench_data import shipped_root

    sets: dict[str, list] = {}
    for fam in [f for f in args.generated_families.split(",") if f] if args.generated > 0 else []:
        for t in generate(fam, args.generated, args.seed, split="test", min_objects=2, max_objects=4, verify=False):
            sets.setdefault(f"generated/{fam}", []).append(
                dataclasses.replace(t.with_given_domain(), id="gen-" + t.id, meta={**t.meta, "set": f"generated/{fam}"}))
    rng = random.Random(args.seed)
    for fam in [f for f in args.planbench.split(",") if f] if args.per_family > 0 else []:
        pool = import_planbench(shipped_root(), [fam])
        for t in rng.sample(pool, min(args.per_family, len(pool))):
            sets.setdefault(f"planbench/{fam}", []).append(
                dataclasses.replace(t.with_given_domain(), meta={**t.meta, "set": f"planbench/{fam}"}))
    out, queues = [], [list(v) for v in sets.values()]
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def grade(task, ep) -> dict:
    """The episode's outcome: success, faithful (the checker against the reference), calls, and
    under selection what was chosen."""
    from omtr.evaluation.run import faithfulness

    j = ep.to_json()
    f = faithfulness(task, j)
    rec = {"success": bool(j["success"]), "faithful": bool(f.get("faithful")), "calls": j["planner_calls"],
           "category": j["final_category"], "drift": (f.get("categories") or [None])[0] if j["success"] and
           not f.get("faithful") else None, "empty_plan": bool(j["success"] and not j["plan"]),
           "actor_success": bool(j["actor_success"]), "problem": j["problem"]}
    if "selection" in j:
        s = j["selection"]
        rec["selection"] = {k: s[k] for k in ("candidates", "selected", "reason", "broken", "solved", "accepted",
                                              "agreement")}
    return rec


def greedy_actor(task, ep) -> dict:
    """The greedy run's first spec alone (what budget 1 would have answered)."""
    from omtr.evaluation.run import faithfulness

    s = ep.steps[0]
    ok = bool(s.verdict.success)
    f = faithfulness(task, {"success": ok, "domain": s.domain, "problem": s.problem, "plan": s.verdict.plan}) if ok else {}
    return {"success": ok, "faithful": bool(f.get("faithful"))}


def _ci(values: np.ndarray, idx: np.ndarray | None) -> list:
    if idx is None or not len(values):
        return [None, None]
    means = values[idx].mean(axis=1)
    return [round(float(np.percentile(means, q)), 4) for q in (2.5, 97.5)]


def summarise(records: list[dict], *, bootstrap: int, seed: int) -> dict:
    n = len(records)
    if not n:
        return {"tasks": 0}
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(bootstrap, n)) if bootstrap else None

    def block(recs, ix) -> dict:
        out: dict = {"tasks": len(recs)}
        for mode in (*MODES, "greedy_actor"):
            m: dict = {}
            for key in ("success", "faithful") + (("calls",) if mode != "greedy_actor" else ()):
                v = np.array([float(r[mode][key]) for r in recs])
                m[key] = {"value": round(float(v.mean()), 4), "ci": _ci(v, ix)}
            solved = [r[mode] for r in recs if r[mode]["success"]]
            m["drift"] = round(sum(not r["faithful"] for r in solved) / len(solved), 4) if solved else None
            m["solved"], m["faithful_count"] = len(solved), sum(r[mode]["faithful"] for r in recs)
            out[mode] = m
        for key in ("faithful", "success", "calls"):
            d = np.array([float(r["invariants"][key]) - float(r["greedy"][key]) for r in recs])
            out.setdefault("paired_invariants_minus_greedy", {})[key] = {"value": round(float(d.mean()), 4),
                                                                         "ci": _ci(d, ix)}
        d = np.array([float(r["invariants"]["faithful"]) - float(r["greedy_actor"]["faithful"]) for r in recs])
        out["paired_invariants_minus_greedy_actor"] = {"faithful": {"value": round(float(d.mean()), 4), "ci": _ci(d, ix)}}
        return out

    summary = {"overall": block(records, idx), "sets": {}}
    for s in sorted({r["set"] for r in records}):
        recs = [r for r in records if r["set"] == s]
        k = len(recs)
        six = np.random.default_rng(seed).integers(0, k, size=(bootstrap, k)) if bootstrap else None
        summary["sets"][s] = block(recs, six)
    sel = [r["invariants"]["selection"] for r in records]
    summary["selection"] = {
        "candidates_per_task": round(sum(s["candidates"] for s in sel) / n, 3),
        "greedy_kept": sum(s["selected"] == 0 for s in sel),
        "stopped_at_greedy": sum(s["candidates"] == 1 and s["accepted"] for s in sel),
        "accepted": sum(bool(s["accepted"]) for s in sel),
        "chosen_solved_broken": sum(bool(s["solved"][s["selected"]] and s["broken"][s["selected"]]) for s in sel),
        "agreement_used": sum(s["agreement"] is not None for s in sel),
        "greedy_solved_but_broken": sum(bool(s["solved"][0] and s["broken"][0]) for s in sel),
    }
    return summary


def table(summary: dict) -> str:
    o = summary["overall"]
    lines = [f"{o['tasks']} tasks", f"{'mode':<14}{'success':>22}{'faithful':>22}{'calls':>20}{'drift':>8}"]

    def cell(m, k):
        v = m[k]
        return f"{v['value']:.3f} [{v['ci'][0]}, {v['ci'][1]}]" if v["ci"][0] is not None else f"{v['value']:.3f}"

    for mode in (*MODES, "greedy_actor"):
        m = o[mode]
        lines.append(f"{mode:<14}{cell(m, 'success'):>22}{cell(m, 'faithful'):>22}"
                     f"{cell(m, 'calls') if 'calls' in m else '1':>20}{m['drift'] if m['drift'] is not None else '-':>8}")
    p = o["paired_invariants_minus_greedy"]
    lines.append("invariants - greedy: " + ", ".join(f"{k} {v['value']:+.3f} {v['ci']}" for k, v in p.items()))
    q = o["paired_invariants_minus_greedy_actor"]["faithful"]
    lines.append(f"invariants - greedy Actor alone: faithful {q['value']:+.3f} {q['ci']}")
    for s, b in summary["sets"].items():
        lines.append(f"  {s}: {b['tasks']} tasks; faithful greedy {b['greedy']['faithful']['value']:.3f} "
                     f"invariants {b['invariants']['faithful']['value']:.3f}; success greedy "
                     f"{b['greedy']['success']['value']:.3f} invariants {b['invariants']['success']['value']:.3f}; "
                     f"calls {b['greedy']['calls']['value']:.2f} vs {b['invariants']['calls']['value']:.2f}")
    lines.append(f"selection: {summary['selection']}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--generated", type=int, default=6, help="generated tasks per family")
    ap.add_argument("--generated-families", default=",".join(GENERATED))
    ap.add_argument("--per-family", type=int, default=4, help="PlanBench tasks per family")
    ap.add_argument("--planbench", default=",".join(PLANBENCH), help="PlanBench families (comma-separated)")
    ap.add_argument("--budget", type=int, default=4, help="planner calls per task, both modes")
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--batch", type=int, default=8, help="generation batch")
    ap.add_argument("--chunk", type=int, default=8, help="tasks run (both modes) and graded together")
    ap.add_argument("--engine", default="fast")
    ap.add_argument("--model", default="small", help="model profile or directory (micro: a smoke test of the code)")
    ap.add_argument("--seed", type=int, default=5407, help="task seed (generation, PlanBench draw); sampling seed too")
    ap.add_argument("--bootstrap", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--minutes", type=float, default=0.0, help="start no new chunk after this many minutes (0: none)")
    ap.add_argument("--out", required=True, help="JSON file (rewritten after every chunk)")
    ap.add_argument("--summarise-only", action="store_true", help="recompute the summary of --out's records")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    outp = Path(args.out)
    if args.summarise_only:
        result = json.loads(outp.read_text())
        result["summary"] = summarise(result["records"], bootstrap=args.bootstrap, seed=args.seed)
        outp.write_text(json.dumps(result, indent=1) + "\n")
        print(table(result["summary"]))
        return

    import torch

    torch.set_num_threads(args.threads)
    from omtr.config import SolverConfig
    from omtr.inference.select import run_with_select
    from omtr.model import load_model
    from omtr.policy import Sampling
    from omtr.rollout import make_engine
    from omtr.solver import SolverPool

    t0 = time.time()
    tasks = build_tasks(args)
    views = [t.for_training() for t in tasks]  # what the policy sees: no reference
    log.info("%d tasks: %s", len(tasks), {s: sum(t.meta["set"] == s for t in tasks)
                                          for s in sorted({t.meta["set"] for t in tasks})})
    model = load_model(args.model)
    model.eval()
    engine = make_engine(args.engine, model)
    outp.parent.mkdir(parents=True, exist_ok=True)
    result: dict = {"settings": vars(args), "seconds": {}, "records": []}
    spent = {m: 0.0 for m in MODES}
    sampling = Sampling(greedy=True, max_new_tokens=args.max_new_tokens)
    with SolverPool(1, SolverConfig(time_limit_s=20.0, memory_limit_mb=2048)) as pool:
        for c0 in range(0, len(tasks), args.chunk):
            if args.minutes and time.time() - t0 > 60 * args.minutes:
                result["stopped_early"] = {"measured": len(result["records"]), "left": len(tasks) - c0}
                log.info("time budget spent: %d of %d tasks measured", c0, len(tasks))
                break
            ctasks, cviews = tasks[c0:c0 + args.chunk], views[c0:c0 + args.chunk]
            eps = {}
            for mode in MODES:
                t = time.time()
                samp = sampling if mode == "greedy" else dataclasses.replace(sampling, seed=args.seed + c0)
                eps[mode] = run_with_select(mode, cviews, engine, pool, budget=args.budget, sampling=samp,
                                            batch_size=args.batch, judge=False)
                spent[mode] += time.time() - t
            for i, task in enumerate(ctasks):
                rec = {"id": task.id, "set": task.meta["set"],
                       "greedy": grade(task, eps["greedy"][i]), "invariants": grade(task, eps["invariants"][i]),
                       "greedy_actor": greedy_actor(task, eps["greedy"][i])}
                result["records"].append(rec)
                g, s = rec["greedy"], rec["invariants"]
                log.info("%s [%s]: greedy %s/%s in %d, invariants %s/%s in %d (chose %d: %s)", task.id, rec["set"],
                         "S" if g["success"] else "-", "F" if g["faithful"] else "-", g["calls"],
                         "S" if s["success"] else "-", "F" if s["faithful"] else "-", s["calls"],
                         s["selection"]["selected"], s["selection"]["reason"])
            result["seconds"] = {**{m: round(v, 1) for m, v in spent.items()}, "total": round(time.time() - t0, 1)}
            result["summary"] = summarise(result["records"], bootstrap=args.bootstrap, seed=args.seed)
            outp.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result["summary"]))


if __name__ == "__main__":
    main()
