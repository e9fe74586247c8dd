"""``ref=snapshot``: every ``tau`` steps the reference becomes a hard copy of the policy (TR-DPO's hard update).
``tau`` defaults to a fraction of the run, as for ``ref=ema`` (:class:`ablate.refs.ema.MovingRefConfig`);
``ref=trdpo_hard`` is this regime with TR-DPO's tau-to-run ratio."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ablate.refs.base import register
from ablate.refs.ema import TRDPO_TAU_FRACTION, EmaReference, MovingRefConfig


@dataclass
class SnapshotRefConfig(MovingRefConfig):
    name: str = "snapshot"


@register(SnapshotRefConfig)
class SnapshotReference(EmaReference):
    rank = 90

    def step(self, policy: torch.nn.Module, step: int) -> None:
        if step % self.tau == 0:
            self.update(policy, 1.0)


@dataclass
class TrdpoHardRefConfig(SnapshotRefConfig):
    name: str = "trdpo_hard"
    tau_fraction: float = TRDPO_TAU_FRACTION


@register(TrdpoHardRefConfig)
class TrdpoHardReference(SnapshotReference):
    """``ref=trdpo_hard``: ``ref=snapshot`` every 0.4 of the run, TR-DPO's tau 512 to its run length."""

    rank = 120
    variant_of = "snapshot"  # TR-DPO's settings of snapshot: not a sweep point of its own
