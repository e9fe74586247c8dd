"""Hierarchical (two-level) percentile bootstrap over seeds and prompts.

The data are per-prompt values grouped by seed (a prompt's samples are averaged first: the prompt is the
unit). The estimate is the mean over seeds of each seed's mean over prompts. One resample draws as many seeds
as there are, with replacement, then, within each drawn seed, as many of its prompts as it has, with
replacement; the interval is the percentile interval of the resampled estimates. For a paired comparison the
values are per-prompt differences (regime minus baseline, same seed, same prompt), so both levels stay paired.
With one seed only the prompt level varies: the interval is then over prompts alone.

The generator is seeded from the report's seed and the comparison's name, so a report is the same every time
and one comparison's numbers do not depend on which others were computed before it.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

# values drawn per block of resamples (bounds memory: resamples x seeds x prompts)
_BLOCK = 2_000_000


@dataclass
class BootInterval:
    """The estimate with its percentile intervals at two levels (``lo``/``hi``: the wider one)."""

    estimate: float
    lo: float
    hi: float
    lo_inner: float  # the narrower level's interval (TOST's 1 - 2 alpha)
    hi_inner: float
    n_seeds: int
    n_prompts: int  # prompts over all seeds
    reps: np.ndarray | None = field(default=None, repr=False)  # the replicates (the tests' p, analysis.pvalues)


def rng_for(seed: int, *key: object) -> np.random.Generator:
    """A generator for one named computation: the report's seed and a stable hash of ``key``."""
    return np.random.default_rng([int(seed), zlib.crc32("|".join(map(str, key)).encode())])


def _clean(groups: Sequence[Sequence[float]]) -> list[np.ndarray]:
    """Each seed's finite values; seeds left with none are dropped."""
    out = []
    for g in groups:
        x = np.asarray(g, dtype=float)
        x = x[np.isfinite(x)]
        if len(x):
            out.append(x)
    return out


def estimate(groups: Sequence[Sequence[float]]) -> float:
    """The mean over seeds of each seed's mean over its prompts (NaN without data)."""
    g = _clean(groups)
    return float(np.mean([x.mean() for x in g])) if g else math.nan


def resample(groups: Sequence[Sequence[float]], n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``n_boot`` bootstrap replicates of :func:`estimate`: seeds drawn with replacement, then prompts drawn with
    replacement within each drawn seed."""
    g = _clean(groups)
    if not g:
        return np.full(n_boot, math.nan)
    sizes = np.array([len(x) for x in g])
    n_seeds, width = len(g), int(sizes.max())
    padded = np.zeros((n_seeds, width))
    for i, x in enumerate(g):
        padded[i, : len(x)] = x
    out = np.empty(n_boot)
    block = max(1, _BLOCK // (n_seeds * width))
    for start in range(0, n_boot, block):
        b = min(block, n_boot - start)
        seeds = rng.integers(0, n_seeds, size=(b, n_seeds))
        n = sizes[seeds]  # prompts of each drawn seed
        idx = (rng.random((b, n_seeds, width)) * n[..., None]).astype(np.int64)  # < n: that seed's own prompts
        values = padded[seeds[..., None], idx]
        used = np.arange(width) < n[..., None]  # a seed with fewer prompts draws only as many
        out[start : start + b] = (np.where(used, values, 0.0).sum(-1) / n).mean(-1)
    return out


def interval(
    groups: Sequence[Sequence[float]],
    n_boot: int,
    rng: np.random.Generator,
    confidence: float = 0.95,
    inner: float = 0.90,
) -> BootInterval:
    """The estimate with its ``confidence`` and ``inner`` percentile intervals from one set of resamples."""
    g = _clean(groups)
    if not g:
        return BootInterval(math.nan, math.nan, math.nan, math.nan, math.nan, 0, 0)
    reps = resample(g, n_boot, rng)
    q = np.quantile(reps, [(1 - confidence) / 2, (1 + confidence) / 2, (1 - inner) / 2, (1 + inner) / 2])
    lo, hi, lo_in, hi_in = (float(v) for v in q)
    return BootInterval(estimate(g), lo, hi, lo_in, hi_in, len(g), int(sum(len(x) for x in g)), reps)


def seed_percentile(values: Sequence[float], n_boot: int, rng: np.random.Generator, confidence: float = 0.95):
    """``(mean, lo, hi)``: percentile bootstrap of the mean over seeds (one level: no prompts). It never leaves
    the range of the values, so a non-negative quantity keeps a non-negative interval."""
    x = np.asarray([v for v in values if np.isfinite(v)], dtype=float)
    if len(x) == 0:
        return math.nan, math.nan, math.nan
    reps = x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(-1)
    lo, hi = np.quantile(reps, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(x.mean()), float(lo), float(hi)
