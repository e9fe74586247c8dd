"""``model.precision=auto``: settled from the machine's capability flags when the job is validated."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch

from ablate.compose import compose
from ablate.models.precision import SLOW_BF16, bf16_slowdown, cpu_bf16_flags, native_bf16, resolve
from ablate.validation import validate

CPU = torch.device("cpu")


def cpuinfo_flags() -> set[str] | None:
    path = Path("/proc/cpuinfo")
    if not path.is_file():
        return None
    for line in path.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return None


def test_torch_still_reports_the_cpus_bf16_instructions():
    """The private checks :func:`cpu_bf16_flags` reads exist in the installed torch, and on an x86 Linux host
    agree with the kernel's own flags (a torch that renamed them would make auto fall back to fp32 everywhere)."""
    flags = cpu_bf16_flags()
    assert flags is not None, f"torch {torch.__version__} no longer reports the CPU's bf16 instructions"
    kernel = cpuinfo_flags()
    if kernel is None or platform.machine() != "x86_64":
        pytest.skip("no /proc/cpuinfo flags on this x86 host")
    assert flags == {"AVX-512 BF16": "avx512_bf16" in kernel, "AMX": "amx_tile" in kernel}


def test_auto_is_settled_when_the_job_is_validated_and_an_explicit_choice_stays():
    native, why = native_bf16(CPU)
    want = "bf16" if native else "fp32"
    assert resolve("auto", CPU) == (want, f"auto: {why}")
    for asked, got in (("auto", want), ("bf16", "bf16"), ("fp32", "fp32")):
        cfg = compose("model=tiny", f"model.precision={asked}", "model.device=cpu")
        validate(cfg)
        assert cfg.model.precision == got


def test_auto_never_picks_bf16_where_a_bf16_run_would_be_warned_of_as_slow():
    """What the flags promise, measured loosely (a shared machine's timing is noisy): where auto picks bf16, a bf16
    matmul is not the many times slower one of a CPU without bf16 instructions (0.3-0.5x fp32's on an AVX-512 BF16
    host alone, 60x on an AVX2-only one: docs/measured.md)."""
    if resolve("auto", CPU)[0] != "bf16":
        pytest.skip("auto picks fp32 here")
    assert bf16_slowdown(size=512) < 2 * SLOW_BF16
