"""What every figure of a report shares, so that they agree: the one order of regimes, each regime's colour, each
condition's marker and its legend entry, and how a figure is written (matplotlib, files only)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from analysis.load import base_regime, natural_key  # noqa: E402

LABEL_SEP = " | "  # a figure label with several conditions: "<condition> | <regime>"
CONDITION_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<")


@cache
def regime_order() -> tuple[str, ...]:
    """Every registered regime in the canonical order (``ablate.refs.regime_names``: each regime's declared
    ``rank``, plug-ins included); read once, on first use, so that the analysis imports no torch until a figure
    or table needs the order."""
    from ablate.refs import regime_names

    return tuple(regime_names("all"))


@cache
def _rank() -> dict[str, int]:
    return {r: i for i, r in enumerate(regime_order())}


def regime_key(label) -> tuple:
    """The one order of regime labels in every table and figure: by condition (natural order) where the label
    carries one (``<condition> | <regime>``), then by the reference's place in :func:`regime_order` (others after,
    by name), then the label's natural order (``ema(alpha=0.03)`` before ``ema(alpha=0.1)``)."""
    cond, _, regime = str(label).rpartition(LABEL_SEP)
    rank = _rank()
    return natural_key(cond), rank.get(base_regime(regime), len(rank)), natural_key(regime)


def ordered(regimes) -> list[str]:
    """The distinct labels in :func:`regime_key`'s order."""
    return sorted({str(r) for r in regimes}, key=regime_key)


def regime_colors(regimes) -> dict[str, tuple]:
    """One colour per regime, in the canonical order (pass every regime of a report: same colour everywhere)."""
    dark, light = plt.get_cmap("tab10"), plt.get_cmap("tab20")
    palette = [dark(i) for i in range(10)] + [light(2 * i + 1) for i in range(10)]  # 20 distinct, tab10 first
    return {r: palette[i % len(palette)] for i, r in enumerate(ordered(regimes))}


def drawn_runs(runs):
    """The runs a report's figures draw, and their conditions in natural order (a per-condition figure's number is
    its condition's place in that list): the finished runs only, since a failed or unfinished run's last evaluation
    is not the end of training and a condition whose every job failed (a broken model) has no figure; every run
    where none finished."""
    finished = runs[runs["status"] == "finished"] if (runs["status"] == "finished").any() else runs
    return finished, sorted(finished["condition"].astype(str).unique(), key=natural_key)


def condition_markers(conditions) -> dict[str, str]:
    """Each condition's marker, in the order given (the conditions' natural order: the same in every figure)."""
    return {c: CONDITION_MARKERS[i % len(CONDITION_MARKERS)] for i, c in enumerate(conditions)}


def condition_handles(markers: dict[str, str]) -> list[Line2D]:
    """Legend entries for conditions, condition -> marker in the legend's order: the marker alone, in grey."""
    return [Line2D([], [], ls="", marker=mk, color="grey", mec="black", label=c) for c, mk in markers.items()]


def save(fig, path: Path) -> Path:
    """Write ``fig`` to ``path`` (PNG, 120 dpi) and close it."""
    import warnings

    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # long legends: bbox_inches="tight" makes room instead
        fig.tight_layout()
        fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
