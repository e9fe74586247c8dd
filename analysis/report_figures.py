"""The report's figures with their captions: one colour per regime across every figure."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from analysis import figures
from analysis.bench_costs import step_ms
from analysis.figure_style import LABEL_SEP, condition_markers, drawn_runs
from analysis.figures_equivalence import equivalence as equivalence_figure
from analysis.figures_frontier import CAPTION as FRONTIER_BY_CONDITION
from analysis.figures_frontier import frontier_by_condition
from analysis.load import Runs, base_regime
from analysis.overoptimisation import CAPTION as OVEROPTIMISATION
from analysis.report_config import ReportConfig
from analysis.sensitivity import CAPTION as SENSITIVITY
from analysis.strength import CAPTION as STRENGTH

FIDELITY = (
    "fidelity of what training consumed from the reference (DPO: the sd of its margin error on the training pairs; "
    "GRPO/PPO: the sd of the per-token KL penalty error; the stand-in divergence's error where neither was "
    "measured: the y label names it). Points: geometric mean over seeds; error bars: its 95% interval, a t "
    "interval on the log scale that never crosses zero. Regimes without that figure (no reference) are absent."
)
#: the Pareto caption when the report has a bench: its time axis is the bench's, not the jobs'
PARETO_BENCH = (
    "Cost against fidelity: reference memory held (each run's) and reference time per DPO training step from the "
    "bench (the cost section's: side by side in one process; the jobs' own times shared their cores, and a paused "
    "job counts its pause; a regime the bench did not measure, or a cache whose runs missed it (the bench times hits), is "
    "left out of that panel) vs the " + FIDELITY
)
SEEDS = "Lines and points: mean over seeds; shaded bands and error bars: the lowest to the highest seed."
CAPTIONS = {
    "equivalence": "Each regime's difference from the baseline on every verdict metric: marker at the estimate "
    "(circle equivalent, square different, diamond inconclusive), thin line its 95% interval, thick line its "
    "90% interval (the one TOST uses), grey band ± the equivalence margin, dashed line 0. Equivalent: the thick "
    "line lies inside the grey band. Intervals: hierarchical bootstrap over seeds and prompts, with several seeds "
    "widened to the seed-level t interval where that is wider (or seed-level t alone where a run has no "
    "samples.jsonl; see the verdict table); with several seeds, ticks just below mark each seed's own difference. "
    "An interval that runs on past the panel (beyond 4 margins and 1.5x the farthest estimate) ends in an arrow.",
    "frontier": "Gold reward and win rate against the true KL to the full reference, at each evaluation "
    "(the DPO paper's frontier; up and to the left is better). " + SEEDS,
    "frontier by condition": FRONTIER_BY_CONDITION,
    "kl_error": "Left: the stand-in divergence (exact KL from the policy to the regime's reference, on the "
    "policy's fresh evaluation samples) vs the true KL to the full reference, one point per run (log-log; on the "
    "dashed line the two agree). For DPO this is not a KL the run trained against: DPO consumes only the "
    "reference's sequence log-probs on its training pairs. Right: |stand-in divergence - true KL| per regime at "
    "step 0 (pale; where the runs evaluated it) and at the end (solid): bars the mean over seeds, error bars the lowest to the highest seed.",
    "pareto": "Cost against fidelity: reference memory and reference time per training step (each job's own "
    "wall time: comparable across regimes only when the jobs had like machines to themselves) vs the " + FIDELITY,
    "training": "Left: the training loss at each optimiser step. Right: the true KL to the full reference "
    "(solid) and the stand-in divergence (dotted) at each evaluation. " + SEEDS,
    "sensitivity": SENSITIVITY,
    "overoptimisation": OVEROPTIMISATION,
    "strength": STRENGTH,
    "drift": "Response length, repeated bigrams, unsafe rate and held-out perplexity at each evaluation. " + SEEDS,
}


def _labelled(frame: pd.DataFrame, by_condition: bool) -> pd.DataFrame:
    if not by_condition or frame.empty:
        return frame
    return frame.assign(regime=frame["condition"] + LABEL_SEP + frame["regime"])


def label_colors(labels) -> dict[str, tuple]:
    """Each figure label's colour: its regime's (``<condition> | <regime>`` takes ``<regime>``'s), so that a
    regime keeps one colour in every figure and under every condition."""
    own = figures.regime_colors({str(lb).split(LABEL_SEP)[-1] for lb in labels})
    return {lb: own[str(lb).split(LABEL_SEP)[-1]] for lb in labels}


def _condition_keys(labels: list[str], conditions: list[str]) -> tuple[dict, dict]:
    """With several conditions: each label's marker (its condition's) and its (regime, condition), the latter in the
    order the figures list them: by regime, then by condition in natural order."""
    by_cond = condition_markers(conditions)
    markers = {lb: by_cond[c] for lb in labels if (c := lb.split(LABEL_SEP)[0]) in by_cond}  # failed ones: none
    regimes = figures.ordered({lb.split(LABEL_SEP)[-1] for lb in labels})
    order = [f"{c}{LABEL_SEP}{r}" for r in regimes for c in conditions]
    return markers, {lb: (lb.split(LABEL_SEP)[-1], lb.split(LABEL_SEP)[0]) for lb in order if lb in set(labels)}


def make_figures(
    data: Runs, agg: pd.DataFrame, eq: pd.DataFrame, out: Path, cfg: ReportConfig, bench: Path | None = None
) -> dict[str, Path]:
    """Every figure the data allow, name -> PNG path; each regime (per condition when there are several)
    keeps one colour in all of them. ``bench``: the bench's CSV, whose reference times the Pareto figure then uses."""
    runs = data.runs
    if bench is not None:  # the bench times a cache's hits only: a regime whose runs missed it gets no bench time
        ms = step_ms(bench)
        missed = runs[pd.to_numeric(runs.get("ref_misses", pd.Series(0, index=runs.index)), errors="coerce") > 0]
        missed = set(zip(missed["condition"], missed["regime"]))
        agg = agg.assign(
            bench_ms_per_step_mean=[
                math.nan if (c, r) in missed else ms.get(base_regime(r), math.nan)
                for c, r in zip(agg["condition"], agg["regime"])
            ]
        )
    finished, conditions = drawn_runs(runs)  # a condition whose every job failed has no marker and no figure
    several = len(conditions) > 1  # then one point or line per condition and regime
    done_curves = data.curves[data.curves["path"].isin(finished["path"])] if len(data.curves) else data.curves
    curves, fig_runs, fig_agg = (_labelled(f, several) for f in (done_curves, runs, agg))
    labels = report_labels(data, several)
    colors = label_colors(labels)  # a regime's colour in every figure, whatever the condition
    names = {lb: lb.split(LABEL_SEP)[-1] for lb in labels}
    markers, groups = _condition_keys(labels, conditions) if several else (None, None)
    d = out / "figures"
    figs = {}
    if len(eq):
        figs["equivalence"] = equivalence_figure(eq, d / "equivalence.png", cfg.baseline, colors)
    if not curves.empty and figures.KL_TRUE in curves:
        if several:  # colour the regime, marker the condition: the frontier moving with the setting
            own = {r: colors[lb] for lb, r in names.items()}
            figs["frontier by condition"] = frontier_by_condition(
                done_curves, d / "frontier.png", cfg.baseline, own, condition_markers(conditions)
            )
            for name, draw in (("training", figures.training), ("drift", figures.drift)):
                for i, cond in enumerate(conditions, 1):  # one figure per condition: readable, the regimes' colours
                    c = done_curves[done_curves["condition"] == cond]
                    figs[f"{name}, {cond}"] = draw(c, d / f"{name}_{i}.png", own, title=cond)
        else:
            figs["frontier"] = figures.frontier(curves, d / "frontier.png", colors)
            figs["training"] = figures.training(curves, d / "training.png", colors)
            figs["drift"] = figures.drift(curves, d / "drift.png", colors)
    figs["kl_error"] = figures.kl_error(fig_runs, d / "kl_error.png", colors, markers, groups)
    if len(agg):
        time = figures.BENCH_TIME if bench is not None else figures.JOB_TIME
        figs["pareto"] = figures.pareto(fig_agg, d / "pareto.png", colors, time=time, markers=markers, groups=groups)
    return figs


#: the names of the PNGs a report draws (``training_2.png``: one per condition); :func:`remove_stale` touches no other
DRAWN = re.compile(
    r"^(equivalence|frontier|kl_error|pareto|sensitivity|overoptimisation|(training|drift|strength)(_\d+)?)\.png$"
)


def remove_stale(figs: dict[str, Path], out: Path) -> None:
    """Delete the report figures in ``out/figures`` that this report did not draw (from an earlier run of it: say
    ``training.png`` once the runs vary a setting and it draws ``training_1.png``...); a file of another name (one
    added by hand) is left alone."""
    for stale in set((out / "figures").glob("*.png")) - set(figs.values()):
        if DRAWN.match(stale.name):
            stale.unlink()


def report_labels(data: Runs, several: bool) -> list[str]:
    """Every regime label the report's figures draw (``condition | regime`` when there are ``several`` conditions)."""
    return sorted(set(_labelled(data.runs, several)["regime"].astype(str)))


def figure_lines(figs: dict[str, Path], out: Path, bench: bool = False) -> list[str]:
    """Each figure with its caption under it (``bench``: the Pareto figure's times are the bench's)."""
    lines = ["## Figures", ""]
    for name, path in figs.items():
        caption = PARETO_BENCH if name == "pareto" and bench else CAPTIONS[name.split(",")[0]]  # "training, <cond>"
        lines += [f"![{name}]({path.relative_to(out)})", "", f"*Figure ({name}).* {caption}", ""]
    return lines
