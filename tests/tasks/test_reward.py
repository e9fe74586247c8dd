"""Tests for ablate.tasks.reward (real VADER)."""

from ablate.tasks.reward import GoldReward


def test_ordering_positive_neutral_negative():
    pos, neu, neg = GoldReward()(
        [
            "This movie was wonderful, brilliant and I loved every minute of it!",
            "The movie is ninety minutes long and was released on a Tuesday.",
            "This movie was awful, boring and I hated every terrible minute of it.",
        ]
    )
    assert pos > neu > neg
    assert pos > 0.5 and neg < -0.5


def test_range_and_length():
    texts = ["great great great!!!", "horrible disgusting worst ever", "ok", "a b c"]
    scores = GoldReward()(texts)
    assert len(scores) == len(texts)
    assert all(isinstance(s, float) and -1.0 <= s <= 1.0 for s in scores)


def test_empty_text_is_zero():
    assert GoldReward()(["", "   "]) == [0.0, 0.0]
    assert GoldReward()([]) == []
