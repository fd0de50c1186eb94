"""omtr's one PDDL grammar, rendered for each decoder that reads it.

The source is :func:`omtr.model.grammar.pddl_ebnf`: EBNF as xgrammar reads it, which is what
omtr's own decoder compiles. Servers read other dialects of the same notation:

* ``xgrammar`` — the source, unchanged.
* ``vllm`` / ``vllm-legacy`` — the source, unchanged: vLLM hands a grammar written with ``::=``
  to its xgrammar backend (a grammar without ``::=`` it reads as Lark); the two modes differ only
  in the request field that carries it (``structured_outputs.grammar`` / ``guided_grammar``).
* ``llamacpp`` — GBNF for llama.cpp's own C++ parser (the one its server runs), which is stricter
  than xgrammar's: rule names of letters, digits and ``-`` only (``_`` becomes ``-``); inside a
  character class only ``\\n \\t \\r \\\\ \\" \\[ \\] \\xHH \\uHHHH`` are escapes, so a literal
  ``-`` goes last instead of being written ``\\-``; a rule's body stays on one line; no comments.

Rendering works on tokens (names, ``::=``, strings, character classes, repetition bounds,
operators), so it follows whatever rules the source grammar gains; a construct it cannot carry
into a dialect is a :class:`DialectError` naming the rule and the construct, never a grammar
the server drops. Standard library only: the HTTP backend reads the grammar without torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DIALECTS = ("xgrammar", "vllm", "vllm-legacy", "llamacpp")

_GBNF_NAME = re.compile(r"[A-Za-z0-9-]+\Z")
_SOURCE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_REPEAT = re.compile(r"\{\s*(\d*)\s*(,?)\s*(\d*)\s*\}")
# escapes the source may use, and what they stand for
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "[": "[", "]": "]", "-": "-",
            "^": "^", "/": "/", "0": "\0"}


class DialectError(ValueError):
    """The source grammar holds something a dialect cannot express; the message says what and where."""


@dataclass(frozen=True)
class Token:
    kind: str  # name | define | string | class | repeat | op
    value: object  # name: str; string: decoded str; class: (negated, ((lo, hi), ...)); repeat: (m, n|None); op: str


def tokenize(ebnf: str) -> list[Token]:
    """The source grammar as tokens; whitespace, line breaks and ``#`` comments dropped."""
    out: list[Token] = []
    i, n = 0, len(ebnf)
    while i < n:
        c = ebnf[i]
        if c.isspace():
            i += 1
        elif c == "#":
            j = ebnf.find("\n", i)
            i = n if j < 0 else j
        elif ebnf.startswith("::=", i):
            out.append(Token("define", "::="))
            i += 3
        elif c == '"':
            text, i = _string(ebnf, i)
            out.append(Token("string", text))
        elif c == "[":
            cls, i = _char_class(ebnf, i)
            out.append(Token("class", cls))
        elif c == "{":
            m = _REPEAT.match(ebnf, i)
            if not m or not m.group(1):
                raise DialectError(f"unreadable repetition bound at {_where(ebnf, i)}")
            lo = int(m.group(1))
            hi = lo if not m.group(2) else (int(m.group(3)) if m.group(3) else None)
            out.append(Token("repeat", (lo, hi)))
            i = m.end()
        elif c in "()|?*+":
            out.append(Token("op", c))
            i += 1
        else:
            m = _SOURCE_NAME.match(ebnf, i)
            if not m:
                raise DialectError(f"unexpected {c!r} at {_where(ebnf, i)}")
            out.append(Token("name", m.group(0)))
            i = m.end()
    return out


def rules(ebnf: str) -> list[tuple[str, list[Token]]]:
    """``(name, body tokens)`` per rule, in order."""
    toks = tokenize(ebnf)
    starts = [k for k in range(len(toks) - 1) if toks[k].kind == "name" and toks[k + 1].kind == "define"]
    if not starts or starts[0] != 0:
        raise DialectError("the grammar does not start with a rule (NAME ::= ...)")
    out = []
    for a, b in zip(starts, starts[1:] + [len(toks)]):
        out.append((toks[a].value, toks[a + 2:b]))
    names = [r for r, _ in out]
    dup = sorted({r for r in names if names.count(r) > 1})
    if dup:
        raise DialectError(f"rule(s) defined twice: {', '.join(dup)}")
    return out


def render(ebnf: str, dialect: str) -> str:
    """The grammar in ``dialect`` (one of :data:`DIALECTS`)."""
    if dialect in ("xgrammar", "vllm", "vllm-legacy"):
        rules(ebnf)  # readable, every rule once
        return ebnf
    if dialect == "llamacpp":
        return to_gbnf(ebnf)
    raise DialectError(f"unknown grammar dialect {dialect!r}; choose from {', '.join(DIALECTS)}")


def gbnf_name(name: str) -> str:
    """A rule name as llama.cpp's parser reads it: ``_`` (and ``.``) become ``-``."""
    out = name.replace("_", "-").replace(".", "-")
    if not _GBNF_NAME.match(out):
        raise DialectError(f"rule name {name!r} has no GBNF spelling (letters, digits and '-' only)")
    return out


def to_gbnf(ebnf: str) -> str:
    """The grammar as GBNF for llama.cpp's C++ parser, one rule a line."""
    parsed = rules(ebnf)
    names = {r for r, _ in parsed}
    mapping: dict[str, str] = {}
    for r, _ in parsed:
        g = gbnf_name(r)
        clash = [o for o, m in mapping.items() if m == g]
        if clash:
            raise DialectError(f"rules {clash[0]!r} and {r!r} both become {g!r} in GBNF; rename one")
        mapping[r] = g
    lines = []
    for r, body in parsed:
        parts = []
        for t in body:
            if t.kind == "name":
                if t.value not in names:
                    raise DialectError(f"rule {r!r} refers to {t.value!r}, which no rule defines")
                parts.append(mapping[t.value])
            elif t.kind == "string":
                parts.append(_gbnf_string(t.value))
            elif t.kind == "class":
                parts.append(_gbnf_class(*t.value))
            elif t.kind == "repeat":
                lo, hi = t.value
                parts.append(f"{{{lo}}}" if hi == lo else (f"{{{lo},}}" if hi is None else f"{{{lo},{hi}}}"))
            elif t.kind == "op":
                parts.append(t.value)
            else:
                raise DialectError(f"rule {r!r}: {t.kind} {t.value!r} cannot stand inside a rule body")
        lines.append(f"{mapping[r]} ::= " + _join(parts))
    return "\n".join(lines) + "\n"


def gbnf_problems(text: str) -> list[str]:
    """What llama.cpp's parser would refuse in ``text`` (names, class escapes), one line each.

    A static check of what :func:`to_gbnf` exists for; the slow tests put the rendering through
    the real parser."""
    out = []
    bare = re.sub(r"\{[^}]*\}", " ", _strip_literals(text))
    for name in sorted(set(re.findall(r"[A-Za-z0-9_.-]+", bare))):
        if not _GBNF_NAME.match(name):
            out.append(f"rule name {name!r}: letters, digits and '-' only")
    for m in re.finditer(r"\\(.)", _classes_only(text)):
        if m.group(1) not in "ntr\\\"[]xuU":
            out.append(f"character class escape '\\{m.group(1)}': not an escape in GBNF")
    return out


# ------------------------------------------------------------------------------------ helpers


def _where(text: str, i: int) -> str:
    line = text.count("\n", 0, i) + 1
    start = text.rfind("\n", 0, i) + 1
    return f"line {line}, column {i - start + 1}"


def _escape_at(text: str, i: int) -> tuple[str, int]:
    """The character an escape at ``text[i] == '\\'`` stands for, and the index after it."""
    if i + 1 >= len(text):
        raise DialectError(f"a backslash ends the grammar at {_where(text, i)}")
    e = text[i + 1]
    if e in "xuU":
        width = {"x": 2, "u": 4, "U": 8}[e]
        digits = text[i + 2:i + 2 + width]
        if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
            raise DialectError(f"bad \\{e} escape at {_where(text, i)}")
        return chr(int(digits, 16)), i + 2 + width
    if e not in _ESCAPES:
        raise DialectError(f"unknown escape '\\{e}' at {_where(text, i)}")
    return _ESCAPES[e], i + 2


def _string(text: str, i: int) -> tuple[str, int]:
    out, j = [], i + 1
    while j < len(text):
        c = text[j]
        if c == '"':
            return "".join(out), j + 1
        if c == "\n":
            break
        if c == "\\":
            ch, j = _escape_at(text, j)
            out.append(ch)
        else:
            out.append(c)
            j += 1
    raise DialectError(f"unterminated string at {_where(text, i)}")


def _char_class(text: str, i: int):
    """``[...]`` as (negated, ranges); ``-`` is a range between two items, literal first or last."""
    j = i + 1
    negated = text.startswith("^", j)
    if negated:
        j += 1
    items: list[tuple[str, bool]] = []  # (char, escaped)
    while j < len(text) and text[j] != "]":
        if text[j] == "\n":
            break
        if text[j] == "\\":
            ch, j = _escape_at(text, j)
            items.append((ch, True))
        else:
            items.append((text[j], False))
            j += 1
    if j >= len(text) or text[j] != "]":
        raise DialectError(f"unterminated character class at {_where(text, i)}")
    ranges: list[tuple[int, int]] = []
    k = 0
    while k < len(items):
        ch, _ = items[k]
        if k + 2 < len(items) and items[k + 1] == ("-", False):
            lo, hi = ord(ch), ord(items[k + 2][0])
            if lo > hi:
                raise DialectError(f"empty range {ch}-{items[k + 2][0]} at {_where(text, i)}")
            ranges.append((lo, hi))
            k += 3
        else:
            ranges.append((ord(ch), ord(ch)))
            k += 1
    return (negated, _merge(ranges)), j + 1


def _merge(ranges):
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((a, b) for a, b in out)


_GBNF_ESC = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\"}


def _gbnf_char(c: str, special: str) -> str:
    if c in _GBNF_ESC:
        return _GBNF_ESC[c]
    if c in special:
        return "\\" + c
    if ord(c) < 0x20 or ord(c) == 0x7F:
        return f"\\x{ord(c):02x}"
    return c


def _gbnf_string(s: str) -> str:
    return '"' + "".join(_gbnf_char(c, '"') for c in s) + '"'


def _gbnf_class(negated: bool, ranges) -> str:
    """A class llama.cpp reads as written: a literal ``-`` last, a literal ``^`` never first."""
    parts, dash = [], False
    for lo, hi in ranges:
        pieces = [(lo, hi)]
        if lo <= ord("-") <= hi:  # the dash leaves its range and goes last
            dash = True
            pieces = [(a, b) for a, b in ((lo, ord("-") - 1), (ord("-") + 1, hi)) if a <= b]
        for a, b in pieces:
            x, y = _gbnf_char(chr(a), "[]"), _gbnf_char(chr(b), "[]")
            parts.append(x if a == b else (x + y if b == a + 1 else f"{x}-{y}"))
    if dash:
        parts.append("-")
    if not parts:
        raise DialectError("an empty character class has no GBNF spelling")
    body = "".join(parts)
    if body.startswith("^"):
        body = "\\x5e" + body[1:]
    return "[" + ("^" if negated else "") + body + "]"


def _join(parts: list[str]) -> str:
    """Tokens as one line: a space between items, none inside parentheses or before a suffix."""
    out = ""
    for p in parts:
        glue = not out or out.endswith("(") or p == ")" or p in ("?", "*", "+") or p.startswith("{")
        out += p if glue else " " + p
    return out


def _strip_literals(text: str) -> str:
    """``text`` with strings and character classes blanked out, ``::=`` and operators spaces."""
    text = re.sub(r'"(?:\\.|[^"\\\n])*"', " ", text)
    text = re.sub(r"\[(?:\\.|[^\]\\\n])*\]", " ", text)
    return re.sub(r"::=|[()|?*+]", " ", text)


def _classes_only(text: str) -> str:
    text = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)
    return " ".join(re.findall(r"\[(?:\\.|[^\]\\\n])*\]", text))
