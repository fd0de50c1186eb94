"""Progress for long work: a log line with count, rate and ETA every few seconds.

Quiet when ``quiet=True``, when the ``CI`` environment variable is set, or when INFO logging is off.
"""

from __future__ import annotations

import logging
import os
import time


class Progress:
    def __init__(self, total: int | None, desc: str, *, quiet: bool = False, every_s: float = 2.0,
                 logger: logging.Logger | None = None, batch: int | None = None):
        self.total, self.desc, self.every_s = total, desc, every_s
        # Items that finish in batches (episodes generated together): no ETA until a whole first
        # batch is done (one batch's first finisher says nothing of the rate).
        self.batch = batch
        self.log = logger or logging.getLogger("omtr.progress")
        self.enabled = not quiet and not os.environ.get("CI") and self.log.isEnabledFor(logging.INFO)
        self.done = 0
        self.tokens = 0  # tokens processed, when the caller counts them (a rate in tokens/s)
        self.start = self.last = time.monotonic()

    def update(self, n: int = 1, *, tokens: int = 0) -> None:
        self.done += n
        self.tokens += tokens
        now = time.monotonic()
        if self.enabled and now - self.last >= self.every_s:
            self.last = now
            self.log.info("%s", self.line(now))

    def line(self, now: float | None = None) -> str:
        now = now or time.monotonic()
        elapsed = max(now - self.start, 1e-9)
        rate = self.done / elapsed
        toks = f", {self.tokens / elapsed:.0f} tokens/s" if self.tokens else ""
        if self.total:
            head = f"{self.desc}: {self.done}/{self.total} ({100 * self.done / self.total:.0f}%) {rate:.1f}/s{toks}"
            if self.batch and self.done < min(self.batch, self.total):
                return f"{head}, ETA after the first batch of {min(self.batch, self.total)}"
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            return f"{head}, ETA {eta:.0f}s"
        return f"{self.desc}: {self.done} done, {rate:.1f}/s{toks}"

    def close(self) -> None:
        if self.enabled and self.done and time.monotonic() - self.start >= self.every_s:
            self.log.info("%s (finished)", self.line())


class GenerationProgress:
    """Progress of one batched generation, logged while it runs: new tokens/s, sequences still
    running, elapsed. The first line comes after ``first_s``, then one every ``every_s``; quiet
    under the same rules as :class:`Progress` (``--quiet`` sets WARNING logging; ``CI``)."""

    def __init__(self, desc: str, sequences: int, *, first_s: float = 5.0, every_s: float = 10.0,
                 logger: logging.Logger | None = None):
        self.desc, self.sequences, self.every_s = desc, sequences, every_s
        self.log = logger or logging.getLogger("omtr.progress")
        self.enabled = not os.environ.get("CI") and self.log.isEnabledFor(logging.INFO)
        self.tokens = 0
        self.running = sequences
        self.start = time.monotonic()
        self.next = self.start + first_s
        self.lines = 0
        self.prefill_total = self.prefill_done = self.prefill_cached = 0
        self.prefill_start = self.start

    # The prefill: prompt tokens computed (and found in the prefix cache), logged like the decode.
    def start_prefill(self, total: int) -> None:
        self.prefill_total, self.prefill_done, self.prefill_cached = total, 0, 0
        self.prefill_start = time.monotonic()

    def prefill(self, tokens: int, *, cached: bool = False) -> None:
        self.prefill_done += tokens
        if cached:
            self.prefill_cached += tokens
        if self.enabled:
            now = time.monotonic()
            if now >= self.next:
                self.next = now + self.every_s
                self.lines += 1
                self.log.info("%s", self.prefill_line(now))

    def prefill_line(self, now: float | None = None) -> str:
        elapsed = max((now or time.monotonic()) - self.prefill_start, 1e-9)
        computed = self.prefill_done - self.prefill_cached
        return (f"prefilling ({self.desc}): {self.prefill_done}/{self.prefill_total} prompt tokens "
                f"({self.prefill_cached} from the prefix cache), {computed / elapsed:.0f} tokens/s computed, "
                f"{elapsed:.0f} s elapsed")

    def end_prefill(self) -> None:
        if self.enabled and self.lines:
            self.log.info("%s (done)", self.prefill_line())

    def step(self, new_tokens: int, running: int) -> None:
        self.tokens += new_tokens
        self.running = running
        if self.enabled:
            now = time.monotonic()
            if now >= self.next:
                self.next = now + self.every_s
                self.lines += 1
                self.log.info("%s", self.line(now))

    def line(self, now: float | None = None) -> str:
        elapsed = max((now or time.monotonic()) - self.start, 1e-9)
        return (f"generating ({self.desc}): {self.running}/{self.sequences} sequences running, "
                f"{self.tokens} new tokens, {self.tokens / elapsed:.1f} tokens/s, {elapsed:.0f} s elapsed")

    def close(self) -> None:
        if self.enabled and self.lines:
            self.log.info("%s (done)", self.line())
