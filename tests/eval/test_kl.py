"""Tests for ablate.eval.kl."""

from __future__ import annotations

import math

import pytest
import torch

from ablate.eval.kl import (
    exact_kl_per_token,
    gather_token_logprobs,
    kl_estimators,
    logprob_errors,
    sequence_sum,
)


def _lp(*probs: float) -> torch.Tensor:
    """Log-probs of one distribution, shaped [1, 1, V]."""
    return torch.tensor(probs, dtype=torch.float64).log().view(1, 1, -1)


def test_exact_kl_hand_example() -> None:
    kl = exact_kl_per_token(_lp(0.5, 0.5), _lp(0.9, 0.1))
    expected = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert kl.shape == (1, 1)
    assert kl.item() == pytest.approx(expected, rel=1e-12)


def test_exact_kl_identical_is_zero() -> None:
    logits = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(0))
    lp = torch.log_softmax(logits, dim=-1)
    kl = exact_kl_per_token(lp, lp.clone())
    assert torch.equal(kl, torch.zeros(2, 3, dtype=lp.dtype))


def test_exact_kl_inf_when_ref_has_zero_on_support() -> None:
    kl = exact_kl_per_token(_lp(0.5, 0.5), _lp(1.0, 0.0))
    assert math.isinf(kl.item()) and kl.item() > 0


def test_exact_kl_zero_policy_mass_contributes_nothing() -> None:
    # p = [1, 0]; q = [0.5, 0.5] -> KL = ln 2; the p=0 entry adds nothing.
    kl = exact_kl_per_token(_lp(1.0, 0.0), _lp(0.5, 0.5))
    assert kl.item() == pytest.approx(math.log(2.0), rel=1e-12)
    # p = 0 and q = 0 on the same entry must not produce NaN.
    kl = exact_kl_per_token(_lp(0.25, 0.75, 0.0), _lp(0.5, 0.5, 0.0))
    expected = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)
    assert kl.item() == pytest.approx(expected, rel=1e-12)


def test_exact_kl_shape_mismatch_raises() -> None:
    with pytest.raises(ValueError):
        exact_kl_per_token(_lp(0.5, 0.5), _lp(0.2, 0.3, 0.5))


def test_estimator_formulas() -> None:
    logp = torch.tensor([[math.log(0.5), math.log(0.2)]], dtype=torch.float64)
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]], dtype=torch.float64)
    est = kl_estimators(logp, ref)
    l = torch.log(torch.tensor([[0.5, 2.5]], dtype=torch.float64))  # q/p
    torch.testing.assert_close(est["k1"], -l)
    torch.testing.assert_close(est["k2"], l**2 / 2)
    torch.testing.assert_close(est["k3"], torch.tensor([[0.5, 2.5]], dtype=torch.float64) - 1 - l)


P = [0.5, 0.3, 0.2]
Q = [0.2, 0.3, 0.5]


def test_k1_k3_expectations_equal_exact_kl() -> None:
    """Under p, E[k1] and E[k3] equal KL(p||q) exactly (finite sum)."""
    p = torch.tensor(P, dtype=torch.float64)
    est = kl_estimators(p.log().view(1, -1), torch.tensor(Q, dtype=torch.float64).log().view(1, -1))
    kl = exact_kl_per_token(_lp(*P), _lp(*Q)).item()
    assert (p * est["k1"][0]).sum().item() == pytest.approx(kl, rel=1e-12)
    assert (p * est["k3"][0]).sum().item() == pytest.approx(kl, rel=1e-12)


def test_k1_k3_monte_carlo_approach_exact_kl() -> None:
    p = torch.tensor(P, dtype=torch.float64)
    q = torch.tensor(Q, dtype=torch.float64)
    n = 200_000
    idx = torch.multinomial(p, n, replacement=True, generator=torch.Generator().manual_seed(1234))
    logp = p.log()[idx].view(1, n)
    ref = q.log()[idx].view(1, n)
    est = kl_estimators(logp, ref)
    kl = exact_kl_per_token(_lp(*P), _lp(*Q)).item()
    for key in ("k1", "k3"):
        x = est[key]
        se = x.std().item() / math.sqrt(n)
        assert abs(x.mean().item() - kl) < 4 * se, key
    assert bool((est["k3"] >= 0).all())
    assert bool((est["k2"] >= 0).all())
    assert bool((est["k1"] < 0).any())  # token 2: p=0.2 < q=0.5


def test_k3_nonnegative_on_random_inputs() -> None:
    g = torch.Generator().manual_seed(7)
    logp = -torch.rand(64, 32, generator=g, dtype=torch.float64) * 10
    ref = -torch.rand(64, 32, generator=g, dtype=torch.float64) * 10
    assert bool((kl_estimators(logp, ref)["k3"] >= 0).all())


def test_sequence_sum_ignores_masked_nan_inf() -> None:
    per_token = torch.tensor([[1.0, 2.0, float("nan")], [float("inf"), 3.0, -float("inf")]])
    mask = torch.tensor([[1, 1, 0], [0, 1, 0]], dtype=torch.float32)
    out = sequence_sum(per_token, mask)
    torch.testing.assert_close(out, torch.tensor([3.0, 3.0]))
    out_bool = sequence_sum(per_token, mask.bool())
    torch.testing.assert_close(out_bool, torch.tensor([3.0, 3.0]))


def test_sequence_sum_keeps_unmasked_inf() -> None:
    out = sequence_sum(torch.tensor([[1.0, float("inf")]]), torch.ones(1, 2))
    assert math.isinf(out.item())


def test_logprob_errors_known_numbers() -> None:
    approx = torch.tensor([[-1.0, -2.5, 99.0], [-0.5, -3.0, 0.0]])
    truth = torch.tensor([[-1.5, -2.0, 0.0], [-0.5, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    out = logprob_errors(approx, truth, mask)
    # errors: 0.5, -0.5, 0.0, -2.0
    assert out["logp_mae"] == pytest.approx(3.0 / 4.0)
    assert out["logp_rmse"] == pytest.approx(math.sqrt((0.25 + 0.25 + 0.0 + 4.0) / 4.0))
    assert out["logp_max_err"] == pytest.approx(2.0)


def test_logprob_errors_empty_mask_is_nan() -> None:
    out = logprob_errors(torch.zeros(2, 2), torch.ones(2, 2), torch.zeros(2, 2))
    assert all(math.isnan(v) for v in out.values())
    assert set(out) == {"logp_mae", "logp_rmse", "logp_max_err"}


def test_gather_token_logprobs() -> None:
    lp = torch.arange(2 * 3 * 4, dtype=torch.float32).view(2, 3, 4)
    tokens = torch.tensor([[0, 3, 1], [2, 2, 0]])
    out = gather_token_logprobs(lp, tokens)
    expected = torch.tensor([[0.0, 7.0, 9.0], [14.0, 18.0, 20.0]])
    torch.testing.assert_close(out, expected)


def test_finite_scores_take_the_unmasked_path_bit_for_bit() -> None:
    """Scores that are all finite (logits) skip the masks for tokens without mass: every KL is the masked path's to
    the last bit, over rows from identical (the series near 0) to far apart (the large-exponent terms)."""
    from ablate.eval.kl import _kl_masked, kl_from_scores

    g = torch.Generator().manual_seed(0)
    x = (
        torch.randn(64, 4096, generator=g, dtype=torch.float64)
        * torch.logspace(-3, 1.5, 64, dtype=torch.float64)[:, None]
    )
    y = (
        x
        + torch.randn(64, 4096, generator=g, dtype=torch.float64)
        * torch.logspace(-9, 2.5, 64, dtype=torch.float64)[:, None]
    )
    y[0] = x[0]  # identical rows: exactly 0
    lp = x.log_softmax(-1)
    fast, masked = kl_from_scores(x, y), _kl_masked(x, y, lp, lp.exp())
    assert torch.equal(fast, masked) and fast[0] == 0
    assert fast.min() >= 0 and fast.max() > 700 and fast[1] < 1e-12  # both ends were reached
    y[3, 5] = -math.inf  # a token the second gives no mass: the masked path, as before
    assert math.isinf(kl_from_scores(x, y)[3]) and torch.equal(kl_from_scores(x, y)[4:], fast[4:])


def test_the_audit_computes_the_policys_softmax_once_and_each_kl_as_alone() -> None:
    from ablate.eval.kl import audit_terms, kl_from_scores

    g = torch.Generator().manual_seed(2)
    pol = torch.randn(3, 20, 500, generator=g) * 3
    judge, stand_in = pol + 0.2 * torch.randn(pol.shape, generator=g), pol + torch.randn(pol.shape, generator=g)
    tokens, mask = torch.randint(0, 500, (3, 20), generator=g), torch.rand(3, 20, generator=g) > 0.3
    terms = audit_terms(pol, judge, tokens, mask, stand_in, chunk_elements=500 * 7)
    assert torch.equal(terms.kl[mask], kl_from_scores(pol[mask], judge[mask]))
    assert torch.equal(terms.stand_in_kl[mask], kl_from_scores(pol[mask], stand_in[mask]))
    assert not terms.kl[~mask].any() and (terms.stand_in_kl[mask] > terms.kl[mask]).all()
