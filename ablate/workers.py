"""How many jobs this machine runs at once: the ``${ablate_workers:threads,gib}`` resolver that the
``parallel`` launcher preset uses for joblib's ``n_jobs``."""

from __future__ import annotations

import os
from pathlib import Path


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def usable_memory_gib() -> float:
    """Physical memory, or the cgroup's limit when it is lower (containers, SLURM allocations)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for f in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(f).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total / 2**30


def workers(threads_per_job: int | None = 2, gib_per_job: float = 6.0) -> int:
    """Jobs that fit side by side: each gets ``threads_per_job`` cores (None: 2) and ``gib_per_job`` GiB
    (at least 1)."""
    threads_per_job = 2 if threads_per_job is None else threads_per_job
    by_cores = usable_cores() // max(1, int(threads_per_job))
    by_memory = int(usable_memory_gib() // max(0.1, float(gib_per_job)))
    return max(1, min(by_cores, by_memory))


def register_resolver() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("ablate_workers"):
        OmegaConf.register_new_resolver("ablate_workers", workers)
