"""Conformance of the decoding constraint: does it admit every task's own spec?

    python benchmarks/scope_conformance.py --out docs/results/scope-conformance.json
    python benchmarks/scope_conformance.py --step 10 --model micro      # every 10th PlanBench task

For every PlanBench task shipped in omtr (all configurations) and a sample of every generator
family, the reference spec with its objects spelled as the English spells them
(:mod:`omtr.evaluation.spelling`) is judged by :func:`omtr.model.scope_check.check_spec` under the
model's own decoding settings, in the domain-given mode (the reference domain given, the problem
judged) and in the full mode (domain and problem judged). Prints, per family and mode, how many were
admitted, the rules that refused the others and the first refusal of each rule, and the time per
spec. Every rate should be 100%: a refusal means the decoder forbids the task.

``--mutants`` (domain given, PlanBench only) also judges three changes of each reference that leave
the task, each of which the statement rules should refuse: an object joining two of the
statement's names (``crate0-crate1``), an object named by a word the task never uses, and, where
an :init clause's words name its predicate (``planet object b``), that clause's atom with another
predicate of the same arity. Printed as refusal rates per family.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small", help="whose decoding settings: a profile or a model directory")
    ap.add_argument("--step", type=int, default=1, help="every STEP-th PlanBench task (default 1: all)")
    ap.add_argument("--generated", type=int, default=30, help="generated tasks per generator family")
    ap.add_argument("--seed", type=int, default=4242, help="generator seed")
    ap.add_argument("--modes", default="given,full")
    ap.add_argument("--mutants", action="store_true", help="also judge changed references that leave the task")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)

    from omtr.cli.model import _model_config
    from omtr.evaluation.spelling import spelled_problem
    from omtr.model.limits import GrammarLimits
    from omtr.model.scope_check import check_spec
    from omtr.tasks.generators import generate
    from omtr.tasks.planbench import import_planbench
    from omtr.tasks.planbench_data import shipped_root

    cfg = _model_config(args.model)
    limits = GrammarLimits(**cfg.grammar_limits)
    tasks = import_planbench(shipped_root())[::args.step]
    for fam in ("blocksworld", "mystery_blocksworld", "gripper", "logistics"):
        tasks += generate(fam, args.generated, args.seed, verify=False)
    results: dict = {"model": args.model, "grammar_limits": cfg.grammar_limits, "step": args.step,
                     "generated_per_family": args.generated, "seed": args.seed, "families": {}}
    worst = 1.0
    for mode in args.modes.split(","):
        counts: dict = defaultdict(Counter)
        first: dict = {}
        t0 = time.perf_counter()
        for t in tasks:
            fam = t.meta.get("variant") or f"generated/{t.family}"
            prob = spelled_problem(t)
            kw = {"given": t.reference.domain} if mode == "given" else {"domain": t.reference.domain}
            r = check_spec(t.nl, prob, constraint=cfg.constraint, statement_objects=cfg.statement_objects,
                           statement_facts=cfg.statement_facts,
                           statement_predicates=getattr(cfg, "statement_predicates", True),
                           init_invariants=getattr(cfg, "init_invariants", True), limits=limits, **kw)
            counts[fam]["admitted" if r.admitted else r.rule] += 1
            counts[fam]["rules:" + r.rules] += 1
            if not r.admitted and (fam, r.rule) not in first:
                text = prob if r.part == "problem" else t.reference.domain
                first[(fam, r.rule)] = {"id": t.id, "at": r.at, "part": r.part,
                                        "near": text[max(0, r.at - 60):r.at + 30]}
        secs = time.perf_counter() - t0
        for fam, c in counts.items():
            n = sum(v for k, v in c.items() if not k.startswith("rules:"))
            rate = c["admitted"] / n
            worst = min(worst, rate)
            entry = {"tasks": n, "admitted": c["admitted"], "rate": round(rate, 4),
                     "refused_by": {k: v for k, v in c.items() if k != "admitted" and not k.startswith("rules:")},
                     "rules": {k[6:]: v for k, v in c.items() if k.startswith("rules:")},
                     "first_refusals": [v for (f, _), v in first.items() if f == fam]}
            results["families"].setdefault(fam, {})[mode] = entry
            print(f"{mode:5s} {fam:34s} {c['admitted']:4d}/{n:<4d} {100 * rate:6.1f}%  "
                  f"{json.dumps(entry['refused_by']) if entry['refused_by'] else ''}")
        results.setdefault("seconds", {})[mode] = round(secs, 1)
        print(f"{mode}: {len(tasks)} specs in {secs:.1f} s ({1000 * secs / max(len(tasks), 1):.0f} ms a spec)")
    results["all_admitted"] = worst == 1.0
    if args.mutants:
        results["mutants"] = refused_mutants([t for t in tasks if t.meta.get("variant")], cfg, limits)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0 if worst == 1.0 else 1


UNSEEN = "zorvex"  # a word no PlanBench task uses


def mutants(task, prob: str) -> dict:
    """The changed references of ``--mutants`` (module doc); a kind is left out where it does not apply."""
    import re

    from omtr.model.scope import given_declarations
    from omtr.statement import clause_predicate, read_statement

    reading = read_statement(task.nl)
    out = {}
    head = prob.lower().index("(:objects") + len("(:objects")
    if len(reading.names) >= 2:
        out["joined"] = prob[:head] + f" {reading.names[0]}-{reading.names[1]}" + prob[head:]
    if UNSEEN not in task.nl.lower():
        out["unseen"] = prob[:head] + f" {UNSEEN}" + prob[head:]
    preds = given_declarations(task.reference.domain).predicates
    spelled = {n.replace("_", "").replace("-", ""): n for n in reading.names}
    for c in reading.init:
        want = clause_predicate(c, preds) if c.key else None
        other = [q for q, a in preds.items() if want and q != want and len(a) == len(preds[want])]
        if not other:
            continue
        atom = re.compile(r"\(\s*" + re.escape(want) + r"\s+" + r"\s+".join(re.escape(spelled.get(k, k)) for k in c.key)
                          + r"\s*\)", re.I)
        m = atom.search(prob, prob.lower().index("(:init"))
        if m:
            out["predicate"] = prob[:m.start()] + f"({other[0]} {' '.join(spelled.get(k, k) for k in c.key)})" \
                + prob[m.end():]
            break
    return out


def refused_mutants(tasks, cfg, limits) -> dict:
    """Per family and kind of change: how many changed references the decoder refuses, and by which rule."""
    from omtr.evaluation.spelling import spelled_problem
    from omtr.model.scope_check import check_spec

    counts: dict = defaultdict(Counter)
    for t in tasks:
        fam = t.meta.get("variant")
        for kind, text in mutants(t, spelled_problem(t)).items():
            r = check_spec(t.nl, text, given=t.reference.domain, constraint=cfg.constraint,
                           statement_objects=cfg.statement_objects, statement_facts=cfg.statement_facts,
                           statement_predicates=getattr(cfg, "statement_predicates", True),
                           init_invariants=getattr(cfg, "init_invariants", True), limits=limits)
            counts[(fam, kind)]["tasks"] += 1
            counts[(fam, kind)]["refused" if not r.admitted else "admitted"] += 1
            if not r.admitted:
                counts[(fam, kind)]["by:" + r.rule] += 1
    out: dict = {}
    for (fam, kind), c in sorted(counts.items()):
        entry = {"tasks": c["tasks"], "refused": c["refused"], "rate": round(c["refused"] / c["tasks"], 4),
                 "by": {k[3:]: v for k, v in c.items() if k.startswith("by:")}}
        out.setdefault(fam, {})[kind] = entry
        print(f"mutant {kind:9s} {fam:24s} refused {c['refused']:4d}/{c['tasks']:<4d} {100 * entry['rate']:6.1f}%  "
              f"{json.dumps(entry['by'])}")
    return out


if __name__ == "__main__":
    sys.exit(main())
