"""``ref=none``: no reference. Its log-probs are zero, so DPO's reference log-ratio is zero and PPO/GRPO
train without a KL term; there is no approximate KL. It composes with every algorithm the same way.

Reference-free losses and weaker constraints are options of the algorithm's loss, not of this regime:
``algo.loss_type=simpo`` (SimPO, which needs ``ref=none``), ``algo.sft_weight`` (SFT replay) and
``algo.l2_init`` (L2 to the initial weights); see ``ablate.config.DPOConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ablate.config import RefConfig
from ablate.refs.base import Reference, TokenBatch, register


@dataclass
class NoneRefConfig(RefConfig):
    name: str = "none"


@register(NoneRefConfig)
class NoReference(Reference):
    rank = 100
    has_reference = False

    def _logprobs(self, batch: TokenBatch) -> torch.Tensor:
        return torch.zeros(batch.input_ids.shape[0], batch.input_ids.shape[1] - 1, device=batch.input_ids.device)
