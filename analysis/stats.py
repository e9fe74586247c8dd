"""Aggregation over seeds and paired comparison with a baseline regime.

Intervals are Student-t 95% intervals of the mean over seeds (n - 1 degrees of freedom); with n < 2
there is no interval (NaN). The comparison with ``full`` pairs runs by seed (same seed: same preference
pairs, same evaluation prompts and sampling seed), so each regime's effect is the mean of per-seed
differences, tested with a paired t-test; the effect size is Cohen's d_z (mean difference / its standard
deviation); p-values are also Holm-adjusted over the regimes compared for one metric. A difference is
claimed only when the adjusted p < alpha; otherwise the table says there is no evidence either way.

Positive quantities (KL, log-prob errors, bytes, times, perplexity, lengths: :func:`is_positive`) get an
interval that never crosses zero (:func:`positive_interval`): the geometric mean over seeds with a Student-t
interval on the log scale, back-transformed; where a seed's value is exactly 0 (no log), the arithmetic mean
with a percentile bootstrap over seeds, which stays within the values' range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from ablate.tracking import schema
from analysis.bootstrap import rng_for, seed_percentile
from analysis.pvalues import holm

ALPHA = 0.05
#: units of quantities that cannot be negative
POSITIVE_UNITS = ("nats per response", "nats per token", "bytes", "ms", "s", "perplexity", "tokens")
#: keys in those units whose estimator can be negative
SIGNED = ("kl_true_k1", "kl_penalty_err_mean")
METHOD_T = "t"
METHOD_LOG_T = "geometric mean, t on the log scale"
METHOD_ZERO = "arithmetic mean, percentile bootstrap over seeds (a value is 0: no log scale)"


@dataclass
class Interval:
    mean: float
    std: float
    n: int
    lo: float
    hi: float
    method: str = METHOD_T  # how the mean and the interval were made


def t_interval(values, confidence: float = 0.95) -> Interval:
    """Mean, sample standard deviation and t interval of the finite values (NaNs are not data)."""
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    n = len(x)
    if n == 0:
        return Interval(math.nan, math.nan, 0, math.nan, math.nan)
    mean = float(x.mean())
    if n < 2:
        return Interval(mean, math.nan, 1, math.nan, math.nan)
    std = float(x.std(ddof=1))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * std / math.sqrt(n)
    return Interval(mean, std, n, mean - half, mean + half)


def is_positive(column: str) -> bool:
    """A summary column (or its ``_step0`` copy) whose values cannot be negative, by its unit in the schema."""
    try:
        m = schema.metric(column)
    except KeyError:
        return False
    return m.unit in POSITIVE_UNITS and m.key not in SIGNED


def positive_interval(values, rng: np.random.Generator, confidence: float = 0.95) -> Interval:
    """The mean over seeds of a positive quantity with a 95% interval that never crosses zero: geometric mean
    and t interval of the logs (all values > 0); arithmetic mean and percentile bootstrap over seeds (a value
    is 0); a plain t interval, said so, if a value is negative after all. ``std`` is the values' own."""
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    n = len(x)
    if n == 0 or (x < 0).any():
        iv = t_interval(x, confidence)
        iv.method = METHOD_T if n == 0 else "t (a value is negative)"
        return iv
    std = float(x.std(ddof=1)) if n > 1 else math.nan
    if np.all(x == x[0]):  # one value, or the same in every seed: exactly that value
        lo = float(x[0]) if n > 1 else math.nan
        return Interval(float(x[0]), std, n, lo, lo, METHOD_LOG_T if x[0] > 0 else METHOD_T)
    if (x > 0).all():
        logs = t_interval(np.log(x), confidence)
        return Interval(math.exp(logs.mean), std, n, math.exp(logs.lo), math.exp(logs.hi), METHOD_LOG_T)
    mean, lo, hi = seed_percentile(x, 2000, rng, confidence)
    return Interval(mean, std, n, lo, hi, METHOD_ZERO)


def aggregate(
    runs: pd.DataFrame, metrics: list[str], by: tuple[str, ...] = ("condition", "regime"), seed: int = 0
) -> pd.DataFrame:
    """One row per group of finished runs: ``<metric>_mean/_std/_n/_lo/_hi/_method`` for each metric, plus
    ``n_runs`` and the seeds. Positive quantities get :func:`positive_interval`, the others
    :func:`t_interval`; a metric infinite in some seed gets :func:`infinite_interval` and ``<metric>_inf``, the
    number of such seeds (the column only where some group has one: 0 in the others)."""
    done = runs[runs["status"] == "finished"]
    rows = []
    for key, g in done.groupby(list(by), sort=False):
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(by, key))
        row["algo"] = ",".join(sorted(set(map(str, g["algo"])))) if "algo" in g else ""
        row["n_runs"] = len(g)
        row["seeds"] = ",".join(str(s) for s in sorted(g["seed"].dropna().astype(int).unique()))
        for m in metrics:
            values = g[m].astype(float) if m in g else pd.Series([], dtype=float)
            infinite = int(np.isinf(values).sum())
            if infinite:
                iv = infinite_interval(values)
                row[f"{m}_inf"] = infinite
            elif m not in g:
                iv = Interval(math.nan, math.nan, 0, math.nan, math.nan)
            elif is_positive(m):
                iv = positive_interval(values, rng_for(seed, "aggregate", *key, m))
            else:
                iv = t_interval(values)
            row.update({f"{m}_mean": iv.mean, f"{m}_std": iv.std, f"{m}_n": iv.n, f"{m}_lo": iv.lo, f"{m}_hi": iv.hi})
            row[f"{m}_method"] = iv.method
        rows.append(row)
    out = pd.DataFrame(rows)
    counts = [f"{m}_inf" for m in metrics if f"{m}_inf" in out]  # only where a seed was infinite
    out[counts] = out[counts].fillna(0).astype(int)
    methods = [c for c in out if c.endswith("_method")]
    return out.astype(dict.fromkeys(methods, object)).copy()  # consolidated: not one block per column


def infinite_interval(values) -> Interval:
    """The mean over seeds where some seed's value is infinite (a divergence from a reference that gave a token no
    mass): that infinity (undefined, NaN, where seeds disagree in sign), ``n`` every seed with a number, no
    interval; the method says how many seeds were infinite."""
    x = np.asarray([v for v in values if v is not None and not np.isnan(v)], dtype=float)
    inf = x[np.isinf(x)]
    if (inf > 0).all():
        mean, what = math.inf, "+inf: the mean is +inf"
    elif (inf < 0).all():
        mean, what = -math.inf, "-inf: the mean is -inf"
    else:
        mean, what = math.nan, "+inf or -inf: the mean is undefined"
    return Interval(mean, math.nan, len(x), math.nan, math.nan, f"{len(inf)} of {len(x)} seeds {what}, no interval")


def paired_vs_baseline(
    runs: pd.DataFrame,
    metric: str,
    baseline: str = "full",
    by: str = "condition",
    pair_on: str = "seed",
    alpha: float = ALPHA,
) -> pd.DataFrame:
    """Each regime against ``baseline`` on one metric, paired by seed, within each ``by`` group."""
    done = runs[runs["status"] == "finished"]
    out = []
    for group, g in done.groupby(by, sort=False):
        base = g[g["regime"] == baseline].drop_duplicates(pair_on, keep="last").set_index(pair_on)[metric].astype(float)
        rows = []
        for regime, r in g.groupby("regime", sort=False):
            if regime == baseline:
                continue
            other = r.drop_duplicates(pair_on, keep="last").set_index(pair_on)[metric].astype(float)
            both = pd.concat([base.rename("b"), other.rename("o")], axis=1, join="inner").dropna()
            d = (both["o"] - both["b"]).to_numpy()
            n = len(d)
            iv = t_interval(d)
            row = {
                by: group,
                "regime": regime,
                "metric": metric,
                "n_pairs": n,
                "baseline_mean": both["b"].mean(),
                "regime_mean": both["o"].mean(),
                "diff_mean": iv.mean,
                "diff_lo": iv.lo,
                "diff_hi": iv.hi,
                "t": math.nan,
                "p": math.nan,
                "d_z": math.nan,
                "note": "",
            }
            if n < 2:
                row["note"] = f"n={n} paired seeds: no test"
            elif np.all(d == 0):
                row["note"] = "identical to the baseline in every seed"
            elif np.std(d, ddof=1) <= 1e-9 * max(1.0, float(np.abs(d).max())):  # t undefined (rounding aside)
                row["note"] = "the same difference in every seed"
            else:
                res = stats.ttest_rel(both["o"], both["b"])
                row.update(t=float(res.statistic), p=float(res.pvalue), d_z=float(d.mean() / d.std(ddof=1)))
            rows.append(row)
        adjusted = holm([r["p"] for r in rows])
        for r, p_adj in zip(rows, adjusted):
            r["p_holm"] = p_adj
            if not r["note"]:
                r["note"] = "differs" if p_adj < alpha else "no evidence of a difference"
        out += rows
    return pd.DataFrame(out)
