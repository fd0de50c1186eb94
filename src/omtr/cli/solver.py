"""``omtr solver ...``: the solver fleet (``omtr solver serve``) and a probe of a running one."""

from __future__ import annotations

import json
import os
import sys

from omtr.cli import CliError, add_command


def register(subparsers) -> None:
    parser = add_command(
        subparsers, "solver",
        help="the solver fleet: serve the environment over HTTP, or probe a running fleet",
        description="The Fast Downward + VAL environment as an HTTP service (a fleet pod), and its client side.",
        examples="""  omtr solver serve --port 8600 --workers 2
  OMTR_SOLVER_TOKEN=secret omtr solver serve --host 0.0.0.0 --workers 4 --cache-dir /var/cache/omtr
  OMTR_SOLVER_URL=http://127.0.0.1:8600 omtr solve --batch specs.jsonl --out verdicts.jsonl
  omtr solver ping --url http://127.0.0.1:8600
""",
    )
    sub = parser.add_subparsers(dest="solver_command", metavar="SUBCOMMAND")
    parser.set_defaults(handler=lambda args: (parser.print_help(), 2)[1])
    _register_serve(sub)
    _register_ping(sub)


def _register_serve(sub) -> None:
    from omtr.config import ServiceConfig

    d = ServiceConfig()
    p = add_command(
        sub, "serve",
        help="run a fleet pod: POST /v1/solve, /healthz, /readyz, /metrics",
        description=(
            "Serve the environment over HTTP around a pool of warm solver workers and the result cache. "
            "A bearer token is required when OMTR_SOLVER_TOKEN (or --token-file) is set. SIGTERM stops "
            "taking batches, lets running ones finish, then exits."
        ),
        examples="""  omtr solver serve                                   # 127.0.0.1:8600, one worker
  omtr solver serve --port 8600 --workers 2 --time-limit 20
  omtr solver serve --host 0.0.0.0 --token-file /run/secrets/omtr-solver --cache-dir /var/cache/omtr
  curl -s localhost:8600/metrics | grep omtr_solver_calls_total
""",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8600, help="port (default 8600)")
    p.add_argument("--workers", type=int, default=d.workers, help=f"solver worker processes (default {d.workers})")
    p.add_argument("--max-batch-specs", type=int, default=d.max_batch_specs,
                   help=f"most specs per request (default {d.max_batch_specs})")
    p.add_argument("--max-body-mb", type=float, default=d.max_body_bytes / 2 ** 20,
                   help=f"largest request body in MiB (default {d.max_body_bytes // 2 ** 20})")
    p.add_argument("--queue-specs", type=int, default=d.queue_specs,
                   help=f"specs admitted at once before answering 429 (default {d.queue_specs})")
    p.add_argument("--chunk-specs", type=int, default=d.chunk_specs,
                   help="specs handed to the pool at a time (default 4 x workers)")
    p.add_argument("--token-file", metavar="PATH", help="file holding the bearer token (else OMTR_SOLVER_TOKEN)")
    p.add_argument("--time-limit", type=float, metavar="S", help="planner CPU limit in seconds (default 60)")
    p.add_argument("--memory-limit", type=int, metavar="MB", help="planner memory limit in MiB (default 4096)")
    p.add_argument("--search", metavar="STR", help="Fast Downward alias or search string (default lama-first)")
    p.add_argument("--cache-dir", metavar="DIR", help="keep the result cache on disk in DIR (survives restarts)")
    p.add_argument("--no-cache", action="store_true", help="do not answer from the result cache")
    p.add_argument("--drain-timeout", type=float, default=d.drain_timeout_s, metavar="S",
                   help=f"on SIGTERM, seconds running batches may take (default {d.drain_timeout_s:.0f})")
    p.set_defaults(handler=_serve)


def _register_ping(sub) -> None:
    p = add_command(
        sub, "ping",
        help="check that a fleet answers and print its limits",
        description="GET /readyz and /v1/info of a fleet (default: OMTR_SOLVER_URL).",
        examples="  omtr solver ping --url http://127.0.0.1:8600\n",
    )
    p.add_argument("--url", help="fleet base URL (default: OMTR_SOLVER_URL)")
    p.set_defaults(handler=_ping)


def _token(path: str | None) -> str | None:
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            raise CliError(f"--token-file {path}: {exc.strerror}") from None
        if not token:
            raise CliError(f"--token-file {path} is empty")
        return token
    return os.environ.get("OMTR_SOLVER_TOKEN") or None


def _serve(args) -> int:
    from omtr.config import ConfigError, ServiceConfig, SolverConfig

    if not 0 <= args.port <= 65535:
        raise CliError(f"--port must be 0..65535, got {args.port}")
    try:
        scfg = ServiceConfig(workers=args.workers, max_batch_specs=args.max_batch_specs,
                             max_body_bytes=int(args.max_body_mb * 2 ** 20), queue_specs=args.queue_specs,
                             chunk_specs=args.chunk_specs, drain_timeout_s=args.drain_timeout)
        solver = SolverConfig().replace(time_limit_s=args.time_limit, memory_limit_mb=args.memory_limit,
                                        search=args.search, cache=False if args.no_cache else None,
                                        cache_dir=args.cache_dir)
        scfg = ServiceConfig(**{**scfg.__dict__, "max_time_limit_s": max(scfg.max_time_limit_s, solver.time_limit_s),
                                "max_memory_limit_mb": max(scfg.max_memory_limit_mb, solver.memory_limit_mb)})
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ModuleNotFoundError as exc:
        raise CliError(f"the fleet needs {exc.name}: pip install -e '.[fleet]'") from None
    from omtr.solver.service import serve

    return serve(scfg, solver, host=args.host, port=args.port, token=_token(args.token_file),
                 log_level="warning" if args.quiet else "info")


def _ping(args) -> int:
    from omtr.config import ConfigError, FleetConfig

    try:
        cfg = FleetConfig.from_env(url=args.url)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    if not cfg.url:
        raise CliError("no fleet given: pass --url or set OMTR_SOLVER_URL")
    from omtr.solver.client import FleetClient, FleetError

    try:
        with FleetClient(cfg) as client:
            json.dump(client.info(), sys.stdout)
    except FleetError as exc:
        raise CliError(str(exc)) from None
    sys.stdout.write("\n")
    return 0
