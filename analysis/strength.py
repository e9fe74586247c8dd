"""The strength stage of a long-run report: a stand-in run at more than one beta, against the baseline at one.

A reference holds the policy with strength beta times what it measures, so a stand-in that lets the policy drift
may hold it at a larger beta, at some cost in reward. With ``--fold algo.beta`` a run at a beta other than most runs'
is labelled ``<regime>(algo.beta=<b>)`` and compared with the baseline at the common beta, in the same seeds
(:func:`analysis.load.label_conditions`); the over-optimisation table (:mod:`analysis.overoptimisation`) then holds
each such regime's end point against the baseline. This section gathers, for every stand-in that ran at more than
one beta in a condition, those rows side by side by beta: its end true KL as a ratio to the baseline's, its end gold
reward and variety as differences from the baseline's, and how many of its seeds collapsed; with the null control
(``placebo``) and the unanchored run (``none``) drawn beside them as what noise alone and no reference at all give.
It computes nothing new: every number is the over-optimisation table's (and the recheck recomputes that table).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator

from analysis.figure_style import plt, regime_colors, save
from analysis.load import base_regime, uses_setting
from analysis.markdown import md_table, num, span

BETA = "cfg.algo.beta"
#: the over-optimisation table's paired columns this section shows, with their headings
SHOWN = (
    ("end_kl_ratio", "end KL ratio"),
    ("end_gold_difference", "end gold diff."),
    ("end_variety_difference", "end variety diff."),
)
#: regimes drawn as references beside the stand-ins (each at the common beta): noise alone, and no reference
REFERENCES = (("placebo", "null control (placebo)"), ("none", "no reference (none)"))
CAPTION = (
    "Each stand-in that ran at more than one beta, against the baseline at the common beta in the same seeds, per "
    "beta (log scale): left, its end true KL as a ratio to the baseline's (log scale; 1, dashed: the baseline's "
    "own); middle, its end gold reward minus the baseline's; right, the share of its seeds that collapsed. Markers: "
    "the over-optimisation table's estimates (ratio: geometric mean over seeds; difference: mean), bars their 95% "
    "t intervals over seeds (none with one seed); each stand-in's points are shifted a little sideways so that "
    "their bars do not overlap. Grey band: the null control's interval (a prompt order alone); dotted line: no "
    "reference at all."
)


def stand_in(label: str) -> str:
    """A regime label without its folded beta (``ema(alpha=0.1, algo.beta=1.0)`` -> ``ema(alpha=0.1)``,
    ``snapshot(algo.beta=0.3)`` -> ``snapshot``): what the section draws as one line across betas."""
    return _EMPTY.sub("", _FOLDED_BETA.sub("", str(label)).replace("(, ", "("))


_FOLDED_BETA = re.compile(r",? ?algo\.beta=[^,)]*")
_EMPTY = re.compile(r"\(\)$")


def frame(runs: pd.DataFrame, table: pd.DataFrame, baseline: str = "full") -> pd.DataFrame:
    """The over-optimisation ``table``'s rows (with their paired columns) of every stand-in other than ``baseline``
    that ran at more than one beta in a condition, with ``ref_name`` and ``beta`` (its runs' ``cfg.algo.beta``),
    sorted by condition, stand-in and beta; empty where no stand-in did (or the runs record no beta)."""
    if BETA not in runs or not len(table) or "n_paired" not in table:
        return pd.DataFrame()
    beta = runs.groupby(["condition", "regime"], sort=False)[BETA].first().astype(float).rename("beta").reset_index()
    t = table.merge(beta, on=["condition", "regime"], how="inner")
    t = t[t["n_paired"].notna() & (t["regime"].map(base_regime) != baseline)].assign(
        ref_name=lambda f: f["regime"].map(stand_in)
    )
    several = t.groupby(["condition", "ref_name"])["beta"].transform("nunique") > 1
    t = t[several & ~t["ref_name"].isin([r for r, _ in REFERENCES])]
    return t.sort_values(["condition", "ref_name", "beta"], kind="stable").reset_index(drop=True)


def _references(table: pd.DataFrame, cond: str) -> dict[str, pd.Series]:
    t = table[(table["condition"] == cond) & table["regime"].isin([r for r, _ in REFERENCES])]
    return {r["regime"]: r for _, r in t.iterrows() if "n_paired" in r and pd.notna(r["n_paired"])}


def _errorbar(ax, x: float, row: pd.Series, col: str, color, label: str | None) -> None:
    y, lo, hi = (float(row[c]) for c in (col, f"{col}_lo", f"{col}_hi"))
    if not math.isfinite(y):
        return
    bar = [[y - lo], [hi - y]] if math.isfinite(lo) and math.isfinite(hi) else None
    ax.errorbar([x], [y], yerr=bar, fmt="o", color=color, ms=5, capsize=3, lw=1.2, label=label)


def figure(f: pd.DataFrame, table: pd.DataFrame, cond: str, path: Path, colors: dict | None = None) -> Path:
    """Three panels (see :data:`CAPTION`) for one condition's stand-ins; ``colors``: each regime label's (the
    report's: every regime it has, so that a stand-in keeps its colour across figures)."""
    colors = colors if colors is not None else regime_colors(table["regime"])
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    f = f[f["condition"] == cond]
    names = list(dict.fromkeys(f["ref_name"]))
    betas = sorted(set(f["beta"]))
    for i, name in enumerate(names):
        g = f[f["ref_name"] == name]
        shift = 1.06 ** (i - (len(names) - 1) / 2)  # multiplicative: the x axis is logarithmic
        xs = [b * shift for b in g["beta"]]
        c = colors.get(name, colors.get(g["regime"].iloc[0], "black"))
        for ax, (col, _) in zip(axes[:2], SHOWN[:2]):
            ax.plot(xs, g[col].astype(float), "-", color=c, lw=0.8, alpha=0.6)
            for j, (x, (_, row)) in enumerate(zip(xs, g.iterrows())):
                _errorbar(ax, x, row, col, c, name if j == 0 else None)
        share = (g["collapsed"] / g["n_seeds"]).astype(float)
        axes[2].plot(xs, share, "-o", color=c, ms=5, lw=0.8, label=name)
        for x, (_, row), y in zip(xs, g.iterrows(), share):
            count = f"{int(row['collapsed'])}/{int(row['n_seeds'])}"
            axes[2].annotate(count, (x, y), textcoords="offset points", xytext=(4, 4 + 9 * i), fontsize=7, color=c)
    refs = _references(table, cond)
    for regime, label in REFERENCES:
        if regime not in refs:
            continue
        r = refs[regime]
        for ax, (col, _) in zip(axes[:2], SHOWN[:2]):
            lo, hi = float(r[f"{col}_lo"]), float(r[f"{col}_hi"])
            if regime == "placebo" and math.isfinite(lo) and math.isfinite(hi):
                ax.axhspan(lo, hi, color="grey", alpha=0.2, lw=0, label=label)
            elif regime == "none" and math.isfinite(float(r[col])):
                ax.axhline(float(r[col]), color="black", ls=":", lw=1, label=label)
        style = {"color": "grey", "ls": "-"} if regime == "placebo" else {"color": "black", "ls": ":"}
        count = f"{int(r['collapsed'])}/{int(r['n_seeds'])}"
        axes[2].axhline(r["collapsed"] / r["n_seeds"], lw=1, label=f"{label}: {count}", **style)
    axes[0].axhline(1.0, color="grey", ls="--", lw=0.8)
    axes[0].set_yscale("log")
    axes[0].yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axes[0].yaxis.set_major_formatter(FuncFormatter(lambda v, _: num(v)))
    axes[1].axhline(0.0, color="grey", ls="--", lw=0.8)
    axes[2].set_ylim(-0.05, 1.1)
    ylabels = ("end true KL / baseline's (ratio)", "end gold reward - baseline's", "share of seeds collapsed")
    for ax, y in zip(axes, ylabels):
        ax.set_xscale("log")
        ax.margins(x=0.12)  # room for the collapse counts beside the last points
        ax.set_xticks(betas, [num(b) for b in betas])
        ax.minorticks_off()
        ax.set_xlabel("beta (the stand-in's)")
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    axes[2].legend(fontsize=7)
    head = "does a larger beta hold the stand-in?"
    fig.suptitle(head if cond == "all runs" else f"{cond}: {head}")
    return save(fig, path)


def _row(name: str, beta: str, r: pd.Series) -> list[str]:
    return (
        [f"`{name}`", beta, str(int(r["n_paired"]))]
        + [span(r[c], r[f"{c}_lo"], r[f"{c}_hi"]) for c, _ in SHOWN]
        + [f"{int(r['collapsed'])} of {int(r['n_seeds'])}"]
    )


def section(
    runs: pd.DataFrame, table: pd.DataFrame, out: Path, baseline: str = "full", colors: dict | None = None
) -> tuple[list[str], list[Path]]:
    """The report's section (``[]`` where no stand-in ran at several betas) and its figures, one per condition that
    has such a stand-in (``strength.png``; ``strength_<i>.png`` with several)."""
    f = frame(runs, table, baseline)
    if not len(f):
        return [], []
    used = runs[uses_setting(runs, BETA)]
    beta = used.groupby(["condition", "regime"], sort=False)[BETA].first().map(lambda b: num(float(b)))
    conds = list(dict.fromkeys(f["condition"]))
    lines = [
        "## Beta: does a larger beta hold the stand-in?",
        "",
        f"Each stand-in that ran at more than one beta, against `{baseline}` at its own beta in the same seeds "
        "(the over-optimisation table's rows, side by side by beta): its end true KL as a ratio to "
        f"`{baseline}`'s (geometric mean [95% t interval on the log scale]), its end gold reward and variety minus "
        f"`{baseline}`'s (mean [95% t interval]), and how many of its seeds collapsed. The last rows, for scale: "
        "the null control (`placebo`, a prompt order alone) and no reference (`none`), where the report has them.",
        "",
    ]
    figs = []
    for i, cond in enumerate(conds, 1):
        at = beta.get((cond, baseline), "n/a")
        refs = _references(table, cond)
        rows = [_row(r["ref_name"], num(float(r["beta"])), r) for _, r in f[f["condition"] == cond].iterrows()]
        rows += [_row(name, beta.get((cond, name), "unused"), refs[name]) for name, _ in REFERENCES if name in refs]
        header = ["regime", "beta", "seeds paired", *(h for _, h in SHOWN), "collapsed"]
        lines += [f"### {cond}: `{baseline}` at beta {at}", "", md_table(header, rows), ""]
        name = "strength.png" if len(conds) == 1 else f"strength_{i}.png"
        figs.append(figure(f, table, cond, out / "figures" / name, colors or regime_colors(runs["regime"])))
    return lines, figs
