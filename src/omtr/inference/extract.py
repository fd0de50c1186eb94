"""Domain and problem out of model text, whatever shape the text is in.

A model's answer may wrap the PDDL in code fences, talk before and after it, stop mid-block at
the token limit, forget one block, write extra blocks or repeat itself. :func:`extract_spec`
scans the text once, cutting out every ``(define (domain ...))`` / ``(define (problem ...))``
block by balanced parentheses (comments skipped), and picks:

* the first closed domain block, and
* the first closed problem block after it (or, failing that, anywhere in the text).

With a given domain (the domain-given mode) only the problem is taken from the text, the first
closed problem block, and paired with the given domain; a domain block the answer writes anyway
is ignored (and noted).

It never raises. What it cannot find becomes a ``syntax`` verdict (:func:`extraction_verdict`)
whose message says what is missing, so the Editor reads the same kind of diagnostic as for any
other failure and no planner call is spent on it.

:func:`spec_complete` answers "are both blocks closed?" for early stopping during decoding; it
rejects cheaply and then scans only from the first ``define``, and :class:`SpecScanner` does the
same work incrementally when a caller feeds text piece by piece. :func:`problem_complete` is the
domain-given mode's stop: a closed problem block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from omtr.pddl.categories import Category
from omtr.solver.verdict import Verdict

# "(define (domain" / "(define (problem", any spacing and case.
_HEADER = re.compile(r"\(\s*define\s*\(\s*(domain|problem)\b", re.IGNORECASE)
# What the scanner looks at inside a block: headers, parentheses, comments, code fences.
_TOKEN = re.compile(r"\(\s*define\s*\(\s*(?:domain|problem)\b|[()]|;[^\n]*|```", re.IGNORECASE)

KINDS = ("domain", "problem")


@dataclass
class Block:
    kind: str  # domain | problem
    start: int
    end: int | None  # index after the closing parenthesis; None when never closed
    missing: int = 0  # closing parentheses missing when not closed

    @property
    def closed(self) -> bool:
        return self.end is not None


@dataclass
class Extracted:
    """What :func:`extract_spec` found: the chosen texts and notes on everything else."""

    domain: str | None
    problem: str | None
    blocks: list[Block] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    given: bool = False  # the domain was given (not read from the text)

    @property
    def ok(self) -> bool:
        return self.domain is not None and self.problem is not None

    def problem_message(self) -> str:
        """One sentence naming what is missing (empty when both blocks were found)."""
        parts = []
        for kind in (("problem",) if self.given else KINDS):
            if getattr(self, kind) is not None:
                continue
            opened = [b for b in self.blocks if b.kind == kind]
            if opened:
                b = opened[0]
                parts.append(
                    f"the {kind} block is never closed ({b.missing} closing parenthes"
                    f"{'i' if b.missing == 1 else 'e'}s missing; was the output cut off?)"
                )
            else:
                parts.append(f"no (define ({kind} ...)) block was found")
        if not parts:
            return ""
        msg = "; ".join(parts)
        if self.given:
            return msg[0].upper() + msg[1:] + (
                ". The domain is given: write the complete problem as one balanced (define (problem ...)) block."
            )
        return msg[0].upper() + msg[1:] + (
            ". Write the complete domain, then the complete problem, each as one balanced (define ...) block."
        )


def scan_blocks(text: str) -> list[Block]:
    """Every define block in ``text`` in order, closed or not (a new header ends an open block)."""
    blocks: list[Block] = []
    cur: Block | None = None
    depth = 0
    for m in _TOKEN.finditer(text):
        tok = m.group(0)
        c = tok[0]
        if c == ";":
            continue
        if c == "`":  # a code fence: PDDL has no backticks, so an open block ends here
            if cur is not None:
                cur.missing, cur = depth, None
            continue
        if c == "(" and len(tok) > 1:  # a header
            if cur is not None:
                cur.missing = depth
            kind = "domain" if "domain" in tok.lower() else "problem"
            cur = Block(kind, m.start(), None)
            blocks.append(cur)
            depth = 2  # "(define (" opened two; the header's own ")" comes later
            continue
        if cur is None:
            continue
        depth += 1 if c == "(" else -1
        if depth == 0:
            cur.end, cur = m.end(), None
    if cur is not None:
        cur.missing = depth
    return blocks


def extract_spec(text: str, given_domain: str | None = None) -> Extracted:
    """The domain and problem in ``text`` (either may be None); never raises. With ``given_domain``
    only the problem is read from the text, and the domain is the given one."""
    if not isinstance(text, str):
        text = str(text or "")
    if given_domain is not None:
        return _extract_problem(text, given_domain)
    blocks = scan_blocks(text)
    domains = [b for b in blocks if b.kind == "domain" and b.closed]
    problems = [b for b in blocks if b.kind == "problem" and b.closed]
    dom = domains[0] if domains else None
    prob = None
    if problems:
        after = [b for b in problems if dom is None or b.start >= dom.end]
        prob = after[0] if after else problems[0]
    notes = []
    extra = len(domains) + len(problems) - (dom is not None) - (prob is not None)
    if extra:
        notes.append(f"{extra} further complete block(s) ignored; the first domain and the first problem after it were used")
    unclosed = [b for b in blocks if not b.closed]
    if unclosed and dom is not None and prob is not None:
        notes.append(f"{len(unclosed)} unfinished block(s) ignored")
    return Extracted(
        domain=text[dom.start:dom.end] if dom else None,
        problem=text[prob.start:prob.end] if prob else None,
        blocks=blocks,
        notes=notes,
    )


def _extract_problem(text: str, given_domain: str) -> Extracted:
    blocks = scan_blocks(text)
    problems = [b for b in blocks if b.kind == "problem" and b.closed]
    prob = problems[0] if problems else None
    notes = []
    if any(b.kind == "domain" for b in blocks):
        notes.append("a domain block in the answer was ignored: the domain is given")
    if len(problems) > 1:
        notes.append(f"{len(problems) - 1} further complete problem block(s) ignored; the first was used")
    return Extracted(domain=given_domain, problem=text[prob.start:prob.end] if prob else None,
                     blocks=blocks, notes=notes, given=True)


def extraction_verdict(ex: Extracted) -> Verdict | None:
    """A ``syntax`` verdict naming what could not be extracted; None when both blocks are there."""
    if ex.ok:
        return None
    return Verdict.failure(Category.SYNTAX, ex.problem_message(), stage="extract")


def spec_complete(text: str) -> bool:
    """True once ``text`` holds a closed domain block and a closed problem block.

    Cheap enough to call after every decoded token: texts without two ``define`` headers are
    rejected by a substring count, and the scan starts at the first header.
    """
    low = text.lower()
    if low.count("define") < 2 or "domain" not in low or "problem" not in low:
        return False
    m = _HEADER.search(text)
    if m is None:
        return False
    closed = set()
    line_start = text.rfind("\n", 0, m.start()) + 1  # from the line's start: a ";" before it still counts
    for b in scan_blocks(text[line_start:]):
        if b.closed:
            closed.add(b.kind)
            if len(closed) == 2:
                return True
    return False


def problem_complete(text: str) -> bool:
    """True once ``text`` holds a closed problem block (the stop of the domain-given mode)."""
    low = text.lower()
    if "problem" not in low or "define" not in low:
        return False
    m = _HEADER.search(text)
    if m is None:
        return False
    line_start = text.rfind("\n", 0, m.start()) + 1
    return any(b.closed and b.kind == "problem" for b in scan_blocks(text[line_start:]))


def _header_prefix(rest: str) -> bool:
    """Could ``rest`` (which starts with "(") still grow into a define header?"""
    squeezed = "".join(rest.split()).lower()
    return any(h.startswith(squeezed) and len(squeezed) < len(h) for h in ("(define(domain", "(define(problem"))


class SpecScanner:
    """:func:`spec_complete` fed piece by piece: ``feed(new_text) -> bool``, each character once.

    For decoders that keep per-sequence state. A header split across pieces is held back until
    it can be told apart from an ordinary parenthesis.
    """

    def __init__(self) -> None:
        self._pending = ""  # held-back text that may be the start of a header
        self._depth = 0
        self._in_block = False
        self._in_comment = False
        self._ticks = 0
        self._kind = ""
        self.closed: set[str] = set()

    @property
    def complete(self) -> bool:
        return len(self.closed) == 2

    def feed(self, piece: str) -> bool:
        if self.complete:
            return True
        text = self._pending + piece
        self._pending = ""
        i, n = 0, len(text)
        while i < n:
            c = text[i]
            if self._in_comment:
                self._in_comment = c != "\n"
                i += 1
                continue
            self._ticks = self._ticks + 1 if c == "`" else 0
            if c == ";":
                self._in_comment = True
            elif self._ticks == 3 and self._in_block:  # a code fence ends an open block
                self._in_block = False
            elif c == "(":
                m = _HEADER.match(text, i)
                if m is not None and m.end() == n:  # "domain" may go on ("domainx"): wait and see
                    self._pending = text[i:]
                    return False
                if m is not None:
                    self._in_block, self._depth, self._kind = True, 2, m.group(1).lower()
                    i = m.end()
                    continue
                if _header_prefix(text[i:i + 40]) and i + 40 > n:
                    self._pending = text[i:]
                    return False
                if self._in_block:
                    self._depth += 1
            elif c == ")" and self._in_block:
                self._depth -= 1
                if self._depth == 0:
                    self._in_block = False
                    self.closed.add(self._kind)
                    if self.complete:
                        return True
            i += 1
        return False
