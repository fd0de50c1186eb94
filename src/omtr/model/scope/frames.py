"""The tracker's frames: one per open parenthesis of the answer, and the characters words are made of.

Shared by the tracker (:mod:`.tracker`), which pushes and pops the frames as it reads, and by the
rules, which read them. Holds no rule of its own.
"""

from __future__ import annotations

WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-?:=")
SECTION_HEADS = ("domain", "problem", ":requirements", ":types", ":predicates", ":action",
                 ":domain", ":objects", ":init", ":goal")


class Reject(Exception):
    """The character just fed makes the answer leave the scope rules."""


# Frame kinds
ROOT, DEFINE, SECTION, HEADER, REQ, TYPES, PREDS, PDECL, ACTION, PARAMS, FORMULA, CONJ, NOT, ATOM, EQ, \
    OBJECTS, INIT, GOAL = range(18)
TYPED = (TYPES, PDECL, PARAMS, OBJECTS)


class Frame:
    """One open parenthesis. ``ctx`` (formulas): pre, eff, init or goal."""

    __slots__ = ("kind", "ctx", "words", "group", "after_dash", "items", "used", "neg", "pred", "args",
                 "expect", "name")

    def __init__(self, kind: int, ctx: str | None = None):
        self.kind = kind
        self.ctx = ctx
        self.words = 0  # words read in this frame (the head included)
        self.group: list[str] = []  # typed lists: items waiting for their type
        self.after_dash = False
        self.items: dict[str, str] = {}  # typed lists: item -> type (object until a type follows)
        self.used: set | None = None  # conjunctions and :init: literals written
        self.neg = False
        self.pred: str | None = None
        self.args: list[str] = []
        self.expect: str | None = None  # action: the keyword just read
        self.name: str | None = None

    def copy(self) -> "Frame":
        f = Frame.__new__(Frame)
        for s in Frame.__slots__:
            setattr(f, s, getattr(self, s))
        f.group = list(self.group)
        f.items = dict(self.items)
        f.args = list(self.args)
        if self.used is not None:
            f.used = set(self.used)
        return f
