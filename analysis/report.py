"""``python -m analysis report``: sweep folders -> ``report.md`` (tables, figures, findings), ``summary.csv``
(every metric aggregated over seeds), ``table.tex`` and ``figures/*.png``, with a header that says how to
reproduce it: the sweep command, the code's commit, package versions, seeds and hardware."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ablate.tracking import schema
from ablate.tracking.run_dir import load_summary
from analysis import figures
from analysis.archive import reproduce_lines
from analysis.bench_costs import cost_lines
from analysis.conditions import section as conditions_section
from analysis.declared import effect_warnings
from analysis.equivalence import compare, regime_intervals
from analysis.headlines import headline
from analysis.load import Runs, natural_key
from analysis.markdown import md_table, span
from analysis.markdown import num as _num
from analysis.notes import render as render_notes
from analysis.overoptimisation import section as overoptimisation_section
from analysis.report_config import ReportConfig
from analysis.report_figures import figure_lines, make_figures, remove_stale
from analysis.report_verdicts import condition_sections, null_control_lines, statistics_lines, verdict_findings
from analysis.samples import prompt_frame
from analysis.sensitivity import section as sensitivity_section
from analysis.stats import aggregate, paired_vs_baseline
from analysis.strength import section as strength_section


def table(name: str) -> list[tuple[str, str, float]]:
    """(summary column, header, scale) of each column of one of the report's tables, from the metric schema."""
    cols = schema.REPORT_TABLES[name]
    return [(c, schema.header(c, cols), schema.metric(c).scale) for c in cols]


FIDELITY = table("fidelity")
BEHAVIOUR = table("behaviour")
CONSUMED = table("consumed")
SECTIONS = (
    ("fidelity and cost of each reference", FIDELITY),
    ("what training consumed from its reference, against the full reference (end of training)", CONSUMED),
    ("behaviour", BEHAVIOUR),
)


#: the jobs' own reference time per step (figures.JOB_TIME's column): a timing only where the jobs had like machines
#: to themselves
JOB_TIME_COLUMN = figures.JOB_TIME[0]
JOB_TIME_NOTE = {
    False: "`ref. ms/step`: each job's own wall time inside its reference per training step: comparable across "
    "regimes only when the jobs ran alone on like machines (this report was given no bench).",
    True: "Reference time per step: the bench's, in the cost section. The jobs' own (`ref_ms_per_step` in "
    "`summary.csv`) are left out here: the jobs shared their cores, and a paused job counts its pause.",
}


def cell(row: pd.Series, col: str, scale: float = 1.0) -> str:
    """``mean [lo, hi]`` over seeds; ``n/a`` with no data; the mean alone with one seed; ``+inf (1 of 3 seeds)``
    where some seed's value was infinite."""
    mean, lo, hi = (row.get(f"{col}_{k}", math.nan) / scale for k in ("mean", "lo", "hi"))
    if infinite := _infinite_seeds(row, col):
        return f"{_infinity(mean)} ({infinite} of {int(row[f'{col}_n'])} seeds)"
    if schema.metric(col).unit == "cosine" and math.isfinite(mean):  # 0.9997 and 0.9765 differ: 4 decimals
        width = math.isfinite(lo) and math.isfinite(hi) and hi - lo > 1e-12
        return f"{mean:.4f}" + (f" [{lo:.4f}, {hi:.4f}]" if width else "")
    return span(mean, lo, hi)


def _infinite_seeds(row: pd.Series, col: str) -> int:
    """How many seeds of ``row`` had an infinite ``col`` (``stats.infinite_interval``)."""
    k = pd.to_numeric(row.get(f"{col}_inf", 0), errors="coerce")
    return int(k) if pd.notna(k) else 0


def _infinity_sign(mean: float) -> str | None:
    """An infinite mean's sign, ``+`` or ``-``; None (undefined) where the seeds' infinities disagree (NaN)."""
    return None if math.isnan(mean) else ("+" if mean > 0 else "-")


def _infinity(mean: float) -> str:
    sign = _infinity_sign(mean)
    return "undefined (+inf and -inf)" if sign is None else f"{sign}inf"


def latex_table(agg: pd.DataFrame, caption: str) -> str:
    cols = FIDELITY[1:3] + [FIDELITY[4]] + BEHAVIOUR[:3]
    esc = lambda s: s.replace("_", r"\_").replace("%", r"\%")  # noqa: E731
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        r"\small",
        r"\begin{tabular}{ll" + "r" * len(cols) + "}",
        r"\toprule",
        "condition & regime & " + " & ".join(esc(h) for _, h, _ in cols) + r" \\",
        r"\midrule",
    ]
    for _, row in agg.iterrows():
        cells = []
        for col, _, scale in cols:
            mean, lo, hi = (row.get(f"{col}_{k}", math.nan) / scale for k in ("mean", "lo", "hi"))
            if infinite := _infinite_seeds(row, col):
                sign = _infinity_sign(mean) or r"\pm"
                cells.append(rf"${sign}\infty$ ({infinite}/{int(row[f'{col}_n'])} seeds)")
            elif not math.isfinite(mean):
                cells.append("--")
            elif math.isfinite(lo):
                cells.append(f"{_num(mean)} [{_num(lo)}, {_num(hi)}]")
            else:
                cells.append(_num(mean))
        lines.append(f"{esc(str(row['condition']))} & {esc(str(row['regime']))} & " + " & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", rf"\caption{{{esc(caption)}}}", r"\end{table}", ""]
    return "\n".join(lines)


def _measured(agg: pd.DataFrame, col: str) -> bool:
    """Whether any row of ``agg`` has a value of summary column ``col``."""
    return f"{col}_mean" in agg and bool(agg[f"{col}_mean"].notna().any())


def _ordered(agg: pd.DataFrame) -> pd.DataFrame:
    """Rows by condition (natural order), then by regime in the figures' order (:func:`figures.regime_key`)."""
    conds = {c: i for i, c in enumerate(sorted(agg["condition"].astype(str).unique(), key=natural_key))}
    labels = {r: i for i, r in enumerate(figures.ordered(agg["regime"]))}
    return (
        agg.assign(_c=agg["condition"].astype(str).map(conds), _r=agg["regime"].astype(str).map(labels))
        .sort_values(["_c", "_r"], kind="stable")
        .drop(columns=["_c", "_r"])
        .copy()  # consolidated (dropping a column leaves a fragmented frame)
    )


def provenance(runs: pd.DataFrame, paths: list[str]) -> dict:
    """Commits, versions and hardware as the runs recorded them."""
    have_summary = runs[runs["status"] != "unfinished"]
    commits = sorted(set(have_summary.get("git_commit", pd.Series(dtype=str)).dropna()))
    versions, hardware, tasks = {}, {}, set()
    for p in paths:
        f = Path(p) / "summary.json"
        if f.is_file():
            summary = load_summary(f)
            prov = summary.get("provenance") or {}
            versions = versions or prov.get("versions", {})
            hardware = hardware or prov.get("hardware", {})
            if prov.get("task"):
                tasks.add(task_line(prov["task"], summary.get("data") or {}))
    return {"commits": commits, "versions": versions, "hardware": hardware, "tasks": sorted(tasks)}


def task_line(task: dict, data: dict) -> str:
    """What a run was trained and judged on: the task (its data's path and sha256) and the judges (their paths)."""
    where = f" {task['data']} (sha256 {data['sha256'][:16]})" if task.get("data") and data.get("sha256") else ""
    judge = task.get("judge", "?") + (f" {task['judge_path']}" if task.get("judge_path") else "")
    safety = task.get("safety", "?") + (f" {task['safety_path']}" if task.get("safety_path") else "")
    return f"task {task.get('task', '?')}{where}; judge {judge}; safety {safety}"


def compute_line(runs: pd.DataFrame) -> str:
    """The report's compute: the finished jobs' wall time in all and a job's median (wall time, so it counts
    whatever shared the machine and any pause of a job: an upper bound on the compute itself)."""
    wall = pd.to_numeric(runs.loc[runs["status"] == "finished"].get("wall_s", pd.Series(dtype=float)), errors="coerce")
    wall = wall.dropna()
    if wall.empty:
        return "- compute: not recorded"
    return (
        f"- compute: {len(wall)} finished jobs, {wall.sum() / 3600:.1f} h of job wall time in all, "
        f"{wall.median() / 60:.0f} min a job (median); wall time counts whatever shared the machine and any pause of "
        "a job, so it bounds the compute from above"
    )


def findings(agg: pd.DataFrame, baseline: str) -> list[str]:
    """Plain statements on the stand-in divergence, each with its n (the verdicts have their own)."""
    out = []
    for _, row in _ordered(agg).iterrows():
        e0, e1 = row.get("kl_abs_err_step0_mean", math.nan), row.get("kl_abs_err_mean", math.nan)
        if row["regime"] != baseline and not math.isnan(e1):
            n0, n1 = int(row.get("kl_abs_err_step0_n", 0)), int(row["kl_abs_err_n"])
            # runs evaluated only at the end have no step-0 figure: the clause is left out, not printed as n/a
            start = ""
            if infinite := _infinite_seeds(row, "kl_abs_err_step0"):
                start = f"{_infinity(e0)} nats at step 0 (in {infinite} of {n0} seeds) and "
            elif math.isfinite(e0):
                start = f"{_num(e0)} nats at step 0{'' if n0 == n1 else f' (n = {n0} seed{_s(n0)})'} and "
            out.append(
                f"`{row['regime']}` ({row['condition']}): the stand-in divergence differs from the true KL by "
                f"{start}{cell(row, 'kl_abs_err')} at the end "
                f"(true KL {cell(row, 'kl_true')}; n = {n1} seed{_s(n1)})."
            )
    return out


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _problems_table(data: Runs) -> list[str]:
    """Every run that did not finish, with its status and reason: listed, never dropped."""
    lines = ["## Runs not finished", ""]
    bad = data.problems()
    if not len(bad):
        return lines + ["None: every job finished.", ""]
    rows = [
        [str(r["status"]), f"`{r['job']}`", str(r.get("regime", "")), str(r.get("seed", "")), str(r["reason"])[:200]]
        for _, r in bad.iterrows()
    ]
    return lines + [md_table(["status", "job", "regime", "seed", "reason"], rows), ""]


def _seed_t_table(c: pd.DataFrame, baseline: str) -> str:
    """The seed-level paired t-tests (kept beside the verdicts, which come from the intervals over prompts and seeds)."""
    return md_table(
        ["regime", "metric", "n", "difference [95% CI]", "p (Holm)", "d_z", "t-test"],
        [
            [
                f"`{r['regime']}`",
                r["metric"],
                str(r["n_pairs"]),
                f"{_num(r['diff_mean'])} [{_num(r['diff_lo'])}, {_num(r['diff_hi'])}]",
                _num(r["p_holm"]),
                _num(r["d_z"]),
                r["note"],
            ]
            for _, r in c.iterrows()
        ],
    )


def write_report(
    data: Runs,
    out: Path,
    command: str,
    title: str,
    baseline: str = "full",
    notes: str | None = None,
    config: ReportConfig | None = None,
    bench: Path | None = None,
) -> Path:
    """Write ``report.md``, ``summary.csv``, ``equivalence.csv``, ``primary.csv``, ``comparisons.csv``,
    ``table.tex`` and ``figures/`` under ``out``; ``config`` (default: its defaults with ``baseline``) sets the
    primary metric, margins, alpha and bootstrap; ``bench``: a ``python -m ablate.bench`` CSV for the cost section."""
    cfg = config or ReportConfig(baseline=baseline)
    baseline = cfg.baseline
    out.mkdir(parents=True, exist_ok=True)
    runs = data.runs
    agg = _ordered(aggregate(runs, schema.report_columns(), seed=cfg.seed))
    agg.to_csv(out / "summary.csv", index=False)
    (out / "table.tex").write_text(
        latex_table(agg, f"{title}: mean over seeds [95% interval; positive quantities: geometric mean, log-scale t].")
    )
    prompts = prompt_frame(runs)
    eq, own = (
        _ordered(f) if len(f) else f for f in (compare(runs, prompts, cfg), regime_intervals(runs, prompts, cfg))
    )
    if len(eq):
        eq.to_csv(out / "equivalence.csv", index=False)
    if len(own):
        own.to_csv(out / "primary.csv", index=False)
    cmp = (
        pd.concat(
            [paired_vs_baseline(runs, m, baseline=baseline) for m in schema.compared_keys() if m in runs],
            ignore_index=True,
        )
        if (runs["regime"] == baseline).any()
        else pd.DataFrame()
    )
    if len(cmp):
        cmp.to_csv(out / "comparisons.csv", index=False)
    figs = make_figures(data, agg, eq, out, cfg, bench)

    prov = provenance(runs, list(runs["path"]))
    seeds = sorted(int(s) for s in runs["seed"].dropna().unique())
    lines = [
        f"# {title}",
        "",
        f"Made by `{command}` (nothing in it depends on when: it regenerates byte for byte from the same runs).",
        "",
        "## Reproduce",
        "",
        "```bash",
    ]
    lines += reproduce_lines(data.sweeps, out)
    lines += [command, "```", ""]
    lines += [
        f"- runs: {len(runs)} jobs, {int((runs['status'] == 'finished').sum())} finished; seeds "
        f"{', '.join(map(str, seeds))}; models {', '.join(sorted(map(str, runs['model'].dropna().unique())))}; "
        f"algorithms {', '.join(sorted(map(str, runs['algo'].dropna().unique())))}",
        f"- code the runs were made with: {', '.join(prov['commits']) or 'not recorded'}",
        "- versions: " + (", ".join(f"{k} {v}" for k, v in prov["versions"].items()) or "not recorded"),
        "- hardware: " + (", ".join(f"{k} {v}" for k, v in prov["hardware"].items()) or "not recorded"),
        *[f"- data and judges: {t}" for t in prov["tasks"]],  # runs made before they were recorded: no line
        compute_line(runs),
        "- KL in nats per response. `stand-in div.` is the exact KL from the policy to the regime's own reference "
        "on the policy's fresh evaluation samples; the *true KL* is the same against the full reference. For DPO "
        "the stand-in divergence is not a quantity training used (DPO consumes only sequence log-probs of its "
        "training pairs). Per-run win rates are against an independent SFT sample of each prompt (ties half), "
        "with a 95% t interval over prompts (runs made before that: the coupled sample, a Wilson interval).",
        "",
    ]
    lines += statistics_lines(cfg, prompts, eq)
    warnings = effect_warnings(cfg, runs)
    lines += [*warnings, ""] if warnings else []
    lines += null_control_lines(eq, cfg)
    lines += _problems_table(data)

    for cond, a in agg.groupby("condition", sort=False):
        lines += condition_sections(cond, own, eq, cfg)
        for heading, columns in SECTIONS:
            timed = any(c == JOB_TIME_COLUMN for c, _, _ in columns) and _measured(a, JOB_TIME_COLUMN)
            columns = [c for c in columns if _measured(a, c[0]) and not (bench is not None and c[0] == JOB_TIME_COLUMN)]
            if not columns:  # nothing measured (a consumed-fidelity table of runs from before the audit)
                continue
            rows = [
                [f"`{r['regime']}`", str(r["n_runs"])] + [cell(r, c, s) for c, _, s in columns] for _, r in a.iterrows()
            ]
            lines += [f"## {cond}: {heading}", "", md_table(["regime", "n"] + [h for _, h, _ in columns], rows), ""]
            if timed:
                lines += [JOB_TIME_NOTE[bench is not None], ""]
        if dropped := [h for _, cols in SECTIONS for c, h, _ in cols if not _measured(a, c)]:
            lines += [f"Not measured in these runs, so left out of the tables: {', '.join(dropped)}.", ""]
        c = cmp[cmp["condition"] == cond] if len(cmp) else cmp
        if len(c):
            lines += [
                f"## {cond}: seed-level paired t-tests against `{baseline}`",
                "",
                "Summary values paired by seed, Holm-adjusted over regimes, Cohen's d_z; kept for reference: the "
                "verdicts above come from the intervals over prompts and seeds of `equivalence.csv`.",
                "",
                _seed_t_table(c, baseline),
                "",
            ]

    lines += conditions_section(runs, prompts, cfg, out)
    if bench is not None:
        lines += cost_lines(bench, list(agg["regime"].drop_duplicates()))
    ended = runs.loc[runs["status"].isin(["finished", "diverged"]), "path"]  # a diverged run's curve is a result here
    curves = data.curves[data.curves["path"].isin(ended)] if len(data.curves) else data.curves
    over_lines, over_fig = overoptimisation_section(curves, out, baseline)
    lines += over_lines
    if over_fig is not None:
        figs["overoptimisation"] = over_fig
        strength_lines, strength_figs = strength_section(runs, pd.read_csv(out / "overoptimisation.csv"), out, baseline)
        lines += strength_lines
        figs.update(strength_figs)
    beta_lines, beta_fig = sensitivity_section(runs, eq, cfg, out)
    lines += beta_lines
    if beta_fig is not None:
        figs["sensitivity"] = beta_fig
    remove_stale(figs, out)
    lines += figure_lines(figs, out, bench=bench is not None)
    lines += ["## What the numbers show", ""]
    found = verdict_findings(eq, cfg) + findings(agg, baseline)
    lines += [f"- {f}" for f in found] or ["- (no comparisons: no baseline runs)"]
    lines.append("")
    if notes:  # its placeholders filled from the tables just written (analysis/notes.py)
        lines += ["## Reading", "", render_notes(notes, out).strip(), ""]
    sentence = headline(out)  # the same, from headline.md: under the title (and in the README)
    if sentence is not None:
        lines[2:2] = [f"**In one sentence.** {sentence}", ""]
    lines += [
        "## Files",
        "",
        "- `summary.csv`: every metric, mean / std / n / 95% interval / method per condition and regime",
        "- `primary.csv`: each regime's verdict metrics with their 95% intervals over prompts and seeds",
        "- `equivalence.csv`: every verdict: difference, 95% and 90% intervals, margin, method",
        "- `comparisons.csv`: the seed-level paired t-tests with the baseline",
        "- `table.tex`: the main table for a paper (booktabs)",
        *(
            ["- `sensitivity.csv`: each stand-in's differences against beta x its margin error's sd"]
            if beta_lines
            else []
        ),
        *(
            ["- `overoptimisation.csv`: per regime, where the gold reward peaked, the end point and the collapse"]
            if over_lines
            else []
        ),
        "- `figures/`: the figures above",
        "",
    ]
    report = out / "report.md"
    report.write_text("\n".join(lines))
    return report
