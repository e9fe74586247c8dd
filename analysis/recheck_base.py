"""What the recheck's parts share (:mod:`analysis.recheck`, :mod:`analysis.recheck_curves`): the findings they add
to, and the float64 means they recompute with."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

PerSample = Callable[[dict], float]


def _f(v) -> float:
    return math.nan if v is None else float(v)


def per_prompt(rows: tuple[dict, ...], value: PerSample) -> dict[str, float]:
    """prompt -> the mean of ``value`` over its samples (math.fsum in float64)."""
    by: dict[str, list[float]] = {}
    for r in rows:
        by.setdefault(str(r["prompt"]), []).append(value(r))
    return {p: math.fsum(v) / len(v) for p, v in by.items()}


def mean_of(values: Iterable[float]) -> float:
    v = list(values)
    return math.fsum(v) / len(v) if v else math.nan


def agree(a: float, b: float, rtol: float) -> bool:
    """Both missing, or equal to ``rtol`` relative (1e-12 absolute near 0)."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= max(rtol * max(abs(a), abs(b)), 1e-12)


@dataclass
class Findings:
    checked: int = 0
    runs: int = 0
    rows: int = 0
    unchecked: int = 0  # runs not finished, or without samples
    errors: list[str] = field(default_factory=list)
    borderline: list[str] = field(default_factory=list)
    max_rel: float = 0.0
    max_end: float = 0.0  # the largest distance of an interval end, as a fraction of the width

    def compare(self, what: str, reported: float, recomputed: float, rtol: float) -> None:
        self.checked += 1
        if not agree(reported, recomputed, rtol):
            self.errors.append(f"{what}: reported {reported!r}, recomputed {recomputed!r}")
        elif math.isfinite(reported) and reported != recomputed:
            self.max_rel = max(self.max_rel, abs(reported - recomputed) / max(abs(reported), abs(recomputed)))
