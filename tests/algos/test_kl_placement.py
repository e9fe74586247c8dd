"""Where the KL penalty goes (algo.kl_placement) with which estimator (algo.kl_estimator): the expected gradient of
each combination, computed exactly on a small categorical policy, against the exact gradient of KL(pi || ref); the
config's defaults and its explicit zero-gradient ablation; GRPO and PPO training with the penalty in the loss."""

from __future__ import annotations

import logging

import pytest
import torch

from ablate.algos.kl_estimators import (
    ZERO_GRADIENT_WARNING,
    covered_loss_penalty,
    kl_penalty,
    loss_penalty,
    reward_penalty,
    zero_gradient_warning,
)
from ablate.errors import ConfigError
from tests.conftest import run_cli, typed_config

V, BETA = 5, 0.3  # pi = softmax(theta) over 5 tokens, a fixed reference


def _policy():
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(V, generator=g, dtype=torch.float64).requires_grad_(True)
    ref = torch.log_softmax(torch.randn(V, generator=g, dtype=torch.float64), -1)
    return theta, ref


def _grad(x, theta):
    (g,) = torch.autograd.grad(x, theta)
    return g


def _exact(theta, ref, reverse: bool = True):
    """grad of beta * KL(pi || ref) (``reverse``), or of beta * KL(ref || pi), the forward KL."""
    logp = torch.log_softmax(theta, -1)
    kl = (logp.exp() * (logp - ref)).sum() if reverse else (ref.exp() * (ref - logp)).sum()
    return _grad(BETA * kl, theta)


def _expected_gradient(theta, ref, placement: str, estimator: str):
    """E_{x ~ pi}[gradient of what training minimises], summed exactly over the 5 outcomes (the sampling weights pi(x)
    carry no gradient). ``reward``: the score-function gradient of the detached penalty, E[beta k(x) grad log pi(x)];
    ``loss``: E[grad beta k(x)] through log pi (k3 as TRL's, times the importance ratio)."""
    logp = torch.log_softmax(theta, -1)
    prob = logp.exp().detach()
    if placement == "reward":
        penalty = -reward_penalty(logp.view(V, 1), ref.view(V, 1), torch.ones(V, 1), BETA, estimator)  # beta * k(x)
        assert not penalty.requires_grad
        return _grad((prob * penalty * logp).sum(), theta)
    return _grad((prob * BETA * loss_penalty(logp, ref, estimator)).sum(), theta)


def _rel_err(g, exact) -> float:
    return float((g - exact).norm() / exact.norm())


# what each combination's expected gradient is, relative to the exact one (0: exact; 1 with k1 in the loss: it is 0).
# The biased ones are reported as measured on this policy (seed 0), not hidden: k2 and k3 in the reward weigh the
# score function by values that are not log pi - log ref.
EXPECTED = {
    ("reward", "k1"): 0.0,
    ("reward", "k2"): 0.464,
    ("reward", "k3"): 1.09,
    ("loss", "k1"): 1.0,
    ("loss", "k2"): 0.0,
    ("loss", "k3"): 0.0,
}


@pytest.mark.parametrize("placement,estimator", list(EXPECTED), ids=[f"{p}-{e}" for p, e in EXPECTED])
def test_expected_gradient_of_each_placement_against_the_exact_kl_gradient(placement, estimator):
    theta, ref = _policy()
    exact = _exact(theta, ref)
    assert exact.norm() > 0.1
    g = _expected_gradient(theta, ref, placement, estimator)
    if (placement, estimator) == ("loss", "k1"):
        assert g.abs().max() < 1e-15  # E[grad log pi] = 0: the zero-gradient ablation
    elif EXPECTED[placement, estimator] == 0.0:
        assert torch.allclose(g, exact, rtol=1e-12, atol=1e-15)
    else:
        assert _rel_err(g, exact) == pytest.approx(EXPECTED[placement, estimator], abs=5e-3)


def test_plain_k3_in_the_loss_follows_the_forward_kl_and_trls_ratio_makes_it_k2():
    """The known bias of k3 differentiated in the loss: E[(1 - ref/pi) grad log pi] = grad KL(ref || pi). TRL's term
    (k3 times the importance ratio, use_bias_correction_kl) has per sample exactly k2's gradient, hence the exact one."""
    theta, ref = _policy()
    logp = torch.log_softmax(theta, -1)
    prob = logp.exp().detach()
    plain = _grad((prob * BETA * kl_penalty(logp, ref, "k3")).sum(), theta)
    assert torch.allclose(plain, _exact(theta, ref, reverse=False), rtol=1e-12, atol=1e-15)
    assert _rel_err(plain, _exact(theta, ref)) == pytest.approx(0.679, abs=5e-3)  # reported: what the ratio corrects
    for x in range(V):  # per sample, not only in expectation
        trl, k2 = (_grad(loss_penalty(torch.log_softmax(theta, -1)[x], ref[x], e), theta) for e in ("k3", "k2"))
        assert torch.allclose(trl, k2, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_a_row_without_a_reference_term_adds_nothing_to_the_loss_nor_its_gradient(estimator):
    """k1 against the policy's own detached log-probs would be 0 in value but grad log pi in gradient: masked."""
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0], [float("nan"), float("nan")]])
    term = covered_loss_penalty(logp, ref, estimator)
    assert torch.equal(term[1].detach(), torch.zeros(2))
    assert torch.equal(term[0], loss_penalty(logp, ref, estimator)[0])
    (grad,) = torch.autograd.grad(term.sum(), logp)
    assert torch.equal(grad[1], torch.zeros(2)) and (grad[0] != 0).all()


# ------------------------------------------------------------------------------------------------ the config
@pytest.mark.parametrize(
    "algo,overrides,placement",
    [
        ("grpo", [], "loss"),  # k3: TRL's own term
        ("ppo", [], "reward"),  # k1
        ("grpo", ["algo.kl_estimator=k1"], "reward"),  # k1 never goes to the loss by default
        ("grpo", ["algo.kl_estimator=k2"], "loss"),
        ("ppo", ["algo.kl_estimator=k3"], "reward"),
        ("ppo", ["algo.kl_estimator=k2", "algo.kl_placement=loss"], "loss"),
    ],
)
def test_the_default_placement_and_no_ablation_unless_asked(tmp_path, algo, overrides, placement):
    cfg = typed_config(tmp_path, "model=tiny", f"algo={algo}", *overrides).algo
    assert cfg.placement() == placement
    assert cfg.summary_fields() == {"kl_zero_gradient_ablation": False}
    assert zero_gradient_warning(cfg.kl_estimator, cfg.placement()) is None


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_k1_in_the_loss_is_an_explicit_ablation_that_says_so(tmp_path, algo):
    cfg = typed_config(tmp_path, "model=tiny", f"algo={algo}", "algo.kl_placement=loss", "algo.kl_estimator=k1").algo
    assert cfg.placement() == "loss" and cfg.zero_gradient_ablation()
    assert cfg.summary_fields() == {"kl_zero_gradient_ablation": True}
    assert zero_gradient_warning("k1", "loss") == ZERO_GRADIENT_WARNING and "\n" not in ZERO_GRADIENT_WARNING
    assert typed_config(tmp_path, "model=tiny").algo.summary_fields() == {}  # DPO has no KL estimator


def test_an_unknown_placement_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="^algo.kl_placement must be one of reward, loss, got 'both'$"):
        typed_config(tmp_path, "model=tiny", "algo=ppo", "algo.kl_placement=both")


# ---------------------------------------------------------------------------------------------- training
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_grpo_k2_and_k1_in_the_loss(tmp_path, tiny_source, tokenizer, ref_ctx, cache_root, caplog):
    """Same samples and gold rewards as a run without reference. k2 in the loss (a reference that differs from the
    policy): TRL's loss plus beta times the token mean of k2, which is the logged kl, and no reward penalty. k1 in the
    loss with every row uncovered (ref=cached, miss=skip): exactly the run without reference (loss and gradient),
    after the one-line warning (logged by grpo.build_trainer, which the runs go through)."""
    from ablate.inputs import prepare_from_pairs
    from ablate.refs.cached import CachedRefConfig, CachedReference
    from ablate.refs.none import NoneRefConfig, NoReference
    from ablate.refs.topk import TopKRefConfig, TopKReference
    from ablate.tasks.pairs import Pair
    from tests.algos.test_grpo import PROMPTS, _recorder, _step_logs, _train

    ref_ctx.cache_root = str(cache_root)
    cached = CachedReference(CachedRefConfig(miss="skip", batch_size=1), ref_ctx)
    prepare_from_pairs(cached, tokenizer, [Pair(PROMPTS[0], "A lovely film.", "Awful.", 0.5, -0.5)])
    runs = {
        "none": (NoReference(NoneRefConfig(), ref_ctx), []),
        "k2": (TopKReference(TopKRefConfig(k=5, keep_sampled=False), ref_ctx), ["algo.kl_estimator=k2"]),
        "k1": (cached, ["algo.kl_estimator=k1", "algo.kl_placement=loss"]),
    }
    logs = {}
    for name, (reference, overrides) in runs.items():
        rec = _recorder()
        with caplog.at_level(logging.WARNING, logger="ablate.algos.grpo"):
            caplog.clear()
            _train(tmp_path / name, tiny_source, tokenizer, reference, "algo.max_steps=1", *overrides, recorder=rec)
        warned = [r.getMessage() for r in caplog.records if r.name == "ablate.algos.grpo"]
        assert warned == ([ZERO_GRADIENT_WARNING] if name == "k1" else []), name
        (logs[name],) = _step_logs(rec)
    none, k2, k1 = logs["none"], logs["k2"], logs["k1"]
    assert k2["kl"] > 0 and not any(k.startswith("rewards/kl_penalty") for k in k2)
    assert k2["rewards/gold/mean"] == none["rewards/gold/mean"]
    assert k2["loss"] == pytest.approx(none["loss"] + 0.04 * k2["kl"], rel=1e-4, abs=1e-7)
    assert k1["kl"] == 0.0 and (k1["loss"], k1["grad_norm"]) == (none["loss"], none["grad_norm"])


@pytest.mark.filterwarnings("ignore")
def test_ppo_k2_in_the_loss(tmp_path, tiny_source, tokenizer, ref_ctx):
    """The rollout's rewards carry no KL (the same advantages as without a reference), and each minibatch's loss adds
    beta times the token mean of k2, differentiated."""
    from ablate.refs.none import NoneRefConfig, NoReference
    from ablate.refs.topk import TopKRefConfig, TopKReference
    from tests.algos.test_ppo import _low_id_share, _trainer

    data, trainers = {}, {}
    for name, reference in (
        ("none", NoReference(NoneRefConfig(), ref_ctx)),
        ("k2", TopKReference(TopKRefConfig(k=5, keep_sampled=False), ref_ctx)),
    ):
        torch.manual_seed(0)  # the value head's initialisation
        t = _trainer(
            tmp_path / name, tiny_source, tokenizer, reference, _low_id_share,
            "algo.kl_estimator=k2", "algo.kl_placement=loss", "algo.max_steps=1",
        )  # fmt: skip
        trainers[name], data[name] = t, t.rollout(1)
    assert torch.equal(data["k2"]["adv"], data["none"]["adv"])  # no penalty in the reward
    assert (data["k2"]["kl_seq"] > 0).all()  # measured at rollout: the k2 values summed over each response
    stats = trainers["k2"].optimise(data["k2"])
    beta = trainers["k2"].beta
    assert stats["kl_loss"] > 0
    assert stats["loss"] == pytest.approx(stats["pg_loss"] + 0.1 * stats["vf_loss"] + beta * stats["kl_loss"])
    assert "kl_loss" not in trainers["none"].optimise(data["none"])  # beta = 0: no term


# ---------------------------------------------------------------------------------------------------- a run
@pytest.mark.slow
def test_a_run_with_k1_in_the_loss_says_so_at_start_and_in_its_summary(tmp_path):
    """The one-line warning before training, and ``kl_zero_gradient_ablation`` in summary.json."""
    import json

    run_dir = tmp_path / "run"
    res = run_cli(
        "model=tiny", "algo=ppo", "algo.kl_placement=loss", "algo.kl_estimator=k1", "algo.max_steps=1",
        "algo.batch_size=2", "algo.minibatch_size=2", "task.n_train=4", "task.max_new_tokens=8", "eval.n_prompts=2",
        "eval.samples_per_prompt=1", "eval.interval=0", "eval.fidelity=false", "logger=none",
        f"hydra.run.dir={run_dir}", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    warned = [line for line in (res.stdout + res.stderr).splitlines() if ZERO_GRADIENT_WARNING in line]
    assert len(warned) == 1 and warned[0].endswith(ZERO_GRADIENT_WARNING) and "[WARNING]" in warned[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["kl_zero_gradient_ablation"] is True
