"""MLflow runs for omtr steps.

Every step logs through :func:`start_run`, which works the same locally (SQLite store by
default), under ``mlflow run`` (it joins the project's run instead of opening another) and in a
Kubeflow pod (``MLFLOW_TRACKING_URI`` points at the server).
"""

from __future__ import annotations

import contextlib
import os


@contextlib.contextmanager
def start_run(experiment: str, run_name: str, tracking_uri: str | None = None):
    import mlflow

    from omtr.paths import default_tracking_uri

    mlflow.set_tracking_uri(tracking_uri or default_tracking_uri())
    if os.environ.get("MLFLOW_RUN_ID"):
        # Launched by `mlflow run`: the run and its experiment already exist.
        with mlflow.start_run() as run:
            yield run
        return
    if not os.environ.get("MLFLOW_EXPERIMENT_ID"):
        mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name=run_name) as run:
        yield run
