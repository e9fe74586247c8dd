"""KL estimators for samples drawn from the policy, and where each one enters an objective.

For a sample y ~ pi and a reference ref, per token, with l = log ref - log pi: k1 = -l (unbiased for
KL(pi || ref), can be negative), k2 = l^2 / 2 (biased, >= 0), k3 = e^l - 1 - l (unbiased, >= 0).

``algo.kl_placement``: where the per-token penalty goes.

- ``reward``: detached, it lowers the reward (PPO: per token; GRPO: summed over the completion, before the
  group normalisation). Its expected gradient is the score function's, E[k(y) grad log pi(y)]: exactly
  grad KL(pi || ref) for k1 (classic RLHF PPO); biased for k2 and k3 (their values are not log pi - log ref).
- ``loss``: differentiated through log pi (the reference's log-probs are constants). Per token, on policy:
  k1's expected gradient is E[grad log pi] = 0 (it regularises nothing: the zero-gradient ablation, never
  a default); k2's gradient (log pi - log ref) grad log pi is exactly grad KL(pi || ref) in expectation;
  k3 is TRL's GRPO term, k3 times the importance ratio pi / pi_old (TRL's ``use_bias_correction_kl``, on by
  default), whose gradient at pi_old = pi equals k2's, so it is exact too. The plain k3 (without the ratio)
  would give E[(1 - ref/pi) grad log pi] = grad KL(ref || pi), the forward KL's gradient: that is the bias
  the ratio corrects (tests/algos/test_kl_placement.py computes all of these exactly on a small policy).
"""

from __future__ import annotations

import torch

ZERO_GRADIENT_WARNING = (
    "algo.kl_placement=loss with algo.kl_estimator=k1: the zero-gradient ablation (on policy, k1 differentiated "
    "in the loss has expected gradient 0: no pull toward the reference, only variance); summary.json records "
    "kl_zero_gradient_ablation=true"
)


def estimators(logp: torch.Tensor, ref_logp: torch.Tensor) -> dict[str, torch.Tensor]:
    """Schulman's per-sample KL(policy || ref) estimators for tokens sampled from the policy. With
    ``l = ref_logp - logp``: ``k1 = -l`` (unbiased, can be negative), ``k2 = l**2 / 2`` (biased, >= 0),
    ``k3 = exp(l) - 1 - l`` (unbiased, >= 0)."""
    log_ratio = ref_logp - logp
    return {"k1": -log_ratio, "k2": log_ratio.pow(2) / 2, "k3": _k3(log_ratio)}


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL estimate for samples from the policy: k1 = logp - ref_logp, k2 = l^2 / 2, k3 = e^l - 1 - l
    (l = ref_logp - logp). (k1 is written ``logp - ref_logp``: where the two are equal it is +0.0, as
    :func:`estimators`' ``-l`` is -0.0.)"""
    if estimator == "k1":
        return logp - ref_logp
    if estimator == "k2":
        return (ref_logp - logp).pow(2) / 2
    if estimator == "k3":
        return _k3(ref_logp - logp)
    raise ValueError(f"unknown KL estimator {estimator!r} (k1 | k2 | k3)")


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """``exp(l) - 1 - l`` for ``l = ref_logp - logp``."""
    return torch.expm1(log_ratio) - log_ratio


# ------------------------------------------------------------------------------------- the reward placement
def sequence_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, estimator: str) -> torch.Tensor:
    """[B] the estimator summed over the masked (response) tokens, detached: the per-sequence KL estimate that
    the reward placement subtracts (times beta) from a sequence's reward."""
    return (kl_penalty(logp, ref_logp, estimator) * mask.to(logp.dtype)).sum(dim=-1).detach()


def reward_penalty(
    logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, beta: float, estimator: str
) -> torch.Tensor:
    """[B] what the KL penalty adds to each sequence's reward: -beta * sum_t k_t, detached."""
    return -beta * sequence_penalty(logp, ref_logp, mask, estimator)


# --------------------------------------------------------------------------------------- the loss placement
def loss_penalty(
    logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str, old_logp: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-token KL term to add (times beta) to a loss, differentiated through ``logp`` (``ref_logp`` is a
    constant): k1 and k2 as they are; k3 as TRL's GRPO computes it, times the importance ratio
    ``exp(logp - old_logp)`` (TRL's ``use_bias_correction_kl``; ``old_logp``: the sampling policy's log-probs,
    by default ``logp`` detached, i.e. on policy, where the ratio is 1 in value and carries the gradient)."""
    ref_logp = ref_logp.detach()
    term = kl_penalty(logp, ref_logp, estimator)
    if estimator != "k3":
        return term
    old = logp.detach() if old_logp is None else old_logp.detach()
    return term * torch.exp(logp - old)


def covered_loss_penalty(
    logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str, old_logp: torch.Tensor | None = None
) -> torch.Tensor:
    """:func:`loss_penalty` as training adds it: a row the regime has no reference term for (all NaN,
    :func:`ablate.refs.base.uncovered_rows`) contributes exactly 0 with zero gradient (k1 against the policy's own
    detached log-probs is 0 in value but not in gradient, hence the mask)."""
    from ablate.refs.base import fill_uncovered, uncovered_rows

    covered = ~uncovered_rows(ref_logp).view(-1, *([1] * (ref_logp.dim() - 1)))
    term = loss_penalty(logp, fill_uncovered(ref_logp, logp), estimator, old_logp)
    return term * covered.to(term.dtype)


def zero_gradient_warning(estimator: str, placement: str) -> str | None:
    """The one line a run that asked for k1 in the loss logs at start (None for any other combination)."""
    return ZERO_GRADIENT_WARNING if (estimator, placement) == ("k1", "loss") else None
