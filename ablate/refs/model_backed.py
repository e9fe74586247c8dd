"""Shared machinery for regimes that hold a frozen model (full, quantised, EMA, snapshot, distilled)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, ClassVar

import torch

from ablate.models.logprobs import (  # noqa: F401  (re-exported: their home is ablate.models.logprobs)
    add_logprob_head,
    has_logprob_head,
    next_token_logits,
    next_token_logprobs,
    token_logprobs,
)
from ablate.refs.base import RefContext, Reference, TokenBatch, module_bytes

if TYPE_CHECKING:
    from ablate.models.prompt_cache import ChunkPrompts


def freeze(model: torch.nn.Module) -> torch.nn.Module:
    """Eval mode (no dropout) and no gradients: a reference must never move or be noisy."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


class ModelReference(Reference):
    """A reference that is a frozen model held in memory."""

    #: True for a regime whose model is the SFT model exactly as ``RefContext.load_model()`` returns it, only ever
    #: read (never updated, quantised or wrapped): it may then be handed a frozen copy the run already holds
    #: instead of loading its own (``ablate.inputs.RunInputs.ref_context``). Its cost counts the copy all the same.
    reads_sft_copy: ClassVar[bool] = False
    #: its log-probs and its distribution are the held model's (through the fused head and through the full logits)
    logprobs_match_distribution = True
    has_distribution = True

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

    def reads(self, model: torch.nn.Module) -> bool:
        return self.model is model

    def _logprobs(self, batch: TokenBatch) -> torch.Tensor:
        return token_logprobs(self.model, batch.to(self.ctx.device))

    def _distribution(self, batch: TokenBatch) -> torch.Tensor:
        """[B, T-1, V] float32 next-token logits of the held model (unnormalised log-scores)."""
        return next_token_logits(self.model, batch.to(self.ctx.device))

    def _distribution_on(self, batch: TokenBatch, prompts: ChunkPrompts) -> torch.Tensor:
        """The held model's forward on the chunk's cached prompts (:mod:`ablate.models.prompt_cache`), as the audit
        runs the judge's, so a model equal to the judge audits to exactly its figures. A subclass that computes its
        distribution otherwise (its own ``_distribution``: a quantised model scores each row alone, as training
        does) keeps its own."""
        if type(self)._distribution is not ModelReference._distribution:
            return self._distribution(batch)
        return prompts.next_token_logits(self.model, batch.to(self.ctx.device))
