"""Where a KL estimator enters the objective decides what it does: exact expectations on a small policy."""

from __future__ import annotations

import itertools

import torch

from ablate.algos.kl_estimators import kl_penalty, reward_penalty, sequence_penalty

BETA = 0.3
V, T = 6, 2  # a categorical over 6 outcomes per token, sequences of 2 independent tokens: 36 outcomes


def _setup():
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(V, generator=g, dtype=torch.float64).requires_grad_(True)
    ref = torch.log_softmax(torch.randn(V, generator=g, dtype=torch.float64), -1)
    seqs = torch.tensor(list(itertools.product(range(V), repeat=T)))  # [36, T]
    return theta, ref, seqs


def _token_logps(theta, ref, seqs):
    logp = torch.log_softmax(theta, -1)[seqs]  # [36, T], differentiable in theta
    return logp, ref[seqs]


def _grad(x, theta):
    (g,) = torch.autograd.grad(x, theta)
    return g


def _exact_kl_gradient(theta, ref):
    """grad of -beta * KL(pi^T || ref^T) = -beta * T * KL(pi || ref): the gradient a KL penalty should give."""
    logp = torch.log_softmax(theta, -1)
    return _grad(-BETA * T * (logp.exp() * (logp - ref)).sum(), theta)


def test_k1_in_the_reward_has_the_gradient_of_minus_kl():
    theta, ref, seqs = _setup()
    logp, ref_lp = _token_logps(theta, ref, seqs)
    seq_logp = logp.sum(1)
    prob = seq_logp.exp().detach()  # exact expectation over outcomes, the sampling weights carry no gradient
    reward = reward_penalty(logp, ref_lp, torch.ones_like(logp), BETA, "k1")  # detached by construction
    assert not reward.requires_grad
    reinforce = _grad((prob * reward * seq_logp).sum(), theta)  # E[R(y) grad log pi(y)]
    expected = _exact_kl_gradient(theta, ref)
    assert expected.abs().max() > 1e-2
    assert torch.allclose(reinforce, expected, atol=1e-12, rtol=1e-10)


def test_k1_in_the_loss_has_zero_expected_gradient():
    theta, ref, seqs = _setup()
    logp, ref_lp = _token_logps(theta, ref, seqs)
    prob = logp.sum(1).exp().detach()
    loss = BETA * kl_penalty(logp, ref_lp, "k1").sum(1)  # the former GRPO k1: gradient through log pi
    in_loss = _grad((prob * loss).sum(), theta)
    assert in_loss.abs().max() < 1e-14  # E[grad log pi] = 0: no pull toward the reference at all
    assert _exact_kl_gradient(theta, ref).abs().max() > 1e-2


def test_sequence_penalty_sums_masked_tokens_and_is_detached():
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    k1 = sequence_penalty(logp, ref, mask, "k1")
    assert torch.equal(k1, torch.tensor([0.5 - 1.0, 0.5])) and not k1.requires_grad
    assert torch.equal(reward_penalty(logp, ref, mask, 0.1, "k1"), -0.1 * k1)
    k2 = sequence_penalty(logp, ref, mask, "k2")
    assert torch.equal(k2, torch.tensor([0.125 + 0.5, 0.125])) and not k2.requires_grad
