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
from pathlib import Path

import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator

from analysis.figure_style import drawn_runs, ordered, plt, regime_colors, regime_key, save
from analysis.load import BETA, base_regime, natural_key, uses_setting
from analysis.markdown import md_table, num, span

#: the over-optimisation table's paired columns this section shows, with their headings
SHOWN = (
    ("end_kl_ratio", "end KL ratio"),
    ("end_gold_difference", "end gold diff."),
    ("end_variety_difference", "end variety diff."),
)
#: regimes drawn as references beside the stand-ins (each at the common beta): noise alone, and no reference
REFERENCES = (("placebo", "null control (placebo)"), ("none", "no reference (none)"))
CAPTION = (
    "Each stand-in that ran at more than one beta, against the baseline at the common beta in the same seeds, "
    "against the stand-in's beta (log axis): left, its end true KL as a ratio to the baseline's (log axis; 1, "
    "dashed: the baseline's own); middle, its end gold reward minus the baseline's; right, the share of all its "
    "seeds that collapsed. Markers: the over-optimisation table's estimates (ratio: geometric mean over the seeds "
    "paired with the baseline; difference: mean), bars their 95% t intervals over seeds (none with one seed), n: "
    "the seeds paired; each stand-in's points are shifted a little sideways so that their bars do not overlap. "
    "References, at the common beta whatever the x axis says: the null control (grey band: its interval; right, "
    "solid grey line: its share) and no reference at all (dotted)."
)


def _betas(runs: pd.DataFrame) -> pd.Series:
    """Each (condition, regime)'s beta, from the runs that used it (NaN: none did, ``none`` under GRPO)."""
    used = runs[BETA].where(uses_setting(runs, BETA))
    return pd.to_numeric(used, errors="coerce").groupby([runs["condition"], runs["regime"]], sort=False).first()


def _labelled(runs: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """``table``'s rows of the regimes ``runs`` has, with their ``beta`` and ``stand_in`` (the label without its
    folded beta, :func:`analysis.load.label_conditions`' ``unfolded``: ``ema(alpha=0.1, algo.beta=1.0)`` ->
    ``ema(alpha=0.1)``), and ``reference``: a regime drawn for scale (:data:`REFERENCES`) at the common beta."""
    keys = ["condition", "regime"]
    stand_ins = runs.groupby(keys, sort=False)["unfolded"].first().rename("stand_in")
    t = table.merge(pd.concat([_betas(runs).rename("beta"), stand_ins], axis=1).reset_index(), on=keys, how="inner")
    is_ref = t["regime"].map(base_regime).isin(dict(REFERENCES)) & (t["stand_in"] == t["regime"])
    return t.assign(reference=is_ref.astype(bool))


def frame(runs: pd.DataFrame, table: pd.DataFrame, baseline: str = "full") -> pd.DataFrame:
    """The over-optimisation ``table``'s rows (with their paired columns) of every stand-in other than ``baseline``
    and the references that ran at more than one (positive) beta in a condition, with ``stand_in`` (the label
    without its folded beta) and ``beta``, in the report's order (conditions in natural order, stand-ins in the
    regimes' order, beta rising); empty where no stand-in did (or the runs record no beta)."""
    return _frames(runs, table, baseline)[1]


def _frames(runs: pd.DataFrame, table: pd.DataFrame, baseline: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``table``'s labelled rows (:func:`_labelled`) and :func:`frame`'s, from one labelling."""
    if BETA not in runs or not len(table) or "n_paired" not in table:
        return pd.DataFrame(), pd.DataFrame()
    t = labelled = _labelled(runs, table)
    t = t[t["n_paired"].notna() & (t["beta"] > 0) & (t["regime"].map(base_regime) != baseline) & ~t["reference"]]
    t = t[t.groupby(["condition", "stand_in"])["beta"].transform("nunique") > 1]
    rows = t.to_dict("records")
    order = sorted(range(len(t)), key=lambda i: (natural_key(rows[i]["condition"]), regime_key(rows[i]["stand_in"]),
                                                 rows[i]["beta"]))  # fmt: skip
    return labelled, t.iloc[order].reset_index(drop=True)


def _references(t: pd.DataFrame, cond: str) -> dict[str, pd.Series]:
    """Condition ``cond``'s references (:data:`REFERENCES`) that paired with the baseline, by regime, from the
    labelled rows (:func:`_labelled`)."""
    t = t[(t["condition"] == cond) & t["reference"] & t["n_paired"].notna()]
    return {base_regime(r["regime"]): r for _, r in t.iterrows()}


def _errorbar(ax, x: float, row: pd.Series, col: str, color, label: str | None) -> None:
    y, lo, hi = (float(row[c]) for c in (col, f"{col}_lo", f"{col}_hi"))
    if not math.isfinite(y):
        return
    bar = [[y - lo], [hi - y]] if math.isfinite(lo) and math.isfinite(hi) else None
    ax.errorbar([x], [y], yerr=bar, fmt="o", color=color, ms=5, capsize=3, lw=1.2, label=label)


def figure(f: pd.DataFrame, refs: dict[str, pd.Series], cond: str, path: Path, colors: dict) -> Path:
    """Three panels (see :data:`CAPTION`) for one condition's stand-ins (:func:`frame`'s rows) and its references
    (:func:`_references`); ``colors``: each regime label's (the report's: every regime it has, so that a stand-in
    keeps its colour across figures)."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    f = f[f["condition"] == cond]
    names = list(dict.fromkeys(f["stand_in"]))
    betas = sorted(set(f["beta"]))
    for i, name in enumerate(names):
        g = f[f["stand_in"] == name]
        shift = 1.06 ** (i - (len(names) - 1) / 2)  # multiplicative: the x axis is logarithmic
        xs = [b * shift for b in g["beta"]]
        c = colors.get(name, colors.get(g["regime"].iloc[0], "black"))
        for ax, (col, _) in zip(axes[:2], SHOWN[:2]):
            ax.plot(xs, g[col].astype(float), "-", color=c, lw=0.8, alpha=0.6)
            for j, (x, (_, row)) in enumerate(zip(xs, g.iterrows())):
                _errorbar(ax, x, row, col, c, name if j == 0 else None)
                if ax is axes[0] and math.isfinite(float(row[col])):
                    n = f"n={int(row['n_paired'])}"
                    ax.annotate(
                        n, (x, float(row[col])), textcoords="offset points", xytext=(5, -3), fontsize=7, color=c
                    )
        share = (g["collapsed"] / g["n_seeds"]).astype(float)
        axes[2].plot(xs, share, "-o", color=c, ms=5, lw=0.8, label=name)
        for x, (_, row), y in zip(xs, g.iterrows(), share):
            count = f"{int(row['collapsed'])}/{int(row['n_seeds'])}"
            axes[2].annotate(count, (x, y), textcoords="offset points", xytext=(4, 4 + 9 * i), fontsize=7, color=c)
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
        ax.margins(x=0.12)  # room for the counts beside the last points
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
) -> tuple[list[str], dict[str, Path]]:
    """The report's section (``[]`` where no stand-in ran at several betas) and its figures by name, one per
    condition that has such a stand-in: ``strength`` (``strength.png``) where the report has one condition, else
    ``strength, <condition>`` (``strength_<i>.png``, ``i`` the condition's place among the report's, as for its
    training figures)."""
    labelled, f = _frames(runs, table, baseline)
    if not len(f):
        return [], {}
    beta = _betas(runs).map(lambda b: num(float(b)) if math.isfinite(b) else "unused")
    report_conds = drawn_runs(runs)[1]  # numbered as the report's other per-condition figures
    lines = [
        "## Beta: does a larger beta hold the stand-in?",
        "",
        f"Each stand-in that ran at more than one beta, against `{baseline}` at the common beta (each heading names "
        "it) in the same seeds (the over-optimisation table's rows, side by side by the stand-in's beta): its end "
        f"true KL as a ratio to `{baseline}`'s (geometric mean [95% t interval on the log scale]), its end gold "
        f"reward and variety minus `{baseline}`'s (mean [95% t interval]), and how many of its seeds collapsed. The "
        "last rows, for scale: the null control (`placebo`, a prompt order alone) and no reference (`none`), where "
        "the report has them.",
        "",
    ]
    figs = {}
    colors = colors or regime_colors(runs["regime"])
    for cond in dict.fromkeys(f["condition"]):
        g = f[f["condition"] == cond]
        refs = _references(labelled, cond)
        rows = [_row(r["stand_in"], num(float(r["beta"])), r) for _, r in g.iterrows()]
        rows += [_row(r["regime"], beta.get((cond, r["regime"]), "n/a"), r) for _, r in refs.items()]
        header = ["regime", "beta", "seeds paired", *(h for _, h in SHOWN), "collapsed"]
        lines += [
            f"### {cond}: `{baseline}` at beta {beta.get((cond, baseline), 'n/a')}",
            "",
            md_table(header, rows),
            "",
        ]
        uneven = [n for n, s in g.groupby("stand_in", sort=False)["n_paired"] if s.nunique() > 1]
        if uneven:
            lines += [
                "The betas of " + ", ".join(f"`{n}`" for n in ordered(uneven)) + " do not all have the same seeds "
                "yet (the seeds paired): a stand-in's rows at different betas rest on different seeds, so the seeds' "
                "own spread is part of any difference between them.",
                "",
            ]
        one = len(report_conds) == 1
        path = out / "figures" / ("strength.png" if one else f"strength_{report_conds.index(cond) + 1}.png")
        figs["strength" if one else f"strength, {cond}"] = figure(f, refs, cond, path, colors)
    return lines, figs
