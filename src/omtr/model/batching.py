"""Which prompts go through the network together.

A forward pass computes the common token prefix of its rows once (:meth:`RoleModel._prefill`), so
rows with alike prompts are cheap together and dear apart: the eight Editor prompts of one task
share the system message, the task and its domain (most of their tokens), those of eight different
tasks share the system message only. :func:`alike_chunks` orders a batch's prompts so that alike
ones land in the same micro-batch.
"""

from __future__ import annotations

import os
from typing import Sequence

SHARE = 0.5  # a chunk closes when the next text shares less than this fraction of its first text


def prompt_text(messages: Sequence[dict]) -> str:
    """A prompt's messages as one string (its order is the tokens' order)."""
    return "\n".join(f"{m.get('role', '')}:{m.get('content', '')}" for m in messages)


def alike_chunks(texts: Sequence[str], size: int, *, share: float = SHARE,
                 lengths: Sequence[int] | None = None) -> list[list[int]]:
    """Positions of ``texts`` in chunks of at most ``size``, alike texts together.

    The texts are sorted (equal texts keep their order); a chunk closes when it holds ``size``
    texts or when the next one's common prefix with the chunk's first text is shorter than
    ``share`` of that text. Every position appears exactly once.

    With ``lengths`` (one per text: the tokens each row adds beyond the shared prompt, e.g. a
    completion's), each run of alike texts is ordered by length before it is cut into chunks of
    ``size``, so that a chunk's rows are of about one length: a batch pads every row to its
    longest, and the eight samples of one task range from ~250 to ~900 completion tokens."""
    if size < 1:
        raise ValueError(f"chunk size must be >= 1, got {size}")
    if lengths is not None and len(lengths) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(lengths)} lengths")
    order = sorted(range(len(texts)), key=lambda i: texts[i])
    runs: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur:
            head = texts[cur[0]]
            full = lengths is None and len(cur) >= size
            if full or len(os.path.commonprefix([head, texts[i]])) < share * len(head):
                runs.append(cur)
                cur = []
        cur.append(i)
    if cur:
        runs.append(cur)
    if lengths is None:
        return runs
    chunks: list[list[int]] = []
    for run in runs:
        run = sorted(run, key=lambda i: lengths[i])  # stable: equal lengths keep their order
        chunks += [run[k:k + size] for k in range(0, len(run), size)]
    return chunks
