"""The report's figures (matplotlib, files only). Every function takes the loaded frames, writes one PNG
and returns its path; curves are means over seeds at each evaluation step with a shaded band from the
lowest to the highest seed. ``colors`` (from :func:`regime_colors` over every regime of the report) gives a
regime the same colour in every figure; without it a figure colours only the regimes it draws."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from ablate.tracking import schema
from analysis.figure_style import (  # noqa: F401  (re-exported: the figures' shared order and colours)
    LABEL_SEP,
    condition_handles,
    ordered,
    plt,
    regime_colors,
    regime_key,
    regime_order,
)
from analysis.figure_style import save as _save

MIB = 2**20
# the logged curves the figures draw (metrics.jsonl and W&B names), from the metric schema
KL_TRUE, KL_APPROX = schema.logged("kl_true"), schema.logged("kl_approx")
REWARD_GOLD, WIN_RATE, PPL = schema.logged("reward_gold"), schema.logged("win_rate"), schema.logged("ppl")
LENGTH, REP_2, UNSAFE_RATE = schema.logged("length"), schema.logged("rep_2"), schema.logged("unsafe_rate")
TRAIN_LOSS = f"{schema.TRAIN_SECTION}loss"  # the trainer's own name for its loss


def _colors(colors: dict | None, regimes) -> dict:
    return colors if colors is not None else regime_colors(regimes)


def _seed_stats(rows: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    """Per (regime, step): each column's mean over seeds as ``<col>``, its lowest and highest seed as
    ``<col>_min`` and ``<col>_max``."""
    have = [c for c in cols if c in rows]
    g = rows.groupby(["regime", "step"])[have]
    mean, lo, hi = g.mean(numeric_only=True), g.min(numeric_only=True), g.max(numeric_only=True)
    return pd.concat([mean, lo.add_suffix("_min"), hi.add_suffix("_max")], axis=1).reset_index()


def _eval_means(curves: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    """:func:`_seed_stats` on evaluation rows only."""
    ev = curves[curves[KL_TRUE].notna()] if KL_TRUE in curves else curves.iloc[0:0]
    return _seed_stats(ev, cols)


def _band(ax, g: pd.DataFrame, col: str, color, x: str = "step") -> None:
    """Shade the seeds' range of ``col`` (``<col>_min`` to ``<col>_max``) around its mean curve."""
    if f"{col}_min" in g:
        ax.fill_between(g[x], g[f"{col}_min"], g[f"{col}_max"], color=color, alpha=0.2, lw=0)


def _spread(g: pd.DataFrame, col: str) -> np.ndarray:
    """[below, above] the mean to the seeds' range, for error bars (rounding of the mean never below 0)."""
    mid = g[col].to_numpy(dtype=float)
    err = [mid - g[f"{col}_min"].to_numpy(dtype=float), g[f"{col}_max"].to_numpy(dtype=float) - mid]
    return np.clip(np.nan_to_num(np.asarray(err)), 0, None)


FRONTIER_Y = (REWARD_GOLD, WIN_RATE)  # the frontier's two panels: each against the true KL
_FRONTIER_LABELS = {REWARD_GOLD: "gold reward (VADER compound, mean)", WIN_RATE: "win rate against the SFT model"}


def frontier_axes(axes, titles: tuple[str, str]) -> None:
    """Labels, grid, titles of the two frontier panels (:data:`FRONTIER_Y`) and the win rate's 0.5 line."""
    for ax, y, title in zip(axes, FRONTIER_Y, titles):
        ax.set_xlabel("true KL to the full reference (nats per response)")
        ax.set_ylabel(_FRONTIER_LABELS[y])
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[1].axhline(0.5, color="grey", lw=0.8, ls="--")


def frontier(curves: pd.DataFrame, path: Path, colors: dict | None = None) -> Path:
    """Gold reward and win rate against the true KL over training (the DPO paper's frontier); error bars span
    the seeds in both directions."""
    m = _eval_means(curves, [KL_TRUE, REWARD_GOLD, WIN_RATE])
    colors = _colors(colors, m["regime"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, y in zip(axes, FRONTIER_Y):
        for r in ordered(m["regime"]) if y in m else []:  # a curve not logged: an empty panel
            g = m[m["regime"] == r].sort_values("step")
            ax.errorbar(
                g[KL_TRUE],
                g[y],
                xerr=_spread(g, KL_TRUE),
                yerr=_spread(g, y),
                fmt="-o",
                color=colors[r],
                label=r,
                ms=4,
                elinewidth=0.8,
                capsize=2,
            )
    frontier_axes(axes, ("reward vs KL over training (points: evaluations)", "win rate vs KL over training"))
    axes[1].legend(fontsize=8, ncol=2)
    return _save(fig, path)


def kl_error(
    runs: pd.DataFrame,
    path: Path,
    colors: dict | None = None,
    markers: dict | None = None,
    groups: dict | None = None,
) -> Path:
    """True KL vs the stand-in divergence per run at the end, and their absolute difference at step 0 and at the
    end (bars: mean over seeds, error bars: the seeds' range). With several conditions, ``markers``: a label's
    marker (its condition's) and ``groups``: a label's (regime, condition), for a legend of regimes and conditions
    instead of every label, and bars named by regime over the condition."""
    done = runs[runs["status"] == "finished"]
    colors = _colors(colors, done["regime"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    ax = axes[0]
    both = done[["kl_true", "kl_approx"]].astype(float)
    pos = both[(both > 0).all(axis=1)]
    for r in ordered(done["regime"]):
        g = done[(done["regime"] == r)].astype({"kl_true": float, "kl_approx": float})
        g = g[(g["kl_true"] > 0) & (g["kl_approx"] > 0)]
        if len(g):
            mk = (markers or {}).get(r, "o")
            ax.scatter(
                g["kl_true"], g["kl_approx"], color=colors[r], label=r, s=22, marker=mk, edgecolor="black", lw=0.3
            )
    if len(pos):
        lo, hi = float(pos.min().min()) / 2, float(pos.max().max()) * 2
        ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--", label="stand-in = true")
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("true KL at the end (nats per response)")
    ax.set_ylabel("stand-in divergence KL(policy || regime ref) at the end")
    ax.set_title("stand-in divergence vs true KL\n(one point per run)", fontsize=10)
    if groups and markers:  # one entry per regime (its colour) and per condition (its marker)
        both = (done["kl_approx"].astype(float) > 0) & (done["kl_true"].astype(float) > 0)  # what the scatter draws
        drawn = set(done.loc[both, "regime"])
        shown = [r for r in groups if r in drawn]
        regimes = {groups[r][0]: Line2D([], [], ls="", marker="o", color=colors[r], label=groups[r][0]) for r in shown}
        conds = condition_handles({groups[r][1]: markers[r] for r in shown})
        extra = [h for h in ax.get_legend_handles_labels()[0] if h.get_label() == "stand-in = true"]
        ax.legend(handles=[*regimes.values(), *conds, *extra], fontsize=7, ncol=2)
    elif ax.get_legend_handles_labels()[0]:  # no run drawn: no legend
        ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3, which="both")

    ax = axes[1]
    order = [r for r in groups if r in set(done["regime"])] if groups else ordered(done["regime"])  # groups: by regime
    regs = [r for r in order if done[done["regime"] == r]["kl_abs_err"].notna().any()]
    x = np.arange(len(regs))
    infinite = []  # (x, seeds infinite, seeds): a seed whose divergence was infinite makes the mean infinite
    for off, col, label in ((-0.2, "kl_abs_err_step0", "step 0"), (0.2, "kl_abs_err", "end")):
        if col not in done:
            continue
        vals = [done[done["regime"] == r][col].astype(float) for r in regs]
        marks = [(i, int(np.isinf(v).sum()), int(v.notna().sum())) for i, v in enumerate(vals) if np.isinf(v).any()]
        vals = [v[np.isfinite(v)] for v in vals]  # the bars: finite seeds; an infinite one is marked above its bar
        means = np.array([v.mean() if len(v) else np.nan for v in vals])
        infinite += [(i + off, k, n, float(vals[i].max()) if len(vals[i]) else 0.0) for i, k, n in marks]
        spread = np.clip(
            np.nan_to_num([[m - v.min() for m, v in zip(means, vals)], [v.max() - m for m, v in zip(means, vals)]]),
            0,
            None,
        )
        ax.bar(
            x + off,
            means,
            yerr=spread,
            capsize=2,
            width=0.4,
            label=label,
            color=[colors[r] for r in regs],
            alpha=0.55 if label == "step 0" else 1.0,
            edgecolor="black",
            lw=0.5,
        )
    ticks = [f"{groups[r][0]} ({groups[r][1]})" if groups and r in groups else r for r in regs]
    ax.set_xticks(x, ticks, rotation=30 if not groups else 60, ha="right", fontsize=8 if not groups else 7)
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_ylabel("|stand-in div. - true KL| (nats per response)")
    at_start = "kl_abs_err_step0" in done and done["kl_abs_err_step0"].astype(float).notna().any()
    when = "pale: step 0, solid: end" if at_start else "at the end (no step-0 evaluation)"
    ax.set_title(f"stand-in divergence error by regime\n({when}; mean over seeds)", fontsize=10)
    finite = [done[c].astype(float) for c in ("kl_abs_err_step0", "kl_abs_err") if c in done]
    top = max((float(v[np.isfinite(v)].max()) for v in finite if np.isfinite(v).any()), default=0)
    if top > 0:
        ax.set_ylim(0, top * (10 if infinite else 3))  # room above the tallest bar (and an infinity's mark)
    for xi, k, n, below in infinite:  # just above the bar's finite seeds
        ax.annotate(
            f"+inf\n{k} of {n}\nseeds",
            (xi, below * 1.5 if below > 0 else 1e-3),
            ha="center",
            va="bottom",
            fontsize=6,
            color="firebrick",
        )
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def _pareto_front(xs, ys) -> list[int]:
    pts = sorted((x, y, i) for i, (x, y) in enumerate(zip(xs, ys)) if np.isfinite(x) and np.isfinite(y))
    front, best = [], math.inf
    for _x, y, i in pts:
        if y < best:
            front.append(i)
            best = y
    return front


#: the fidelity the Pareto figure weighs cost against, first that the runs measured: what the algorithm itself
#: consumed (DPO's margins, GRPO/PPO's KL penalty), else the stand-in divergence's error
FIDELITY_AXES = (
    ("margin_err_sd", "sd of the reference margin error (nats): what DPO consumed"),
    ("kl_penalty_err_sd", "sd of the KL penalty error (nats per token): what training consumed"),
    ("kl_abs_err", "|stand-in div. - true KL| at the end (nats)"),
)


def fidelity_axis(agg: pd.DataFrame) -> tuple[str, str]:
    """(column, label) of the first :data:`FIDELITY_AXES` entry measured for at least two regimes."""
    for col, label in FIDELITY_AXES:
        if f"{col}_mean" in agg and agg[f"{col}_mean"].notna().sum() >= 2:
            return col, label
    return FIDELITY_AXES[-1]


def _labels(ax, xs, ys, names, log_y: bool) -> None:
    """Each point's name beside it, raised by whole lines until it overlaps no label placed before it (labels
    measured in inches of the panel: 8-point text, about 0.075 inch a character, 9 points a line)."""
    w_in = ax.get_position().width * ax.figure.get_figwidth()
    h_in = ax.get_position().height * ax.figure.get_figheight()
    x0, x1 = ax.get_xlim()
    y0, y1 = ax.get_ylim()
    if log_y:
        y0, y1 = math.log10(max(y0, 1e-3)), math.log10(max(y1, 1e-3))
    per_char = 0.075 * (x1 - x0) / w_in  # data units of x per character
    line = 9 / 72 * (y1 - y0) / h_in  # data units of y per line of text
    placed: list[tuple[float, float, float]] = []  # (x, y of the label, width)
    for x, y, name in zip(xs, ys, names):
        ly = math.log10(y) if log_y and y > 0 else y
        width = per_char * len(name)
        k = 0
        while any(
            abs(py - (ly + k * line)) < 0.9 * line and (px <= x < px + pw or x <= px < x + width)
            for px, py, pw in placed
        ):
            k += 1
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(5, 4 + 9 * k), fontsize=8)
        placed.append((x, ly + k * line, width))


#: the Pareto figure's time axis: the jobs' own reference time per step, or the bench's (``bench_ms_per_step``)
JOB_TIME = ("ref_ms_per_step", "reference time per training step (ms), as each job measured it")
BENCH_TIME = ("bench_ms_per_step", "reference time per DPO step (ms), from the bench")


def pareto(
    agg: pd.DataFrame,
    path: Path,
    colors: dict | None = None,
    time: tuple[str, str] = JOB_TIME,
    markers: dict | None = None,
    groups: dict | None = None,
) -> Path:
    """Cost (reference bytes, reference time per step: ``time``'s column and label) against fidelity
    (:func:`fidelity_axis`). A regime without a time (not in the bench) is left out of the time panel only.
    With several conditions, ``markers``: a label's marker (its condition's) and ``groups``: a label's (regime,
    condition): a point is named by its regime, once (beside the first), and a legend gives the markers."""
    col_y, label_y = fidelity_axis(agg)
    a = agg[agg[f"{col_y}_mean"].notna()].reset_index(drop=True)
    colors = _colors(colors, a["regime"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, col, scale, label in (
        (axes[0], "ref_bytes", MIB, "reference memory held (MiB)"),
        (axes[1], time[0], 1.0, time[1]),
    ):
        xs = (a[f"{col}_mean"] / scale).to_numpy(dtype=float)
        ys = a[f"{col_y}_mean"].to_numpy(dtype=float)
        for i, r in enumerate(a["regime"]):
            if not np.isfinite(xs[i]):
                continue
            yerr = None
            if np.isfinite(a.loc[i, f"{col_y}_lo"]):
                yerr = [[ys[i] - a.loc[i, f"{col_y}_lo"]], [a.loc[i, f"{col_y}_hi"] - ys[i]]]
                yerr = np.clip(np.asarray(yerr, dtype=float), 0, None)
            mk = (markers or {}).get(r, "o")
            ax.errorbar(xs[i], ys[i], yerr=yerr, fmt=mk, color=colors[r], mec="black", mew=0.4, capsize=3)
        front = _pareto_front(xs, ys)
        if len(front) > 1:
            ax.plot(xs[front], ys[front], color="black", lw=0.8, ls=":", label="Pareto front")
        handles = ax.get_legend_handles_labels()[0]
        if groups and markers:  # the conditions' markers
            handles += condition_handles({groups[r][1]: markers[r] for r in a["regime"] if r in groups})
        if handles:
            ax.legend(handles=handles, fontsize=8)
        ax.set_yscale("symlog", linthresh=1e-3)
        shown = np.isfinite(xs)
        text = [(groups or {}).get(r, (r,))[0] for r in a["regime"][shown]]
        text = [t if t not in text[:i] else "" for i, t in enumerate(text)]  # once per name
        keep = [i for i, t in enumerate(text) if t]
        _labels(ax, xs[shown][keep], ys[shown][keep], [text[i] for i in keep], log_y=True)
        ax.set_xlabel(label)
        ax.set_ylabel(label_y, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_title("memory vs fidelity (lower left is better)")
    axes[1].set_title("time vs fidelity (lower left is better)")
    return _save(fig, path)


def training(curves: pd.DataFrame, path: Path, colors: dict | None = None, title: str = "") -> Path:
    """Training loss per step and true KL per evaluation, per regime (mean over seeds, band: the seeds' range);
    ``title`` above both panels (the condition, where a report has several)."""
    colors = _colors(colors, curves["regime"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    if TRAIN_LOSS in curves:
        tr = _seed_stats(curves[curves[TRAIN_LOSS].notna()], [TRAIN_LOSS])
        for r in ordered(tr["regime"]):
            g = tr[tr["regime"] == r].sort_values("step")
            axes[0].plot(g["step"], g[TRAIN_LOSS], color=colors[r], label=r)
            _band(axes[0], g, TRAIN_LOSS, colors[r])
    axes[0].set_xlabel("optimiser step")
    axes[0].set_ylabel("training loss (mean over seeds)")
    axes[0].set_title("training loss")
    axes[0].legend(fontsize=7, ncol=2)
    m = _eval_means(curves, [KL_TRUE, KL_APPROX])
    for r in ordered(m["regime"]):
        g = m[m["regime"] == r].sort_values("step")
        axes[1].plot(g["step"], g[KL_TRUE], "-o", color=colors[r], ms=4, label=f"{r}")
        _band(axes[1], g, KL_TRUE, colors[r])
        if KL_APPROX in g and g[KL_APPROX].notna().any():
            axes[1].plot(g["step"], g[KL_APPROX], ":", color=colors[r])
    axes[1].set_yscale("symlog", linthresh=1e-2)
    axes[1].set_xlabel("optimiser step")
    axes[1].set_ylabel("KL (nats per response)")
    axes[1].set_title("true KL (solid) and the stand-in divergence (dotted)")
    for ax in axes:
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def drift(curves: pd.DataFrame, path: Path, colors: dict | None = None, title: str = "") -> Path:
    """Length, repetition, unsafe rate and perplexity over training (mean over seeds, band: the seeds' range);
    ``title``: the condition, where a report has several."""
    panels = [
        (LENGTH, "response length (tokens)"),
        (REP_2, "repeated bigram fraction"),
        (UNSAFE_RATE, "unsafe rate (judge p > threshold)"),
        (PPL, "held-out perplexity"),
    ]
    m = _eval_means(curves, [c for c, _ in panels])
    colors = _colors(colors, m["regime"])
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, (col, label) in zip(axes.flat, panels):
        if col in m:
            for r in ordered(m["regime"]):
                g = m[m["regime"] == r].sort_values("step")
                ax.plot(g["step"], g[col], "-o", color=colors[r], ms=3, label=r)
                _band(ax, g, col, colors[r])
        ax.set_xlabel("optimiser step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    if axes[0, 0].get_legend_handles_labels()[0]:
        axes[0, 0].legend(fontsize=7, ncol=2)
    head = "behaviour drift over training (mean over seeds; band: lowest to highest seed)"
    fig.suptitle(f"{title}: {head}" if title else head)
    return _save(fig, path)
