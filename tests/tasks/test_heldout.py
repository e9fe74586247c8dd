"""Tests for ablate.tasks.heldout."""

from ablate.tasks.heldout import heldout_texts


def test_enough_nonempty_lines():
    texts = heldout_texts()
    assert len(texts) >= 30
    assert all(t and t == t.strip() for t in texts)
    assert len(set(texts)) == len(texts)
