"""Shared machinery for regimes that hold a frozen model (full, quantised, EMA, snapshot, distilled)."""

from __future__ import annotations

import time

import torch

from ablate.refs.base import RefContext, Reference, TokenBatch, module_bytes


def freeze(model: torch.nn.Module) -> torch.nn.Module:
    """Eval mode (no dropout) and no gradients: a reference must never move or be noisy."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def add_logprob_head(model: torch.nn.Module) -> None:
    """TRL's fused LM head: per-token log-probs without materialising [B, T, V] logits; the same kernel
    TRL's trainers use for the policy, so a reference equal to the policy gives exactly equal log-probs."""
    from trl.trainer.utils import add_fused_lm_head

    if not has_logprob_head(model):
        add_fused_lm_head(model)


def has_logprob_head(model: torch.nn.Module) -> bool:
    """True when TRL's fused head is already installed (by us, or by a TRL trainer on the policy)."""
    fn = getattr(model.__dict__.get("forward"), "__func__", None)
    return fn is not None and fn.__code__.co_name == "_fused_forward"


def token_logprobs(model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """[B, T-1] log-probs of the response tokens under ``model`` (0 at non-response positions)."""
    add_logprob_head(model)
    labels = batch.input_ids.masked_fill(batch.completion_mask == 0, -100)
    with torch.no_grad():
        out = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            labels=labels,
            fused_lm_head=True,
            use_cache=False,
        )
    return out.log_probs.float()


def next_token_logits(model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """[B, T-1, V] float32 next-token logits at each position (unnormalised log-scores: no copy is made
    when the model's logits are float32; the audit normalises them in float64, a chunk at a time)."""
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
    return logits[:, :-1].float()


def next_token_logprobs(model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """[B, T-1, V] float32 next-token log-probs at each position (normalised in float32)."""
    return torch.log_softmax(next_token_logits(model, batch), dim=-1)


class ModelReference(Reference):
    """A reference that is a frozen model held in memory."""

    model: torch.nn.Module

    def __init__(self, cfg, ctx: RefContext):
        super().__init__(cfg, ctx)
        t0 = time.perf_counter()
        self.model = freeze(self.build_model())
        self._cost.setup_s = time.perf_counter() - t0
        self._cost.bytes_held = module_bytes(self.model)

    def build_model(self) -> torch.nn.Module:
        assert self.ctx.load_model is not None, "RefContext.load_model is required for model-backed references"
        return self.ctx.load_model()

    def _logprobs(self, batch: TokenBatch) -> torch.Tensor:
        return token_logprobs(self.model, batch.to(self.ctx.device))

    def _distribution(self, batch: TokenBatch) -> torch.Tensor:
        """[B, T-1, V] float32 next-token logits of the held model (unnormalised log-scores)."""
        return next_token_logits(self.model, batch.to(self.ctx.device))
