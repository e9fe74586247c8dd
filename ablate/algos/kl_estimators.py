"""KL estimators for samples drawn from the policy, and where each one enters an objective.

For a sample y ~ pi and a reference ref, per token: k1 = log pi - log ref (unbiased for KL(pi || ref),
can be negative), k3 = e^l - 1 - l with l = log ref - log pi (unbiased and >= 0).

k1 belongs in the REWARD, detached: r(y) - beta * sum_t k1_t. With the score-function (REINFORCE/PPO)
gradient E[(r - beta k1(y)) grad log pi(y)], the penalty part is exactly -beta grad KL(pi || ref). Put in
the LOSS instead (beta * k1 with the gradient flowing through log pi, on samples from pi), its expected
gradient is beta E[grad log pi(y)] = 0: it regularises nothing. k3 is used in the loss (TRL's GRPO).
"""

from __future__ import annotations

import torch


def estimators(logp: torch.Tensor, ref_logp: torch.Tensor) -> dict[str, torch.Tensor]:
    """Schulman's per-sample KL(policy || ref) estimators for tokens sampled from the policy. With
    ``l = ref_logp - logp``: ``k1 = -l`` (unbiased, can be negative), ``k2 = l**2 / 2`` (biased, >= 0),
    ``k3 = exp(l) - 1 - l`` (unbiased, >= 0)."""
    log_ratio = ref_logp - logp
    return {"k1": -log_ratio, "k2": log_ratio.pow(2) / 2, "k3": _k3(log_ratio)}


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL estimate for samples from the policy: k1 = logp - ref_logp, k3 = e^l - 1 - l (l = ref - logp).
    (k1 is written ``logp - ref_logp``: where the two are equal it is +0.0, as :func:`estimators`' ``-l`` is -0.0.)"""
    if estimator == "k1":
        return logp - ref_logp
    if estimator == "k3":
        return _k3(ref_logp - logp)
    raise ValueError(f"unknown KL estimator {estimator!r} (k1 | k3)")


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """``exp(l) - 1 - l`` for ``l = ref_logp - logp``."""
    return torch.expm1(log_ratio) - log_ratio


def sequence_k1(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] sum over the masked (response) tokens of k1 = logp - ref_logp, detached: the per-sequence KL
    estimate that a k1 penalty subtracts from the reward."""
    return ((logp - ref_logp) * mask.to(logp.dtype)).sum(dim=-1).detach()


def k1_reward_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, beta: float) -> torch.Tensor:
    """[B] what a k1 KL penalty adds to each sequence's reward: -beta * sum_t (logp - ref_logp), detached."""
    return -beta * sequence_k1(logp, ref_logp, mask)
