"""``python -m analysis report``: sweep folders -> ``report.md`` (tables, figures, findings), ``summary.csv``
(every metric aggregated over seeds), ``table.tex`` and ``figures/*.png``, with a header that says how to
reproduce it: the sweep command, the code's commit, package versions, seeds and hardware."""

from __future__ import annotations

import datetime as _dt
import math
from pathlib import Path

import pandas as pd

from ablate.tracking import schema
from ablate.tracking.run_dir import load_summary
from analysis import figures
from analysis.load import Runs
from analysis.stats import aggregate, paired_vs_baseline


def table(name: str) -> list[tuple[str, str, float]]:
    """(summary column, header, scale) of each column of one of the report's tables, from the metric schema."""
    cols = schema.REPORT_TABLES[name]
    return [(c, schema.header(c, cols), schema.metric(c).scale) for c in cols]


FIDELITY = table("fidelity")
BEHAVIOUR = table("behaviour")


def _num(x: float) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if x == 0:
        return "0"
    a = abs(x)
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 0.01:
        return f"{x:.3g}" if a < 100 else f"{x:.1f}"
    return f"{x:.2e}"


def cell(row: pd.Series, col: str, scale: float = 1.0) -> str:
    """``mean [lo, hi]`` over seeds; ``n/a`` with no data; the mean alone with one seed."""
    mean = row.get(f"{col}_mean", math.nan) / scale
    if not math.isfinite(mean):
        return "n/a"
    lo, hi = row.get(f"{col}_lo", math.nan) / scale, row.get(f"{col}_hi", math.nan) / scale
    if math.isfinite(lo) and hi - lo > 1e-12 * max(1.0, abs(mean)):
        return f"{_num(mean)} [{_num(lo)}, {_num(hi)}]"
    return _num(mean)


def md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


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
            if not math.isfinite(mean):
                cells.append("--")
            elif math.isfinite(lo):
                cells.append(f"{_num(mean)} $\\pm$ {_num((hi - lo) / 2)}")
            else:
                cells.append(_num(mean))
        lines.append(f"{esc(str(row['condition']))} & {esc(str(row['regime']))} & " + " & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", rf"\caption{{{esc(caption)}}}", r"\end{table}", ""]
    return "\n".join(lines)


def _ordered(agg: pd.DataFrame) -> pd.DataFrame:
    rank = {r: i for i, r in enumerate(figures.REGIME_ORDER)}
    key = lambda r: rank.get(str(r).split("(")[0], 99)  # noqa: E731
    return (
        agg.assign(_o=agg["regime"].map(key))
        .sort_values(["condition", "_o", "regime"], kind="stable")
        .drop(columns="_o")
    )


def _provenance(runs: pd.DataFrame, paths: list[str]) -> dict:
    """Commits, versions and hardware as the runs recorded them."""
    have_summary = runs[runs["status"] != "unfinished"]
    commits = sorted(set(have_summary.get("git_commit", pd.Series(dtype=str)).dropna()))
    versions, hardware = {}, {}
    for p in paths:
        f = Path(p) / "summary.json"
        if f.is_file():
            prov = load_summary(f).get("provenance") or {}
            versions = versions or prov.get("versions", {})
            hardware = hardware or prov.get("hardware", {})
    return {"commits": commits, "versions": versions, "hardware": hardware}


def findings(cmp: pd.DataFrame, agg: pd.DataFrame, baseline: str) -> list[str]:
    """Plain statements the numbers support, each with its n and test."""
    out = []
    for _, row in _ordered(agg).iterrows():
        e0, e1 = row.get("kl_abs_err_step0_mean", math.nan), row.get("kl_abs_err_mean", math.nan)
        if row["regime"] != baseline and math.isfinite(e1):
            out.append(
                f"`{row['regime']}` ({row['condition']}): the stand-in divergence differs from the true KL by "
                f"{_num(e0)} nats at step 0 and {cell(row, 'kl_abs_err')} at the end "
                f"(true KL {cell(row, 'kl_true')}; n = {int(row['kl_abs_err_n'])} seeds)."
            )
    for _, r in cmp.iterrows():
        if r["note"] == "differs":
            out.append(
                f"`{r['regime']}` vs `{baseline}` ({r['condition']}), {r['metric']}: difference "
                f"{_num(r['diff_mean'])} [{_num(r['diff_lo'])}, {_num(r['diff_hi'])}], paired t-test over "
                f"{r['n_pairs']} seeds, Holm-adjusted p = {_num(r['p_holm'])}, d_z = {_num(r['d_z'])}."
            )
    n_none = int((cmp["note"] == "no evidence of a difference").sum()) if len(cmp) else 0
    if n_none:
        out.append(
            f"{n_none} of {len(cmp)} regime-vs-`{baseline}` comparisons show no evidence of a difference "
            f"(Holm-adjusted p >= 0.05): with this few seeds only large effects could show; "
            f"absence of evidence is not evidence of absence."
        )
    return out


def write_report(
    data: Runs, out: Path, command: str, title: str, baseline: str = "full", notes: str | None = None
) -> Path:
    from ablate.tracking.provenance import git_commit

    out.mkdir(parents=True, exist_ok=True)
    runs = data.runs
    agg = _ordered(aggregate(runs, schema.report_columns()))
    agg.to_csv(out / "summary.csv", index=False)
    (out / "table.tex").write_text(latex_table(agg, f"{title}: mean over seeds with 95% t-interval half-widths."))
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

    figs = {}
    curves, fig_runs, fig_agg = data.curves, runs, agg
    if runs["condition"].nunique() > 1:  # one line per condition and regime
        label = lambda f: f.assign(regime=f["condition"] + " | " + f["regime"])  # noqa: E731
        curves = label(curves) if not curves.empty else curves
        fig_runs, fig_agg = label(runs), label(agg)
    if not curves.empty and figures.KL_TRUE in curves:
        figs["frontier"] = figures.frontier(curves, out / "figures" / "frontier.png")
        figs["training"] = figures.training(curves, out / "figures" / "training.png")
        figs["drift"] = figures.drift(curves, out / "figures" / "drift.png")
    figs["kl_error"] = figures.kl_error(fig_runs, out / "figures" / "kl_error.png")
    if len(agg):
        figs["pareto"] = figures.pareto(fig_agg, out / "figures" / "pareto.png")

    prov = _provenance(runs, list(runs["path"]))
    seeds = sorted(int(s) for s in runs["seed"].dropna().unique())
    lines = [
        f"# {title}",
        "",
        f"Generated {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC by `{command}`.",
        "",
        "## Reproduce",
        "",
        "```bash",
    ]
    lines += [s["command"] for s in data.sweeps if s.get("command")] or ["# (sweep command not recorded)"]
    lines += [command, "```", ""]
    lines += [
        f"- runs: {len(runs)} jobs, {int((runs['status'] == 'finished').sum())} finished; seeds "
        f"{', '.join(map(str, seeds))}; models {', '.join(sorted(map(str, runs['model'].dropna().unique())))}; "
        f"algorithms {', '.join(sorted(map(str, runs['algo'].dropna().unique())))}",
        f"- code the runs were made with: {', '.join(prov['commits']) or 'not recorded'}; this report: {git_commit()}",
        "- versions: " + (", ".join(f"{k} {v}" for k, v in prov["versions"].items()) or "not recorded"),
        "- hardware: " + (", ".join(f"{k} {v}" for k, v in prov["hardware"].items()) or "not recorded"),
        f"- statistics: mean over seeds [95% Student-t interval]; comparisons with `{baseline}` paired by "
        "seed (paired t-test, Holm-adjusted over regimes, Cohen's d_z). KL in nats per response.",
        "- `stand-in div.` is the exact KL from the policy to the regime's own reference on the policy's "
        "fresh evaluation samples; the *true KL* is the same against the full reference. For DPO the "
        "stand-in divergence is not a quantity training used (DPO consumes only sequence log-probs of its "
        "training pairs). Per-run win rates carry a 95% Wilson interval counting ties as half a win: valid, "
        "but conservative.",
        "",
    ]

    lines += ["## Jobs that did not finish", ""]
    bad = data.problems()
    if len(bad):
        lines.append(
            md_table(
                ["status", "job", "reason"],
                [[r["status"], f"`{r['job']}`", str(r["reason"])[:200]] for _, r in bad.iterrows()],
            )
        )
    else:
        lines.append("None: every job finished.")
    lines.append("")

    for algo, a in agg.groupby("condition", sort=False):
        for title, columns in (("fidelity and cost of each reference", FIDELITY), ("behaviour", BEHAVIOUR)):
            rows = [
                [f"`{r['regime']}`", str(r["n_runs"])] + [cell(r, c, s) for c, _, s in columns] for _, r in a.iterrows()
            ]
            lines += [f"## {algo}: {title}", "", md_table(["regime", "n"] + [h for _, h, _ in columns], rows), ""]
        if len(cmp):
            c = cmp[cmp["condition"] == algo]
            lines += [
                f"## {algo}: each regime against `{baseline}` (paired by seed)",
                "",
                md_table(
                    ["regime", "metric", "n", "difference [95% CI]", "p (Holm)", "d_z", "verdict"],
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
                ),
                "",
            ]

    lines += ["## Figures", ""]
    captions = {
        "frontier": "Gold reward and win rate against the true KL to the full reference, at each evaluation "
        "(the DPO paper's frontier; up and to the left is better).",
        "kl_error": "Left: the stand-in divergence (exact KL from the policy to the regime's reference, on the "
        "policy's fresh evaluation samples) vs the true KL to the full reference (log-log; on the dashed "
        "line the two agree). For DPO this is not a KL the run trained against: DPO consumes only the "
        "reference's sequence log-probs on its training pairs. Right: |stand-in divergence - true KL| "
        "per regime at step 0 and at the end.",
        "pareto": "Cost against fidelity: reference memory and reference time per training step vs the KL "
        "error at the end (error bars: 95% t-intervals over seeds). Regimes without a stand-in divergence "
        "(no reference, or no distribution for fresh samples) are absent.",
        "training": "Training loss, and the true KL (solid) with the stand-in divergence (dotted), over training.",
        "drift": "Response length, repetition, unsafe rate and held-out perplexity over training.",
    }
    for name, path in figs.items():
        lines += [f"![{name}]({path.relative_to(out)})", "", captions[name], ""]

    lines += ["## What the numbers show", ""]
    lines += [f"- {f}" for f in findings(cmp, agg, baseline)] or ["- (no comparisons: no baseline runs)"]
    lines.append("")
    if notes:
        lines += ["## Reading", "", notes.strip(), ""]
    lines += [
        "## Files",
        "",
        "- `summary.csv`: every metric, mean / std / n / 95% interval per algorithm and regime",
        "- `comparisons.csv`: every paired comparison with the baseline",
        "- `table.tex`: the main table for a paper (booktabs)",
        "- `figures/`: the figures above",
        "",
    ]
    report = out / "report.md"
    report.write_text("\n".join(lines))
    return report
