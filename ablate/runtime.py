"""Process-level settings applied once at start-up."""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: blocks this large or larger are mapped on their own and unmapped on free; the heap's free top is kept up to it
THRESHOLD_BYTES = 32 << 20


def tune_allocator() -> bool:
    """Fix glibc malloc's mmap and trim thresholds at 32 MiB (:data:`THRESHOLD_BYTES`), from the start.

    glibc's default adapts both as blocks are freed (the mmap threshold up to 32 MiB, trimming at twice it), so
    large blocks are mapped and unmapped, and the heap trimmed, step after step, which costs kernel time. Much higher
    thresholds fix that but put every smaller block (logits tiles, gradients, optimiser state) on the heap, which
    fragments and raises the peak. At 32 MiB smaller blocks stay in the heap, larger ones are mapped and returned
    whole, and at most 32 MiB of free heap top is kept (what was measured: docs/measured.md). Returns whether both
    were set.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, THRESHOLD_BYTES) and libc.mallopt(_M_TRIM_THRESHOLD, THRESHOLD_BYTES)
        return bool(ok)
    except (OSError, AttributeError):  # not glibc (e.g. musl)
        return False
