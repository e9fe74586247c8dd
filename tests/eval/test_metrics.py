"""Tests for ablate.eval.metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from ablate.eval.metrics import (
    degenerate_share,
    distinct_n,
    mean,
    mean_ci,
    mean_rep_n,
    paired_delta,
    perplexity,
    rep_n,
    words,
)


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


def test_a_win_score_is_one_half_or_zero_and_nan_without_both_scores():
    from ablate.eval.metrics import win_score

    assert (win_score(2, 1), win_score(1, 1), win_score(0, 1)) == (1.0, 0.5, 0.0)
    assert math.isnan(win_score(float("nan"), 1.0)) and math.isnan(win_score(1.0, float("nan")))


def test_rows_of_refuses_columns_of_unequal_length():
    from ablate.eval.metrics import rows_of

    assert rows_of({"a": [1, 2], "b": ["x", "y"]}) == [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
    with pytest.raises(ValueError, match="unequal"):
        rows_of({"a": [1, 2], "b": ["x"]})


def test_a_response_is_degenerate_when_half_its_bigrams_repeat_or_it_has_none() -> None:
    texts = ["so happy so happy so happy", "I love it. I love it.", "A calm and lovely day.", "Great!", ""]
    assert [round(rep_n(t, 2), 2) for t in texts[:3]] == [0.6, 0.4, 0.0]
    assert degenerate_share(texts) == 3 / 5  # the first, and the two with no bigram
    assert degenerate_share(texts[1:3]) == 0.0
    assert degenerate_share(texts, threshold=0.4) == 4 / 5
    assert math.isnan(degenerate_share([]))


def test_perplexity_is_exp_of_the_mean_nll_per_token() -> None:
    assert perplexity([2.0, 4.0], [2, 4]) == pytest.approx(math.exp(1.0))
    assert math.isnan(perplexity([], []))
