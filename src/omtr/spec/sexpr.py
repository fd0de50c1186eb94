"""A small, bounded s-expression reader for PDDL with line numbers.

Symbols are lower-cased (PDDL is case-insensitive). Comments run from ``;`` to the end of the
line. Nesting deeper than ``max_depth`` and unbalanced parentheses are reported with the line.
"""

from __future__ import annotations

import re


class SExprError(ValueError):
    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.line = line


class Sym(str):
    """A symbol with the line it came from."""

    line: int

    def __new__(cls, text: str, line: int = 0):
        obj = super().__new__(cls, text)
        obj.line = line
        return obj


class SList(list):
    """A parenthesised list with the line of its opening parenthesis."""

    def __init__(self, items=(), line: int = 0):
        super().__init__(items)
        self.line = line

    @property
    def head(self) -> str | None:
        return self[0] if self and isinstance(self[0], str) else None


_TOKEN = re.compile(r"\(|\)|;[^\n]*|\n|[^\s();]+|[ \t\r\f\v]+")


def read_sexpr(text: str, *, max_depth: int = 64, what: str = "file") -> SList:
    """Read exactly one top-level s-expression from ``text``."""
    stack: list[SList] = []
    top: list[SList] = []
    line = 1
    for m in _TOKEN.finditer(text):
        tok = m.group()
        if tok == "\n":
            line += 1
        elif tok == "(":
            if len(stack) >= max_depth:
                raise SExprError(
                    f"{what}: parentheses nested deeper than {max_depth} levels at line {line}; "
                    "PDDL specs need only a few levels",
                    line,
                )
            stack.append(SList(line=line))
        elif tok == ")":
            if not stack:
                raise SExprError(f"{what}: unexpected ')' at line {line} with no matching '('", line)
            done = stack.pop()
            if stack:
                stack[-1].append(done)
            else:
                top.append(done)
        elif tok[0] == ";" or tok[0] in " \t\r\f\v":
            continue
        else:
            if not stack:
                raise SExprError(
                    f"{what}: text {tok[:40]!r} outside the (define ...) form at line {line}", line
                )
            stack[-1].append(Sym(tok.lower(), line))
    if stack:
        opened = stack[-1].line
        raise SExprError(
            f"{what}: missing ')': the '(' opened at line {opened} is never closed "
            f"({len(stack)} unclosed)",
            opened,
        )
    if not top:
        raise SExprError(f"{what}: empty: expected (define ...)", 1)
    if len(top) > 1:
        raise SExprError(
            f"{what}: more than one top-level form (second starts at line {top[1].line}); "
            "put one (define ...) per file",
            top[1].line,
        )
    return top[0]


def to_text(x) -> str:
    """Render an s-expression back to PDDL text (lower case)."""
    if isinstance(x, list):
        return "(" + " ".join(to_text(i) for i in x) + ")"
    return str(x)
