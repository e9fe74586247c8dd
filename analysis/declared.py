"""The analysis a sweep declared before its runs, and each margin against what training achieved.

A sweep preset (or the command line) may declare its analysis in the runs' own config: ``plan.primary``,
``plan.margins.<metric>`` (``0.05`` in the metric's unit, ``10%`` of the baseline's mean), ``plan.seeds``,
``plan.basis`` and ``plan.null_control`` (``ablate/config/run.py``'s ``PlanConfig``). Every run's ``config.yaml``
keeps it, so the margins a report applies were fixed before any result was seen: the report takes them from the
runs, says so in its settings, and names any margin, primary metric or null control the command line changed. Runs
that declare nothing get the report's own margins, and the report says those were chosen at analysis time.

A margin is judged against the baseline's effect over the SFT model (``SFT_VALUE``: what the SFT model itself
scores on the metric): a margin more than half that effect lets an *equivalent* stand-in lose more than half of what
training achieved, and the report warns.
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd

from analysis.load import is_missing
from analysis.report_config import ReportConfig, parse_margin

PREFIX = "cfg.plan."
#: each metric's value for the SFT model itself (the baseline's effect is its mean's distance from this)
SFT_VALUE = {"reward_delta": 0.0, "win_rate": 0.5, "kl_true": 0.0}
MOST_OF_EFFECT = 0.5  # a margin above this share of the effect is warned of


def plan_of(runs: pd.DataFrame) -> dict | None:
    """The plan the runs declare (``primary``, ``margins``, ``seeds``, ``basis``, and ``jobs``: how many of the
    runs declare it, of ``of``), None where none declares one; a ValueError where they declare different ones. Runs
    that declare none beside runs that do (a baseline from an earlier sweep) leave the plan to the others, and
    ``jobs < of`` says so."""
    cols = [c for c in runs if c.startswith(PREFIX)]
    each = [
        tuple((c.removeprefix(PREFIX), row[c]) for c in cols if not _empty(row[c])) for _, row in runs[cols].iterrows()
    ]
    declared = sorted({p for p in each if p}, key=each.index)  # config order
    if not declared:
        return None
    if len(declared) > 1:
        raise ValueError(
            f"the runs declare {len(declared)} different plans: report them separately, or give every margin "
            "with --margin"
        )
    items = dict(declared[0])
    seeds = items.get("seeds")
    return dict(
        primary=items.get("primary"),
        margins={k.removeprefix("margins."): str(v) for k, v in items.items() if k.startswith("margins.")},
        seeds=None if seeds is None else int(seeds),
        basis=str(items.get("basis", "")),
        null_control=None if _empty(items.get("null_control")) else str(items["null_control"]),
        jobs=sum(bool(p) for p in each),
        of=len(each),
    )


def _empty(v) -> bool:
    return is_missing(v) or v == ""


def apply(
    cfg: ReportConfig,
    plan: dict | None,
    cli_margins: list[str],
    cli_primary: str | None,
    cli_null_control: str | None = None,
) -> ReportConfig:
    """``cfg`` with the plan's primary metric, margins and null control (the command line's win, and are named),
    and the lines that say where they came from (``cfg.origin``)."""
    primary = cli_primary or (plan or {}).get("primary") or cfg.primary
    null = cli_null_control or (plan or {}).get("null_control") or cfg.null_control
    if plan is None:
        origin = ["- margins chosen at analysis time: the runs declare no `plan` (`ablate/config/run.py`)"]
        return dataclasses.replace(cfg, primary=primary, null_control=null, origin=tuple(origin))
    margins = dict(cfg.margins)
    given = dict(parse_margin(m) for m in cli_margins)
    declared = dict(parse_margin(f"{m}={v}") for m, v in plan["margins"].items())
    margins.update(declared)
    margins.update(given)
    listed = ", ".join(f"`{m}` ±{declared[m].describe()}" for m in declared) or "none"
    origin = [
        f"- declared before the runs (their `plan`): margins {listed}"
        + (f"; primary `{plan['primary']}`" if plan.get("primary") else "")
        + (f"; {plan['seeds']} seeds planned" if plan.get("seeds") else "")
        + (f"; null control `{plan['null_control']}`" if plan.get("null_control") else "")
        + (f"; basis: {plan['basis']}" if plan.get("basis") else "")
        + (
            f" (declared by {plan['jobs']} of the {plan['of']} jobs; the others declare none)"
            if plan.get("jobs", 0) < plan.get("of", 0)
            else ""
        )
    ]
    changed = [m for m in given if m in declared and given[m] != declared[m]]
    if changed:
        origin.append(
            "- **changed at analysis time** (`--margin`): "
            + ", ".join(f"`{m}` ±{given[m].describe()} (declared ±{declared[m].describe()})" for m in changed)
        )
    for what, given_value, key in (
        ("primary metric", cli_primary, "primary"),
        ("null control", cli_null_control, "null_control"),
    ):
        if given_value and plan.get(key) and given_value != plan[key]:
            origin.append(f"- **{what} changed at analysis time**: `{given_value}` (declared `{plan[key]}`)")
    return dataclasses.replace(cfg, primary=primary, margins=margins, null_control=null, origin=tuple(origin))


def effect_warnings(cfg: ReportConfig, runs: pd.DataFrame) -> list[str]:
    """A warning line per condition and metric whose margin is more than half of the baseline's effect over the SFT
    model (the margin resolved against the baseline's mean there)."""
    done = runs[(runs["status"] == "finished") & (runs["regime"] == cfg.baseline)]
    lines = []
    for cond, g in done.groupby("condition", sort=False):
        for metric in cfg.metrics():
            if metric not in SFT_VALUE or metric not in g or metric not in cfg.margins:
                continue
            mean = float(g[metric].astype(float).mean())
            effect, margin = abs(mean - SFT_VALUE[metric]), cfg.margins[metric].resolve(mean)
            if math.isfinite(effect) and math.isfinite(margin) and margin > MOST_OF_EFFECT * effect:
                lines.append(
                    f"- **Margin above half the effect ({cond})**: the margin of `{metric}`, ±{margin:.3g}, is "
                    + (f"{margin / effect:.0%} of" if effect > 0 else "more than")
                    + f" `{cfg.baseline}`'s effect over the SFT model ({effect:.3g}): an *equivalent* there allows "
                    "a stand-in to lose more than half of what training achieved."
                )
    return lines
