"""Resident memory: the process's peak, and the peak over one phase (Linux: ``VmHWM``, which writing 5 to
``/proc/self/clear_refs`` resets to the current RSS)."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

_STATUS = Path("/proc/self/status")
_CLEAR = Path("/proc/self/clear_refs")


def peak_rss_bytes() -> float:
    """This process's peak resident memory so far (a reused launcher worker carries earlier jobs' peak). Linux:
    ``VmHWM`` of this program; ``getrusage``'s maxrss is kept across ``execve``, so a job started by a large
    process (the bench) would report its parent's size at the fork. Elsewhere: ``getrusage``."""
    kib = _status_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return float(peak if sys.platform == "darwin" else peak * 1024)


def _status_kib(field: str) -> float | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return float(line.split()[1])
    except OSError:
        return None
    return None


def reset_phase_peak() -> bool:
    """Start measuring a phase's peak; False where the OS cannot (then :func:`phase_peak_bytes` is NaN)."""
    try:
        _CLEAR.write_text("5")
        return True
    except OSError:
        return False


def phase_peak_bytes(was_reset: bool) -> float:
    kib = _status_kib("VmHWM") if was_reset else None
    return kib * 1024 if kib is not None else float("nan")
