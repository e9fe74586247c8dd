"""The report's sections on statistics: its config and rules, the null control, each regime's primary-metric
intervals and the equivalence verdicts against the baseline (markdown lines)."""

from __future__ import annotations

import pandas as pd

from analysis.equivalence import (
    BOOT,
    DETERMINISM,
    DIFFERENT,
    EQUIVALENT,
    INCONCLUSIVE,
    null_control,
    parse_seed_cell,
)
from analysis.markdown import bracket, md_table, num, span
from analysis.pvalues import MOST_SEEDS
from analysis.report_config import ReportConfig
from analysis.samples import COUPLED


def statistics_lines(cfg: ReportConfig, prompts: pd.DataFrame, eq: pd.DataFrame) -> list[str]:
    """The resolved config and the rules the verdicts and intervals follow."""
    a = cfg.alpha
    lines = ["## Statistics", "", *cfg.describe()]
    lines += [
        f"- verdict rule, per metric, each regime against `{cfg.baseline}`: **{EQUIVALENT}** when two one-sided "
        f"tests at alpha {a:g} reject a difference as large as the margin, i.e. the {100 * (1 - 2 * a):g}% "
        f"interval of the difference lies inside ±margin; **{DIFFERENT}** when it is not equivalent and the "
        f"{100 * (1 - a):g}% interval excludes 0; **{INCONCLUSIVE}** otherwise (the data cannot tell an effect "
        "as large as the margin from none). " + _relative_rule(cfg),
        f"- intervals of the verdicts: {BOOT}, percentile: resample seeds with replacement, then prompts with "
        "replacement within each drawn seed; a comparison is paired by seed and by prompt (per-prompt "
        "differences); a prompt's samples are averaged first (the prompt is the unit); per-prompt values from each "
        f"run's `samples.jsonl`. {cfg.n_boot} resamples, seeded ({cfg.seed}): deterministic. With two seeds or more "
        "the interval is the union, end by end, of that bootstrap's and the Student-t interval of the per-seed "
        "means (seeds - 1 degrees of freedom): a percentile bootstrap over a few seeds is too narrow where the "
        "seeds disagree (training noise; see `analysis/equivalence.py`); `equivalence.csv` keeps both "
        "(`boot_lo`/`boot_hi`, `seed_t_lo`/`seed_t_hi`). Where a run has no "
        "`samples.jsonl` the row says `seed-level t`: a paired Student-t interval over seeds of the summary values "
        "(prompts not resampled)."
        + (
            " Where the seeds share their prompts (the crossed design; the row's method says `two-way`), the interval "
            "is instead the union of a two-way bootstrap (seeds and prompts drawn independently), the two-way "
            "random-effects t interval ((MS_seed + MS_prompt) / (seeds x prompts), Satterthwaite's degrees of "
            "freedom; `crossed_t_lo`/`crossed_t_hi`) and the seed-level t: a prompt effect every seed shares is "
            "counted once, not as if each seed had its own prompts (see `analysis/crossed.py`)."
            if cfg.design == "crossed"
            else ""
        ),
        "- per-regime tables: mean over seeds [95% Student-t interval]; positive quantities (KL, log-prob errors, "
        "bytes, times, perplexity, length) show the geometric mean over seeds with a t interval on the log scale, "
        "which never crosses zero (where a seed's value is exactly 0: the arithmetic mean with a percentile "
        "bootstrap over seeds, within the values' range). `summary.csv` names the method of each cell.",
    ]
    if len(prompts) and (prompts["win_against"] == COUPLED).any():
        lines.append(
            "- win rate from `samples.jsonl`: against independent SFT samples where the runs recorded them "
            "(`sft_indep_reward`); older runs without them are scored against the coupled SFT sample, as their "
            "own win rate was."
        )
    if len(eq) and ((eq["n_seeds"] == 1) & (eq["verdict"] != DETERMINISM)).any():
        lines.append(
            "- one seed: a regime compared on one paired seed gets no verdict (**inconclusive**, whatever its "
            "interval): that interval is over the prompts only, and training noise, which only a second seed "
            "measures, is not in it; the row's note says what the prompts alone would give."
        )
    if len(eq) and (eq["method"].str.startswith("seed-level")).any():
        lines.append("- some rows have no `samples.jsonl`: their intervals are seed-level t (see the method column).")
    return lines + [""]


def null_control_lines(eq: pd.DataFrame, cfg: ReportConfig) -> list[str]:
    """The null-control section: equivalent as it must be, or a loud warning."""
    return ["## Null control", "", *null_control(eq, cfg), ""]


def own_table(own: pd.DataFrame, cfg: ReportConfig, label: str = "regime") -> str:
    """Each regime's own value of the verdict metrics with its 95% interval and the method (``label``: what the
    rows are, for the first column's header)."""
    metrics = [m for m in cfg.metrics() if m in set(own["metric"])]
    rows = []
    for regime, g in own.groupby("regime", sort=False):
        g = g.set_index("metric")
        cells = [span(g.loc[m, "estimate"], g.loc[m, "lo"], g.loc[m, "hi"]) if m in g.index else "n/a" for m in metrics]
        rows.append([f"`{regime}`", *cells, str(g["method"].iloc[0])])
    return md_table([label, *[f"{m} [95%]" for m in metrics], "interval"], rows)


def _relative_rule(cfg: ReportConfig) -> str:
    if cfg.relative == "log-ratio":
        return (
            "A relative margin (a share of the baseline's mean) is read on the log-ratio scale: the row's difference "
            "is the mean over seeds of log(regime's mean / baseline's mean), its margin ±log(1 + share)."
        )
    return "A relative margin is a share of the baseline's mean on the same data."


def _scale(r) -> str:
    """`` (log ratio)`` for a row on the log-ratio scale (:mod:`analysis.log_ratio`), else nothing."""
    return " (log ratio)" if r.get("scale") == "log ratio" else ""


def _p_cell(r) -> str:
    """``p_diff (p_holm); p_tost`` of a verdict row (n/a where a test does not apply)."""
    return f"{_p(r.get('p_diff'))} ({_p(r.get('p_holm'))}); {_p(r.get('p_tost'))}"


def _p(v) -> str:
    return "n/a" if v is None or not v == v else "<0.001" if v < 0.001 else f"{v:.3f}"


def _power_cell(r) -> str:
    """The TOST's power with the row's seeds if the true difference were 0, and the seeds 80% needs."""
    power, seeds = r.get("power_tost"), r.get("seeds_for_power")
    if power is None or not power == power:
        return "n/a"
    return f"{power:.2f} ({'>' + str(MOST_SEEDS) if seeds == float('inf') else f'{seeds:.0f}'})"


def verdict_table(eq: pd.DataFrame, cfg: ReportConfig, label: str = "regime") -> str:
    """One row per regime and metric: difference, its intervals, the margin and the verdict (``label``: what the
    rows are)."""
    hi_pct, in_pct = 100 * (1 - cfg.alpha), 100 * (1 - 2 * cfg.alpha)
    seeds = [parse_seed_cell(c) for c in (eq["seed_diffs"] if "seed_diffs" in eq else [""] * len(eq))]
    rows = [
        [
            f"`{r['regime']}`",
            f"`{r['metric']}`" + (" (primary)" if r["metric"] == cfg.primary else "") + _scale(r),
            f"{num(r['regime_mean'])} vs {num(r['baseline_mean'])}",
            f"{num(r['diff'])} {bracket(r['lo'], r['hi'])}",
            bracket(r["lo_inner"], r["hi_inner"]),
            f"±{num(r['margin'])}",
            f"**{r['verdict']}**",
            _p_cell(r),
            _power_cell(r),
            "; ".join(x for x in (r["method"], r["note"]) if x),
        ]
        for _, r in eq.iterrows()
    ]
    header = [
        label,
        "metric",
        f"{label} vs {cfg.baseline}",
        f"difference [{hi_pct:g}%]",
        f"{in_pct:g}% (TOST)",
        "margin",
        "verdict",
        "p: diff (Holm); TOST",
        "TOST power (seeds for 80%)",
        "interval, note",
    ]
    if any(seeds):  # several seeds: each seed's own difference, the spread the seed-level t interval reads
        header.insert(4, "each seed")
        for row, per in zip(rows, seeds):
            row.insert(4, ", ".join(num(v) for v in per.values()))
    return md_table(header, rows)


def condition_sections(cond: str, own: pd.DataFrame, eq: pd.DataFrame, cfg: ReportConfig) -> list[str]:
    """The primary-metric and verdict tables of one condition."""
    lines = []
    o = own[own["condition"] == cond] if len(own) else own
    if len(o):
        lines += [
            f"## {cond}: primary metric `{cfg.primary}` and the verdict metrics, each regime",
            "",
            own_table(o, cfg),
            "",
        ]
    e = eq[eq["condition"] == cond] if len(eq) else eq
    if len(e):
        lines += [f"## {cond}: equivalence with `{cfg.baseline}` (verdicts)", "", verdict_table(e, cfg), ""]
    return lines


def verdict_findings(eq: pd.DataFrame, cfg: ReportConfig) -> list[str]:
    """One plain statement per verdict, the primary metric first, then a count per verdict."""
    if not len(eq):
        return []
    out = []
    order = {m: i for i, m in enumerate(cfg.metrics())}
    checks = eq[eq["verdict"] == DETERMINISM]
    eq = eq[eq["verdict"] != DETERMINISM]
    for _, r in eq.assign(_o=eq["metric"].map(order)).sort_values("_o", kind="stable").iterrows():
        if r["regime"] == cfg.null_control:
            continue  # the null-control section speaks for it
        out.append(
            f"`{r['regime']}` vs `{cfg.baseline}` ({r['condition']}), `{r['metric']}`: **{r['verdict']}**, "
            f"{'log ratio' if _scale(r) else 'difference'} "
            f"{num(r['diff'])} {bracket(r['lo'], r['hi'])} ({100 * (1 - 2 * cfg.alpha):g}%: "
            f"{bracket(r['lo_inner'], r['hi_inner'])}, margin ±{num(r['margin'])}; {r['method']})."
        )
    counts = eq["verdict"].value_counts()
    out.append(
        f"Of {len(eq)} verdicts: {int(counts.get(EQUIVALENT, 0))} equivalent, {int(counts.get(DIFFERENT, 0))} "
        f"different, {int(counts.get(INCONCLUSIVE, 0))} inconclusive (inconclusive: more seeds or prompts needed "
        "to tell an effect as large as the margin from none)."
    )
    if len(checks):
        which = ", ".join(f"`{r}` ({c})" for (c, r), _ in checks.groupby(["condition", "regime"], sort=False))
        out.append(
            f"Not counted: {len(checks)} rows of {which}, identical to `{cfg.baseline}` on every sample of every "
            f"seed: **{DETERMINISM}s** (the same code path cannot differ by noise), not tests; they have no p-value "
            "and are not in Holm's family."
        )
    return out
