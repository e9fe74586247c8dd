"""``ref=shared``: the policy trains a LoRA adapter; the reference is the same weights with the adapter
disabled. No second copy of the model is held."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ablate.config import RefConfig
from ablate.errors import ConfigError
from ablate.models.logprobs import add_logprob_head, head_logprobs, next_token_logits
from ablate.models.precision import unwrapped_forward
from ablate.refs.base import Reference, TokenBatch, register
from ablate.versions import required

if TYPE_CHECKING:
    from ablate.models.prompt_cache import ChunkPrompts


@dataclass
class SharedRefConfig(RefConfig):
    name: str = "shared"


@register(SharedRefConfig)
class SharedReference(Reference):
    rank = 40
    required_packages = required("peft", "peft", "ref=shared")
    logprobs_match_distribution = True  # both are the adapter-disabled policy's
    has_distribution = True

    @classmethod
    def check_config(cls, cfg) -> None:
        if not cfg.model.adapter.enabled:
            raise ConfigError(
                "ref=shared needs a LoRA policy (the reference is the policy with its adapter "
                "disabled): add model.adapter.enabled=true"
            )

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        if ctx.policy is None or not hasattr(ctx.policy, "disable_adapter"):
            raise ConfigError("ref=shared needs the policy to be a peft model with an adapter")
        self.policy = ctx.policy
        self._cost.bytes_held = 0  # nothing beyond the policy's own weights

    @contextmanager
    def _base(self) -> Iterator[torch.nn.Module]:
        """The policy with its adapter disabled, in eval mode, outside Accelerate's autocast wrapper."""
        was_training = self.policy.training
        self.policy.eval()
        try:
            with self.policy.disable_adapter(), unwrapped_forward(self.policy), torch.no_grad():
                yield self.policy
        finally:
            self.policy.train(was_training)

    def _logprobs(self, batch: TokenBatch) -> torch.Tensor:
        add_logprob_head(self.policy.get_base_model())  # the head is the base model's, under the adapter
        batch = batch.to(self.ctx.device)
        with self._base() as model:
            return head_logprobs(model, batch)

    def _distribution(self, batch: TokenBatch) -> torch.Tensor:
        """[B, T-1, V] float32 next-token logits of the adapter-disabled policy (unnormalised log-scores)."""
        batch = batch.to(self.ctx.device)
        with self._base() as model:
            return next_token_logits(model, batch)

    def _distribution_on(self, batch: TokenBatch, prompts: ChunkPrompts) -> torch.Tensor:
        """The adapter-disabled policy on the chunk's cached prompts (:mod:`ablate.models.prompt_cache`), as the audit
        runs the judge: the SFT model's weights, so it audits to exactly the judge's figures as ``full`` does."""
        batch = batch.to(self.ctx.device)
        with self._base() as model:
            return prompts.next_token_logits(model, batch, state="adapter disabled")
