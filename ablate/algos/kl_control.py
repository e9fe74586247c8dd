"""KL coefficient control for online algorithms (PPO, GRPO).

``fixed``: beta never moves. ``adaptive``: Ziegler et al. (2019)'s proportional controller: with
``e = clip(KL / target - 1, -0.2, 0.2)``, after ``n`` steps ``beta <- beta * (1 + e * n / horizon)``.

Units: ``horizon`` counts optimiser steps (one update per PPO step; one per logged step for GRPO, with
``n`` = the logging interval), not samples as in Ziegler et al. (whose horizon of 10,000 counted episodes).
With ``horizon=100``, beta moves by at most 0.2% per step (about 22% over 100 steps at the clip).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FixedKLController:
    value: float

    def update(self, kl: float, n_steps: int = 1) -> float:
        return self.value


@dataclass
class AdaptiveKLController:
    value: float
    target: float
    horizon: int

    def update(self, kl: float, n_steps: int = 1) -> float:
        """Move beta toward the value that keeps ``kl`` at ``target``; returns the new beta.
        A NaN KL (nothing measured) leaves beta unchanged."""
        if kl != kl:  # NaN
            return self.value
        error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
        return self.value


def make_controller(kind: str, beta: float, target: float, horizon: int):
    if kind == "fixed":
        return FixedKLController(beta)
    if kind == "adaptive":
        return AdaptiveKLController(beta, target, horizon)
    raise ValueError(f"unknown KL control {kind!r} (fixed | adaptive)")
