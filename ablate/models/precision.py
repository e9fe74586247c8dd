"""Compute precision: bf16 autocast over fp32 weights, or plain fp32, and a way around Accelerate's wrapper."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def is_bf16(precision: str) -> bool:
    """Whether ``precision`` (``model.precision``, ``eval.precision``: bf16 | fp32) asks for bf16 autocast."""
    return precision == "bf16"


SLOW_BF16 = 5.0  # bf16 matmuls this many times slower than fp32: the CPU has no bf16 instructions (warned of)


def bf16_slowdown(size: int = 256, repeats: int = 3) -> float:
    """How many times slower a bf16 matmul runs than an fp32 one on this CPU (best of ``repeats`` each, side by
    side). A CPU with bf16 instructions (AVX-512 BF16, AMX) runs bf16 at least as fast as fp32; one without them
    (AVX2 only) sends bf16 matmuls to ATen's reference kernel: on such a 2-core machine a 1024^3 bf16 matmul took
    60x its fp32 time (docs/measured.md)."""
    import time

    a = torch.randn(size, size)
    best = {}
    for dtype in (torch.float32, torch.bfloat16):
        x = a.to(dtype)
        x @ x  # warm-up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            x @ x
            times.append(time.perf_counter() - t0)
        best[dtype] = min(times)
    return best[torch.bfloat16] / max(best[torch.float32], 1e-9)


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
