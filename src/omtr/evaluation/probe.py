"""The held-out faithful probe: how faithful the policy being trained is, measured while it trains.

Training never reads a reference (``omtr.tasks.training``); whether a spec states the task can only
be graded here, on the evaluation side. A :class:`FaithfulProbe` holds held-out tasks *with* their
references and, when the trainer calls it after an update, runs the current policy greedily on them
(budget 1, the Judge scoring each spec) and grades every answer with the checker. The trainer gets
numbers back, logs them beside the update's (``probe_*`` in ``metrics.jsonl`` and MLflow) and uses
them for nothing else: they are a curve, never a reward.

Reported (fractions of the probe's tasks unless said otherwise):

* ``probe_success``: the planner accepted the spec; ``probe_nontrivial``: with a plan of at least one
  action; ``probe_faithful``: the checker finds it equivalent to the reference;
* ``probe_drift``: solved-but-unfaithful over solved with a plan (the paper's drift, on this probe);
* ``probe_judge_auc_fd``: the Judge's AUC between faithful (F) and solved-but-unfaithful (D) specs,
  when both occur; with ``samples`` > 0, every task also gets that many samples at 0.7 and the AUC
  pools them (the paper's H.9 pool), which a greedy answer per task alone rarely fills;
* ``probe_faithful_sampled`` (with ``samples`` > 0): the share of those samples that are faithful,
  the policy's own faithful rate where the greedy answers are all right or all wrong (a greedy
  24/24 says nothing about how often a sample at 0.7 still states the task).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Sequence

log = logging.getLogger(__name__)


class FaithfulProbe:
    """Greedy answers of the policy on held-out tasks (with references), graded by the checker."""

    def __init__(self, tasks: Sequence, *, max_new_tokens: int = 448, samples: int = 0, temperature: float = 0.7,
                 seed: int = 0, batch_size: int | None = None):
        bad = [t.id for t in tasks if getattr(t, "reference", None) is None]
        if bad:
            raise ValueError(f"probe task(s) {', '.join(bad[:5])} carry no reference: the probe grades answers with "
                             "the checker; give it a task file written by `omtr tasks generate` or `omtr tasks planbench`")
        if not tasks:
            raise ValueError("the probe needs at least one held-out task")
        self.tasks = list(tasks)
        self.max_new_tokens, self.samples, self.temperature = int(max_new_tokens), int(samples), float(temperature)
        self.seed, self.batch_size = int(seed), batch_size
        self.calls = 0

    @classmethod
    def from_file(cls, path: str | Path, n: int | None = None, **kw) -> "FaithfulProbe":
        from omtr.tasks.records import load_tasks

        tasks = load_tasks(path)
        return cls(tasks[:n] if n else tasks, **kw)

    def grade(self, task, ep) -> str:
        """``faithful``, ``unfaithful`` (solved with a plan, another task), ``empty`` (solved with an
        empty plan) or ``failed``."""
        from omtr.evaluation.run import faithfulness

        f = ep.final
        if f is None or not f.verdict.success:
            return "failed"
        if not f.verdict.plan:
            return "empty"
        rep = faithfulness(task, {"success": True, "domain": f.domain, "problem": f.problem, "plan": f.verdict.plan})
        return "faithful" if rep.get("faithful") else "unfaithful"

    def __call__(self, policy, env) -> dict[str, float]:
        from omtr.inference.episode import run_episodes
        from omtr.policy import Sampling
        from omtr.telemetry import binary_auc

        t0 = time.perf_counter()
        views = [t.for_training() for t in self.tasks]
        eps = run_episodes(views, policy, env, budget=1, judge=True, batch_size=self.batch_size,
                           sampling=Sampling(greedy=True, max_new_tokens=self.max_new_tokens))
        grades = [self.grade(t, e) for t, e in zip(self.tasks, eps)]
        pool = [(e.judge_score, g) for e, g in zip(eps, grades)]
        if self.samples:
            reps = [k for k in range(len(views)) for _ in range(self.samples)]
            more = run_episodes([views[k] for k in reps], policy, env, budget=1, judge=True, batch_size=self.batch_size,
                                sampling=Sampling(greedy=False, temperature=self.temperature,
                                                  max_new_tokens=self.max_new_tokens, seed=self.seed + 17 * self.calls))
            sampled = [self.grade(self.tasks[k], e) for k, e in zip(reps, more)]
            pool += [(e.judge_score, g) for e, g in zip(more, sampled)]
        self.calls += 1
        n = len(grades)
        f, d = grades.count("faithful"), grades.count("unfaithful")
        out = {"probe_success": sum(g != "failed" for g in grades) / n, "probe_nontrivial": (f + d) / n,
               "probe_faithful": f / n, "probe_tasks": float(n)}
        if f + d:
            out["probe_drift"] = d / (f + d)
        if self.samples:
            out["probe_faithful_sampled"] = sampled.count("faithful") / len(sampled)
        fd = [(s, g == "faithful") for s, g in pool if s is not None and g in ("faithful", "unfaithful")]
        auc = binary_auc([s for s, _ in fd], [y for _, y in fd]) if fd else None
        if auc is not None:
            out["probe_judge_auc_fd"] = auc
        out["probe_s"] = time.perf_counter() - t0
        log.info("probe: %d/%d faithful, %d solved with a plan%s, Judge AUC F vs D %s (%.0f s)", f, n, f + d,
                 f", {out['probe_faithful_sampled']:.0%} of {len(sampled)} samples faithful" if self.samples else "",
                 f"{auc:.2f}" if auc is not None else "-", out["probe_s"])
        return out


__all__ = ["FaithfulProbe"]
