"""L2 to the initial weights: a constraint that needs no reference model, an option of DPO's loss.

    term = l2_init * sum over the trained parameters of ||theta - theta_0||^2

``theta_0`` is a copy of the trained parameters taken when the trainer is built: before any update, and on a
resumed job before the checkpoint's weights are loaded (when training starts), so it is always the initial
policy. That copy is what the constraint costs in memory: a cost of the algorithm's loss, not of the
reference (``ref_bytes`` does not count it).
"""

from __future__ import annotations

import torch


class L2ToInit:
    """``weight * ||theta - theta_0||^2`` over the parameters of ``policy`` that train, ``theta_0`` copied now."""

    def __init__(self, weight: float, policy: torch.nn.Module):
        self.weight = weight
        self._init = [(p, p.detach().clone()) for p in policy.parameters() if p.requires_grad]

    @property
    def nbytes(self) -> int:
        """Bytes held by the copy of the initial parameters."""
        return sum(t.numel() * t.element_size() for _, t in self._init)

    def __call__(self) -> torch.Tensor:
        """The term, differentiable in the current parameters."""
        return self.weight * sum(((p - p0) ** 2).sum() for p, p0 in self._init)
