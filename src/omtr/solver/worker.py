"""A solver worker process: ``python -m omtr.solver.worker FD``.

It imports the Fast Downward translator once and then answers specs sent over the socket ``FD``
until it receives ``None`` or its parent dies.
"""

from __future__ import annotations

import logging
import os

from omtr.config import SolverConfig
from omtr.pddl.categories import Category
from omtr.solver.verdict import Verdict

log = logging.getLogger(__name__)


def _worker_main(conn) -> None:
    import signal

    from omtr.solver import proc
    from omtr.solver.pipeline import run_planner, warm_translator

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle
    warm_translator()
    proc.search_binary()
    proc.validate_binary()
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if msg is None:
            return
        job_id, domain, problem, cfg_dict = msg
        cfg = SolverConfig(**cfg_dict)
        try:
            v = run_planner(domain, problem, cfg)
        except Exception as exc:  # noqa: BLE001 - a bug must become a verdict, not a dead fleet
            log.exception("solver worker failed on a spec")
            v = Verdict.failure(Category.UNREACHABLE_SEARCH, f"internal solver error: {type(exc).__name__}: {exc}",
                                stage="internal")
        conn.send((job_id, v.to_json()))
        if v.memory_out and v.stage == "translate":
            return  # the translator ran out of memory in this process: start afresh


if __name__ == "__main__":
    import sys
    from multiprocessing.connection import Connection

    _worker_main(Connection(int(sys.argv[1])))
