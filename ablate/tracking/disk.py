"""Bytes a job writes to storage (Linux: ``write_bytes`` of ``/proc/self/io``, charged when the process dirties
file pages, so a checkpoint pruned later still counts). Other processes (W&B's own service) are not included."""

from __future__ import annotations

from pathlib import Path

_IO = Path("/proc/self/io")
UNAVAILABLE = "this OS does not report the bytes a process writes (no /proc/self/io)"


def written_bytes() -> float | None:
    """Bytes this process has written to storage so far; None where the OS does not say."""
    try:
        for line in _IO.read_text().splitlines():
            if line.startswith("write_bytes:"):
                return float(line.split()[1])
    except OSError:
        return None
    return None
