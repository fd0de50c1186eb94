"""The solver fleet's HTTP service: ``omtr solver serve``.

One process holds a :class:`~omtr.solver.SolverPool` (warm workers) and its result cache, and
answers batches over HTTP, so verdicts are the same as the local pool's wherever they are computed.

    POST /v1/solve   {"specs": [{"id", "domain", "problem"}, ...], "config": {...}?}
                     -> {"verdicts": [{"id", <verdict>}, ...]}  (input order)
    GET  /v1/info    limits a client splits its batches to
    GET  /healthz    200 while the process is up
    GET  /readyz     200 once the workers are warm (503 before, and while draining)
    GET  /metrics    Prometheus text format (names in omtr.solver.metrics)

Safety: request bodies and spec counts are capped (413); a bearer token is required when one is
configured (401); admission is bounded by ``queue_specs`` (429 + Retry-After, never an unbounded
queue); a batch is handed to the pool in chunks and stops at the next chunk when its client has
gone; SIGTERM stops taking new batches (503), lets the running ones finish, then exits.

``fastapi`` and ``uvicorn`` are imported only when a service is built (``omtr --help`` stays fast).
"""


import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import logging
import math
import threading
import time
from collections import OrderedDict

from omtr.config import ConfigError, ServiceConfig, SolverConfig

log = logging.getLogger(__name__)

# Per-request solver settings a client may choose (the rest are the server's).
REQUEST_CONFIG_KEYS = ("time_limit_s", "memory_limit_mb", "search", "validate", "cache", "max_file_bytes",
                       "max_nesting")
MAX_ID_CHARS = 256


class RequestError(Exception):
    """A request the service refuses: HTTP status, metric reason, and a sentence for the client."""

    def __init__(self, status: int, reason: str, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.status, self.reason, self.message, self.retry_after = status, reason, message, retry_after


def parse_batch(body: bytes, scfg: ServiceConfig, base: SolverConfig):
    """``(ids, pairs, config)`` from a request body, or a :class:`RequestError` saying what is wrong."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(400, "bad_json", f"the request body is not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise RequestError(422, "bad_request", 'the body must be a JSON object {"specs": [...]}, got '
                           f"{type(doc).__name__}")
    unknown = sorted(set(doc) - {"specs", "config"})
    if unknown:
        raise RequestError(422, "bad_request", f"unknown field(s) {unknown}; expected 'specs' and optional 'config'")
    specs = doc.get("specs")
    if not isinstance(specs, list):
        raise RequestError(422, "bad_request", "'specs' must be a list of {\"id\", \"domain\", \"problem\"} objects")
    if not specs:
        raise RequestError(422, "bad_request", "'specs' is empty; send at least one spec")
    if len(specs) > scfg.max_batch_specs:
        raise RequestError(413, "too_many_specs", f"{len(specs)} specs in one request; this server takes at most "
                           f"{scfg.max_batch_specs} (split the batch; GET /v1/info gives the limits)")
    ids: list[str] = []
    pairs: list[tuple] = []
    seen: set[str] = set()
    for n, spec in enumerate(specs):
        where = f"specs[{n}]"
        if not isinstance(spec, dict):
            raise RequestError(422, "bad_request", f"{where} must be an object with 'id', 'domain' and 'problem'")
        extra = sorted(set(spec) - {"id", "domain", "problem", "encoding"})
        if extra:
            raise RequestError(422, "bad_request", f"{where}: unknown field(s) {extra}")
        sid = spec.get("id")
        if not isinstance(sid, (str, int)) or isinstance(sid, bool):
            raise RequestError(422, "bad_request", f"{where}.id must be a string or an integer")
        sid = str(sid)
        if len(sid) > MAX_ID_CHARS:
            raise RequestError(422, "bad_request", f"{where}.id is longer than {MAX_ID_CHARS} characters")
        if sid in seen:
            raise RequestError(422, "bad_request", f"{where}.id {sid!r} appears twice; ids must be unique in a batch")
        seen.add(sid)
        encoding = spec.get("encoding", "text")
        if encoding not in ("text", "base64"):
            raise RequestError(422, "bad_request", f"{where}.encoding must be 'text' or 'base64', got {encoding!r}")
        texts = []
        for part in ("domain", "problem"):
            value = spec.get(part)
            if not isinstance(value, str):
                got = "missing" if value is None else f"a {type(value).__name__}"
                raise RequestError(422, "bad_request", f"{where}.{part} must be a string of PDDL text, got {got}")
            if encoding == "base64":
                try:
                    value = base64.b64decode(value, validate=True)
                except (binascii.Error, ValueError):
                    raise RequestError(422, "bad_request", f"{where}.{part} is not valid base64") from None
            texts.append(value)
        ids.append(sid)
        pairs.append((texts[0], texts[1]))
    return ids, pairs, request_config(doc.get("config"), scfg, base)


def request_config(raw, scfg: ServiceConfig, base: SolverConfig) -> SolverConfig:
    if raw is None:
        return base
    if not isinstance(raw, dict):
        raise RequestError(422, "bad_request", "'config' must be an object")
    unknown = sorted(set(raw) - set(REQUEST_CONFIG_KEYS))
    if unknown:
        raise RequestError(422, "bad_request", f"config: unknown or server-only field(s) {unknown}; "
                           f"a request may set {list(REQUEST_CONFIG_KEYS)}")
    types = {"time_limit_s": (int, float), "memory_limit_mb": (int,), "search": (str,), "validate": (bool,),
             "cache": (bool,), "max_file_bytes": (int,), "max_nesting": (int,)}
    for k, v in raw.items():
        if not isinstance(v, types[k]) or (isinstance(v, bool) and bool not in types[k]):
            raise RequestError(422, "bad_request", f"config.{k} has the wrong type ({type(v).__name__})")
    try:
        cfg = base.replace(**raw)
    except ConfigError as exc:
        raise RequestError(422, "bad_request", f"config: {exc}") from None
    if cfg.time_limit_s > scfg.max_time_limit_s:
        raise RequestError(422, "bad_request", f"config.time_limit_s={cfg.time_limit_s} is above this server's "
                           f"limit of {scfg.max_time_limit_s} s")
    if cfg.memory_limit_mb > scfg.max_memory_limit_mb:
        raise RequestError(422, "bad_request", f"config.memory_limit_mb={cfg.memory_limit_mb} is above this "
                           f"server's limit of {scfg.max_memory_limit_mb} MiB")
    for k in ("max_file_bytes", "max_nesting"):  # a client may lower the input limits, not raise them
        if getattr(cfg, k) > getattr(base, k):
            raise RequestError(422, "bad_request", f"config.{k}={getattr(cfg, k)} is above this server's "
                               f"{getattr(base, k)}")
    return cfg


class _Replays:
    """Finished batches by Idempotency-Key, and batches running now, so a retry never runs twice."""

    def __init__(self, entries: int, max_bytes: int = 64 * 1024 * 1024):
        self.entries, self.max_bytes = entries, max_bytes
        self.done: OrderedDict[str, tuple[str, bytes]] = OrderedDict()
        self.running: dict[str, tuple[str, asyncio.Future, list[int]]] = {}
        self.size = 0

    def remember(self, key: str, digest: str, payload: bytes) -> None:
        if self.entries == 0 or len(payload) > self.max_bytes:
            return
        self.done[key] = (digest, payload)
        self.size += len(payload)
        while len(self.done) > self.entries or self.size > self.max_bytes:
            _, (_, old) = self.done.popitem(last=False)
            self.size -= len(old)


class FleetService:
    """The state behind the HTTP app: the pool, admission, replays and metrics."""

    def __init__(self, scfg: ServiceConfig | None = None, solver: SolverConfig | None = None,
                 token: str | None = None):
        from omtr.solver.metrics import FleetMetrics

        self.scfg = scfg or ServiceConfig()
        self.solver = solver or SolverConfig()
        self.token = token
        self.metrics = FleetMetrics()
        self.metrics.workers.set(0)
        self.metrics.ready.set(0)
        self.pool = None
        self.ready = threading.Event()
        self.draining = False
        self.start_error: str | None = None
        self._stop = threading.Event()
        self._boot: threading.Thread | None = None
        self._admitted = 0
        self._inflight = 0
        self._lock = threading.Lock()
        self._replays = _Replays(self.scfg.idempotency_entries)
        self._recent: list[float] = []  # finish times of recent specs (Retry-After estimate)

    # ------------------------------------------------------------------------- pool lifecycle
    def start(self) -> None:
        """Start the workers in the background; /readyz turns 200 once they are warm.

        The pool is made, held and closed by one thread that lives as long as the pool: workers
        carry a parent-death signal, which Linux sends when the *thread* that started them ends.
        """

        def boot():
            from omtr.solver.pool import SolverPool

            try:
                pool = SolverPool(self.scfg.workers, self.solver)
            except Exception as exc:  # noqa: BLE001 - reported by /readyz and the log
                self.start_error = f"the solver workers did not start: {exc}"
                log.error(self.start_error)
                return
            self.pool = pool
            self.metrics.workers.set(pool.workers)
            self.metrics.ready.set(1)
            self.ready.set()
            log.info("solver fleet pod ready: %d worker(s)", pool.workers)
            self._stop.wait()
            self.ready.clear()
            self.metrics.ready.set(0)
            pool.close()
            self.metrics.workers.set(0)

        self._boot = threading.Thread(target=boot, name="omtr-fleet-pool", daemon=True)
        self._boot.start()

    def begin_drain(self) -> None:
        if not self.draining:
            self.draining = True
            self.metrics.ready.set(0)
            log.info("draining: no new batches; %d spec(s) admitted still run", self._admitted)

    def close(self) -> None:
        self._stop.set()
        if self._boot is not None:
            self._boot.join(timeout=60)

    # ---------------------------------------------------------------------------- admission
    def check_token(self, header: str | None) -> None:
        if not self.token:
            return
        scheme, _, given = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.token.encode()):
            raise RequestError(401, "unauthorized", "missing or wrong bearer token (header 'Authorization: Bearer "
                               "TOKEN'; the client reads OMTR_SOLVER_TOKEN)")

    def check_open(self) -> None:
        if self.draining:
            raise RequestError(503, "draining", "this pod is shutting down; retry on another", retry_after=1)
        if not self.ready.is_set():
            msg = self.start_error or "the solver workers are still starting"
            raise RequestError(503, "not_ready", msg, retry_after=2)

    def admit(self, n: int) -> None:
        with self._lock:
            if self._admitted + n > self.scfg.queue_specs:
                raise RequestError(429, "overload", f"the queue is full ({self._admitted} of {self.scfg.queue_specs} "
                                   f"specs admitted); retry later", retry_after=self._retry_after())
            self._admitted += n
            self._gauges()

    def release(self, n: int) -> None:
        with self._lock:
            self._admitted -= n
            self._gauges()

    def _gauges(self) -> None:
        self.metrics.queue_depth.set(max(0, self._admitted - self._inflight))
        self.metrics.inflight.set(self._inflight)

    def _retry_after(self) -> float:
        now = time.monotonic()
        recent = [t for t in self._recent if now - t < 10]
        rate = len(recent) / 10 if recent else self.scfg.workers  # specs/s, pessimistic when idle
        return min(30.0, max(1.0, math.ceil(self._admitted / max(rate, 0.1) / 4)))

    # ------------------------------------------------------------------------------ solving
    def solve_chunk(self, pairs, cfg):
        """Blocking: one chunk through the pool (runs in a thread)."""
        with self._lock:
            self._inflight += len(pairs)
            self._gauges()
        try:
            verdicts = self.pool.solve_many(pairs, cfg)
        finally:
            with self._lock:
                self._inflight -= len(pairs)
                now = time.monotonic()
                self._recent = [t for t in self._recent if now - t < 10][-10_000:] + [now] * len(pairs)
                self._gauges()
        for v in verdicts:
            self.metrics.observe_verdict(v)
        return verdicts


def build_app(service: FleetService):
    """The FastAPI app around ``service`` (started and closed with the app's lifespan)."""
    import contextlib

    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.concurrency import run_in_threadpool

    m = service.metrics

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if service._boot is None:
            service.start()
        yield
        await run_in_threadpool(service.close)

    app = FastAPI(title="omtr solver fleet", version="1", lifespan=lifespan, docs_url=None, redoc_url=None)

    def refuse(err: RequestError) -> JSONResponse:
        m.rejected.labels(err.reason).inc()
        m.requests.labels(str(err.status)).inc()
        headers = {}
        if err.retry_after is not None:
            headers["Retry-After"] = str(int(math.ceil(err.retry_after)))
        if err.status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="omtr-solver"'
        return JSONResponse({"error": err.message, "reason": err.reason}, status_code=err.status, headers=headers)

    async def read_body(request: Request) -> bytes:
        limit = service.scfg.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                raise RequestError(400, "bad_request", "Content-Length is not a number")
            if int(declared) > limit:
                raise RequestError(413, "too_large", f"the body is {int(declared)} bytes; this server takes at most "
                                   f"{limit} (split the batch)")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError(413, "too_large", f"the body is over {limit} bytes (split the batch)")
            chunks.append(chunk)
        return b"".join(chunks)

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz():
        if service.ready.is_set() and not service.draining:
            return {"status": "ready", "workers": service.pool.workers}
        status = "draining" if service.draining else ("failed" if service.start_error else "starting")
        return JSONResponse({"status": status, "error": service.start_error}, status_code=503)

    @app.get("/v1/info")
    async def info():
        s = service.scfg
        return {"max_batch_specs": s.max_batch_specs, "max_body_bytes": s.max_body_bytes,
                "queue_specs": s.queue_specs, "workers": s.workers, "max_time_limit_s": s.max_time_limit_s,
                "max_memory_limit_mb": s.max_memory_limit_mb, "config_keys": list(REQUEST_CONFIG_KEYS),
                "search": service.solver.search, "time_limit_s": service.solver.time_limit_s}

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/solve")
    async def solve(request: Request):
        t0 = time.perf_counter()
        try:
            service.check_token(request.headers.get("authorization"))
            service.check_open()
            body = await read_body(request)
            m.request_bytes.observe(len(body))
            ids, pairs, cfg = parse_batch(body, service.scfg, service.solver)
        except RequestError as err:
            return refuse(err)
        key = request.headers.get("idempotency-key")
        replays = service._replays
        digest = hashlib.sha256(body).hexdigest()
        if key:
            if len(key) > 200:
                return refuse(RequestError(422, "bad_request", "Idempotency-Key is longer than 200 characters"))
            hit = replays.done.get(key)
            running = replays.running.get(key)
            if (hit and hit[0] != digest) or (running and running[0] != digest):
                return refuse(RequestError(422, "idempotency_conflict", "this Idempotency-Key was used for a "
                                           "different batch; use a new key per batch"))
            if hit:
                m.replays.inc()
                m.requests.labels("200").inc()
                return Response(hit[1], media_type="application/json", headers={"X-Omtr-Replay": "1"})
            if running:  # the first try is still running: wait for it instead of verifying again
                running[2][0] += 1
                try:
                    payload = await asyncio.shield(running[1])
                finally:
                    running[2][0] -= 1
                if payload is not None:
                    m.replays.inc()
                    m.requests.labels("200").inc()
                    return Response(payload, media_type="application/json", headers={"X-Omtr-Replay": "1"})
                # the first try was stopped (its client left and nobody waited): run it now
        try:
            service.admit(len(pairs))
        except RequestError as err:
            return refuse(err)
        m.request_specs.observe(len(pairs))
        m.inflight_requests.inc()
        future: asyncio.Future | None = None
        waiters = [0]
        if key:
            future = asyncio.get_running_loop().create_future()
            replays.running[key] = (digest, future, waiters)
        payload: bytes | None = None
        admitted = len(pairs)
        try:
            verdicts = []
            step = service.scfg.chunk
            for start in range(0, len(pairs), step):
                if start and waiters[0] == 0 and await request.is_disconnected():
                    m.cancelled.inc()
                    log.info("client left: batch stopped after %d of %d specs", start, len(pairs))
                    m.requests.labels("499").inc()
                    return Response(status_code=499)
                chunk = pairs[start:start + step]
                verdicts += await run_in_threadpool(service.solve_chunk, chunk, cfg)
                service.release(len(chunk))
                admitted -= len(chunk)
            out = [{"id": i, **v.to_json()} for i, v in zip(ids, verdicts)]
            payload = json.dumps({"verdicts": out}).encode()
            if key:
                replays.remember(key, digest, payload)
            m.requests.labels("200").inc()
            m.request_seconds.observe(time.perf_counter() - t0)
            return Response(payload, media_type="application/json")
        finally:
            if admitted:
                service.release(admitted)
            m.inflight_requests.dec()
            if key:
                replays.running.pop(key, None)
                if future is not None and not future.done():
                    future.set_result(payload)

    return app


def serve(scfg: ServiceConfig, solver: SolverConfig, host: str = "127.0.0.1", port: int = 8600,
          token: str | None = None, log_level: str = "info") -> int:
    """Run the service until SIGTERM/SIGINT; running batches finish first (drain), then it exits."""
    import signal

    import uvicorn

    service = FleetService(scfg, solver, token)
    service.start()
    app = build_app(service)

    class _Server(uvicorn.Server):
        def handle_exit(self, sig, frame):  # SIGTERM/SIGINT: stop admitting before uvicorn stops listening
            service.begin_drain()
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM:  # drained is a clean exit (status 0), not death by signal
                self._captured_signals = [s for s in self._captured_signals if s != signal.SIGTERM]

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=scfg.drain_timeout_s, lifespan="on")
    server = _Server(config)
    server.run()
    return 0
