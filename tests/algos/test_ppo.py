"""Our PPO on the tiny model: it calls the regime's reference, and it learns."""

from __future__ import annotations

import pytest
import torch

from ablate.algos.ppo import PPOTrainer
from ablate.inputs import prepare_from_pairs
from ablate.models.loading import load_model
from ablate.refs.cached import CachedRefConfig, CachedReference
from ablate.refs.full import FullRefConfig, FullReference
from ablate.refs.none import NoneRefConfig, NoReference
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
        "algo=ppo",
        "algo.max_steps=2",
        "algo.batch_size=4",
        "algo.minibatch_size=2",
        "task.max_new_tokens=8",
        "algo.learning_rate=1e-3",
        *overrides,
    )


def _trainer(tmp_path, tiny_source, tokenizer, reference, score_fn, *overrides):
    return PPOTrainer(
        _cfg(tmp_path, *overrides),
        policy=load_model(tiny_source, torch.device("cpu")),
        tokenizer=tokenizer,
        prompts=PROMPTS,
        score_fn=score_fn,
        reference=reference,
        callbacks=[],
        device=torch.device("cpu"),
    )


def _low_id_share(sb):
    """A reward the tiny random model can learn quickly: the share of response tokens in the lower half of
    the vocabulary (about 0.5 at random)."""
    ids, mask = sb.batch.input_ids[:, 1:], sb.batch.completion_mask[:, 1:].bool()
    return [((row[m] < 24576).float().mean().item()) for row, m in zip(ids, mask)]


def test_ppo_calls_the_regime_once_per_rollout(tmp_path, tiny_source, tokenizer, ref_ctx):
    reference = FullReference(FullRefConfig(), ref_ctx)
    trainer = _trainer(tmp_path, tiny_source, tokenizer, reference, _low_id_share)
    trainer.train()
    assert reference.cost().forward_calls == 2
    assert trainer.state.global_step == 2


def test_ppo_first_rollout_has_zero_kl_against_full(tmp_path, tiny_source, tokenizer, ref_ctx):
    trainer = _trainer(tmp_path, tiny_source, tokenizer, FullReference(FullRefConfig(), ref_ctx), _low_id_share)
    data = trainer.rollout(1)
    assert torch.allclose(data["kl_seq"], torch.zeros_like(data["kl_seq"]), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_ppo_cached_skip_gives_fresh_samples_no_kl_term(
    tmp_path, tiny_source, tokenizer, ref_ctx, cache_root, estimator
):
    """Skipped rows: no forwards, and exactly zero penalty and logged KL (not log pi, as a 0 log-prob reads)."""
    from transformers import TrainerCallback

    from ablate.tasks.pairs import Pair

    class Recorder(TrainerCallback):
        def __init__(self):
            self.logs = []

        def on_log(self, args, state, control, logs=None, **kw):
            self.logs.append(dict(logs or {}))

    ref_ctx.cache_root = str(cache_root)
    reference = CachedReference(CachedRefConfig(miss="skip", batch_size=1), ref_ctx)
    prepare_from_pairs(reference, tokenizer, [Pair(PROMPTS[0], "A lovely film.", "Awful.", 0.5, -0.5)])
    rec = Recorder()
    trainer = PPOTrainer(
        _cfg(tmp_path, f"algo.kl_estimator={estimator}"),
        policy=load_model(tiny_source, torch.device("cpu")),
        tokenizer=tokenizer,
        prompts=PROMPTS,
        score_fn=_low_id_share,
        reference=reference,
        callbacks=[rec],
        device=torch.device("cpu"),
    )
    data = trainer.rollout(1)
    assert torch.equal(data["kl_seq"], torch.zeros_like(data["kl_seq"]))
    trainer.train()
    assert [h["kl"] for h in rec.logs] == [0.0, 0.0]
    extra = reference.cost().extra
    assert extra["misses"] == 4 + 8 and extra["hits"] == 0 and extra["model_forwards"] == 0


def test_ppo_none_has_beta_zero(tmp_path, tiny_source, tokenizer, ref_ctx):
    reference = NoReference(NoneRefConfig(), ref_ctx)
    trainer = _trainer(tmp_path, tiny_source, tokenizer, reference, _low_id_share)
    trainer.train()
    assert trainer.beta == 0.0 and reference.cost().forward_calls == 0


def _direction_reward(good: torch.Tensor):
    """A reward the tiny random model can learn in a few steps: the share of response tokens whose (initial)
    embedding points along a fixed random direction (about 0.5 at random). It is linear in the output
    embeddings, so moving the final hidden state along that direction raises it."""

    def score(sb):
        ids, mask = sb.batch.input_ids[:, 1:], sb.batch.completion_mask[:, 1:].bool()
        return [good[row[m]].float().mean().item() for row, m in zip(ids, mask)]

    return score


@torch.no_grad()
def _expected_reward(model, batch, good) -> float:
    """The policy's exact expected per-token reward at the response positions of a fixed batch (sampled
    rewards of 8 x 6 tokens are too noisy to compare a few steps apart)."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
    mass = torch.softmax(logits.float(), -1)[..., good].sum(-1)
    m = batch.target_mask
    return float(mass[m].mean())


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_ppo_raises_the_training_reward(tmp_path, tiny_source, tokenizer, ref_ctx, estimator):
    # the value head's initialisation draws from the global RNG: seed it, as the pipeline does, so the result does
    # not depend on which tests ran before (unseeded, k1 once gained only 0.009)
    torch.manual_seed(0)
    reference = FullReference(FullRefConfig(), ref_ctx)
    emb = reference.model.get_input_embeddings().weight.detach()
    good = (emb @ torch.randn(emb.shape[1], generator=torch.Generator().manual_seed(0))) > 0
    trainer = _trainer(
        tmp_path,
        tiny_source,
        tokenizer,
        reference,
        _direction_reward(good),
        "algo.max_steps=10",
        "algo.batch_size=8",
        "algo.minibatch_size=4",
        "algo.learning_rate=3e-3",
        f"algo.kl_estimator={estimator}",
        "task.max_new_tokens=6",
    )
    batch = trainer.rollout(1)["batch"]
    before = _expected_reward(trainer.model, batch, good)
    trainer.train()
    after = _expected_reward(trainer.model, batch, good)
    # measured with the coupled sampler, value-head seeds 0/1/2: k1 0.502 -> 0.525/0.519/0.519, k3 0.525/0.519/0.518
    assert after > before + 0.015, (before, after)
