"""Token log-probabilities from final hidden states, a chunk of positions at a time.

``log p(t_i) = z_i[t_i] - logsumexp(z_i)`` with ``z_i = mask_i(W h_i + b) / T`` for N positions
``i`` (the LM head ``W, b``, the temperature ``T``, the grammar's mask of position i setting
disallowed tokens to -inf). The usual way computes ``z`` for the whole batch, ``[B, L, V]``, and
autograd keeps it (and the scaled, masked and exponentiated copies) until the backward pass: for
SmolLM2's 49,152-token vocabulary 0.7 GB a copy for 8 rows of 448 positions. Here only one chunk's
``[chunk, V]`` buffer exists at a time, in the forward and in the backward pass:

- **forward** (per chunk): the head, the temperature, the mask, the target logit minus the
  logsumexp. With gradients wanted for the hidden states, the chunk's softmax ``p_i`` is turned
  into ``d log p(t_i) / d h_i = (W[t_i] - p_i W) / T`` right away (``log p(t_i)`` depends on ``h_i``
  alone, so this [N, H] Jacobian is all the backward pass needs for them): no recomputation,
  the same two matrix products per chunk as the usual forward and backward.
- **backward**: ``grad h_i = g_i * J_i``. When the head's weight itself trains (a trainable
  backbone; the weight may be tied to the input embeddings), each chunk's ``p`` is recomputed
  for ``grad W = sum_i g_i (e_{t_i} - p_i) h_i^T / T`` (and ``grad b``).

Under a bf16 autocast (``update_dtype=bf16``, omtr.model.precision) the head still runs in the
weights' dtype (fp32): the autocast is off inside both passes, so the log-probabilities (the PPO
ratio's terms) are fp32 products of the final hidden states. The Jacobian's product alone, the
half of the head's work that only shapes the gradient, is bf16 there, as the layers' products
are: ``p_i W`` would cancel against ``W[t_i]`` where ``p_i(t_i)`` is near 1, so the target's
share is taken out first, ``J_i = ((1 - p_i(t_i)) W[t_i] - q_i W) / T`` with ``q_i`` the softmax
off the target, and only ``q_i W`` is rounded (relative error ~2^-8 of a term as small as the result).

Values equal the full-batch computation up to float rounding (tests/test_logprob_chunks.py).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

MaskFn = Callable[[torch.Tensor, torch.Tensor], None]


def lean_head(model) -> nn.Linear | None:
    """The causal LM's output layer when its logits are a plain ``Linear`` of the final hidden
    states (what :func:`chunked_token_logprobs` computes); None otherwise (an adapter on the head,
    logit soft-capping or scaling), in which case callers take the full-batch path."""
    head = model.get_output_embeddings()
    if type(head) is not nn.Linear:
        return None
    cfg = model.config
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None) not in (None, 1, 1.0):
        return None
    return head


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float,
                  bitmask: torch.Tensor | None, apply_mask: MaskFn | None) -> torch.Tensor:
    """``mask((W h + b).float() / T)`` for one chunk, a fresh [c, V] fp32 tensor (the head in the
    weights' dtype, then fp32: as the model's own forward and ``.float()``)."""
    z = nn.functional.linear(h.to(weight.dtype), weight, bias).float()
    if temperature != 1.0:
        z.div_(temperature)
    if bitmask is not None:
        apply_mask(z, bitmask)
    return z


def _softmax_(z: torch.Tensor) -> torch.Tensor:
    """logsumexp of each row of ``z``; ``z`` becomes the rows' softmax in place (no second buffer)."""
    m = z.amax(dim=-1, keepdim=True)
    m.masked_fill_(m.isinf(), 0.0)  # a row of -inf stays -inf (as torch.logsumexp)
    z.sub_(m).exp_()
    s = z.sum(dim=-1, keepdim=True)
    z.div_(s)
    return (s.log_() + m).squeeze(-1)


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, bitmask, apply_mask, temperature, chunk, jac_dtype):
        with torch.autocast(hidden.device.type, enabled=False):  # the head in the weights' dtype (fp32)
            return _ChunkedLogprobs._forward(ctx, hidden, weight, bias, targets, bitmask, apply_mask, temperature,
                                             chunk, jac_dtype)

    @staticmethod
    def _forward(ctx, hidden, weight, bias, targets, bitmask, apply_mask, temperature, chunk, jac_dtype):
        need_h = ctx.needs_input_grad[0]
        need_w = ctx.needs_input_grad[1] or (bias is not None and ctx.needs_input_grad[2])
        N, H = hidden.shape
        out = torch.empty(N, dtype=torch.float32, device=hidden.device)
        jac = torch.empty((N, H), dtype=torch.float32, device=hidden.device) if need_h else None
        lse_all = torch.empty(N, dtype=torch.float32, device=hidden.device) if need_w else None
        low = need_h and jac_dtype is not None and jac_dtype != weight.dtype
        w_low = weight.to(jac_dtype) if low else None  # once per call, not per chunk
        for s in range(0, N, chunk):
            e = min(N, s + chunk)
            t = targets[s:e]
            z = _chunk_logits(hidden[s:e], weight, bias, temperature,
                              bitmask[s:e] if bitmask is not None else None, apply_mask)
            target = z.gather(1, t.unsqueeze(1)).squeeze(1)
            lse = _softmax_(z)  # z holds the softmax p from here on
            out[s:e] = target - lse
            if need_h and low:  # ((1 - p_t) W[t] - q W) / T, q the softmax off the target (module docstring)
                idx = t.unsqueeze(1)
                keep = 1.0 - z.gather(1, idx)
                qw = (z.scatter_(1, idx, 0.0).to(jac_dtype) @ w_low).float()
                jac[s:e] = (weight[t].float() * keep - qw) / temperature
            elif need_h:
                pw = (z.to(weight.dtype) @ weight).float()  # p W: [c, H]
                jac[s:e] = (weight[t].float() - pw) / temperature
            if need_w:
                lse_all[s:e] = lse
            del z
        ctx.temperature, ctx.chunk, ctx.apply_mask = temperature, chunk, apply_mask
        ctx.has_bias, ctx.has_mask = bias is not None, bitmask is not None
        ctx.need_h, ctx.need_w = need_h, need_w
        ctx.hidden_dtype = hidden.dtype
        saved = [jac if need_h else None]
        if need_w:
            saved += [hidden, weight, bias, targets, bitmask, lse_all]
        ctx.save_for_backward(*saved)
        return out

    @staticmethod
    def backward(ctx, grad):
        with torch.autocast(grad.device.type, enabled=False):
            return _ChunkedLogprobs._backward(ctx, grad)

    @staticmethod
    def _backward(ctx, grad):
        saved = ctx.saved_tensors
        grad = grad.float()
        grad_h = grad_w = grad_b = None
        if ctx.need_h:
            grad_h = (saved[0] * grad.unsqueeze(1)).to(ctx.hidden_dtype)
        if ctx.need_w:
            hidden, weight, bias, targets, bitmask, lse_all = saved[1:]
            T = ctx.temperature
            gw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
            gb = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if bias is not None else None
            N = hidden.shape[0]
            for s in range(0, N, ctx.chunk):
                e = min(N, s + ctx.chunk)
                z = _chunk_logits(hidden[s:e], weight, bias, T, bitmask[s:e] if bitmask is not None else None,
                                  ctx.apply_mask)
                g = grad[s:e]
                # d log p(t) / d z = e_t - p (z before the temperature: / T), times g
                G = z.sub_(lse_all[s:e].unsqueeze(1)).exp_().mul_(-g.unsqueeze(1))
                G[torch.arange(e - s, device=G.device), targets[s:e]] += g
                if T != 1.0:
                    G.div_(T)
                gw.addmm_(G.t(), hidden[s:e].float())  # fp32 accumulation
                if gb is not None:
                    gb += G.sum(0)
                del z, G
            grad_w = gw.to(weight.dtype) if ctx.needs_input_grad[1] else None
            grad_b = gb.to(bias.dtype) if (gb is not None and ctx.needs_input_grad[2]) else None
        return grad_h, grad_w, grad_b, None, None, None, None, None, None


def chunked_token_logprobs(hidden: torch.Tensor, head: nn.Linear, targets: torch.Tensor, *,
                           temperature: float = 1.0, chunk: int = 512, bitmask: torch.Tensor | None = None,
                           apply_mask: MaskFn | None = None) -> torch.Tensor:
    """``log p(targets[i] | hidden[i])`` for N positions: ``hidden`` [N, H] (final hidden states),
    ``targets`` [N] token ids, ``bitmask`` [N, ceil(V/32)] the grammar's rows (applied with
    ``apply_mask(logits, bitmask)`` in place; None: no constraint). Returns [N] fp32 values,
    differentiable w.r.t. ``hidden`` and the head's parameters; ``chunk`` positions at a time.
    Under a bf16 autocast the Jacobian's product is bf16 (the module's docstring), the values fp32."""
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1, got {chunk}")
    if bitmask is not None and apply_mask is None:
        raise ValueError("a bitmask needs apply_mask")
    if hidden.shape[0] == 0:
        return hidden.new_zeros(0, dtype=torch.float32) + 0 * hidden.sum()
    kind = hidden.device.type
    jac_dtype = (torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind)
                 and torch.get_autocast_dtype(kind) == torch.bfloat16 else None)
    return _ChunkedLogprobs.apply(hidden, head.weight, head.bias, targets.to(hidden.device), bitmask, apply_mask,
                                  float(temperature), int(chunk), jac_dtype)
