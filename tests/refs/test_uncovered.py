"""Rows a regime has no reference term for (all NaN) become exactly zero KL, with zero gradient."""

from __future__ import annotations

import torch

from ablate.algos.kl_estimators import kl_penalty
from ablate.refs.base import fill_uncovered, uncovered_rows

NAN = float("nan")


def _rows():
    policy = torch.tensor([[-1.0, -2.5, -0.3], [-4.0, -0.1, -7.0], [-2.0, -1.0, -3.0]], requires_grad=True)
    ref = torch.tensor([[-1.2, -2.0, 0.0], [NAN, NAN, NAN], [-2.0, NAN, -3.0]])
    return policy, ref


def test_only_all_nan_rows_are_uncovered():
    _, ref = _rows()
    assert uncovered_rows(ref).tolist() == [False, True, False]  # a partly NaN row is a fault, not a skip


def test_fill_uncovered_takes_the_policy_detached_and_leaves_other_rows():
    policy, ref = _rows()
    out = fill_uncovered(ref, policy)
    assert not out.requires_grad
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], policy[1].detach())
    assert torch.isnan(out[2, 1]) and torch.equal(out[2, [0, 2]], ref[2, [0, 2]])  # a fault still shows
    assert fill_uncovered(ref.double(), policy).dtype == torch.float64


def test_filled_rows_give_exactly_zero_kl_and_gradient():
    policy, ref = _rows()
    filled = fill_uncovered(ref, policy)
    for est in ("k1", "k3"):  # k1 enters rewards only (detached); k3 also enters losses
        assert torch.equal(kl_penalty(policy, filled, est)[1].detach(), torch.zeros(3)), est
    (grad,) = torch.autograd.grad(kl_penalty(policy[1], filled[1], "k3").sum(), policy)
    assert torch.equal(grad, torch.zeros_like(grad))
    # TRL's k3 form, times the importance ratio (use_bias_correction_kl), as GRPO computes it
    d = filled[1] - policy[1]
    trl_k3 = (torch.exp(d) - d - 1) * torch.exp(policy[1] - policy[1].detach())
    (grad,) = torch.autograd.grad(trl_k3.sum(), policy)
    assert torch.equal(trl_k3.detach(), torch.zeros(3)) and torch.equal(grad, torch.zeros_like(grad))
