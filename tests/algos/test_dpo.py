"""DPO through TRL: the regime hook changes nothing but where reference log-probs come from."""

from __future__ import annotations

import math

import pytest
import torch

from ablate.algos.dpo import _dpo_trainer_cls
from ablate.tasks.pairs import pairs_dataset
from ablate.models.loading import load_model
from ablate.refs.full import FullRefConfig, FullReference
from ablate.tasks.pairs import Pair

PAIRS = [
    Pair("Review the film Lucky Harbor.", "A wonderful, joyful film.", "A dull and awful mess.", 0.8, -0.7),
    Pair("Continue: I watched it and", "loved every minute of it.", "hated the ending.", 0.6, -0.5),
    Pair("Write a review of Iron Summer.", "Great acting and a lovely score.", "Boring.", 0.7, -0.3),
    Pair("Continue: the plot was", "clever and beautiful.", "a disaster.", 0.7, -0.6),
]


def _args(tmp_path, precompute: bool):
    from trl import DPOConfig

    return DPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=3, learning_rate=1e-3,
                     logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, bf16=False,
                     gradient_checkpointing=False, seed=0, data_seed=0, precompute_ref_log_probs=precompute,
                     lr_scheduler_type="constant", disable_tqdm=True)


def _losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


@pytest.mark.filterwarnings("ignore")
def test_regime_trainer_matches_stock_trl_with_a_reference_model(tmp_path, tiny_source, tokenizer, ref_ctx):
    from trl import DPOTrainer

    cpu = torch.device("cpu")
    stock = DPOTrainer(model=load_model(tiny_source, cpu), ref_model=load_model(tiny_source, cpu),
                       args=_args(tmp_path / "stock", precompute=False), train_dataset=pairs_dataset(PAIRS),
                       processing_class=tokenizer)
    stock.train()
    reference = FullReference(FullRefConfig(), ref_ctx)
    ours = _dpo_trainer_cls()(model=load_model(tiny_source, cpu), args=_args(tmp_path / "ours", precompute=True),
                             train_dataset=pairs_dataset(PAIRS), processing_class=tokenizer, reference=reference)
    ours.train()
    a, b = _losses(stock), _losses(ours)
    assert len(a) == len(b) == 3
    assert math.isclose(a[0], math.log(2), rel_tol=1e-4)  # reference == policy at step 0
    for x, y in zip(a, b):
        assert math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-5)
    assert b[-1] < b[0]  # it learns
    for (n1, p1), (n2, p2) in zip(stock.model.named_parameters(), ours.model.named_parameters()):
        assert torch.allclose(p1, p2, atol=1e-5), n1
    # the regime was asked once per step, and TRL loaded no reference of its own
    assert reference.cost().forward_calls == 3
    assert ours.ref_model is None


@pytest.mark.filterwarnings("ignore")
def test_cached_regime_trains_like_full_with_zero_reference_forwards(tmp_path, tiny_source, tokenizer, ref_ctx,
                                                                     cache_root):
    from ablate.refs.cached import CachedRefConfig, CachedReference

    cpu = torch.device("cpu")
    ref_ctx.cache_root = str(cache_root)
    runs = {}
    for name, reference in (("full", FullReference(FullRefConfig(), ref_ctx)),
                            ("cached", CachedReference(CachedRefConfig(miss="error"), ref_ctx))):
        trainer = _dpo_trainer_cls()(model=load_model(tiny_source, cpu), args=_args(tmp_path / name, precompute=True),
                                     train_dataset=pairs_dataset(PAIRS), processing_class=tokenizer,
                                     reference=reference)
        trainer.train()
        runs[name] = (_losses(trainer), reference)
    (full_losses, _), (cached_losses, cached) = runs["full"], runs["cached"]
    for x, y in zip(full_losses, cached_losses):
        assert math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-5)
    extra = cached.cost().extra
    assert extra["model_forwards"] == 0 and extra["misses"] == 0 and extra["hits"] == 3 * 2 * 2
    assert cached.cost().bytes_held < 1e6  # log-probs only, no weights


@pytest.mark.filterwarnings("ignore")
def test_none_regime_uses_no_reference_term(tmp_path, tiny_source, tokenizer, ref_ctx):
    from ablate.refs.none import NoneRefConfig, NoReference

    trainer = _dpo_trainer_cls()(model=load_model(tiny_source, torch.device("cpu")),
                                 args=_args(tmp_path, precompute=True), train_dataset=pairs_dataset(PAIRS),
                                 processing_class=tokenizer, reference=NoReference(NoneRefConfig(), ref_ctx))
    trainer.train()
    first = trainer.state.log_history[0]
    # with a zero reference the implicit reward is beta * log pi(y): not 0 at step 0, unlike with a reference
    assert first["rewards/chosen"] == pytest.approx(0.1 * first["logps/chosen"], rel=1e-3)
