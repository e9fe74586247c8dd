"""``ref=none``: reference-free training, optionally with weaker constraints instead of an anchor.

DPO: the reference log-ratio is zero. ``loss=simpo`` trains with SimPO instead (Meng et al. 2024, see
:mod:`ablate.algos.simpo`): length-normalised log-probs with SimPO's own ``simpo_beta`` (not ``algo.beta``)
and target margin ``simpo_gamma``. PPO/GRPO: beta = 0 (``loss=simpo`` is DPO only). Weaker constraints:
``sft_weight`` adds an SFT (replay) loss on the chosen responses; ``l2_init`` adds
``l2_init * ||theta - theta_0||^2`` over the trained parameters (this keeps a copy of them, counted in
``ref_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ablate.algos.simpo import SimPOParams
from ablate.config import RefConfig, require
from ablate.refs.base import Reference, TokenBatch, register


@dataclass
class NoneRefConfig(RefConfig):
    name: str = "none"
    loss: str = "dpo"  # dpo | simpo (DPO only)
    simpo_beta: float = 2.0  # SimPO's beta (the paper uses 2-2.5); loss=simpo only, replaces algo.beta
    simpo_gamma: float = 1.0  # SimPO's target reward margin (the paper: gamma / beta about 0.5)
    sft_weight: float = 0.0
    l2_init: float = 0.0

    def __post_init__(self) -> None:
        require(self.loss in ("dpo", "simpo"), f"ref.loss must be dpo or simpo, got {self.loss!r}")
        require(self.simpo_beta > 0, f"ref.simpo_beta must be > 0, got {self.simpo_beta}")
        require(self.simpo_gamma >= 0, f"ref.simpo_gamma must be >= 0, got {self.simpo_gamma}")
        require(self.sft_weight >= 0, f"ref.sft_weight must be >= 0, got {self.sft_weight}")
        require(self.l2_init >= 0, f"ref.l2_init must be >= 0, got {self.l2_init}")


@register("none", NoneRefConfig)
class NoReference(Reference):
    has_reference = False

    def __init__(self, cfg: NoneRefConfig, ctx):
        super().__init__(cfg, ctx)
        self._init_params: list[tuple[torch.nn.Parameter, torch.Tensor]] | None = None

    @classmethod
    def check_config(cls, cfg) -> None:
        require(
            cfg.ref.loss == "dpo" or cfg.algo.name == "dpo",
            f"ref.loss={cfg.ref.loss} is a DPO loss: it does nothing with algo={cfg.algo.name} (drop it)",
        )

    def _logprobs(self, batch: TokenBatch) -> torch.Tensor:
        return torch.zeros(batch.input_ids.shape[0], batch.input_ids.shape[1] - 1, device=batch.input_ids.device)

    def dpo_loss_types(self, loss_type: str) -> tuple[list[str], list[float] | None]:
        types = ["sigmoid_norm" if self.cfg.loss == "simpo" else loss_type]
        if self.cfg.sft_weight > 0:
            return types + ["sft"], [1.0, self.cfg.sft_weight]
        return types, None

    def simpo(self) -> SimPOParams | None:
        """SimPO's beta and margin when DPO trains with ``loss=simpo``, else None."""
        if self.cfg.loss != "simpo":
            return None
        return SimPOParams(beta=self.cfg.simpo_beta, gamma=self.cfg.simpo_gamma)

    def extra_loss(self, policy: torch.nn.Module) -> torch.Tensor | None:
        if self.cfg.l2_init <= 0:
            return None
        if self._init_params is None:  # first call: before the first update, the parameters are theta_0
            self._init_params = [(p, p.detach().clone()) for p in policy.parameters() if p.requires_grad]
            self._cost.bytes_held = sum(t.numel() * t.element_size() for _, t in self._init_params)
        return self.cfg.l2_init * sum(((p - p0) ** 2).sum() for p, p0 in self._init_params)
