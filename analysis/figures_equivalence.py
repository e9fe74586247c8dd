"""The equivalence figure: each regime's difference from the baseline, per metric, with its intervals and the
equivalence margins (matplotlib, file only)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.equivalence import parse_seed_cell
from analysis.figure_style import LABEL_SEP, ordered, plt, regime_colors
from analysis.figure_style import save as _save

MARKERS = {"equivalent": "o", "different": "s", "inconclusive": "D", "determinism check": "x"}


def panel_reach(c: pd.DataFrame, margin: float) -> float:
    """How far a panel reaches either side of 0: every estimate, seed and interval end, but an interval no further
    than 4 margins or 1.5x the farthest estimate or seed (so that one wide interval cannot shrink the margin band to
    a line); NaN (matplotlib's own range) without a finite margin."""
    if not math.isfinite(margin):
        return math.nan
    seeds = [abs(v) for cell in c.get("seed_diffs", pd.Series(dtype=object)) for v in parse_seed_cell(cell).values()]
    points = [abs(float(v)) for v in c["diff"] if np.isfinite(v)] + seeds
    ends = [abs(float(v)) for col in ("lo", "hi") for v in c[col] if np.isfinite(v)]
    cap = max(4 * margin, 1.5 * max(points, default=0.0))
    return max(min(max(ends, default=0.0), cap), max(points, default=0.0), margin) * 1.05


def equivalence(cmp: pd.DataFrame, path: Path, baseline: str, colors: dict | None = None) -> Path:
    """One panel per metric: per regime (a row), the difference from ``baseline`` (marker by verdict), its 95%
    interval (thin line) and 90% interval (thick line), each seed's own difference (ticks just below), with the
    margins shaded grey and 0 dashed; an interval reaching past the panel (:func:`panel_reach`) ends in an arrow."""
    metrics = list(dict.fromkeys(cmp["metric"]))
    labels = cmp["regime"] if cmp["condition"].nunique() <= 1 else cmp["condition"] + LABEL_SEP + cmp["regime"]
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
        reach = panel_reach(c, margin)
        for y, label in enumerate(rows):
            if label not in c.index:
                continue
            r = c.loc[label]
            color = colors.get(label, "black")
            for lo, hi, lw in ((r["lo"], r["hi"], 1.2), (r["lo_inner"], r["hi_inner"], 3.5)):
                ax.plot(np.clip([lo, hi], -reach, reach), [y, y], color=color, lw=lw, solid_capstyle="butt")
            for end, edge in ((r["lo"], -reach), (r["hi"], reach)):  # an interval past the panel: an arrow at the edge
                if abs(end) > reach:
                    ax.plot(edge, y, "<" if edge < 0 else ">", color=color, ms=6)
            ax.plot(r["diff"], y, MARKERS.get(r["verdict"], "o"), color=color, mec="black", ms=6)
            per_seed = list(parse_seed_cell(r.get("seed_diffs")).values())
            ax.plot(per_seed, [y + 0.25] * len(per_seed), "|", color=color, ms=7, mew=1.2)
        if math.isfinite(reach):
            ax.set_xlim(-1.08 * reach, 1.08 * reach)
        ax.set_yticks(range(len(rows)), rows)
        ax.invert_yaxis()
        ratio = "scale" in c and (c["scale"] == "log ratio").all()
        ax.set_xlabel(f"{metric}: log(regime / {baseline})" if ratio else f"{metric}: regime - {baseline}")
        ax.set_title(metric)
        ax.grid(alpha=0.3, axis="x")
    axes[0][0].legend(fontsize=7, loc="best")
    fig.suptitle(
        f"difference from {baseline} (thin: 95% interval, thick: 90%; marker: o equivalent, s different, "
        "D inconclusive, x determinism check; ticks below: each seed's difference; arrow: the interval runs on past the panel)",
        fontsize=9,
    )
    return _save(fig, path)
