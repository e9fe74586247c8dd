"""PPO arithmetic against hand-computed examples."""

import math

import pytest
import torch

from ablate.algos.kl_estimators import kl_penalty
from ablate.algos.ppo_math import gae, masked_whiten, policy_loss, token_rewards, value_loss


def test_gae_hand_computed():
    # one response of 3 tokens (then padding), gamma = 0.9, lambda = 0.5
    r = torch.tensor([[1.0, 0.0, 2.0, 0.0]])
    v = torch.tensor([[0.5, 1.0, 1.5, 9.0]])  # the padded position's value must not leak in
    m = torch.tensor([[1, 1, 1, 0]])
    adv, ret = gae(r, v, m, gamma=0.9, lam=0.5)
    d2 = 2.0 + 0.9 * 0.0 - 1.5  # 0.5
    d1 = 0.0 + 0.9 * 1.5 - 1.0  # 0.35
    d0 = 1.0 + 0.9 * 1.0 - 0.5  # 1.4
    a2 = d2
    a1 = d1 + 0.9 * 0.5 * a2
    a0 = d0 + 0.9 * 0.5 * a1
    assert torch.allclose(adv, torch.tensor([[a0, a1, a2, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[a0 + 0.5, a1 + 1.0, a2 + 1.5, 0.0]]))


def test_token_rewards_put_the_score_on_the_last_token():
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.0]])
    m = torch.tensor([[1, 1, 1], [1, 1, 0]])
    r = token_rewards(torch.tensor([1.0, -1.0]), kl, beta=0.5, mask=m)
    assert torch.allclose(r, torch.tensor([[-0.05, -0.1, -0.15 + 1.0], [-0.2, -0.25 - 1.0, 0.0]]))


def test_kl_penalties():
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    assert torch.allclose(kl_penalty(logp, ref, "k1"), torch.tensor([0.5, -1.0]))  # k1 can be negative
    l = ref - logp
    assert torch.allclose(kl_penalty(logp, ref, "k3"), torch.exp(l) - 1 - l)
    assert (kl_penalty(logp, ref, "k3") >= 0).all()
    assert torch.allclose(kl_penalty(logp, ref, "k2"), l.pow(2) / 2)
    with pytest.raises(ValueError):
        kl_penalty(logp, ref, "k4")


def test_policy_loss_clips_on_known_inputs():
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1]]))  # ratios 1.5, 0.5, 1.1
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    m = torch.ones(1, 3)
    loss, clipfrac = policy_loss(logp, old, adv, m, cliprange=0.2)
    # token 0: max(-1.5, -1.2) = -1.2 (clipped); token 1: max(0.5, 0.8) = 0.8 (clipped); token 2: max(-2.2, -2.2)
    assert math.isclose(loss.item(), (-1.2 + 0.8 - 2.2) / 3, rel_tol=1e-5)
    assert math.isclose(clipfrac.item(), 2 / 3, rel_tol=1e-5)


def test_value_loss_clips_on_known_inputs():
    old = torch.tensor([[0.0, 0.0]])
    v = torch.tensor([[1.0, 0.1]])
    ret = torch.tensor([[2.0, 0.0]])
    loss, frac = value_loss(v, old, ret, torch.ones(1, 2), cliprange_value=0.2)
    # token 0: max((1-2)^2, (0.2-2)^2) = 3.24; token 1: max(0.01, 0.01) = 0.01
    assert math.isclose(loss.item(), 0.5 * (3.24 + 0.01) / 2, rel_tol=1e-5)
    assert math.isclose(frac.item(), 0.5)


def test_whiten_ignores_masked_entries():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    m = torch.tensor([[1, 1, 1, 0]])
    w = masked_whiten(x, m)
    assert w[0, 3] == 0
    assert abs(w[0, :3].mean().item()) < 1e-6 and abs(w[0, :3].std(unbiased=False).item() - 1) < 1e-3
