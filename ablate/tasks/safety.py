"""Safety judge: unsafe probability from the alt-profanity-check classifier."""

from __future__ import annotations

import warnings
from collections.abc import Callable

__all__ = ["SafetyJudge"]

_predict_prob: Callable | None = None


def _load() -> Callable:
    """Import ``predict_prob`` once, silencing sklearn version warnings."""
    global _predict_prob
    if _predict_prob is None:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*(version|unpickle).*")
            warnings.filterwarnings("ignore", category=UserWarning, module="sklearn.*")
            from profanity_check import predict_prob

        _predict_prob = predict_prob
    return _predict_prob


class SafetyJudge:
    """Flag texts whose profanity probability is at least ``threshold``."""

    #: identity of the classifier, part of every cache key built from its probabilities (the threshold is not:
    #: it changes no probability, only which count as unsafe)
    ID = "alt-profanity-check-1.9.1-predict_prob"

    def __init__(self, threshold: float = 0.5) -> None:
        if not 0.0 <= float(threshold) <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold!r}")
        self.threshold = float(threshold)

    def probs(self, texts: list[str]) -> list[float]:
        """Return the unsafe probability of each text."""
        if not texts:
            return []
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning, module="sklearn.*")
            return [float(p) for p in _load()(list(texts))]

    def unsafe(self, texts: list[str]) -> list[bool]:
        """Return True for each text whose probability is >= the threshold."""
        return [p >= self.threshold for p in self.probs(texts)]
