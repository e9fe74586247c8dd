"""The fidelity audit of what each algorithm consumes (ablate.eval.fidelity), on the tiny model: the exact reference is
exactly exact in fp32, the precision has its own small error in bf16, quantisation adds to it, and every regime under
every algorithm gives every figure or a reason."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from ablate.algos.registry import algorithm
from ablate.config import AdapterConfig
from ablate.eval.fidelity import KEYS, FidelityProbe, logged_name
from ablate.models.loading import add_adapter, load_model
from ablate.refs import REGISTRY
from ablate.refs.cached import CachedRefConfig, CachedReference
from ablate.refs.full import FullRefConfig, FullReference
from ablate.refs.int8 import Int8RefConfig, Int8Reference
from ablate.tasks.pair_tokens import pair_batches
from ablate.tasks.pairs import Pair
from ablate.tasks.reward import GoldReward
from tests.conftest import typed_config

CPU = torch.device("cpu")
PAIRS = [
    Pair("Review the film Lucky Harbor.", "A wonderful, joyful film.", "A dull and awful mess.", 0.8, -0.7),
    Pair("Continue: The plot of Iron Summer", "is gripping and warm.", "drags on forever.", 0.6, -0.4),
    Pair("Write about Glass Kingdom.", "Lovely acting, a fine score.", "Boring and far too long.", 0.7, -0.5),
    Pair("Describe Velvet Engine's ending.", "It lands beautifully.", "It is a mess.", 0.5, -0.6),
]
PROMPTS = [p.prompt for p in PAIRS]
LN2_FP32 = float(torch.tensor(math.log(2), dtype=torch.float32))


DPO = ("algo=dpo", "algo.batch_size=2")
GRPO = ("algo=grpo", "algo.batch_size=4", "algo.num_generations=2")
PPO = ("algo=ppo", "algo.batch_size=2", "algo.minibatch_size=2")


def _cfg(tmp_path, algo, precision="fp32"):
    return typed_config(tmp_path, "model=tiny", "task.max_new_tokens=8", f"model.precision={precision}", *algo)


def _probe(tiny_source, tokenizer, cfg) -> FidelityProbe:
    dpo = cfg.algo.name == "dpo"
    return FidelityProbe(
        judge=load_model(tiny_source, CPU),
        tokenizer=tokenizer,
        algo=cfg.algo,
        precision=cfg.model.precision,
        device=CPU,
        pair_batches=pair_batches(tokenizer, PAIRS, cfg.algo.batch_size, 128) if dpo else None,
        prompts=None if dpo else PROMPTS,
    )


def _trainer(cfg, tokenizer, policy, reference):
    """The trainer a run of ``cfg`` builds: the audit differentiates its own loss."""
    return algorithm(cfg.algo.name).build(
        cfg=cfg,
        policy=policy,
        tokenizer=tokenizer,
        pairs=PAIRS,
        prompts=PROMPTS,
        reward=GoldReward(),
        proxy=None,
        reference=reference,
        callbacks=[],
        out_dir=Path(cfg.out_dir),
        device=CPU,
    )


def _measure(probe, policy, reference, cfg, fresh=()) -> dict[str, float]:
    trainer = _trainer(cfg, probe.tokenizer, policy, reference)
    metrics, _ = probe.measure(policy, reference, fresh, trainer)
    return {k: metrics[logged_name(k)] for k in KEYS}


def test_the_exact_reference_in_fp32_has_zero_margin_error_unit_cosine_and_loss_ln2(
    tiny_source, tokenizer, ref_ctx, tmp_path
):
    cfg = _cfg(tmp_path, DPO)
    probe = _probe(tiny_source, tokenizer, cfg)
    m = _measure(probe, load_model(tiny_source, CPU), FullReference(FullRefConfig(), ref_ctx), cfg)
    assert m["margin_err_mean"] == m["margin_err_sd"] == m["margin_err_max"] == 0.0
    assert m["grad_cos"] == 1.0 and m["dpo_loss"] == LN2_FP32  # TRL's loss, in the policy's fp32


def test_cached_gives_exactly_what_full_gives(tiny_source, tokenizer, ref_ctx, tmp_path):
    cfg = _cfg(tmp_path, DPO)
    probe, policy = _probe(tiny_source, tokenizer, cfg), load_model(tiny_source, CPU)
    cached = CachedReference(
        CachedRefConfig(miss="error"), dataclasses.replace(ref_ctx, max_length=128, cache_root=str(tmp_path))
    )
    cached.prepare(pair_batches(tokenizer, PAIRS, 3, 128))  # other batches than DPO's: fp32 rows do not change values
    m_cached = _measure(probe, policy, cached, cfg)
    assert m_cached == _measure(probe, policy, FullReference(FullRefConfig(), ref_ctx), cfg)
    assert m_cached["margin_err_max"] == 0.0 and m_cached["grad_cos"] == 1.0
    assert cached.hits == 0  # the audit leaves the regime's own statistics to training


def test_cached_on_dpos_batches_gives_exactly_what_full_gives_in_bf16(tiny_source, tokenizer, ref_ctx, tmp_path):
    """In bf16 a batch's padding changes the rounding of its rows: cached precomputes in DPO's own batches (its
    default ``ref.batch_size``), so full's figures and cached's agree to the last digit there too."""
    cfg = _cfg(tmp_path, DPO, precision="bf16")
    probe, policy = _probe(tiny_source, tokenizer, cfg), load_model(tiny_source, CPU)
    ctx = dataclasses.replace(ref_ctx, precision="bf16", max_length=128, cache_root=str(tmp_path))
    cached = CachedReference(CachedRefConfig(miss="error", batch_size=cfg.algo.batch_size), ctx)
    cached.prepare(pair_batches(tokenizer, PAIRS, cfg.algo.batch_size, 128))
    m_cached = _measure(probe, policy, cached, cfg)
    m_full = _measure(probe, policy, FullReference(FullRefConfig(), ctx), cfg)
    assert m_cached == m_full and m_full["margin_err_max"] > 0  # the same nonzero zero line of bf16


@pytest.mark.filterwarnings("ignore")
def test_bf16_has_its_own_zero_line_and_int8_a_larger_error(tiny_source, tokenizer, ref_ctx, tmp_path):
    cfg = _cfg(tmp_path, DPO, precision="bf16")
    probe = _probe(tiny_source, tokenizer, cfg)
    ctx = dataclasses.replace(ref_ctx, precision="bf16")
    policy = load_model(tiny_source, CPU)
    full = _measure(probe, policy, FullReference(FullRefConfig(), ctx), cfg)
    int8 = _measure(probe, policy, Int8Reference(Int8RefConfig(), ctx), cfg)
    assert 0 < full["margin_err_max"] < 0.1 and full["grad_cos"] < 1.0
    assert int8["margin_err_sd"] > full["margin_err_sd"] > 0


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("algo", [GRPO, PPO], ids=["grpo", "ppo"])
def test_online_penalty_error_is_zero_for_the_exact_reference_and_not_for_int8(
    tiny_source, tokenizer, ref_ctx, algo, tmp_path
):
    from ablate.models.sampling import sample

    cfg = _cfg(tmp_path, algo)
    probe = _probe(tiny_source, tokenizer, cfg)
    policy = load_model(tiny_source, CPU)
    fresh = sample(policy, tokenizer, PROMPTS, max_new_tokens=8, temperature=1.0, batch_size=4, seed=1)
    full = _measure(probe, policy, FullReference(FullRefConfig(), ref_ctx), cfg, fresh)
    int8 = _measure(probe, policy, Int8Reference(Int8RefConfig(), ref_ctx), cfg, fresh)
    assert full["kl_penalty_err_mean"] == full["kl_penalty_err_sd"] == 0.0 and full["grad_cos"] == 1.0
    assert int8["kl_penalty_err_sd"] > 0 and int8["grad_cos"] < 1.0


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


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("algo", [DPO, GRPO], ids=["dpo", "grpo"])
def test_every_regime_gives_every_figure_or_a_reason(tiny_source, tokenizer, ref_ctx, tmp_path, algo):
    from ablate.models.sampling import sample

    cfg = _cfg(tmp_path, algo)
    algo = cfg.algo
    probe = _probe(tiny_source, tokenizer, cfg)
    policy = add_adapter(load_model(tiny_source, CPU), AdapterConfig(enabled=True))  # `shared` needs one
    fresh = sample(policy, tokenizer, PROMPTS[:2], max_new_tokens=6, temperature=1.0, batch_size=2, seed=1)
    ctx = dataclasses.replace(ref_ctx, cache_root=str(tmp_path))
    trainer = None  # one trainer, as a run has one (TRL gives a peft policy a "ref" adapter once); its regime swapped
    for name in sorted(REGISTRY):
        if algo.name not in REGISTRY[name].supported_algos:
            continue
        reference = _regime(name, ctx, policy, algo.name)
        if trainer is None:
            trainer = _trainer(cfg, tokenizer, policy, reference)
        trainer.reference = reference
        try:
            metrics, why = probe.measure(policy, reference, fresh, trainer)
        finally:
            reference.close()  # a served regime's server, as a run closes its reference
        for key in KEYS:
            value = metrics[logged_name(key)]
            assert math.isfinite(value) or key in why, (name, key, value)
        if name != "none":
            assert math.isfinite(metrics["kl/grad_cos"]), (name, why)


class _Logs:
    """Collects the trainer's logged losses (a callback, as the run's own)."""

    def __init__(self):
        from transformers import TrainerCallback

        self.losses = []
        outer = self

        class CB(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kw):
                if logs and "loss" in logs:
                    outer.losses.append(logs["loss"])

        self.callback = CB()


@pytest.mark.slow
@pytest.mark.parametrize(
    "algo",
    [(*DPO, "algo.sft_weight=0.5", "algo.max_steps=1"), (*PPO, "algo.ppo_epochs=1", "algo.max_steps=1")],
    ids=["dpo", "ppo"],
)
def test_the_audited_loss_is_the_loss_the_trainer_logs_at_its_first_step(
    tiny_source, tokenizer, ref_ctx, tmp_path, algo
):
    """The audit differentiates the trainer's own loss on the trainer's own first batch: its value before training
    is, to the last bit, the loss the trainer then logs at step 1 (DPO's SFT term makes it depend on the batch)."""
    cfg = _cfg(tmp_path, algo)
    probe = _probe(tiny_source, tokenizer, cfg)
    torch.manual_seed(0)
    policy = load_model(tiny_source, CPU)
    reference = FullReference(FullRefConfig(), ref_ctx)
    logs = _Logs()
    trainer = algorithm(cfg.algo.name).build(
        cfg=cfg, policy=policy, tokenizer=tokenizer, pairs=PAIRS, prompts=PROMPTS, reward=GoldReward(), proxy=None,
        reference=reference, callbacks=[logs.callback], out_dir=Path(cfg.out_dir), device=CPU,
    )  # fmt: skip
    audited, cos = probe.first_batch_loss(policy, trainer, reference)
    trainer.train()
    assert cos == 1.0 and audited == logs.losses[0] and audited != math.log(2)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("algo", [GRPO, PPO], ids=["grpo", "ppo"])
def test_the_audited_gradient_follows_the_kl_placement(tiny_source, tokenizer, ref_ctx, tmp_path, algo):
    """What ``grad_cos`` differentiates is the trainer's loss as configured: with k1 in the loss the reference never
    reaches the gradient (int8's cosine is 1); in the reward it does."""
    policy = load_model(tiny_source, CPU)
    int8 = Int8Reference(Int8RefConfig(), ref_ctx)
    cos = {}
    for placement, est in (("loss", "k1"), ("reward", "k1")):
        cfg = _cfg(tmp_path / placement, (*algo, f"algo.kl_placement={placement}", f"algo.kl_estimator={est}"))
        cos[placement] = _measure(_probe(tiny_source, tokenizer, cfg), policy, int8, cfg)["grad_cos"]
    assert cos["loss"] == pytest.approx(1.0, abs=1e-12) and cos["reward"] < 1.0


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_runs_step_0_audit_loss_is_its_first_logged_loss(tmp_path, precision):
    """In a run (the trainer's loader prepared, its model under the training precision): the audit at step 0 computes,
    to the last bit, the loss the trainer logs at step 1 (with the SFT replay term the loss depends on the batch), in
    the training precision."""
    import json

    from tests.conftest import TINY_FAST, run_cli

    run_dir = tmp_path / "run"
    res = run_cli(
        *TINY_FAST, "algo.max_steps=1", "algo.sft_weight=0.5", f"model.precision={precision}", "eval.interval=0",
        f"hydra.run.dir={run_dir}", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    audit = next(r for r in rows if r.get("step") == 0 and "kl/dpo_loss" in r)
    first = next(r for r in rows if r.get("step") == 1 and "train/loss" in r)
    assert audit["kl/dpo_loss"] == first["train/loss"] != LN2_FP32
    assert audit["kl/grad_cos"] == 1.0 if precision == "fp32" else 0.99 < audit["kl/grad_cos"] < 1.0  # bf16's zero line
