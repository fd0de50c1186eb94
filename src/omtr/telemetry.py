"""Training telemetry for Prometheus: the metrics the trainer exports (dashboard: dashboards/training.json).

How they reach Prometheus (documented in dashboards/README.md):

* **A metrics endpoint on the trainer** (the default): ``telemetry.serve(port)`` starts an HTTP
  server with ``/metrics`` in a daemon thread; Prometheus scrapes it like any pod.
* **A Pushgateway push** for short jobs that may end between two scrapes:
  ``telemetry.push("http://pushgateway:9091")`` after each logged step (``job="omtr-train"``,
  grouped by run id).

    tel = TrainingTelemetry(run_id="run-7")
    tel.serve(9108)
    tel.record(step=10, rewards={"actor": 0.41, "judge": 0.8, "editor": 0.2}, success_rate=0.35,
               categories={"success": 35, "syntax": 40, ...}, judge_auc=0.71, judge_ece=0.08,
               kl={"actor": 0.02}, tokens_per_s=230.0, episodes=64, planner_calls=211)

``prometheus_client`` is imported when a :class:`TrainingTelemetry` is made, never at start-up.
The helpers :func:`binary_auc` and :func:`expected_calibration_error` compute the Judge's two
numbers from its scores and the planner's outcomes.
"""

from __future__ import annotations

from typing import Mapping, Sequence

ROLES = ("actor", "judge", "editor")
OUTCOMES = ("success", "syntax", "object_type", "predicate_schema", "precondition_effect", "goal_constraint",
            "unreachable_search")

# Every series name the trainer exports (the dashboard test holds dashboards/training.json to these).
METRICS = {
    "omtr_train_step": "Training step of the latest record.",
    "omtr_train_reward": "Mean reward per role over the latest step's episodes.",
    "omtr_train_success_rate": "Share of the latest step's episodes whose final spec the planner accepted (VAL-checked).",
    "omtr_train_category_share": "Share of the latest step's final verdicts by outcome ('success' or a category).",
    "omtr_train_judge_auc": "ROC AUC of the Judge's success score against the planner's verdicts (latest step).",
    "omtr_train_judge_ece": "Expected calibration error of the Judge's success probability (10 bins, latest step).",
    "omtr_train_kl": "KL divergence to the reference policy per role (latest step).",
    "omtr_train_tokens_per_second": "Generated tokens per second over the latest step.",
    "omtr_train_episodes": "Episodes finished (counter).",
    "omtr_train_planner_calls": "Planner calls made by the trainer (counter).",
}


def binary_auc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """ROC AUC: the chance a random positive outscores a random negative (ties count half).

    ``None`` when one class is missing (AUC is undefined then).
    """
    if len(scores) != len(labels):
        raise ValueError(f"{len(scores)} scores for {len(labels)} labels")
    pairs = sorted(zip(scores, labels), key=lambda p: p[0])
    pos = sum(1 for _, y in pairs if y)
    neg = len(pairs) - pos
    if pos == 0 or neg == 0:
        return None
    rank_sum = 0.0  # sum of the positives' (1-based, tie-averaged) ranks
    i = 0
    while i < len(pairs):
        j = i
        while j + 1 < len(pairs) and pairs[j + 1][0] == pairs[i][0]:
            j += 1
        avg_rank = (i + j) / 2 + 1
        rank_sum += avg_rank * sum(1 for k in range(i, j + 1) if pairs[k][1])
        i = j + 1
    return (rank_sum - pos * (pos + 1) / 2) / (pos * neg)


def expected_calibration_error(probs: Sequence[float], labels: Sequence[bool], bins: int = 10) -> float | None:
    """Sum over equal-width probability bins of |mean prob - accuracy| weighted by the bin's share."""
    if len(probs) != len(labels):
        raise ValueError(f"{len(probs)} probabilities for {len(labels)} labels")
    if bins < 1:
        raise ValueError("bins must be >= 1")
    if not probs:
        return None
    totals = [[0, 0.0, 0] for _ in range(bins)]  # count, sum of probs, positives
    for p, y in zip(probs, labels):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"probability {p} is outside [0, 1]")
        b = min(int(p * bins), bins - 1)
        totals[b][0] += 1
        totals[b][1] += p
        totals[b][2] += 1 if y else 0
    n = len(probs)
    return sum(c / n * abs(s / c - k / c) for c, s, k in totals if c)


class TrainingTelemetry:
    """The trainer's Prometheus metrics, in a registry of their own."""

    def __init__(self, run_id: str = "", registry=None):
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.run_id = run_id
        r = self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.step = Gauge("omtr_train_step", METRICS["omtr_train_step"], registry=r)
        self.reward = Gauge("omtr_train_reward", METRICS["omtr_train_reward"], ["role"], registry=r)
        self.success_rate = Gauge("omtr_train_success_rate", METRICS["omtr_train_success_rate"], registry=r)
        self.category_share = Gauge("omtr_train_category_share", METRICS["omtr_train_category_share"], ["category"],
                                    registry=r)
        self.judge_auc = Gauge("omtr_train_judge_auc", METRICS["omtr_train_judge_auc"], registry=r)
        self.judge_ece = Gauge("omtr_train_judge_ece", METRICS["omtr_train_judge_ece"], registry=r)
        self.kl = Gauge("omtr_train_kl", METRICS["omtr_train_kl"], ["role"], registry=r)
        self.tokens_per_s = Gauge("omtr_train_tokens_per_second", METRICS["omtr_train_tokens_per_second"],
                                  registry=r)
        self.episodes = Counter("omtr_train_episodes", METRICS["omtr_train_episodes"], registry=r)
        self.planner_calls = Counter("omtr_train_planner_calls", METRICS["omtr_train_planner_calls"], registry=r)
        self._server = None

    def record(self, *, step: int, rewards: Mapping[str, float] | None = None, success_rate: float | None = None,
               categories: Mapping[str, int] | None = None, judge_auc: float | None = None,
               judge_ece: float | None = None, kl: Mapping[str, float] | None = None,
               tokens_per_s: float | None = None, episodes: int = 0, planner_calls: int = 0) -> None:
        """Set the gauges from one training step (``None``: leave unchanged); counters add up."""
        self.step.set(step)
        for role, value in (rewards or {}).items():
            self.reward.labels(_known(role, ROLES, "role")).set(value)
        if success_rate is not None:
            self.success_rate.set(success_rate)
        if categories:
            total = sum(categories.values())
            for outcome in OUTCOMES:
                self.category_share.labels(outcome).set(categories.get(outcome, 0) / total if total else 0.0)
            unknown = set(categories) - set(OUTCOMES)
            if unknown:
                raise ValueError(f"unknown outcome(s) {sorted(unknown)}; expected {OUTCOMES}")
        if judge_auc is not None:
            self.judge_auc.set(judge_auc)
        if judge_ece is not None:
            self.judge_ece.set(judge_ece)
        for role, value in (kl or {}).items():
            self.kl.labels(_known(role, ROLES, "role")).set(value)
        if tokens_per_s is not None:
            self.tokens_per_s.set(tokens_per_s)
        if episodes:
            self.episodes.inc(episodes)
        if planner_calls:
            self.planner_calls.inc(planner_calls)

    def serve(self, port: int, addr: str = "127.0.0.1"):
        """Expose ``/metrics`` on ``addr:port`` from a daemon thread (Prometheus scrapes it)."""
        from prometheus_client import start_http_server

        self._server, _ = start_http_server(port, addr=addr, registry=self.registry)
        return self._server

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def push(self, gateway: str, job: str = "omtr-train") -> None:
        """Push every metric to a Pushgateway (grouped by run id), replacing this run's last push."""
        from prometheus_client import push_to_gateway

        push_to_gateway(gateway, job=job, registry=self.registry,
                        grouping_key={"run_id": self.run_id} if self.run_id else None)


def _known(value: str, allowed: Sequence[str], what: str) -> str:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; expected one of {list(allowed)}")
    return value
