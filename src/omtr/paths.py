"""Where omtr finds shared data (PlanBench files) and keeps local state, and a free local port."""

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


# PlanBench's instance folders (under planbench/instances/) of each family's basic set.
PLANBENCH_FOLDERS = {
    "blocksworld": "blocksworld",
    "mystery_blocksworld": "blocksworld/mystery",
    "logistics": "logistics",
    "depots": "depots",
}


def planbench_family(family: str, root: Path | None = None) -> tuple[str, list[Path]]:
    """The domain text and the instance files (in numeric order) of a PlanBench family."""
    root = root or benchmarks_dir(required=True)
    base = root / "planbench" / "instances" / PLANBENCH_FOLDERS[family]
    files = sorted((base / "generated_basic").glob("instance-*.pddl"), key=lambda p: int(p.stem.split("-")[1]))
    return (base / "generated_domain.pddl").read_text(), files


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the system has free on ``host`` now (bound to port 0, then released): for a
    server or a process group's store that this process starts next."""
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
