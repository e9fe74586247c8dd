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
    return list(costs.values()), refs


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
