"""KL divergences between policy and reference models.

Conventions: per-token values of a batch of responses are ``[B, T]`` tensors
with a float/bool ``mask`` ``[B, T]`` marking real response tokens. ``logp`` is
the policy log-prob of the sampled token, ``ref_logp`` the reference log-prob
of the same token. Full distributions are log-probs ``[B, T, V]``.

No value is clamped: an infinite KL stays infinite.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def exact_kl_per_token(policy_logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Exact ``KL(p || q) = sum_v p (log p - log q)`` per position, ``[B, T]``.

    Entries with ``p == 0`` contribute exactly 0 (even where ``q == 0``);
    ``q == 0`` with ``p > 0`` gives ``+inf``. Computed in float64 and returned
    in the promoted input dtype.
    """
    if policy_logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"shape mismatch: {tuple(policy_logprobs.shape)} vs "
            f"{tuple(ref_logprobs.shape)}"
        )
    out_dtype = torch.promote_types(policy_logprobs.dtype, ref_logprobs.dtype)
    lp = policy_logprobs.to(torch.float64)
    lq = ref_logprobs.to(torch.float64)
    p = lp.exp()
    support = p > 0
    # Substitute harmless values off the support so -inf - -inf never forms NaN.
    diff = torch.where(support, lp - lq, torch.zeros_like(lp))
    terms = torch.where(support, p * diff, torch.zeros_like(lp))
    return terms.sum(dim=-1).to(out_dtype)


def kl_estimators(logp: Tensor, ref_logp: Tensor) -> dict[str, Tensor]:
    """Schulman's per-sample KL(policy || ref) estimators for tokens sampled
    from the policy. With ``l = ref_logp - logp``:
    ``k1 = -l`` (unbiased, can be negative), ``k2 = l**2 / 2`` (biased,
    >= 0), ``k3 = exp(l) - 1 - l`` (unbiased, >= 0)."""
    if logp.shape != ref_logp.shape:
        raise ValueError(
            f"shape mismatch: {tuple(logp.shape)} vs {tuple(ref_logp.shape)}"
        )
    l = ref_logp - logp
    return {
        "k1": -l,
        "k2": l.pow(2) / 2,
        "k3": torch.expm1(l) - l,
    }


def sequence_sum(per_token: Tensor, mask: Tensor) -> Tensor:
    """Masked sum over the time axis, ``[B, T] -> [B]``.

    Masked-out positions are replaced by 0 via ``torch.where`` so NaN/inf
    there cannot leak. A float mask weights the kept positions.
    """
    if per_token.shape != mask.shape:
        raise ValueError(
            f"shape mismatch: {tuple(per_token.shape)} vs {tuple(mask.shape)}"
        )
    keep = mask.bool()
    zero = torch.zeros_like(per_token)
    if mask.dtype == torch.bool:
        vals = torch.where(keep, per_token, zero)
    else:
        vals = torch.where(keep, per_token * mask.to(per_token.dtype), zero)
    return vals.sum(dim=-1)


def logprob_errors(approx: Tensor, truth: Tensor, mask: Tensor) -> dict[str, float]:
    """Mean absolute, root-mean-square and max absolute error between two
    ``[B, T]`` log-prob tensors over masked positions (nan if none)."""
    if approx.shape != truth.shape or approx.shape != mask.shape:
        raise ValueError(
            f"shape mismatch: {tuple(approx.shape)}, {tuple(truth.shape)}, "
            f"{tuple(mask.shape)}"
        )
    keep = mask.bool()
    if not bool(keep.any()):
        nan = math.nan
        return {"logp_mae": nan, "logp_rmse": nan, "logp_max_err": nan}
    err = (approx.to(torch.float64) - truth.to(torch.float64))[keep]
    abs_err = err.abs()
    return {
        "logp_mae": float(abs_err.mean()),
        "logp_rmse": float(err.pow(2).mean().sqrt()),
        "logp_max_err": float(abs_err.max()),
    }


def gather_token_logprobs(logprobs: Tensor, tokens: Tensor) -> Tensor:
    """Pick the log-prob of each token: ``[B, T, V]`` and ``[B, T]`` -> ``[B, T]``."""
    if logprobs.shape[:-1] != tokens.shape:
        raise ValueError(
            f"shape mismatch: logprobs {tuple(logprobs.shape)} vs tokens "
            f"{tuple(tokens.shape)}"
        )
    return logprobs.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
