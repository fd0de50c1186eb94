"""Small pure numeric helpers of the trainer; each is tested against hand-computed values.

Token-level helpers take tensors ``[B, L]`` with a boolean ``mask`` marking real tokens (padding
is ignored everywhere). Sequence-level helpers (GAE, group baselines, credit) take plain lists of
floats, as rewards are.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from omtr.telemetry import binary_auc, expected_calibration_error

__all__ = [
    "band_penalty", "binary_auc", "brier_score", "discounted_credit", "expected_calibration_error", "gae",
    "group_advantages", "judge_loss", "kl_k3", "masked_mean", "masked_whiten", "ppo_clip_loss", "seq_mean",
    "thresholded_judge_reward", "whiten",
]


# ------------------------------------------------------------------------------ masked reductions

def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over the positions ``mask`` marks (all of them, or along ``dim``); 0 where none."""
    m = mask.to(x.dtype)
    if dim is None:
        return (x * m).sum() / m.sum().clamp(min=1.0)
    return (x * m).sum(dim) / m.sum(dim).clamp(min=1.0)


def seq_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over each sequence's tokens, then over the sequences that have any: ``[B, L] -> []``."""
    per_seq = masked_mean(x, mask, dim=1)
    has = mask.any(dim=1)
    if not bool(has.any()):
        return x.sum() * 0.0
    return per_seq[has].mean()


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / std`` over the masked positions (population std); other positions become 0."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return ((x - mean) * torch.rsqrt(var + eps)).masked_fill(~mask.bool(), 0.0)


# Below this spread a batch's (or group's) values are centred but not scaled: dividing by a near-zero
# standard deviation would blow rounding noise, or a small term such as an untrained Judge's 0.3 s_J,
# up to unit-size advantages.
MIN_STD = 1e-3


def whiten(values: Sequence[float], eps: float = 1e-8, min_std: float = MIN_STD) -> list[float]:
    """Plain-list ``(x - mean) / std`` (population std); a single value becomes 0, and values whose
    spread is below ``min_std`` are only centred (see :data:`MIN_STD`)."""
    n = len(values)
    if n == 0:
        return []
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / n)
    if n == 1:
        return [0.0]
    if std < min_std:
        return [v - mean for v in values]
    return [(v - mean) / (std + eps) for v in values]


# ------------------------------------------------------------------------------ PPO

def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                  clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The clipped surrogate, as a loss to minimise, and the share of tokens whose ratio was clipped.

    ``advantages`` is one value per sequence ``[B]`` (or per token ``[B, L]``). Per token:
    ``max(-A r, -A clip(r, 1-eps, 1+eps))`` with ``r = exp(logp - old_logp)``; averaged per sequence,
    then over sequences."""
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    ratio = torch.exp(logp - old_logp)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip, 1.0 + clip)
    loss = seq_mean(torch.maximum(unclipped, clipped), mask)
    clip_frac = masked_mean((clipped > unclipped).to(logp.dtype), mask)
    return loss, clip_frac.detach()


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate on tokens sampled from pi: ``exp(d) - d - 1``, ``d = ref - logp``.

    Non-negative, unbiased, and low-variance (Schulman's k3)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


# ------------------------------------------------------------------------------ advantages

def gae(rewards: Sequence[float], values: Sequence[float], gamma: float, lam: float,
        last_value: float = 0.0) -> tuple[list[float], list[float]]:
    """Generalised advantage estimation over one trajectory of steps.

    ``delta_t = r_t + gamma V_{t+1} - V_t`` (``V_T = last_value``, 0 at a terminal state),
    ``A_t = delta_t + gamma lam A_{t+1}``; returns ``(advantages, returns = A + V)``."""
    if len(rewards) != len(values):
        raise ValueError(f"{len(rewards)} rewards for {len(values)} values")
    adv = [0.0] * len(rewards)
    nxt_v, nxt_a = last_value, 0.0
    for t in range(len(rewards) - 1, -1, -1):
        delta = rewards[t] + gamma * nxt_v - values[t]
        nxt_a = delta + gamma * lam * nxt_a
        adv[t] = nxt_a
        nxt_v = values[t]
    return adv, [a + v for a, v in zip(adv, values)]


def discounted_credit(final_reward: float, steps: int, gamma: float) -> list[float]:
    """An episode-end reward credited to each of ``steps`` steps: ``gamma^(T-t) R`` for t = 1..T."""
    return [final_reward * gamma ** (steps - t) for t in range(1, steps + 1)]


def group_advantages(rewards: Sequence[float], groups: Sequence[object], *, scale: bool = True,
                     eps: float = 1e-6) -> list[float]:
    """GRPO-style: each reward minus the mean of its group (the samples of one task), divided by
    the group's standard deviation (population) when ``scale`` and the group's spread is at least
    :data:`MIN_STD` (below it the rewards are only centred); a group of one gets 0."""
    if len(rewards) != len(groups):
        raise ValueError(f"{len(rewards)} rewards for {len(groups)} group keys")
    members: dict[object, list[float]] = {}
    for r, g in zip(rewards, groups):
        members.setdefault(g, []).append(r)
    out = []
    for r, g in zip(rewards, groups):
        xs = members[g]
        if len(xs) < 2:
            out.append(0.0)
            continue
        mean = sum(xs) / len(xs)
        a = r - mean
        if scale:
            std = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
            if std >= MIN_STD:
                a /= std + eps
        out.append(a)
    return out


# ------------------------------------------------------------------------------ the Judge

def band_penalty(s: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(1-b) max(0, s-0.5)^2 + 0.5 b max(0, 0.5-s)^2``: confident scores on the wrong side of 0.5."""
    b = b.to(s.dtype)
    return (1 - b) * torch.clamp(s - 0.5, min=0) ** 2 + 0.5 * b * torch.clamp(0.5 - s, min=0) ** 2


def judge_loss(s: torch.Tensor, b: torch.Tensor, band_weight: float,
               eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``L_J = BCE(s, b) + lambda_band * band``, means over the batch; returns ``(L_J, BCE, band)``."""
    b = b.to(s.dtype)
    sc = s.clamp(eps, 1 - eps)
    bce = -(b * torch.log(sc) + (1 - b) * torch.log(1 - sc)).mean()
    band = band_penalty(s, b).mean()
    return bce + band_weight * band, bce, band


def thresholded_judge_reward(s: float, b: bool, tau: float = 0.5) -> float:
    """Appendix A.4: +1 accept a success, -1 accept a failure, +0.5 reject a failure, -0.5 reject a success."""
    if s >= tau:
        return 1.0 if b else -1.0
    return -0.5 if b else 0.5


def brier_score(probs: Sequence[float], labels: Sequence[bool]) -> float | None:
    """Mean squared error of probabilities against 0/1 outcomes."""
    if len(probs) != len(labels):
        raise ValueError(f"{len(probs)} probabilities for {len(labels)} labels")
    if not probs:
        return None
    return sum((p - float(y)) ** 2 for p, y in zip(probs, labels)) / len(probs)
