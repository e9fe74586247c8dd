"""``ref=ema``: the reference follows the policy, ref <- (1 - alpha) ref + alpha policy every ``tau`` steps
(TR-DPO's soft update). Needs full fine-tuning: with an adapter the policy's weights are not the
reference's weights."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ablate.config import RefConfig, require
from ablate.errors import ConfigError
from ablate.refs.base import register
from ablate.refs.model_backed import ModelReference


@dataclass
class EmaRefConfig(RefConfig):
    name: str = "ema"
    alpha: float = 0.6  # TR-DPO's common choice
    tau: int = 10  # update every tau optimiser steps

    def __post_init__(self) -> None:
        require(0.0 <= self.alpha <= 1.0, f"ref.alpha must be in [0, 1], got {self.alpha}")
        require(self.tau >= 1, f"ref.tau must be >= 1, got {self.tau}")


def _policy_params(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    model = policy.module if hasattr(policy, "module") else policy
    return dict(model.named_parameters())


@register(EmaRefConfig)
class EmaReference(ModelReference):
    updates: int = 0

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.model.adapter.enabled:
            raise ConfigError(
                f"ref={cls.name} updates the reference from the policy's weights, which needs full "
                f"fine-tuning: drop model.adapter.enabled=true (or use ref=shared)"
            )

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self._cost.extra["updates"] = 0

    def step(self, policy: torch.nn.Module, step: int) -> None:
        if step % self.cfg.tau:
            return
        self.update(policy, self.cfg.alpha)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "updates": self.updates, "weights": self.model.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.model.load_state_dict(state["weights"])
        self.updates = int(state["updates"])
        self._cost.extra["updates"] = self.updates

    @torch.no_grad()
    def update(self, policy: torch.nn.Module, alpha: float) -> None:
        src = _policy_params(policy)
        for name, p in self.model.named_parameters():
            p.lerp_(src[name].detach().to(p.dtype), alpha)  # p <- p + alpha (policy - p)
        self.updates += 1
        self._cost.extra["updates"] = self.updates
