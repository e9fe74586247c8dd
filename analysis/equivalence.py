"""Each regime against the baseline: one verdict per metric, *different*, *equivalent* or *inconclusive*.

The rule (alpha from the report's config, 0.05 by default):

- *equivalent*: two one-sided tests (TOST) at level alpha: the (1 - 2 alpha) = 90% interval of the difference
  lies inside (-margin, +margin);
- *different*: not equivalent, and the (1 - alpha) = 95% interval of the difference excludes 0 (so it is not
  inside the margins either);
- *inconclusive*: neither: the data cannot tell an effect as large as the margin from none.

A difference smaller than the margin that the 95% interval still detects is *equivalent* (the practitioner's
question is whether the stand-in changes the result by more than the margin), with a note.

The intervals are hierarchical percentile bootstraps over seeds and prompts (:mod:`analysis.bootstrap`),
paired by seed and prompt, from each run's ``samples.jsonl``; where a run of the comparison has none, the
interval is the seed-level paired Student-t interval of the summary values, and the row says so.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis import bootstrap
from analysis.markdown import bracket, num
from analysis.report_config import ReportConfig
from analysis.samples import PER_PROMPT, by_seed, groups, paired_differences
from analysis.stats import is_positive, positive_interval, t_interval

EQUIVALENT, DIFFERENT, INCONCLUSIVE = "equivalent", "different", "inconclusive"
BOOT = "hierarchical bootstrap"
SEED_T = "seed-level t (no samples.jsonl)"


def verdict(lo: float, hi: float, lo_inner: float, hi_inner: float, margin: float) -> str:
    """The verdict from the (1 - alpha) interval ``[lo, hi]`` and the (1 - 2 alpha) interval ``[lo_inner,
    hi_inner]`` of a difference, with equivalence margin ``margin`` (see the module's rule)."""
    if math.isfinite(margin) and math.isfinite(lo_inner) and -margin < lo_inner and hi_inner < margin:
        return EQUIVALENT
    if math.isfinite(lo) and (lo > 0 or hi < 0):
        return DIFFERENT
    return INCONCLUSIVE


def boot_method(per_seed) -> str:
    """``hierarchical bootstrap (3 seeds x 64 prompts)``, or the prompts in all when seeds differ."""
    sizes = [int(np.isfinite(np.asarray(x, dtype=float)).sum()) for x in per_seed]
    sizes = [n for n in sizes if n]
    if len(set(sizes)) == 1:
        return f"{BOOT} ({len(sizes)} seed{'s' * (len(sizes) > 1)} x {sizes[0]} prompts)"
    return f"{BOOT} ({len(sizes)} seeds, {sum(sizes)} prompts in all)"


def _seed_values(runs: pd.DataFrame, regime: str, metric: str) -> pd.Series:
    g = runs[runs["regime"] == regime].drop_duplicates("seed", keep="last").set_index("seed")
    return g[metric].astype(float) if metric in g else pd.Series(dtype=float)


def _t_row(runs: pd.DataFrame, regime: str, baseline: str, metric: str, alpha: float) -> dict:
    """Seed-level paired t intervals of the summary values (the fallback without samples.jsonl)."""
    both = pd.concat(
        [_seed_values(runs, regime, metric).rename("r"), _seed_values(runs, baseline, metric).rename("b")],
        axis=1,
        join="inner",
    ).dropna()
    d = (both["r"] - both["b"]).to_numpy()
    outer, inner = t_interval(d, 1 - alpha), t_interval(d, 1 - 2 * alpha)
    note = f"{len(d)} paired seed(s): no interval" if len(d) < 2 else ""
    return dict(
        n_seeds=len(d),
        n_prompts=0,
        baseline_mean=float(both["b"].mean()) if len(d) else math.nan,
        regime_mean=float(both["r"].mean()) if len(d) else math.nan,
        diff=outer.mean,
        lo=outer.lo,
        hi=outer.hi,
        lo_inner=inner.lo,
        hi_inner=inner.hi,
        method=SEED_T,
        note=note,
    )


def _boot_row(reg: pd.DataFrame, base: pd.DataFrame, metric: str, cfg: ReportConfig, key: tuple) -> dict:
    """Hierarchical bootstrap of the per-prompt differences, paired by seed and prompt."""
    diffs = paired_differences(reg, base, metric)
    iv = bootstrap.interval(
        list(diffs.values()), cfg.n_boot, bootstrap.rng_for(cfg.seed, *key), 1 - cfg.alpha, 1 - 2 * cfg.alpha
    )
    seeds = sorted(diffs)
    b = bootstrap.estimate([s.to_numpy() for k, s in by_seed(base, metric).items() if k in diffs])
    r = bootstrap.estimate([s.to_numpy() for k, s in by_seed(reg, metric).items() if k in diffs])
    note = "1 seed: the interval is over prompts only" if iv.n_seeds == 1 else ""
    if metric == "win_rate" and "win_against" in reg and (reg["win_against"] != reg["win_against"].iloc[0]).any():
        note = "win rates of runs with and without independent SFT samples"
    return dict(
        n_seeds=len(seeds),
        n_prompts=iv.n_prompts,
        baseline_mean=b,
        regime_mean=r,
        diff=iv.estimate,
        lo=iv.lo,
        hi=iv.hi,
        lo_inner=iv.lo_inner,
        hi_inner=iv.hi_inner,
        method=boot_method(diffs.values()),
        note=note,
    )


def _has_samples_for_every_seed(runs: pd.DataFrame, prompts: pd.DataFrame, regime: str) -> bool:
    seeds = set(runs.loc[runs["regime"] == regime, "seed"])
    return bool(seeds) and seeds <= set(prompts.loc[prompts["regime"] == regime, "seed"])


def _per_prompt(prompts: pd.DataFrame, metric: str, regimes: tuple) -> bool:
    """Whether every sample file of these regimes has ``metric`` (older runs' samples lack some columns: their
    summary values are used instead)."""
    if metric not in PER_PROMPT:
        return False
    values = prompts.loc[prompts["regime"].isin(regimes), metric]
    return bool(len(values)) and bool(values.notna().all())


def compare(runs: pd.DataFrame, prompts: pd.DataFrame, cfg: ReportConfig) -> pd.DataFrame:
    """One row per (condition, regime other than the baseline, metric with a margin): the difference, its
    intervals, the resolved margin, the verdict, the method and a note."""
    done = runs[runs["status"] == "finished"]
    out = []
    for cond, g in done.groupby("condition", sort=False):
        if not (g["regime"] == cfg.baseline).any():
            continue
        p = prompts[prompts["condition"] == cond] if len(prompts) else prompts
        for regime in g["regime"].drop_duplicates():
            if regime == cfg.baseline:
                continue
            boot = all(_has_samples_for_every_seed(g, p, r) for r in (regime, cfg.baseline))
            for metric in cfg.metrics():
                if boot and _per_prompt(p, metric, (regime, cfg.baseline)):
                    reg, base = p[p["regime"] == regime], p[p["regime"] == cfg.baseline]
                    row = _boot_row(reg, base, metric, cfg, (cond, regime, metric))
                elif metric in g:
                    row = _t_row(g, regime, cfg.baseline, metric, cfg.alpha)
                else:
                    continue  # neither samples nor a summary value: not measured
                margin = cfg.margins[metric].resolve(row["baseline_mean"]) if metric in cfg.margins else math.nan
                v = verdict(row["lo"], row["hi"], row["lo_inner"], row["hi_inner"], margin)
                if v == EQUIVALENT and (row["lo"] > 0 or row["hi"] < 0):
                    row["note"] = "; ".join(x for x in (row["note"], "a difference smaller than the margin") if x)
                if not math.isfinite(margin):
                    row["note"] = "; ".join(x for x in (row["note"], "no margin (no baseline mean)") if x)
                out.append({"condition": cond, "regime": regime, "metric": metric, **row, "margin": margin})
                out[-1]["verdict"] = v
    return pd.DataFrame(out)


def regime_intervals(runs: pd.DataFrame, prompts: pd.DataFrame, cfg: ReportConfig) -> pd.DataFrame:
    """Per (condition, regime, metric with a margin): its own estimate with a 95% interval: the hierarchical
    bootstrap over seeds and prompts where every run has samples.jsonl, else over seeds (positive quantities
    with :func:`analysis.stats.positive_interval`)."""
    done = runs[runs["status"] == "finished"]
    out = []
    for (cond, regime), g in done.groupby(["condition", "regime"], sort=False):
        p = prompts[(prompts["condition"] == cond) & (prompts["regime"] == regime)] if len(prompts) else prompts
        boot = _has_samples_for_every_seed(g, p, regime)
        for metric in cfg.metrics():
            key = (cond, regime, metric, "own")
            if boot and _per_prompt(p, metric, (regime,)):
                iv = bootstrap.interval(groups(p, metric), cfg.n_boot, bootstrap.rng_for(cfg.seed, *key), 1 - cfg.alpha)
                row = dict(estimate=iv.estimate, lo=iv.lo, hi=iv.hi, n_seeds=iv.n_seeds, n_prompts=iv.n_prompts)
                row["method"] = boot_method(groups(p, metric))
            elif metric in g:
                values = g.drop_duplicates("seed", keep="last")[metric].astype(float)
                if is_positive(metric):
                    tv = positive_interval(values, bootstrap.rng_for(cfg.seed, *key), 1 - cfg.alpha)
                else:
                    tv = t_interval(values, 1 - cfg.alpha)
                row = dict(estimate=tv.mean, lo=tv.lo, hi=tv.hi, n_seeds=tv.n, n_prompts=0)
                row["method"] = f"seed-level {tv.method} (no samples.jsonl)"
            else:
                continue
            out.append({"condition": cond, "regime": regime, "metric": metric, **row})
    return pd.DataFrame(out)


def null_control(cmp: pd.DataFrame, cfg: ReportConfig) -> list[str]:
    """Markdown lines on the null control: whether it came out equivalent on every metric, per condition, and a
    loud warning where it did not (then no verdict of the report should be trusted)."""
    name = cfg.null_control
    rows = cmp[cmp["regime"] == name] if len(cmp) else cmp
    if not len(rows):
        return [
            f"- No `{name}` runs compared with `{cfg.baseline}`: this report has no null control, so nothing "
            "checks that its verdicts can tell an effect from noise."
        ]
    lines = []
    for cond, g in rows.groupby("condition", sort=False):
        floor = ", ".join(f"`{r['metric']}` {num(r['diff'])} {bracket(r['lo'], r['hi'])}" for _, r in g.iterrows())
        floor = (
            f"  - the noise floor ({cond}): `{name}` - `{cfg.baseline}`, what a change that should do nothing "
            f"does to each verdict metric (95% intervals): {floor}."
        )
        bad = g[g["verdict"] != EQUIVALENT]
        if not len(bad):
            lines.append(
                f"- Null control ({cond}): `{name}` came out **equivalent** to `{cfg.baseline}` on "
                f"{', '.join(f'`{m}`' for m in g['metric'])}, as it must."
            )
            lines.append(floor)
        else:
            which = ", ".join(f"`{r['metric']}` {r['verdict']}" for _, r in bad.iterrows())
            lines.append(
                f"- **WARNING ({cond}): the null control `{name}` did NOT come out equivalent to `{cfg.baseline}` "
                f"({which}). It should be indistinguishable from the baseline: no other verdict of this report "
                "should be trusted.**"
            )
            lines.append(floor)
    return lines
