"""The bounds that apply to decoding: token-by-token generation is rarely matmul-bound.

Each decode step of a batch of ``B`` sequences multiplies every weight by ``B`` vectors (compute: about
``2 * params * B`` FLOPs) and reads every weight once plus each sequence's KV cache so far (memory:
``weight bytes + B * context * KV bytes per position``). The step can go no faster than the slower of the two
at the machine's measured matmul ceiling and memory bandwidth; :func:`decode_bound` says which one binds and
the tokens per second it allows, and sampling's measured throughput is reported as a fraction of it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch


def memory_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Bytes per second of streaming a buffer of ``nbytes`` (a sum over fp32, on the CPU threads torch uses,
    best of ``repeats``): the read bandwidth a decode step's weight and cache reads see."""
    x = torch.ones(nbytes // 4, dtype=torch.float32)
    x.sum()  # warm-up: pages touched
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * x.element_size() / best


@dataclass(frozen=True)
class DecodeBound:
    """What one decode step at batch ``batch`` costs at best, and the throughput that allows."""

    batch: int
    compute_s: float  # 2 * matmul params * batch / matmul ceiling
    memory_s: float  # (weight bytes + batch * context * KV bytes per position) / bandwidth
    tokens_per_s: float  # batch / the slower of the two
    bound: str  # "compute" or "memory": which one binds

    def as_dict(self, prefix: str) -> dict:
        return {f"{prefix}{k}": v for k, v in asdict(self).items()}


def decode_bound(
    *,
    matmul_params: int,
    weight_bytes: int,
    kv_bytes_per_pos: int,
    batch: int,
    context: float,
    ceiling_flops: float,
    bandwidth: float,
) -> DecodeBound:
    """The bound of a decode step of ``batch`` sequences whose mean context (prompt and tokens so far) is
    ``context`` positions."""
    compute_s = 2.0 * matmul_params * batch / ceiling_flops
    memory_s = (weight_bytes + batch * context * kv_bytes_per_pos) / bandwidth
    step_s = max(compute_s, memory_s)
    return DecodeBound(batch, compute_s, memory_s, batch / step_s, "compute" if compute_s >= memory_s else "memory")
