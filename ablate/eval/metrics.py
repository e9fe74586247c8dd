"""Scalar evaluation metrics: win rates with Wilson intervals, repetition and
diversity of generated text, means with t-based confidence intervals, and paired
differences with intervals over prompts.

Honest-numbers rule: no metric clamps its value; a metric that cannot be
computed (empty input, too few items) returns ``float('nan')``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

import numpy as np
from scipy import stats

_WORD_RE = re.compile(r"\w+")
NAN = float("nan")


def wilson_interval(successes: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion.

    ``successes`` may be fractional (e.g. ties counted as half a win).
    Returns ``(nan, nan)`` when ``n == 0``. Raises ``ValueError`` unless
    ``0 <= successes <= n`` and ``0 < confidence < 1``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if math.isnan(successes) or successes < 0 or successes > n:
        raise ValueError(f"successes must be in [0, n={n}], got {successes}")
    if n == 0:
        return (NAN, NAN)
    z = float(stats.norm.ppf(0.5 + confidence / 2.0))
    p_hat = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p_hat + z2 / (2.0 * n)) / denom
    half = (z / denom) * math.sqrt(p_hat * (1.0 - p_hat) / n + z2 / (4.0 * n * n))
    return (centre - half, centre + half)


def win_rate(policy_scores: Sequence[float], baseline_scores: Sequence[float]) -> dict[str, float]:
    """Pairwise win rate of policy over baseline; ties count half.

    Scores are compared exactly (equal means tie). Returns ``win_rate``,
    its Wilson 95% bounds ``win_rate_lo``/``win_rate_hi``, and the counts
    ``wins``, ``ties``, ``losses``, ``n``. Empty input gives nan rate and
    interval with zero counts. Length mismatch raises ``ValueError``.
    """
    pol = list(policy_scores)
    base = list(baseline_scores)
    if len(pol) != len(base):
        raise ValueError(f"length mismatch: {len(pol)} policy vs {len(base)} baseline scores")
    wins = sum(1 for a, b in zip(pol, base) if a > b)
    ties = sum(1 for a, b in zip(pol, base) if a == b)
    n = len(pol)
    losses = n - wins - ties
    if n == 0:
        rate, lo, hi = NAN, NAN, NAN
    else:
        score = wins + 0.5 * ties
        rate = score / n
        lo, hi = wilson_interval(score, n, 0.95)
    return {
        "win_rate": rate,
        "win_rate_lo": lo,
        "win_rate_hi": hi,
        "wins": wins,
        "ties": ties,
        "losses": losses,
        "n": n,
    }


def words(text: str) -> list[str]:
    """Lowercased word tokens: maximal runs matching the regex ``\\w+``
    (Unicode letters, digits and underscore); punctuation is dropped."""
    return _WORD_RE.findall(text.lower())


def _ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """All contiguous n-grams of ``tokens`` (empty if fewer than n tokens)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def rep_n(text: str, n: int = 2) -> float:
    """Share of repeated word n-grams within one text:
    ``1 - distinct / total``. nan when the text has no n-grams."""
    grams = _ngrams(words(text), n)
    if not grams:
        return NAN
    return 1.0 - len(set(grams)) / len(grams)


def mean_rep_n(texts: Iterable[str], n: int = 2) -> float:
    """Mean of :func:`rep_n` over texts that have n-grams (nan if none)."""
    vals = [v for v in (rep_n(t, n) for t in texts) if not math.isnan(v)]
    return mean(vals)


def distinct_n(texts: Iterable[str], n: int = 2) -> float:
    """Corpus-level distinct-n: distinct n-grams over all texts divided by
    total n-grams over all texts (nan if there are none)."""
    seen: set[tuple[str, ...]] = set()
    total = 0
    for t in texts:
        grams = _ngrams(words(t), n)
        seen.update(grams)
        total += len(grams)
    if total == 0:
        return NAN
    return len(seen) / total


def mean(xs: Iterable[float]) -> float:
    """Arithmetic mean; nan for empty input."""
    arr = np.asarray(list(xs), dtype=np.float64)
    if arr.size == 0:
        return NAN
    return float(arr.mean())


def mean_ci(xs: Iterable[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """``(mean, lo, hi)`` with a two-sided Student-t interval on the mean.

    The interval is ``(nan, nan)`` when fewer than 2 values; the mean is nan
    for empty input.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    arr = np.asarray(list(xs), dtype=np.float64)
    m = mean(arr)
    k = arr.size
    if k < 2:
        return (m, NAN, NAN)
    sem = float(arr.std(ddof=1)) / math.sqrt(k)
    t = float(stats.t.ppf(0.5 + confidence / 2.0, df=k - 1))
    return (m, m - t * sem, m + t * sem)


def paired_delta(
    policy: Sequence[float], baseline: Sequence[float], groups: Sequence[int], confidence: float = 0.95
) -> tuple[float, float, float]:
    """``(mean, lo, hi)`` of ``policy - baseline`` over matched items (same prompt, same sample index, same
    noise), with a Student-t interval that treats the group (the prompt) as the unit: each group's mean
    difference is one observation, so samples of one prompt are not counted as independent."""
    if not len(policy) == len(baseline) == len(groups):
        raise ValueError(f"length mismatch: {len(policy)} policy, {len(baseline)} baseline, {len(groups)} groups")
    by_group: dict[int, list[float]] = {}
    for a, b, g in zip(policy, baseline, groups):
        by_group.setdefault(g, []).append(float(a) - float(b))
    return mean_ci([mean(d) for d in by_group.values()], confidence)


def win_rate_by_group(
    policy: Sequence[float], opponent: Sequence[float], groups: Sequence[int], confidence: float = 0.95
) -> dict[str, float]:
    """The win rate of ``policy`` over ``opponent`` (independent samples; ties count half) with a Student-t interval
    that treats the group (the prompt) as the unit: each group's mean score is one observation."""
    if not len(policy) == len(opponent) == len(groups):
        raise ValueError(f"length mismatch: {len(policy)} policy, {len(opponent)} opponent, {len(groups)} groups")
    by_group: dict[int, list[float]] = {}
    for a, b, g in zip(policy, opponent, groups):
        by_group.setdefault(g, []).append(1.0 if a > b else 0.5 if a == b else 0.0)
    rate, lo, hi = mean_ci([mean(s) for s in by_group.values()], confidence)
    return {"win_rate": rate, "win_rate_lo": lo, "win_rate_hi": hi}


def rows_of(columns: dict[str, Sequence]) -> list[dict]:
    """Equal-length columns as rows (dicts in the columns' order); unequal lengths raise ``ValueError``."""
    lengths = {len(v) for v in columns.values()}
    if len(lengths) > 1:
        raise ValueError(f"columns of unequal lengths: { {k: len(v) for k, v in columns.items()} }")
    return [dict(zip(columns, values)) for values in zip(*columns.values())]
