"""The solver-grounded environment E(y) -> Verdict.

    >>> from omtr.solver import solve
    >>> v = solve(domain_text, problem_text)          # doctest: +SKIP
    >>> v.success, v.category, v.message, v.plan      # doctest: +SKIP

``solve`` and ``solve_many`` use a process-wide pool of warm workers and a process-wide
in-memory cache; for long-running work (training, evaluation) hold a :class:`SolverPool`.
"""

from __future__ import annotations

import atexit
import importlib
import threading
from typing import TYPE_CHECKING

from omtr.config import SolverConfig
from omtr.pddl.categories import Category
from omtr.solver.lint import lint  # eager: the name would otherwise resolve to the submodule
from omtr.solver.verdict import Verdict

if TYPE_CHECKING:
    from omtr.solver.cache import ResultCache, normalise, spec_key
    from omtr.solver.pipeline import PlanCheck, validate_plan
    from omtr.solver.pool import SolverPool

# Imported on first use, so that one-off commands load only the parts they run.
_LAZY = {
    "ResultCache": "omtr.solver.cache", "normalise": "omtr.solver.cache", "spec_key": "omtr.solver.cache",
    "PlanCheck": "omtr.solver.pipeline", "validate_plan": "omtr.solver.pipeline",
    "SolverPool": "omtr.solver.pool",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'omtr.solver' has no attribute {name!r}")

__all__ = [
    "Category", "PlanCheck", "ResultCache", "SolverConfig", "SolverPool", "Verdict",
    "lint", "normalise", "shared_pool", "solve", "solve_many", "spec_key", "validate_plan",
]

_lock = threading.Lock()
_pools: "dict[int, SolverPool]" = {}
_cache: "ResultCache | None" = None


def shared_cache() -> "ResultCache":
    global _cache
    if _cache is None:
        from omtr.solver.cache import ResultCache

        _cache = ResultCache()
    return _cache


def shared_pool(workers: int = 1) -> "SolverPool":
    """The process-wide pool with ``workers`` workers (started on first use, closed at exit)."""
    from omtr.solver.pool import SolverPool

    with _lock:
        pool = _pools.get(workers)
        if pool is None or pool._closed:
            pool = _pools[workers] = SolverPool(workers, cache=shared_cache())
        return pool


@atexit.register
def _close_pools() -> None:
    for pool in list(_pools.values()):
        pool.close()
    _pools.clear()


def solve(domain_text, problem_text, config: SolverConfig | None = None) -> Verdict:
    """E(y): the verdict for one spec. Never raises for bad input; it becomes a verdict."""
    return solve_many([(domain_text, problem_text)], workers=1, config=config)[0]


def solve_many(specs, workers: int = 1, config: SolverConfig | None = None, *, progress: bool = False) -> list[Verdict]:
    """Verdicts for ``(domain, problem)`` pairs in input order, over ``workers`` processes."""
    cfg = config or SolverConfig()
    if cfg.cache_dir:  # a pool of its own, whose cache lives in cache_dir
        from omtr.solver.pool import SolverPool

        with SolverPool(workers, cfg) as own:
            return own.solve_many(specs, cfg, progress=progress)
    return shared_pool(workers).solve_many(specs, cfg, progress=progress)
