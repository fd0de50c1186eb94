"""Resident memory by phase of a training update, and handing freed heap memory back to the system.

:class:`PhaseMemory` keeps, for each phase the trainer names (``with mem.phase("rollout"): ...``),
the resident set (``/proc/self/statm``) at its start and end and the process's high-water mark
(``VmHWM``, the kernel's own figure, what GNU ``time -v`` reports at the end) when it ends, in MiB;
with a sampling interval also the phase's own peak, sampled on a daemon thread (torch's CPU kernels
release the GIL, so it runs during them). The trainer logs them as ``mem_<phase>_end_mb``,
``mem_<phase>_hwm_mb`` (``mem_<phase>_peak_mb`` when sampled; ``memory_sample_ms``) and ``mem_hwm_mb``.
The high-water mark is never reset (``/proc/self/clear_refs`` would also reset what
``getrusage``/``time -v`` report).

:func:`trim_heap` asks glibc to return the free memory at the top of its heaps and in whole free
pages inside them to the system (``malloc_trim(0)``): after a phase that made and freed many
tensors (the rollout's KV caches, the update's activations) the allocator otherwise keeps those
pages resident, and the next phase's peak lands on top of them. It changes no value anywhere.
Where glibc is not the C library (musl, macOS) it does nothing and says so by returning False.

:func:`ask_huge_pages` turns on torch's transparent-huge-page advice for its CPU blocks of 2 MiB
and more (``THP_MEM_ALLOC_ENABLE``), which torch reads once, at its first allocation: ``omtr train``
asks before it imports torch (the ``huge_pages`` training setting).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import sys
import threading

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_LIBC = None
log = logging.getLogger(__name__)
HUGE_PAGES_ENV = "THP_MEM_ALLOC_ENABLE"  # torch's: advise MADV_HUGEPAGE on CPU blocks of 2 MiB and more


def rss_mb() -> float | None:
    """The process's resident set now, in MiB (None where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE / 2**20
    except OSError:
        return None


def hwm_mb() -> float | None:
    """The process's resident high-water mark (``VmHWM``) so far, in MiB (None where unknown)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def trim_heap() -> bool:
    """``malloc_trim(0)``: glibc returns its free heap memory to the system. False where unavailable."""
    global _LIBC
    if _LIBC is None:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC = lib if hasattr(lib, "malloc_trim") else False
        except OSError:
            _LIBC = False
    if not _LIBC:
        return False
    _LIBC.malloc_trim(0)
    return True


M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
MMAP_THRESHOLD = 1 << 20  # bytes: blocks of this size and more get pages of their own (lean_memory)


def fix_mmap_threshold(nbytes: int = MMAP_THRESHOLD) -> bool:
    """``mallopt(M_MMAP_THRESHOLD, nbytes)``: glibc serves every block of ``nbytes`` or more with pages
    of its own, handed back to the system when the block is freed. By default the threshold rises
    with each such block freed (up to 32 MiB), after which tensors of up to 32 MiB (activations, KV
    cache blocks) come from the heap, whose free pages stay resident and stack under the next
    phase's peak. Fixing it also fixes the heap's trim threshold (128 KiB). Process-wide; changes no
    value. False where unavailable (not glibc)."""
    if not trim_heap():  # loads libc; False: not glibc
        return False
    return bool(_LIBC.mallopt(M_MMAP_THRESHOLD, int(nbytes)))


ROLLOUT_MMAP_THRESHOLD = 32 << 20  # glibc's own ceiling for its dynamic threshold (64-bit)
# lean_memory's threshold in the rollout: the fast engine's blocks of keys and values (a prefix-cache
# block of SmolLM2 5.9 MiB, a row cache's layer ~18 MiB and growing by concatenation every 64 tokens,
# a prompt prefix's keys ~30 MiB) and the prefill's activations get pages of their own and leave
# when freed, instead of widening a heap whose free pages stay resident under the rollout's peak.
LEAN_ROLLOUT_MMAP_THRESHOLD = MMAP_THRESHOLD


@contextlib.contextmanager
def mmap_threshold(nbytes: int = MMAP_THRESHOLD, after: int = ROLLOUT_MMAP_THRESHOLD):
    """:func:`fix_mmap_threshold` at ``nbytes`` inside, ``after`` on the way out. The trainer wraps its
    passes that train (few, large blocks: page faults cost little beside their matrix products) and,
    under ``lean_memory``, its rollout (:data:`LEAN_ROLLOUT_MMAP_THRESHOLD`); between them, and
    without ``lean_memory``, glibc's threshold ends at 32 MiB (its own ceiling) anyway;
    :func:`trim_heap` after each phase hands its freed heap pages back."""
    fix_mmap_threshold(nbytes)
    try:
        yield
    finally:
        fix_mmap_threshold(after)


class PhaseMemory:
    """Resident memory of named phases (see the module doc).

    Without a sampling interval (the trainer's default) no thread runs: each phase records the
    resident set at its start and end and the process's high-water mark at its end (``VmHWM``;
    a phase after which it is higher than before set the process's peak, and that is its peak).
    With ``interval_s`` a daemon thread samples the resident set, and each phase's own peak is
    recorded too. On a machine with as many busy threads as cores, a thread that wakes every few
    milliseconds slows torch's CPU kernels (their threads wait for each other): sample only to
    profile."""

    def __init__(self, interval_s: float | None = None, *, enabled: bool = True):
        self.enabled = enabled and rss_mb() is not None
        self.interval_s = interval_s if interval_s and interval_s > 0 else None
        self.phases: dict[str, dict[str, float]] = {}
        self._peak = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            r = rss_mb()
            if r is not None:
                with self._lock:
                    self._peak = max(self._peak, r)

    def _ensure_thread(self) -> None:
        if self._thread is None and self.interval_s is not None:
            self._thread = threading.Thread(target=self._run, name="omtr-rss", daemon=True)
            self._thread.start()

    @contextlib.contextmanager
    def phase(self, name: str):
        if not self.enabled:
            yield
            return
        self._ensure_thread()
        start = rss_mb() or 0.0
        with self._lock:
            outer = self._peak
            self._peak = start
        try:
            yield
        finally:
            end = rss_mb() or 0.0
            with self._lock:
                peak = max(self._peak, end)
                self._peak = max(outer, peak)  # an enclosing phase keeps its own peak
            rec = {"start_mb": start, "end_mb": end, "hwm_mb": hwm_mb() or 0.0}
            if self.interval_s is not None:
                rec["peak_mb"] = peak
            self.phases[name] = rec

    def metrics(self) -> dict[str, float]:
        """``mem_<phase>_end_mb`` and ``mem_<phase>_hwm_mb`` (and, sampled, ``mem_<phase>_peak_mb``) of
        the phases since :meth:`reset`, and ``mem_hwm_mb``."""
        out: dict[str, float] = {}
        for name, p in self.phases.items():
            for k in ("peak_mb", "end_mb", "hwm_mb"):
                if k in p:
                    out[f"mem_{name}_{k}"] = round(p[k], 1)
        hwm = hwm_mb()
        if self.enabled and hwm is not None:
            out["mem_hwm_mb"] = round(hwm, 1)
        return out

    def reset(self) -> None:
        self.phases = {}

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None
        self._stop = threading.Event()


def ask_huge_pages(on: bool) -> bool:
    """Ask torch's CPU allocator to advise transparent huge pages (``madvise(MADV_HUGEPAGE)``) for
    its blocks of 2 MiB and more, through ``THP_MEM_ALLOC_ENABLE``, which torch reads once, at its
    first allocation: so this must run before torch is imported. A value the environment already
    holds decides (``THP_MEM_ALLOC_ENABLE=0 omtr train ...`` keeps 4 KiB pages whatever the setting).
    Returns whether the advice is on for this process; False, with a debug line, where torch was
    imported first. Changes no value; where the kernel's THP mode is ``never`` the advice does
    nothing. Measured (2 cores): with the training passes' heap (``lean_heap_mb``) the PPO phase
    took 47.6 s against 57.7 s and peaked at 2,184 MB against 3,098 MB."""
    if HUGE_PAGES_ENV in os.environ:
        return os.environ[HUGE_PAGES_ENV].strip().lower() in ("1", "true", "on", "yes")
    if "torch" in sys.modules:
        log.debug("huge_pages: torch is already imported, so its allocator keeps the setting it read")
        return False
    os.environ[HUGE_PAGES_ENV] = "1" if on else "0"
    return on
