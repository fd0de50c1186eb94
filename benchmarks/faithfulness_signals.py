"""Which annotation-free signals tell a faithful spec from a solved-but-unfaithful one? Measured.

    flock /tmp/omtr-heavy.lock .venv/bin/python benchmarks/faithfulness_signals.py \
        --out docs/results/faithfulness-signals-2026-12-03.json
    .venv/bin/python benchmarks/faithfulness_signals.py --generated 1 --per-family 1 --out /tmp/s.json  # a tiny run

Held-out tasks, domain given: ``--generated`` generated tasks of BlocksWorld and Gripper (seed
``--seed``, test split, 2-4 objects) and ``--per-family`` PlanBench tasks of each of ``--planbench``'s
families (drawn with ``--seed``), each task's ``domain`` its reference domain (as ``omtr tasks
import-planbench --given-domain`` sets it). The untrained model (``small``, SmolLM2, the fast engine)
writes one greedy answer and ``--samples`` answers at ``--temperature`` per task, budget 1 (the
Actor only); the planner solves each; a solved answer is graded F (the checker finds it equivalent
to the reference) or D (solved, another task). The reference is read here only to give the domain
and by the checker; the policy sees each task's training view, and the signals read only the
English, the given domain and the samples (:mod:`omtr.faithfulness.signals`).

Signals, per solved sample (higher: more likely faithful):

* ``agreement``: its semantic cluster's share of the task's k samples (checker-equivalence between
  generated specs; unsolved samples count against every cluster); ``agreement_solved``: the same
  over the task's solved samples only;
* ``invariants``: minus the number of the given domain's mutex groups (Fast Downward's invariant
  synthesis) its initial state breaks; ``invariants_ok``: 1 when it breaks none, else 0;
* ``reviewer``: (log p(statement | problem) - log p(statement)) per statement token, the backbone
  with adapters off;
* ``judge``: today's Judge (the untrained head), on the Judge's own prompt;
* ``grounded``: the statement-vs-atoms F1 of :mod:`omtr.rl.grounding`;
* ``typed_grounding``: the same F1 with the predicate each clause's words name in the given domain
  (:func:`omtr.faithfulness.signals.typed_grounding`);
* ``clause_reviewer`` / ``clause_reviewer_min``: the reviewer clause by clause, mean and minimum of
  (log p(clause | its atom) - log p(clause)) per token (:func:`~omtr.faithfulness.signals.clause_likelihoods`).

``--rescore`` computes these three from a JSON's stored problems (no generation); ``--markdown``
writes the per-set table (grades, AUC per signal, picking by each signal), each set with its own
bootstrap over its own tasks.

Reported per signal: the AUC between F and D samples (the paper's H.9 pool restricted to the solved
samples; the interval a percentile bootstrap over tasks, samples travelling with their task), overall
and per set; and the faithful success of picking one of the k by the signal (among the solved samples,
ties shared) against greedy, a random solved sample and the oracle (any faithful sample), each with
a bootstrap interval over tasks and the paired difference from a random solved sample. The JSON is
rewritten after every task, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import time
from pathlib import Path

import numpy as np

GENERATED = ("blocksworld", "gripper")
PLANBENCH = ("blocksworld", "mystery_blocksworld", "logistics")
SIGNALS = ("agreement", "agreement_solved", "invariants", "invariants_ok", "reviewer", "judge", "grounded",
           "typed_grounding", "clause_reviewer", "clause_reviewer_min")
# The signals --rescore recomputes from the stored problems (no generation, no planner).
RESCORE = ("typed_grounding", "clause_reviewer", "clause_reviewer_min")
# Combinations computed from the stored signals (no new measurement): the invariant check as a gate,
# then agreement (or the reviewer) to rank what passes it.
COMBOS = {
    "invariants_ok+agreement": ("invariants_ok", "agreement"),
    "invariants_ok+reviewer": ("invariants_ok", "reviewer"),
}
log = logging.getLogger("omtr.signals")


def combined(signals: dict) -> dict:
    """The COMBOS of one sample: the gate (0/1) plus the second signal squashed into [0, 1)."""
    out = {}
    for name, (gate, rank) in COMBOS.items():
        g, r = signals.get(gate), signals.get(rank)
        out[name] = None if g is None or r is None else g + 0.5 + math.atan(r) / math.pi * 0.999
    return out


def build_tasks(args) -> list:
    """Evaluation tasks (with references), domain given, each with ``set`` noted in ``meta``."""
    import dataclasses

    from omtr.tasks.generators import generate
    from omtr.tasks.planbench import import_planbench
    from omtr.tasks.planbench_data import shipped_root

    tasks = []
    for fam in [f for f in args.generated_families.split(",") if f] if args.generated > 0 else []:
        for t in generate(fam, args.generated, args.seed, split="test", min_objects=2, max_objects=4, verify=False):
            tasks.append(dataclasses.replace(t.with_given_domain(), id="gen-" + t.id,
                                             meta={**t.meta, "set": f"generated/{fam}"}))
    rng = random.Random(args.seed)
    for fam in [f for f in args.planbench.split(",") if f] if args.per_family > 0 else []:
        pool = import_planbench(shipped_root(), [fam])
        for t in rng.sample(pool, min(args.per_family, len(pool))):
            tasks.append(dataclasses.replace(t.with_given_domain(), meta={**t.meta, "set": f"planbench/{fam}"}))
    return tasks


def interleave(tasks: list) -> list:
    """Round-robin over the sets, so that a run cut short by ``--minutes`` keeps every set."""
    by: dict[str, list] = {}
    for t in tasks:
        by.setdefault(t.meta["set"], []).append(t)
    out, queues = [], list(by.values())
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


DRIFT: dict[int, str] = {}  # id(step) -> the checker's first finding for a D sample


def grade(task, step) -> str:
    """F, D, or U (unsolved) for one budget-1 answer (a D's first finding kept in ``DRIFT``)."""
    from omtr.evaluation.run import faithfulness

    if step is None or not step.verdict.success:
        return "U"
    rep = faithfulness(task, {"success": True, "domain": step.domain, "problem": step.problem,
                              "plan": step.verdict.plan})
    if not rep.get("faithful"):
        DRIFT[id(step)] = (rep.get("categories") or ["unknown"])[0]
    return "F" if rep.get("faithful") else "D"


def task_signals(task, view, steps, grades, model, scorer) -> dict[str, list]:
    """Every signal of each solved sample of one task (None for unsolved samples)."""
    from omtr.faithfulness import signals as S
    from omtr.inference import prompts as P
    from omtr.rl.grounding import grounding_score

    k = len(steps)
    solved = [g != "U" for g in grades]
    specs = [(s.domain, s.problem) if ok else None for s, ok in zip(steps, solved)]
    t0 = time.perf_counter()
    m = S.equivalence_matrix(specs)
    t_eq = time.perf_counter() - t0
    out: dict[str, list] = {n: [None] * k for n in SIGNALS}
    out["agreement"] = S.agreement(m)
    out["agreement"] = [a if ok else None for a, ok in zip(out["agreement"], solved)]
    out["agreement_solved"] = S.agreement(m, over=solved)
    idx = [i for i in range(k) if solved[i]]
    for i in idx:
        inv = S.invariant_score(view.domain, steps[i].problem)
        out["invariants"][i] = inv
        out["invariants_ok"][i] = None if inv is None else float(inv == 0)
        out["grounded"][i] = grounding_score(view.nl, steps[i].problem)
    t1 = time.perf_counter()
    if idx:
        judged = model.judge([P.judge_messages(view, P.spec_text(steps[i].domain, steps[i].problem, steps[i].text,
                                                                 given=True)) for i in idx])
        for i, s in zip(idx, judged):
            out["judge"][i] = float(s)
    t2 = time.perf_counter()
    if idx and scorer is not None:
        rev = S.reviewer_likelihoods(scorer, view.nl, [steps[i].problem if solved[i] else None for i in range(k)])
        out["reviewer"] = rev
    t3 = time.perf_counter()
    out.update(statement_signals(view, [steps[i].problem if solved[i] else None for i in range(k)], scorer))
    out["_seconds"] = {"equivalence": round(t_eq, 2), "judge": round(t2 - t1, 2), "reviewer": round(t3 - t2, 2),
                       "clauses": round(time.perf_counter() - t3, 2)}
    return out


def statement_signals(view, problems: list, scorer) -> dict[str, list]:
    """The signals that read the statement clause by clause (:data:`RESCORE`), per problem (None:
    an unsolved sample): the predicate-typed grounding F1 and the per-clause reviewer (mean, min)."""
    from omtr.faithfulness import signals as S

    out = {"typed_grounding": [None if p is None else S.typed_grounding(view.nl, view.domain, p) for p in problems]}
    per = (S.clause_likelihoods(scorer, view.nl, view.domain, problems) if scorer is not None
           else [None] * len(problems))
    out["clause_reviewer"] = [None if c is None else c["mean"] for c in per]
    out["clause_reviewer_min"] = [None if c is None else c["min"] for c in per]
    return out


def record(task, greedy_step, steps, grades, sig, secs) -> dict:
    def val(x):
        return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 5)

    return {"id": task.id, "set": task.meta["set"], "greedy": grade(task, greedy_step), "seconds": secs,
            "samples": [{"grade": g, "empty_plan": bool(s is not None and s.verdict.success and not s.verdict.plan),
                         "category": (DRIFT.get(id(s)) if g == "D" else None if s is None or s.verdict.success
                                      or s.verdict.category is None else s.verdict.category.value),
                         "signals": {n: val(sig[n][i]) for n in SIGNALS},
                         "problem": s.problem if s is not None and g != "U" else None}
                        for i, (g, s) in enumerate(zip(grades, steps))]}


def within_task_auc(cands, bs) -> dict:
    """The AUC over F-D pairs of the same task only (what choosing among a task's samples needs; the
    pooled AUC also rewards a signal that only tells easy tasks from hard ones), with a bootstrap
    interval over tasks: ``{"value", "ci", "pairs", "tasks"}``."""
    by: dict[int, tuple[list, list]] = {}
    for ti, v, g in cands:
        by.setdefault(ti, ([], []))[0 if g == "F" else 1].append(v)
    wins, pairs = {}, {}
    for ti, (f, d) in by.items():
        if f and d:
            wins[ti] = sum((a > b) + 0.5 * (a == b) for a in f for b in d)
            pairs[ti] = len(f) * len(d)
    out: dict = {"pairs": int(sum(pairs.values())), "tasks": len(pairs)}
    if not pairs:
        return {**out, "value": None, "ci": [None, None]}
    out["value"] = round(sum(wins.values()) / sum(pairs.values()), 4)
    boots = []
    if bs.idx is not None:
        tis = np.array(sorted(pairs))
        w, p = np.array([wins[t] for t in tis]), np.array([pairs[t] for t in tis])
        for row in bs.idx:
            c = np.bincount(row, minlength=bs.n)[tis]
            if (c * p).sum():
                boots.append(float((c * w).sum() / (c * p).sum()))
    out["ci"] = [round(float(np.percentile(boots, q)), 4) for q in (2.5, 97.5)] if boots else [None, None]
    return out


def summarise(records: list[dict], args) -> dict:
    """Every measure over all the tasks, and the same per set (``per_set``: each with its own bootstrap
    over its own tasks)."""
    out = summary_of(records, args)
    out["per_set"] = {st: summary_of([r for r in records if r["set"] == st], args)
                      for st in sorted({r["set"] for r in records})}
    return out


def summary_of(records: list[dict], args) -> dict:
    from omtr.evaluation.metrics import Bootstrap, auc_rate
    from omtr.faithfulness.signals import choose

    n = len(records)
    bs = Bootstrap(n, args.bootstrap, args.seed)
    out: dict = {"tasks": n, "samples": sum(len(r["samples"]) for r in records)}
    grades = [s["grade"] for r in records for s in r["samples"]]
    out["grades"] = {g: grades.count(g) for g in "UDF"}
    out["empty_plans_solved"] = sum(1 for r in records for s in r["samples"] if s["grade"] != "U" and s["empty_plan"])

    def cands(sig: str):
        c, missing = [], 0
        for ti, r in enumerate(records):
            for s in r["samples"]:
                if s["grade"] == "U":
                    continue
                v = s["signals"].get(sig)
                if v is None:
                    missing += 1
                    continue
                c.append((ti, float(v), s["grade"]))
        return c, missing

    for r in records:
        for smp in r["samples"]:
            smp["signals"].update(combined(smp["signals"]))
    names = list(SIGNALS) + list(COMBOS)
    auc: dict = {}
    for sig in names:
        c, missing = cands(sig)
        a = auc_rate(c, bs)
        a["missing"] = missing
        a["within_task"] = within_task_auc(c, bs)
        f = [v for _, v, g in c if g == "F"]
        d = [v for _, v, g in c if g == "D"]
        a["mean_f"] = round(float(np.mean(f)), 4) if f else None
        a["mean_d"] = round(float(np.mean(d)), 4) if d else None
        auc[sig] = a
    out["auc_f_vs_d"] = auc

    def hits_of(pick) -> np.ndarray:
        return np.array([pick(r) for r in records], dtype=float)

    def is_f(r):
        return [1.0 if s["grade"] == "F" else 0.0 for s in r["samples"]]

    def solved(r):
        return [s["grade"] != "U" for s in r["samples"]]

    def random_solved(r):
        ok = solved(r)
        return sum(f for f, o in zip(is_f(r), ok) if o) / sum(ok) if any(ok) else 0.0

    def by(sig):
        def pick(r):
            w = choose([s["signals"].get(sig) for s in r["samples"]], solved(r))
            return sum(a * b for a, b in zip(w, is_f(r)))
        return pick

    base = {"greedy": hits_of(lambda r: float(r["greedy"] == "F")),
            "random_solved": hits_of(random_solved),
            "oracle_any_faithful": hits_of(lambda r: float(any(is_f(r)))),
            "any_solved": hits_of(lambda r: float(any(solved(r))))}
    sel: dict = {name: bs.rate(h) for name, h in base.items()}
    rnd = base["random_solved"]
    for sig in names:
        h = hits_of(by(sig))
        d = {**bs.rate(h)}
        diff = h - rnd
        d["minus_random"] = round(float(diff.mean()), 4) if n else None
        d["minus_random_ci"] = ([round(float(np.percentile(diff[bs.idx].mean(1), q)), 4) for q in (2.5, 97.5)]
                                if bs.idx is not None else [None, None])
        g = h - base["greedy"]
        d["minus_greedy"] = round(float(g.mean()), 4) if n else None
        d["minus_greedy_ci"] = ([round(float(np.percentile(g[bs.idx].mean(1), q)), 4) for q in (2.5, 97.5)]
                                if bs.idx is not None else [None, None])
        sel["by_" + sig] = d
    out["faithful_success"] = sel
    return out


def table(summary: dict) -> str:
    lines = [f"{summary['tasks']} tasks, {summary['samples']} samples: grades {summary['grades']}",
             "", f"{'signal':<26}{'AUC F vs D':>12}  {'95% CI':<18}{'n_F':>5}{'n_D':>5}{'miss':>5}  "
                 f"{'within task [CI]':<24}"
                 f"{'pick by signal':>15}  {'minus random [CI]':<24}"]
    sel = summary["faithful_success"]
    for sig, a in summary["auc_f_vs_d"].items():
        ci = a["ci"]
        s = sel["by_" + sig]
        val = "-" if a["value"] is None else f"{a['value']:.3f}"
        cis = "-" if ci[0] is None else f"[{ci[0]:.3f}, {ci[1]:.3f}]"
        rci = s["minus_random_ci"]
        w = a["within_task"]
        ws = "-" if w["value"] is None else f"{w['value']:.3f} [{w['ci'][0]:.3f}, {w['ci'][1]:.3f}]"
        lines.append(f"{sig:<26}{val:>12}  {cis:<18}{a['n_f']:>5}{a['n_d']:>5}{a['missing']:>5}  {ws:<24}"
                     f"{s['value'] if s['value'] is not None else '-':>15}  {s['minus_random']:+.3f} "
                     f"[{rci[0]:+.3f}, {rci[1]:+.3f}]")
    lines.append("")
    for name in ("greedy", "random_solved", "oracle_any_faithful", "any_solved"):
        r = sel[name]
        lines.append(f"{name:<20} faithful success {r['value']}  CI {r['ci']}")
    return "\n".join(lines)


def _cell(a: dict, grades: dict) -> str:
    if a["value"] is None:
        if grades["D"] and grades["F"]:
            return "not scored"
        return "undefined (" + ("no D" if not grades["D"] else "no F") + ")"
    ci = a["ci"]
    return f"{a['value']:.2f}" + ("" if ci[0] is None else f" [{ci[0]:.2f}, {ci[1]:.2f}]")


def family_table(summary: dict) -> str:
    """Markdown: per set, the samples' grades, each signal's F-vs-D AUC [95% CI] (undefined where the
    set has no D or no F sample), and the faithful success of picking one of the k by each signal."""
    sets = list(summary["per_set"])
    blocks = [("all", summary)] + [(st, summary["per_set"][st]) for st in sets]
    head = "| | " + " | ".join(f"{name} ({b['tasks']} tasks)" for name, b in blocks) + " |"
    rule = "| --- " * (len(blocks) + 1) + "|"
    lines = ["AUC between faithful (F) and solved-but-unfaithful (D) samples [95% CI, bootstrap over tasks]:",
             "", head, rule,
             "| samples U / D / F | " + " | ".join("{U} / {D} / {F}".format(**b["grades"]) for _, b in blocks) + " |"]
    for sig in summary["auc_f_vs_d"]:
        lines.append(f"| {sig} | " + " | ".join(_cell(b["auc_f_vs_d"][sig], b["grades"]) for _, b in blocks) + " |")
    lines += ["", "Faithful success of the one sample picked (among the solved, ties shared) [95% CI]:", "", head, rule]
    pick = lambda r: "-" if r["value"] is None else f"{r['value']:.2f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]"  # noqa: E731
    for name in ("greedy", "random_solved", "oracle_any_faithful"):
        lines.append(f"| {name} | " + " | ".join(pick(b["faithful_success"][name]) for _, b in blocks) + " |")
    for sig in summary["auc_f_vs_d"]:
        lines.append(f"| by {sig} | " + " | ".join(pick(b["faithful_success"]["by_" + sig]) for _, b in blocks) + " |")
    return "\n".join(lines)


def rescore(result: dict, args) -> None:
    """Recompute the :data:`RESCORE` signals of stored records from their problems (the task's
    English and given domain rebuilt from the settings' seed; the backbone loaded for the clause
    reviewer), in place."""
    import torch

    from omtr.faithfulness.signals import BackboneScorer
    from omtr.model import load_model

    torch.set_num_threads(args.threads)
    views = {t.id: t.for_training() for t in build_tasks(argparse.Namespace(**result["settings"]))}
    model = load_model(result["settings"].get("model", args.model))
    model.eval()
    scorer = BackboneScorer(model, batch_size=16)
    for r in result["records"]:
        t = time.perf_counter()
        got = statement_signals(views[r["id"]], [s["problem"] if s["grade"] != "U" else None
                                                 for s in r["samples"]], scorer)
        for i, s in enumerate(r["samples"]):
            for name in RESCORE:
                v = got[name][i]
                s["signals"][name] = None if v is None else round(float(v), 5)
        r.setdefault("seconds", {})["clauses"] = round(time.perf_counter() - t, 2)
        log.info("rescored %s", r["id"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--generated", type=int, default=8, help="generated tasks per family")
    ap.add_argument("--generated-families", default=",".join(GENERATED))
    ap.add_argument("--per-family", type=int, default=4, help="PlanBench tasks per family")
    ap.add_argument("--planbench", default=",".join(PLANBENCH), help="PlanBench families (comma-separated)")
    ap.add_argument("--samples", type=int, default=8, help="samples per task (k)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--batch", type=int, default=16, help="generation batch")
    ap.add_argument("--engine", default="fast")
    ap.add_argument("--model", default="small", help="model profile or directory (micro: a smoke test of the code)")
    ap.add_argument("--statement-rules", choices=("all", "names"), default="all",
                    help="names: the decoder keeps the statement's names but not its facts and predicates rules "
                         "(statement_facts off), the regime where solved-but-unfaithful samples still occur")
    ap.add_argument("--chunk", type=int, default=4, help="tasks generated, graded and scored together")
    ap.add_argument("--minutes", type=float, default=0.0,
                    help="start no new chunk after this many minutes (0: no limit); the JSON says how many ran")
    ap.add_argument("--no-reviewer", action="store_true", help="skip the reviewer likelihood (the slowest signal)")
    ap.add_argument("--seed", type=int, default=9301)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True, help="JSON file (rewritten after every task)")
    ap.add_argument("--resume", action="store_true",
                    help="keep --out's records and measure only the tasks they lack (sampling seeds differ per run)")
    ap.add_argument("--summarise-only", action="store_true",
                    help="recompute the summary of --out's records (no model, no planner) and print the table")
    ap.add_argument("--rescore", action="store_true",
                    help="recompute the clause-by-clause signals of --out's records from their stored problems "
                         "(the backbone, no generation, no planner), then the summary")
    ap.add_argument("--markdown", help="also write the per-set table (markdown) here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.summarise_only or args.rescore:
        result = json.loads(Path(args.out).read_text())
        if args.rescore:
            rescore(result, args)
            result["signals"] = list(SIGNALS)
        result["summary"] = summarise(result["records"], args)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(table(result["summary"]))
        if args.markdown:
            Path(args.markdown).write_text(family_table(result["summary"]) + "\n")
        return

    import torch

    torch.set_num_threads(args.threads)
    from omtr.config import SolverConfig
    from omtr.faithfulness.signals import BackboneScorer
    from omtr.inference.episode import run_episodes
    from omtr.model import load_model
    from omtr.policy import Sampling
    from omtr.rollout import make_engine
    from omtr.solver import SolverPool

    t0 = time.time()
    tasks = interleave(build_tasks(args))
    views = [t.for_training() for t in tasks]  # what the policy sees: no reference
    log.info("%d tasks: %s", len(tasks), {s: sum(t.meta["set"] == s for t in tasks) for s in
                                          sorted({t.meta["set"] for t in tasks})})
    model = load_model(args.model)
    model.eval()
    if args.statement_rules == "names":
        import dataclasses

        model.cfg = dataclasses.replace(model.cfg, statement_facts=False)
    engine = make_engine(args.engine, model)
    outp = Path(args.out)
    outp.parent.mkdir(parents=True, exist_ok=True)
    result: dict = {"settings": vars(args), "signals": list(SIGNALS), "seconds": {}, "records": []}
    if args.resume and outp.is_file():  # a run cut short: measure only the tasks it did not reach
        prev = json.loads(outp.read_text())
        done = {r["id"] for r in prev["records"]}
        keep = [i for i, t in enumerate(tasks) if t.id not in done]
        tasks, views = [tasks[i] for i in keep], [views[i] for i in keep]
        result = prev
        result.setdefault("runs", []).append({"seconds": prev.get("seconds"), "settings": prev.get("settings")})
        result.pop("stopped_early", None)
        result["settings"] = vars(args)
        log.info("resuming: %d tasks measured already, %d to go", len(done), len(tasks))

    def save():
        outp.write_text(json.dumps(result, indent=1) + "\n")

    k = args.samples
    scorer = None if args.no_reviewer else BackboneScorer(model, batch_size=k + 1)
    greedy_s = samples_s = signals_s = 0.0
    with SolverPool(1, SolverConfig(time_limit_s=20.0, memory_limit_mb=2048)) as pool:
        for c0 in range(0, len(tasks), args.chunk):
            if args.minutes and time.time() - t0 > 60 * args.minutes:
                log.info("time budget of %.0f minutes spent: %d of %d tasks measured", args.minutes, c0, len(tasks))
                result["stopped_early"] = {"measured": len(result["records"]), "left": len(tasks) - c0}
                break
            ctasks, cviews = tasks[c0:c0 + args.chunk], views[c0:c0 + args.chunk]
            t = time.time()
            greedy = run_episodes(cviews, engine, pool, budget=1, judge=False, batch_size=args.batch,
                                  sampling=Sampling(greedy=True, max_new_tokens=args.max_new_tokens))
            greedy_s += time.time() - t
            t = time.time()
            eps = run_episodes([v for v in cviews for _ in range(k)], engine, pool, budget=1, judge=False,
                               batch_size=args.batch,
                               sampling=Sampling(greedy=False, temperature=args.temperature,
                                                 max_new_tokens=args.max_new_tokens, seed=args.seed + len(result["records"])))
            samples_s += time.time() - t
            t = time.time()
            for ti, (task, view) in enumerate(zip(ctasks, cviews)):
                steps = [e.final for e in eps[ti * k:(ti + 1) * k]]
                grades = [grade(task, s) for s in steps]
                sig = task_signals(task, view, steps, grades, model, scorer)
                secs = sig.pop("_seconds")
                result["records"].append(record(task, greedy[ti].final, steps, grades, sig, secs))
                log.info("task %d/%d %s: %s (greedy %s) %s", c0 + ti + 1, len(tasks), task.id, "".join(grades),
                         result["records"][-1]["greedy"], secs)
            signals_s += time.time() - t
            result["seconds"] = {"greedy": round(greedy_s, 1), "samples": round(samples_s, 1),
                                 "signals": round(signals_s, 1), "total": round(time.time() - t0, 1)}
            result["summary"] = summarise(result["records"], args)
            save()
    print(table(result["summary"]))
    if args.markdown:
        Path(args.markdown).write_text(family_table(result["summary"]) + "\n")


if __name__ == "__main__":
    main()
