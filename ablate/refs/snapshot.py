"""``ref=snapshot``: every ``tau`` steps the reference becomes a hard copy of the policy (TR-DPO's hard update)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ablate.config import RefConfig, require
from ablate.refs.base import register
from ablate.refs.ema import EmaReference


@dataclass
class SnapshotRefConfig(RefConfig):
    name: str = "snapshot"
    tau: int = 20

    def __post_init__(self) -> None:
        require(self.tau >= 1, f"ref.tau must be >= 1, got {self.tau}")


@register(SnapshotRefConfig)
class SnapshotReference(EmaReference):
    def step(self, policy: torch.nn.Module, step: int) -> None:
        if step % self.cfg.tau == 0:
            self.update(policy, 1.0)
