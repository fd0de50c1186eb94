"""``omtr validate-episodes``: run the episode-log suite (Great Expectations) on one parquet log."""

from __future__ import annotations

import json
import sys

from omtr.cli import CliError, add_command

EXAMPLES = """  omtr validate-episodes RUN/episodes/cycle-0003/update-000012.parquet
  omtr validate-episodes log.parquet --json report.json     # the report as JSON too
  omtr validate-episodes log.parquet --json -               # the JSON report instead of the text one
  omtr validate-episodes log.parquet --max-step 9           # a run with a planner-call budget of 10

Checks the columns and their types, the value sets of role and category, ranges (judge_score in
[0, 1], step between 0 and --max-step), that (episode, role, step) is unique within a (run, cycle),
that a step succeeded exactly when it has no category, and that steps have no gaps. Failures name
the bad rows (0-based, in file order) with their run, cycle, episode, task, role and step.
Exit status: 0 the log passed; 1 it failed; 2 usage errors (no such file, not parquet).
"""


def register(sub) -> None:
    p = add_command(
        sub, "validate-episodes",
        help="validate a parquet episode log with the Great Expectations suite",
        description="Validate one episode log (one row per role step) the way training does before an update.",
        examples=EXAMPLES,
    )
    p.add_argument("file", metavar="FILE.parquet", help="the episode log")
    p.add_argument("--json", metavar="OUT", help="also write the report as JSON to OUT ('-': print it instead of the text)")
    p.add_argument("--max-step", type=int, default=None, metavar="N",
                   help="largest step allowed (default: the planner-call budget minus one, 5)")
    p.set_defaults(handler=run)


def run(args) -> int:
    from pathlib import Path

    path = Path(args.file)
    if not path.exists():
        raise CliError(f"{path}: no such file")
    if path.is_dir():
        raise CliError(f"{path}: is a directory, expected a parquet file")
    if args.max_step is not None and args.max_step < 0:
        raise CliError(f"--max-step must be 0 or more, got {args.max_step}")

    from omtr.validation.episodes import EpisodeLogError, read_episode_log, validate_episode_log

    try:
        log = read_episode_log(path)
    except (EpisodeLogError, OSError) as exc:
        raise CliError(str(exc)) from None
    result = validate_episode_log(log, max_step=args.max_step, source=str(path))
    report = result.to_json()
    if args.json == "-":
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(result.describe())
        if args.json:
            try:
                Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
            except OSError as exc:
                raise CliError(f"--json {args.json}: {exc.strerror or exc}") from None
    return 0 if result.success else 1
