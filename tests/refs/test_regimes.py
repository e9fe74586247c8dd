"""Invariants that pin each regime's behaviour against the full reference (each able to fail)."""

from __future__ import annotations

import pytest
import torch

from ablate.eval.kl import exact_kl_per_token, gather_token_logprobs
from ablate.models.loading import add_adapter, load_model
from ablate.refs.cached import CachedRefConfig, CachedReference
from ablate.refs.ema import EmaRefConfig, EmaReference
from ablate.refs.int8 import Int8RefConfig, Int8Reference
from ablate.refs.nf4 import Nf4RefConfig, Nf4Reference
from ablate.refs.none import NoneRefConfig, NoReference
from ablate.refs.shared import SharedRefConfig, SharedReference
from ablate.refs.snapshot import SnapshotRefConfig, SnapshotReference
from ablate.refs.topk import TopKRefConfig, TopKReference, topk_distribution
from tests.conftest import token_batch
from tests.refs.conftest import PROMPTS, RESPONSES
from tests.refs.documented import undocumented_extras


def _perturbed(tiny_source, scale=0.05, seed=0):
    policy = load_model(tiny_source, torch.device("cpu"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return policy


# ----------------------------------------------------------------------------------- topk
def test_topk_with_k_equal_vocab_is_full(ref_ctx, full, batch):
    vocab = full.model.config.vocab_size
    for tail in ("bucket", "renorm"):
        ref = TopKReference(TopKRefConfig(k=vocab, tail=tail), ref_ctx)
        assert torch.equal(ref.distribution(batch), full.distribution(batch))
        assert torch.allclose(ref.logprobs(batch), full.logprobs(batch), atol=1e-5)


@pytest.mark.parametrize("tail", ["bucket", "renorm"])
def test_topk_is_a_proper_distribution_that_keeps_the_top(tail):
    lp = torch.log_softmax(torch.randn(2, 3, 50, dtype=torch.float64), -1)
    approx = topk_distribution(lp, 5, tail, 1e-6)
    assert torch.allclose(approx.logsumexp(-1), torch.zeros(2, 3, dtype=torch.float64), atol=1e-9)
    top = lp.topk(5, -1).indices
    if tail == "bucket":  # the top-k keep their true log-probs
        assert torch.equal(approx.gather(-1, top), lp.gather(-1, top))
    kl = exact_kl_per_token(lp, approx)
    assert (kl > 0).all()  # the tail costs fidelity


def test_topk_bucket_tail_is_finite_where_the_top_hold_all_the_float_mass():
    # float32: the top token's log-prob rounds to 0, so 1 - sum(top k) is <= 0 and a 1 - sum tail would be -inf
    # (a GRPO k3 of +inf for a sampled token outside the top k); the tail's own log-mass keeps its true value
    logits = torch.full((1, 1, 50), -40.0)
    logits[..., 0] = 0.0
    lp = torch.log_softmax(logits, -1)
    assert lp[..., :5].double().exp().sum() >= 1.0
    approx = topk_distribution(lp, 5, "bucket", 1e-10)
    assert torch.isfinite(approx).all()
    assert torch.allclose(approx, lp)  # an even tail is represented exactly


def test_topk_small_k_biases_kl_and_logprobs(ref_ctx, full, batch, tiny_source):
    ref = TopKReference(TopKRefConfig(k=5, keep_sampled=False), ref_ctx)  # a top-logprobs endpoint
    d = (ref.logprobs(batch) - full.logprobs(batch))[batch.target_mask]
    assert d.abs().max() > 0
    assert ref.cost().extra["stored_bytes_per_position"] == 5 * 8 + 4
    assert not undocumented_extras(ref)


# ------------------------------------------------------------------------------- ema/snap
def test_ema_formula_step_by_step(ref_ctx, full, tiny_source):
    ref = EmaReference(EmaRefConfig(alpha=0.25, tau=2), ref_ctx)
    r0 = {n: p.clone() for n, p in ref.model.named_parameters()}
    policy = _perturbed(tiny_source)
    ref.step(policy, 1)  # not a multiple of tau: no update
    assert all(torch.equal(p, r0[n]) for n, p in ref.model.named_parameters())
    ref.step(policy, 2)
    pol = dict(policy.named_parameters())
    for n, p in ref.model.named_parameters():
        assert torch.allclose(p, 0.75 * r0[n] + 0.25 * pol[n], atol=1e-6), n
    r1 = {n: p.clone() for n, p in ref.model.named_parameters()}
    ref.step(policy, 4)
    for n, p in ref.model.named_parameters():
        assert torch.allclose(p, 0.75 * r1[n] + 0.25 * pol[n], atol=1e-6), n
    assert ref.cost().extra["updates"] == 2
    assert not undocumented_extras(ref)


def test_ema_alpha_zero_and_late_snapshot_equal_full(ref_ctx, full, batch, tiny_source):
    policy = _perturbed(tiny_source)
    ema = EmaReference(EmaRefConfig(alpha=0.0, tau=1), ref_ctx)
    snap = SnapshotReference(SnapshotRefConfig(tau=100), ref_ctx)
    for step in range(1, 11):
        ema.step(policy, step)
        snap.step(policy, step)
    assert torch.equal(ema.logprobs(batch), full.logprobs(batch))
    assert torch.equal(snap.logprobs(batch), full.logprobs(batch))


def test_snapshot_copies_the_policy_exactly_at_tau(ref_ctx, batch, tiny_source):
    from ablate.refs.model_backed import token_logprobs

    snap = SnapshotReference(SnapshotRefConfig(tau=3), ref_ctx)
    policy = _perturbed(tiny_source)
    snap.step(policy, 2)
    assert not torch.equal(snap.logprobs(batch), token_logprobs(policy.eval(), batch))
    snap.step(policy, 3)
    assert torch.equal(snap.logprobs(batch), token_logprobs(policy, batch))


# ------------------------------------------------------------------------------------- none
def test_none_gives_zero_reference_log_ratio(ref_ctx, batch):
    import dataclasses

    ref = NoReference(NoneRefConfig(), ref_ctx)
    assert not ref.has_reference
    assert torch.count_nonzero(ref.logprobs(batch)) == 0
    assert ref.cost().bytes_held == 0
    # only "no reference": the reference-free losses are options of the algorithm's loss (DPOConfig)
    assert [f.name for f in dataclasses.fields(NoneRefConfig)] == ["name"]
    assert NoReference.supported_algos == ("dpo", "ppo", "grpo")


# ------------------------------------------------------------------------------ quantised
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize(
    "cls,cfg",
    [
        (Int8Reference, Int8RefConfig()),
        (Nf4Reference, Nf4RefConfig()),
        (Nf4Reference, Nf4RefConfig(quant_type="fp4", double_quant=True)),
    ],
)
def test_quantised_differ_from_full_by_a_small_nonzero_amount(ref_ctx, full, batch, cls, cfg):
    ref = cls(cfg, ref_ctx)
    d = (ref.logprobs(batch) - full.logprobs(batch))[batch.target_mask].abs()
    assert 0 < d.mean() < 0.5
    kl = exact_kl_per_token(full.distribution(batch), ref.distribution(batch))[batch.target_mask]
    assert (kl > 0).any() and kl.mean() < 0.1
    assert ref.cost().bytes_held < full.cost().bytes_held


@pytest.mark.filterwarnings("ignore")
def test_quantised_bytes_order(ref_ctx, full):
    int8 = Int8Reference(Int8RefConfig(), ref_ctx).cost().bytes_held
    nf4 = Nf4Reference(Nf4RefConfig(), ref_ctx).cost().bytes_held
    assert nf4 < int8 < full.cost().bytes_held


# ---------------------------------------------------------------------------------- shared
def test_shared_is_the_policy_without_its_adapter(ref_ctx, full, batch, tiny_source):
    from ablate.config import AdapterConfig

    policy = add_adapter(load_model(tiny_source, torch.device("cpu")), AdapterConfig(enabled=True, r=4))
    ref_ctx.policy = policy
    ref = SharedReference(SharedRefConfig(), ref_ctx)
    assert ref.cost().bytes_held == 0
    assert torch.allclose(ref.logprobs(batch), full.logprobs(batch), atol=1e-6)
    with torch.no_grad():  # move the adapter: the policy changes, the shared reference must not
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.add_(0.5)
    policy.train()
    assert torch.allclose(ref.logprobs(batch), full.logprobs(batch), atol=1e-6)
    assert policy.training  # restored
    from ablate.refs.model_backed import next_token_logprobs

    moved = next_token_logprobs(policy.eval(), batch)
    assert not torch.allclose(
        gather_token_logprobs(moved, batch.input_ids[:, 1:])[batch.target_mask],
        full.logprobs(batch)[batch.target_mask],
        atol=1e-3,
    )


# ---------------------------------------------------------------------------------- cached
def test_cached_equals_full_on_its_data_with_no_forwards(ref_ctx, full, batch, cache_root):
    ref_ctx.cache_root = str(cache_root)
    ref = CachedReference(CachedRefConfig(miss="error"), ref_ctx)
    ref.prepare([batch])
    assert torch.allclose(ref.logprobs(batch), full.logprobs(batch), atol=1e-6)
    # a batch padded differently, in another order, is still a hit: lookups are by content
    wide = token_batch(ref_ctx.tokenizer, PROMPTS[::-1], RESPONSES[::-1])
    assert torch.allclose(ref.logprobs(wide), full.logprobs(wide), atol=1e-6)
    extra = ref.cost().extra
    assert extra["hits"] == 6 and extra["misses"] == 0 and extra["model_forwards"] == 0
    with pytest.raises(NotImplementedError):
        ref.distribution(batch)
    # a resumed job's counters are the whole job's: they travel in the checkpoint's reference state
    resumed = CachedReference(CachedRefConfig(miss="error"), ref_ctx)
    resumed.prepare([batch])
    resumed.load_state_dict(ref.state_dict())
    resumed.logprobs(batch)
    assert resumed.cost().extra["hits"] == 9 and resumed.cost().extra["hit_rate"] == 1.0


def test_cached_miss_policies(ref_ctx, full, batch, cache_root, tokenizer):
    ref_ctx.cache_root = str(cache_root)
    fresh = token_batch(tokenizer, ["Something else entirely"], ["not cached"])
    for miss in ("error", "skip", "fallback"):
        ref = CachedReference(CachedRefConfig(miss=miss), ref_ctx)
        ref.prepare([batch])
        if miss == "error":
            with pytest.raises(RuntimeError, match="not in the cache"):
                ref.logprobs(fresh)
        elif miss == "skip":  # no reference term: the whole row is NaN (not 0, which reads as log-prob 0)
            assert torch.isnan(ref.logprobs(fresh)).all()
            assert ref.cost().extra["hit_rate"] == 0.0
        else:
            assert torch.allclose(ref.logprobs(fresh), full.logprobs(fresh), atol=1e-6)
            assert ref.cost().extra["model_forwards"] == 1 and ref.cost().bytes_held > full.cost().bytes_held * 0.9
            assert not undocumented_extras(ref)


def test_cached_skip_marks_only_the_missed_rows_and_audits_see_them_too(ref_ctx, full, batch, cache_root, tokenizer):
    from ablate.eval.response_audit import LOGP_KEYS, Audit
    from ablate.refs.base import AUDIT, uncovered_rows

    ref_ctx.cache_root = str(cache_root)
    ref = CachedReference(CachedRefConfig(miss="skip"), ref_ctx)
    ref.prepare([batch])
    mixed = token_batch(tokenizer, [PROMPTS[0], "Something else entirely"], [RESPONSES[0], "not cached"])
    out = ref.logprobs(mixed)
    assert uncovered_rows(out).tolist() == [False, True]
    assert torch.allclose(out[0], full.logprobs(mixed)[0], atol=1e-6)
    torch.testing.assert_close(ref.logprobs(mixed, AUDIT), out, equal_nan=True, rtol=0, atol=0)
    assert ref.cost().extra["misses"] == 1  # an audit is not counted
    audit = Audit()
    assert audit.regime_logprobs(ref, mixed, "fp32") is None
    assert audit.reasons[LOGP_KEYS[0]] == "ref=cached has no reference term for 1 of 2 sampled responses"


def test_cached_skip_is_refused_for_dpo(tmp_path):
    from ablate.errors import ConfigError
    from tests.conftest import typed_config

    with pytest.raises(ConfigError, match="miss=skip is for online algorithms"):
        CachedReference.check_config(typed_config(tmp_path, "model=tiny", "algo=dpo", "ref=cached", "ref.miss=skip"))
    CachedReference.check_config(typed_config(tmp_path, "model=tiny", "algo=grpo", "ref=cached", "ref.miss=skip"))


def test_cached_corrupted_file_is_detected_and_rebuilt(ref_ctx, full, batch, tmp_path, caplog):
    ref_ctx.cache_root = str(tmp_path)
    ref = CachedReference(CachedRefConfig(miss="error"), ref_ctx)
    ref.prepare([batch])
    values = ref.entry.path / "logps.safetensors"
    blob = bytearray(values.read_bytes())
    blob[-3] ^= 0xFF
    values.write_bytes(bytes(blob))
    again = CachedReference(CachedRefConfig(miss="error"), ref_ctx)
    with caplog.at_level("WARNING"):
        again.prepare([batch])
    assert "failed its checksum" in caplog.text
    assert torch.allclose(again.logprobs(batch), full.logprobs(batch), atol=1e-6)


def test_cached_key_changes_with_every_input(ref_ctx, tokenizer):
    ref = CachedReference(CachedRefConfig(miss="error"), ref_ctx)
    ref_ctx.max_length = 256
    base = ref.cache_key("data")
    assert ref.cache_key("data2") != base
    ref_ctx.max_length = 128
    assert ref.cache_key("data") != base
    ref_ctx.max_length = 256
    fp = ref_ctx.model_fingerprint
    ref_ctx.model_fingerprint = "tiny:other"
    assert ref.cache_key("data") != base
    ref_ctx.model_fingerprint = fp
    assert ref.cache_key("data") == base
    old = tokenizer.chat_template
    tokenizer.chat_template = old.replace("assistant", "bot")
    try:
        assert ref.cache_key("data") != base
    finally:
        tokenizer.chat_template = old
    ref_ctx.precision = "bf16"
    assert ref.cache_key("data") != base


def test_cached_miss_auto_is_settled_by_validate_not_at_run_time(tmp_path, ref_ctx):
    """``ref.miss=auto`` becomes error (DPO) or skip (online) when the config is validated; the regime never
    rewrites its own config, and refuses an unsettled ``auto``."""
    from ablate.errors import ConfigError
    from ablate.validation import validate
    from tests.conftest import typed_config

    for algo, miss in (("dpo", "error"), ("grpo", "skip"), ("ppo", "skip")):
        cfg = typed_config(tmp_path, "model=tiny", f"algo={algo}", "ref=cached")
        assert cfg.ref.miss == "auto"
        validate(cfg)
        assert cfg.ref.miss == miss
        assert cfg.ref.batch_size == cfg.algo.batch_size  # precomputed in the algorithm's own batches
    with pytest.raises(ConfigError, match="miss=auto is settled when the config is validated"):
        CachedReference(CachedRefConfig(), ref_ctx)


def test_cached_keys_its_cache_on_the_batches_it_precomputed(tokenizer, ref_ctx, tmp_path):
    """In bf16 a batch's padding changes the rounding of its rows: the same pairs in other batches are another
    cache entry, never a stale one."""
    import dataclasses

    from ablate.tasks.pair_tokens import pair_batches
    from ablate.tasks.pairs import Pair

    pairs = [Pair(f"Review film {i}.", "Lovely" + " and warm" * i, "Dull.", 0.5, -0.5) for i in range(4)]
    ctx = dataclasses.replace(ref_ctx, max_length=64, cache_root=str(tmp_path))
    paths = set()
    for rows in (2, 4):
        ref = CachedReference(CachedRefConfig(miss="error", batch_size=rows), ctx)
        ref.prepare(pair_batches(tokenizer, pairs, rows, 64))
        paths.add(ref.entry.path)
    assert len(paths) == 2


def test_cached_reads_the_algorithm_by_name_not_the_config(ref_ctx):
    """The regime's context carries the algorithm's name and max length, not the run's config."""
    import dataclasses

    from ablate.refs.base import RefContext

    names = {f.name for f in dataclasses.fields(RefContext)}
    assert {"algo", "max_length", "precision", "device"} <= names
    ref = CachedReference(CachedRefConfig(miss="error"), dataclasses.replace(ref_ctx, max_length=77))
    assert ref.cache_key("data")["max_length"] == 77


def test_every_hook_a_caller_uses_is_declared_on_the_base_with_a_neutral_default(ref_ctx, batch):
    """Callers never probe a regime for a hook: the base declares each one, and its default changes nothing."""
    from ablate.refs.base import Reference

    class Plain(Reference):
        def _logprobs(self, b):
            return torch.zeros(b.input_ids.shape[0], b.input_ids.shape[1] - 1)

    ref = Plain(None, ref_ctx)
    assert (ref.wants_training_data, ref.needs_pairs, ref.required_packages) == (False, False, {})
    assert ref.prepare([batch]) is None and ref.cost().setup_s == 0.0
    assert Plain.resolve(None) is None
    assert not hasattr(ref, "unavailable_reason") and not hasattr(ref, "prepare_from_pairs")
    assert not hasattr(ref, "dpo_loss_types") and not hasattr(ref, "extra_loss")  # the algorithm's loss, not a hook


def test_a_regime_is_registered_under_its_schema_name_written_once():
    from dataclasses import dataclass

    from ablate.config import RefConfig
    from ablate.refs.base import REGISTRY, register

    for name, cls in REGISTRY.items():
        assert cls.name == name == cls.config_cls().name  # the schema's default is the one place it is written

    @dataclass
    class Nameless(RefConfig):
        pass

    with pytest.raises(TypeError, match="must give its regime's name"):
        register(Nameless)
