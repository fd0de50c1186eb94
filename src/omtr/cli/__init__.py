"""The ``omtr`` command line: one entry point, one subcommand per step.

Each subcommand lives in its own module under ``omtr.cli`` and exposes ``register(subparsers)``.
Modules here import only the standard library at import time; heavy libraries are imported
inside the handlers so that ``omtr --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# Subcommands, in the order they appear in --help; "a-b" lives in the module omtr.cli.a_b.
SUBCOMMANDS = ("solve", "demo", "tasks", "faithful", "solver", "model", "infer", "evaluate", "validate-episodes", "train", "register", "promote", "pipeline", "deploy", "k8s")

EPILOG = """examples:
  omtr demo                                   # the environment on bundled specs, logged to MLflow
  omtr solve domain.pddl problem.pddl         # one verdict as JSON
  omtr solve --batch specs.jsonl --out verdicts.jsonl --workers 2
  omtr <command> --help                       # every command has its own examples
"""


class CliError(Exception):
    """A usage error: printed as one line, exit status 2."""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every subcommand, or with just ``only`` (what ``main`` uses when the command
    line names one: the other subcommands' modules are then never imported)."""
    parser = argparse.ArgumentParser(
        prog="omtr",
        description="omtr: natural-language planning tasks to solver-verified PDDL.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings only, no progress bars")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in (only,) if only in SUBCOMMANDS else SUBCOMMANDS:
        try:
            module = importlib.import_module(f"omtr.cli.{name.replace('-', '_')}")
        except ModuleNotFoundError as exc:  # a subcommand module not written yet
            if exc.name == f"omtr.cli.{name.replace('-', '_')}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    command = next((w for w in words if not w.startswith("-")), None)
    parser = build_parser(command)
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args) or 0)
    except CliError as exc:
        print(f"omtr {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `omtr ... | head`: the reader left, nothing is wrong
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def add_command(sub, name: str, *, help: str, description: str, examples: str) -> argparse.ArgumentParser:
    """A subcommand parser with a description and an examples epilog."""
    return sub.add_parser(
        name,
        help=help,
        description=description,
        epilog="examples:\n" + examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def read_input_file(path: str, what: str = "") -> bytes:
    """The bytes of a file named on the command line, or a CliError that names it."""
    label = f"{what} {path}" if what else path
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise CliError(f"{label}: no such file") from None
    except IsADirectoryError:
        raise CliError(f"{label}: is a directory, expected a file") from None
    except PermissionError:
        raise CliError(f"{label}: permission denied") from None


def finished_ids(path: str) -> set[str]:
    """Ids of the records already in a JSON Lines output that a run appends to (``--resume``).

    A last line cut short by a kill is removed from the file first, so that the next record does
    not run into it; that record's work is simply done again."""
    import json

    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)
    done = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                done.add(str(json.loads(line)["id"]))
            except (ValueError, KeyError, TypeError):
                continue  # not a record of ours: its work runs again
    return done
