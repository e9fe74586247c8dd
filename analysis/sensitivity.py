"""When is a cheap reference safe? A section of the report for sweeps that vary DPO's beta.

DPO sees its reference only through each training pair's margin ``log ref(y_w) - log ref(y_l)``, and only as
``beta`` times it inside the sigmoid: a stand-in whose margins are off by ``e`` moves each pair's logit by
``beta * e``. So the scale of the perturbation DPO receives is ``beta x sd(e)`` (``margin_err_sd``, measured on the
run's own training pairs against the full reference in fp32). The section lays each (beta, regime)'s behaviour
effect, its difference from the exact reference trained at the same beta (the report's verdicts), against that
scale: a table, a figure, and the reading the data allow:

- the largest ``beta x sd`` below which every point is *equivalent* on every verdict metric, and the smallest at
  which one is *different*;
- Spearman's rank correlation between ``beta x sd`` and the size of each metric's difference (in units of its
  margin), over the points. Descriptive: the points share seeds, prompts and the baseline's runs, so they are not
  independent and its p-value is only a guide.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sstats

from analysis.figure_style import condition_handles, condition_markers, plt, regime_colors, save
from analysis.figures_equivalence import panel_reach
from analysis.load import BETA
from analysis.markdown import md_table, num, span
from analysis.report_config import ReportConfig

SD = "margin_err_sd"
CAPTION = (
    "Each stand-in's difference from the exact reference at the same beta, in units of the metric's equivalence "
    "margin (so the grey band, ±1, is the margin on every panel), against beta x the standard deviation of its "
    "reference margin error on the training pairs (log scale): marker at the estimate, thin line its 95% interval, "
    "thick line its 90% interval (the one the equivalence test uses); an interval that runs on past the panel (beyond "
    "4 margins and 1.5x the farthest estimate) ends in an arrow. Colour: regime; marker: beta. Points whose "
    "beta x sd is 0 cannot be drawn on the log scale and are listed in the table only."
)


def applies(runs: pd.DataFrame) -> bool:
    """Whether the finished runs vary beta and measured the margin error (DPO)."""
    done = runs[runs["status"] == "finished"]
    return BETA in done and done[BETA].nunique() > 1 and SD in done and bool(done[SD].notna().any())


def frame(runs: pd.DataFrame, eq: pd.DataFrame, cfg: ReportConfig) -> pd.DataFrame:
    """One row per (condition, regime, verdict metric): beta, the margin error's sd (mean over seeds), their
    product ``scaled``, the verdict row's difference and intervals, and the same divided by the margin (``rel*``)."""
    done = runs[runs["status"] == "finished"]
    per = (
        done.groupby(["condition", "regime"], sort=False)
        .agg(ref_name=("ref_name", "first"), beta=(BETA, "first"), sd=(SD, "mean"), n_seeds=("seed", "nunique"))
        .reset_index()
    )
    per["scaled"] = per["beta"].astype(float) * per["sd"]
    if not len(eq):
        return pd.DataFrame()
    cols = ["condition", "regime", "metric", "diff", "lo", "hi", "lo_inner", "hi_inner", "margin", "verdict"]
    out = eq[cols].merge(per, on=["condition", "regime"], how="inner")
    for c in ("diff", "lo", "hi", "lo_inner", "hi_inner"):
        out["rel_" + c] = out[c] / out["margin"]
    order = {m: i for i, m in enumerate(cfg.metrics())}
    return out.assign(_m=out["metric"].map(order)).sort_values(["scaled", "_m"], kind="stable").drop(columns="_m")


# an identical code path (a determinism check) differs by exactly 0: inside every margin
_HOLDS = ("equivalent", "determinism check")


def bounds(f: pd.DataFrame) -> tuple[float, float, str]:
    """(largest scale with every point up to it equivalent on every metric, smallest scale with a *different*
    verdict, a description of that point); NaN where there is none."""
    pts = f.groupby(["condition", "regime"], sort=False).agg(
        scaled=("scaled", "first"), all_eq=("verdict", lambda v: bool(v.isin(_HOLDS).all()))
    )
    pts = pts[np.isfinite(pts["scaled"])].sort_values("scaled")
    safe = math.nan
    for _, p in pts.iterrows():
        if not p["all_eq"]:
            break
        safe = p["scaled"]
    diff = f[(f["verdict"] == "different") & np.isfinite(f["scaled"])].sort_values("scaled")
    if not len(diff):
        return safe, math.nan, ""
    d = diff.iloc[0]
    return safe, float(d["scaled"]), f"`{d['regime']}` at {d['condition']}, `{d['metric']}`"


def bound_line(safe: float, first: float, where: str, baseline: str) -> str:
    """The bounds of :func:`bounds` as one markdown bullet."""
    diff = f"the smallest beta x sd with a difference is **{num(first)}** ({where})" if math.isfinite(first) else ""
    if not math.isfinite(safe):
        head = "- The point with the smallest beta x sd is not equivalent on every verdict metric"
        return head + (f"; {diff}." if diff else ".")
    head = f"- Every point with beta x sd up to **{num(safe)}** is equivalent to `{baseline}` on every verdict metric"
    return head + (f"; {diff}." if diff else "; no point is different.")


def correlations(f: pd.DataFrame) -> pd.DataFrame:
    """Per metric: Spearman's rho between the scale and |difference| / margin, its n and (descriptive) p."""
    rows = []
    for metric, g in f.groupby("metric", sort=False):
        g = g[np.isfinite(g["scaled"]) & np.isfinite(g["rel_diff"])]
        if len(g) < 3 or g["scaled"].nunique() < 2 or g["rel_diff"].abs().nunique() < 2:
            rows.append(dict(metric=metric, n=len(g), rho=math.nan, p=math.nan))  # too few points, or no spread
            continue
        r = sstats.spearmanr(g["scaled"], g["rel_diff"].abs())
        rows.append(dict(metric=metric, n=len(g), rho=float(r.statistic), p=float(r.pvalue)))
    return pd.DataFrame(rows)


def figure(f: pd.DataFrame, path: Path, baseline: str) -> Path:
    metrics = list(dict.fromkeys(f["metric"]))
    colors = regime_colors([*f["ref_name"], baseline])  # the baseline counted: each regime's colour elsewhere
    betas = sorted(f["beta"].astype(float).unique())
    marker = condition_markers(betas)  # ascending beta: the markers of the report's beta conditions (natural order)
    ncols = min(2, len(metrics))
    nrows = math.ceil(len(metrics) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.6 * nrows), squeeze=False)
    for ax in axes.flat[len(metrics) :]:
        ax.set_visible(False)
    drawn = f[f["scaled"] > 0]
    for ax, metric in zip(axes.flat, metrics):
        ax.axhspan(-1, 1, color="grey", alpha=0.15, lw=0)
        ax.axhline(0, color="black", lw=0.8, ls="--")
        points = drawn[drawn["metric"] == metric]
        rel = points[["rel_diff", "rel_lo", "rel_hi"]].set_axis(["diff", "lo", "hi"], axis=1)
        reach = panel_reach(rel, 1.0)  # in margins: one wide interval cannot squeeze the band
        for _, r in points.iterrows():
            c, x = colors[r["ref_name"]], r["scaled"]
            for lo, hi, lw in ((r["rel_lo"], r["rel_hi"], 1.0), (r["rel_lo_inner"], r["rel_hi_inner"], 3.0)):
                ax.plot([x, x], np.clip([lo, hi], -reach, reach), color=c, lw=lw, solid_capstyle="butt")
            for end, edge in ((r["rel_lo"], -reach), (r["rel_hi"], reach)):  # past the panel: an arrow at the edge
                if abs(end) > reach:
                    ax.plot(x, edge, "v" if edge < 0 else "^", color=c, ms=6)
            ax.plot(x, r["rel_diff"], marker[float(r["beta"])], color=c, mec="black", ms=6)
        ax.set_ylim(-1.08 * reach, 1.08 * reach)
        ax.set_xscale("log")
        ax.set_xlabel("beta x sd(reference margin error)")
        ax.set_ylabel(f"({metric}: regime - {baseline}) / margin")
        ax.set_title(metric)
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color=colors[n], lw=3, label=n) for n in colors]
    handles += condition_handles({f"beta {b:g}": marker[b] for b in betas})
    right = axes.flat[min(ncols, len(metrics)) - 1]  # beside the top row's last panel: it covers no point
    right.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return save(fig, path)


def section(runs: pd.DataFrame, eq: pd.DataFrame, cfg: ReportConfig, out: Path) -> tuple[list[str], Path | None]:
    """The section's markdown lines and its figure (``[]``, None when the runs do not vary beta); writes
    ``sensitivity.csv``."""
    if not applies(runs):
        return [], None
    f = frame(runs, eq, cfg)
    if not len(f):
        return [], None
    f.to_csv(out / "sensitivity.csv", index=False)
    done = runs[(runs["status"] == "finished") & (runs["regime"] == cfg.baseline)]
    floor = done.groupby(BETA)[SD].mean()
    metrics = list(dict.fromkeys(f["metric"]))
    rows = []
    for (_, regime), g in f.groupby(["condition", "regime"], sort=False):
        r0 = g.iloc[0]
        cells = []
        for m in metrics:
            x = g[g["metric"] == m]
            cells.append(
                f"{span(x['diff'].iloc[0], x['lo'].iloc[0], x['hi'].iloc[0])} {x['verdict'].iloc[0]}"
                if len(x)
                else "n/a"
            )
        rows.append(
            [f"`{regime}`", num(float(r0["beta"])), str(int(r0["n_seeds"])), num(r0["sd"]), num(r0["scaled"])] + cells
        )
    lines = [
        "## When is a cheap reference safe? Behaviour effect against beta x margin error",
        "",
        f"Each stand-in against `{cfg.baseline}` trained at the same beta (the verdicts above), ordered by "
        "beta x sd(margin error), the scale of the perturbation DPO's loss receives (see `analysis/sensitivity.py`). "
        f"`{cfg.baseline}`'s own margin error (its precision's zero line): "
        + ", ".join(f"{num(s)} at beta {num(float(b))}" for b, s in floor.items())
        + ".",
        "",
        md_table(
            ["regime", "beta", "seeds", "margin err. sd", "beta x sd"] + [f"{m} diff [95%] verdict" for m in metrics],
            rows,
        ),
        "",
    ]
    lines.append(bound_line(*bounds(f), cfg.baseline))
    for _, c in correlations(f).iterrows():
        if not math.isfinite(c["rho"]):
            lines.append(
                f"- `{c['metric']}`: no rank correlation over {c['n']} points (too few, or every difference the same)."
            )
            continue
        lines.append(
            f"- `{c['metric']}`: Spearman's rho between beta x sd and |difference| / margin "
            f"{num(c['rho'])} over {c['n']} points (p {num(c['p'])}, descriptive: the points share seeds and prompts)."
        )
    lines.append("")
    fig = figure(f, out / "figures" / "sensitivity.png", cfg.baseline)
    return lines, fig
