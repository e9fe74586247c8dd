"""Process-level settings applied once at start-up."""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_allocator() -> bool:
    """Keep glibc malloc from returning freed activations to the OS after every step.

    By default glibc serves large blocks with mmap and unmaps them on free, so each training step
    page-faults its activations in again: measured here on SmolLM2 (8 x 100 tokens, bf16 autocast,
    AdamW) a step took 3.9 s with 1.6 s of it in the kernel, and 3.1 s with 0.5 s after this call.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30) and libc.mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1)
        return bool(ok)
    except (OSError, AttributeError):  # not glibc (e.g. musl)
        return False
