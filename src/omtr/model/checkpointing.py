"""Activation checkpointing of the decoder layers, prompt prefixes shared as before.

The training passes (PPO log-probabilities, the Judge's scores) keep every decoder layer's
activations for the backward pass: for SmolLM2 and 8 rows of ~450 own tokens over a shared
900-token prefix about 12 GB, most of it the attention's keys and values (the prefix's repeated
for every row, grouped-query heads expanded) and the MLP's 1,536-wide intermediates. Under
:func:`checkpointed_layers` each layer keeps only its input; the backward pass recomputes one
layer at a time (about one more forward pass of compute).

Transformers' own gradient checkpointing drops the KV cache (a layer that writes the cache would
write it a second time when the backward pass recomputes it), and the shared prefix reaches the
rows only through the cache. :class:`ReplayCache` is a cache that a recomputation can replay:
each layer's keys and values are a fixed ``past`` (none for the prefix's own pass; the prefix's,
batch of one, for the rows' pass) followed by the call's own, returned without being stored, so a
layer computes the same thing however often it runs. The prefix's keys and values (``own()``)
carry their gradients back to the prefix's pass.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils.checkpoint import checkpoint
from transformers.cache_utils import Cache, DynamicLayer


class _ReplayLayer(DynamicLayer):
    def __init__(self, past: tuple[torch.Tensor, torch.Tensor] | None = None, record: bool = True):
        super().__init__()
        self.past, self.record, self.own = past, record, None
        if past is not None:  # what get_seq_length and the masks read
            self.lazy_initialization(*past)
            self.keys, self.values = past

    def update(self, key_states, value_states, *args, **kwargs):
        if self.record:
            self.own = (key_states, value_states)
        if self.past is None:
            return key_states, value_states
        pk, pv = self.past
        b = key_states.shape[0]
        return (torch.cat([pk.expand(b, -1, -1, -1), key_states], dim=-2),
                torch.cat([pv.expand(b, -1, -1, -1), value_states], dim=-2))

    def batch_repeat_interleave(self, repeats: int) -> None:
        pass  # the past (a batch of one) is expanded to the rows' batch in update, not copied

    def batch_select_indices(self, indices) -> None:
        raise NotImplementedError("a ReplayCache is for one forward pass; it does not follow a shrinking batch")


class ReplayCache(Cache):
    """A KV cache of fixed per-layer ``past`` keys/values (or none) that stores nothing new.

    ``own()`` are the keys and values the last pass computed for its own tokens, per layer: the
    prefix pass's become the rows pass's ``past``."""

    def __init__(self, layers: int, past: list[tuple[torch.Tensor, torch.Tensor]] | None = None):
        if past is not None and len(past) != layers:
            raise ValueError(f"{layers} layers but a past of {len(past)}")
        super().__init__(layers=[_ReplayLayer(past[i] if past else None, record=past is None) for i in range(layers)])

    def layers_past(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The fixed per-layer ``past`` keys and values this cache was built over."""
        return [layer.past for layer in self.layers]

    def own(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        missing = [i for i, layer in enumerate(self.layers) if layer.own is None]
        if missing:
            raise RuntimeError(f"layers {missing[:3]} saw no pass")
        return [layer.own for layer in self.layers]


def decoder_layers(lm) -> list:
    """The decoder layers of a causal LM (a peft model or a plain transformers one)."""
    base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    decoder = getattr(base, base.base_model_prefix)
    return list(decoder.layers)


def spread(layers: list, share: float) -> list:
    """``round(share * len(layers))`` of ``layers`` (at least one), spread evenly over the stack:
    0.5 of 30 gives every other layer, 1.0 all of them."""
    n = len(layers)
    k = min(n, max(1, round(share * n)))
    return [layers[(i * n) // k] for i in range(k)]


@contextlib.contextmanager
def checkpointed_layers(layers):
    """Inside: each layer's forward pass, where gradients are on, runs under non-reentrant
    :func:`torch.utils.checkpoint.checkpoint` (its input kept, its activations recomputed in the
    backward pass). Without gradients the layers run as they are."""
    patched = []
    try:
        for layer in layers:
            forward = layer.forward

            def run(*args, _forward=forward, **kwargs):
                if not torch.is_grad_enabled():
                    return _forward(*args, **kwargs)
                return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

            layer.forward = run  # the instance's attribute, in front of the class's method
            patched.append(layer)
        yield
    finally:
        for layer in patched:
            del layer.forward
