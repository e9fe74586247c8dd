"""The fidelity audit of what each algorithm consumes (ablate.eval.fidelity), on the tiny model: the exact reference is
exactly exact in fp32, the precision has its own small error in bf16, quantisation adds to it, and every regime under
every algorithm gives every figure or a reason."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from ablate.config import AdapterConfig, DPOConfig, GRPOAlgoConfig, PPOAlgoConfig
from ablate.eval.fidelity import KEYS, FidelityProbe, logged_name
from ablate.models.loading import add_adapter, load_model
from ablate.refs import REGISTRY
from ablate.refs.cached import CachedRefConfig, CachedReference
from ablate.refs.full import FullRefConfig, FullReference
from ablate.refs.int8 import Int8RefConfig, Int8Reference
from ablate.tasks.pair_tokens import pair_batches
from ablate.tasks.pairs import Pair
from ablate.tasks.reward import GoldReward

CPU = torch.device("cpu")
PAIRS = [
    Pair("Review the film Lucky Harbor.", "A wonderful, joyful film.", "A dull and awful mess.", 0.8, -0.7),
    Pair("Continue: The plot of Iron Summer", "is gripping and warm.", "drags on forever.", 0.6, -0.4),
    Pair("Write about Glass Kingdom.", "Lovely acting, a fine score.", "Boring and far too long.", 0.7, -0.5),
    Pair("Describe Velvet Engine's ending.", "It lands beautifully.", "It is a mess.", 0.5, -0.6),
]
PROMPTS = [p.prompt for p in PAIRS]


def _probe(tiny_source, tokenizer, algo, precision="fp32") -> FidelityProbe:
    dpo = algo.name == "dpo"
    return FidelityProbe(
        judge=load_model(tiny_source, CPU),
        tokenizer=tokenizer,
        algo=algo,
        precision=precision,
        device=CPU,
        pair_batches=pair_batches(tokenizer, PAIRS, algo.batch_size, 128) if dpo else None,
        prompts=None if dpo else PROMPTS,
        reward=GoldReward(),
        max_new_tokens=8,
    )


def _measure(probe, policy, reference) -> dict[str, float]:
    metrics, _ = probe.measure(policy, reference)
    return {k: metrics[logged_name(k)] for k in KEYS}


def test_the_exact_reference_in_fp32_has_zero_margin_error_unit_cosine_and_loss_ln2(tiny_source, tokenizer, ref_ctx):
    probe = _probe(tiny_source, tokenizer, DPOConfig(batch_size=2))
    m = _measure(probe, load_model(tiny_source, CPU), FullReference(FullRefConfig(), ref_ctx))
    assert m["margin_err_mean"] == m["margin_err_sd"] == m["margin_err_max"] == 0.0
    assert m["grad_cos"] == 1.0 and m["dpo_loss"] == math.log(2)


def test_cached_gives_exactly_what_full_gives(tiny_source, tokenizer, ref_ctx, tmp_path):
    algo = DPOConfig(batch_size=2)
    probe, policy = _probe(tiny_source, tokenizer, algo), load_model(tiny_source, CPU)
    cached = CachedReference(
        CachedRefConfig(miss="error"), dataclasses.replace(ref_ctx, max_length=128, cache_root=str(tmp_path))
    )
    cached.prepare(pair_batches(tokenizer, PAIRS, 3, 128))  # other batches than DPO's: fp32 rows do not change values
    m_cached = _measure(probe, policy, cached)
    assert m_cached == _measure(probe, policy, FullReference(FullRefConfig(), ref_ctx))
    assert m_cached["margin_err_max"] == 0.0 and m_cached["grad_cos"] == 1.0
    assert cached.hits == 0  # the audit leaves the regime's own statistics to training


def test_cached_on_dpos_batches_gives_exactly_what_full_gives_in_bf16(tiny_source, tokenizer, ref_ctx, tmp_path):
    """In bf16 a batch's padding changes the rounding of its rows: cached precomputes in DPO's own batches (its
    default ``ref.batch_size``), so full's figures and cached's agree to the last digit there too."""
    algo = DPOConfig(batch_size=2)
    probe, policy = _probe(tiny_source, tokenizer, algo, precision="bf16"), load_model(tiny_source, CPU)
    ctx = dataclasses.replace(ref_ctx, precision="bf16", max_length=128, cache_root=str(tmp_path))
    cached = CachedReference(CachedRefConfig(miss="error", batch_size=algo.batch_size), ctx)
    cached.prepare(pair_batches(tokenizer, PAIRS, algo.batch_size, 128))
    m_cached = _measure(probe, policy, cached)
    m_full = _measure(probe, policy, FullReference(FullRefConfig(), ctx))
    assert m_cached == m_full and m_full["margin_err_max"] > 0  # the same nonzero zero line of bf16


@pytest.mark.filterwarnings("ignore")
def test_bf16_has_its_own_zero_line_and_int8_a_larger_error(tiny_source, tokenizer, ref_ctx):
    probe = _probe(tiny_source, tokenizer, DPOConfig(batch_size=2), precision="bf16")
    ctx = dataclasses.replace(ref_ctx, precision="bf16")
    policy = load_model(tiny_source, CPU)
    full = _measure(probe, policy, FullReference(FullRefConfig(), ctx))
    int8 = _measure(probe, policy, Int8Reference(Int8RefConfig(), ctx))
    assert 0 < full["margin_err_max"] < 0.1 and full["grad_cos"] < 1.0
    assert full["dpo_loss"] == math.log(2)  # policy and reference computed alike: the loss is exactly ln 2
    assert int8["margin_err_sd"] > full["margin_err_sd"] > 0


@pytest.mark.parametrize(
    "algo", [GRPOAlgoConfig(batch_size=4, num_generations=2), PPOAlgoConfig(batch_size=2, minibatch_size=2)]
)
def test_online_penalty_error_is_zero_for_the_exact_reference_and_not_for_int8(tiny_source, tokenizer, ref_ctx, algo):
    from ablate.models.sampling import sample

    probe = _probe(tiny_source, tokenizer, algo)
    policy = load_model(tiny_source, CPU)
    fresh = sample(policy, tokenizer, PROMPTS, max_new_tokens=8, temperature=1.0, batch_size=4, seed=1)
    full, _ = probe.measure(policy, FullReference(FullRefConfig(), ref_ctx), fresh)
    int8, _ = probe.measure(policy, Int8Reference(Int8RefConfig(), ref_ctx), fresh)
    assert full["kl/penalty_err_mean"] == full["kl/penalty_err_sd"] == 0.0 and full["kl/grad_cos"] == 1.0
    assert int8["kl/penalty_err_sd"] > 0 and int8["kl/grad_cos"] < 1.0


def _regime(name, ref_ctx, policy, algo):
    cls = REGISTRY[name]
    cfg = cls.config_cls()
    if name == "distilled":
        cfg = dataclasses.replace(cfg, steps=2, batch_size=4, num_layers=1)
    if name == "cached":
        cfg = dataclasses.replace(cfg, miss="fallback" if algo != "dpo" else "error")
    ctx = dataclasses.replace(ref_ctx, policy=policy, algo=algo, train_data=PAIRS, max_length=128)
    ref = cls(cfg, ctx)
    if ref.wants_training_data:
        ref.prepare(pair_batches(ref_ctx.tokenizer, PAIRS, 2, 128))
    return ref


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("algo", [DPOConfig(batch_size=2), GRPOAlgoConfig(batch_size=4, num_generations=2)])
def test_every_regime_gives_every_figure_or_a_reason(tiny_source, tokenizer, ref_ctx, tmp_path, algo):
    from ablate.models.sampling import sample

    probe = _probe(tiny_source, tokenizer, algo)
    policy = add_adapter(load_model(tiny_source, CPU), AdapterConfig(enabled=True))  # `shared` needs one
    fresh = sample(policy, tokenizer, PROMPTS[:2], max_new_tokens=6, temperature=1.0, batch_size=2, seed=1)
    ctx = dataclasses.replace(ref_ctx, cache_root=str(tmp_path))
    for name in sorted(REGISTRY):
        if algo.name not in REGISTRY[name].supported_algos:
            continue
        metrics, why = probe.measure(policy, _regime(name, ctx, policy, algo.name), fresh)
        for key in KEYS:
            value = metrics[logged_name(key)]
            assert math.isfinite(value) or key in why, (name, key, value)
        if name != "none":
            assert math.isfinite(metrics["kl/grad_cos"]), (name, why)
