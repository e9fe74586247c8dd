"""Scalar evaluation metrics: repetition and diversity of generated text, means with t-based confidence
intervals, and paired differences and win rates with intervals over prompts (the prompt as the unit).

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


#: a response is degenerate when at least this share of its word bigrams repeat an earlier one of its own
#: ("so happy so happy so happy" 0.6, "I love it. I love it." 0.4): the collapse an unanchored policy drifts into
DEGENERATE_REP_2 = 0.5


def degenerate_share(texts: Sequence[str], threshold: float = DEGENERATE_REP_2) -> float:
    """Share of ``texts`` whose :func:`rep_n` (bigrams) is at least ``threshold``; a text with no bigrams (one word
    or none) counts as degenerate too. nan when there are no texts."""
    if not texts:
        return NAN
    return sum(not (rep_n(t, 2) < threshold) for t in texts) / len(texts)


def perplexity(nll: Sequence[float], tokens: Sequence[float]) -> float:
    """exp of the summed negative log-likelihoods over the summed token counts (nan when there are no tokens)."""
    n = float(sum(tokens))
    return math.exp(float(sum(nll)) / n) if n > 0 else NAN


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
    return mean_ci(group_means([float(a) - float(b) for a, b in zip(policy, baseline)], groups), confidence)


def group_means(values: Sequence[float], groups: Sequence[int]) -> list[float]:
    """The mean of ``values`` within each group, in the order the groups first appear."""
    by_group: dict[int, list[float]] = {}
    for v, g in zip(values, groups, strict=True):
        by_group.setdefault(g, []).append(v)
    return [mean(v) for v in by_group.values()]


def win_score(policy: float, opponent: float) -> float:
    """One comparison's score: 1 for a win, 0.5 for a tie, 0 for a loss; NaN when either score is NaN."""
    if math.isnan(policy) or math.isnan(opponent):
        return NAN
    return 1.0 if policy > opponent else 0.5 if policy == opponent else 0.0


def win_rate_by_group(
    policy: Sequence[float], opponent: Sequence[float], groups: Sequence[int], confidence: float = 0.95
) -> dict[str, float]:
    """The win rate of ``policy`` over ``opponent`` (independent samples; ties count half) with a Student-t interval
    that treats the group (the prompt) as the unit: each group's mean score is one observation."""
    if not len(policy) == len(opponent) == len(groups):
        raise ValueError(f"length mismatch: {len(policy)} policy, {len(opponent)} opponent, {len(groups)} groups")
    rate, lo, hi = mean_ci(group_means([win_score(a, b) for a, b in zip(policy, opponent)], groups), confidence)
    return {"win_rate": rate, "win_rate_lo": lo, "win_rate_hi": hi}


def rows_of(columns: dict[str, Sequence]) -> list[dict]:
    """Equal-length columns as rows (dicts in the columns' order); unequal lengths raise ``ValueError``."""
    lengths = {len(v) for v in columns.values()}
    if len(lengths) > 1:
        raise ValueError(f"columns of unequal lengths: { {k: len(v) for k, v in columns.items()} }")
    return [dict(zip(columns, values)) for values in zip(*columns.values())]
