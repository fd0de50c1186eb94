"""How a Kubeflow component runs its one ``omtr`` subcommand: a child process with a wall clock.

Kubeflow Pipelines v2 has no per-task time-out that every backend honours (kfp-kubernetes'
``set_timeout`` sets the pod's ``activeDeadlineSeconds``, which the local runner ignores), so each
component passes its time-out here: the subcommand runs in its own process group, and when the
time is up the group gets SIGTERM (``omtr train`` writes a checkpoint on it), then SIGKILL after a
grace period. A failure raises :class:`StepError`, which fails the task.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

log = logging.getLogger("omtr.step")

GRACE_S = 30.0  # between SIGTERM and SIGKILL


class StepError(RuntimeError):
    """The subcommand failed or ran out of time; the message names it and its exit status."""


def run_omtr(args: list[str], *, timeout_s: float, env: dict[str, str] | None = None, ok: tuple[int, ...] = (0,),
             cwd: str | None = None) -> int:
    """Run ``omtr ARGS`` (the interpreter this process runs on) and return its exit status.

    ``env`` entries are added to this process's environment; an empty value removes the variable
    (so an empty pipeline parameter means "not set"). Exit statuses outside ``ok`` raise StepError."""
    full = dict(os.environ)
    for k, v in (env or {}).items():
        if v in ("", None):
            full.pop(k, None)
        else:
            full[k] = str(v)
    cmd = [sys.executable, "-m", "omtr", *[str(a) for a in args]]
    shown = "omtr " + " ".join(str(a) for a in args)
    log.info("$ %s (time-out %g s)", shown, timeout_s)
    print(f"$ {shown}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=full, cwd=cwd, start_new_session=True)
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _stop(proc)
        raise StepError(f"`{shown}` ran past its time-out of {timeout_s:g} s and was stopped; "
                        f"raise the step's time-out parameter or shrink its work") from None
    except BaseException:
        _stop(proc)
        raise
    log.info("`%s` exited with status %d after %.1f s", shown, rc, time.monotonic() - t0)
    if rc not in ok:
        raise StepError(f"`{shown}` exited with status {rc} (its output is in this task's log above)")
    return rc


def _stop(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
