"""The run's figures: per-update metrics, per-cycle summaries, the curve, MLflow and telemetry.

After each update :meth:`MetricsMixin._gather_batch` collects what the metrics need from every rank,
:meth:`MetricsMixin._metrics` computes the update's figures over the whole batch (rewards, success
and failure shares, Judge calibration, losses, throughput), and :meth:`MetricsMixin._log_metrics`
appends them to ``metrics.jsonl`` and sends them to MLflow (:mod:`omtr.rl.tracking`) with the
batch's episode logs, and to the Prometheus telemetry. At a cycle's end
:meth:`MetricsMixin._end_cycle` logs the cycle's means and redraws ``training_curve.png``;
:meth:`MetricsMixin._finish` writes the final ``metrics.jsonl`` and curve.

With several ranks, rank 0 alone writes ``metrics.jsonl``, the MLflow run and the curve.

The methods live on :class:`MetricsMixin`, a base of :class:`omtr.rl.trainer.Trainer`; they read its
``cfg``, ``coll``, ``out``, ``run_name``, counters and ``history``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from pathlib import Path

from omtr.config import ROLE_NAMES
from omtr.inference.episode import Episode
from omtr.rl import losses as L
from omtr.rl.rewards import outcome
from omtr.rl.steps import GEN_ROLES, StepItem

log = logging.getLogger("omtr.rl")


class MetricsMixin:
    """The trainer's metrics, cycle summaries, training curve, MLflow run and telemetry."""

    # ------------------------------------------------------------------ metrics
    def _gather_batch(self, episodes: list[Episode], items: list[StepItem], times: tuple) -> dict:
        """What the metrics need of this rank's episodes and steps, as plain records, from every
        rank (rank order, so the batch's episodes in batch order); the times of every rank."""
        eps = [{"success": e.success, "actor_success": e.actor_success,
                "final": outcome(e.final.verdict) if e.final is not None else None,
                "judge": (e.judge_score, e.actor_success)
                if e.judge_score is not None and not e.steps[0].verdict.limited else None,
                "calls": e.planner_calls, "gen_tokens": sum(len(s.token_ids) for s in e.steps),
                "actor_prompt_tokens": [s.prompt_tokens for s in e.steps if s.role == "actor"]}
               for e in episodes]
        its = [(it.role, it.ep, it.step, it.reward, it.outcome, it.limited, len(it.tokens)) for it in items]
        mine = {"episodes": eps, "items": its, "times": tuple(times)}
        parts = self.coll.gather(mine)
        return {"episodes": [e for p in parts for e in p["episodes"]],
                "items": [i for p in parts for i in p["items"]],
                "times": [p["times"] for p in parts]}

    def _metrics(self, batch: dict, stats: dict, calls: int) -> dict:
        """The update's figures over the whole batch (every rank's episodes); times are the
        slowest rank's (the update waits for it)."""
        episodes, items = batch["episodes"], batch["items"]
        rollout_s, ref_s, update_s, validation_s = (max(t[k] for t in batch["times"]) for k in range(4))
        n = max(1, len(episodes))
        m: dict[str, float] = {}
        ra = [r for role, _, _, r, *_ in items if role == "actor" and r is not None]
        last_editor: dict[int, tuple] = {}
        for it in items:
            role, ep, step = it[:3]
            if role == "editor" and (ep not in last_editor or step > last_editor[ep][2]):
                last_editor[ep] = it
        re_ = [it[3] for it in last_editor.values() if it[3] is not None]
        m["reward_actor"] = _mean(ra)
        m["reward_editor"] = _mean(re_)
        m["success_rate"] = sum(e["success"] for e in episodes) / n
        m["actor_success_rate"] = sum(e["actor_success"] for e in episodes) / n
        m["limited_steps"] = float(sum(it[5] for it in items))
        finals = [e["final"] for e in episodes if e["final"] is not None]
        first = [it[4] for it in items if it[0] == "actor"]
        for cat in ("success", "syntax", "object_type", "predicate_schema", "precondition_effect",
                    "goal_constraint", "unreachable_search"):
            m[f"share_final_{cat}"] = finals.count(cat) / max(1, len(finals))
            m[f"share_actor_{cat}"] = first.count(cat) / max(1, len(first))
        m["mean_ladder_actor"] = _mean([_ladder(o) for o in first])
        scored = [e["judge"] for e in episodes if e["judge"] is not None]
        if scored:
            ps, ys = [p for p, _ in scored], [y for _, y in scored]
            m["judge_ece"] = L.expected_calibration_error(ps, ys)
            m["judge_brier"] = L.brier_score(ps, ys)
            auc = L.binary_auc(ps, ys)
            if auc is not None:
                m["judge_auc"] = auc
            m["reward_judge"] = _mean([L.thresholded_judge_reward(p, y, self.cfg.judge_threshold) for p, y in scored])
            m["judge_mean_score"] = _mean(ps)
        for k, v in stats.items():
            if k != "update_tokens":
                m[k] = v
        gen_tokens = sum(e["gen_tokens"] for e in episodes)
        m["gen_tokens"] = float(gen_tokens)
        m["rollout_tokens_per_s"] = gen_tokens / rollout_s if rollout_s > 0 else 0.0
        m["update_tokens_per_s"] = stats.get("update_tokens", 0) / update_s if update_s > 0 else 0.0
        m["len_actor"] = _mean([it[6] for it in items if it[0] == "actor"])
        m["len_editor"] = _mean([it[6] for it in items if it[0] == "editor"])
        m["prompt_tokens_actor"] = _mean([t for e in episodes for t in e["actor_prompt_tokens"]])
        m["rollout_s"], m["reference_s"], m["update_s"] = rollout_s, ref_s, update_s
        m["validation_s"] = validation_s
        m["planner_calls"] = float(calls)
        m["calls_per_episode"] = calls / n
        m["episodes_total"] = float(self.episodes_done)
        m["planner_calls_total"] = float(self.planner_calls)
        if self.coll.active:
            m["ranks"] = float(self.coll.world)
        return {k: float(v) for k, v in m.items() if v is not None and not (isinstance(v, float) and math.isnan(v))}

    # ------------------------------------------------------------------ cycle end / finish
    def _end_cycle(self) -> None:
        c = self.cycle - 1
        rows = [h for h in self.history if h.get("cycle") == c]
        if rows:
            keys = sorted({k for r in rows for k in r if k not in ("update", "cycle")})
            summary = {f"cycle_{k}": _mean([r[k] for r in rows if k in r]) for k in keys}
            self._tracker_log(summary, step=c)
        if not self.coll.is_main:
            return
        if self.cfg.save_model_every_cycle:
            self.save_model()
        self._curve()

    def _finish(self) -> None:
        if not (self.out / "model").exists() and self.cfg.save_model_every_cycle:
            self.save_model()
        (self.out / "metrics.jsonl").write_text("".join(json.dumps(h) + "\n" for h in self.history))
        self._curve()
        if self._tracker is not None:
            self._tracker.artifact(self.out / "metrics.jsonl")

    def _curve(self) -> None:
        if not self.history:
            return
        from omtr.rl.curves import training_curve

        png = training_curve(self.history, self.out / "training_curve.png")
        if self._tracker is not None:
            self._tracker.artifact(png)

    # ------------------------------------------------------------------ tracking
    @contextlib.contextmanager
    def _tracking(self):
        if not self.cfg.mlflow or not self.coll.is_main:  # one MLflow writer: rank 0
            yield
            return
        from omtr.rl.tracking import Tracker

        self._tracker = Tracker(self.out, self.cfg, self.run_name)
        try:
            yield
        finally:
            self._tracker.close()
            self._tracker = None

    def _tracker_log(self, metrics: dict, step: int) -> None:
        if self._tracker is not None:
            self._tracker.metrics(metrics, step)

    def _log_metrics(self, metrics: dict, log_path: Path | None, validation: dict) -> None:
        log.info("update %d/%d: success %.2f, R_A %.3f, judge loss %s, %s gen tok/s, %s update tok/s",
                 self.update, self.cfg.total_updates, metrics.get("success_rate", 0.0),
                 metrics.get("reward_actor", float("nan")), f"{metrics['judge_loss']:.3f}" if "judge_loss" in metrics else "-",
                 f"{metrics['rollout_tokens_per_s']:.1f}", f"{metrics['update_tokens_per_s']:.1f}")
        with open(self.out / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"update": self.update, **metrics}) + "\n")
        if self._tracker is not None:
            self._tracker.metrics(metrics, self.update)
            folder = self.out / "episodes" / f"cycle-{(self.update - 1) // self.cfg.updates_per_cycle:04d}"
            stem = f"update-{self.update - 1:06d}"
            logs = sorted(folder.glob(f"{stem}.rank-*.parquet")) if self.coll.active else [log_path]
            for p in logs:  # every rank's log (all were written and validated before the update)
                if p is None:
                    continue
                self._tracker.artifact(p, f"episodes/{p.parent.name}")
                v = p.with_suffix(".validation.txt")
                if v.exists():
                    self._tracker.artifact(v, f"episodes/{p.parent.name}")
        if self._telemetry is not None:
            cats = {k[len("share_final_"):]: int(round(v * 1000)) for k, v in metrics.items() if k.startswith("share_final_")}
            self._telemetry.record(step=self.update, rewards={r: metrics[f"reward_{r}"] for r in ROLE_NAMES
                                                               if f"reward_{r}" in metrics},
                                   success_rate=metrics.get("success_rate"), categories=cats,
                                   judge_auc=metrics.get("judge_auc"), judge_ece=metrics.get("judge_ece"),
                                   kl={r: metrics[f"{r}_kl"] for r in GEN_ROLES if f"{r}_kl" in metrics},
                                   tokens_per_s=metrics.get("rollout_tokens_per_s"),
                                   episodes=self.cfg.episodes_per_batch, planner_calls=int(metrics["planner_calls"]))

    _telemetry = None


# ---------------------------------------------------------------------------------------- helpers

def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _ladder(o: str) -> float:
    from omtr.rl.rewards import LADDER

    return LADDER.get(o, 0.0)

