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

The recomputation need not repeat the attention (a fifth of a CPU layer's forward time with a
long prompt): on a CPU each checkpointed layer keeps its attention's output and log-sum-exp (a
[rows, heads, tokens] row of numbers and one hidden-size vector per token, ~1/16 of what the layer
would keep unchecked), and in the backward pass the recomputation takes them back instead of
running the attention kernel again, while its queries, keys and values are recomputed as before for
the kernel's backward pass (:class:`_KeptAttention`; torch's own CPU flash-attention kernels, so
values and gradients are those of ``scaled_dot_product_attention``). Elsewhere (a GPU, dropout,
attention biases, a prompt prefix's own unmasked pass, whose output would be held for a whole
optimizer step under ``prompt_prefix_once``) the layer recomputes everything, as before.
"""

from __future__ import annotations

import contextlib
import threading

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


def decoder(lm):
    """The decoder of a causal LM (a peft model or a plain transformers one): the transformer
    without its LM head, whose output is the final hidden states (LoRA layers are inside it)."""
    base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    return getattr(base, base.base_model_prefix)


def decoder_layers(lm) -> list:
    """The decoder layers of a causal LM (a peft model or a plain transformers one)."""
    return list(decoder(lm).layers)


def spread(layers: list, share: float) -> list:
    """``round(share * len(layers))`` of ``layers`` (at least one), spread evenly over the stack:
    0.5 of 30 gives every other layer, 1.0 all of them."""
    n = len(layers)
    k = min(n, max(1, round(share * n)))
    return [layers[(i * n) // k] for i in range(k)]


KEPT_SDPA = "omtr_kept_sdpa"  # the attention function's name in transformers' registry
_active = threading.local()  # (store, mode) of the checkpointed region running on this thread


class _AttentionStore:
    """One checkpointed layer call's attention results: kept by its forward pass, taken back in
    order by its recomputation (a layer calls its attention once per pass). A call made during a
    packed-rows pass (:func:`packed_rows`) remembers the rows' layout, which its recomputation (in
    the backward pass, after the pass has returned) needs again."""

    def __init__(self, config):
        self.config, self.kept, self.next = config, [], 0
        self.packed = getattr(_packed, "value", None)

    def contexts(self):
        return self._region("keep"), self._region("replay")

    @contextlib.contextmanager
    def _region(self, mode):
        previous, previous_packed = getattr(_active, "value", None), getattr(_packed, "value", None)
        impl = self.config._attn_implementation
        if self.packed is not None:  # the packed rows' attention, in the forward pass and its recomputation
            target = PACKED
        else:
            target = KEPT_SDPA if impl == "sdpa" else None
        _active.value = (self, mode) if target else None
        if target:
            self.config._attn_implementation = target
            _packed.value = self.packed
        if mode == "replay":
            self.next = 0
        try:
            yield
        finally:
            _active.value = previous
            _packed.value = previous_packed
            if target:
                self.config._attn_implementation = impl


class _KeptAttention(torch.autograd.Function):
    """torch's CPU flash attention whose forward result may be given (``kept``: the output and
    log-sum-exp of an earlier identical call), so that a recomputation skips the kernel; the
    backward pass is the kernel's own, on the queries, keys and values of this call."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scale, causal, kept):
        if kept is None:
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal,
                                                                                  attn_mask=mask, scale=scale)
        else:
            out, lse = kept
        ctx.scale, ctx.causal = scale, causal
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, _grad_lse):
        q, k, v, out, lse, mask = ctx.saved_tensors
        gq, gk, gv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out.contiguous(), q, k, v, out, lse, 0.0, ctx.causal, attn_mask=mask, scale=ctx.scale)
        return gq, gk, gv, None, None, None, None


_mask_memo: list = [None, None, None]  # (bool mask, dtype, additive mask): the one all layers of a pass share


def _additive(mask: torch.Tensor, dtype) -> torch.Tensor:
    """A boolean mask as the kernel's additive one (0 where attended, -inf elsewhere), made once
    for all the layers that receive the same mask."""
    if _mask_memo[0] is mask and _mask_memo[1] == dtype:
        return _mask_memo[2]
    add = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
    _mask_memo[:] = [mask, dtype, add]
    return add


def forget_masks() -> None:
    """Drop the additive mask kept for the layers of the last pass (after an update: the rollout
    that follows needs none of it)."""
    _mask_memo[:] = [None, None, None]


def kept_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' sdpa attention, with the output kept for (or taken back in) the recomputation
    of a checkpointed layer on a CPU; transformers' own function wherever that does not apply."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    state = getattr(_active, "value", None)
    plain = (state is None or dropout or query.device.type != "cpu" or kwargs.get("position_bias") is not None
             or kwargs.get("softcap") is not None or not (query.dtype == key.dtype == value.dtype)
             or query.shape[2] == 1)
    # A pass without a mask is a shared prompt prefix's own: kept for the whole optimizer step under
    # prompt_prefix_once, its attention output would be held as long; it recomputes it instead.
    plain = plain or attention_mask is None or attention_mask.dtype != torch.bool
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    store, mode = state
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    mask = _additive(attention_mask, query.dtype)
    kept = None
    if mode == "replay" and store.next < len(store.kept):
        kept = store.kept[store.next]
        store.next += 1
    out, lse = _KeptAttention.apply(query, key, value, mask, scaling, False, kept)
    if mode == "keep":
        store.kept.append((out.detach(), lse))
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(KEPT_SDPA, kept_sdpa)
    AttentionMaskInterface.register(KEPT_SDPA, sdpa_mask)
    AttentionInterface.register(PACKED, packed_attention)
    AttentionMaskInterface.register(PACKED, _no_mask)


# ---------------------------------------------------------------------- packed rows

PACKED = "omtr_packed_rows"  # the packed rows' attention function's name in transformers' registry
_packed = threading.local()  # (prefix length, rows' lengths) of the packed-rows pass running on this thread
_FLASH = None


def _flash():
    global _FLASH
    if _FLASH is None:
        _FLASH = (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu,
                  torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward)
    return _FLASH


def _no_mask(*args, **kwargs):
    """The packed rows' attention reads the rows' layout, not a mask: none is built."""
    return None


def packing_applies(config, device) -> bool:
    """Whether a forward pass of this model on ``device`` can take packed rows: torch's CPU flash
    attention kernels behind transformers' sdpa attention, without dropout."""
    return (getattr(device, "type", str(device)) == "cpu" and getattr(config, "_attn_implementation", None) == "sdpa"
            and not getattr(config, "attention_dropout", 0.0))


@contextlib.contextmanager
def packed_rows(config, prefix: int, lengths):
    """Inside: the model's attention takes one row of packed sequences (the rows of a batch one
    after another, no padding) over a shared ``prefix`` of that many key positions (the cache's
    past): each packed row attends to the whole prefix and causally to its own tokens, never to
    another row's (:func:`packed_attention`). Positions are the caller's (each row's restart after
    the prefix)."""
    _register()
    impl, previous = config._attn_implementation, getattr(_packed, "value", None)
    config._attn_implementation = PACKED
    _packed.value = (int(prefix), tuple(int(n) for n in lengths))
    try:
        yield
    finally:
        config._attn_implementation = impl
        _packed.value = previous


def _segments(lengths):
    off = 0
    for n in lengths:
        yield off, n
        off += n


class _PackedAttention(torch.autograd.Function):
    """Attention of packed rows over a shared prefix, as two kinds of flash-attention passes:
    every row's queries against the prefix's keys in one unmasked pass (the query heads of one
    key head folded into its query positions, so the prefix's keys are neither expanded per row
    nor per head), and each row's queries against its own keys in a causal pass. The two partial
    results are merged by their log-sum-exps. The backward pass runs the kernel's backward on
    each part with the merged output and log-sum-exp: that gives every part the probabilities of
    the whole softmax, so the gradients are those of the one attention over prefix and row."""

    @staticmethod
    def forward(ctx, q, k, v, scale, prefix, lengths, kept):
        fwd, _ = _flash()
        _, H, N, D = q.shape
        KV = k.shape[1]
        G = H // KV
        q = q.contiguous()
        if kept is not None:
            out, lse = kept
        else:
            out = torch.empty_like(q)
            lse = torch.empty((1, H, N), dtype=torch.float32, device=q.device)
            for off, n in _segments(lengths):  # own keys, causal
                ks = k[:, :, prefix + off:prefix + off + n].repeat_interleave(G, dim=1).contiguous()
                vs = v[:, :, prefix + off:prefix + off + n].repeat_interleave(G, dim=1).contiguous()
                o, s = fwd(q[:, :, off:off + n].contiguous(), ks, vs, 0.0, True, scale=scale)
                out[:, :, off:off + n] = o
                lse[:, :, off:off + n] = s
            if prefix:
                o1, s1 = fwd(q.view(1, KV, G * N, D), k[:, :, :prefix].contiguous(), v[:, :, :prefix].contiguous(),
                             0.0, False, scale=scale)
                o1, s1 = o1.reshape(1, H, N, D), s1.reshape(1, H, N)
                total = torch.logaddexp(s1, lse)
                out = (o1.float() * (s1 - total).exp_().unsqueeze(-1)
                       + out.float() * (lse - total).exp_().unsqueeze(-1)).to(q.dtype)
                lse = total
        ctx.scale, ctx.prefix, ctx.lengths = scale, prefix, lengths
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, _grad_lse):
        _, bwd = _flash()
        q, k, v, out, lse = ctx.saved_tensors
        scale, prefix = ctx.scale, ctx.prefix
        _, H, N, D = q.shape
        KV = k.shape[1]
        G = H // KV
        grad_out, out = grad_out.contiguous(), out.contiguous()
        gq = torch.zeros_like(q)
        gk, gv = torch.zeros_like(k), torch.zeros_like(v)
        if prefix:
            kp, vp = k[:, :, :prefix].contiguous(), v[:, :, :prefix].contiguous()
            gqf, gkp, gvp = bwd(grad_out.view(1, KV, G * N, D), q.view(1, KV, G * N, D), kp, vp,
                                out.view(1, KV, G * N, D), lse.reshape(1, KV, G * N), 0.0, False, scale=scale)
            gq += gqf.reshape(1, H, N, D)
            gk[:, :, :prefix] = gkp
            gv[:, :, :prefix] = gvp
        for off, n in _segments(ctx.lengths):
            sl = slice(off, off + n)
            ks = k[:, :, prefix + off:prefix + off + n].repeat_interleave(G, dim=1).contiguous()
            vs = v[:, :, prefix + off:prefix + off + n].repeat_interleave(G, dim=1).contiguous()
            gqs, gks, gvs = bwd(grad_out[:, :, sl].contiguous(), q[:, :, sl].contiguous(), ks, vs,
                                out[:, :, sl].contiguous(), lse[:, :, sl].contiguous(), 0.0, True, scale=scale)
            gq[:, :, sl] += gqs
            gk[:, :, prefix + off:prefix + off + n] = gks.reshape(1, KV, G, n, D).sum(2)
            gv[:, :, prefix + off:prefix + off + n] = gvs.reshape(1, KV, G, n, D).sum(2)
        return gq, gk, gv, None, None, None, None


def packed_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' attention function for a packed-rows pass (:func:`packed_rows`): ``query``
    [1, heads, rows' tokens, dim]; ``key``/``value`` the prefix's positions then the rows'. Inside
    a checkpointed layer the output is kept for (or taken back in) its recomputation, as
    :func:`kept_sdpa` does."""
    layout = getattr(_packed, "value", None)
    if layout is None:
        raise RuntimeError("packed rows' attention outside a packed-rows pass (omtr.model.checkpointing.packed_rows)")
    prefix, lengths = layout
    if dropout or kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None:
        raise RuntimeError("packed rows take plain attention: no dropout, soft-capping or position bias; "
                           "--set pack_rows=false")
    if query.shape[0] != 1 or query.shape[2] != sum(lengths) or key.shape[2] != prefix + sum(lengths):
        raise RuntimeError(f"packed rows: queries {tuple(query.shape)} and keys {tuple(key.shape)} do not match a "
                           f"prefix of {prefix} and rows of {sum(lengths)} tokens")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if not query.dtype == key.dtype == value.dtype:  # e.g. a stored fp32 prefix under a bf16 autocast
        dtype = (torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu")
                 else torch.promote_types(torch.promote_types(query.dtype, key.dtype), value.dtype))
        query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    state = getattr(_active, "value", None)
    kept, store, mode = None, None, None
    if state is not None:
        store, mode = state
        if mode == "replay" and store.next < len(store.kept):
            kept = store.kept[store.next]
            store.next += 1
    out, lse = _PackedAttention.apply(query, key, value, scaling, prefix, lengths, kept)
    if mode == "keep":
        store.kept.append((out.detach(), lse))
    return out.transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def checkpointed_layers(layers):
    """Inside: each layer's forward pass, where gradients are on, runs under non-reentrant
    :func:`torch.utils.checkpoint.checkpoint` (its input kept, its activations recomputed in the
    backward pass). Without gradients the layers run as they are."""
    _register()
    patched = []
    try:
        for layer in layers:
            forward = layer.forward
            config = getattr(getattr(layer, "self_attn", None), "config", None)

            def run(*args, _forward=forward, _config=config, **kwargs):
                if not torch.is_grad_enabled():
                    return _forward(*args, **kwargs)
                extra = {}
                if _config is not None:  # the attention kept for the recomputation (on a CPU)
                    extra["context_fn"] = _AttentionStore(_config).contexts
                return checkpoint(_forward, *args, use_reentrant=False, **extra, **kwargs)

            layer.forward = run  # the instance's attribute, in front of the class's method
            patched.append(layer)
        yield
    finally:
        for layer in patched:
            del layer.forward
