"""The audit's exact KL in float64, chunked: right at tiny KL (where fp32 is not), never negative, and the
same whatever the chunking."""

from __future__ import annotations

import math

import mpmath
import pytest
import torch

from ablate.eval.kl import audit_terms, exact_kl_per_token, kl_from_scores, token_logprobs


def _near_identical_logits(rows: int, vocab: int, gap: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 logits ``x`` (std 3) and ``y = x + gap * noise`` rounded to fp32: two distributions whose KL is tiny."""
    g = torch.Generator().manual_seed(seed)
    x = (3.0 * torch.randn(rows, vocab, generator=g, dtype=torch.float64)).float()
    y = (x.double() + gap * torch.randn(rows, vocab, generator=g, dtype=torch.float64)).float()
    return x, y


def _kl_40_digits(x: torch.Tensor, y: torch.Tensor) -> float:
    """KL(softmax x || softmax y) of one row, textbook formula, with 40 significant digits (mpmath)."""
    with mpmath.workdps(40):
        xs, ys = [mpmath.mpf(float(v)) for v in x], [mpmath.mpf(float(v)) for v in y]
        lx = mpmath.log(mpmath.fsum(mpmath.exp(v) for v in xs))
        ly = mpmath.log(mpmath.fsum(mpmath.exp(v) for v in ys))
        return float(mpmath.fsum(mpmath.exp(a - lx) * ((a - lx) - (b - ly)) for a, b in zip(xs, ys)))


def _old_fp32_kl(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """What the audit computed before: fp32 log-softmax of each side, then sum p (log p - log q) in float64."""
    lp, lq = torch.log_softmax(x.float(), -1).double(), torch.log_softmax(y.float(), -1).double()
    return (lp.exp() * (lp - lq)).sum(-1)


def test_tiny_kl_is_exact_in_float64_and_not_in_fp32() -> None:
    """Logits that differ by about 1e-7 (KL about 1e-15 nats): the audit agrees with a 40-digit computation
    to 1e-6 relative; the old fp32 path is off by orders of magnitude."""
    x, y = _near_identical_logits(2, 8192, 1e-7)
    truth = torch.tensor([_kl_40_digits(x[i], y[i]) for i in range(2)], dtype=torch.float64)
    assert (truth > 0).all() and (truth < 1e-13).all()
    new = kl_from_scores(x, y)
    assert torch.allclose(new, truth, rtol=1e-6, atol=0.0), (new, truth)
    old_err = ((_old_fp32_kl(x, y) - truth) / truth).abs()
    assert (old_err > 1.0).all(), old_err  # fp32 is not even of the right size here


def test_small_kl_of_a_realistic_size_is_exact_in_float64_and_not_in_fp32() -> None:
    """Logits that differ by about 1e-3 (KL about 1e-7 nats per token, as a response of 50 tokens with KL
    1e-5): fp32 is off by more than 1e-3 relative, float64 within 1e-9."""
    x, y = _near_identical_logits(2, 8192, 1e-3, seed=1)
    truth = torch.tensor([_kl_40_digits(x[i], y[i]) for i in range(2)], dtype=torch.float64)
    assert torch.allclose(kl_from_scores(x, y), truth, rtol=1e-9, atol=0.0)
    assert (((_old_fp32_kl(x, y) - truth) / truth).abs() > 1e-3).any()


def test_kl_is_never_negative_near_zero() -> None:
    x, y = _near_identical_logits(64, 4096, 1e-7, seed=2)
    assert (_old_fp32_kl(x, y) < 0).any()  # the old path goes negative here
    assert (kl_from_scores(x, y) >= 0).all()
    assert (kl_from_scores(x, x) == 0).all()  # identical rows: exactly 0


def test_logits_and_their_log_probs_give_the_same_kl() -> None:
    """Log-scores: a row shifted by a constant, or normalised, is the same distribution."""
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(5, 300, generator=g, dtype=torch.float64), torch.randn(5, 300, generator=g, dtype=torch.float64)
    ref = kl_from_scores(x, y)
    assert torch.allclose(kl_from_scores(x.log_softmax(-1), y + 7.0), ref, rtol=1e-12)
    textbook = (x.softmax(-1) * (x.log_softmax(-1) - y.log_softmax(-1))).sum(-1)
    assert torch.allclose(ref, textbook, rtol=1e-12)


@pytest.mark.parametrize(
    "x,y,expected",
    [
        ([0.0, 0.0, -1000.0], [0.0, 0.0, 0.0], math.log(1.5)),  # p underflows on the third token, q does not
        ([0.0, -math.inf], [0.0, 0.0], math.log(2.0)),  # q has mass where p is exactly 0
        ([0.0, 0.0], [0.0, -math.inf], math.inf),  # q is exactly 0 where p is not
        ([0.0, -math.inf], [0.0, -math.inf], 0.0),
        ([0.0, -2000.0], [-1000.0, 0.0], 1000.0),  # exp overflows: the log-sum-exp form
    ],
)
def test_edge_supports(x, y, expected) -> None:
    got = kl_from_scores(torch.tensor([x], dtype=torch.float64), torch.tensor([y], dtype=torch.float64)).item()
    assert got == pytest.approx(expected, rel=1e-12)


def test_audit_terms_are_chunk_independent_masked_and_float64() -> None:
    g = torch.Generator().manual_seed(4)
    B, T, V = 3, 6, 50
    pol, judge, stand_in = (torch.randn(B, T, V, generator=g) for _ in range(3))
    tokens = torch.randint(0, V, (B, T), generator=g)
    mask = torch.rand(B, T, generator=g) > 0.3
    one = audit_terms(pol, judge, tokens, mask, stand_in, chunk_elements=V)  # one position per chunk
    many = audit_terms(pol, judge, tokens, mask, stand_in)
    for name in ("kl", "logp", "judge_logp", "stand_in_kl", "stand_in_logp"):
        a, b = getattr(one, name), getattr(many, name)
        assert a.dtype == torch.float64 and torch.equal(a, b), name
        assert (a[~mask] == 0).all(), name
    lp = pol.double().log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(many.logp[mask], lp[mask], rtol=1e-14)
    assert torch.equal(many.judge_logp, token_logprobs(judge, tokens, mask))
    assert torch.equal(many.kl[mask], kl_from_scores(pol[mask], judge[mask]))
    assert torch.equal(many.stand_in_kl[mask], kl_from_scores(pol[mask], stand_in[mask]))
    assert torch.equal(many.stand_in_logp, token_logprobs(stand_in, tokens, mask))
    bare = audit_terms(pol, judge, tokens, mask)
    assert bare.stand_in_kl is None and bare.stand_in_logp is None
    # a stand-in that is the judge itself (ref=full reads the judge's copy) gives what a copy of it gives
    same, copy = audit_terms(pol, judge, tokens, mask, judge), audit_terms(pol, judge, tokens, mask, judge.clone())
    for name in ("stand_in_kl", "stand_in_logp"):
        assert torch.equal(getattr(same, name), getattr(copy, name)), name
    assert torch.equal(same.stand_in_kl, same.kl) and torch.equal(same.stand_in_logp, same.judge_logp)
    assert torch.equal(exact_kl_per_token(pol, judge)[mask], kl_from_scores(pol[mask], judge[mask]).float())
