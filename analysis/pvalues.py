"""The p-values beside each verdict, from the very intervals the verdict reads.

Each interval method of a comparison (:mod:`analysis.equivalence`) is also a test:

- ``p_diff``: the two-sided test of no difference. A t interval's p is the t distribution's; a percentile bootstrap's
  is twice the smaller share of its replicates on either side of 0, so its ``1 - alpha`` percentile interval excludes
  0 when p is below alpha (0 when no replicate is: below ``1 / n_boot``, which the bootstrap cannot resolve; with two
  seeds or more the union's t tests then give the p, and the report's Holm adjustment is not capped by the number of
  replicates);
- ``p_tost``: the two one-sided tests of equivalence, the larger of the two p-values at ``-margin`` and ``+margin``
  (t: the t distribution; bootstrap: the shares of replicates at or beyond each margin), so its ``1 - 2 alpha``
  interval lies inside the margins when p is below alpha.

A verdict rests on the union of its methods' intervals, so it rejects only where every method does: the union's p
is the largest of its methods' p (:func:`union`). Over a report, the tests of difference are a family: Holm's
step-down adjustment (``statsmodels``) keeps the chance of any false "different" at alpha (:func:`holm`). An
equivalence verdict is one TOST per comparison; a claim of equivalence on several metrics at once is the
intersection-union test, whose p is the largest of its TOSTs' p and needs no adjustment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats
from statsmodels.stats.multitest import multipletests

NAN = float("nan")
MOST_SEEDS = 64  # power: the seeds counted looks no further


@dataclass(frozen=True)
class TTest:
    """A t test of a mean: ``mean`` with standard error ``se`` on ``df`` degrees of freedom."""

    mean: float
    se: float
    df: float

    def p(self, margin: float) -> tuple[float, float]:
        """``(p_diff, p_tost)``; NaN where the test does not apply (no se; no finite margin for p_tost)."""
        if not (math.isfinite(self.mean) and math.isfinite(self.se) and self.df > 0):
            return NAN, NAN
        if self.se == 0:  # every value the same: the mean is exact
            p_diff = float(self.mean == 0)
            return p_diff, float(not abs(self.mean) < margin) if math.isfinite(margin) else NAN
        p_diff = float(2 * stats.t.sf(abs(self.mean) / self.se, self.df))
        if not math.isfinite(margin):
            return p_diff, NAN
        lower = stats.t.sf((self.mean + margin) / self.se, self.df)  # H0: difference <= -margin
        upper = stats.t.cdf((self.mean - margin) / self.se, self.df)  # H0: difference >= +margin
        return p_diff, float(max(lower, upper))


@dataclass(frozen=True)
class BootTest:
    """A percentile bootstrap's replicates of the difference, read as a test."""

    reps: np.ndarray

    def p(self, margin: float) -> tuple[float, float]:
        r = np.asarray(self.reps, dtype=float)
        r = r[np.isfinite(r)]
        if not len(r):
            return NAN, NAN

        def share(k) -> float:
            return int(k) / len(r)

        p_diff = min(1.0, 2 * min(share((r <= 0).sum()), share((r >= 0).sum())))
        if not math.isfinite(margin):
            return p_diff, NAN
        return p_diff, max(share((r <= -margin).sum()), share((r >= margin).sum()))


def seed_t(per_seed) -> TTest | None:
    """The seed-level t test of the per-seed means (None with fewer than two seeds)."""
    means = [float(np.mean(x[np.isfinite(x)])) for x in map(np.asarray, per_seed) if np.isfinite(x).any()]
    if len(means) < 2:
        return None
    return TTest(float(np.mean(means)), float(np.std(means, ddof=1)) / math.sqrt(len(means)), len(means) - 1)


def union(tests, margin: float) -> tuple[float, float]:
    """The union's ``(p_diff, p_tost)``: each the largest of its methods' (NaN where none applies)."""
    ps = [t.p(margin) for t in tests if t is not None]
    diff = [p for p, _ in ps if math.isfinite(p)]
    tost = [p for _, p in ps if math.isfinite(p)]
    return (max(diff) if diff else NAN), (max(tost) if tost else NAN)


def holm(pvalues) -> list[float]:
    """Holm's step-down adjustment over the finite p-values (``statsmodels``'s ``multipletests``); NaN stays NaN."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(len(p), NAN)
    finite = np.isfinite(p)
    if finite.any():
        out[finite] = multipletests(p[finite], method="holm")[1]
    return out.tolist()


def tost_power(sd: float, n: int, margin: float, diff: float = 0.0, alpha: float = 0.05) -> float:
    """Approximate power of TOST with ``n`` paired seeds whose differences have sd ``sd`` (see the module)."""
    if n < 2 or not (sd >= 0 and margin > 0) or not math.isfinite(sd):
        return math.nan
    if sd == 0:
        return 1.0 if abs(diff) < margin else 0.0
    se, df = sd / math.sqrt(n), n - 1
    t = stats.t.ppf(1 - alpha, df)
    p = stats.nct.sf(t, df, (diff + margin) / se) + stats.nct.cdf(-t, df, (diff - margin) / se) - 1
    return max(0.0, float(p))


def seeds_needed(sd: float, margin: float, diff: float = 0.0, alpha: float = 0.05, power: float = 0.8) -> float:
    """The fewest seeds (2 to :data:`MOST_SEEDS`) whose TOST power reaches ``power``; inf when none does (a true
    difference at or beyond the margin never becomes equivalent); NaN without an sd."""
    if not math.isfinite(sd) or not margin > 0:
        return math.nan
    for n in range(2, MOST_SEEDS + 1):
        if tost_power(sd, n, margin, diff, alpha) >= power:
            return float(n)
    return math.inf
