"""``python -m analysis plan <pilot sweep>``: how many seeds each verdict needs, from a pilot sweep's seed-to-seed spread.

For each regime against the baseline and each metric with a margin, the pilot gives the per-seed paired differences
(regime minus baseline, mean over the shared prompts, from ``samples.jsonl``; else the summaries). Their standard
deviation ``sd`` over seeds is the noise a verdict's seed-level interval carries. The power of the equivalence test
(TOST at ``alpha``, margin ``m``) with ``n`` seeds, when the true difference is ``d``, is approximated with the
noncentral t (``scipy.stats.nct``, ``n - 1`` degrees of freedom, standard error ``sd / sqrt(n)``)::

    power = P(T1 > t) + P(T2 < -t) - 1,  T1 ~ nct((d + m) / se), T2 ~ nct((d - m) / se),  t = t(1 - alpha, n - 1)

(the usual approximation; 0 where it is negative). The plan gives the seeds needed for 80% power (``--power``) when
the true difference is 0 and when it is the pilot's, and the power the pilot's own seed count has. It is a plan for
the seed-level part of the interval: the prompts' share (the crossed design's ``var_b / P``) does not shrink with
seeds, so where it dominates, more prompts are needed, not more seeds.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis import log_ratio
from analysis.declared import SFT_VALUE
from analysis.equivalence import seed_values
from analysis.pvalues import MOST_SEEDS, seeds_needed, tost_power
from analysis.report_config import ReportConfig
from analysis.samples import by_seed, paired_series


def _per_seed(
    runs: pd.DataFrame, prompts: pd.DataFrame, regime: str, baseline: str, metric: str, log: bool = False
) -> tuple[dict, bool]:
    """seed -> the paired difference of the seed's means (samples where every run of both has them, else summaries);
    ``log``: the log ratio of the means where every one is positive (:mod:`analysis.log_ratio`). And whether it is
    the log ratio."""
    reg, base = (prompts[prompts["regime"] == r] for r in (regime, baseline)) if len(prompts) else (prompts, prompts)
    if len(reg) and len(base) and metric in reg:
        pairs = log_ratio.paired_frames(by_seed(reg, metric), by_seed(base, metric))
        if log and log_ratio.applies(pairs):
            return log_ratio.seed_log_ratios(pairs), True
        out = {k: float(np.nanmean(s)) for k, s in paired_series(reg, base, metric).items() if s.notna().any()}
        if out:
            return out, False
    both = pd.concat({r: seed_values(runs, r, metric) for r in (regime, baseline)}, axis=1, join="inner").dropna()
    if log and len(both) and bool((both > 0).all().all()):
        return dict(zip(both.index, np.log(both[regime] / both[baseline]))), True
    return dict(zip(both.index, both[regime] - both[baseline])), False


def plan(runs: pd.DataFrame, prompts: pd.DataFrame, cfg: ReportConfig, power: float = 0.8) -> pd.DataFrame:
    """One row per (condition, regime other than the baseline, metric with a margin): the pilot's seeds, mean
    difference, sd over seeds, margin, the power it has, and the seeds needed for ``power`` at a true difference of 0
    and of the pilot's; ``note`` says why a figure is missing."""
    done = runs[runs["status"] == "finished"]
    out = []
    for cond, g in done.groupby("condition", sort=False):
        p = prompts[prompts["condition"] == cond] if len(prompts) else prompts
        base_mean = {
            m: float(g.loc[g["regime"] == cfg.baseline, m].astype(float).mean()) for m in cfg.margins if m in g
        }
        for regime in g["regime"].drop_duplicates():
            if regime == cfg.baseline:
                continue
            for metric in cfg.metrics():
                if metric not in cfg.margins:
                    continue
                relative = cfg.relative == "log-ratio" and cfg.margins[metric].relative
                d, log = _per_seed(g, p, regime, cfg.baseline, metric, relative)
                if log:  # the report's rule: a relative margin on the log-ratio scale
                    margin = log_ratio.log_margin(cfg.margins[metric].value)
                else:
                    margin = cfg.margins[metric].resolve(base_mean.get(metric, math.nan))
                n = len(d)
                sd = float(np.std(list(d.values()), ddof=1)) if n >= 2 else math.nan
                diff = float(np.mean(list(d.values()))) if n else math.nan
                note = (
                    "" if n >= 2 else f"{n} paired seed(s) of `{regime}` and `{cfg.baseline}`: a pilot needs 2 or more"
                )
                out.append(
                    dict(
                        condition=cond,
                        regime=regime,
                        metric=metric,
                        pilot_seeds=n,
                        diff=diff,
                        sd=sd,
                        margin=margin,
                        power_now=tost_power(sd, n, margin, diff, cfg.alpha),
                        seeds_if_0=seeds_needed(sd, margin, 0.0, cfg.alpha, power),
                        seeds_if_observed=seeds_needed(sd, margin, diff, cfg.alpha, power),
                        note=note,
                    )
                )
    if not out and len(done):
        regimes = ", ".join(sorted(done["regime"].unique()))
        out.append(dict(condition="", regime=regimes, metric="", note=f"no regime to compare with `{cfg.baseline}`"))
    return pd.DataFrame(out)


def describe(table: pd.DataFrame, power: float) -> list[str]:
    """The plan as lines: a markdown table (seeds needed, ``>64`` where more would not do)."""
    if not len(table) or "pilot_seeds" not in table:
        return [f"plan: {r}" for r in table.get("note", pd.Series(["no finished runs"]))]

    def seeds(v):
        return "n/a" if math.isnan(v) else f">{MOST_SEEDS}" if math.isinf(v) else f"{v:.0f}"

    def f(v):
        return "n/a" if not math.isfinite(v) else f"{v:.3g}"

    lines = [
        f"| condition | regime | metric | pilot seeds | diff | sd over seeds | margin | power now | seeds for "
        f"{power:.0%} if 0 | if as observed | note |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for _, r in table.iterrows():
        lines.append(
            f"| {r['condition']} | {r['regime']} | {r['metric']} | {r['pilot_seeds']} | {f(r['diff'])} | {f(r['sd'])} "
            f"| {f(r['margin'])} | {f(r['power_now'])} | {seeds(r['seeds_if_0'])} | {seeds(r['seeds_if_observed'])} "
            f"| {r['note']} |"
        )
    return lines


def margins_from_effect(runs: pd.DataFrame, cfg: ReportConfig, fraction: float) -> pd.DataFrame:
    """Margins to declare before a sweep (``plan.margins``), per condition of the baseline's runs (a calibration's
    settings): ``fraction`` of the baseline's effect over the SFT model on each metric with an SFT value
    (:data:`analysis.declared.SFT_VALUE`), from the mean over its finished runs."""
    done = runs[(runs["status"] == "finished") & (runs["regime"] == cfg.baseline)]
    out = []
    for cond, g in done.groupby("condition", sort=False):
        for metric, sft in SFT_VALUE.items():
            if metric not in g:
                continue
            mean = float(g[metric].astype(float).mean())
            effect = abs(mean - sft)
            out.append(
                dict(
                    condition=cond, metric=metric, runs=len(g), mean=mean, sft=sft, effect=effect,
                    margin=fraction * effect, override=f"+plan.margins.{metric}={fraction * effect:.3g}",
                )
            )  # fmt: skip
    return pd.DataFrame(out)


def describe_margins(table: pd.DataFrame, fraction: float) -> list[str]:
    """The derived margins as a markdown table, each with the override that declares it."""
    if not len(table):
        return ["plan: no finished baseline runs to derive margins from"]
    lines = [
        f"Margins at {fraction:.0%} of the baseline's effect over the SFT model (declare them before the runs: "
        "the overrides, or a `plan:` block in the sweep preset):",
        "",
        "| condition | metric | runs | baseline mean | SFT | effect | margin | override |",
        "|---|---|--:|--:|--:|--:|--:|---|",
    ]
    for _, r in table.iterrows():
        lines.append(
            f"| {r['condition']} | {r['metric']} | {r['runs']} | {r['mean']:.3g} | {r['sft']:g} | {r['effect']:.3g} | "
            f"{r['margin']:.3g} | `{r['override']}` |"
        )
    return lines
