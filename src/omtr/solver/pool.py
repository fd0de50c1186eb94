"""The local solver fleet: long-lived worker processes with a warm translator.

The caller's process lints every spec (milliseconds, no planner) and answers repeated specs
from the cache; only specs that need the planner travel to a worker over a pipe. Each worker is
watched with a wall clock: a worker that does not answer in time, or dies, is killed together
with its planner processes (they carry a parent-death signal) and replaced.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import os
import queue
import resource
import threading
import time
from typing import Iterable, Sequence

from omtr.config import SolverConfig
from omtr.solver.cache import ResultCache, spec_key
from omtr.solver.lint import lint
from omtr.solver.verdict import Verdict
from omtr.spec.categories import Category

log = logging.getLogger(__name__)


def _lint_verdict(domain, problem, cfg: SolverConfig):
    """(verdict or None, lint result, lint ms)."""
    t0 = time.perf_counter()
    res = lint(domain, problem, cfg)
    ms = (time.perf_counter() - t0) * 1000
    if res.error is not None:
        e = res.error
        v = Verdict.failure(e.category, e.message, stage="lint", warnings=res.warnings)
        v.timings = {"lint_ms": ms, "total_ms": ms}
        return v, res, ms
    return None, res, ms


# ------------------------------------------------------------------------------------- worker


def _worker_main(conn, memory_limit_mb: int) -> None:
    from omtr.solver import proc
    from omtr.solver.pipeline import run_planner, warm_translator

    proc.die_with_parent()
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
        _limit_own_memory(cfg.memory_limit_mb)
        _, res, lint_ms = _lint_verdict(domain, problem, cfg)
        try:
            v = run_planner(domain, problem, cfg, res)
        except Exception as exc:  # noqa: BLE001 - a bug must become a verdict, not a dead fleet
            log.exception("solver worker failed on a spec")
            v = Verdict.failure(Category.UNREACHABLE_SEARCH, f"internal solver error: {type(exc).__name__}: {exc}",
                                stage="internal")
        v.timings["lint_ms"] = lint_ms
        conn.send((job_id, v.to_json()))
        if v.memory_out and v.stage == "translate":
            return  # the translator ran out of memory in this process: start afresh


def _limit_own_memory(memory_mb: int) -> None:
    """The in-process translator may use ``memory_mb`` on top of what the worker already maps.

    Only the soft limit moves (it may go up again for the next job); planner subprocesses set
    their own limits.
    """
    try:
        with open("/proc/self/statm") as f:
            vm_bytes = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        soft = vm_bytes + memory_mb * 1024 * 1024
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    except (OSError, ValueError):
        pass


class _Worker:
    def __init__(self, ctx, memory_limit_mb: int):
        self.parent, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child, memory_limit_mb), daemon=True)
        self.process.start()
        child.close()
        self.ready = False

    def wait_ready(self, timeout: float = 120.0) -> None:
        if self.ready:
            return
        if not self.parent.poll(timeout):
            self.kill()
            raise RuntimeError("a solver worker did not start within %.0f s" % timeout)
        tag, _ = self.parent.recv()
        assert tag == "ready"
        self.ready = True

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.parent.close()

    def stop(self) -> None:
        try:
            self.parent.send(None)
        except (OSError, BrokenPipeError):
            pass
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        self.parent.close()


class SolverPool:
    """A fixed number of solver workers; thread-safe ``solve_many``.

    Use as a context manager, or call :meth:`close`. ``cache`` may be shared between pools.
    """

    def __init__(self, workers: int = 1, config: SolverConfig | None = None, cache: ResultCache | None = None):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.config = config or SolverConfig()
        self.cache = cache if cache is not None else (
            ResultCache(self.config.cache_max_entries, self.config.cache_dir) if self.config.cache else None
        )
        self._ctx = mp.get_context("spawn")
        self._jobs: queue.Queue = queue.Queue()
        self._workers = [self._new_worker() for _ in range(workers)]
        for w in self._workers:
            w.wait_ready()
        self._threads = [
            threading.Thread(target=self._dispatch, args=(i,), daemon=True, name=f"omtr-solver-{i}")
            for i in range(workers)
        ]
        self._closed = False
        for t in self._threads:
            t.start()

    def _new_worker(self) -> _Worker:
        return _Worker(self._ctx, self.config.memory_limit_mb)

    @property
    def workers(self) -> int:
        return len(self._workers)

    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    # ------------------------------------------------------------------ dispatch (one thread each)
    def _dispatch(self, i: int) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            domain, problem, cfg, done = item
            done.set_result(self._run_on_worker(i, domain, problem, cfg))

    def _run_on_worker(self, i: int, domain: str, problem: str, cfg: SolverConfig) -> Verdict:
        w = self._workers[i]
        # translate + search + validate each get the CPU limit; the wall clock covers them all.
        deadline_s = 3 * (cfg.time_limit_s + cfg.wall_clock_slack_s) + 10
        t0 = time.perf_counter()
        try:
            w.parent.send((0, domain, problem, dataclasses.asdict(cfg)))
            if w.parent.poll(deadline_s):
                _, d = w.parent.recv()
                v = Verdict.from_json(d)
                if not w.process.is_alive() or v.memory_out and v.stage == "translate":
                    self._replace(i)
                return v
            self._replace(i)
            return Verdict.failure(
                Category.UNREACHABLE_SEARCH,
                f"time limit: the solver worker gave no answer within {deadline_s:.0f} s wall clock and was killed",
                stage="search", timed_out=True, timings={"total_ms": (time.perf_counter() - t0) * 1000},
            )
        except (EOFError, OSError, BrokenPipeError):
            code = w.process.exitcode
            self._replace(i)
            return Verdict.failure(
                Category.UNREACHABLE_SEARCH,
                f"the solver worker died (exit {code}) on this spec, most likely out of memory "
                f"(limit {cfg.memory_limit_mb} MiB); not a proof of unsolvability",
                stage="search", memory_out=True, timings={"total_ms": (time.perf_counter() - t0) * 1000},
            )

    def _replace(self, i: int) -> None:
        self._workers[i].kill()
        w = self._new_worker()
        w.wait_ready()
        self._workers[i] = w

    # ---------------------------------------------------------------------------------- public
    def solve(self, domain, problem, config: SolverConfig | None = None) -> Verdict:
        return self.solve_many([(domain, problem)], config=config)[0]

    def solve_many(self, specs: Iterable[Sequence], config: SolverConfig | None = None,
                   progress: bool = False) -> list[Verdict]:
        """Verdicts for ``(domain, problem)`` pairs, in input order."""
        if self._closed:
            raise RuntimeError("this SolverPool is closed")
        from omtr.progress import Progress

        cfg = config or self.config
        specs = list(specs)
        out: list[Verdict | None] = [None] * len(specs)
        pending: dict[str, list[int]] = {}
        futures: dict[str, _Future] = {}
        lint_ms: dict[int, float] = {}
        bar = Progress(len(specs), "solving", quiet=not progress)
        for idx, spec in enumerate(specs):
            t0 = time.perf_counter()
            domain, problem = spec[0], spec[1]
            v, res, ms = _lint_verdict(domain, problem, cfg)
            if v is not None:
                out[idx] = v
                bar.update()
                continue
            domain, problem = res.domain_text, res.problem_text  # decoded text
            key = spec_key(domain, problem, cfg)
            hit = self.cache.get(key) if self.cache is not None and cfg.cache else None
            if hit is not None:
                hit.timings = {"lint_ms": ms, "total_ms": (time.perf_counter() - t0) * 1000}
                out[idx] = hit
                bar.update()
                continue
            lint_ms[idx] = ms
            if key in pending:
                pending[key].append(idx)
                continue
            pending[key] = [idx]
            fut = futures[key] = _Future(time.perf_counter())
            self._jobs.put((domain, problem, cfg, fut))
        for key, idxs in pending.items():
            fut = futures[key]
            v = fut.result()
            v.timings["total_ms"] = (fut.finished - fut.started) * 1000
            if self.cache is not None and cfg.cache:
                self.cache.put(key, v)
            for n, idx in enumerate(idxs):
                if n == 0:
                    out[idx] = v
                else:
                    dup = Verdict.from_json(v.to_json())
                    dup.cached = True
                    out[idx] = dup
                bar.update()
        bar.close()
        return out  # type: ignore[return-value]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join(timeout=10)
        for w in self._workers:
            w.stop()

    def __enter__(self) -> "SolverPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Future:
    def __init__(self, started: float):
        self.started = started
        self.finished = started
        self._event = threading.Event()
        self._value: Verdict | None = None

    def set_result(self, v: Verdict) -> None:
        self._value = v
        self.finished = time.perf_counter()
        self._event.set()

    def result(self) -> Verdict:
        self._event.wait()
        return self._value  # type: ignore[return-value]
