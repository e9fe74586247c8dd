"""Relative metrics on the log-ratio scale: a metric whose margin is a share of the baseline's mean (true KL, length:
±10%) is compared per seed as ``log(regime's mean / baseline's mean)`` over the prompts both evaluated, and the
verdict reads the mean of those log ratios over seeds against ``±log(1 + share)``.

Why: seeds' baselines differ (``full``'s true KL ranged 1.45-2.81 nats over four DPO seeds), so an absolute
difference pools effects of different sizes, and a margin of 10% of the pooled mean treats an estimated quantity as a
constant. A log ratio is per seed, scale-free, and its interval carries the baseline's own uncertainty:

- the bootstrap redraws prompts for both runs of a seed together (the pair is kept) and recomputes both means, so the
  ratio's denominator varies as it would in another sample (the bootstrap of the ratio, not a delta-method
  approximation); seeds are drawn too (two-way where every seed shares its prompts, else prompts within each drawn
  seed, as the difference's intervals do);
- the seed-level t interval of the per-seed log ratios, whose spread includes the baseline's seed-to-seed spread.

The verdict interval is their union, end by end, as for differences (:mod:`analysis.equivalence`). A seed whose
regime or baseline mean is not positive has no log ratio: the row falls back to the difference scale and says so.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

SCALE = "log ratio"
DIFFERENCE = "difference"
# values drawn per block of resamples (bounds memory: resamples x seeds x prompts)
_BLOCK = 2_000_000


def log_margin(share: float) -> float:
    """A relative margin (``0.10``: 10%) on the log-ratio scale: ``log(1 + share)`` either side (a ratio within
    [1 / 1.1, 1.1])."""
    return math.log1p(share)


def seed_means(pairs: dict) -> dict:
    """seed -> (regime's mean, baseline's mean) over a seed's paired prompts."""
    return {k: (float(f["r"].mean()), float(f["b"].mean())) for k, f in pairs.items() if len(f)}


def applies(pairs: dict) -> bool:
    """Every seed has paired prompts and both means positive (a log ratio exists)."""
    means = seed_means(pairs)
    return bool(means) and len(means) == len(pairs) and all(r > 0 and b > 0 for r, b in means.values())


def seed_log_ratios(pairs: dict) -> dict:
    """seed -> log(regime's mean / baseline's mean)."""
    return {k: math.log(r / b) for k, (r, b) in seed_means(pairs).items()}


def estimate(pairs: dict) -> float:
    """The mean over seeds of each seed's log ratio."""
    v = list(seed_log_ratios(pairs).values())
    return float(np.mean(v)) if v else math.nan


def is_crossed(pairs: dict) -> bool:
    """Two seeds or more, every one with the first one's prompts."""
    labels = [list(f.index) for f in pairs.values()]
    return len(labels) >= 2 and all(sorted(x) == sorted(labels[0]) for x in labels[1:])


def resample(pairs: dict, n_boot: int, rng: np.random.Generator, crossed: bool) -> np.ndarray:
    """``n_boot`` bootstrap replicates of :func:`estimate`: seeds drawn with replacement and, with them, prompts (each
    drawn prompt bringing both runs' values): ``crossed``, one draw of prompts shared by every drawn seed (the two-way
    bootstrap); else a draw within each drawn seed."""
    frames = list(pairs.values())
    n_seeds = len(frames)
    out = np.empty(n_boot)
    if crossed:
        order = list(frames[0].index)
        r = np.stack([f.loc[order, "r"].to_numpy(dtype=float) for f in frames])
        b = np.stack([f.loc[order, "b"].to_numpy(dtype=float) for f in frames])
        n_prompts = r.shape[1]
        block = max(1, _BLOCK // max(1, n_seeds * n_prompts))
        for start in range(0, n_boot, block):
            k = min(block, n_boot - start)
            s = rng.integers(0, n_seeds, size=(k, n_seeds))
            p = rng.integers(0, n_prompts, size=(k, n_prompts))
            ratio = r[s[:, :, None], p[:, None, :]].mean(-1) / b[s[:, :, None], p[:, None, :]].mean(-1)
            with np.errstate(invalid="ignore", divide="ignore"):
                out[start : start + k] = np.log(ratio).mean(-1)
        return out
    drawn = rng.integers(0, n_seeds, size=(n_boot, n_seeds))
    logs = np.empty((n_boot, n_seeds))
    for j in range(n_seeds):
        for s, f in enumerate(frames):
            rows = np.flatnonzero(drawn[:, j] == s)
            if not len(rows):
                continue
            r, b = f["r"].to_numpy(dtype=float), f["b"].to_numpy(dtype=float)
            idx = rng.integers(0, len(r), size=(len(rows), len(r)))
            with np.errstate(invalid="ignore", divide="ignore"):
                logs[rows, j] = np.log(r[idx].mean(-1) / b[idx].mean(-1))
    return logs.mean(-1)


def paired_frames(regime: dict, baseline: dict) -> dict:
    """seed -> a frame (index prompt; ``r``, ``b``) of both runs' per-prompt values on the prompts both evaluated,
    finite in both, from ``seed -> Series prompt -> value`` of each."""
    out = {}
    for seed in sorted(set(regime) & set(baseline)):
        both = pd.concat([regime[seed].rename("r"), baseline[seed].rename("b")], axis=1, join="inner").astype(float)
        out[seed] = both[np.isfinite(both).all(axis=1)]
    return out
