"""Where a run's numbers come from: the code's git commit, package versions, the machine."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGES = ("ablate", "torch", "transformers", "trl", "peft", "accelerate", "bitsandbytes", "hydra-core", "wandb")


def git_commit(path: Path | None = None) -> str:
    """``<sha>`` (``+dirty`` with uncommitted changes) of the checkout holding the code, or ``unknown``
    (an installed wheel, no git)."""
    where = path or Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = "not installed"
    return out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware() -> dict[str, str | int]:
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0
    hw: dict[str, str | int] = {"cpu": cpu_model(), "cores": cores, "torch_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        hw["gpu"] = torch.cuda.get_device_name(0)
    return hw


def provenance() -> dict:
    """The code, libraries and machine, and how many processes the job ran on (``world_size``: 1 unless launched
    with ``accelerate launch`` / ``torchrun``)."""
    from ablate.distributed import world_size

    return {"git_commit": git_commit(), "versions": versions(), "hardware": hardware(), "world_size": world_size()}
