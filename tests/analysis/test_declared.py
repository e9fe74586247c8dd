"""Margins declared before the runs (the runs' ``plan``): the report applies them and says so, names a margin the
command line changed, applies a declared null control, refuses runs that declare different plans, warns of a margin above half of the baseline's
effect; ``analysis plan --fraction`` derives margins to declare from a calibration's runs."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis.__main__ import main
from tests.analysis.synthetic import samples, write_run

PLAN = {"plan": {"margins": {"reward_delta": "0.02", "kl_true": "20%"}, "seeds": 8, "basis": "25% of full's effect"}}


def _sweep(root, plan=PLAN, other=None):
    for seed in (0, 1):
        write_run(root, "full", seed, samples(seed, 8), config=plan)
        write_run(root, "int8", seed, samples(seed, 8, shift=0.01), config=other or plan)


def _report(root, out, *extra) -> str:
    assert main(["report", str(root), "--out", str(out), "--boot", "200", *extra]) == 0
    return (out / "report.md").read_text()


def test_the_runs_declared_margins_are_applied_and_said(tmp_path):
    _sweep(tmp_path / "s")
    text = _report(tmp_path / "s", tmp_path / "r")
    assert "- declared before the runs (their `plan`): margins `reward_delta` ±0.02 absolute, `kl_true` ±20% of" in text
    assert "8 seeds planned; basis: 25% of full's effect" in text
    eq = pd.read_csv(tmp_path / "r" / "equivalence.csv").set_index(["regime", "metric"])
    assert eq.loc[("int8", "reward_delta"), "margin"] == pytest.approx(0.02)
    assert eq.loc[("int8", "kl_true"), "margin"] == pytest.approx(math.log(1.2))  # 20%, on the log-ratio scale
    assert eq.loc[("int8", "win_rate"), "margin"] == pytest.approx(0.05)  # not declared: the report's default
    changed = _report(tmp_path / "s", tmp_path / "r2", "--margin", "reward_delta=0.05")
    assert (
        "**changed at analysis time** (`--margin`): `reward_delta` ±0.05 absolute (declared ±0.02 absolute)" in changed
    )


def test_a_declared_null_control_is_the_reports_unless_the_command_line_names_another(tmp_path):
    plan = {"plan": {**PLAN["plan"], "null_control": "int8"}}
    _sweep(tmp_path / "s", plan=plan)
    text = _report(tmp_path / "s", tmp_path / "r")
    assert "8 seeds planned; null control `int8`; basis" in text
    assert "baseline `full`; null control `int8`" in text  # the settings the report ran under
    assert "No `int8` runs compared" not in text and "No `cached` runs compared" not in text
    changed = _report(tmp_path / "s", tmp_path / "r2", "--null-control", "cached")
    assert "**null control changed at analysis time**: `cached` (declared `int8`)" in changed
    assert "No `cached` runs compared with `full`" in changed
    undeclared = _report(tmp_path / "s", tmp_path / "r3", "--null-control", "int8")
    assert "changed at analysis time" not in undeclared


def test_runs_without_a_plan_say_their_margins_were_chosen_at_analysis_time(tmp_path):
    _sweep(tmp_path / "s", plan=None)
    assert "- margins chosen at analysis time: the runs declare no `plan`" in _report(tmp_path / "s", tmp_path / "r")


def test_runs_that_declare_different_plans_are_one_line(tmp_path, capsys):
    other = {"plan": {"margins": {"reward_delta": "0.03"}}}
    _sweep(tmp_path / "s", other=other)
    assert main(["report", str(tmp_path / "s"), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["analysis: error: the runs declare 2 different plans: report them separately, or give every "
                   "margin with --margin"]  # fmt: skip


def test_a_plan_some_runs_declare_is_the_reports_and_says_who_declared_it(tmp_path):
    """A baseline from an earlier sweep (no plan) beside the runs that declare one: their plan applies, and the
    report says how many jobs declared it."""
    for seed in (0, 1):
        write_run(tmp_path / "s", "full", seed, samples(seed, 8))
        write_run(tmp_path / "s", "int8", seed, samples(seed, 8, shift=0.01), config=PLAN)
    text = _report(tmp_path / "s", tmp_path / "r")
    assert "basis: 25% of full's effect (declared by 2 of the 4 jobs; the others declare none)" in text
    eq = pd.read_csv(tmp_path / "r" / "equivalence.csv").set_index(["regime", "metric"])
    assert eq.loc[("int8", "reward_delta"), "margin"] == pytest.approx(0.02)


def test_a_margin_above_half_of_the_baselines_effect_is_warned_of(tmp_path):
    """The synthetic `full` wins against its SFT sample about half the time: a ±0.05 win-rate margin is far more
    than half of an effect near 0; its reward gain (near 0 too) is warned of with the declared 0.02."""
    _sweep(tmp_path / "s")
    text = _report(tmp_path / "s", tmp_path / "r")
    runs = pd.read_csv(tmp_path / "r" / "summary.csv").set_index("regime")
    effect = abs(runs.loc["full", "win_rate_mean"] - 0.5)
    warned = "the margin of `win_rate`, ±0.05, is" in text
    assert warned == (0.05 > 0.5 * effect)
    assert "allows a stand-in to lose more than half of what training achieved" in text


def test_plan_derives_margins_to_declare_from_the_baselines_effect(tmp_path, capsys):
    for seed in (0, 1):
        write_run(tmp_path, "full", seed, reward_delta=0.1 + 0.02 * seed, win_rate=0.6, kl_true=2.0)
    assert main(["plan", str(tmp_path), "--fraction", "0.25"]) == 0
    out = capsys.readouterr().out
    assert "plan: no regime to compare with `full`" in out
    assert "| reward_delta | 2 | 0.11 | 0 | 0.11 | 0.0275 | `+plan.margins.reward_delta=0.0275` |" in out
    assert "`+plan.margins.win_rate=0.025`" in out and "`+plan.margins.kl_true=0.5`" in out
    assert main(["plan", str(tmp_path), "--fraction", "1.5"]) == 2
