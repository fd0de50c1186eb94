"""The local solver fleet: long-lived worker processes with a warm translator.

The caller's process lints every spec (milliseconds, no planner) and answers repeated specs
from the cache; only specs that need the planner travel to a worker over a socket. Each worker is
watched with a wall clock: a worker that does not answer in time, or dies, is killed together
with its planner processes (they carry a parent-death signal) and replaced.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import threading
import time
from typing import Iterable, Sequence

from omtr.config import SolverConfig
from omtr.pddl.categories import Category
from omtr.solver.cache import ResultCache, exact_key, spec_key
from omtr.solver.lint import lint_verdict
from omtr.solver.verdict import Verdict

log = logging.getLogger(__name__)


class _Worker:
    """One worker: ``python -m omtr.solver.worker FD`` speaking pickles over a socket pair.

    A plain subprocess (not multiprocessing's spawn) so that the caller's ``__main__`` module is
    never re-imported in the worker.
    """

    def __init__(self):
        import socket
        import subprocess
        import sys
        from multiprocessing.connection import Connection

        from omtr.solver import proc

        mine, theirs = socket.socketpair()
        env = dict(os.environ)
        src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "omtr.solver.worker", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            preexec_fn=proc.die_with_parent,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.parent = Connection(mine.detach())
        self.ready = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

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
        from omtr.solver.proc import kill_children

        if self.alive():
            kill_children(self.process.pid)  # its planner calls first: they would outlive it
            self.process.kill()
        self.process.wait(timeout=10)
        self.parent.close()

    def stop(self) -> None:
        try:
            self.parent.send(None)
        except (OSError, BrokenPipeError):
            pass
        try:
            self.process.wait(timeout=5)
        except Exception:  # noqa: BLE001 - still running: make sure it goes
            self.process.kill()
            self.process.wait(timeout=5)
        self.parent.close()


class SolverPool:
    """A fixed number of solver workers; thread-safe ``solve_many``.

    Use as a context manager, or call :meth:`close`. ``cache`` may be shared between pools.

    ``workers=0`` plans in the calling process instead, with no worker to start: the fastest way
    to check one spec (``omtr solve domain.pddl problem.pddl``). The translator then runs in this
    process under its CPU-time signal, which needs the main thread, and holds global state, so
    use it from a single thread of a short-lived process; long runs want workers.
    """

    def __init__(self, workers: int = 1, config: SolverConfig | None = None, cache: ResultCache | None = None):
        if workers < 0:
            raise ValueError(f"workers must be >= 0 (0: plan in this process), got {workers}")
        self.config = config or SolverConfig()
        self.cache = cache if cache is not None else (
            ResultCache(self.config.cache_max_entries, self.config.cache_dir) if self.config.cache else None
        )
        self._jobs: queue.Queue = queue.Queue()
        # Each worker is started by the dispatch thread that feeds it, never by the caller's thread: a
        # worker's parent-death signal (Linux PR_SET_PDEATHSIG) follows the *thread* that forked it, so
        # a pool first used from a short-lived thread would lose its workers when that thread ended.
        self._workers: list = [None] * workers
        started = [threading.Event() for _ in range(workers)]
        failed: list = [None] * workers
        self._threads = [
            threading.Thread(target=self._dispatch, args=(i, started[i], failed), daemon=True,
                             name=f"omtr-solver-{i}")
            for i in range(workers)
        ]
        self._closed = False
        for t in self._threads:
            t.start()
        for e in started:
            e.wait()
        errors = [f for f in failed if f is not None]
        if errors:
            self.close()
            raise errors[0]

    @property
    def workers(self) -> int:
        return len(self._workers)

    def worker_pids(self) -> list[int]:
        return [w.pid for w in self._workers]

    # ------------------------------------------------------------------ dispatch (one thread each)
    def _dispatch(self, i: int, started: threading.Event, failed: list) -> None:
        try:
            w = _Worker()
            w.wait_ready()
            self._workers[i] = w
        except BaseException as exc:  # noqa: BLE001 - raised by the constructor, in the caller's thread
            failed[i] = exc
            return
        finally:
            started.set()
        while True:
            item = self._jobs.get()
            if item is None:
                return
            domain, problem, cfg, done = item
            done.started = time.perf_counter()
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
                if not w.alive() or v.memory_out and v.stage == "translate":
                    self._replace(i)
                return v
            self._replace(i)
            return Verdict.failure(
                Category.UNREACHABLE_SEARCH,
                f"time limit: the solver worker gave no answer within {deadline_s:.0f} s wall clock and was killed",
                stage="search", timed_out=True, timings={"total_ms": (time.perf_counter() - t0) * 1000},
            )
        except (EOFError, OSError, BrokenPipeError):
            code = w.process.poll()
            self._replace(i)
            return Verdict.failure(
                Category.UNREACHABLE_SEARCH,
                f"the solver worker died (exit {code}) on this spec, most likely out of memory "
                f"(limit {cfg.memory_limit_mb} MiB); not a proof of unsolvability",
                stage="search", memory_out=True, timings={"total_ms": (time.perf_counter() - t0) * 1000},
            )

    @staticmethod
    def _run_here(domain: str, problem: str, cfg: SolverConfig) -> Verdict:
        from omtr.solver.pipeline import run_planner

        try:
            return run_planner(domain, problem, cfg)
        except Exception as exc:  # noqa: BLE001 - as in a worker: a bug becomes a verdict
            log.exception("the in-process solver failed on a spec")
            return Verdict.failure(Category.UNREACHABLE_SEARCH, f"internal solver error: {type(exc).__name__}: {exc}",
                                   stage="internal")

    def _replace(self, i: int) -> None:
        self._workers[i].kill()
        w = _Worker()
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
        lint_ms: dict[str, float] = {}
        lint_warnings: dict[str, list[str]] = {}
        bar = Progress(len(specs), "solving", quiet=not progress)
        use_cache = self.cache is not None and cfg.cache
        exact_keys: dict[int, str] = {}
        for idx, spec in enumerate(specs):
            t0 = time.perf_counter()
            domain, problem = spec[0], spec[1]
            if use_cache:  # byte-identical spec seen before: no lint, no planner
                exact = exact_keys[idx] = exact_key(domain, problem, cfg)
                hit = self.cache.get(exact)
                if hit is not None:
                    hit.timings = {"total_ms": (time.perf_counter() - t0) * 1000}
                    out[idx] = hit
                    bar.update()
                    continue
            v, res, ms = lint_verdict(domain, problem, cfg)
            if v is not None:
                if use_cache:
                    self.cache.put(exact_keys[idx], v)
                out[idx] = v
                bar.update()
                continue
            domain, problem = res.domain_text, res.problem_text  # decoded text
            key = spec_key(domain, problem, cfg)
            hit = self.cache.get(key) if use_cache else None
            if hit is not None:
                hit.timings = {"lint_ms": ms, "total_ms": (time.perf_counter() - t0) * 1000}
                self.cache.put(exact_keys[idx], hit)
                out[idx] = hit
                bar.update()
                continue
            if key in pending:
                pending[key].append(idx)
                continue
            pending[key] = [idx]
            lint_ms[key], lint_warnings[key] = ms, res.warnings
            fut = futures[key] = _Future()
            if self._workers:
                self._jobs.put((domain, problem, cfg, fut))
            else:
                fut.set_result(self._run_here(domain, problem, cfg))
        for key, idxs in pending.items():
            fut = futures[key]
            v = fut.result()
            if v.timed_out or v.memory_out:  # logged, never mistaken for a proof of unsolvability
                log.info("resource limit (%s): %s", "time" if v.timed_out else "memory", v.message)
            v.warnings = lint_warnings[key] + [w for w in v.warnings if w not in lint_warnings[key]]
            v.timings["lint_ms"] = lint_ms[key]
            v.timings["total_ms"] = (fut.finished - fut.started) * 1000 + lint_ms[key]
            if use_cache:
                self.cache.put(key, v)
                for idx in idxs:
                    self.cache.put(exact_keys[idx], v)
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
            if w is not None:
                w.stop()

    def __enter__(self) -> "SolverPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Future:
    def __init__(self):
        self.started = self.finished = time.perf_counter()
        self._event = threading.Event()
        self._value: Verdict | None = None

    def set_result(self, v: Verdict) -> None:
        self._value = v
        self.finished = time.perf_counter()
        self._event.set()

    def result(self) -> Verdict:
        self._event.wait()
        return self._value  # type: ignore[return-value]

