"""A random walk through the scoped decoder, shared by the scope tests."""

from __future__ import annotations

import random

import numpy as np


def walk(grammar, seed: int, *, given=None, objects=None, max_steps: int = 1500):
    """Pick uniformly among the tokens the combined mask admits (or the forced one) until the end
    of sequence, the grammar's end or ``max_steps``; returns (text, finished, state)."""
    rng = random.Random(seed)
    st = grammar.state(scoped=True, given=given, objects=objects)
    bm = grammar.allocate_bitmask(1)
    pieces = grammar.vocab.pieces
    V = grammar.vocab_size
    for _ in range(max_steps):
        forced = st.fill(bm, 0)
        if forced is None:
            ids = np.flatnonzero(np.unpackbits(bm[0].numpy().view(np.uint8), bitorder="little")[:V])
            tok = int(rng.choice(ids))
        else:
            tok = forced
        if tok == grammar.eos:
            break
        assert st.accept(tok, pieces[tok]), st.text[-80:]
        if st.matcher.is_terminated():
            break
    return st.text, st.matcher.is_completed() or st.matcher.is_terminated(), st
