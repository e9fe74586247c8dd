"""Timing on a shared, noisy machine: interleave the things compared, repeat, take medians; and the
machine's own matmul ceiling to compare throughput with."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def interleaved(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> dict[str, float]:
    """Median seconds per call of each function, calling them round-robin so drift hits all alike."""
    for _ in range(warmup):
        for f in fns.values():
            f()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def matmul_ceiling(dtype: torch.dtype, n: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of an n x n x n matmul in ``dtype`` on the CPU threads torch uses (best of ``repeats``)."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(dtype)
    b = torch.randn(n, n, generator=g).to(dtype)
    a @ b  # warm-up
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2.0 * n**3 / best


def _timed(f: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def matmul_params(model: torch.nn.Module) -> int:
    """Parameters that take part in matmuls per token: every Linear (the LM head included, tied or not);
    embedding lookups are not matmuls."""
    seen, n = set(), 0
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and id(m.weight) not in seen:
            seen.add(id(m.weight))
            n += m.weight.numel()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and id(head.weight) not in seen and not isinstance(head, torch.nn.Linear):
        n += head.weight.numel()
    return n
