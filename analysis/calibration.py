"""``python -m analysis calibration``: which training setting to run the regime reports at.

One row per calibration job (``ref=full``, one setting of learning rate, steps and pairs each): its effect on the
gold reward against the SFT model (``reward_delta``, coupled samples, 95% interval over prompts), its win rate, its
true KL and the other behaviour metrics. A setting *qualifies* when its ``reward_delta`` interval lies above 0 and
its true KL per response is inside the window (default 1 to 5 nats); the *chosen* setting of each algorithm is the
cheapest that qualifies: fewest training sequences (steps x batch: what every job of a report pays), then fewest
training prompts (each job audits its reference on every pair, ``cached`` precomputes them, and the sweep samples
them), then the clearest improvement (the highest lower end of the ``reward_delta`` interval). Writes ``report.md``, ``calibration.csv``, ``table.tex`` and ``figures/calibration.png``; nothing in
them depends on when or where the report is made, so it regenerates byte for byte from the same runs.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from analysis.archive import reproduce_lines
from analysis.load import Runs
from analysis.markdown import md_table, num, span

#: (column, cfg key) of the settings a calibration varies
SETTINGS = (
    ("learning_rate", "cfg.algo.learning_rate"),
    ("max_steps", "cfg.algo.max_steps"),
    ("batch_size", "cfg.algo.batch_size"),
    ("n_train", "cfg.task.n_train"),
    ("beta", "cfg.algo.beta"),
    ("eval_prompts", "cfg.eval.n_prompts"),
    ("eval_samples", "cfg.eval.samples_per_prompt"),
)
#: summary metrics in the table (with their 95% interval where the run has one)
METRICS = ("reward_delta", "win_rate", "kl_true", "length", "ppl", "unsafe_rate", "wall_s")


def calibration_frame(data: Runs, kl_window: tuple[float, float] = (1.0, 5.0)) -> pd.DataFrame:
    """One row per finished job: settings, metrics, ``improves``, ``in_window``, ``qualifies``, ``chosen``."""
    runs = data.finished()
    rows = []
    for _, r in runs.iterrows():
        row = {"algo": r.get("algo"), "seed": r.get("seed"), "job": r["job"]}
        for col, key in SETTINGS:
            row[col] = r.get(key, math.nan)
        for m in METRICS:
            row[m] = float(r.get(m, math.nan))
            for side in ("lo", "hi"):
                if f"{m}_{side}" in r:
                    row[f"{m}_{side}"] = float(r[f"{m}_{side}"])
        rows.append(row)
    f = pd.DataFrame(rows)
    if f.empty:
        return f
    f["sequences"] = f["max_steps"] * f["batch_size"]
    f["improves"] = f["reward_delta_lo"] > 0
    f["in_window"] = (f["kl_true"] >= kl_window[0]) & (f["kl_true"] <= kl_window[1])
    f["qualifies"] = f["improves"] & f["in_window"]
    f = f.sort_values(["algo", "sequences", "n_train", "learning_rate", "seed"], kind="stable").reset_index(drop=True)
    f["chosen"] = False
    for _, g in f[f["qualifies"]].groupby("algo"):
        order = g.sort_values(["sequences", "n_train", "reward_delta_lo"], ascending=[True, True, False], kind="stable")
        best = order.index[0]
        f.loc[best, "chosen"] = True
    return f


def _setting(r: pd.Series) -> str:
    what = "pairs" if r["algo"] == "dpo" else "prompts"
    return f"lr {r['learning_rate']:g}, {int(r['max_steps'])} steps, {int(r['n_train'])} {what}"


def _interval(r: pd.Series, m: str) -> str:
    return span(r[m], r.get(f"{m}_lo", math.nan), r.get(f"{m}_hi", math.nan))


def latex(f: pd.DataFrame, window: tuple[float, float]) -> str:
    esc = lambda s: s.replace("_", r"\_").replace("%", r"\%")  # noqa: E731
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        r"\small",
        r"\begin{tabular}{llrrrr}",
        r"\toprule",
        r"algorithm & setting & reward delta [95\%] & win rate [95\%] & true KL & length \\",
        r"\midrule",
    ]
    for _, r in f.iterrows():
        mark = r"$^\star$" if r["chosen"] else ""
        lines.append(
            f"{esc(str(r['algo']))} & {esc(_setting(r))}{mark} & {_interval(r, 'reward_delta')} & "
            f"{_interval(r, 'win_rate')} & {num(r['kl_true'])} & {num(r['length'])} \\\\"
        )
    caption = (
        f"Calibration (ref=full, one seed): gold-reward effect against the SFT model on coupled samples and true KL "
        f"(nats per response); $^\\star$: the cheapest setting whose effect interval is above 0 with a true KL in "
        f"[{num(window[0])}, {num(window[1])}]."
    )
    lines += [r"\bottomrule", r"\end{tabular}", rf"\caption{{{caption}}}", r"\end{table}", ""]
    return "\n".join(lines)


def figure(f: pd.DataFrame, window: tuple[float, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    algos = list(dict.fromkeys(f["algo"]))
    fig, axes = plt.subplots(1, len(algos), figsize=(6.0 * len(algos), 4.2), squeeze=False)
    for ax, algo in zip(axes[0], algos):
        g = f[f["algo"] == algo]
        ax.axvspan(window[0], window[1], color="0.92", label="true KL window")
        ax.axhline(0, color="0.4", lw=0.8)
        for i, (_, r) in enumerate(g.iterrows()):
            lo, hi = r.get("reward_delta_lo", math.nan), r.get("reward_delta_hi", math.nan)
            err = [[r["reward_delta"] - lo], [hi - r["reward_delta"]]] if math.isfinite(lo) else None
            ax.errorbar(
                r["kl_true"],
                r["reward_delta"],
                yerr=err,
                fmt="*" if r["chosen"] else "o",
                ms=12 if r["chosen"] else 6,
                color="C3" if r["chosen"] else "C0",
                capsize=3,
            )
            ax.annotate(
                f"{r['learning_rate']:g} x {int(r['max_steps'])} ({int(r['n_train'])})",
                (r["kl_true"], r["reward_delta"]),
                fontsize=7,
                xytext=(5, 8 if i % 2 else -12),
                textcoords="offset points",
            )
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("true KL to the full reference (nats per response)")
        ax.set_ylabel("reward_delta vs SFT (coupled, 95% interval)")
        ax.set_title(f"{algo}, ref=full: lr x steps (train prompts); star: chosen", fontsize=9)
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def _provenance_lines(data: Runs) -> list[str]:
    from analysis.report import provenance

    runs = data.finished()
    prov = provenance(runs, list(runs["path"]))
    threads = sorted(set(runs.get("cfg.threads", pd.Series(dtype=object)).dropna().map(str)))
    total = float(runs["wall_s"].sum()) if "wall_s" in runs else math.nan
    return [
        f"- code the runs were made with: {', '.join(prov['commits']) or 'not recorded'}",
        "- versions: " + (", ".join(f"{k} {v}" for k, v in prov["versions"].items()) or "not recorded"),
        "- hardware: " + (", ".join(f"{k} {v}" for k, v in prov["hardware"].items()) or "not recorded"),
        f"- torch threads per job: {', '.join(threads) or 'all cores'}; compute: {len(runs)} jobs, "
        f"{num(total / 60)} min of job wall time in all",
    ]


def write_calibration(
    data: Runs, out: Path, command: str, title: str, notes: str | None = None, kl_window: tuple[float, float] = (1, 5)
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    f = calibration_frame(data, kl_window)
    if f.empty:
        raise ValueError("no finished calibration runs")
    cols = ["algo", "seed", *(c for c, _ in SETTINGS), "sequences"]
    cols += [c for m in METRICS for c in (m, f"{m}_lo", f"{m}_hi") if c in f]
    cols += ["improves", "in_window", "qualifies", "chosen", "job"]
    f[cols].to_csv(out / "calibration.csv", index=False, float_format="%.6g")
    (out / "table.tex").write_text(latex(f, kl_window))
    figure(f, kl_window, out / "figures" / "calibration.png")

    lines = [f"# {title}", "", "## Reproduce", "", "```bash"]
    lines += reproduce_lines(data.sweeps, out)
    lines += [command, "```", ""]
    lines += _provenance_lines(data)
    lines += [
        f"- rule: a setting qualifies when its `reward_delta` 95% interval is above 0 and its true KL is within "
        f"[{num(kl_window[0])}, {num(kl_window[1])}] nats per response; the chosen one (**bold**) is the cheapest "
        "that qualifies: fewest training sequences (steps x batch, what each job pays), then fewest training prompts "
        "(each job audits its reference on every pair), then the highest lower end of the `reward_delta` interval.",
        "- noise floor: `reward_delta` compares the policy with the SFT model on *coupled* samples (same prompt, same "
        "random stream), so with nothing trained it is exactly 0; the win rate is against an *independent* SFT "
        "sample (ties half), whose null value is 0.5 with an interval about as wide as those below.",
        "",
    ]
    bad = data.problems()
    if len(bad):
        lines += ["## Runs not finished", ""]
        lines += [
            md_table(
                ["status", "job", "reason"],
                [[str(r["status"]), f"`{r['job']}`", str(r["reason"])[:200]] for _, r in bad.iterrows()],
            ),
            "",
        ]
    for algo, g in f.groupby("algo", sort=False):
        lines += [f"## {algo}", ""]
        rows = []
        for _, r in g.iterrows():
            name = _setting(r)
            rows.append(
                [
                    f"**{name}**" if r["chosen"] else name,
                    str(int(r["sequences"])),
                    _interval(r, "reward_delta"),
                    _interval(r, "win_rate"),
                    num(r["kl_true"]),
                    num(r["length"]),
                    num(r["ppl"]),
                    num(r["unsafe_rate"]),
                    num(r["wall_s"] / 60),
                    "yes" if r["qualifies"] else ("no: " + ("KL" if r["improves"] else "no clear effect")),
                ]
            )
        head = [
            "setting",
            "sequences",
            "reward_delta [95%]",
            "win rate [95%]",
            "true KL",
            "length",
            "ppl",
            "unsafe",
            "job min",
            "qualifies",
        ]
        lines += [md_table(head, rows), ""]
        chosen = g[g["chosen"]]
        lines += [
            f"Chosen for {algo}: **{_setting(chosen.iloc[0])}**."
            if len(chosen)
            else f"No {algo} setting qualifies: widen the grid.",
            "",
        ]
    lines += ["![calibration](figures/calibration.png)", ""]
    if notes:
        lines += ["## Reading", "", notes.strip(), ""]
    lines += [
        "## Files",
        "",
        "- `calibration.csv`: every job's settings, metrics with intervals, and the rule's flags",
        "- `table.tex`: the table for a paper (booktabs)",
        "- `figures/calibration.png`: reward effect against true KL, the window shaded",
        "- `runs/`: the runs' own files (config, summary, metrics, samples), from which this report regenerates",
        "",
    ]
    report = out / "report.md"
    report.write_text("\n".join(lines))
    return report
