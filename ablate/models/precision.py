"""Compute precision: bf16 autocast over fp32 weights, or plain fp32, and a way around Accelerate's wrapper."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def is_bf16(precision: str) -> bool:
    """Whether ``precision`` (``model.precision``, ``eval.precision``: bf16 | fp32) asks for bf16 autocast."""
    return precision == "bf16"


def autocast(device: torch.device, precision: str):
    """bf16 autocast when asked for; for fp32 an autocast-disabled context (so an outer bf16 one is undone)."""
    if is_bf16(precision):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return torch.autocast(device.type, enabled=False)


@contextmanager
def unwrapped_forward(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Run ``model`` with the forward it had before Accelerate wrapped it in mixed-precision autocast.

    Accelerate's ``prepare_model`` replaces ``model.forward`` with an autocast-wrapped version (keeping the
    old one as ``model._original_forward``); inside that wrapper an outer ``autocast(enabled=False)`` has no
    effect. Audits need the scoring precision they ask for, so they step around it for the duration.
    """
    original = model.__dict__.get("_original_forward")
    if original is None:
        yield model
        return
    wrapped = model.__dict__["forward"]
    model.forward = original
    try:
        yield model
    finally:
        model.forward = wrapped
