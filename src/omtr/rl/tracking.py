"""MLflow for a training run: the full config, per-update and per-cycle metrics, artifacts.

The tracking URI comes from the environment (``MLFLOW_TRACKING_URI``), else a SQLite file in the
working directory (:func:`omtr.paths.default_tracking_uri`). A resumed run logs into the same
MLflow run (its id is kept in ``RUN_DIR/mlflow_run.json``).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger("omtr.rl")

RUN_FILE = "mlflow_run.json"


class Tracker:
    def __init__(self, out: Path, cfg, run_name: str):
        import mlflow

        from omtr.paths import default_tracking_uri

        self.mlflow = mlflow
        mlflow.set_tracking_uri(default_tracking_uri())
        known = out / RUN_FILE
        run_id = json.loads(known.read_text())["run_id"] if known.is_file() else None
        if run_id is None and os.environ.get("MLFLOW_RUN_ID"):
            run_id = os.environ["MLFLOW_RUN_ID"]  # launched by `mlflow run`
        if run_id is None:
            if not os.environ.get("MLFLOW_EXPERIMENT_ID"):
                mlflow.set_experiment(cfg.experiment)
            self.run = mlflow.start_run(run_name=run_name)
            params = {k: (json.dumps(v) if isinstance(v, (list, dict, tuple)) else v) for k, v in cfg.to_dict().items()}
            mlflow.log_params(params)
            mlflow.log_dict(cfg.to_dict(), "config.json")
            known.write_text(json.dumps({"run_id": self.run.info.run_id}) + "\n")
        else:
            self.run = mlflow.start_run(run_id=run_id)
        self.run_id = self.run.info.run_id

    def metrics(self, metrics: dict, step: int) -> None:
        try:
            self.mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)
        except Exception as exc:  # tracking must never stop training
            log.warning("MLflow: could not log metrics (%s)", exc)

    def artifact(self, path: Path, artifact_path: str | None = None) -> None:
        try:
            self.mlflow.log_artifact(str(path), artifact_path)
        except Exception as exc:
            log.warning("MLflow: could not log %s (%s)", path, exc)

    def close(self) -> None:
        self.mlflow.end_run()
