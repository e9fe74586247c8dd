"""SimPO (Meng et al. 2024): a reference-free preference loss on length-normalised log-probs, with a margin.

    loss = -log sigmoid(beta / |y_w| * log pi(y_w) - beta / |y_l| * log pi(y_l) - gamma)

with its own beta (about 2-2.5, not DPO's 0.1) and a target reward margin gamma (gamma / beta about 0.5).

How it runs inside TRL's ``DPOTrainer``: TRL's ``sigmoid_norm`` loss is

    -log sigmoid(beta * ((log pi(y_w) - ref_w) / |y_w| - (log pi(y_l) - ref_l) / |y_l|))

(lengths = completion tokens, at least 1). With SimPO's beta, ``ref_l = 0`` and ``ref_w = (gamma / beta) * |y_w|``
this is SimPO's loss exactly: the margin enters as a log-ratio offset of gamma / beta, which is also where
TRL's ``CPOTrainer`` puts it (``loss_type="simpo"``: ``logits - simpo_gamma / beta``). :func:`margin_reference`
gives those two "reference" values; :func:`simpo_loss` is the formula itself, for tests and checks.
A side effect to know when reading the logs: TRL's ``rewards/*`` metrics are ``beta * (log pi(y) - ref)``, so
under SimPO ``rewards/chosen`` (and ``rewards/margins``) include ``-gamma * |y_w|``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class SimPOParams:
    """SimPO's inverse temperature ``beta`` and target reward margin ``gamma``."""

    beta: float
    gamma: float


def completion_lengths(completion_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """|y_w|, |y_l| of a DPO batch laid out [chosen; rejected], counted as TRL's ``sigmoid_norm`` counts them."""
    lengths = completion_mask.sum(dim=1).clamp(min=1).float()
    chosen, rejected = lengths.chunk(2, dim=0)
    return chosen, rejected


def simpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    chosen_len: torch.Tensor,
    rejected_len: torch.Tensor,
    params: SimPOParams,
) -> torch.Tensor:
    """Per-pair SimPO loss from summed response log-probs and response lengths."""
    reward_w = params.beta * chosen_logps / chosen_len
    reward_l = params.beta * rejected_logps / rejected_len
    return -F.logsigmoid(reward_w - reward_l - params.gamma)


def margin_reference(completion_mask: torch.Tensor, params: SimPOParams) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(ref_chosen_logps, ref_rejected_logps)`` that turn TRL's ``sigmoid_norm`` loss (run with SimPO's
    beta) into SimPO's loss: ``(gamma / beta) * |y_w|`` and 0."""
    chosen_len, rejected_len = completion_lengths(completion_mask)
    return chosen_len * (params.gamma / params.beta), torch.zeros_like(rejected_len)
