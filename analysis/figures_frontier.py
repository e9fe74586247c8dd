"""The frontier figure of a report whose runs vary a setting (beta, the KL estimator): colour the regime, marker the
condition, and where the conditions are values of one numeric setting a line through each regime's points in that
setting's order: the DPO paper's reward-KL frontier moving with beta (matplotlib, file only)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
from matplotlib.lines import Line2D

from analysis.figure_style import condition_handles, condition_markers, ordered, plt, regime_colors, save
from analysis.figures import FRONTIER_Y, KL_TRUE, REWARD_GOLD, WIN_RATE, _spread, frontier_axes
from analysis.load import natural_key

_ONE_NUMBER = re.compile(r"^([\w.]+)=(-?\d+(?:\.\d+)?(?:e-?\d+)?)$")
CAPTION = (
    "Gold reward and win rate against the true KL to the full reference at each run's last evaluation (the DPO "
    "paper's frontier; up and to the left is better), one point per regime and condition: colour the regime, marker "
    "the condition; where the conditions are values of one numeric setting (beta), a line joins each regime's "
    "points in that setting's order, so the frontier's movement with the setting reads along it. The baseline's "
    "markers are larger (a regime identical to it leaves a ring). Points: mean over each condition's seeds; error "
    "bars: the lowest to the highest seed."
)


def numeric_setting(conditions) -> str | None:
    """The setting's name when every condition is ``<one setting>=<a number>`` of the same setting, else None."""
    names = {m.group(1) if (m := _ONE_NUMBER.match(str(c))) else None for c in conditions}
    return names.pop() if len(names) == 1 and None not in names else None


def final_points(curves: pd.DataFrame) -> pd.DataFrame:
    """Per (condition, regime): the mean over seeds of each run's last evaluation (true KL, gold reward, win rate),
    with each column's lowest and highest seed as ``<col>_min`` / ``<col>_max``."""
    cols = [c for c in (KL_TRUE, REWARD_GOLD, WIN_RATE) if c in curves]
    ev = curves[curves[KL_TRUE].notna()] if KL_TRUE in curves else curves.iloc[0:0]
    last = ev.sort_values("step").groupby("path", sort=False).tail(1)
    g = last.groupby(["condition", "regime"], sort=False)[cols]
    mean, lo, hi = g.mean(), g.min(), g.max()
    return pd.concat([mean, lo.add_suffix("_min"), hi.add_suffix("_max")], axis=1).reset_index()


def frontier_by_condition(
    curves: pd.DataFrame,
    path: Path,
    baseline: str = "full",
    colors: dict | None = None,
    markers: dict | None = None,
) -> Path:
    """Two panels (gold reward, win rate) against the true KL: see :data:`CAPTION`. The baseline's markers are
    drawn larger, so that a regime identical to it (the null control) leaves it visible as a ring. ``colors``: each
    regime's, ``markers``: each condition's (the report's other figures' own, so that they agree)."""
    m = final_points(curves)
    conditions = sorted(m["condition"].astype(str).unique(), key=natural_key)
    marker = markers if markers is not None else condition_markers(conditions)
    colors = colors if colors is not None else regime_colors(m["regime"])
    joined = numeric_setting(conditions) is not None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for ax, y in zip(axes, FRONTIER_Y):
        for r in ordered(m["regime"]) if y in m else []:  # a curve not logged: an empty panel
            g = m[m["regime"] == r].set_index("condition").reindex([c for c in conditions if c in set(m["condition"])])
            g = g[g["regime"].notna()].reset_index()
            color = colors[r]
            if joined and len(g) > 1:
                ax.plot(g[KL_TRUE], g[y], "-", color=color, lw=1.2, alpha=0.7)
            for _, p in g.iterrows():
                one = g[g["condition"] == p["condition"]]
                ax.errorbar(
                    one[KL_TRUE],
                    one[y],
                    xerr=_spread(one, KL_TRUE),
                    yerr=_spread(one, y),
                    fmt=marker[p["condition"]],
                    color=color,
                    mec="black",
                    ms=10 if r == baseline else 6,
                    elinewidth=0.8,
                    capsize=2,
                )
    frontier_axes(axes, ("reward vs KL, last evaluation", "win rate vs KL, last evaluation"))
    handles = [Line2D([], [], color=colors[r], lw=3, label=r) for r in ordered(m["regime"])]
    handles += condition_handles({c: marker[c] for c in conditions})
    axes[1].legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return save(fig, path)
