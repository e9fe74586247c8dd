"""The baseline across conditions: does the setting itself (beta, the KL estimator, ...) change the result?

The report's verdicts compare each regime with the baseline *within* a condition. When a sweep varies a setting,
the first question is what that setting does to the exact reference itself (the DPO paper's reward-KL frontier moving
with beta; GRPO's KL estimator and its placement). This section answers it with the same machinery: the baseline's
runs, relabelled by condition, each compared with the *reference condition* (``--reference-condition``, else the one
with the most baseline seeds; ties: the first in the conditions' natural order) by the same paired intervals and the
same verdict rule. The pairing holds because every condition evaluates the same prompts with the same coupled
random streams per seed.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from analysis.equivalence import compare, regime_intervals
from analysis.load import natural_key
from analysis.report_config import ReportConfig
from analysis.report_verdicts import own_table, verdict_table


def reference_condition(runs: pd.DataFrame, baseline: str, chosen: str | None = None) -> str | None:
    """``chosen`` (it must be a condition with finished baseline runs), else the condition whose baseline runs have
    the most seeds (the first in natural order on a tie); None without two conditions."""
    done = runs[(runs["status"] == "finished") & (runs["regime"] == baseline)]
    seeds = done.groupby("condition", sort=False)["seed"].nunique()
    seeds = seeds.loc[sorted(seeds.index, key=natural_key)]
    if chosen is not None and chosen not in seeds.index:
        known = ", ".join(map(str, seeds.index)) or "none"
        raise ValueError(f"--reference-condition {chosen}: no finished {baseline} runs under it (conditions: {known})")
    if len(seeds) < 2:
        return None
    return chosen if chosen is not None else str(seeds.idxmax())


def _relabelled(frame: pd.DataFrame, baseline: str, label: str) -> pd.DataFrame:
    """The baseline's rows with their condition as the regime, all in one condition ``label``, in the conditions'
    natural order (``beta=0.03``, ``0.1``, ``0.3``: the tables list them in the order the rows come)."""
    f = frame[frame["regime"] == baseline].copy()
    f["regime"] = f["condition"].astype(str)
    f["condition"] = label
    return f.sort_values("regime", key=lambda s: s.map(natural_key), kind="stable")


def across(runs: pd.DataFrame, prompts: pd.DataFrame, cfg: ReportConfig) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """(each condition's own intervals, each against the reference condition's verdict rows, that condition) for
    the baseline; empty frames when there are fewer than two conditions with baseline runs."""
    ref = reference_condition(runs, cfg.baseline, cfg.reference_condition)
    if ref is None:
        return pd.DataFrame(), pd.DataFrame(), ""
    label = f"{cfg.baseline} across conditions"
    r, p = _relabelled(runs, cfg.baseline, label), _relabelled(prompts, cfg.baseline, label)
    c = dataclasses.replace(cfg, baseline=ref)
    return regime_intervals(r, p, c), compare(r, p, c), ref


def section(runs: pd.DataFrame, prompts: pd.DataFrame, cfg: ReportConfig, out) -> list[str]:
    """The section's markdown lines (``[]`` with fewer than two conditions); writes ``conditions.csv``."""
    own, eq, ref = across(runs, prompts, cfg)
    if not len(own):
        return []
    if len(eq):
        eq.to_csv(out / "conditions.csv", index=False)
    ref_cfg = dataclasses.replace(cfg, baseline=ref)
    why = "chosen" if cfg.reference_condition else f"the one with the most `{cfg.baseline}` seeds"
    lines = [
        f"## `{cfg.baseline}` across conditions: what the setting itself does",
        "",
        f"`{cfg.baseline}` under each condition (its own values, 95% intervals), then each condition against "
        f"**{ref}** ({why}), paired by seed and prompt, with the same margins "
        "and verdict rule as the regimes (see `analysis/conditions.py`).",
        "",
        own_table(own, cfg, "condition"),
        "",
    ]
    if len(eq):
        lines += [verdict_table(eq, ref_cfg, "condition"), ""]
    return lines
