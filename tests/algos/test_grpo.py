"""GRPO through TRL with the regime's reference: the regime is what TRL asks, and nothing else."""

from __future__ import annotations

import pytest
import torch

from ablate.algos.grpo import _RegimeRef, build_trainer
from ablate.inputs import prepare_from_pairs
from ablate.models.loading import load_model
from ablate.refs.cached import CachedRefConfig, CachedReference
from ablate.refs.full import FullRefConfig, FullReference
from ablate.refs.none import NoneRefConfig, NoReference
from ablate.tasks.pairs import Pair
from ablate.tasks.reward import GoldReward
from tests.conftest import typed_config

PROMPTS = [
    "Write a review of Iron Summer.",
    "Continue: I watched it and",
    "Review the film Lucky Harbor.",
    "Continue: the plot was",
]


def _cfg(tmp_path, *overrides):
    return typed_config(
        tmp_path,
        "model=tiny",
        "algo=grpo",
        "algo.max_steps=2",
        "algo.batch_size=4",
        "algo.num_generations=2",
        "task.max_new_tokens=8",
        "algo.learning_rate=1e-3",
        *overrides,
    )


def _recorder():
    from transformers import TrainerCallback

    class Recorder(TrainerCallback):
        logs: list = []

        def on_log(self, args, state, control, logs=None, **kw):
            self.logs.append(dict(logs or {}))

    r = Recorder()
    r.logs = []
    return r


def _train(tmp_path, tiny_source, tokenizer, reference, *overrides, recorder=None):
    cfg = _cfg(tmp_path, *overrides)
    trainer = build_trainer(
        cfg,
        policy=load_model(tiny_source, torch.device("cpu")),
        tokenizer=tokenizer,
        prompts=PROMPTS,
        reward=GoldReward(),
        reference=reference,
        callbacks=[recorder] if recorder else [],
        out_dir=tmp_path,
        device=torch.device("cpu"),
    )
    trainer.train()
    return trainer


@pytest.mark.filterwarnings("ignore")
def test_grpo_asks_the_regime_for_reference_logprobs(tmp_path, tiny_source, tokenizer, ref_ctx):
    reference = FullReference(FullRefConfig(), ref_ctx)
    trainer = _train(tmp_path, tiny_source, tokenizer, reference)
    assert isinstance(trainer.ref_model, _RegimeRef)  # TRL loaded no reference of its own
    assert reference.cost().forward_calls == 2  # one generation batch per step
    kls = [h["kl"] for h in trainer.state.log_history if "kl" in h]
    assert kls[0] == pytest.approx(0.0, abs=1e-6)  # first batch: policy == reference


def _step_logs(rec) -> list[dict]:
    return [h for h in rec.logs if "loss" in h and "train_loss" not in h]  # not the final run summary


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_grpo_cached_skip_rows_have_no_kl_term(tmp_path, tiny_source, tokenizer, ref_ctx, cache_root):
    """Every fresh sample misses: TRL's k3 term (or the k1 reward penalty) is exactly 0 with zero gradient, so
    loss and gradient norm equal a run without any reference (beta = 0), and the logged kl is exactly 0."""
    ref_ctx.cache_root = str(cache_root)
    runs = {}
    for name in ("none", "k3", "k1"):
        if name == "none":
            reference = NoReference(NoneRefConfig(), ref_ctx)
        else:
            reference = CachedReference(CachedRefConfig(miss="skip", batch_size=1), ref_ctx)
            prepare_from_pairs(reference, tokenizer, [Pair(PROMPTS[0], "A lovely film.", "Awful.", 0.5, -0.5)])
        rec = _recorder()
        _train(
            tmp_path / name,
            tiny_source,
            tokenizer,
            reference,
            "algo.max_steps=1",
            f"algo.kl_estimator={'k3' if name == 'none' else name}",
            recorder=rec,
        )
        runs[name] = (_step_logs(rec), reference)
    base, _ = runs.pop("none")
    for name, (logs, reference) in runs.items():
        assert [h["kl"] for h in logs] == [0.0], name  # was 48,311 per token (k3) when a miss read as log-prob 0
        assert [(h["loss"], h["grad_norm"]) for h in logs] == [(h["loss"], h["grad_norm"]) for h in base], name
        extra = reference.cost().extra
        assert extra["misses"] == 4 and extra["hit_rate"] == 0.0 and extra["model_forwards"] == 0
    assert [h["rewards/kl_penalty/mean"] for h in runs["k1"][0]] == [0.0]


@pytest.mark.filterwarnings("ignore")
def test_grpo_without_reference_has_beta_zero_and_no_calls(tmp_path, tiny_source, tokenizer, ref_ctx):
    reference = NoReference(NoneRefConfig(), ref_ctx)
    trainer = _train(tmp_path, tiny_source, tokenizer, reference)
    assert trainer.beta == 0.0 and trainer.ref_model is None
    assert reference.cost().forward_calls == 0


@pytest.mark.filterwarnings("ignore")
def test_grpo_adaptive_kl_moves_beta(tmp_path, tiny_source, tokenizer, ref_ctx):
    reference = FullReference(FullRefConfig(), ref_ctx)
    rec = _recorder()
    trainer = _train(
        tmp_path,
        tiny_source,
        tokenizer,
        reference,
        "algo.kl_control=adaptive",
        "algo.kl_target=1.0",
        "algo.kl_horizon=10",
        "algo.max_steps=3",
        recorder=rec,
    )
    coefs = [h["kl_coef"] for h in rec.logs if "kl" in h]  # the step logs (the last log is the run summary)
    assert len(coefs) == 3 and trainer.beta == coefs[-1]
    # KL far below target: beta shrinks by the clipped 2% per step
    assert coefs[0] == pytest.approx(0.04 * 0.98) and coefs[-1] < coefs[0]


@pytest.mark.filterwarnings("ignore")
def test_grpo_k1_is_zero_against_an_equal_reference(tmp_path, tiny_source, tokenizer, ref_ctx):
    rec = _recorder()
    _train(
        tmp_path, tiny_source, tokenizer, FullReference(FullRefConfig(), ref_ctx), "algo.kl_estimator=k1", recorder=rec
    )
    logs = _step_logs(rec)
    assert len(logs) == 2 and logs[0]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert logs[0]["rewards/kl_penalty/mean"] == pytest.approx(0.0, abs=1e-5)


@pytest.mark.filterwarnings("ignore")
def test_grpo_k1_enters_the_reward_before_group_normalisation(tmp_path, tiny_source, tokenizer, ref_ctx):
    """Against a reference that differs from the policy: the same samples and gold rewards as a k3 run, but
    each completion's reward is lowered by beta * its summed k1 before TRL normalises per group."""
    from ablate.refs.topk import TopKRefConfig, TopKReference

    runs = {}
    for est in ("k1", "k3"):
        rec = _recorder()
        trainer = _train(
            tmp_path / est,
            tiny_source,
            tokenizer,
            TopKReference(TopKRefConfig(k=5, keep_sampled=False), ref_ctx),
            f"algo.kl_estimator={est}",
            "algo.max_steps=1",
            recorder=rec,
        )
        runs[est] = (_step_logs(rec)[0], trainer._logs)
    (k1, k1_logs), (k3, k3_logs) = runs["k1"], runs["k3"]
    gold = torch.tensor(list(k1_logs["rewards"]["gold"]))
    assert torch.equal(gold, torch.tensor(list(k3_logs["rewards"]["gold"])))  # same samples, raw rewards logged
    penalty = torch.tensor(list(k1_logs["rewards"]["kl_penalty"]))  # -beta * sum_t k1 per completion
    assert (penalty != 0).all()
    tokens = k1["completions/mean_length"] * len(penalty)
    assert float(penalty.sum()) == pytest.approx(-0.04 * k1["kl"] * tokens, rel=1e-4)  # kl: mean k1 per token
    groups = (gold + penalty).view(-1, 2)  # num_generations = 2
    expected = (groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)
    advantages = torch.tensor(list(k1_logs["advantages"]))
    assert torch.allclose(advantages, expected.flatten(), atol=1e-4)
    assert not torch.allclose(advantages, torch.tensor(list(k3_logs["advantages"])), atol=1e-2)
    assert k3["kl"] > 0 and k1["kl"] != pytest.approx(k3["kl"], rel=1e-3)
    assert "rewards/kl_penalty/mean" not in k3  # k3 stays TRL's term in the loss


@pytest.mark.filterwarnings("ignore")
def test_grpo_k1_penalty_is_one_more_reward_of_weight_one(tmp_path, tiny_source, tokenizer, ref_ctx):
    """With a learned (proxy) reward the gold one is logged at weight 0; k1's penalty joins at weight 1."""
    reference = FullReference(FullRefConfig(), ref_ctx)
    names = {}
    for est in ("k1", "k3"):
        trainer = build_trainer(
            _cfg(tmp_path / est, f"algo.kl_estimator={est}"),
            policy=load_model(tiny_source, torch.device("cpu")),
            tokenizer=tokenizer,
            prompts=PROMPTS,
            reward=GoldReward(),
            reference=reference,
            callbacks=[],
            out_dir=tmp_path / est,
            device=torch.device("cpu"),
            proxy=lambda texts, prompts: [0.0] * len(texts),
        )
        names[est] = dict(zip(trainer.reward_func_names, trainer.reward_weights.tolist()))
    assert names["k1"] == {"proxy_rm": 1.0, "gold": 0.0, "kl_penalty": 1.0}
    assert names["k3"] == {"proxy_rm": 1.0, "gold": 0.0}


def test_the_prompt_order_of_each_epoch_depends_on_seed_and_epoch_only():
    """An uninterrupted run draws the orders TRL's sampler draws; a sampler made afresh (a resumed job) and set to
    epoch e draws epoch e's order, not epoch 0's again."""
    from trl.trainer.utils import RepeatSampler

    from ablate.algos.grpo import replayable_epochs

    def sampler():
        return RepeatSampler(range(7), mini_repeat_count=2, batch_size=1, seed=3)

    stock, ours = sampler(), replayable_epochs(sampler())
    orders = [list(stock) for _ in range(3)]
    assert len({tuple(o) for o in orders}) == 3  # the orders differ from epoch to epoch
    for epoch, order in enumerate(orders):
        ours.set_epoch(epoch)
        assert list(ours) == order
    resumed = replayable_epochs(sampler())
    resumed.set_epoch(2)
    assert list(resumed) == orders[2]
    unshuffled = RepeatSampler(range(7), mini_repeat_count=2, shuffle=False)
    assert replayable_epochs(unshuffled) is unshuffled and not hasattr(unshuffled, "set_epoch")


def test_the_prompt_order_follows_the_data_seed_not_the_seed():
    """A placebo moves only ``data_seed``: its sampler draws the orders of one seeded with it, every epoch and after a
    resume; where the two seeds agree (every other run) nothing moves."""
    from trl.trainer.utils import RepeatSampler

    from ablate.algos.grpo import replayable_epochs

    def orders(s, epochs=3):
        out = []
        for epoch in range(epochs):
            s.set_epoch(epoch)
            out.append(list(s))
        return out

    def sampler(seed):
        return RepeatSampler(range(9), mini_repeat_count=2, batch_size=1, seed=seed)

    own = orders(replayable_epochs(sampler(4)))
    assert orders(replayable_epochs(sampler(3), data_seed=4)) == own
    assert orders(replayable_epochs(sampler(3), data_seed=3)) != own
    assert orders(replayable_epochs(sampler(3), data_seed=3)) == orders(replayable_epochs(sampler(3)))
    resumed = replayable_epochs(sampler(3), data_seed=4)
    resumed.set_epoch(2)
    assert list(resumed) == own[2]
