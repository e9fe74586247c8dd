"""``ref=ema``: the reference follows the policy, ref <- (1 - alpha) ref + alpha policy every ``tau`` steps
(TR-DPO's soft update). Needs full fine-tuning: with an adapter the policy's weights are not the
reference's weights.

When the reference is updated is shared with ``ref=snapshot`` (:class:`MovingRefConfig`): by default ``tau`` is a
fraction of the run (``tau_fraction`` of ``algo.max_steps``, settled when the config is validated), so a run of
any length updates; a ``tau`` that leaves no update before the end (the reference would equal ``ref=full``) is
refused unless ``allow_no_update``. ``ref=trdpo_soft`` is this regime with TR-DPO's alpha and tau-to-run ratio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ablate.config import RefConfig, require, require_count_or_none
from ablate.errors import ConfigError
from ablate.refs.base import register
from ablate.refs.model_backed import ModelReference

# TR-DPO (Gorbatovski et al. 2024) as TRL maps it (PR #5078, from the paper's tables): alpha 0.6, tau 512 optimiser
# steps, one epoch. 512 steps is about 0.4 of an epoch of Anthropic-HH (about 161k pairs, about 1,250 steps at a
# batch of 128) and about 0.7 of one of TL;DR (about 93k pairs): the presets take 0.4, two updates a run.
TRDPO_ALPHA = 0.6
TRDPO_TAU_FRACTION = 0.4


@dataclass
class MovingRefConfig(RefConfig):
    """When a reference that follows the policy (ema, snapshot) is updated: after every ``tau`` optimiser steps
    but the last."""

    tau: int | None = None  # update every tau optimiser steps; None: tau_fraction of algo.max_steps (at validation)
    tau_fraction: float = 0.2  # tau = max(1, floor(tau_fraction * algo.max_steps)): 4 updates in 10 or 40 steps
    allow_no_update: bool = False  # accept a tau that leaves no update before the end (the reference equals full)

    def __post_init__(self) -> None:
        require_count_or_none("ref.tau", self.tau)
        require(0 < self.tau_fraction <= 1, f"ref.tau_fraction must be in (0, 1], got {self.tau_fraction}")


@dataclass
class EmaRefConfig(MovingRefConfig):
    name: str = "ema"
    alpha: float = TRDPO_ALPHA  # TR-DPO's common choice

    def __post_init__(self) -> None:
        super().__post_init__()
        require(0.0 <= self.alpha <= 1.0, f"ref.alpha must be in [0, 1], got {self.alpha}")


def tau_for(fraction: float, max_steps: int) -> int:
    """The update interval that is ``fraction`` of a run of ``max_steps`` optimiser steps: its whole steps, at
    least 1 (so for a fraction below 1, any run of 2 steps or more updates at least once)."""
    return max(1, math.floor(fraction * max_steps + 1e-9))  # 1e-9: 0.29 * 100 is 28.999...


def updates_in(tau: int, max_steps: int) -> int:
    """How many updates a run of ``max_steps`` optimiser steps makes: after steps tau, 2 tau, ..., never after the
    last one (:class:`ablate.callbacks.ReferenceStepCallback`); the same count for DPO, PPO and GRPO, whose
    ``algo.max_steps`` all count optimiser steps (PPO: rollout batches)."""
    return (max_steps - 1) // tau


def _policy_params(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    model = policy.module if hasattr(policy, "module") else policy
    return dict(model.named_parameters())


@register(EmaRefConfig)
class EmaReference(ModelReference):
    rank = 80
    EXTRA_DOCS = {
        "updates": "times the reference was updated from the policy during training",
        "tau": "the update interval in force, in optimiser steps (set directly or from ref.tau_fraction)",
    }
    updates: int = 0

    @classmethod
    def resolve(cls, cfg) -> None:
        """``tau=None``: ``tau_fraction`` of ``algo.max_steps`` (:func:`tau_for`)."""
        if cfg.ref.tau is None:
            cfg.ref.tau = tau_for(cfg.ref.tau_fraction, cfg.algo.max_steps)

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.model.adapter.enabled:
            raise ConfigError(
                f"ref={cls.name} updates the reference from the policy's weights, which needs full "
                f"fine-tuning: drop model.adapter.enabled=true (or use ref=shared)"
            )
        tau, steps = cfg.ref.tau, cfg.algo.max_steps
        if updates_in(tau, steps) == 0 and not cfg.ref.allow_no_update:
            raise ConfigError(
                f"ref={cls.name} would never update: it equals full (an update every ref.tau={tau} steps, none "
                f"after the last of algo.max_steps={steps}): lower ref.tau (or null: ref.tau_fraction of the run) "
                f"or raise algo.max_steps, or set ref.allow_no_update=true"
            )

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self._cost.extra["updates"] = 0
        if cfg.tau is not None:  # the interval in force (config.yaml keeps tau=null when a fraction set it)
            self._cost.extra["tau"] = cfg.tau

    @property
    def tau(self) -> int:
        """The update interval, in optimiser steps (settled from ``tau_fraction`` when the config is validated)."""
        require(
            self.cfg.tau is not None,
            f"ref.tau=null is settled when the config is validated (ablate.validation.validate): build "
            f"ref={self.name} with tau set",
        )
        return self.cfg.tau

    def step(self, policy: torch.nn.Module, step: int) -> None:
        if step % self.tau:
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


@dataclass
class TrdpoSoftRefConfig(EmaRefConfig):
    name: str = "trdpo_soft"
    alpha: float = TRDPO_ALPHA
    tau_fraction: float = TRDPO_TAU_FRACTION


@register(TrdpoSoftRefConfig)
class TrdpoSoftReference(EmaReference):
    """``ref=trdpo_soft``: ``ref=ema`` with TR-DPO's settings, alpha 0.6 every 0.4 of the run (see above)."""

    rank = 110
    variant_of = "ema"  # TR-DPO's settings of ema: not a sweep point of its own
