"""One JSON Lines reader for every omtr input file, with line-numbered errors.

    for n, obj in read_jsonl(path, what="attempts file"):
        ...

Blank lines are skipped; a line that is not JSON, or (with ``objects=True``, the default) not a
JSON object, raises :class:`JsonlError` whose message is one line: ``PATH:LINE: what is wrong``.
Callers raise their own error type from it where they have one (``except JsonlError as e:
raise MyError(str(e))``) so a user sees the same sentence whatever file it is.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import PurePath
from typing import Any, Iterator


class JsonlError(ValueError):
    """A JSON Lines file that cannot be read; the message names the file and line."""


def read_jsonl(path: str | os.PathLike, *, what: str = "file", objects: bool = True) -> Iterator[tuple[int, Any]]:
    """(line number, decoded value) for each non-blank line of ``path`` (a file path, or a
    path-like object with ``read_bytes``, such as a file inside the shipped data archive)."""
    try:
        if hasattr(path, "read_bytes") and not isinstance(path, PurePath):
            fh = io.BytesIO(path.read_bytes())
        else:
            fh = open(path, "rb")
    except FileNotFoundError:
        raise JsonlError(f"{path}: no such {what}") from None
    except OSError as exc:
        raise JsonlError(f"{path}: cannot read the {what} ({exc.strerror})") from None
    with fh:
        for n, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise JsonlError(f"{path}:{n}: not UTF-8 text") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise JsonlError(f"{path}:{n}: not valid JSON ({exc.msg} at column {exc.pos + 1})") from None
            if objects and not isinstance(obj, dict):
                raise JsonlError(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}")
            yield n, obj
