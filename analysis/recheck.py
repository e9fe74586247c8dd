"""An independent recomputation of a report's figures, in float64, from its runs' ``samples.jsonl``.

``python -m analysis recheck <sweep folders> [--report reports/<name>]`` checks two things without the code that made
them (neither ``ablate.eval`` nor ``analysis.samples``/``analysis.bootstrap`` is imported; the run labels come from
``analysis.load``):

- each finished run's ``summary.json``: the final evaluation's reward (policy, SFT, their difference), win rate
  against the independent SFT sample (ties half), true KL, length and truncation rate, recomputed from the sample
  rows as the mean over prompts of each prompt's mean (``math.fsum``); they must agree to ``--rtol``;
- with ``--report``, each bootstrap row of its ``equivalence.csv`` (and of ``conditions.csv``: the baseline under
  each condition against the reference condition): the difference (regime minus baseline, paired by seed and
  prompt, mean over seeds of the mean over prompts) must agree to ``--rtol``, and a separate hierarchical percentile
  bootstrap (its own generator and resample count) must put both ends of the 95% interval within ``--itol`` of the
  interval's width of the report's; with two seeds or more, the Student-t interval of the per-seed means must
  agree to ``--rtol`` and the union of the two (the interval the verdict used) to ``--itol``. A row of the crossed
  design (the seeds share their prompts) is rechecked the same way with its own parts: a two-way bootstrap (seeds
  and prompts drawn independently), the two-way random-effects t interval (``--rtol``) and the seed-level t, and
  their union. A verdict that the
  separate bootstrap would give otherwise is listed as borderline, not as an error: its interval sits on a margin
  or on 0;
- with ``--report``, the p-values beside the verdicts: ``p_holm`` is Holm's adjustment (``statsmodels``) of the
  table's ``p_diff``; each row's ``p_diff`` and ``p_tost`` are at least its t tests' (seed-level, and two-way where
  crossed), recomputed exactly (the union's p is the largest of its methods'); no *different* keeps an adjusted p
  at or above alpha unless the report says ``multiplicity: none``, and a *different* interval whose row says
  *inconclusive* is Holm's doing only when its adjusted p is at or above alpha;
- with ``--report``, each bootstrap row of its ``primary.csv`` (a regime's own value of a verdict metric, where a
  claim such as "full DPO improves on the SFT model" lives): the estimate to ``--rtol``, the 95% interval (with
  several seeds, its union with the seed-level t interval, on the log scale for KL and length) to ``--itol``;
- with ``--report``, its ``notes.md`` and ``headline.md``: every number typed in the prose (outside the ``{{...}}``
  placeholders the report fills from its tables, and outside `code`) is a cell of the report's tables or of a run,
  at the digits given (:mod:`analysis.notes_check`); a regime whose row says *determinism check* is identical to the baseline on
  every sample;
- with ``--report``, each row of its ``sensitivity.csv`` (the beta report): the verdict row it restates, the mean
  margin error sd over the runs' summaries, beta x sd and the differences in units of the margin, to ``--rtol``.
- with ``--report``, each row of its ``overoptimisation.csv``: per run, every evaluation step's gold gain, true KL,
  proxy gain and degenerate share from the samples, the peak, the end and the collapse; per regime the means over
  seeds and their t intervals, to ``--rtol`` (:mod:`analysis.recheck_curves`).

Exit status 0 when everything agrees, 1 when something does not (each disagreement is printed), 2 on bad input.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import t as scipy_t
from statsmodels.stats.multitest import multipletests

from analysis.notes_check import unsupported
from analysis.recheck_base import Findings, PerSample, _f, mean_of, per_prompt
from analysis.recheck_curves import recheck_overoptimisation


def _win(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return 1.0 if a > b else 0.5 if a == b else 0.0


def _opponent(row: dict) -> float:
    # runs older than the independent SFT sample scored their win rate against the coupled one
    return _f(row["sft_indep_reward"] if "sft_indep_reward" in row else row.get("sft_reward"))


#: summary key -> the sample fields it needs and its per-sample value (the summary is the mean over prompts of each
#: prompt's mean); a run whose samples lack a field (older runs) has that figure left unchecked
SUMMARY: dict[str, tuple[tuple[str, ...], PerSample]] = {
    "reward_gold": (("policy_reward",), lambda r: _f(r["policy_reward"])),
    "reward_gold_sft": (("sft_reward",), lambda r: _f(r["sft_reward"])),
    "reward_delta": (("policy_reward", "sft_reward"), lambda r: _f(r["policy_reward"]) - _f(r["sft_reward"])),
    "win_rate": (("policy_reward", "sft_reward"), lambda r: _win(_f(r["policy_reward"]), _opponent(r))),
    "kl_true": (("kl_true",), lambda r: _f(r["kl_true"])),
    "length": (("length",), lambda r: _f(r["length"])),
    "truncation_rate": (("truncated",), lambda r: float(bool(r["truncated"]))),
}
#: the equivalence table's metrics that the samples give per prompt
PER_PROMPT = ("reward_delta", "win_rate", "kl_true", "length")
#: those that cannot be negative (a regime's own interval of them is a t interval on the log scale over seeds)
POSITIVE = ("kl_true", "length")


@functools.cache  # within one recheck: a run's samples serve its summary and every report row it is in
def final_rows(run: Path) -> tuple[dict, ...]:
    """The sample rows of the last evaluation step in ``run/samples.jsonl`` (empty when there are none)."""
    f = run / "samples.jsonl"
    if not f.is_file():
        return ()
    rows = [json.loads(line) for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [r for r in rows if isinstance(r, dict) and "prompt" in r]
    last = max((int(r.get("step", 0)) for r in rows), default=0)
    return tuple(r for r in rows if int(r.get("step", 0)) == last)


def recheck_summaries(runs: pd.DataFrame, found: Findings, rtol: float) -> None:
    """Each finished run's summary figures against the mean over prompts of its samples."""
    found.unchecked += int((runs["status"] != "finished").sum())
    for path in runs.loc[runs["status"] == "finished", "path"]:
        run = Path(path)
        rows = final_rows(run)
        if not rows:
            found.unchecked += 1
            continue
        summary = json.loads((run / "summary.json").read_text())
        found.runs += 1
        for key, (fields, value) in SUMMARY.items():
            if key in summary and all(f in r for r in rows for f in fields):
                found.compare(f"{run.name}: {key}", _f(summary[key]), mean_of(per_prompt(rows, value).values()), rtol)


def _last_runs(runs: pd.DataFrame, condition: str, label: str) -> dict:
    """seed -> the run folder of (condition, regime) (the last one where a seed was run twice)."""
    done = runs[runs["status"] == "finished"]
    g = done[(done["condition"].astype(str) == condition) & (done["regime"] == label)]
    return {seed: Path(r["path"].iloc[-1]) for seed, r in g.groupby("seed")}


def seed_values(runs: pd.DataFrame, side: tuple[str, str], metric: str) -> dict:
    """seed -> the per-prompt values of the runs of ``side`` (a (condition, regime) pair); NaNs dropped, seeds left
    with none dropped."""
    out = {}
    for seed, run in sorted(_last_runs(runs, *side).items()):
        v = np.array(list(per_prompt(final_rows(run), SUMMARY[metric][1]).values()), dtype=np.float64)
        if np.isfinite(v).any():
            out[seed] = v[np.isfinite(v)]
    return out


def seed_differences(runs: pd.DataFrame, side: tuple[str, str], base: tuple[str, str], metric: str) -> dict:
    """seed -> (for each seed both have) the per-prompt differences between the runs of ``side`` and of ``base`` (each a
    (condition, regime) pair) on the prompts both evaluated; NaNs dropped, seeds left with none dropped."""
    a_runs, b_runs = _last_runs(runs, *side), _last_runs(runs, *base)
    out = {}
    for seed in sorted(set(a_runs) & set(b_runs)):
        a = per_prompt(final_rows(a_runs[seed]), SUMMARY[metric][1])
        b = per_prompt(final_rows(b_runs[seed]), SUMMARY[metric][1])
        d = np.array([a[p] - b[p] for p in a if p in b], dtype=np.float64)
        if np.isfinite(d).any():
            out[seed] = d[np.isfinite(d)]
    return out


def seed_prompt_table(runs: pd.DataFrame, side: tuple[str, str], base: tuple[str, str], metric: str) -> np.ndarray:
    """``[seeds, prompts]`` differences between the runs of ``side`` and of ``base`` (the seeds both have, in order; the
    prompts any of them evaluated, NaN where a seed lacks one)."""
    a_runs, b_runs = _last_runs(runs, *side), _last_runs(runs, *base)
    cells: dict = {}
    for seed in sorted(set(a_runs) & set(b_runs)):
        a = per_prompt(final_rows(a_runs[seed]), SUMMARY[metric][1])
        b = per_prompt(final_rows(b_runs[seed]), SUMMARY[metric][1])
        cells[seed] = {p: a[p] - b[p] for p in a if p in b}
    prompts = list(dict.fromkeys(p for row in cells.values() for p in row))
    return np.array([[row.get(p, math.nan) for p in prompts] for row in cells.values()], dtype=np.float64)


def _avg(x: np.ndarray) -> float:
    """``x.mean()`` to the last bit (numpy's mean is its sum over the count), without the call's overhead: the
    bootstrap loops below take millions of means of a few dozen values."""
    return x.sum() / x.size


def two_way_intervals(table: np.ndarray, n: int, seed: int, levels: tuple[float, ...]) -> list[tuple[float, float]]:
    """Percentile intervals at each of ``levels`` of the mean over seeds of the mean over prompts, drawing seeds and
    prompts independently with replacement (a loop over resamples)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    stats = np.empty(n)
    for i in range(n):
        drawn = table[rng.integers(0, table.shape[0], table.shape[0])][
            :, rng.integers(0, table.shape[1], table.shape[1])
        ]
        means = [_avg(row[np.isfinite(row)]) for row in drawn if np.isfinite(row).any()]
        stats[i] = np.mean(means) if means else math.nan
    tails = [(1 - level) / 2 for level in levels]
    return [(float(np.nanquantile(stats, t)), float(np.nanquantile(stats, 1 - t))) for t in tails]


def two_way_parts(table: np.ndarray) -> tuple[float, float, float]:
    """``(grand mean, its standard error, degrees of freedom)`` of the two-way random-effects model over the prompts
    every seed has: variance (MS_seeds + MS_prompts) / (seeds x prompts), Satterthwaite's degrees of freedom."""
    x = table[:, np.isfinite(table).all(axis=0)]
    s, p = x.shape
    grand = x.mean()
    ms_s = p * float(((x.mean(axis=1) - grand) ** 2).sum()) / (s - 1)
    ms_p = s * float(((x.mean(axis=0) - grand) ** 2).sum()) / (p - 1)
    if ms_s + ms_p == 0:  # every difference the same: a point
        return float(grand), 0.0, math.inf
    df = (ms_s + ms_p) ** 2 / (ms_s**2 / (s - 1) + ms_p**2 / (p - 1))
    return float(grand), math.sqrt((ms_s + ms_p) / (s * p)), df


def two_way_t(table: np.ndarray, level: float) -> tuple[float, float]:
    """The two-way random-effects t interval at ``level`` of the grand mean (:func:`two_way_parts`)."""
    grand, se, df = two_way_parts(table)
    half = scipy_t.ppf((1 + level) / 2, df) * se if se > 0 else 0.0
    return grand - half, grand + half


def t_pvalues(mean: float, se: float, df: float, margin: float) -> tuple[float, float]:
    """``(p of no difference, p of the two one-sided tests at +-margin)`` of a t statistic (an exact mean: 0 or 1)."""
    if se == 0:
        return float(mean == 0), float(not abs(mean) < margin)
    p_tost = max(scipy_t.sf((mean + margin) / se, df), scipy_t.cdf((mean - margin) / se, df))
    return float(2 * scipy_t.sf(abs(mean) / se, df)), float(p_tost)


def boot_intervals(groups: list[np.ndarray], n: int, seed: int, levels: tuple[float, ...]) -> list[tuple[float, float]]:
    """Percentile intervals at each of ``levels`` of the mean over seeds of the mean over prompts, resampling seeds
    and then prompts within each drawn seed (a loop over resamples: slow and plain on purpose)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    stats = np.empty(n)
    for i in range(n):
        drawn = rng.integers(0, len(groups), len(groups))
        stats[i] = np.mean([_avg(groups[k][rng.integers(0, len(groups[k]), len(groups[k]))]) for k in drawn])
    tails = [(1 - level) / 2 for level in levels]
    return [(float(np.quantile(stats, t)), float(np.quantile(stats, 1 - t))) for t in tails]


def recheck_report(runs: pd.DataFrame, report: Path, baseline: str, found: Findings, opts: dict) -> None:
    """The bootstrap rows of ``report/equivalence.csv`` (each regime against the baseline within a condition) and of
    ``conditions.csv`` where there is one (the baseline under each condition against it under the reference
    condition, the one no row names): the difference exactly, the interval to bootstrap noise."""
    regimes = set(runs["regime"].astype(str))
    compared = regimes - {baseline}
    if not (report / "equivalence.csv").is_file() and baseline in regimes and compared:
        found.errors.append(
            f"no equivalence.csv, though the runs compare {', '.join(sorted(compared))} with {baseline}"
        )
    for table in ("equivalence.csv", "conditions.csv"):
        recheck_holm(report / table, found, opts)
    for name in ("notes.md", "headline.md"):  # every number typed in the reading is a cell of a table or a run
        if (report / name).is_file():
            for lit in unsupported((report / name).read_text(), report, runs):
                found.errors.append(f"{name}: the number {lit} is in no table of the report nor any run")
    for i, row in _bootstrap_rows(report / "equivalence.csv"):
        side, base = (row["condition"], row["regime"]), (row["condition"], baseline)
        _check_row(f"{row['condition']}: {row['regime']} - {baseline}", row, side, base, runs, found, opts, i)
    if (report / "conditions.csv").is_file():
        rows = list(_bootstrap_rows(report / "conditions.csv"))
        named = {row["regime"] for _, row in rows}
        conditions = set(runs.loc[runs["regime"] == baseline, "condition"].astype(str))
        ref = sorted(conditions - named)
        for i, row in rows:
            what = f"{baseline}: {row['regime']} - {ref[0] if len(ref) == 1 else '?'}"
            if len(ref) != 1:
                found.errors.append(
                    f"{what}: {row['metric']}: the reference condition is not one of {sorted(conditions)}"
                )
                continue
            side, base = (row["regime"], baseline), (ref[0], baseline)
            _check_row(what, row, side, base, runs, found, opts, 10_000 + i)


def recheck_holm(table: Path, found: Findings, opts: dict) -> None:
    """``p_holm`` of every row is Holm's adjustment (statsmodels) of the table's ``p_diff``, and no *different* row
    has an adjusted p at or above alpha unless the report's rule left multiplicity aside (``none``)."""
    if not table.is_file():
        return
    frame = pd.read_csv(table)
    if "p_holm" not in frame:
        return
    p = frame["p_diff"].to_numpy(dtype=float)
    finite = np.isfinite(p)
    again = np.full(len(p), math.nan)
    if finite.any():
        again[finite] = multipletests(p[finite], method="holm")[1]
    for i, row in frame.iterrows():
        found.compare(f"{table.name} row {i}: p_holm", _f(row["p_holm"]), again[i], opts["rtol"])
    rule = (table.parent / "report.md").read_text() if (table.parent / "report.md").is_file() else ""
    if "- multiplicity: none" not in rule:
        kept = frame[(frame["verdict"] == "different") & ~(frame["p_holm"] < opts["alpha"])]
        for _, row in kept.iterrows():
            found.errors.append(f"{table.name}: {row['regime']} {row['metric']}: different with p_holm {row['p_holm']}")


def recheck_primary(runs: pd.DataFrame, report: Path, found: Findings, opts: dict) -> None:
    """Each bootstrap row of ``report/primary.csv`` (a regime's own value of a verdict metric): the estimate exactly,
    the 95% interval to bootstrap noise (with two seeds or more: its union with the seed-level t interval, on the log
    scale for a positive quantity)."""
    for i, row in _bootstrap_rows(report / "primary.csv"):  # none where the report has no primary.csv
        what = f"{row['condition']}: {row['regime']}: {row['metric']}"
        groups = _estimate_checked(
            what, seed_values(runs, (row["condition"], row["regime"]), row["metric"]), row, found, opts
        )
        if groups is None:
            continue
        ((lo, hi),) = boot_intervals(groups, opts["n_boot"], opts["seed"] + 20_000 + i, (1 - opts["alpha"],))
        if len(groups) > 1:
            tlo, thi = seed_t(groups, 1 - opts["alpha"], positive=row["metric"] in POSITIVE)
            lo, hi = min(lo, tlo), max(hi, thi)
        _check_interval(what + ":", (float(row["lo"]), float(row["hi"])), (lo, hi), found, opts)


def _estimate_checked(what: str, per_seed: dict, row: dict, found: Findings, opts: dict) -> list[np.ndarray] | None:
    """The per-seed values as a list, after checking the row's estimate (``diff`` in a comparison's row,
    ``estimate`` in a regime's own) against their mean over seeds of the mean over prompts; None (an error noted)
    when no run gave any."""
    paired = "diff" in row
    groups = list(per_seed.values())
    if not groups:
        found.errors.append(f"{what}: no {'paired ' * paired}samples found for this row")
        return None
    found.rows += 1
    reported = row["diff"] if paired else row["estimate"]
    found.compare(what, float(reported), mean_of(g.mean() for g in groups), opts["rtol"])
    return groups


def _bootstrap_rows(table: Path):
    if not table.is_file():  # a report with no comparisons (no baseline run yet) has no equivalence.csv, and
        return  # one of no verdict metric no primary.csv
    frame = pd.read_csv(table, keep_default_na=False, na_values=[""])
    for i, row in frame.iterrows():
        if "bootstrap" in str(row["method"]) and row["metric"] in PER_PROMPT:
            yield i, {k: (str(v) if k in ("condition", "regime", "metric", "verdict") else v) for k, v in row.items()}


def seed_pairs(runs: pd.DataFrame, side: tuple[str, str], base: tuple[str, str], metric: str) -> dict:
    """seed -> (the runs of ``side``'s, of ``base``'s per-prompt values) on the prompts both evaluated, finite in
    both, in one prompt order (the first seed's, where the seeds share their prompts)."""
    a_runs, b_runs = _last_runs(runs, *side), _last_runs(runs, *base)
    out = {}
    for seed in sorted(set(a_runs) & set(b_runs)):
        a = per_prompt(final_rows(a_runs[seed]), SUMMARY[metric][1])
        b = per_prompt(final_rows(b_runs[seed]), SUMMARY[metric][1])
        keep = sorted(p for p in a if p in b and math.isfinite(a[p]) and math.isfinite(b[p]))
        if keep:
            out[seed] = (np.array([a[p] for p in keep]), np.array([b[p] for p in keep]))
    return out


def ratio_intervals(pairs: list, two_way: bool, n: int, seed: int, levels: tuple) -> list[tuple[float, float]]:
    """Percentile intervals of the mean over seeds of log(mean of side / mean of base), seeds drawn with replacement
    and, with each, prompts (both values of a prompt together): one draw for every seed (``two_way``) or one per
    drawn seed (a loop over resamples)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    stats = np.empty(n)
    for i in range(n):
        drawn = rng.integers(0, len(pairs), len(pairs))
        shared = rng.integers(0, len(pairs[0][0]), len(pairs[0][0])) if two_way else None
        logs = []
        for k in drawn:
            r, b = pairs[k]
            idx = shared if two_way else rng.integers(0, len(r), len(r))
            logs.append(math.log(_avg(r[idx]) / _avg(b[idx])))
        stats[i] = math.fsum(logs) / len(logs)
    tails = [(1 - level) / 2 for level in levels]
    return [(float(np.quantile(stats, t)), float(np.quantile(stats, 1 - t))) for t in tails]


def _check_ratio_row(what: str, row: dict, side, base, runs, found: Findings, opts: dict, seed: int) -> None:
    """A row on the log-ratio scale: its estimate and seed-level t exactly, its interval from a separate bootstrap
    of both means, its p floors and its verdict."""
    pairs = seed_pairs(runs, side, base, row["metric"])
    if not pairs:
        found.errors.append(f"{what}: no paired samples found for this row")
        return
    found.rows += 1
    logs = np.array([math.log(r.mean() / b.mean()) for r, b in pairs.values()])
    found.compare(what, float(row["diff"]), mean_of(logs), opts["rtol"])
    levels = (1 - opts["alpha"], 1 - 2 * opts["alpha"])
    two_way = "two-way" in str(row["method"])
    (lo, hi), (ilo, ihi) = ratio_intervals(list(pairs.values()), two_way, opts["n_boot"], opts["seed"] + seed, levels)
    if len(logs) > 1:
        _check_interval(
            what + ": the bootstrap's", (_f(row.get("boot_lo")), _f(row.get("boot_hi"))), (lo, hi), found, opts
        )
        groups = [np.array([v]) for v in logs]
        (tlo, thi), (tilo, tihi) = (seed_t(groups, level) for level in levels)
        found.compare(what + ": seed-level t low end", _f(row.get("seed_t_lo")), tlo, opts["rtol"])
        found.compare(what + ": seed-level t high end", _f(row.get("seed_t_hi")), thi, opts["rtol"])
        lo, hi, ilo, ihi = min(lo, tlo), max(hi, thi), min(ilo, tilo), max(ihi, tihi)
    _check_interval(what + ":", (float(row["lo"]), float(row["hi"])), (lo, hi), found, opts)
    if row["verdict"] == "determinism check":
        if not all(bool((r == b).all()) for r, b in pairs.values()):
            found.errors.append(f"{what}: a determinism check in the report, but not identical to the baseline")
        return
    if "p_diff" in row and len(logs) > 1:
        t = (logs.mean(), logs.std(ddof=1) / math.sqrt(len(logs)), len(logs) - 1)
        for name, k in (("p_diff", 0), ("p_tost", 1)):
            floor = t_pvalues(*t, float(row["margin"]))[k]
            if not _f(row[name]) >= floor * (1 - opts["rtol"]) - 1e-12:
                found.errors.append(f"{what}: {name} {_f(row[name]):.6g} below its t test's {floor:.6g}")
    again = _verdict(lo, hi, ilo, ihi, float(row["margin"])) if len(logs) > 1 else "inconclusive"
    if again == "different" and row["verdict"] == "inconclusive" and _f(row.get("p_holm")) >= opts["alpha"]:
        again = "inconclusive"
    if again != row["verdict"]:
        found.borderline.append(f"{what}: {row['verdict']} in the report, {again} with the separate bootstrap")


def _check_row(what: str, row: dict, side, base, runs: pd.DataFrame, found: Findings, opts: dict, seed: int) -> None:
    what = f"{what}: {row['metric']}"
    if row.get("scale") == "log ratio":
        return _check_ratio_row(what, row, side, base, runs, found, opts, seed)
    per_seed = seed_differences(runs, side, base, row["metric"])
    groups = _estimate_checked(what, per_seed, row, found, opts)
    if groups is None:
        return
    levels = (1 - opts["alpha"], 1 - 2 * opts["alpha"])
    two_way = "two-way" in str(row["method"])
    if two_way:
        table = seed_prompt_table(runs, side, base, row["metric"])
        (lo, hi), (ilo, ihi) = two_way_intervals(table, opts["n_boot"], opts["seed"] + seed, levels)
    else:
        (lo, hi), (ilo, ihi) = boot_intervals(groups, opts["n_boot"], opts["seed"] + seed, levels)
    if len(groups) > 1:  # each seed's difference, the bootstrap's own interval, the seed-level t one, their union
        cell = row.get("seed_diffs")
        reported = dict(item.split(":") for item in cell.split(";")) if isinstance(cell, str) and cell else {}
        if sorted(reported) != sorted(map(str, per_seed)):
            found.errors.append(
                f"{what}: differences of seeds {sorted(reported)} reported, of {sorted(per_seed)} found"
            )
        for seed, g in per_seed.items():
            found.compare(f"{what}: seed {seed}'s difference", _f(reported.get(str(seed))), g.mean(), opts["rtol"])
        _check_interval(
            what + ": the bootstrap's", (_f(row.get("boot_lo")), _f(row.get("boot_hi"))), (lo, hi), found, opts
        )
        (tlo, thi), (tilo, tihi) = (seed_t(groups, level) for level in levels)
        found.compare(what + ": seed-level t low end", _f(row.get("seed_t_lo")), tlo, opts["rtol"])
        found.compare(what + ": seed-level t high end", _f(row.get("seed_t_hi")), thi, opts["rtol"])
        lo, hi, ilo, ihi = min(lo, tlo), max(hi, thi), min(ilo, tilo), max(ihi, tihi)
    if two_way:
        (clo, chi), (cilo, cihi) = (two_way_t(table, level) for level in levels)
        found.compare(what + ": two-way t low end", _f(row.get("crossed_t_lo")), clo, opts["rtol"])
        found.compare(what + ": two-way t high end", _f(row.get("crossed_t_hi")), chi, opts["rtol"])
        lo, hi, ilo, ihi = min(lo, clo), max(hi, chi), min(ilo, cilo), max(ihi, cihi)
    _check_interval(what + ":", (float(row["lo"]), float(row["hi"])), (lo, hi), found, opts)
    if row["verdict"] == "determinism check":  # no test: every per-prompt difference exactly 0
        if not all(bool((g[np.isfinite(g)] == 0).all()) for g in groups):
            found.errors.append(f"{what}: a determinism check in the report, but not identical to the baseline")
        return
    if "p_diff" in row and len(groups) > 1:  # the union's p is at least each t test's (exact here)
        means = np.array([g.mean() for g in groups])
        tests = [(means.mean(), means.std(ddof=1) / math.sqrt(len(means)), len(means) - 1)]
        tests += [two_way_parts(table)] if two_way else []
        for name, k in (("p_diff", 0), ("p_tost", 1)):
            floor = max(t_pvalues(*t, float(row["margin"]))[k] for t in tests)
            if not _f(row[name]) >= floor * (1 - opts["rtol"]) - 1e-12:
                found.errors.append(f"{what}: {name} {_f(row[name]):.6g} below its t test's {floor:.6g}")
    # one seed: no verdict (training noise is not in its interval), whatever the prompts give
    again = _verdict(lo, hi, ilo, ihi, float(row["margin"])) if len(groups) > 1 else "inconclusive"
    if again == "different" and row["verdict"] == "inconclusive" and _f(row.get("p_holm")) >= opts["alpha"]:
        again = "inconclusive"  # Holm's adjustment over the report's tests of difference
    if again != row["verdict"]:
        found.borderline.append(f"{what}: {row['verdict']} in the report, {again} with the separate bootstrap")


#: the columns of a sensitivity row that restate its verdict row (``equivalence.csv``)
_VERDICT_COLUMNS = ("diff", "lo", "hi", "lo_inner", "hi_inner", "margin")


def recheck_sensitivity(runs: pd.DataFrame, report: Path, found: Findings, rtol: float) -> None:
    """``report/sensitivity.csv`` (the beta report's figure and table), present wherever the finished runs vary
    beta and measured the margin error: one row per verdict row of ``equivalence.csv`` (none missing, none extra),
    restating its difference, intervals and verdict; its ``beta`` the runs' own, ``sd`` the mean of the runs'
    finite ``margin_err_sd`` (the report's rule), ``scaled`` beta x sd, each ``rel_*`` the value over the margin.
    The last three are the figure's axes; the restated columns catch a table edited by hand."""
    done = runs[runs["status"] == "finished"]
    varies = "cfg.algo.beta" in done and done["cfg.algo.beta"].nunique() > 1
    measured = "margin_err_sd" in done and bool(done["margin_err_sd"].notna().any())
    if not (report / "sensitivity.csv").is_file():
        if varies and measured:
            found.errors.append("sensitivity: the runs vary beta and measured the margin error: no sensitivity.csv")
        return
    verdicts = pd.read_csv(report / "equivalence.csv").set_index(["condition", "regime", "metric"])
    table = pd.read_csv(report / "sensitivity.csv")
    keys = set(zip(table["condition"], table["regime"], table["metric"]))
    if keys != set(verdicts.index):
        missing, extra = sorted(set(verdicts.index) - keys), sorted(keys - set(verdicts.index))
        found.errors.append(f"sensitivity: rows missing {missing[:3]}, rows with no verdict row {extra[:3]}")
    for _, row in table.iterrows():
        what = f"sensitivity: {row['condition']}: {row['regime']}: {row['metric']}"
        key = (row["condition"], row["regime"], row["metric"])
        g = done[(done["condition"].astype(str) == str(row["condition"])) & (done["regime"] == row["regime"])]
        if key not in verdicts.index or g.empty:
            continue  # counted above
        found.rows += 1
        v = verdicts.loc[key]
        for c in _VERDICT_COLUMNS:
            found.compare(f"{what}: {c}", _f(row[c]), _f(v[c]), rtol)
        if row["verdict"] != v["verdict"]:
            found.errors.append(f"{what}: verdict {row['verdict']}, the verdict row says {v['verdict']}")
        betas = {float(b) for b in g["cfg.algo.beta"]}
        if len(betas) != 1:
            found.errors.append(f"{what}: the runs' beta is not one value: {sorted(betas)}")
            continue
        beta = betas.pop()
        sds = [x for x in g["margin_err_sd"].astype(float) if math.isfinite(x)]
        sd = math.fsum(sds) / len(sds) if sds else math.nan
        found.compare(f"{what}: beta", _f(row["beta"]), beta, rtol)
        found.compare(f"{what}: margin error sd", _f(row["sd"]), sd, rtol)
        found.compare(f"{what}: beta x sd", _f(row["scaled"]), beta * sd, rtol)
        for c in _VERDICT_COLUMNS[:-1]:
            found.compare(f"{what}: rel_{c}", _f(row[f"rel_{c}"]), _f(v[c]) / _f(v["margin"]), rtol)


def seed_t(groups: list[np.ndarray], level: float, positive: bool = False) -> tuple[float, float]:
    """The Student-t interval at ``level`` of the mean of the per-seed means (n - 1 degrees of freedom); ``positive``
    (and every mean above 0): on the log scale, back-transformed."""
    means = np.array([g.mean() for g in groups], dtype=np.float64)
    log = positive and means.min() > 0
    x = np.log(means) if log else means
    half = scipy_t.ppf((1 + level) / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    lo, hi = float(x.mean() - half), float(x.mean() + half)
    return (math.exp(lo), math.exp(hi)) if log else (lo, hi)


def _check_interval(what: str, reported: tuple[float, float], again: tuple[float, float], found, opts) -> None:
    """Both ends within ``itol`` of the interval's width (the wider of the two; a missing end disagrees)."""
    width = max(reported[1] - reported[0], again[1] - again[0])
    if not math.isfinite(width):
        found.errors.append(f"{what} 95% interval missing in the report: {reported}")
        return
    ends = max(abs(again[0] - reported[0]), abs(again[1] - reported[1]))
    found.max_end = max(found.max_end, ends / width if width > 0 else 0.0)
    if ends > opts["itol"] * width or reported[0] > reported[1]:
        found.errors.append(
            f"{what} 95% interval [{reported[0]:.6g}, {reported[1]:.6g}], recomputed [{again[0]:.6g}, {again[1]:.6g}]"
        )


def _verdict(lo: float, hi: float, lo_inner: float, hi_inner: float, margin: float) -> str:
    # the rule of analysis.equivalence, restated
    if math.isfinite(margin) and -margin < lo_inner and hi_inner < margin:
        return "equivalent"
    return "different" if lo > 0 or hi < 0 else "inconclusive"


def recheck(
    folders: list[Path],
    report: Path | None,
    baseline: str = "full",
    regimes: list[str] | None = None,
    seeds: list[int] | None = None,
    fold: list[str] | None = None,
    **opts,
) -> Findings:
    from analysis.load import load_runs

    opts = {"rtol": 1e-9, "itol": 0.1, "n_boot": 4000, "seed": 20261201, "alpha": 0.05, **opts}
    runs = load_runs(*folders, regimes=regimes, seeds=seeds, fold=fold or ()).runs
    final_rows.cache_clear()  # read the samples as they are now
    found = Findings()
    recheck_summaries(runs, found, opts["rtol"])
    if report is not None:
        recheck_report(runs, report, baseline, found, opts)
        recheck_primary(runs, report, found, opts)
        recheck_sensitivity(runs, report, found, opts["rtol"])
        recheck_overoptimisation(runs, report, found, opts["rtol"], baseline)
    return found


def describe(found: Findings, report: Path | None) -> list[str]:
    """What the recheck found, a line each (disagreements first)."""
    lines = [f"DISAGREES  {e}" for e in found.errors] + [f"borderline  {b}" for b in found.borderline]
    lines.append(
        f"recheck: {found.runs} runs' summaries and {found.rows} report rows, {found.checked} figures: "
        + (f"{len(found.errors)} disagree" if found.errors else "all agree")
        + f" (largest relative difference {found.max_rel:.1g}"
        + (f"; {found.unchecked} runs not finished or without samples, not checked" if found.unchecked else "")
        + (f"; interval ends within {found.max_end:.0%} of the width" if report is not None and found.rows else "")
        + ")"
    )
    return lines
