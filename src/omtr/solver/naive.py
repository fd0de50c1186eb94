"""The naive way to solve a spec, as a reference for omtr's verdicts.

Fast Downward's own driver (``fast-downward.py --alias lama-first``) as a fresh subprocess, then
VAL's ``Validate`` on the plan it wrote: how LLM+P-style code calls the planner. The conformance
tests and the benchmarks compare omtr against it; nothing in the environment itself uses it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from omtr.solver.proc import driver_script, validate_binary


@dataclass
class NaiveResult:
    solved: bool  # the driver wrote a plan and VAL says "Plan valid"
    planned: bool  # the driver wrote a plan (VAL may still reject it)
    output: str  # the tail of the driver's output, or of VAL's when a plan was written


def _bytes(x: str | bytes) -> bytes:
    return x if isinstance(x, bytes) else x.encode("utf-8")


def plain_driver_run(domain: str | bytes, problem: str | bytes, *, time_limit_s: float = 20,
                     memory_limit_mb: int | None = None, alias: str = "lama-first",
                     tail: int = 800) -> NaiveResult:
    """Solve one spec the naive way; ``time_limit_s`` is the driver's ``--overall-time-limit``."""
    tmp = tempfile.mkdtemp(prefix="omtr-naive-")
    try:
        paths = [os.path.join(tmp, "domain.pddl"), os.path.join(tmp, "problem.pddl")]
        for path, data in zip(paths, (domain, problem)):
            with open(path, "wb") as f:
                f.write(_bytes(data))
        plan = os.path.join(tmp, "sas_plan")
        limits = ["--overall-time-limit", str(max(1, int(time_limit_s)))]
        if memory_limit_mb:
            limits += ["--overall-memory-limit", f"{int(memory_limit_mb)}M"]
        try:
            run = subprocess.run(
                [sys.executable, driver_script(), "--plan-file", plan, *limits, "--alias", alias, *paths],
                cwd=tmp, capture_output=True, timeout=time_limit_s + 30,
            )
            out = (run.stdout + run.stderr).decode("utf-8", "replace")
        except subprocess.TimeoutExpired:
            out = f"the driver ran past {time_limit_s + 30:.0f} s of wall clock"
        if not os.path.exists(plan):
            return NaiveResult(False, False, out[-tail:])
        try:
            val = subprocess.run([validate_binary(), *paths, plan], cwd=tmp, capture_output=True,
                                 timeout=time_limit_s + 30)
            vout = val.stdout.decode("utf-8", "replace")
        except subprocess.TimeoutExpired:
            vout = "VAL ran past its wall clock"
        return NaiveResult("Plan valid" in vout, True, vout[-tail:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def plain_driver_solves(domain: str | bytes, problem: str | bytes, *, time_limit_s: float = 20,
                        memory_limit_mb: int | None = 2048) -> tuple[bool, str]:
    """``(solved, output tail)`` of :func:`plain_driver_run`."""
    r = plain_driver_run(domain, problem, time_limit_s=time_limit_s, memory_limit_mb=memory_limit_mb)
    return r.solved, r.output
