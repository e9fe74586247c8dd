"""Gold reward for controlled sentiment: VADER compound score."""

from __future__ import annotations

from typing import Any

__all__ = ["GoldReward"]


class GoldReward:
    """Score texts by VADER compound sentiment in [-1, 1] (higher = more positive)."""

    #: identity of the scoring function, part of every cache key built from rewards
    ID = "vaderSentiment-3.3.2-compound"

    def __init__(self) -> None:
        self._analyzer: Any = None

    def _get(self) -> Any:
        """Build the VADER analyzer on first use and cache it."""
        if self._analyzer is None:
            from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

            self._analyzer = SentimentIntensityAnalyzer()
        return self._analyzer

    def __call__(self, texts: list[str], prompts: list[str] | None = None) -> list[float]:
        """Return one compound score per text (VADER reads the response alone: ``prompts`` are not used); empty or
        blank text scores 0.0."""
        if not texts:
            return []
        analyzer = self._get()
        return [float(analyzer.polarity_scores(t)["compound"]) if t.strip() else 0.0 for t in texts]
