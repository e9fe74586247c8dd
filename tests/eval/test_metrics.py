"""Tests for ablate.eval.metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from ablate.eval.metrics import (
    distinct_n,
    mean,
    mean_ci,
    mean_rep_n,
    paired_delta,
    rep_n,
    wilson_interval,
    win_rate,
    words,
)

Z95 = 1.959963984540054  # standard normal 0.975 quantile


def _wilson_closed_form(s: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Independent textbook form: (s + z^2/2 -+ z*sqrt(s(n-s)/n + z^2/4)) / (n + z^2)."""
    root = z * math.sqrt(s * (n - s) / n + z * z / 4)
    return ((s + z * z / 2 - root) / (n + z * z), (s + z * z / 2 + root) / (n + z * z))


def test_wilson_8_of_10_known_values() -> None:
    lo, hi = wilson_interval(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-4)
    assert hi == pytest.approx(0.9433, abs=1e-4)
    elo, ehi = _wilson_closed_form(8, 10)
    assert lo == pytest.approx(elo, abs=1e-12)
    assert hi == pytest.approx(ehi, abs=1e-12)


def test_wilson_extremes_and_fractional() -> None:
    lo, hi = wilson_interval(0, 10)
    assert lo == pytest.approx(0.0, abs=1e-12)
    assert hi == pytest.approx(_wilson_closed_form(0, 10)[1], abs=1e-12)
    lo, hi = wilson_interval(2.5, 7)
    elo, ehi = _wilson_closed_form(2.5, 7)
    assert (lo, hi) == (pytest.approx(elo, abs=1e-12), pytest.approx(ehi, abs=1e-12))


def test_wilson_other_confidence_is_narrower() -> None:
    lo90, hi90 = wilson_interval(8, 10, confidence=0.90)
    elo, ehi = _wilson_closed_form(8, 10, z=1.6448536269514722)
    assert lo90 == pytest.approx(elo, abs=1e-12)
    assert hi90 == pytest.approx(ehi, abs=1e-12)


def test_wilson_n0_is_nan() -> None:
    lo, hi = wilson_interval(0, 0)
    assert math.isnan(lo) and math.isnan(hi)


@pytest.mark.parametrize("s,n", [(-1, 10), (11, 10), (0.5, 0), (float("nan"), 3)])
def test_wilson_invalid_successes_raise(s: float, n: int) -> None:
    with pytest.raises(ValueError):
        wilson_interval(s, n)


def test_win_rate_counts_with_ties() -> None:
    policy = [3.0, 1.0, 2.0, 5.0, 0.0]
    base = [1.0, 1.0, 4.0, 2.0, 0.0]
    out = win_rate(policy, base)
    assert (out["wins"], out["ties"], out["losses"], out["n"]) == (2, 2, 1, 5)
    assert out["win_rate"] == pytest.approx(3.0 / 5.0)
    elo, ehi = _wilson_closed_form(3.0, 5)
    assert out["win_rate_lo"] == pytest.approx(elo, abs=1e-12)
    assert out["win_rate_hi"] == pytest.approx(ehi, abs=1e-12)


def test_win_rate_ties_count_half() -> None:
    out = win_rate([1, 1, 1, 1], [1, 1, 1, 1])
    assert out["win_rate"] == 0.5
    assert out["wins"] == 0 and out["ties"] == 4 and out["losses"] == 0


def test_win_rate_empty_and_mismatch() -> None:
    out = win_rate([], [])
    assert math.isnan(out["win_rate"])
    assert math.isnan(out["win_rate_lo"]) and math.isnan(out["win_rate_hi"])
    assert (out["wins"], out["ties"], out["losses"], out["n"]) == (0, 0, 0, 0)
    with pytest.raises(ValueError):
        win_rate([1.0, 2.0], [1.0])


def test_words_lowercases_and_drops_punctuation() -> None:
    assert words("The cat, THE cat!") == ["the", "cat", "the", "cat"]
    assert words("") == []


def test_rep_n_known_values() -> None:
    # bigrams: (the,cat) (cat,the) (the,cat): 2 distinct of 3
    assert rep_n("The cat. THE cat!") == pytest.approx(1.0 / 3.0)
    assert rep_n("a b c d") == 0.0
    # unigrams: a a a a -> 1 distinct of 4
    assert rep_n("a a a a", n=1) == pytest.approx(0.75)
    assert math.isnan(rep_n("one", n=2))
    assert math.isnan(rep_n(""))


def test_mean_rep_n_skips_texts_without_ngrams() -> None:
    assert mean_rep_n(["the cat the cat", "a b c", "x"]) == pytest.approx((1 / 3 + 0) / 2)
    assert math.isnan(mean_rep_n(["x", ""]))
    assert math.isnan(mean_rep_n([]))


def test_distinct_n_across_responses() -> None:
    # bigrams: ab bc | ab bd -> 3 distinct of 4
    assert distinct_n(["a b c", "a b d"]) == pytest.approx(0.75)
    assert distinct_n(["a b c", "a b d"], n=1) == pytest.approx(4 / 6)
    assert math.isnan(distinct_n(["x", ""]))
    assert math.isnan(distinct_n([]))


def test_mean_and_mean_ci() -> None:
    assert math.isnan(mean([]))
    assert mean([1.0, 2.0, 6.0]) == pytest.approx(3.0)
    m, lo, hi = mean_ci([1.0, 2.0, 3.0])
    # df=2 Student-t quantile in closed form: t = (2a-1) * sqrt(2 / (4a(1-a))), a=0.975
    a = 0.975
    t_975_df2 = (2 * a - 1) * math.sqrt(2 / (4 * a * (1 - a)))
    half = t_975_df2 * 1.0 / math.sqrt(3.0)  # sample sd = 1
    assert m == pytest.approx(2.0)
    assert lo == pytest.approx(2.0 - half, abs=1e-12)
    assert hi == pytest.approx(2.0 + half, abs=1e-12)


def test_mean_ci_too_few_points() -> None:
    m, lo, hi = mean_ci([5.0])
    assert m == 5.0 and math.isnan(lo) and math.isnan(hi)
    m, lo, hi = mean_ci([])
    assert math.isnan(m) and math.isnan(lo) and math.isnan(hi)


def test_paired_delta_treats_the_prompt_as_the_unit() -> None:
    # prompt 0: differences 1 and 3 (mean 2); prompt 1: 0 and 0; prompt 2: -1 -> three observations 2, 0, -1
    policy = [1.0, 3.0, 0.5, 0.5, 0.0]
    sft = [0.0, 0.0, 0.5, 0.5, 1.0]
    m, lo, hi = paired_delta(policy, sft, groups=[0, 0, 1, 1, 2])
    want = mean_ci([2.0, 0.0, -1.0])
    assert (m, lo, hi) == pytest.approx(want)
    assert m == pytest.approx(1 / 3)  # not the mean over the five samples (0.6)


def test_paired_delta_is_exactly_zero_for_identical_scores() -> None:
    assert paired_delta([0.3, -0.2, 0.7], [0.3, -0.2, 0.7], groups=[0, 1, 2]) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="length mismatch"):
        paired_delta([1.0], [1.0, 2.0], groups=[0])


def test_win_rate_by_group_scores_each_prompt_once_with_ties_half():
    from ablate.eval.metrics import win_rate_by_group

    # prompt 0: win, tie (0.75); prompt 1: loss, loss (0); prompt 2: win, win (1)
    out = win_rate_by_group([2, 1, 0, 0, 5, 5], [1, 1, 1, 1, 0, 0], groups=[0, 0, 1, 1, 2, 2])
    assert out["win_rate"] == pytest.approx(1.75 / 3)
    half = stats.t.ppf(0.975, 2) * np.std([0.75, 0.0, 1.0], ddof=1) / np.sqrt(3)
    assert (out["win_rate_lo"], out["win_rate_hi"]) == pytest.approx((1.75 / 3 - half, 1.75 / 3 + half))
    with pytest.raises(ValueError, match="length mismatch"):
        win_rate_by_group([1], [1, 2], groups=[0])


def test_rows_of_refuses_columns_of_unequal_length():
    from ablate.eval.metrics import rows_of

    assert rows_of({"a": [1, 2], "b": ["x", "y"]}) == [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
    with pytest.raises(ValueError, match="unequal"):
        rows_of({"a": [1, 2], "b": ["x"]})
