"""Progress for long work: a log line with count, rate and ETA every few seconds.

Quiet when ``quiet=True``, when the ``CI`` environment variable is set, or when INFO logging is off.
"""

from __future__ import annotations

import logging
import os
import time


class Progress:
    def __init__(self, total: int | None, desc: str, *, quiet: bool = False, every_s: float = 2.0,
                 logger: logging.Logger | None = None):
        self.total, self.desc, self.every_s = total, desc, every_s
        self.log = logger or logging.getLogger("omtr.progress")
        self.enabled = not quiet and not os.environ.get("CI") and self.log.isEnabledFor(logging.INFO)
        self.done = 0
        self.start = self.last = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and now - self.last >= self.every_s:
            self.last = now
            self.log.info("%s", self.line(now))

    def line(self, now: float | None = None) -> str:
        now = now or time.monotonic()
        elapsed = max(now - self.start, 1e-9)
        rate = self.done / elapsed
        if self.total:
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            return (f"{self.desc}: {self.done}/{self.total} ({100 * self.done / self.total:.0f}%) "
                    f"{rate:.1f}/s, ETA {eta:.0f}s")
        return f"{self.desc}: {self.done} done, {rate:.1f}/s"

    def close(self) -> None:
        if self.enabled and self.done and time.monotonic() - self.start >= self.every_s:
            self.log.info("%s (finished)", self.line())
