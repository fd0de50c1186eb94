"""Prometheus metrics of the solver fleet (``omtr solver serve``), one registry per service.

Every name here is what the fleet dashboard (``dashboards/solver-fleet.json``) may query; the
dashboard test checks that it names nothing else. ``prometheus_client`` is imported here, so only
the service imports this module.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Per-spec latency: lint-only verdicts take about a millisecond, planner calls tens of ms to the
# time limit (60 s by default).
SPEC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
BYTE_BUCKETS = tuple(2 ** k for k in range(10, 27, 2))  # 1 KiB .. 64 MiB
SPEC_COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

# Closed vocabularies of label values (kept small: every value is a time series).
REJECT_REASONS = ("bad_json", "bad_request", "too_large", "too_many_specs", "unauthorized",
                  "overload", "draining", "not_ready", "idempotency_conflict")


class FleetMetrics:
    """The fleet's metrics in a registry of their own (several services may share a process)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("omtr_solver_requests", "Requests to POST /v1/solve, by HTTP status code.",
                                ["code"], registry=r)
        self.rejected = Counter("omtr_solver_rejected_requests",
                                "Requests to POST /v1/solve refused before any spec was verified, by reason.",
                                ["reason"], registry=r)
        for reason in REJECT_REASONS:
            self.rejected.labels(reason)
        self.calls = Counter("omtr_solver_calls", "Specs verified (one verdict each).", registry=r)
        self.verdicts = Counter("omtr_solver_verdicts",
                                "Verdicts by outcome: 'success' or one of the six diagnostic categories.",
                                ["category"], registry=r)
        from omtr.pddl.categories import Category

        for c in ["success", *(c.value for c in Category)]:
            self.verdicts.labels(c)
        self.cache_hits = Counter("omtr_solver_cache_hits", "Verdicts answered from the result cache.", registry=r)
        self.timeouts = Counter("omtr_solver_timeouts", "Verdicts that hit the time limit.", registry=r)
        self.memory_outs = Counter("omtr_solver_memory_outs", "Verdicts that hit the memory limit.", registry=r)
        self.too_large = Counter("omtr_solver_too_large",
                                 "Verdicts refused by omtr's own input limits (bytes per file, nesting).", registry=r)
        self.cancelled = Counter("omtr_solver_cancelled_requests",
                                 "Batches stopped early because their client disconnected.", registry=r)
        self.replays = Counter("omtr_solver_idempotent_replays",
                               "Retried batches answered without verifying again (same Idempotency-Key).",
                               registry=r)
        self.spec_seconds = Histogram("omtr_solver_spec_duration_seconds",
                                      "Time to a verdict for one spec (lint, planner, VAL), seconds.",
                                      buckets=SPEC_BUCKETS, registry=r)
        self.request_seconds = Histogram("omtr_solver_request_duration_seconds",
                                         "Time to answer one POST /v1/solve batch, seconds.",
                                         buckets=REQUEST_BUCKETS, registry=r)
        self.request_bytes = Histogram("omtr_solver_request_bytes", "Body size of POST /v1/solve requests, bytes.",
                                       buckets=BYTE_BUCKETS, registry=r)
        self.request_specs = Histogram("omtr_solver_request_specs", "Specs per accepted POST /v1/solve request.",
                                       buckets=SPEC_COUNT_BUCKETS, registry=r)
        self.queue_depth = Gauge("omtr_solver_queue_depth",
                                 "Specs admitted and waiting for the pool (not yet in flight).", registry=r)
        self.inflight = Gauge("omtr_solver_inflight_specs", "Specs handed to the pool and not yet answered.",
                              registry=r)
        self.inflight_requests = Gauge("omtr_solver_inflight_requests", "Batches being answered now.", registry=r)
        self.workers = Gauge("omtr_solver_workers", "Solver worker processes of this pod.", registry=r)
        self.ready = Gauge("omtr_solver_ready", "1 once the workers are warm and the pod takes work, else 0.",
                           registry=r)

    def observe_verdict(self, v) -> None:
        self.calls.inc()
        self.verdicts.labels("success" if v.success else (v.category.value if v.category else "unknown")).inc()
        if v.cached:
            self.cache_hits.inc()
        if v.timed_out:
            self.timeouts.inc()
        if v.memory_out:
            self.memory_outs.inc()
        if getattr(v, "too_large", False):
            self.too_large.inc()
        self.spec_seconds.observe(v.timings.get("total_ms", 0.0) / 1000)


def exported_names(registry: CollectorRegistry) -> set[str]:
    """Every series name the registry can expose (``_total``, ``_bucket``... included)."""
    suffixes = {"counter": ("_total", "_created"), "gauge": ("",),
                "histogram": ("_bucket", "_count", "_sum", "_created"), "summary": ("", "_count", "_sum", "_created")}
    names: set[str] = set()
    for family in registry.collect():
        for s in suffixes.get(family.type, ("",)):
            names.add(family.name + s)
    return names
