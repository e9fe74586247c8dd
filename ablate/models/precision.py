"""Compute precision: bf16 autocast over fp32 weights, or plain fp32, and a way around Accelerate's wrapper."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def is_bf16(precision: str) -> bool:
    """Whether ``precision`` (``model.precision``, ``eval.precision``: bf16 | fp32) asks for bf16 autocast."""
    return precision == "bf16"


def native_bf16(device: torch.device) -> tuple[bool, str]:
    """Whether ``device`` computes bf16 natively, and what said so: a GPU that supports bf16 without emulation; a
    CPU with AVX-512 BF16 or AMX (x86) or with the BF16 extension (Arm), as torch's own CPU checks report them.
    Read from capability flags, not from a timing, so the same machine always gets the same answer."""
    if device.type == "cuda":
        if not torch.cuda.is_available():  # composed on a machine without the GPU it names: nothing to read
            return False, "no CUDA device visible"
        ok = torch.cuda.is_bf16_supported(including_emulation=False)
        return ok, f"{torch.cuda.get_device_name(device)}: bf16 {'supported' if ok else 'not supported'}"
    if device.type != "cpu":
        return False, f"{device.type}: no bf16 check"
    flags = cpu_bf16_flags()
    if flags is None:
        return False, f"torch {torch.__version__} does not say whether this CPU has bf16 instructions"
    have = [name for name, ok in flags.items() if ok]
    return bool(have), "CPU with " + (", ".join(have) if have else "no bf16 instructions (" + ", ".join(flags) + ")")


def cpu_bf16_flags() -> dict[str, bool] | None:
    """The CPU's bf16 instructions as torch reports them (its private checks, the only ones it has: the test
    ``test_torch_still_reports_the_cpus_bf16_instructions`` holds torch to them); None where this torch lacks them."""
    import platform

    try:
        if platform.machine().lower() in ("x86_64", "amd64", "i686", "x86"):
            return {
                "AVX-512 BF16": bool(torch.cpu._is_avx512_bf16_supported()),
                "AMX": bool(torch.cpu._is_amx_tile_supported()),
            }
        return {"BF16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())}  # Arm: the BF16 extension
    except (AttributeError, RuntimeError):
        return None


def resolve(precision: str, device: torch.device) -> tuple[str, str]:
    """``model.precision`` as the job will run it, and why: ``auto`` is bf16 where :func:`native_bf16` says so,
    else fp32 (on a CPU without bf16 instructions a bf16 matmul is many times slower than fp32); bf16 and fp32
    stay as asked."""
    if precision != "auto":
        return precision, "asked for"
    native, why = native_bf16(device)
    return ("bf16" if native else "fp32"), f"auto: {why}"


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
    effect. Audits need the scoring precision they ask for, so they step around it for the duration. Accelerate's
    private attribute: :data:`ablate.algos.trl_fence.CONTRACT` checks it at start-up.
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
