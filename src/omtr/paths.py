"""Where omtr finds shared data (PlanBench files) and keeps local state."""

from __future__ import annotations

import os
from pathlib import Path


def benchmarks_dir(required: bool = False) -> Path | None:
    """The benchmark data folder: ``$OMTR_BENCHMARKS``, else a ``shared/benchmarks`` beside the checkout."""
    env = os.environ.get("OMTR_BENCHMARKS")
    candidates = [Path(env)] if env else []
    here = Path(__file__).resolve()
    candidates += [p / "shared" / "benchmarks" for p in (Path.cwd(), Path.cwd().parent, *here.parents)]
    for c in candidates:
        if (c / "planbench").is_dir():
            return c
    if required:
        raise FileNotFoundError(
            "PlanBench data not found: set OMTR_BENCHMARKS to a folder holding planbench/ "
            "(instances/, configs/, plan_generation/), e.g. a checkout of the PlanBench repository's plan-bench data"
        )
    return None


def default_tracking_uri() -> str:
    """MLflow's URI: ``$MLFLOW_TRACKING_URI`` (set by ``mlflow run``) or a SQLite file in the working dir."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlruns.db'}"
