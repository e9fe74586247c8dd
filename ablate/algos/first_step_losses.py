"""Each algorithm's loss at its first optimiser step, as pure functions of log-probs: what the fidelity audit
(:mod:`ablate.eval.fidelity`) differentiates once with the regime's reference log-probs and once with the exact
ones, to compare the two gradients.

At the first step the sampling policy is the policy itself, so every importance ratio is 1 (``exp(lp - lp.detach())``,
which keeps the gradient). Conventions as in :mod:`ablate.algos.ppo_math`: ``[B, T]`` per-token tensors aligned with
the response tokens, ``mask`` 1 on them. The KL term follows ``placement`` (``reward`` | ``loss``) with ``estimator``
(k1 | k2 | k3) as training places it (:mod:`ablate.algos.kl_estimators`); ``ref_logp`` may hold all-NaN rows (no
reference term): they get none, as in training.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ablate.algos.kl_estimators import covered_loss_penalty, kl_penalty, sequence_penalty
from ablate.algos.ppo_math import gae, masked_mean, masked_whiten, policy_loss, token_rewards
from ablate.refs.base import fill_uncovered


def dpo_sigmoid_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """The DPO paper's loss (TRL's ``sigmoid``, no label smoothing), mean over pairs, from summed sequence log-probs:
    ``-log sigmoid(beta * ((pi_w - ref_w) - (pi_l - ref_l)))``. ``ln 2`` when the policy equals the reference."""
    logits = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -F.logsigmoid(beta * logits).mean()


def group_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """GRPO's advantages: each completion's reward minus its group's mean, over the group's standard deviation
    (+1e-4, TRL's ``scale_rewards="group"``); groups are consecutive ``group_size`` completions."""
    r = rewards.view(-1, group_size)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)


def grpo_loss(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    rewards: torch.Tensor,
    *,
    group_size: int,
    beta: float,
    estimator: str,
    placement: str,
) -> torch.Tensor:
    """GRPO's first-step loss, token-averaged over the batch (TRL's ``dapo``), as :mod:`ablate.algos.grpo` trains it:
    ``-A * ratio``, plus ``beta`` times the per-token estimator in the loss (k3: TRL's, times the ratio); or, in the
    reward, ``r - beta * sum_t k_t`` (detached) before the group normalisation."""
    ratio = torch.exp(logp - logp.detach())
    if placement == "reward":
        penalty = sequence_penalty(logp.detach(), fill_uncovered(ref_logp, logp), mask, estimator)
        adv = group_advantages(rewards - beta * penalty, group_size)
        return masked_mean(-adv[:, None] * ratio, mask)
    adv = group_advantages(rewards, group_size)
    return masked_mean(-adv[:, None] * ratio + beta * covered_loss_penalty(logp, ref_logp, estimator), mask)


def ppo_policy_loss(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    scores: torch.Tensor,
    *,
    beta: float,
    estimator: str,
    placement: str,
    gamma: float,
    lam: float,
    whiten: bool,
    cliprange: float,
) -> torch.Tensor:
    """PPO's first-step clipped policy loss (:mod:`ablate.algos.ppo`) with the KL penalty in the per-token reward, or
    ``beta`` times the token mean of the estimator added to it (the loss placement); the critic left out (values 0:
    the untrained value head's contribution is not the reference's)."""
    in_reward = placement == "reward"
    kl = kl_penalty(logp.detach(), fill_uncovered(ref_logp, logp), estimator) * mask
    rewards = token_rewards(scores, kl, beta if in_reward else 0.0, mask)
    adv, _ = gae(rewards, torch.zeros_like(rewards), mask, gamma, lam)
    if whiten:
        adv = masked_whiten(adv, mask)
    loss, _ = policy_loss(logp, logp.detach(), adv, mask, cliprange)
    if in_reward:
        return loss
    return loss + beta * masked_mean(covered_loss_penalty(logp, ref_logp, estimator), mask)
