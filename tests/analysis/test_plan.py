"""``python -m analysis plan``: the power of the equivalence test over seeds and the seeds a verdict needs, against a
Monte Carlo of the paired t TOST and on synthetic pilot sweeps (no model runs)."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.__main__ import main
from analysis.pvalues import MOST_SEEDS, seeds_needed, tost_power
from tests.analysis.synthetic import samples, write_run


@pytest.mark.parametrize("diff", [0.0, 0.3])
def test_power_agrees_with_a_simulation_of_the_paired_t_tost(diff):
    """8 seeds, sd 1, margin 1: the share of simulated pilots whose 90% t interval lies inside the margin."""
    rng = np.random.default_rng(0)
    x = rng.normal(diff, 1.0, (40_000, 8))
    mean, se = x.mean(1), x.std(1, ddof=1) / math.sqrt(8)
    t = stats.t.ppf(0.95, 7)
    simulated = float(((mean - t * se > -1) & (mean + t * se < 1)).mean())
    assert tost_power(1.0, 8, 1.0, diff) == pytest.approx(simulated, abs=0.01)


def test_seeds_needed_grow_with_the_noise_and_never_come_beyond_the_margin():
    # the review's figure: a paired sd of 0.37 nats against a 0.25-nat margin needs 8 seeds or more (here 21 for 80%)
    assert seeds_needed(0.37, 0.25) >= 8
    assert (
        tost_power(0.37, int(seeds_needed(0.37, 0.25)), 0.25)
        >= 0.8
        > tost_power(0.37, int(seeds_needed(0.37, 0.25)) - 1, 0.25)
    )
    assert seeds_needed(0.1, 0.25) < seeds_needed(0.2, 0.25) < seeds_needed(0.37, 0.25)
    assert seeds_needed(0.1, 0.25, diff=0.3) == math.inf  # a true difference beyond the margin is never equivalent
    assert seeds_needed(0.0, 0.25) == 2 and math.isnan(seeds_needed(math.nan, 0.25))
    assert math.isnan(tost_power(0.1, 1, 0.25))  # one seed has no spread to plan from
    assert seeds_needed(10.0, 0.01) == math.inf and MOST_SEEDS == 64


def test_plan_on_a_pilot_sweep(tmp_path, capsys):
    """Three seeds: int8 shifted by 0, 0.02, 0.04 from full (sd 0.02 over seeds) on reward gain; the table gives its
    pilot sd and the seeds for 80% power; a sweep of full alone says it has nothing to compare; bad input is 2."""
    for seed in range(3):
        write_run(tmp_path, "full", seed, samples(seed, 16))
        write_run(tmp_path, "int8", seed, samples(seed, 16, shift=0.02 * seed))
    csv = tmp_path / "plan.csv"
    assert main(["plan", str(tmp_path), "--csv", str(csv)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("| condition | regime | metric | pilot seeds |")
    row = pd.read_csv(csv).set_index(["regime", "metric"]).loc[("int8", "reward_delta")]
    assert (row["pilot_seeds"], row["diff"], row["sd"], row["margin"]) == pytest.approx((3, 0.02, 0.02, 0.05))
    # true KL, a relative margin: planned on the report's log-ratio scale (identical KL: log ratios of 0)
    kl = pd.read_csv(csv).set_index(["regime", "metric"]).loc[("int8", "kl_true")]
    assert (kl["diff"], kl["sd"], kl["margin"]) == pytest.approx((0.0, 0.0, math.log(1.1)))
    assert row["seeds_if_0"] == seeds_needed(0.02, 0.05) and row["power_now"] == pytest.approx(
        tost_power(0.02, 3, 0.05, 0.02)
    )
    alone = tmp_path / "alone"
    write_run(alone, "full", 0, samples(0, 16))
    assert main(["plan", str(alone)]) == 0
    assert capsys.readouterr().out.strip() == "plan: no regime to compare with `full`"
    assert main(["plan", str(tmp_path), "--power", "1.5"]) == 2
    assert capsys.readouterr().err.strip() == "analysis: error: --power must be in (0, 1), not 1.5"


def test_plan_without_samples_pairs_the_summaries(tmp_path, capsys):
    """No samples.jsonl: the per-seed differences are the summaries' (0.01, 0.02, 0.03: mean 0.02, sd 0.01)."""
    for seed, d in enumerate((0.01, 0.02, 0.03)):
        write_run(tmp_path, "full", seed, reward_delta=0.1, win_rate=0.5, kl_true=1.0)
        write_run(tmp_path, "int8", seed, reward_delta=0.1 + d, win_rate=0.5, kl_true=1.0)
    csv = tmp_path / "plan.csv"
    assert main(["plan", str(tmp_path), "--csv", str(csv)]) == 0
    row = pd.read_csv(csv).set_index(["regime", "metric"]).loc[("int8", "reward_delta")]
    assert (row["pilot_seeds"], row["diff"], row["sd"]) == pytest.approx((3, 0.02, 0.01))
