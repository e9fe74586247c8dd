"""The line a sweep ends with: how many jobs finished, failed, diverged or never finished (a Hydra
callback, so it runs in the launching process whatever the launcher), and the exit code that follows."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from ablate.hydra_fence import Callback
from ablate.status import OUTCOME


def job_statuses(sweep_dir: Path) -> list[tuple[str, str, str]]:
    """(status, job folder relative to the sweep, reason) for every job folder below ``sweep_dir``."""
    from ablate.status import job_dirs
    from ablate.tracking.run_dir import load_summary

    rows = []
    for d in job_dirs(sweep_dir):
        if "previous" in d.relative_to(sweep_dir).parts:
            continue
        try:
            s = load_summary(d / "summary.json")
            rows.append((s.get("status", "unknown"), str(d.relative_to(sweep_dir)), s.get("reason") or ""))
        except (OSError, json.JSONDecodeError):
            rows.append(("unfinished", str(d.relative_to(sweep_dir)), "no summary.json"))
    return rows


def final_line(sweep_dir: Path) -> tuple[str, list[str], int]:
    rows = job_statuses(sweep_dir)
    counts = Counter(status for status, _, _ in rows)
    bad = [
        f"  {status}: {name}" + (f" ({reason})" if reason else "")
        for status, name, reason in rows
        if status != "finished"
    ]
    parts = [f"{counts.get(k, 0)} {k}" for k in ("finished", "failed", "diverged", "unfinished")]
    line = f"ablate: sweep {sweep_dir}: {len(rows)} jobs: {', '.join(parts)}"
    return line, bad, len(bad)


class SweepReport(Callback):
    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        line, bad, n_bad = final_line(Path(str(config.hydra.sweep.dir)))
        for b in bad:
            print(b)
        print(line, flush=True)
        OUTCOME["not_finished"] = n_bad
