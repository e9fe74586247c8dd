"""Held-out movie-review text for measuring policy perplexity."""

from __future__ import annotations

from importlib import resources

__all__ = ["heldout_texts"]


def heldout_texts() -> list[str]:
    """Return the non-blank, stripped lines of ``data/heldout.txt``."""
    text = resources.files("ablate.tasks.data").joinpath("heldout.txt").read_text("utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]
