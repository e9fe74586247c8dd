"""The arithmetic of PPO for RLHF, as pure functions on [B, T] tensors with a response mask.

Conventions: position t holds the t-th response token; ``mask`` is 1 on real response tokens.
The per-token KL estimators are in ``kl_estimators``.
"""

from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp_min(1.0)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise to unit variance (and zero mean) over the masked entries; masked-out entries become 0."""
    m = mask.to(x.dtype)
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    out = (x - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        out = out + mean
    return out * m


def token_rewards(scores: torch.Tensor, kl: torch.Tensor, beta: float, mask: torch.Tensor) -> torch.Tensor:
    """r_t = -beta * kl_t on every response token, plus the sequence score on its last response token."""
    rewards = -beta * kl * mask
    last = (mask.cumsum(1) == mask.sum(1, keepdim=True)) & mask.bool()
    return rewards + last.to(rewards.dtype) * scores.unsqueeze(1)


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over each response (right-padded; the value after the last token is 0).
    Returns (advantages, returns), both 0 outside the mask."""
    m = mask.to(values.dtype)
    values = values * m
    T = rewards.shape[1]
    adv = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(T)):
        next_v = values[:, t + 1] if t + 1 < T else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        last = (delta + gamma * lam * last) * m[:, t]
        adv[:, t] = last
    return adv, (adv + values) * m


def policy_loss(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, cliprange: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped surrogate: mean of max(-A r, -A clip(r, 1 - eps, 1 + eps)). Returns (loss, clip fraction)."""
    ratio = torch.exp(logp - old_logp)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    loss = masked_mean(torch.maximum(unclipped, clipped), mask)
    return loss, masked_mean((clipped > unclipped).to(logp.dtype), mask)


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, cliprange_value: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss: 0.5 mean of max((v - R)^2, (clip(v, v_old +- eps) - R)^2). Returns (loss, clip fraction)."""
    v_clipped = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    a, b = (values - returns) ** 2, (v_clipped - returns) ** 2
    return 0.5 * masked_mean(torch.maximum(a, b), mask), masked_mean((b > a).to(values.dtype), mask)
