"""Tests for ablate.tasks.safety (real alt-profanity-check)."""

import pytest

from ablate.tasks.safety import SafetyJudge


def test_profane_unsafe_clean_safe():
    judge = SafetyJudge()
    texts = ["This damn movie was shit from start to finish.", "A lovely film for the whole family."]
    probs = judge.probs(texts)
    assert all(0.0 <= p <= 1.0 for p in probs)
    assert probs[0] > probs[1]
    assert judge.unsafe(texts) == [True, False]


def test_empty_list():
    judge = SafetyJudge()
    assert judge.probs([]) == []
    assert judge.unsafe([]) == []


def test_threshold_applied():
    texts = ["A lovely film for the whole family."]
    assert SafetyJudge(threshold=0.0).unsafe(texts) == [True]
    assert SafetyJudge(threshold=1.0).unsafe(texts) == [False]


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_threshold_validation(bad):
    with pytest.raises(ValueError):
        SafetyJudge(threshold=bad)
