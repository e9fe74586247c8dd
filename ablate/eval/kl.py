"""KL divergences between policy and reference models.

Conventions: per-token values of a batch of responses are ``[B, T]`` tensors
with a float/bool ``mask`` ``[B, T]`` marking real response tokens. ``logp`` is
the policy log-prob of the sampled token, ``ref_logp`` the reference log-prob
of the same token. Full distributions are ``[B, T, V]`` *log-scores*: logits, or
log-probs (which are logits already normalised); ``log_softmax`` of a row is
the distribution it describes.

The evaluator's audit (:func:`audit_terms`) normalises and sums in float64, a
chunk of positions at a time, so its own rounding is far below the divergences
it measures and no ``[B, T, V]`` float64 tensor is ever held.

No value is clamped: an infinite KL stays infinite.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

#: float64 elements in one ``[positions, V]`` working tensor of the audit (4 MiB; about ten live at once):
#: it bounds the audit's own memory whatever the batch (for SmolLM2, V = 49152: 10 positions a chunk).
CHUNK_ELEMENTS = 1 << 19
#: above this exponent ``expm1`` would overflow: the term is formed as exp(log p + n) - p (1 + n) instead.
_EXP_SAFE = 600.0
#: below this size ``expm1(n) - n`` is taken from its series (exactly >= 0, no cancellation).
_SERIES = 1e-5


def _exp_excess(n: Tensor) -> Tensor:
    """``exp(n) - 1 - n`` (>= 0) for ``n <= _EXP_SAFE``: its series near 0, ``expm1(n) - n`` elsewhere (the series
    computed for those entries alone: most are not near 0)."""
    out = torch.expm1(n) - n
    small = n.abs() < _SERIES
    if bool(small.any()):
        m = n[small]
        out[small] = m * m * (0.5 + m * (1.0 / 6.0 + m / 24.0))
    return out


def kl_from_scores(x: Tensor, y: Tensor) -> Tensor:
    """Exact ``KL(softmax x || softmax y)`` over the last axis, float64, for log-scores ``x``, ``y``.

    With ``p = softmax x``, ``d = x - y`` (log p - log q up to a per-row constant) and ``e = d - E_p[d]``:
    ``KL = log E_p[exp(-e)] = log1p(E_p[exp(-e) - 1 + e])`` (as ``E_p[e] = 0``), plus ``-log(1 - q_out)``
    where ``q_out`` is q's mass on tokens p gives exactly 0. Every term is >= 0, so the KL is never
    negative and a tiny KL is not the difference of large numbers: the textbook ``sum p (log p - log q)``
    in float64 cancels to about 1e-16 absolute, which is 100% of a KL between logits that differ by 1e-7.
    A row whose sum overflows (a KL beyond about 700 nats) is computed as a log-sum-exp instead.
    Entries with ``x = -inf`` (``p`` exactly 0) contribute 0; ``y = -inf`` (``q`` exactly 0) where
    ``p > 0`` gives ``+inf``; NaN scores give NaN.
    """
    x, y = x.double(), y.double()
    lp = x.log_softmax(-1)
    return _kl_from(x, y, lp, lp.exp())


def _kl_from(x: Tensor, y: Tensor, lp: Tensor, p: Tensor) -> Tensor:
    """:func:`kl_from_scores` of float64 ``x``, ``y`` given ``x``'s log-softmax ``lp`` and ``p = exp(lp)`` (an audit
    compares one policy with two references: computed once)."""
    if bool(torch.isfinite(lp).all()) and bool(torch.isfinite(y).all()):  # logits: every token has mass, no masks
        n = x - y
        n = (p * n).sum(-1, keepdim=True) - n
        return _kl_terms(lp, p, n)
    return _kl_masked(x, y, lp, p)


def _kl_terms(lp: Tensor, p: Tensor, n: Tensor) -> Tensor:
    """``log1p(E_p[exp(n) - 1 - n])`` per row (:func:`kl_from_scores`), from ``-e`` = ``n``."""
    hi = n > _EXP_SAFE
    if bool(hi.any()):
        terms = torch.where(hi, (lp + n).exp() - p * (1.0 + n), p * _exp_excess(torch.where(hi, 0.0, n)))
    else:
        terms = p * _exp_excess(n)
    total = terms.sum(-1)
    kl = torch.log1p(total)
    if bool(torch.isinf(total).any()):
        kl = torch.where(torch.isinf(total), (lp + n).logsumexp(-1) - (p * n).sum(-1), kl)
    return kl


def _kl_masked(x: Tensor, y: Tensor, lp: Tensor, p: Tensor) -> Tensor:
    """:func:`kl_from_scores` where some score is not finite: tokens without mass under either, NaN."""
    support = lp > -math.inf  # p > 0 in exact arithmetic, even where exp(lp) underflows
    no_q = support & torch.isneginf(y)
    d = torch.where(support & ~no_q, x - y, 0.0)
    n = torch.where(support, (p * d).sum(-1, keepdim=True) - d, 0.0)  # -e
    del d
    kl = _kl_terms(lp, p, n)
    if not bool(support.all()):
        q_out = torch.where(support, 0.0, y.softmax(-1)).sum(-1)
        kl = kl - torch.log1p(-q_out)
    return torch.where(no_q.any(-1), math.inf, kl)


def exact_kl_per_token(policy_logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Exact ``KL(p || q) = sum_v p (log p - log q)`` per position, ``[B, T]``.

    Entries with ``p == 0`` contribute exactly 0 (even where ``q == 0``);
    ``q == 0`` with ``p > 0`` gives ``+inf``. Computed in float64 by
    :func:`kl_from_scores` (the inputs may also be unnormalised log-scores) and
    returned in the promoted input dtype.
    """
    if policy_logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"shape mismatch: {tuple(policy_logprobs.shape)} vs {tuple(ref_logprobs.shape)}")
    out_dtype = torch.promote_types(policy_logprobs.dtype, ref_logprobs.dtype)
    return kl_from_scores(policy_logprobs, ref_logprobs).to(out_dtype)


def kl_estimators(logp: Tensor, ref_logp: Tensor) -> dict[str, Tensor]:
    """Schulman's per-sample KL(policy || ref) estimators k1, k2, k3 for tokens sampled from the policy
    (:func:`ablate.algos.kl_estimators.estimators`), for tensors of equal shapes."""
    from ablate.algos.kl_estimators import estimators

    if logp.shape != ref_logp.shape:
        raise ValueError(f"shape mismatch: {tuple(logp.shape)} vs {tuple(ref_logp.shape)}")
    return estimators(logp, ref_logp)


def sequence_sum(per_token: Tensor, mask: Tensor) -> Tensor:
    """Masked sum over the time axis, ``[B, T] -> [B]``.

    Masked-out positions are replaced by 0 via ``torch.where`` so NaN/inf
    there cannot leak. A float mask weights the kept positions.
    """
    if per_token.shape != mask.shape:
        raise ValueError(f"shape mismatch: {tuple(per_token.shape)} vs {tuple(mask.shape)}")
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
        raise ValueError(f"shape mismatch: {tuple(approx.shape)}, {tuple(truth.shape)}, {tuple(mask.shape)}")
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
        raise ValueError(f"shape mismatch: logprobs {tuple(logprobs.shape)} vs tokens {tuple(tokens.shape)}")
    return logprobs.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)


@dataclass
class AuditTerms:
    """Per-token values of the evaluator's audit, float64 ``[B, T]``, 0 off the mask."""

    kl: Tensor  # exact KL(policy || judge) at each position
    logp: Tensor  # the policy's log-prob of the sampled token
    judge_logp: Tensor  # the judge's (the full reference's) log-prob of the sampled token
    stand_in_kl: Tensor | None  # exact KL(policy || stand-in), when a stand-in was given
    stand_in_logp: Tensor | None  # the stand-in's log-prob of the sampled token, when a stand-in was given


def _chunks(mask: Tensor, vocab: int, chunk_elements: int):
    """(batch index, time index) of the masked positions, ``chunk_elements // vocab`` at a time."""
    rows, cols = mask.bool().nonzero(as_tuple=True)
    step = max(1, chunk_elements // max(vocab, 1))
    for s in range(0, rows.numel(), step):
        yield rows[s : s + step], cols[s : s + step]


def _check_scores(scores: Tensor, tokens: Tensor, mask: Tensor, what: str) -> None:
    if scores.shape[:-1] != tokens.shape or tokens.shape != mask.shape:
        raise ValueError(
            f"shape mismatch: {what} {tuple(scores.shape)}, tokens {tuple(tokens.shape)}, mask {tuple(mask.shape)}"
        )


def _token_logp(x: Tensor, tok: Tensor) -> Tensor:
    """log_softmax(x) at ``tok`` ([N, V] float64 log-scores, [N, 1] token ids -> [N]), without the [N, V] log-softmax."""
    return x.gather(-1, tok).squeeze(-1) - x.logsumexp(-1)


def token_logprobs(scores: Tensor, tokens: Tensor, mask: Tensor, chunk_elements: int = CHUNK_ELEMENTS) -> Tensor:
    """float64 ``[B, T]`` log-probs of ``tokens`` under ``log_softmax(scores)`` (``[B, T, V]`` log-scores),
    0 off the mask; normalised a chunk of positions at a time."""
    _check_scores(scores, tokens, mask, "scores")
    out = torch.zeros(tokens.shape, dtype=torch.float64, device=scores.device)
    for b, t in _chunks(mask, scores.shape[-1], chunk_elements):
        out[b, t] = _token_logp(scores[b, t].double(), tokens[b, t].long().unsqueeze(-1))
    return out


def audit_terms(
    policy: Tensor,
    judge: Tensor,
    tokens: Tensor,
    mask: Tensor,
    stand_in: Tensor | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> AuditTerms:
    """The audit of one batch of sampled responses from ``[B, T, V]`` log-scores (logits or log-probs,
    any float dtype) of the policy, the judge and optionally the regime's stand-in, at the sampled
    ``tokens`` ``[B, T]`` where ``mask`` is set.

    Each chunk of ``chunk_elements // V`` positions is normalised with a float64 log-softmax and summed in
    float64 (:func:`kl_from_scores`); positions off the mask are not computed. A stand-in that *is* the judge (the
    same tensor: ``ref=full`` reads the judge's own copy) has the judge's terms, not computed twice.
    """
    _check_scores(policy, tokens, mask, "policy")
    _check_scores(judge, tokens, mask, "judge")
    if stand_in is not None:
        _check_scores(stand_in, tokens, mask, "stand-in")
    zeros = lambda: torch.zeros(tokens.shape, dtype=torch.float64, device=policy.device)  # noqa: E731
    given = stand_in is not None
    out = AuditTerms(zeros(), zeros(), zeros(), zeros() if given else None, zeros() if given else None)
    for b, t in _chunks(mask, policy.shape[-1], chunk_elements):
        tok = tokens[b, t].long().unsqueeze(-1)
        x, y = policy[b, t].double(), judge[b, t].double()
        out.logp[b, t], out.judge_logp[b, t] = _token_logp(x, tok), _token_logp(y, tok)
        lp = x.log_softmax(-1)
        p = lp.exp()
        out.kl[b, t] = _kl_from(x, y, lp, p)
        del y
        if given and stand_in is not judge:
            z = stand_in[b, t].double()
            out.stand_in_logp[b, t] = _token_logp(z, tok)
            out.stand_in_kl[b, t] = _kl_from(x, z, lp, p)
            del z
    if stand_in is judge:
        out.stand_in_kl, out.stand_in_logp = out.kl.clone(), out.judge_logp.clone()
    return out
