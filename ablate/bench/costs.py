"""Per regime, in one process: setup time, reference bytes held (against a bf16 full copy too; for int8 and nf4
also with ``ref.quantize_embeddings=true``), cache bytes on disk, the reference's time per training step (one call
on a DPO batch: chosen and rejected sequences of ``algo.batch_size`` pairs); and the exact full-vocabulary KL
audit's cost against one reference forward."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

import torch

from ablate.bench.timing import interleaved
from ablate.refs.base import TokenBatch, bf16_copy_bytes

log = logging.getLogger(__name__)


@dataclass
class RegimeCost:
    regime: str
    setup_s: float
    bytes_held: float
    cache_bytes: float
    own_bytes: float  # the run's own state: fp32 weights, gradients and two AdamW moments of what trains, the ref
    bf16_copy_bytes: float = float("nan")  # a bf16 full copy of the reference model: 2 bytes per parameter
    bytes_held_quantized_embeddings: float = float("nan")  # with ref.quantize_embeddings=true (int8, nf4 only)
    step_s: float = float("nan")
    # a regime that asks ahead (Reference.prefetch): a training call's wait per one-pair step, asked on the spot
    # and asked ahead while the policy trains on the step before (prefetch_cost)
    spot_step_s: float = float("nan")
    ahead_step_s: float = float("nan")


def own_bytes(policy: torch.nn.Module, ref_bytes: float) -> float:
    """What a run of ``policy`` must hold, whatever the harness does: its fp32 weights, plus a gradient and two
    AdamW moments (fp32) per trainable parameter, plus the reference's bytes. Peak RSS is reported against it."""
    weights = sum(p.numel() * 4 for p in policy.parameters())
    trainable = sum(p.numel() * 4 for p in policy.parameters() if p.requires_grad)
    return float(weights + 3 * trainable + ref_bytes)


def build_regime(cfg, pieces) -> tuple[object, float, torch.nn.Module | None]:
    """The regime for a composed run config, its setup wall time (construction + any precompute: ``cached``
    prepares from the pairs' sequences, as online algorithms prepare it), and the policy it was built on when it
    needs one (``shared``: the policy with its adapter; None otherwise)."""
    from ablate.inputs import prepare_from_pairs
    from ablate.models.loading import add_adapter
    from ablate.refs import regime_class

    policy = None
    if cfg.model.adapter.enabled:  # ref=shared: the reference is the policy with its adapter off
        policy = add_adapter(pieces.load(), cfg.model.adapter)
    t0 = time.perf_counter()
    ctx = pieces.inputs.ref_context(cfg, policy=policy, pairs=pieces.pairs)
    ref = regime_class(cfg.ref.name)(cfg.ref, ctx)
    prepare_from_pairs(ref, pieces.tokenizer, pieces.pairs)
    return ref, time.perf_counter() - t0, policy


def quantized_embeddings_bytes(cfg, ref) -> float:
    """Bytes ``cfg``'s regime holds with ``ref.quantize_embeddings=true`` (``ref``'s own when it is already set, a
    second build otherwise); NaN for a regime without the option."""
    from ablate.refs import regime_class

    if not hasattr(cfg.ref, "quantize_embeddings"):
        return float("nan")
    if cfg.ref.quantize_embeddings:
        return float(ref.cost().bytes_held)
    log.info("bench: setting up ref=%s with ref.quantize_embeddings=true", cfg.ref.name)
    variant = regime_class(cfg.ref.name)(dataclasses.replace(cfg.ref, quantize_embeddings=True), ref.ctx)
    return float(variant.cost().bytes_held)


def regime_costs(configs: dict, pieces, batch: TokenBatch, repeats: int) -> tuple[list[RegimeCost], dict]:
    refs, costs = {}, {}
    full_model = pieces.load()
    for name, cfg in configs.items():
        log.info("bench: setting up ref=%s", name)
        ref, setup, policy = build_regime(cfg, pieces)
        c = ref.cost()
        refs[name] = ref
        own = own_bytes(policy if policy is not None else full_model, float(c.bytes_held))
        costs[name] = RegimeCost(
            name,
            setup,
            float(c.bytes_held),
            float(c.cache_bytes),
            own,
            bf16_copy_bytes=float(bf16_copy_bytes(ref.ctx)),
            bytes_held_quantized_embeddings=quantized_embeddings_bytes(cfg, ref),
        )
        del policy
    del full_model
    log.info("bench: timing %d reference calls per regime, interleaved", repeats)
    with torch.no_grad():
        times = interleaved({n: (lambda r=r: r.logprobs(batch)) for n, r in refs.items()}, repeats)
    for n, t in times.items():
        costs[n].step_s = t
    for n, ref in refs.items():
        if ref.prefetches:
            log.info("bench: ref=%s asked on the spot and ahead", n)
            costs[n].spot_step_s, costs[n].ahead_step_s = prefetch_cost(ref, pieces.load(), batch)
    return list(costs.values()), refs


def prefetch_cost(ref, policy: torch.nn.Module, batch: TokenBatch) -> tuple[float, float]:
    """A far reference's wait per training step, one pair a step (the batch's pairs in turn): asked when training
    needs it, then asked ahead (:meth:`~ablate.refs.base.Reference.prefetch`) while the policy does a step's own work,
    a forward and backward on the pair. Mean seconds a training call waited, on the spot and ahead."""
    half = batch.input_ids.shape[0] // 2
    steps = [
        TokenBatch(*(t[[i, i + half]] for t in (batch.input_ids, batch.attention_mask, batch.completion_mask)))
        for i in range(half)
    ]

    def work(step: TokenBatch) -> None:
        policy.zero_grad(set_to_none=True)
        policy(input_ids=step.input_ids, attention_mask=step.attention_mask).logits.float().logsumexp(
            -1
        ).mean().backward()

    def waits() -> float:
        total = 0.0
        for step in steps:
            work(step)
            t0 = time.perf_counter()
            ref.logprobs(step)
            total += time.perf_counter() - t0
        return total / len(steps)

    spot = waits()  # nothing handed over: every row asked when the call comes
    ref.prefetch(steps)
    return spot, waits()


def audit_cost(full_ref, policy, batch: TokenBatch, precision: str, repeats: int) -> dict[str, float]:
    """The evaluator's exact KL (the judge's forward in ``eval.precision``, then its logits normalised with a
    float64 log-softmax and KL summed over the vocabulary in float64, a chunk of response positions at a
    time: ``ablate.eval.kl.audit_terms``) against one reference forward as training makes it."""
    from ablate.eval import kl as klm
    from ablate.models.precision import autocast, unwrapped_forward
    from ablate.refs.model_backed import next_token_logits

    device = batch.input_ids.device
    mask, tokens = batch.target_mask, batch.input_ids[:, 1:]

    def policy_forward():
        with torch.no_grad(), unwrapped_forward(policy), autocast(device, precision):
            return next_token_logits(policy, batch)

    pol = policy_forward()

    def audit(p: str = precision):
        with torch.no_grad(), autocast(device, p):
            judge = next_token_logits(full_ref.model, batch)
        return klm.sequence_sum(klm.audit_terms(pol, judge, tokens, mask).kl, mask)

    with torch.no_grad():
        t = interleaved(
            {
                "forward": lambda: full_ref.logprobs(batch),
                "audit": audit,
                "audit_bf16": lambda: audit("bf16"),
                "policy_forward": policy_forward,
            },
            repeats,
        )
    return {
        "ref_forward_s": t["forward"],
        "audit_s": t["audit"],
        "audit_bf16_ratio": t["audit_bf16"] / t["forward"],
        "audit_with_policy_s": t["audit"] + t["policy_forward"],
        "audit_ratio": t["audit"] / t["forward"],
        "audit_with_policy_ratio": (t["audit"] + t["policy_forward"]) / t["forward"],
    }
