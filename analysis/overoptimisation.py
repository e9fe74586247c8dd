"""Over-optimisation over training: the gold reward's and the proxy's gain over the SFT model against sqrt(KL to the
full reference), per regime (Gao et al.'s axes), and where each run's gold reward peaked.

Per run (:func:`run_points`): the evaluation at which the gold gain (``reward_delta``, the paired difference from the
SFT model's coupled samples, 0 at step 0) is highest, with its step and true KL; the last evaluation's KL, gold gain,
proxy gain (``reward_proxy`` minus the run's own step-0 value), degenerate share and variety (the distinct bigrams of
one response per prompt, over the run's step 0's: :data:`TEMPLATE`); and the first evaluation at which at least
:data:`COLLAPSE` of the responses are degenerate or the variety is at most :data:`TEMPLATE` (the collapse). Per
regime (:func:`regime_table`): each of
those with its mean and 95% Student-t interval over seeds, and the fit of Gao et al.'s RL form
``R(d) = d (alpha - beta ln d)``, ``d = sqrt(KL)``, to every evaluation of every seed, whose maximum sits at
``d* = exp(alpha / beta - 1)`` (:func:`gao_fit`). A regime's figures are only as good as its evaluations: the peak is
one of the evaluated steps, never between them.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ablate.tracking import schema
from analysis.figure_style import LABEL_SEP, ordered, plt, regime_colors, save
from analysis.markdown import md_table, num, span
from analysis.samples import first_response_distinct_2
from analysis.stats import t_interval

KL, GOLD, PROXY = schema.logged("kl_true"), schema.logged("reward_delta"), schema.logged("reward_proxy")
DEGENERATE = schema.logged("degenerate_rate")
#: a run has collapsed at the first evaluation where at least this share of its responses are degenerate (each
#: repeats itself) ...
COLLAPSE = 0.5
#: ... or where the responses have collapsed onto a template: the distinct bigrams of one response per prompt at
#: most this share of the run's step 0's (a quarter of the SFT model's bigram variety lost; how it was chosen:
#: sweeps/drift_calibration.yaml)
TEMPLATE = 0.75
#: per-run columns summarised over seeds in :func:`regime_table`, in its order
SUMMARISED = ("end_kl", "end_gold", "end_proxy", "end_degenerate", "end_variety", "peak_gold", "peak_kl", "peak_step")
CAPTION = (
    "Left: the gold reward's gain over the SFT model (paired, on coupled samples) against the square root of the "
    "true KL to the full reference, at each evaluation (Gao et al.'s axes); dashed: Gao et al.'s RL form "
    "d (alpha - beta ln d) fitted to each regime's evaluations. Middle: the proxy (learned) reward's gain over the "
    "run's own step 0, same axis: a proxy that keeps rising while the gold falls is being gamed. Right: the share of "
    "degenerate responses (half their bigrams repeats; solid) and the variety (dotted: the distinct bigrams of one "
    "response per prompt over the run's step 0's; it falls when the responses collapse onto one template) at each "
    "step, with the collapse thresholds (grey). Thick lines: the mean over seeds of each evaluation's point; thin "
    "lines (left, middle): each seed's own path; bands (right): the lowest to the highest seed."
)


def evaluations(curves: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, evaluation): ``path, condition, regime, seed, step, kl, sqrt_kl, gold, proxy, degenerate,
    variety``; ``proxy`` is the gain over the run's own step-0 evaluation (NaN without one, or without a proxy),
    ``variety`` the distinct bigrams of one response per prompt (from the run's samples) over its step 0's (NaN
    without them)."""
    cols = ["path", "condition", "regime", "seed", "step"]
    if curves.empty or KL not in curves or GOLD not in curves:
        return pd.DataFrame(columns=[*cols, "kl", "sqrt_kl", "gold", "proxy", "degenerate", "variety"])
    ev = curves[curves[KL].notna()].sort_values(["path", "step"])
    out = ev[cols].copy()
    out["kl"] = ev[KL].astype(float)
    out["sqrt_kl"] = np.sqrt(out["kl"].clip(lower=0.0))
    out["gold"] = ev[GOLD].astype(float)
    raw = ev[PROXY].astype(float) if PROXY in ev else pd.Series(math.nan, index=ev.index)
    start = raw.where(ev["step"] == 0).groupby(ev["path"]).transform("first")
    out["proxy"] = raw - start
    out["degenerate"] = ev[DEGENERATE].astype(float) if DEGENERATE in ev else math.nan
    out["variety"] = [math.nan] * len(out)
    for path, rows in out.groupby("path").groups.items():
        distinct = first_response_distinct_2(path) if isinstance(path, str) and Path(path).is_dir() else {}
        start = distinct.get(0, math.nan)
        out.loc[rows, "variety"] = [distinct.get(int(s), math.nan) / start for s in out.loc[rows, "step"]]
    return out.reset_index(drop=True)


def _collapse_step(g: pd.DataFrame) -> float:
    hit = g[(g["degenerate"] >= COLLAPSE) | (g["variety"] <= TEMPLATE)]
    return float(hit["step"].iloc[0]) if len(hit) else math.nan


def run_points(ev: pd.DataFrame) -> pd.DataFrame:
    """Per run: its last evaluation (``end_*``), the evaluation where its gold gain peaked (``peak_*``; the first of
    equal highs), whether that was before the last (``peaked_early``) and its collapse step (NaN: none)."""
    rows = []
    for path, g in ev.groupby("path", sort=False):
        g = g.sort_values("step")
        end = g.iloc[-1]
        peak = g.loc[g["gold"].idxmax()] if g["gold"].notna().any() else end
        rows.append(
            {
                "path": path,
                "condition": end["condition"],
                "regime": end["regime"],
                "seed": end["seed"],
                "evaluations": len(g),
                "end_step": float(end["step"]),
                "end_kl": end["kl"],
                "end_gold": end["gold"],
                "end_proxy": end["proxy"],
                "end_degenerate": end["degenerate"],
                "end_variety": end["variety"],
                "peak_step": float(peak["step"]),
                "peak_kl": peak["kl"],
                "peak_gold": peak["gold"],
                "peaked_early": bool(peak["step"] < end["step"]),
                "collapse_step": _collapse_step(g),
            }
        )
    return pd.DataFrame(rows)


def gao_fit(ev: pd.DataFrame) -> tuple[float, float, float]:
    """``(alpha, beta, kl_at_peak)`` of ``gold = d (alpha - beta ln d)``, ``d = sqrt(kl)``, by least squares over the
    evaluations with ``d > 0``; ``kl_at_peak = exp(2 (alpha / beta - 1))`` where the fitted curve turns down within
    the evaluated KL (beta > 0 and d* at most the largest d), else NaN. All NaN with fewer than three evaluations
    or where the two columns cannot be told apart (a singular fit)."""
    g = ev[(ev["sqrt_kl"] > 0) & ev["gold"].notna()]
    if len(g) < 3:
        return math.nan, math.nan, math.nan
    d = [float(x) for x in g["sqrt_kl"]]
    y = [float(x) for x in g["gold"]]
    u = [-x * math.log(x) for x in d]
    # the normal equations in exactly rounded sums and scalar logs: LAPACK's least squares and numpy's vectorised log
    # round differently with the arrays' alignment and the host's SIMD, and the report must regenerate byte for byte
    suu, sdu, sdd = (
        math.fsum(a * a for a in u),
        math.fsum(a * b for a, b in zip(d, u, strict=True)),
        math.fsum(a * a for a in d),
    )
    sdy, suy = math.fsum(a * b for a, b in zip(d, y, strict=True)), math.fsum(a * b for a, b in zip(u, y, strict=True))
    det = sdd * suu - sdu * sdu
    if not det > 0:
        return math.nan, math.nan, math.nan
    alpha, beta = (sdy * suu - suy * sdu) / det, (suy * sdd - sdy * sdu) / det
    log_peak = alpha / beta - 1 if beta > 0 else math.inf  # ln d*
    peak = math.exp(2 * log_peak) if log_peak <= math.log(max(d)) else math.nan
    return alpha, beta, peak


def regime_table(ev: pd.DataFrame, points: pd.DataFrame) -> pd.DataFrame:
    """Per (condition, regime): the seeds, each :data:`SUMMARISED` column's mean with its 95% t interval over seeds
    (``<col>``, ``<col>_lo``, ``<col>_hi``), how many seeds peaked before their last evaluation and collapsed, the
    mean collapse step of those that did, and :func:`gao_fit`."""
    rows = []
    for (cond, regime), p in points.groupby(["condition", "regime"], sort=False):
        row: dict = {"condition": cond, "regime": regime, "n_seeds": len(p)}
        for col in SUMMARISED:
            iv = t_interval(p[col].astype(float))
            row.update({col: iv.mean, f"{col}_lo": iv.lo, f"{col}_hi": iv.hi})
        row["peaked_early"] = int(p["peaked_early"].sum())
        row["collapsed"] = int(p["collapse_step"].notna().sum())
        row["collapse_step"] = float(p["collapse_step"].mean()) if row["collapsed"] else math.nan
        e = ev[(ev["condition"] == cond) & (ev["regime"] == regime)]
        row["gao_alpha"], row["gao_beta"], row["gao_peak_kl"] = gao_fit(e)
        rows.append(row)
    out = pd.DataFrame(rows)
    if len(out):
        order = {r: i for i, r in enumerate(ordered(out["regime"]))}
        out = out.sort_values(["condition", "regime"], key=lambda s: s.map(order) if s.name == "regime" else s)
    return out.reset_index(drop=True)


#: per-run columns compared with the baseline's run of the same seed: (column, "ratio" | "difference")
PAIRED = (
    ("end_kl", "ratio"),
    ("peak_kl", "ratio"),
    ("end_gold", "difference"),
    ("end_degenerate", "difference"),
    ("end_variety", "difference"),
)


def against_baseline(points: pd.DataFrame, baseline: str = "full") -> pd.DataFrame:
    """Per (condition, regime) other than ``baseline``: each :data:`PAIRED` column against the baseline's run of the
    same condition and seed, as ``<col>_<ratio|difference>`` with ``_lo``/``_hi``: a ratio is the geometric mean of
    the per-seed ratios with its 95% t interval on the log scale (seeds where either value is not above 0 left out),
    a difference the mean of the per-seed differences with its t interval; ``n_paired``: the seeds both ran."""
    rows = []
    base = points[points["regime"] == baseline]
    for (cond, regime), p in points.groupby(["condition", "regime"], sort=False):
        b = base[base["condition"] == cond].set_index("seed")
        if regime == baseline or b.empty:
            continue
        p = p[p["seed"].isin(b.index)].set_index("seed")
        row: dict = {"condition": cond, "regime": regime, "n_paired": len(p)}
        for col, kind in PAIRED:
            x, y = p[col].astype(float), b.loc[p.index, col].astype(float)
            if kind == "ratio":
                ok = (x > 0) & (y > 0)
                iv = t_interval(np.log(x[ok] / y[ok]))
                values = (math.exp(iv.mean) if math.isfinite(iv.mean) else math.nan, math.exp(iv.lo), math.exp(iv.hi))
            else:
                iv = t_interval(x - y)
                values = (iv.mean, iv.lo, iv.hi)
            row.update(dict(zip((f"{col}_{kind}", f"{col}_{kind}_lo", f"{col}_{kind}_hi"), values)))
        rows.append(row)
    return pd.DataFrame(rows)


def has_curves(ev: pd.DataFrame) -> bool:
    """Whether the runs evaluated often enough for the curves to mean something: at least three evaluations a run."""
    return len(ev) > 0 and int(ev.groupby("path").size().min()) >= 3


def figure(ev: pd.DataFrame, table: pd.DataFrame, path, colors: dict | None = None, title: str = ""):
    """Three panels (see :data:`CAPTION`): gold and proxy gain against sqrt(KL), each seed's path and the mean over
    seeds at each step; the degenerate share and the variety against the step, the mean with a band from the lowest
    to the highest seed."""
    colors = colors if colors is not None else regime_colors(ev["regime"])
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    for regime in ordered(ev["regime"]):
        e = ev[ev["regime"] == regime]
        by = e.groupby("step")
        mean, lo, hi = by.mean(numeric_only=True), by.min(numeric_only=True), by.max(numeric_only=True)
        c = colors[regime]
        for ax, y in zip(axes[:2], ("gold", "proxy")):
            if mean[y].notna().any():  # both axes move: each seed's own path, and the mean of the seeds' points
                for _, run in e.groupby("path", sort=False):
                    ax.plot(run["sqrt_kl"], run[y], "-", color=c, lw=0.7, alpha=0.35)
                ax.plot(mean["sqrt_kl"], mean[y], "-o", color=c, ms=3, lw=1.6, label=regime)
        row = table[table["regime"] == regime]
        if len(row) and np.isfinite(row["gao_alpha"].iloc[0]):
            d = np.linspace(1e-3, float(mean["sqrt_kl"].max()), 100)
            a, b = row["gao_alpha"].iloc[0], row["gao_beta"].iloc[0]
            axes[0].plot(d, d * (a - b * np.log(d)), "--", color=c, lw=0.8)
        for y, style in (("degenerate", "-o"), ("variety", ":s")):
            if mean[y].notna().any():
                axes[2].plot(mean.index, mean[y], style, color=c, ms=3, label=regime if y == "degenerate" else None)
                axes[2].fill_between(mean.index, lo[y], hi[y], color=c, alpha=0.15, lw=0)
    labels = (
        ("sqrt(true KL to the full reference), sqrt(nats)", "gold reward gain over SFT (VADER, paired)"),
        ("sqrt(true KL to the full reference), sqrt(nats)", "proxy reward gain over step 0"),
        ("optimiser step", "degenerate share (solid), variety vs step 0 (dotted)"),
    )
    for ax, (x, y) in zip(axes, labels):
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
    axes[0].axhline(0, color="grey", lw=0.8)
    axes[2].axhline(COLLAPSE, color="grey", lw=0.8, ls="--")
    axes[2].axhline(TEMPLATE, color="grey", lw=0.8, ls=":")
    axes[0].legend(fontsize=7, ncol=2)
    head = "over-optimisation: gold and proxy reward against sqrt(KL)"
    fig.suptitle(f"{title}: {head}" if title else head)
    return save(fig, path)


def _step(x: float) -> str:
    """An optimiser step (or a mean of steps) as the table prints it: a whole step without a decimal point."""
    return f"{x:.0f}" if math.isfinite(x) and float(x).is_integer() else num(x)


def _cell(row: pd.Series, col: str) -> str:
    return span(row[col], row[f"{col}_lo"], row[f"{col}_hi"], _step if col.endswith("step") else num)


def section(
    curves: pd.DataFrame, out: Path, baseline: str = "full", colors: dict | None = None
) -> tuple[list[str], Path | None]:
    """The report's over-optimisation section and its figure (``[]``, None unless every run evaluated at least three
    times); writes ``overoptimisation.csv`` (one row per condition and regime: :func:`regime_table`, with
    :func:`against_baseline`'s columns)."""
    ev = evaluations(curves)
    if not has_curves(ev):
        return [], None
    points = run_points(ev)
    paired = against_baseline(points, baseline)
    table = regime_table(ev, points)
    if len(paired):
        table = table.merge(paired, on=["condition", "regime"], how="left")
    table.to_csv(out / "overoptimisation.csv", index=False)
    drawn, fitted = ev, table
    if ev["condition"].nunique() > 1:  # one line per condition and regime, labelled as the report's other figures
        drawn = ev.assign(regime=ev["condition"].astype(str) + LABEL_SEP + ev["regime"].astype(str))
        fitted = table.assign(regime=table["condition"].astype(str) + LABEL_SEP + table["regime"].astype(str))
    fig = figure(drawn, fitted, out / "figures" / "overoptimisation.png", colors)
    lines = [
        "## Over-optimisation: where the gold reward peaked",
        "",
        "Per regime, over seeds (mean [95% t interval]): the last evaluation's true KL, gold gain over the SFT model, "
        "proxy gain over the run's step 0, degenerate share and variety (the distinct bigrams of one response per "
        "prompt over the run's step 0's); the evaluation where each run's gold gain peaked (its gain, KL and step); "
        "how many seeds peaked before their last evaluation, and how many collapsed (at least "
        f"{num(COLLAPSE)} of the responses degenerate, or the variety at most {num(TEMPLATE)}: collapsed onto a "
        "template; the mean step at which they first did); the KL at the peak of "
        "Gao et al.'s RL form fitted to the regime's evaluations (n/a: the fit does not turn down within the evaluated "
        "KL). The peak is one "
        "of the evaluated steps.",
        "",
    ]
    header = ["regime", "seeds", "end KL", "end gold gain", "end proxy gain", "end degenerate", "end variety",
              "peak gold gain", "KL at peak", "step at peak", "peaked early", "collapsed (step)", "Gao peak KL"]  # fmt: skip
    for cond, t in table.groupby("condition", sort=False):
        rows = [
            [
                f"`{r['regime']}`",
                str(r["n_seeds"]),
                *(_cell(r, c) for c in SUMMARISED),
                f"{r['peaked_early']} of {r['n_seeds']}",
                f"{r['collapsed']} of {r['n_seeds']}" + (f" ({_step(r['collapse_step'])})" if r["collapsed"] else ""),
                num(r["gao_peak_kl"]),
            ]
            for _, r in t.iterrows()
        ]
        lines += ([f"### {cond}", ""] if table["condition"].nunique() > 1 else []) + [md_table(header, rows), ""]
        vs = t[t["n_paired"].notna()] if "n_paired" in t else t.iloc[0:0]
        if len(vs):
            lines += [
                f"Against `{baseline}`, paired by seed (ratio: geometric mean of the per-seed ratios [95% t interval "
                "on the log scale]; difference: mean [95% t interval]):",
                "",
                md_table(
                    [
                        "regime",
                        "seeds paired",
                        "end KL ratio",
                        "KL-at-peak ratio",
                        "end gold diff.",
                        "end degenerate diff.",
                        "end variety diff.",
                    ],  # fmt: skip
                    [
                        [f"`{r['regime']}`", str(int(r["n_paired"]))]
                        + [_cell(r, f"{col}_{kind}") for col, kind in PAIRED]
                        for _, r in vs.iterrows()
                    ],
                ),
                "",
            ]
    blind = sorted(set(ev.groupby("path").filter(lambda g: g["variety"].isna().all())["regime"].astype(str)))
    if blind:
        lines += [
            "The template rule cannot read "
            + ", ".join(f"`{r}`" for r in blind)
            + " (no responses at step 0 in a run's samples.jsonl, or no samples): there a collapse is degenerate "
            "responses only, and the end variety is n/a.",
            "",
        ]
    return lines, fig
