"""``omtr tasks ...``: generate, import, inspect and convert planning tasks."""

from __future__ import annotations

import argparse
import logging

from omtr.cli import CliError, add_command

log = logging.getLogger("omtr.tasks")


def register(subparsers) -> None:
    parser = add_command(
        subparsers,
        "tasks",
        help="generate, import and inspect planning tasks (JSONL)",
        description="Task files: generated PlanBench-style tasks, PlanBench's own data, transfer benchmarks, stats.",
        examples="""  omtr tasks generate --family blocksworld --n 1000 --seed 0 --out bw.jsonl
  omtr tasks import-planbench ../shared/benchmarks/planbench --out planbench.jsonl
  omtr tasks stats bw.jsonl
  omtr tasks transfer --benchmark prontoqa --n 200 --seed 0 --out prontoqa.jsonl
""",
    )
    sub = parser.add_subparsers(dest="tasks_command", metavar="SUBCOMMAND")
    parser.set_defaults(handler=lambda args: (parser.print_help(), 2)[1])
    _register_generate(sub)
    _register_import(sub)
    _register_stats(sub)
    _register_transfer(sub)
    _register_score(sub)


# ----------------------------------------------------------------------------- generate


def _register_generate(sub) -> None:
    p = add_command(
        sub,
        "generate",
        help="seeded, solver-checked tasks for blocksworld, mystery_blocksworld, logistics, gripper",
        description=(
            "Draw tasks of one family, render NL and reference PDDL, prove each solvable with a "
            "constructive plan and (unless --no-verify) solve every reference with the environment. "
            "Splits are disjoint by a canonical (init, goal) signature: a signature always lands in "
            "the same split, whatever the seed. --min/--max-objects count the family's size unit "
            "(blocks, packages or balls)."
        ),
        examples="""  omtr tasks generate --family blocksworld --n 1000 --seed 0 --out bw.jsonl
  omtr tasks generate --family gripper --n 200 --seed 1 --split test --min-objects 4 --max-objects 10 --out g.jsonl
  omtr tasks generate --family mystery_blocksworld --n 500 --seed 2 --option vocabulary=random --out myst.jsonl
  omtr tasks generate --family logistics --n 100 --seed 3 --option cities=3 --option planes=1..2 --no-verify --out log.jsonl
  omtr tasks generate --family gripper --n 50 --seed 4 --given-domain --out g_given.jsonl   # the model writes only problems
  omtr tasks generate --family mix --n 24 --seed 5 --split val --given-domain --out mix.jsonl  # 6 of each family
""",
    )
    p.add_argument("--family", required=True,
                   help="task family (blocksworld, mystery_blocksworld, logistics, gripper), several comma-separated, "
                        "or mix (every family): --n is split evenly and the families' tasks interleaved")
    p.add_argument("--n", type=int, required=True, help="number of tasks")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--split", choices=("train", "val", "test"), help="keep only this split (default: label each task)")
    p.add_argument("--min-objects", type=int, help="smallest size (blocks / packages / balls)")
    p.add_argument("--max-objects", type=int, help="largest size (blocks / packages / balls)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="family option, repeatable")
    p.add_argument("--no-verify", action="store_true", help="skip the planner check (constructive plans only)")
    p.add_argument("--workers", type=int, default=2, help="planner processes for verification (default 2)")
    p.add_argument("--given-domain", action="store_true",
                   help="domain-given mode: write the family's domain into each record's 'domain' (an input); "
                        "the model then writes only the problem")
    p.add_argument("--out", required=True, help="output JSONL file")
    p.set_defaults(handler=_generate)


def _generate(args) -> int:
    import time

    from omtr.progress import Progress
    from omtr.tasks.generators import GenerationError, family_list, generate, generate_mix
    from omtr.tasks.records import write_tasks

    options = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--option {item!r}: write KEY=VALUE, e.g. --option rooms=3")
        options[key.strip().replace("-", "_")] = value.strip()
    try:
        several = len(family_list(args.family)) > 1
    except GenerationError as exc:
        raise CliError(str(exc)) from None
    if several and options:
        raise CliError(f"--option is a single family's setting; --family {args.family} names several: "
                       "generate each family with its options, then concatenate the files")
    bar = Progress(args.n, f"generating {args.family}")
    t0 = time.monotonic()
    try:
        tasks = (generate_mix if several else generate)(
            args.family,
            args.n,
            args.seed,
            min_objects=args.min_objects,
            max_objects=args.max_objects,
            split=args.split,
            verify=not args.no_verify,
            workers=args.workers,
            progress=lambda done, total: bar.update(done - bar.done),
            **options,
        )
    except GenerationError as exc:
        raise CliError(str(exc)) from None
    bar.close()
    if args.given_domain:
        tasks = _given(tasks)
    write_tasks(args.out, tasks)
    log.info("wrote %d %s tasks%s to %s in %.1f s", len(tasks), args.family,
             " (domain given)" if args.given_domain else "", args.out, time.monotonic() - t0)
    return 0


# ----------------------------------------------------------------------------- import-planbench


def _register_import(sub) -> None:
    p = add_command(
        sub,
        "import-planbench",
        help="PlanBench's own instances as task records (NL exactly as PlanBench states it)",
        description=(
            "Read a PlanBench data folder (configs/, instances/, optional prompts/ and plan_generation/) "
            "and write one task per instance for Blocksworld, Mystery Blocksworld, Logistics and Depots "
            "(and the 3-block variants). PlanBench comes from github.com/karthikv792/LLMs-Planning "
            "(folder plan-bench/). Without DIR, the copy that ships inside omtr is used (read in place; "
            "src/omtr/data/planbench/UPSTREAM names the upstream commit)."
        ),
        examples="""  omtr tasks import-planbench --out planbench.jsonl                  # the shipped copy, 1,991 tasks
  omtr tasks import-planbench ../shared/benchmarks/planbench --out planbench.jsonl
  omtr tasks import-planbench ~/LLMs-Planning/plan-bench --family logistics --family depots --out pb.jsonl
  OMTR_BENCHMARKS=/data/benchmarks omtr tasks import-planbench --family blocksworld_3 --out bw3.jsonl
  omtr tasks import-planbench --family blocksworld --given-domain --out pb_given.jsonl   # LLM+P's setting
""",
    )
    p.add_argument("dir", nargs="?", help="PlanBench folder (holding configs/ and instances/)")
    p.add_argument(
        "--family", action="append", default=[],
        help="blocksworld, mystery_blocksworld, logistics, depots or a config name such as blocksworld_3; repeatable (default: all)",
    )
    p.add_argument("--split", choices=("train", "val", "test", "none"), default="test", help="split label (default test)")
    p.add_argument("--given-domain", action="store_true",
                   help="domain-given mode: write each instance's domain file into its record's 'domain' (an input)")
    p.add_argument("--out", required=True, help="output JSONL file")
    p.set_defaults(handler=_import_planbench)


def _import_planbench(args) -> int:
    from omtr.tasks.planbench import PlanBenchError, import_planbench
    from omtr.tasks.records import write_tasks

    root = args.dir
    if root is None:  # the copy shipped as package data
        from omtr.tasks.planbench_data import shipped_root

        root = shipped_root()
    try:
        tasks = import_planbench(root, args.family or None, split=None if args.split == "none" else args.split)
    except PlanBenchError as exc:
        raise CliError(str(exc)) from None
    if args.given_domain:
        tasks = _given(tasks)
    write_tasks(args.out, tasks)
    log.info("wrote %d PlanBench tasks%s to %s", len(tasks), " (domain given)" if args.given_domain else "", args.out)
    return 0


def _given(tasks):
    """The tasks in the domain-given mode: each reference's domain becomes the record's input
    ``domain`` (a domain that does not lint is named with its task)."""
    from omtr.tasks.records import TaskFormatError

    try:
        return [t.with_given_domain() for t in tasks]
    except TaskFormatError as exc:
        raise CliError(str(exc)) from None


# ----------------------------------------------------------------------------- stats


def _register_stats(sub) -> None:
    p = add_command(
        sub,
        "stats",
        help="counts per family/split, object and plan-length histograms",
        description="Summarise a task file: counts per family and split, histograms of object counts and plan lengths.",
        examples="""  omtr tasks stats bw.jsonl
  omtr tasks stats planbench.jsonl --json
  omtr tasks stats bw.jsonl --plot bw_stats.png     # needs matplotlib
""",
    )
    p.add_argument("file", help="task JSONL file")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.add_argument("--plot", metavar="PNG", help="also draw the histograms to a PNG (matplotlib)")
    p.set_defaults(handler=_stats)


def _stats(args) -> int:
    import json

    from omtr.tasks.records import TaskFormatError, load_tasks
    from omtr.tasks.stats import compute_stats, format_stats, plot_stats

    try:
        tasks = load_tasks(args.file)
    except TaskFormatError as exc:
        raise CliError(str(exc)) from None
    stats = compute_stats(tasks)
    print(json.dumps(stats, indent=2) if args.json else format_stats(stats))
    if args.plot:
        try:
            plot_stats(stats, args.plot)
        except ImportError:
            raise CliError("--plot needs matplotlib; pip install matplotlib or drop --plot") from None
    return 0


# ----------------------------------------------------------------------------- transfer


def _register_transfer(sub) -> None:
    p = add_command(
        sub,
        "transfer",
        help="zero-shot transfer tasks: ProntoQA, NATURAL PLAN trip planning and calendar scheduling",
        description=(
            "Generate transfer tasks with omtr's own generators (--n/--seed), or import the official files "
            "(--from FILE: ProntoQA JSON, NATURAL PLAN trip_planning.json / calendar_scheduling.json, which "
            "users download themselves). Gold answers go to meta (evaluation only); score answers with "
            "`omtr tasks score`. --raw-out also writes generated tasks in the benchmark's own JSON format."
        ),
        examples="""  omtr tasks transfer --benchmark prontoqa --n 500 --seed 0 --out prontoqa.jsonl
  omtr tasks transfer --benchmark trip --from natural-plan/data/trip_planning.json --out trip.jsonl
  omtr tasks transfer --benchmark calendar --n 100 --seed 1 --raw-out calendar_scheduling.json --out cal.jsonl
""",
    )
    p.add_argument("--benchmark", required=True, choices=("prontoqa", "trip", "calendar"))
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--n", type=int, help="generate this many tasks")
    src.add_argument("--from", dest="source", metavar="FILE", help="import the benchmark's official JSON file")
    p.add_argument("--seed", type=int, default=0, help="random seed for generation (default 0)")
    p.add_argument("--raw-out", metavar="JSON", help="also write generated examples in the benchmark's own format")
    p.add_argument("--split", choices=("train", "val", "test"), default="test", help="split label (default test)")
    p.add_argument("--out", required=True, help="output task JSONL")
    p.set_defaults(handler=_transfer)


def _transfer(args) -> int:
    import json

    from omtr.tasks.records import TaskFormatError, write_tasks
    from omtr.tasks.transfer import BENCHMARKS

    bench = BENCHMARKS[args.benchmark]
    try:
        if args.source:
            tasks = bench.load(args.source, split=args.split)
        else:
            if args.n <= 0:
                raise CliError("--n must be positive")
            raw = bench.generate(args.n, args.seed)
            if args.raw_out:
                with open(args.raw_out, "w", encoding="utf-8") as fh:
                    json.dump(raw, fh, indent=1)
            tasks = bench.to_tasks(raw, split=args.split, source=f"omtr-generator seed {args.seed}")
    except (TaskFormatError, OSError, ValueError) as exc:
        raise CliError(str(exc)) from None
    write_tasks(args.out, tasks)
    log.info("wrote %d %s tasks to %s", len(tasks), args.benchmark, args.out)
    return 0


def _register_score(sub) -> None:
    p = add_command(
        sub,
        "score",
        help="score free-text answers on transfer tasks with the benchmark's own rule",
        description=(
            "Read tasks (from `omtr tasks transfer`) and answers (JSONL with id and answer), score each "
            "answer as the benchmark does (ProntoQA: final true/false; trip: the whole (city, days) "
            "sequence; calendar: the proposed day and slot) and print accuracy as JSON."
        ),
        examples="""  omtr tasks score --tasks prontoqa.jsonl --answers answers.jsonl
  omtr tasks score --tasks trip.jsonl --answers model_out.jsonl --out scored.jsonl
""",
    )
    p.add_argument("--tasks", required=True, help="task JSONL with gold answers in meta")
    p.add_argument("--answers", required=True, help='JSONL of {"id": ..., "answer": "..."}')
    p.add_argument("--out", help="write per-task results as JSONL")
    p.set_defaults(handler=_score)


def _score(args: argparse.Namespace) -> int:
    import json

    from omtr.tasks.records import TaskFormatError, load_tasks
    from omtr.tasks.transfer import score_answers

    try:
        tasks = load_tasks(args.tasks)
        with open(args.answers, encoding="utf-8") as fh:
            answers = {str(r["id"]): str(r.get("answer", "")) for r in map(json.loads, filter(str.strip, fh))}
        summary, rows = score_answers(tasks, answers)
    except (TaskFormatError, OSError, KeyError, ValueError) as exc:
        raise CliError(str(exc)) from None
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json.dumps(r) + "\n")
    print(json.dumps(summary, indent=2))
    return 0
