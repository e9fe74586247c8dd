"""The report's cost section from ``python -m ablate.bench``'s CSV: what each reference holds and what it costs per
training step, measured side by side in one process (a sweep's own ``ref_ms_per_step`` comes from jobs sharing
cores, so it is not a timing)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from analysis.load import base_regime
from analysis.markdown import md_table, num

MIB = 2**20


def bench_commit(csv_path: Path) -> str:
    """The code the bench ran on, from the Markdown report written beside its CSV ('not recorded' without one)."""
    md = csv_path.with_suffix(".md")
    found = re.search(r"\bCode ([0-9a-f]{7,40})\b", md.read_text()) if md.is_file() else None
    return found.group(1) if found else "not recorded"


def step_ms(csv_path: Path) -> dict[str, float]:
    """Reference milliseconds per DPO training step of each regime the bench measured."""
    frame = pd.read_csv(csv_path).set_index("regime")
    return {str(r): 1000.0 * float(v) for r, v in frame["step_s"].items()}


def cost_lines(csv_path: Path, regimes: list[str]) -> list[str]:
    """A Markdown section: per regime of the report, the bench's bytes held (MiB; against the fp32 full reference
    and against a bf16 copy of it, 2 bytes per parameter), reference seconds per DPO step (and against full) and
    set-up seconds. A regime the bench did not measure says so."""
    frame = pd.read_csv(csv_path).set_index("regime")
    if "full" not in frame.index:
        raise ValueError(f"{csv_path}: the bench has no `full` row to compare with")
    full_bytes = float(frame.loc["full", "bytes_held"])
    bf16 = full_bytes / 2  # the full reference is held in fp32: a bf16 copy is half of it
    rows = []
    for regime in regimes:
        base = base_regime(regime)  # the bench measures each regime's defaults
        if base not in frame.index:
            rows.append([f"`{regime}`"] + ["not in the bench"] + [""] * 5)
            continue
        r = frame.loc[base]
        held = float(r["bytes_held"])
        step, step_full = float(r["step_s"]), float(frame.loc["full", "step_s"])
        rows.append(
            [
                f"`{regime}`",
                num(held / MIB),
                num(held / full_bytes),
                num(held / bf16),
                num(step),
                num(step / step_full) if step_full > 0 else "n/a",
                num(float(r["setup_s"])) if math.isfinite(float(r["setup_s"])) else "n/a",
            ]
        )
    return [
        f"## Cost, from the bench (`{csv_path}`, code {bench_commit(csv_path)})",
        "",
        "Measured side by side in one process by `python -m ablate.bench` (medians of interleaved repeats), not by "
        "the sweep's jobs, which shared their cores. Bytes: what the regime holds for the reference; the full "
        "reference is an fp32 copy, so a bf16 copy would be half of it.",
        "",
        md_table(
            ["regime", "MiB held", "vs fp32 full", "vs bf16 copy", "ref s / DPO step", "vs full", "set-up s"], rows
        ),
        "",
    ]
