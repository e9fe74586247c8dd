"""The equivalence figure: each regime's difference from the baseline, per metric, with its intervals and the
equivalence margins (matplotlib, file only)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.equivalence import parse_seed_cell
from analysis.figures import _save, ordered, plt, regime_colors

MARKERS = {"equivalent": "o", "different": "s", "inconclusive": "D"}


def equivalence(cmp: pd.DataFrame, path: Path, baseline: str, colors: dict | None = None) -> Path:
    """One panel per metric: per regime (a row), the difference from ``baseline`` (marker by verdict), its 95%
    interval (thin line) and 90% interval (thick line), each seed's own difference (ticks just below), with the
    margins shaded grey and 0 dashed."""
    metrics = list(dict.fromkeys(cmp["metric"]))
    labels = cmp["regime"] if cmp["condition"].nunique() <= 1 else cmp["condition"] + " | " + cmp["regime"]
    cmp = cmp.assign(label=labels)
    colors = colors if colors is not None else regime_colors(cmp["label"])
    rows = ordered(cmp["label"])
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 0.45 * len(rows) + 1.6), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        c = cmp[cmp["metric"] == metric].set_index("label")
        margins = c["margin"].to_numpy(dtype=float)
        margin = float(np.nanmax(margins)) if np.isfinite(margins).any() else float("nan")
        if np.isfinite(margin):  # one margin per metric (a relative margin: the baseline's mean may vary by condition)
            ax.axvspan(-margin, margin, color="grey", alpha=0.15, lw=0, label="± margin")
        ax.axvline(0, color="black", lw=0.8, ls="--")
        for y, label in enumerate(rows):
            if label not in c.index:
                continue
            r = c.loc[label]
            color = colors.get(label, "black")
            ax.plot([r["lo"], r["hi"]], [y, y], color=color, lw=1.2)
            ax.plot([r["lo_inner"], r["hi_inner"]], [y, y], color=color, lw=3.5, solid_capstyle="butt")
            ax.plot(r["diff"], y, MARKERS.get(r["verdict"], "o"), color=color, mec="black", ms=6)
            per_seed = list(parse_seed_cell(r.get("seed_diffs")).values())
            ax.plot(per_seed, [y + 0.25] * len(per_seed), "|", color=color, ms=7, mew=1.2)
        ax.set_yticks(range(len(rows)), rows)
        ax.invert_yaxis()
        ax.set_xlabel(f"{metric}: regime - {baseline}")
        ax.set_title(metric)
        ax.grid(alpha=0.3, axis="x")
    axes[0][0].legend(fontsize=7, loc="best")
    fig.suptitle(
        f"difference from {baseline} (thin: 95% interval, thick: 90%; marker: o equivalent, s different, "
        "D inconclusive; ticks below: each seed's difference)",
        fontsize=9,
    )
    return _save(fig, path)
