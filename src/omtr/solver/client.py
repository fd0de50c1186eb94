"""The solver fleet's client: a drop-in for :func:`omtr.solver.solve_many` over HTTP.

    from omtr.solver.client import FleetClient
    with FleetClient(url="http://127.0.0.1:8600") as fleet:
        verdicts = fleet.solve_many(pairs, config=cfg)     # same order as `pairs`, like the local pool

    solve_many = solver_for()        # the fleet when OMTR_SOLVER_URL is set, else the local pool

Batches are split to the server's limits (specs and bytes) and sent over a pooled connection,
``concurrency`` at a time. 5xx answers and connection errors are retried ``retries`` times with
exponential back-off and full jitter; 429/503 (overload, a pod starting or draining) are waited
out for up to ``overload_wait_s``, honouring Retry-After. Every request carries an
Idempotency-Key kept across its retries, so a retried batch is answered from the first try's
result instead of being verified twice, and every answer is checked id by id against the batch.
When the fleet cannot be reached, :class:`FleetUnavailable` names the specs that were not
verified; no verdict is ever made up here.
"""

from __future__ import annotations

import base64
import json
import logging
import random
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Sequence

from omtr.config import FleetConfig, SolverConfig
from omtr.solver.verdict import Verdict

log = logging.getLogger(__name__)

_REQUEST_CONFIG_KEYS = ("time_limit_s", "memory_limit_mb", "search", "validate", "cache", "max_file_bytes",
                        "max_nesting")
_SPEC_OVERHEAD = 64  # JSON punctuation and id per spec, bytes (for splitting by size)


class FleetError(RuntimeError):
    """The fleet did not verify some specs. ``unverified``: their ids; ``verdicts``: what was verified."""

    def __init__(self, message: str, unverified: list[str] | None = None, verdicts: list | None = None):
        super().__init__(message)
        self.unverified = unverified or []
        self.verdicts = verdicts


class FleetUnavailable(FleetError):
    """The fleet could not be reached (or kept failing) after every retry."""


class FleetRequestError(FleetError):
    """The fleet refused a batch as malformed (a 4xx other than 429); retrying would not help."""

    def __init__(self, message: str, status: int, unverified=None, verdicts=None):
        super().__init__(message, unverified, verdicts)
        self.status = status


class FleetProtocolError(FleetError):
    """An answer that does not match its batch (count or ids): never used as verdicts."""


def _ids_text(ids: list[str], most: int = 20) -> str:
    shown = ", ".join(ids[:most])
    return shown + (f" and {len(ids) - most} more" if len(ids) > most else "")


class FleetClient:
    """Thread-safe client of one fleet URL (a Kubernetes Service in front of many pods, or one pod)."""

    def __init__(self, config: FleetConfig | None = None, **overrides):
        import httpx

        cfg = config or FleetConfig.from_env()
        if overrides:
            cfg = FleetConfig(**{**cfg.__dict__, **{k: v for k, v in overrides.items() if v is not None}})
        if not cfg.url:
            raise ValueError("FleetClient needs a url (FleetConfig.url or OMTR_SOLVER_URL)")
        self.config = cfg
        self.url = cfg.url.rstrip("/")
        headers = {"User-Agent": "omtr-fleet-client/1"}
        if cfg.token:
            headers["Authorization"] = f"Bearer {cfg.token}"
        self._http = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(cfg.read_timeout_s, connect=cfg.connect_timeout_s),
            limits=httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency),
        )
        self._info: dict | None = None
        self._lock = threading.Lock()
        self.stats = {"requests": 0, "retries": 0, "overloaded": 0, "replays": 0}

    # -------------------------------------------------------------------------------- basics
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "FleetClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] += 1

    def _sleep(self, attempt: int, retry_after: str | None) -> float:
        cfg = self.config
        delay = random.uniform(0, min(cfg.max_backoff_s, cfg.backoff_s * 2 ** attempt))  # full jitter
        if retry_after:
            try:
                delay = min(cfg.max_backoff_s, float(retry_after)) + random.uniform(0, cfg.backoff_s)
            except ValueError:
                pass
        time.sleep(delay)
        return delay

    def info(self) -> dict:
        """The server's limits (GET /v1/info), with retries; cached."""
        if self._info is None:
            self._info = self._get_json("/v1/info")
        return self._info

    def _get_json(self, path: str) -> dict:
        import httpx

        last = ""
        for attempt in range(self.config.retries + 1):
            try:
                r = self._http.get(self.url + path)
                if r.status_code == 200:
                    return r.json()
                last = f"HTTP {r.status_code}: {r.text[:200]}"
                if r.status_code < 500 and r.status_code not in (429, 503):
                    raise FleetRequestError(f"the solver fleet at {self.url} refused GET {path}: {last}",
                                            r.status_code)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
            if attempt < self.config.retries:
                self._sleep(attempt, None)
        raise FleetUnavailable(f"the solver fleet at {self.url} could not be reached ({last})")

    # ------------------------------------------------------------------------------ solving
    def solve(self, domain, problem, config: SolverConfig | None = None) -> Verdict:
        return self.solve_many([(domain, problem)], config=config)[0]

    def solve_many(self, specs: Iterable[Sequence], workers: int | None = None, config: SolverConfig | None = None,
                   *, progress: bool = False, ids: Sequence[str] | None = None) -> list[Verdict]:
        """Verdicts for ``(domain, problem)`` pairs, in input order (like :func:`omtr.solver.solve_many`).

        ``workers`` is accepted for signature compatibility and ignored: the fleet decides. ``config``
        sends its time/memory limits, search, validate and cache settings with each request (None:
        the server's). ``ids`` only name specs in errors (default: their positions). Raises
        :class:`FleetError` (naming the unverified specs) instead of ever returning a made-up verdict.
        """
        from omtr.progress import Progress

        specs = list(specs)
        names = [str(i) for i in ids] if ids is not None else [str(i) for i in range(len(specs))]
        if len(names) != len(specs):
            raise ValueError(f"{len(names)} ids for {len(specs)} specs")
        if not specs:
            return []
        entries = [self._entry(str(n), s) for n, s in enumerate(specs)]
        cfg_doc = None
        if config is not None:
            cfg_doc = {k: getattr(config, k) for k in _REQUEST_CONFIG_KEYS}
        batches = self._split(entries)
        out: list[Verdict | None] = [None] * len(specs)
        failures: list[tuple[list[int], FleetError]] = []
        bar = Progress(len(specs), "solving on the fleet", quiet=not progress)

        def run(batch: list[int]) -> None:
            try:
                verdicts = self._post_batch([entries[i] for i in batch], cfg_doc)
            except FleetError as exc:
                failures.append((batch, exc))
                return
            for i, v in zip(batch, verdicts):
                out[i] = v
            bar.update(len(batch))

        if len(batches) == 1:
            run(batches[0])
        else:
            with ThreadPoolExecutor(max_workers=self.config.concurrency, thread_name_prefix="omtr-fleet") as ex:
                list(ex.map(run, batches))
        bar.close()
        if failures:
            missing = sorted(i for batch, _ in failures for i in batch)
            unverified = [names[i] for i in missing]
            first = failures[0][1]
            kind = type(first)
            msg = (f"{len(unverified)} of {len(specs)} spec(s) were not verified by the solver fleet at {self.url}: "
                   f"{_ids_text(unverified)}. Cause: {first}")
            if kind is FleetRequestError:
                raise FleetRequestError(msg, first.status, unverified, out)
            raise kind(msg, unverified, out)
        return out  # type: ignore[return-value]

    @staticmethod
    def _entry(sid: str, spec: Sequence) -> dict:
        domain, problem = spec[0], spec[1]
        if isinstance(domain, str) and isinstance(problem, str):
            return {"id": sid, "domain": domain, "problem": problem}
        parts = []
        for part in (domain, problem):
            if isinstance(part, str):
                part = part.encode("utf-8", "surrogatepass")
            if not isinstance(part, (bytes, bytearray)):
                raise TypeError(f"spec {sid}: domain and problem must be str or bytes, got {type(part).__name__}")
            parts.append(base64.b64encode(bytes(part)).decode("ascii"))
        return {"id": sid, "domain": parts[0], "problem": parts[1], "encoding": "base64"}

    def _split(self, entries: list[dict]) -> list[list[int]]:
        info = self.info()
        most = max(1, min(self.config.batch_specs, int(info.get("max_batch_specs", self.config.batch_specs))))
        budget = int(info.get("max_body_bytes", 32 * 2 ** 20) * 0.9) - 1024
        batches: list[list[int]] = []
        cur: list[int] = []
        size = 0
        for i, e in enumerate(entries):
            n = len(e["domain"]) * 2 + len(e["problem"]) * 2 + _SPEC_OVERHEAD  # JSON escapes: generous
            if cur and (len(cur) >= most or size + n > budget):
                batches.append(cur)
                cur, size = [], 0
            cur.append(i)
            size += n
        if cur:
            batches.append(cur)
        return batches

    def _post_batch(self, batch: list[dict], cfg_doc: dict | None) -> list[Verdict]:
        import httpx

        body = {"specs": batch}
        if cfg_doc is not None:
            body["config"] = cfg_doc
        data = json.dumps(body).encode()
        key = uuid.uuid4().hex  # the same on every retry of this batch
        headers = {"Content-Type": "application/json", "Idempotency-Key": key}
        ids = [e["id"] for e in batch]
        attempt = 0
        waited_from = None
        last = ""
        while True:
            retry_after = None
            self._count("requests")
            try:
                r = self._http.post(self.url + "/v1/solve", content=data, headers=headers)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                if r.status_code == 200:
                    if r.headers.get("x-omtr-replay"):
                        self._count("replays")
                    return self._verdicts(r, ids)
                message = self._error_text(r)
                last = f"HTTP {r.status_code}: {message}"
                if r.status_code in (429, 503):
                    self._count("overloaded")
                    waited_from = waited_from or time.monotonic()
                    if time.monotonic() - waited_from < self.config.overload_wait_s:
                        self._sleep(0, r.headers.get("retry-after") or "1")
                        continue
                    raise FleetUnavailable(f"the fleet stayed overloaded for {self.config.overload_wait_s:.0f} s "
                                           f"({last})")
                if r.status_code < 500:
                    raise FleetRequestError(f"the solver fleet at {self.url} refused the batch: {last}",
                                            r.status_code)
                retry_after = r.headers.get("retry-after")
            if attempt >= self.config.retries:
                raise FleetUnavailable(f"no answer after {attempt + 1} tries ({last})")
            self._count("retries")
            log.info("solver fleet: %s; retrying a batch of %d (try %d of %d)", last, len(ids), attempt + 2,
                     self.config.retries + 1)
            self._sleep(attempt, retry_after)
            attempt += 1

    @staticmethod
    def _error_text(r) -> str:
        try:
            return str(r.json().get("error") or r.text[:300])
        except ValueError:
            return r.text[:300] or r.reason_phrase

    def _verdicts(self, r, ids: list[str]) -> list[Verdict]:
        try:
            rows = r.json()["verdicts"]
        except (ValueError, KeyError, TypeError) as exc:
            raise FleetProtocolError(f"the solver fleet at {self.url} sent an answer without verdicts ({exc})")
        got = [str(row.get("id")) if isinstance(row, dict) else None for row in rows]
        if got != ids:
            raise FleetProtocolError(f"the solver fleet at {self.url} answered ids {_ids_text([str(g) for g in got], 5)} "
                                     f"for a batch of {_ids_text(ids, 5)}; no verdict of it is used")
        out = []
        for row in rows:
            row = dict(row)
            row.pop("id")
            out.append(Verdict.from_json(row))
        return out


def solver_for(fleet: FleetConfig | None = None):
    """A ``solve_many(specs, workers=1, config=None, *, progress=False)``: the fleet's when a URL is set
    (``fleet.url`` or OMTR_SOLVER_URL), else the local pool's :func:`omtr.solver.solve_many`."""
    fleet = fleet or FleetConfig.from_env()
    if fleet.url:
        return FleetClient(fleet).solve_many
    from omtr.solver import solve_many

    return solve_many
