"""The seed x prompt crossed design: every seed of a sweep is evaluated on the same prompts, so a per-prompt value
``y[s, p]`` (a paired difference, regime minus baseline, same seed and prompt) has a seed effect, a prompt effect
shared by every seed, and their interaction:

    y[s, p] = mu + a[s] + b[p] + e[s, p],   Var(mean) = var_a / S + var_b / P + var_e / (S P).

The hierarchical (nested) bootstrap resamples prompts independently within each seed, as if each seed had its own
prompts: it counts the prompt effect ``S`` times too small. The seed-level t interval of the per-seed means treats the
prompt set as fixed: it leaves ``var_b / P`` out. Two intervals that hold under the crossed model:

- :func:`resample`: the two-way ("pigeonhole") bootstrap: seeds and prompts drawn with replacement independently, the
  estimate recomputed on the drawn rows and columns. Its variance is about the three terms above (the interaction
  counted up to three times: conservative); with few seeds its percentile interval is too narrow, like any
  percentile bootstrap over 3 or 4 values.
- :func:`t_bounds`: the two-way random-effects t interval: ``Var(mean)`` estimated by ``(MS_seed + MS_prompt) /
  (S P)`` from the two-way table's mean squares (each is ``var_e`` plus ``P var_a`` or ``S var_b`` in expectation, so
  the sum over-counts ``var_e / (S P)`` once: conservative, never negative) with Satterthwaite's degrees of freedom.
  With one seed it is the t interval over prompts.

:mod:`analysis.equivalence` uses their union, end by end, when the seeds share their prompts
(``tests/analysis/test_equivalence.py`` simulates the crossed model at 3, 4 and 8 seeds).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from analysis.pvalues import TTest

# values drawn per block of resamples (bounds memory: resamples x seeds x prompts)
_BLOCK = 2_000_000


def table(per_seed: dict) -> np.ndarray:
    """``[S, P]`` values (NaN where a seed lacks a prompt) from ``seed -> Series prompt -> value``, seeds in their
    order and prompts in first-seen order."""
    frame = pd.concat({k: pd.Series(v, dtype=float) for k, v in per_seed.items()}, axis=1, sort=False)
    return frame.to_numpy(dtype=float).T


def is_crossed(per_seed: dict) -> bool:
    """True when at least two seeds evaluated the same prompts (every seed's prompts are the first seed's)."""
    labels = [set(pd.Series(v).index) for v in per_seed.values()]
    return len(labels) >= 2 and all(s == labels[0] for s in labels[1:])


def estimate(values: np.ndarray) -> float:
    """The mean over seeds of each seed's mean over its finite prompts (NaN without data)."""
    means = [row[np.isfinite(row)].mean() for row in values if np.isfinite(row).any()]
    return float(np.mean(means)) if means else math.nan


def resample(values: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``n_boot`` two-way bootstrap replicates of :func:`estimate`: the seeds (rows) and the prompts (columns) drawn
    with replacement, independently; a drawn seed's mean is over its finite values among the drawn prompts."""
    n_seeds, n_prompts = values.shape
    finite = np.isfinite(values)
    filled = np.where(finite, values, 0.0)
    out = np.empty(n_boot)
    block = max(1, _BLOCK // max(1, n_seeds * n_prompts))
    for start in range(0, n_boot, block):
        b = min(block, n_boot - start)
        s = rng.integers(0, n_seeds, size=(b, n_seeds))
        p = rng.integers(0, n_prompts, size=(b, n_prompts))
        total = filled[s[:, :, None], p[:, None, :]].sum(-1)
        count = finite[s[:, :, None], p[:, None, :]].sum(-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[start : start + b] = np.nanmean(np.where(count > 0, total / count, np.nan), axis=-1)
    return out


def t_test(values: np.ndarray) -> TTest | None:
    """The two-way random-effects t test of the grand mean over the prompts every seed has (None with fewer than two
    of them): ``Var(mean)`` from ``(MS_seed + MS_prompt) / (S P)``, Satterthwaite's degrees of freedom; with one
    seed, the t test over its prompts."""
    complete = values[:, np.isfinite(values).all(0)]
    n_seeds, n_prompts = complete.shape
    if n_prompts < 2:
        return None
    mean = float(complete.mean())
    ms_prompt = n_seeds * complete.mean(0).var(ddof=1)
    if n_seeds == 1:
        var, df = ms_prompt / n_prompts, n_prompts - 1
    else:
        ms_seed = n_prompts * complete.mean(1).var(ddof=1)
        var = (ms_seed + ms_prompt) / (n_seeds * n_prompts)
        denom = ms_seed**2 / (n_seeds - 1) + ms_prompt**2 / (n_prompts - 1)
        df = (ms_seed + ms_prompt) ** 2 / denom if denom > 0 else math.inf
    return TTest(mean, math.sqrt(var), df)


def t_bounds(values: np.ndarray, level: float) -> tuple[float, float]:
    """The interval of :func:`t_test` at ``level`` (NaN where it has none)."""
    t = t_test(values)
    if t is None:
        return math.nan, math.nan
    if t.se == 0:
        return t.mean, t.mean
    half = stats.t.ppf(0.5 + level / 2, t.df) * t.se
    return t.mean - half, t.mean + half
