"""Peak resident memory of a short run per regime: each in its own process (``python -m ablate``, two
optimiser steps, one small evaluation), read from the run's ``summary.json`` (``peak_rss_bytes``)."""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
from pathlib import Path

from ablate.tracking.run_dir import load_summary

log = logging.getLogger(__name__)

SHORT = [
    "algo.max_steps=2",
    "eval.at_start=false",
    "eval.interval=0",
    "eval.n_prompts=2",
    "eval.samples_per_prompt=1",
    "logger=none",
    "checkpoint.interval=0",
]


def peak_rss(regime: str, overrides: list[str], threads: int | None) -> tuple[float, float, str]:
    """(peak bytes of the whole run, peak bytes while training, '' or why they are missing)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "ablate", *overrides, *SHORT, f"ref={regime}", f"hydra.run.dir={tmp}/run"]
        if threads:
            cmd.append(f"threads={threads}")
        log.info("bench: peak memory of ref=%s (a short run in its own process)", regime)
        res = subprocess.run(cmd, capture_output=True, text=True)
        f = Path(tmp) / "run" / "summary.json"
        if res.returncode != 0 or not f.is_file():
            return float("nan"), float("nan"), f"the run failed: {(res.stderr.strip().splitlines() or ['?'])[-1]}"
        return (*read_peaks(f), "")


def read_peaks(summary_path: Path) -> tuple[float, float]:
    """(peak bytes of the whole run, peak bytes while training) from a run's ``summary.json``; NaN where the
    summary holds null (strict JSON) or NaN (older runs), or lacks the training peak."""
    s = load_summary(summary_path)
    return _bytes(s["peak_rss_bytes"]), _bytes(s.get("peak_rss_train_bytes"))


def _bytes(value: float | int | None) -> float:
    """A byte count as a float; NaN for a missing one."""
    return float("nan") if value is None else float(value)
