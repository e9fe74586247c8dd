"""Each regime against the baseline: one verdict per metric, *different*, *equivalent* or *inconclusive*.

The rule (alpha from the report's config, 0.05 by default):

- *equivalent*: two one-sided tests (TOST) at level alpha: the (1 - 2 alpha) = 90% interval of the difference
  lies inside (-margin, +margin);
- *different*: not equivalent, and the (1 - alpha) = 95% interval of the difference excludes 0 (so it is not
  inside the margins either);
- *inconclusive*: neither: the data cannot tell an effect as large as the margin from none.

A difference smaller than the margin that the 95% interval still detects is *equivalent* (the practitioner's
question is whether the stand-in changes the result by more than the margin), with a note. A regime whose values
equal the baseline's on every sample (every prompt of every seed) gets no verdict but *determinism check*: an
identical code path cannot differ by noise, so the row tests nothing; it has no p-value and is not counted. A
comparison on one paired seed is *inconclusive* whatever its interval, its note saying what the prompts alone would
give: one seed's interval is over its prompts only, and training noise, which only a second seed measures, is not in
it (a PARTIAL report's regime at its first seed, a one-seed sweep).

The intervals come from each run's ``samples.jsonl``, paired by seed and prompt: a hierarchical percentile
bootstrap over seeds and prompts (:mod:`analysis.bootstrap`) and, with two seeds or more, also the Student-t
interval of the per-seed means (``n_seeds - 1`` degrees of freedom); the interval used is their union, end by end.
The bootstrap alone is too narrow with few seeds: resampling 4 seeds cannot show how far a fifth would fall, and
where the seeds disagree more than their prompts do (training noise), its 95% interval covered the truth in about
86% of simulated 4-seed sweeps and 75% of 2-seed ones (``tests/analysis/test_equivalence.py``). The seed-level t
interval is exact for normal seed means but treats the shared prompt set as fixed; the bootstrap resamples the
prompts. Where a run of the comparison has no ``samples.jsonl``, the interval is the seed-level paired Student-t
interval of the summary values, and the row says so.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis import bootstrap, crossed, log_ratio, pvalues
from analysis.markdown import bracket, num
from analysis.report_config import ReportConfig
from analysis.samples import PER_PROMPT, by_seed, groups, paired_series
from analysis.stats import is_positive, positive_interval, t_interval

EQUIVALENT, DIFFERENT, INCONCLUSIVE = "equivalent", "different", "inconclusive"
# a regime identical to the baseline on every sample of every seed (the same code path, e.g. GRPO's ``cached`` with
# ``miss=fallback``, DPO's ``topk`` with ``keep_sampled=true``): it checks determinism, it cannot fail on noise, so it
# is no test: left out of the verdict counts and of Holm's family
DETERMINISM = "determinism check"
IDENTICAL = "identical to the baseline on every sample: a determinism check, not a test"
BOOT = "hierarchical bootstrap"
UNION = "union of hierarchical bootstrap and seed-level t"
CROSSED = "union of two-way bootstrap, two-way t and seed-level t"
SEED_T = "seed-level t (no samples.jsonl)"
T_WIDER = "the seeds' spread sets the interval (seed-level t wider)"
TWO_WAY_WIDER = "the prompts' spread sets the interval (two-way t wider)"
#: a comparison on one paired seed gets no verdict: its interval is over the prompts alone, and training noise (what a
#: second seed would measure; the null control's seeds show it can be larger than the prompts') is not in it
ONE_SEED = "no verdict from one seed (training noise is not in its interval): {v} over the prompts alone"


def verdict(lo: float, hi: float, lo_inner: float, hi_inner: float, margin: float) -> str:
    """The verdict from the (1 - alpha) interval ``[lo, hi]`` and the (1 - 2 alpha) interval ``[lo_inner,
    hi_inner]`` of a difference, with equivalence margin ``margin`` (see the module's rule)."""
    if math.isfinite(margin) and math.isfinite(lo_inner) and -margin < lo_inner and hi_inner < margin:
        return EQUIVALENT
    if math.isfinite(lo) and (lo > 0 or hi < 0):
        return DIFFERENT
    return INCONCLUSIVE


def boot_method(per_seed, two_way: bool = False) -> str:
    """``hierarchical bootstrap (1 seed x 64 prompts)``, ``union of ... (3 seeds x 64 prompts)``, or the prompts in
    all when seeds differ; ``two_way``: the crossed design's union (:data:`CROSSED`)."""
    sizes = [int(np.isfinite(np.asarray(x, dtype=float)).sum()) for x in per_seed]
    sizes = [n for n in sizes if n]
    name = CROSSED if two_way else UNION if len(sizes) > 1 else BOOT
    if len(set(sizes)) == 1:
        return f"{name} ({len(sizes)} seed{'s' * (len(sizes) > 1)} x {sizes[0]} prompts)"
    return f"{name} ({len(sizes)} seeds, {sum(sizes)} prompts in all)"


def seed_cell(per_seed: dict) -> str:
    """``seed:difference`` of each seed (every digit), ``;``-separated (``equivalence.csv``'s ``seed_diffs``; empty with
    one seed)."""
    if len(per_seed) < 2:
        return ""
    return ";".join(f"{seed}:{float(v)!r}" for seed, v in per_seed.items())


def parse_seed_cell(cell) -> dict:
    """The seeds and differences of a :func:`seed_cell` (``{}`` for an empty or missing cell)."""
    if not isinstance(cell, str) or not cell:
        return {}
    return {k: float(v) for k, v in (item.split(":") for item in cell.split(";"))}


def seed_t_bounds(per_seed, alpha: float, positive: bool = False) -> tuple[float, float, float, float]:
    """``(lo, hi, lo_inner, hi_inner)``: Student-t intervals at 1 - alpha and 1 - 2 alpha of the mean over seeds of
    each seed's mean over its prompts (NaN with fewer than two seeds). ``positive``: on the log scale, back-
    transformed (a positive quantity's interval then never crosses zero)."""
    means = [float(np.mean(x[np.isfinite(x)])) for x in map(np.asarray, per_seed) if np.isfinite(x).any()]
    if len(means) < 2:
        return (math.nan,) * 4
    if positive and min(means) > 0:
        outer, inner = t_interval(np.log(means), 1 - alpha), t_interval(np.log(means), 1 - 2 * alpha)
        return tuple(math.exp(v) for v in (outer.lo, outer.hi, inner.lo, inner.hi))
    outer, inner = t_interval(means, 1 - alpha), t_interval(means, 1 - 2 * alpha)
    return outer.lo, outer.hi, inner.lo, inner.hi


def _widen(ends: tuple, other: tuple) -> tuple:
    """``(lo, hi, lo_inner, hi_inner)`` widened, end by end, to ``other``'s (unchanged where ``other`` is NaN)."""
    if not math.isfinite(other[0]):
        return ends
    return min(ends[0], other[0]), max(ends[1], other[1]), min(ends[2], other[2]), max(ends[3], other[3])


def union_row(
    iv: bootstrap.BootInterval, per_seed, alpha: float, positive: bool = False, two_way: np.ndarray | None = None
) -> dict:
    """The bootstrap's intervals widened, end by end, to the seed-level t intervals (:func:`seed_t_bounds`) and, for
    a crossed ``two_way`` table (``[seeds, prompts]``, :mod:`analysis.crossed`), to its two-way t intervals: ``lo``,
    ``hi``, ``lo_inner``, ``hi_inner``, each method's own 95% ends (``boot_lo`` ..., ``seed_t_lo`` ...,
    ``crossed_t_lo`` ...; NaN where it does not apply) and a note when a t interval set an end."""
    t = seed_t_bounds(per_seed, alpha, positive)
    boot = (iv.lo, iv.hi, iv.lo_inner, iv.hi_inner)
    c = (math.nan,) * 4
    if two_way is not None:
        c = crossed.t_bounds(two_way, 1 - alpha) + crossed.t_bounds(two_way, 1 - 2 * alpha)
    seeds = _widen(boot, t)
    union = _widen(seeds, c)
    return dict(
        lo=union[0],
        hi=union[1],
        lo_inner=union[2],
        hi_inner=union[3],
        boot_lo=iv.lo,
        boot_hi=iv.hi,
        seed_t_lo=t[0],
        seed_t_hi=t[1],
        crossed_t_lo=c[0],
        crossed_t_hi=c[1],
        note=TWO_WAY_WIDER if union != seeds else T_WIDER if seeds != boot else "",
    )


def seed_values(runs: pd.DataFrame, regime: str, metric: str) -> pd.Series:
    """seed -> a regime's summary value of ``metric`` (the last run of a seed when repeated)."""
    g = runs[runs["regime"] == regime].drop_duplicates("seed", keep="last").set_index("seed")
    return g[metric].astype(float) if metric in g else pd.Series(dtype=float)


def _t_row(
    runs: pd.DataFrame, regime: str, baseline: str, metric: str, alpha: float, log: bool = False
) -> tuple[dict, list]:
    """Seed-level paired t intervals of the summary values (the fallback without samples.jsonl), and that t test;
    ``log``: of the per-seed log ratios (:mod:`analysis.log_ratio`), where every value is positive."""
    both = pd.concat(
        [seed_values(runs, regime, metric).rename("r"), seed_values(runs, baseline, metric).rename("b")],
        axis=1,
        join="inner",
    ).dropna()
    log = log and bool(len(both)) and bool((both > 0).all().all())
    d = (np.log(both["r"] / both["b"]) if log else both["r"] - both["b"]).to_numpy()
    outer, inner = t_interval(d, 1 - alpha), t_interval(d, 1 - 2 * alpha)
    seeds = seed_cell(dict(zip(both.index, d)))
    note = f"{len(d)} paired seed(s): no interval" if len(d) < 2 else ""
    row = dict(
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
        seed_diffs=seeds,
        identical=bool(len(d)) and bool((d == 0).all()),
        scale=log_ratio.SCALE if log else log_ratio.DIFFERENCE,
    )
    return row, [pvalues.seed_t([[v] for v in d])]


def _boot_row(reg: pd.DataFrame, base: pd.DataFrame, metric: str, cfg: ReportConfig, key: tuple) -> tuple[dict, list]:
    """The per-prompt differences, paired by seed and prompt: with seeds that share their prompts (and
    ``cfg.design`` not ``nested``) the crossed design's union (:mod:`analysis.crossed`), else the hierarchical
    bootstrap's; and the tests of the union's methods (:mod:`analysis.pvalues`)."""
    series = paired_series(reg, base, metric)
    diffs = {k: s.to_numpy(dtype=float) for k, s in series.items()}
    two_way = crossed.table(series) if cfg.design != "nested" and crossed.is_crossed(series) else None
    iv = boot_interval(list(diffs.values()), two_way, cfg.n_boot, bootstrap.rng_for(cfg.seed, *key), cfg.alpha)
    seeds = sorted(diffs)
    b = bootstrap.estimate([s.to_numpy() for k, s in by_seed(base, metric).items() if k in diffs])
    r = bootstrap.estimate([s.to_numpy() for k, s in by_seed(reg, metric).items() if k in diffs])
    ends = union_row(iv, list(diffs.values()), cfg.alpha, two_way=two_way)
    widened = ends.pop("note")
    note = "1 seed: the interval is over prompts only" if iv.n_seeds == 1 else widened
    if metric == "win_rate" and "win_against" in reg and (reg["win_against"] != reg["win_against"].iloc[0]).any():
        note = "win rates of runs with and without independent SFT samples"
    tests = [pvalues.BootTest(iv.reps), pvalues.seed_t(list(diffs.values()))]
    if two_way is not None:
        tests.append(crossed.t_test(two_way))
    row = dict(
        n_seeds=len(seeds),
        n_prompts=iv.n_prompts,
        baseline_mean=b,
        regime_mean=r,
        diff=iv.estimate,
        **ends,
        method=boot_method(diffs.values(), two_way is not None),
        note=note,
        seed_diffs=seed_cell({k: np.mean(v[np.isfinite(v)]) for k, v in diffs.items() if np.isfinite(v).any()}),
        identical=_identical(diffs.values()),
        scale=log_ratio.DIFFERENCE,
    )
    return row, tests


def _ratio_row(reg: pd.DataFrame, base: pd.DataFrame, metric: str, cfg: ReportConfig, key: tuple):
    """A relative metric on the log-ratio scale (:mod:`analysis.log_ratio`): the per-seed log ratios of both runs'
    means, the union of their bootstrap (both means redrawn with the prompts) and their seed-level t interval
    (:func:`union_row`), and the tests of both; None where a seed's mean is not positive (no log ratio)."""
    pairs = log_ratio.paired_frames(by_seed(reg, metric), by_seed(base, metric))
    if not log_ratio.applies(pairs):
        return None
    two_way = cfg.design != "nested" and log_ratio.is_crossed(pairs)
    reps = log_ratio.resample(pairs, cfg.n_boot, bootstrap.rng_for(cfg.seed, *key), two_way)
    a = cfg.alpha
    lo, hi, lo_in, hi_in = (float(v) for v in np.nanquantile(reps, [a / 2, 1 - a / 2, a, 1 - a]))
    logs = log_ratio.seed_log_ratios(pairs)
    per_seed = [np.array([v]) for v in logs.values()]
    n_prompts = sum(len(f) for f in pairs.values())
    iv = bootstrap.BootInterval(log_ratio.estimate(pairs), lo, hi, lo_in, hi_in, len(pairs), n_prompts, reps)
    ends = union_row(iv, per_seed, a)
    widened = ends.pop("note")
    means = log_ratio.seed_means(pairs)
    sizes = {len(f) for f in pairs.values()}
    shape = (
        f"{len(pairs)} seed{'s' * (len(pairs) > 1)} x {sizes.pop()} prompts"
        if len(sizes) == 1
        else (f"{len(pairs)} seeds, {n_prompts} prompts in all")
    )
    method = f"{log_ratio.SCALE}: {'two-way' if two_way else 'hierarchical'} bootstrap of both means"
    method += f" and seed-level t ({shape})" if len(pairs) > 1 else f" ({shape})"
    row = dict(
        n_seeds=len(pairs),
        n_prompts=n_prompts,
        baseline_mean=float(np.mean([b for _, b in means.values()])),
        regime_mean=float(np.mean([r for r, _ in means.values()])),
        diff=iv.estimate,
        **ends,
        method=method,
        note="1 seed: the interval is over prompts only" if len(pairs) == 1 else widened,
        seed_diffs=seed_cell(logs),
        identical=all(bool((f["r"] == f["b"]).all()) for f in pairs.values()),
        scale=log_ratio.SCALE,
    )
    return row, [pvalues.BootTest(reps), pvalues.seed_t(per_seed)]


def _identical(per_seed) -> bool:
    """Every finite per-prompt difference of every seed exactly 0 (and at least one)."""
    values = np.concatenate([np.asarray(x, dtype=float) for x in per_seed]) if per_seed else np.array([])
    values = values[np.isfinite(values)]
    return bool(len(values)) and bool((values == 0).all())


def boot_interval(
    per_seed: list, two_way: np.ndarray | None, n_boot: int, rng: np.random.Generator, alpha: float
) -> bootstrap.BootInterval:
    """The bootstrap's estimate and percentile intervals at 1 - alpha and 1 - 2 alpha: two-way over a crossed table
    (:func:`analysis.crossed.resample`), else hierarchical over ``per_seed``."""
    if two_way is None:
        return bootstrap.interval(per_seed, n_boot, rng, 1 - alpha, 1 - 2 * alpha)
    reps = crossed.resample(two_way, n_boot, rng)
    a = alpha
    lo, hi, lo_in, hi_in = (float(v) for v in np.nanquantile(reps, [a / 2, 1 - a / 2, a, 1 - a]))
    n_prompts = int(np.isfinite(two_way).sum())
    return bootstrap.BootInterval(crossed.estimate(two_way), lo, hi, lo_in, hi_in, len(two_way), n_prompts, reps)


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
                ratio = cfg.relative == "log-ratio" and metric in cfg.margins and cfg.margins[metric].relative
                if boot and _per_prompt(p, metric, (regime, cfg.baseline)):
                    reg, base = p[p["regime"] == regime], p[p["regime"] == cfg.baseline]
                    made = _ratio_row(reg, base, metric, cfg, (cond, regime, metric)) if ratio else None
                    row, tests = made or _boot_row(reg, base, metric, cfg, (cond, regime, metric))
                elif metric in g:
                    row, tests = _t_row(g, regime, cfg.baseline, metric, cfg.alpha, log=ratio)
                else:
                    continue  # neither samples nor a summary value: not measured
                if ratio and row["scale"] != log_ratio.SCALE:
                    why = "no log ratio (a mean not positive): the difference against share x the baseline's mean"
                    row["note"] = "; ".join(x for x in (row["note"], why) if x)
                if row["scale"] == log_ratio.SCALE:
                    margin = log_ratio.log_margin(cfg.margins[metric].value)
                elif metric in cfg.margins:
                    margin = cfg.margins[metric].resolve(row["baseline_mean"])
                else:
                    margin = math.nan
                v = verdict(row["lo"], row["hi"], row["lo_inner"], row["hi_inner"], margin)
                if v == EQUIVALENT and (row["lo"] > 0 or row["hi"] < 0):
                    row["note"] = "; ".join(x for x in (row["note"], "a difference smaller than the margin") if x)
                if row["n_seeds"] == 1 and v != INCONCLUSIVE and not row["identical"]:
                    row["note"] = "; ".join(x for x in (row["note"], ONE_SEED.format(v=v)) if x)
                    v = INCONCLUSIVE
                if not math.isfinite(margin):
                    row["note"] = "; ".join(x for x in (row["note"], "no margin (no baseline mean)") if x)
                p_diff, p_tost = pvalues.union(tests, margin)
                out.append({"condition": cond, "regime": regime, "metric": metric, **row, "margin": margin})
                out[-1].update(verdict=v, p_diff=p_diff, p_tost=p_tost, **_power(row, margin, cfg.alpha))
    return _adjusted(_determinism(pd.DataFrame(out)), cfg)


def _determinism(cmp: pd.DataFrame) -> pd.DataFrame:
    """A regime identical to the baseline on every sample of every verdict metric (in a condition) becomes a
    :data:`DETERMINISM` row per metric: no verdict, no p-value, no power (one identical metric alone, e.g. the same
    lengths from a policy whose log-probs moved, is still a test)."""
    if not len(cmp):
        return cmp
    same = cmp.groupby(["condition", "regime"], sort=False)["identical"].transform("all").astype(bool)
    cmp.loc[same, "verdict"] = DETERMINISM
    cmp.loc[same, ["p_diff", "p_tost", "power_tost", "seeds_for_power"]] = math.nan
    cmp.loc[same, "note"] = [("; ".join(x for x in (n, IDENTICAL) if x)) for n in cmp.loc[same, "note"]]
    return cmp.drop(columns="identical")


def _power(row: dict, margin: float, alpha: float) -> dict:
    """The TOST's power with the row's own seeds, and the seeds it needs for 80%, if the true difference were 0 and
    the seeds' spread the row's (:func:`analysis.pvalues.tost_power`; NaN with fewer than two seeds)."""
    per_seed = list(parse_seed_cell(row["seed_diffs"]).values())
    sd = float(np.std(per_seed, ddof=1)) if len(per_seed) >= 2 else math.nan
    return dict(
        power_tost=pvalues.tost_power(sd, len(per_seed), margin, 0.0, alpha),
        seeds_for_power=pvalues.seeds_needed(sd, margin, 0.0, alpha),
    )


def _adjusted(cmp: pd.DataFrame, cfg: ReportConfig) -> pd.DataFrame:
    """``p_holm``: Holm's adjustment of ``p_diff`` over the table's rows (one family: every regime, metric and
    condition compared); with ``cfg.multiplicity == "holm"`` a *different* whose adjusted p is not below alpha
    becomes *inconclusive*, with a note."""
    if not len(cmp):
        return cmp
    cmp["p_holm"] = pvalues.holm(cmp["p_diff"])
    if cfg.multiplicity != "holm":
        return cmp
    lost = (cmp["verdict"] == DIFFERENT) & ~(cmp["p_holm"] < cfg.alpha)
    for i in cmp.index[lost]:
        why = f"different before Holm's adjustment over {int(cmp['p_diff'].notna().sum())} tests"
        cmp.loc[i, "note"] = "; ".join(x for x in (cmp.loc[i, "note"], why) if x)
        cmp.loc[i, "verdict"] = INCONCLUSIVE
    return cmp


def regime_intervals(runs: pd.DataFrame, prompts: pd.DataFrame, cfg: ReportConfig) -> pd.DataFrame:
    """Per (condition, regime, metric with a margin): its own estimate with a 95% interval: where every run has
    samples.jsonl, the hierarchical bootstrap over seeds and prompts widened to the seed-level t interval
    (:func:`union_row`; positive quantities' on the log scale), else over seeds only (positive quantities with
    :func:`analysis.stats.positive_interval`)."""
    done = runs[runs["status"] == "finished"]
    out = []
    for (cond, regime), g in done.groupby(["condition", "regime"], sort=False):
        p = prompts[(prompts["condition"] == cond) & (prompts["regime"] == regime)] if len(prompts) else prompts
        boot = _has_samples_for_every_seed(g, p, regime)
        for metric in cfg.metrics():
            key = (cond, regime, metric, "own")
            if boot and _per_prompt(p, metric, (regime,)):
                per_seed = groups(p, metric)
                iv = bootstrap.interval(per_seed, cfg.n_boot, bootstrap.rng_for(cfg.seed, *key), 1 - cfg.alpha)
                ends = union_row(iv, per_seed, cfg.alpha, is_positive(metric))
                row = dict(
                    estimate=iv.estimate, lo=ends["lo"], hi=ends["hi"], n_seeds=iv.n_seeds, n_prompts=iv.n_prompts
                )
                row["method"] = boot_method(per_seed)
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
    """Markdown lines on the null control, per condition: equivalent on every metric, as it must be; a loud warning
    where it came out *different* on one (a bias: then no verdict of the report should be trusted); where it is only
    *inconclusive*, a plain statement that the report is underpowered on those metrics."""
    name = cfg.null_control
    rows = cmp[cmp["regime"] == name] if len(cmp) else cmp
    if not len(rows):
        return [
            f"- No `{name}` runs compared with `{cfg.baseline}`: this report has no null control, so nothing "
            "checks that its verdicts can tell an effect from noise."
        ]
    lines = []
    for cond, g in rows.groupby("condition", sort=False):
        if (g["verdict"] == DETERMINISM).all():
            lines.append(
                f"- **No null control that can fail ({cond})**: `{name}` is identical to `{cfg.baseline}` on every "
                "sample of every seed (the same code path): a determinism check, which no amount of noise can make "
                "fail, so it says nothing about this report's noise floor. A placebo (the baseline retrained with a "
                "nuisance change, such as another data order) is a null control that can fail."
            )
            continue
        floor = ", ".join(f"`{r['metric']}` {num(r['diff'])} {bracket(r['lo'], r['hi'])}" for _, r in g.iterrows())
        floor = (
            f"  - the noise floor ({cond}): `{name}` - `{cfg.baseline}`, what a change that should do nothing "
            f"does to each verdict metric (95% intervals): {floor}."
        )
        different, unsure = g[g["verdict"] == DIFFERENT], g[g["verdict"] == INCONCLUSIVE]
        if len(different):
            which = ", ".join(f"`{r['metric']}` {r['verdict']}" for _, r in g[g["verdict"] != EQUIVALENT].iterrows())
            lines.append(
                f"- **WARNING ({cond}): the null control `{name}` did NOT come out equivalent to `{cfg.baseline}` "
                f"({which}). It should be indistinguishable from the baseline: no other verdict of this report "
                "should be trusted.**"
            )
        elif len(unsure):
            which = ", ".join(f"`{m}`" for m in unsure["metric"])
            lines.append(
                f"- **Null control ({cond}) inconclusive on {which}**: `{name}` is not different from "
                f"`{cfg.baseline}`, but its interval is too wide to fit inside the margin: on "
                f"{'that metric' if len(unsure) == 1 else 'those metrics'} this report cannot yet tell an effect as "
                "large as the margin from none (more seeds), and other regimes' verdicts there are mostly "
                "inconclusive for the same reason."
                + (
                    f" Equivalent, as it must be, on {', '.join(f'`{m}`' for m in g.loc[g['verdict'] == EQUIVALENT, 'metric'])}."
                    if (g["verdict"] == EQUIVALENT).any()
                    else ""
                )
            )
        else:
            lines.append(
                f"- Null control ({cond}): `{name}` came out **equivalent** to `{cfg.baseline}` on "
                f"{', '.join(f'`{m}`' for m in g['metric'])}, as it must."
            )
        lines.append(floor)
    return lines
