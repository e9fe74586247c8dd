"""GRPO through TRL with the regime's reference: the regime is what TRL asks, and nothing else."""

from __future__ import annotations

import pytest
import torch

from ablate.algos.grpo import _RegimeRef, build_trainer
from ablate.models.loading import load_model
from ablate.refs.cached import CachedRefConfig, CachedReference
from ablate.refs.full import FullRefConfig, FullReference
from ablate.refs.none import NoneRefConfig, NoReference
from ablate.tasks.pairs import Pair
from ablate.tasks.reward import GoldReward
from tests.conftest import typed_config

PROMPTS = ["Write a review of Iron Summer.", "Continue: I watched it and", "Review the film Lucky Harbor.",
           "Continue: the plot was"]


def _cfg(tmp_path, *overrides):
    return typed_config(tmp_path, "model=tiny", "algo=grpo", "algo.max_steps=2", "algo.batch_size=4",
                        "algo.num_generations=2", "task.max_new_tokens=8", "algo.learning_rate=1e-3", *overrides)


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
    trainer = build_trainer(cfg, policy=load_model(tiny_source, torch.device("cpu")), tokenizer=tokenizer,
                            prompts=PROMPTS, reward=GoldReward(), reference=reference,
                            callbacks=[recorder] if recorder else [],
                            out_dir=tmp_path, device=torch.device("cpu"))
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


@pytest.mark.filterwarnings("ignore")
def test_grpo_cached_misses_follow_the_policy_and_log_the_hit_rate(tmp_path, tiny_source, tokenizer, ref_ctx,
                                                                   cache_root):
    ref_ctx.cache_root = str(cache_root)
    reference = CachedReference(CachedRefConfig(miss="skip"), ref_ctx)
    reference.prepare_from_pairs([Pair(PROMPTS[0], "A lovely film.", "Awful.", 0.5, -0.5)])
    _train(tmp_path, tiny_source, tokenizer, reference)
    extra = reference.cost().extra
    assert extra["misses"] == 2 * 4 and extra["hit_rate"] == 0.0 and extra["model_forwards"] == 0


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
    trainer = _train(tmp_path, tiny_source, tokenizer, reference, "algo.kl_control=adaptive", "algo.kl_target=1.0",
                     "algo.kl_horizon=10", "algo.max_steps=3", recorder=rec)
    coefs = [h["kl_coef"] for h in rec.logs if "kl" in h]  # the step logs (the last log is the run summary)
    assert len(coefs) == 3 and trainer.beta == coefs[-1]
    # KL far below target: beta shrinks by the clipped 2% per step
    assert coefs[0] == pytest.approx(0.04 * 0.98) and coefs[-1] < coefs[0]


@pytest.mark.filterwarnings("ignore")
def test_grpo_k1_estimator(tmp_path, tiny_source, tokenizer, ref_ctx):
    """k1 is added to TRL's loss by us: zero against an equal reference, and a different number from k3
    (which is >= 0 per token) against a reference that differs from the policy."""
    from ablate.refs.topk import TopKRefConfig, TopKReference

    rec = _recorder()
    _train(tmp_path / "a", tiny_source, tokenizer, FullReference(FullRefConfig(), ref_ctx), "algo.kl_estimator=k1",
           recorder=rec)
    kls = [h["kl"] for h in rec.logs if "kl" in h]
    assert len(kls) == 2 and kls[0] == pytest.approx(0.0, abs=1e-6)
    firsts = {}
    for est in ("k1", "k3"):
        rec = _recorder()
        _train(tmp_path / est, tiny_source, tokenizer, TopKReference(TopKRefConfig(k=5), ref_ctx),
               f"algo.kl_estimator={est}", recorder=rec)
        firsts[est] = next(h for h in rec.logs if "kl" in h)
    assert firsts["k3"]["kl"] > 0
    assert firsts["k1"]["kl"] != pytest.approx(firsts["k3"]["kl"], rel=1e-3)
    assert firsts["k1"]["loss"] != pytest.approx(firsts["k3"]["loss"], rel=1e-3)
