"""``omtr solve``: the environment's verdict for one spec or a batch."""

from __future__ import annotations

import json
import os
import sys

from omtr.cli import CliError, add_command, finished_ids, read_input_file

EXAMPLES = """  omtr solve domain.pddl problem.pddl
  omtr solve domain.pddl problem.pddl --time-limit 10 --search 'astar(lmcut())'
  omtr solve --batch specs.jsonl --out verdicts.jsonl --workers 2
  omtr solve --batch specs.jsonl --out verdicts.jsonl --resume   # continue a stopped batch
  omtr solve big-domain.pddl problem.pddl --max-file-bytes 1000000  # a file over the 256 KiB limit
  omtr solve --batch specs.jsonl --out verdicts.shard-0.jsonl --shard 0/4   # every 4th line from the first
  JOB_COMPLETION_INDEX=2 omtr solve --batch specs.jsonl --out v2.jsonl --shard-count 4   # an Indexed Job's pod

Each batch line is {"id": ..., "domain": "<PDDL text>", "problem": "<PDDL text>"}; each output
line is {"id": ..., <verdict>}. The exit status is 0 whenever verdicts were produced.
With --shard I/N a batch takes only its share: the non-blank lines at positions I, I+N, I+2N, ...
(counted from 0), so N runs with I = 0..N-1 verify every line exactly once.
"""


def register(sub) -> None:
    p = add_command(
        sub, "solve",
        help="run the planner environment on a spec (verdict as JSON)",
        description="Lint, plan (Fast Downward) and validate (VAL) a PDDL domain + problem; print the verdict.",
        examples=EXAMPLES,
    )
    p.add_argument("domain", nargs="?", help="domain PDDL file")
    p.add_argument("problem", nargs="?", help="problem PDDL file")
    p.add_argument("--batch", metavar="SPECS.jsonl", help="solve every line of a JSONL file")
    p.add_argument("--out", metavar="VERDICTS.jsonl", help="where batch verdicts go (required with --batch)")
    p.add_argument("--workers", type=int, default=1, help="solver worker processes (default 1)")
    p.add_argument("--solver-url", metavar="URL", help="verify --batch on a solver fleet (omtr solver serve) "
                   "instead of local workers (default: $OMTR_SOLVER_URL; token: $OMTR_SOLVER_TOKEN)")
    p.add_argument("--shard", metavar="I/N", help="verify only shard I of N of --batch (lines I, I+N, ...; I from 0)")
    p.add_argument("--shard-count", type=int, metavar="N", help="N shards, this one's index taken from "
                   "$JOB_COMPLETION_INDEX (a Kubernetes Indexed Job's pod)")
    p.add_argument("--resume", action="store_true", help="keep --out and skip ids already in it")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    p.add_argument("--time-limit", type=float, metavar="S", help="planner CPU limit in seconds (default 60)")
    p.add_argument("--memory-limit", type=int, metavar="MB", help="planner memory limit in MiB (default 4096)")
    p.add_argument("--search", metavar="STR", help="Fast Downward alias or search string (default lama-first)")
    p.add_argument("--max-file-bytes", type=int, metavar="N",
                   help="largest accepted domain or problem file (default 262144); larger ones get too_large")
    p.add_argument("--max-nesting", type=int, metavar="N",
                   help="deepest accepted parenthesis nesting (default 64, at most 500)")
    p.add_argument("--no-cache", action="store_true", help="do not answer from the result cache")
    p.add_argument("--cache-dir", metavar="DIR", help="keep the result cache on disk in DIR")
    p.set_defaults(handler=run)


def _config(args):
    from omtr.config import ConfigError, SolverConfig

    try:
        return SolverConfig().replace(
            time_limit_s=args.time_limit, memory_limit_mb=args.memory_limit, search=args.search,
            cache=False if args.no_cache else None, cache_dir=args.cache_dir,
            max_file_bytes=args.max_file_bytes, max_nesting=args.max_nesting,
        )
    except ConfigError as exc:
        raise CliError(str(exc)) from None


def run(args) -> int:
    if args.workers < 1:
        raise CliError("--workers must be at least 1")
    cfg = _config(args)
    shard = _shard(args)
    if args.batch:
        if args.domain or args.problem:
            raise CliError("give either DOMAIN PROBLEM or --batch, not both")
        return _batch(args, cfg, shard)
    if shard:
        raise CliError("--shard and --shard-count split a --batch; one spec has nothing to split")
    if not (args.domain and args.problem):
        raise CliError("need DOMAIN and PROBLEM files (or --batch SPECS.jsonl); see omtr solve --help")
    domain, problem = read_input_file(args.domain), read_input_file(args.problem)
    from omtr.solver.pool import SolverPool

    # One spec: plan in this process (no worker to start); the disk cache if one is given.
    with SolverPool(0, cfg.replace(cache=bool(cfg.cache_dir))) as pool:
        v = pool.solve(domain, problem)
    json.dump(v.to_json(), sys.stdout)
    sys.stdout.write("\n")
    return 0


def _shard(args) -> tuple[int, int] | None:
    """(index, count) from --shard I/N, or from --shard-count N and $JOB_COMPLETION_INDEX; None: no sharding."""
    if args.shard is None and args.shard_count is None:
        return None
    if args.shard is not None:
        index_s, sep, count_s = args.shard.partition("/")
        try:
            index, count = int(index_s), int(count_s)
        except ValueError:
            raise CliError(f"--shard must be INDEX/COUNT such as 0/4, got {args.shard!r}") from None
        if not sep:
            raise CliError(f"--shard must be INDEX/COUNT such as 0/4, got {args.shard!r}")
        if args.shard_count is not None and args.shard_count != count:
            raise CliError(f"--shard {args.shard} and --shard-count {args.shard_count} disagree; give one of them")
    else:
        count = args.shard_count
        env = os.environ.get("JOB_COMPLETION_INDEX")
        if env is None:
            raise CliError("--shard-count takes this shard's index from JOB_COMPLETION_INDEX, which is not set; "
                           "pass --shard INDEX/COUNT instead")
        try:
            index = int(env)
        except ValueError:
            raise CliError(f"JOB_COMPLETION_INDEX={env!r} is not a number") from None
    if count < 1 or not 0 <= index < count:
        raise CliError(f"shard {index}/{count}: the count must be at least 1 and the index 0..{max(count - 1, 0)}")
    return index, count


def _batch(args, cfg, shard: tuple[int, int] | None = None) -> int:
    import logging

    from omtr.pddl.categories import Category
    from omtr.solver import SolverPool, Verdict

    log = logging.getLogger("omtr.solve")
    if not args.out:
        raise CliError("--batch needs --out VERDICTS.jsonl")
    if not os.path.exists(args.batch):
        raise CliError(f"{args.batch}: no such file")
    done: set[str] = set()
    if os.path.exists(args.out):
        if args.resume:
            done = finished_ids(args.out)  # a line cut short by a kill is dropped and solved again
        elif not args.overwrite:
            raise CliError(f"{args.out} exists; pass --resume to continue it or --overwrite to replace it")
    items: list[tuple[str, object, object]] = []
    bad: list[tuple[str, str]] = []
    position = -1  # of the non-blank lines, for --shard
    with open(args.batch, "rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            position += 1
            if shard and position % shard[1] != shard[0]:
                continue
            try:
                rec = json.loads(raw)
                if not isinstance(rec, dict):
                    raise ValueError("not a JSON object")
            except ValueError as exc:
                if f"line-{n}" in done:
                    continue
                bad.append((f"line-{n}", f"{args.batch} line {n} is not a JSON object ({exc}); "
                                         "expected {\"id\", \"domain\", \"problem\"}"))
                continue
            rid = str(rec.get("id", f"line-{n}"))
            if rid in done:
                continue
            missing = [k for k in ("domain", "problem") if not isinstance(rec.get(k), str)]
            if missing:
                bad.append((rid, f"{args.batch} line {n} (id {rid}): field {missing[0]!r} is missing or not a string"))
                continue
            items.append((rid, rec["domain"], rec["problem"]))
    mode = "a" if args.resume else "w"
    chunk = max(16, 8 * args.workers)
    from omtr.config import ConfigError, FleetConfig

    try:
        fleet = FleetConfig.from_env(url=args.solver_url)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    if fleet.url:  # the fleet verifies; the local pool stays the default
        from omtr.solver.client import FleetClient, FleetError

        verifier = FleetClient(fleet)
        chunk = fleet.batch_specs * fleet.concurrency  # enough requests in flight to keep the fleet busy
    else:
        FleetError = ()  # noqa: N806 - nothing to catch
        verifier = SolverPool(args.workers, cfg)
    with open(args.out, mode, encoding="utf-8") as out, verifier as pool:
        for rid, msg in bad:
            v = Verdict.failure(Category.SYNTAX, msg, stage="input")
            out.write(json.dumps({"id": rid, **v.to_json()}) + "\n")
        from omtr.progress import Progress

        bar = Progress(len(items), "solving", quiet=args.quiet)
        for start in range(0, len(items), chunk):
            part = items[start:start + chunk]
            try:
                ids = {"ids": [rid for rid, _, _ in part]} if fleet.url else {}
                verdicts = pool.solve_many([(d, p) for _, d, p in part], config=cfg, **ids)
            except FleetError as exc:
                raise CliError(f"{exc}. Verdicts so far are in {args.out}: rerun with --resume") from None
            for (rid, _, _), v in zip(part, verdicts):
                out.write(json.dumps({"id": rid, **v.to_json()}) + "\n")
            out.flush()  # a killed run keeps every finished chunk; --resume continues
            bar.update(len(part))
        bar.close()
    log.info("wrote %d verdicts to %s (%d malformed lines, %d skipped as done%s)",
             len(items) + len(bad), args.out, len(bad), len(done),
             f"; shard {shard[0]}/{shard[1]}" if shard else "")
    return 0
