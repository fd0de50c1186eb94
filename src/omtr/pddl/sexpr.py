"""A small, bounded s-expression reader for PDDL with line numbers.

Tokens are split where Fast Downward's reader splits them: at whitespace, at parentheses and
before every ``?`` (so ``(aircraft?a)`` reads as ``aircraft ?a``, as the planner and VAL read it).
Symbols are lower-cased (PDDL is case-insensitive). Comments run from ``;`` to the end of the
line and may hold any text; outside comments the planner accepts only ASCII, and so does this
reader. Unbalanced parentheses are reported with the line; nesting deeper than ``max_depth`` is
a limit of omtr's (:class:`NestingLimit`), not a syntax error.
"""

from __future__ import annotations

import re


class SExprError(ValueError):
    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.line = line


class NestingLimit(SExprError):
    """Nesting deeper than the reader's ``max_depth``: a limit of omtr's, not malformed PDDL."""

    def __init__(self, message: str, line: int | None, depth: int):
        super().__init__(message, line)
        self.depth = depth


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


# A new symbol starts at every '?' (Fast Downward's tokenizer inserts a space before each '?').
# Whitespace is ASCII whitespace only: anything else belongs to a symbol (and is rejected there).
_TOKEN = re.compile(r"\(|\)|;[^\n]*|\n|\??[^ \t\n\r\f\v();?]+|\?|[ \t\r\f\v]+")


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
                raise NestingLimit(
                    f"{what}: parentheses nested deeper than {max_depth} levels at line {line}, over "
                    f"omtr's nesting limit (SolverConfig.max_nesting, `omtr solve --max-nesting N`); "
                    "specs for one task need only a few levels",
                    line,
                    max_depth,
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
            if not tok.isascii():
                bad = next(c for c in tok if not c.isascii())
                raise SExprError(
                    f"{what}: non-ASCII character {bad!r} in {tok[:40]!r} at line {line}; the planner "
                    "accepts only ASCII outside comments (after ';')",
                    line,
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
