"""Equivalence verdicts (TOST), the hierarchical bootstrap and intervals of positive quantities, on numbers
worked out by hand and on synthetic run folders (no model runs)."""

import math

import numpy as np
import pandas as pd
import pytest

from analysis import bootstrap, crossed
from analysis.equivalence import boot_interval, compare, union_row, verdict
from analysis.load import load_runs
from analysis.report_config import Margin, ReportConfig, build_config, parse_margin
from analysis.report_verdicts import verdict_table
from analysis.samples import prompt_frame
from analysis.stats import aggregate, positive_interval, t_interval
from tests.analysis.synthetic import samples, write_run


def _verdicts(root, cfg=None):
    runs = load_runs(root).runs
    cfg = cfg or ReportConfig(n_boot=1000)
    return compare(runs, prompt_frame(runs), cfg).set_index(["regime", "metric"])


def test_verdict_rule_on_known_intervals():
    assert verdict(-0.03, 0.04, -0.02, 0.03, 0.05) == "equivalent"
    assert verdict(0.01, 0.04, 0.015, 0.035, 0.05) == "equivalent"  # detected, but smaller than the margin
    assert verdict(0.2, 0.4, 0.22, 0.38, 0.05) == "different"
    assert verdict(-0.01, 0.2, 0.0, 0.18, 0.05) == "inconclusive"
    assert verdict(-0.04, 0.06, -0.03, 0.05, 0.05) == "inconclusive"  # touching the margin is not inside
    assert verdict(math.nan, math.nan, math.nan, math.nan, 0.05) == "inconclusive"
    assert verdict(-0.01, 0.01, -0.01, 0.01, math.nan) == "inconclusive"  # no margin: never equivalent


def test_known_equivalent_different_and_inconclusive_regimes(tmp_path):
    """Per-prompt differences from the baseline are exactly the shift (same seed: same prompts and noise), so
    the intervals are known: nf4 +0.02 everywhere (equivalent), int8 +0.3 (different), and ema +0.12 in seed 0
    and -0.08 in seed 1: the bootstrap's resampled seed means are -0.08, 0.02 or 0.12, the seed-level t interval
    (1 degree of freedom) 0.02 ± t(0.975, 1) x 0.1 = ± 1.2706 (inconclusive)."""
    for seed in (0, 1):
        write_run(tmp_path, "full", seed, samples(seed, 12))
        write_run(tmp_path, "nf4", seed, samples(seed, 12, shift=0.02))
        write_run(tmp_path, "int8", seed, samples(seed, 12, shift=0.3))
        write_run(tmp_path, "ema", seed, samples(seed, 12, shift=(0.12, -0.08)[seed]))
    v = _verdicts(tmp_path)
    nf4 = v.loc[("nf4", "reward_delta")]
    assert (nf4["lo"], nf4["hi"], nf4["diff"]) == pytest.approx((0.02, 0.02, 0.02))
    assert nf4["verdict"] == "equivalent"
    # the seeds share their 12 prompts: the crossed design's intervals (the nested ones with --design nested)
    assert nf4["method"] == "union of two-way bootstrap, two-way t and seed-level t (2 seeds x 12 prompts)"
    nested = _verdicts(tmp_path, ReportConfig(n_boot=1000, design="nested")).loc[("nf4", "reward_delta")]
    assert nested["method"] == "union of hierarchical bootstrap and seed-level t (2 seeds x 12 prompts)"
    assert math.isnan(nested["crossed_t_lo"]) and nf4["crossed_t_lo"] == pytest.approx(0.02)
    assert v.loc[("int8", "reward_delta"), "verdict"] == "different"
    ema = v.loc[("ema", "reward_delta")]
    assert (ema["boot_lo"], ema["boot_hi"], ema["diff"]) == pytest.approx((-0.08, 0.12, 0.02))
    assert (ema["seed_t_lo"], ema["seed_t_hi"]) == pytest.approx((0.02 - 1.27062, 0.02 + 1.27062), abs=1e-5)
    # every prompt's difference is the seed's: no prompt spread, and the two-way t is the seed-level t
    assert (ema["crossed_t_lo"], ema["crossed_t_hi"]) == pytest.approx((ema["seed_t_lo"], ema["seed_t_hi"]))
    assert (ema["lo"], ema["hi"]) == pytest.approx((ema["seed_t_lo"], ema["seed_t_hi"]))
    assert ema["verdict"] == "inconclusive" and "t wider" in ema["note"]
    assert {k: round(float(v), 12) for k, v in (x.split(":") for x in ema["seed_diffs"].split(";"))} == {
        "0": 0.12,
        "1": -0.08,
    }
    table = verdict_table(v.reset_index(), ReportConfig()).splitlines()
    assert "| each seed |" in table[0] and "| 0.12, -0.08 |" in table[2 + list(v.index).index(("ema", "reward_delta"))]
    assert v.loc[("nf4", "kl_true"), "margin"] == pytest.approx(math.log(1.1))  # a relative margin: log ratio


def test_one_paired_seed_gets_no_verdict_whatever_its_prompts_give(tmp_path):
    """The same shifts as above with ``int8`` and ``nf4`` at seed 0 only: their intervals over the prompts are as
    tight as before (+0.3 and +0.02 on every prompt), but one seed holds no training noise, so neither is *different*
    or *equivalent*: both *inconclusive*, the note saying what the prompts alone give; the statistics section says
    why; ``cached``, identical on every sample, stays a determinism check; with both seeds the verdicts return."""
    from analysis.report_verdicts import statistics_lines

    for seed in (0, 1):
        write_run(tmp_path, "full", seed, samples(seed, 12))
    write_run(tmp_path, "int8", 0, samples(0, 12, shift=0.3))
    write_run(tmp_path, "nf4", 0, samples(0, 12, shift=0.02))
    write_run(tmp_path, "cached", 0, samples(0, 12))
    cfg = ReportConfig(n_boot=1000)
    v = _verdicts(tmp_path, cfg)
    int8, nf4 = v.loc[("int8", "reward_delta")], v.loc[("nf4", "reward_delta")]
    assert (int8["lo"], int8["hi"], nf4["lo"], nf4["hi"]) == pytest.approx((0.3, 0.3, 0.02, 0.02))
    assert int8["verdict"] == nf4["verdict"] == "inconclusive"
    assert int8["note"].endswith(
        "no verdict from one seed (training noise is not in its interval): different over the prompts alone"
    )
    assert nf4["note"].endswith("equivalent over the prompts alone")
    assert set(v.loc["cached", "verdict"]) == {"determinism check"}
    runs = load_runs(tmp_path).runs
    said = [line for line in statistics_lines(cfg, prompt_frame(runs), v.reset_index()) if "one seed" in line]
    assert len(said) == 1 and "gets no verdict (**inconclusive**" in said[0]
    write_run(tmp_path, "int8", 1, samples(1, 12, shift=0.3))
    both = _verdicts(tmp_path, cfg)
    assert both.loc[("int8", "reward_delta"), "verdict"] == "different"
    assert not any(
        "one seed" in line for line in statistics_lines(cfg, prompt_frame(runs), both.drop("nf4").reset_index())
    )


def test_seed_level_t_fallback_without_samples(tmp_path):
    """No samples.jsonl: the paired t interval of the summary values. Differences 0.01, 0.02, 0.03: mean 0.02,
    sd 0.01, 90% half-width t(0.95, 2) * 0.01 / sqrt(3) = 0.01686: inside ±0.05."""
    for seed, d in enumerate((0.01, 0.02, 0.03)):
        write_run(tmp_path, "full", seed, reward_delta=0.1, win_rate=0.5, kl_true=1.0)
        write_run(tmp_path, "int8", seed, reward_delta=0.1 + d, win_rate=0.5, kl_true=1.0)
    row = _verdicts(tmp_path).loc[("int8", "reward_delta")]
    half = 2.919985580355516 * 0.01 / math.sqrt(3)
    assert (row["lo_inner"], row["hi_inner"]) == pytest.approx((0.02 - half, 0.02 + half))
    assert row["method"].startswith("seed-level t") and row["verdict"] == "equivalent"


def test_bootstrap_is_deterministic_and_shrinks_with_more_prompts():
    rng = np.random.default_rng(7)
    few = [rng.normal(0, 1, 10) for _ in range(3)]
    many = [rng.normal(0, 1, 400) for _ in range(3)]
    a = bootstrap.interval(few, 1000, bootstrap.rng_for(0, "x"))
    b = bootstrap.interval(few, 1000, bootstrap.rng_for(0, "x"))
    c = bootstrap.interval(few, 1000, bootstrap.rng_for(1, "x"))
    assert (a.lo, a.hi) == (b.lo, b.hi) and (a.lo, a.hi) != (c.lo, c.hi)
    wide, narrow = a, bootstrap.interval(many, 1000, bootstrap.rng_for(0, "x"))
    assert narrow.hi - narrow.lo < (wide.hi - wide.lo) / 3
    assert a.lo < a.lo_inner < a.estimate < a.hi_inner < a.hi


def test_bootstrap_resamples_seeds_then_prompts_within_them():
    """Seeds of different sizes: a resample only draws a seed's own prompts (seed 0's values are all 0,
    seed 1's all 10), so every resampled mean is 0, 5 or 10."""
    reps = bootstrap.resample([np.zeros(3), np.full(50, 10.0)], 500, bootstrap.rng_for(0))
    assert set(np.round(reps, 9)) == {0.0, 5.0, 10.0}
    assert bootstrap.estimate([np.zeros(3), np.full(50, 10.0)]) == 5.0


def test_union_is_the_bootstrap_with_one_seed_and_widened_by_the_seeds_spread():
    rng = np.random.default_rng(0)
    one = [rng.normal(0.1, 0.3, 40)]
    iv = bootstrap.interval(one, 500, np.random.default_rng(1))
    u = union_row(iv, one, 0.05)
    assert (u["lo"], u["hi"], u["lo_inner"], u["hi_inner"]) == (iv.lo, iv.hi, iv.lo_inner, iv.hi_inner)
    assert math.isnan(u["seed_t_lo"]) and u["note"] == ""
    # three seeds whose means disagree far more than their prompts vary: the t interval sets both ends
    three = [rng.normal(m, 0.01, 40) for m in (0.0, 0.2, 0.4)]
    iv = bootstrap.interval(three, 500, np.random.default_rng(1))
    u = union_row(iv, three, 0.05)
    t95, t90 = t_interval([x.mean() for x in three], 0.95), t_interval([x.mean() for x in three], 0.90)
    assert (u["lo"], u["hi"], u["lo_inner"], u["hi_inner"]) == (t95.lo, t95.hi, t90.lo, t90.hi)
    assert u["lo"] < iv.lo and u["hi"] > iv.hi and u["note"]
    # a positive quantity's seed-level interval is on the log scale: it stays above zero
    pos = [rng.normal(m, 0.01, 40) for m in (0.5, 3.0)]
    u = union_row(bootstrap.interval(pos, 500, np.random.default_rng(1)), pos, 0.05, positive=True)
    assert u["lo"] > 0 and u["seed_t_lo"] > 0


@pytest.mark.parametrize("n_seeds, boot_at_most", [(2, 0.85), (4, 0.92)])
def test_few_seeds_bootstrap_under_covers_and_the_union_does_not(n_seeds, boot_at_most):
    """Simulated sweeps whose seeds differ more than their prompts (training noise sd 0.1 per seed, sample noise
    0.3 per prompt, 64 prompts): how often each 95% interval covers the true difference 0. The percentile
    bootstrap over a few seeds falls well short (the reason for the union); the union does not."""
    rng = np.random.default_rng(7)
    n, boot, union = 300, 0, 0
    for _ in range(n):
        data = list(rng.normal(0, 0.1, (n_seeds, 1)) + rng.normal(0, 0.3, (n_seeds, 64)))
        iv = bootstrap.interval(data, 400, rng)
        u = union_row(iv, data, 0.05)
        boot += iv.lo <= 0 <= iv.hi
        union += u["lo"] <= 0 <= u["hi"]
    assert boot / n <= boot_at_most
    assert union / n >= 0.93


#: (sd of the seed effect, of the prompt effect shared by every seed, of a seed's own prompt noise): the committed
#: DPO report's paired differences measure 0-0.13, 0-0.09 and 0.10-0.40 on reward gain and true KL (`none` more);
#: the last world is one where the shared prompt effect dominates
CROSSED_WORLDS = [(0.1, 0.0, 0.3), (0.0, 0.1, 0.3), (0.1, 0.1, 0.3), (0.05, 0.05, 0.3), (0.0, 0.2, 0.1)]


@pytest.mark.slow
@pytest.mark.parametrize("n_seeds", [3, 4, 8])
def test_crossed_design_covers_where_the_nested_one_does_not(n_seeds):
    """Simulated crossed sweeps (every seed evaluates the same 64 prompts: y[s, p] = a[s] + b[p] + e[s, p], true
    difference 0) in four worlds, from seeds-dominated to prompts-dominated: the crossed design's interval (the
    union of the two-way bootstrap, the two-way t and the seed-level t) covers 0 in at least 95% of sweeps on
    average, and in each world within two simulation standard errors (1.1 points at 400 sweeps) of 95%. Where the
    shared prompt effect dominates, the nested union, which resamples it as if each seed had its own, falls short."""
    rng = np.random.default_rng(2026 + n_seeds)
    n, floor = 400, 0.95 - 2 * math.sqrt(0.95 * 0.05 / 400)
    covered = {}
    for sa, sb, se in CROSSED_WORLDS:
        hits = nested_hits = 0
        for _ in range(n):
            y = rng.normal(0, sa, (n_seeds, 1)) + rng.normal(0, sb, (1, 64)) + rng.normal(0, se, (n_seeds, 64))
            u = union_row(boot_interval(list(y), y, 400, rng, 0.05), list(y), 0.05, two_way=y)
            hits += u["lo"] <= 0 <= u["hi"]
            nu = union_row(boot_interval(list(y), None, 400, rng, 0.05), list(y), 0.05)
            nested_hits += nu["lo"] <= 0 <= nu["hi"]
        covered[sa, sb] = hits / n
        assert hits / n >= floor, (sa, sb, se, hits / n)
        if (sa, sb) == (0.0, 0.2):
            assert nested_hits / n <= 0.85, nested_hits / n
    assert np.mean(list(covered.values())) >= 0.95, covered


def test_two_way_t_is_the_random_effects_interval_worked_by_hand():
    """2 seeds x 3 prompts: seed means 1 and 2, prompt means 1, 1.5, 2 (grand mean 1.5); MS_seed = 3 x 0.5 = 1.5,
    MS_prompt = 2 x 0.25 = 0.5; variance (1.5 + 0.5) / 6 = 1/3; Satterthwaite df 4 / (1.5**2 / 1 + 0.5**2 / 2) =
    1.6842. One seed: the t interval over its prompts. A missing cell drops its prompt from the t interval."""
    y = np.array([[0.5, 1.0, 1.5], [1.5, 2.0, 2.5]])
    lo, hi = crossed.t_bounds(y, 0.95)
    from scipy.stats import t

    half = t.ppf(0.975, 4 / (1.5**2 + 0.5**2 / 2)) * math.sqrt(1 / 3)
    assert (lo, hi) == pytest.approx((1.5 - half, 1.5 + half))
    lo1, hi1 = crossed.t_bounds(y[:1], 0.95)
    assert (lo1, hi1) == pytest.approx(
        (1.0 - t.ppf(0.975, 2) * 0.5 / math.sqrt(3), 1.0 + t.ppf(0.975, 2) * 0.5 / math.sqrt(3))
    )
    gap = y.copy()
    gap[0, 2] = math.nan
    assert crossed.t_bounds(gap, 0.95) == pytest.approx(crossed.t_bounds(y[:, :2], 0.95))
    assert crossed.estimate(gap) == pytest.approx((0.75 + 2.0) / 2)
    # the two-way bootstrap draws seeds and prompts: with no seed spread, no prompt spread, it is a point
    flat = np.full((3, 5), 0.25)
    assert set(crossed.resample(flat, 50, np.random.default_rng(0))) == {0.25}
    assert crossed.is_crossed({0: pd.Series([1.0], ["a"]), 1: pd.Series([2.0], ["a"])})
    assert not crossed.is_crossed({0: pd.Series([1.0], ["a"]), 1: pd.Series([2.0], ["b"])})


def test_positive_quantity_keeps_its_interval_above_zero():
    spread = [0.001, 0.5, 3.0]
    assert t_interval(spread).lo < 0  # the plain t interval crosses zero
    iv = positive_interval(spread, bootstrap.rng_for(0))
    assert 0 < iv.lo < iv.mean < iv.hi and iv.mean == pytest.approx((0.001 * 0.5 * 3.0) ** (1 / 3))
    with_zero = positive_interval([0.0, 0.5, 3.0], bootstrap.rng_for(0))
    assert with_zero.lo >= 0 and with_zero.mean == pytest.approx(3.5 / 3) and "bootstrap" in with_zero.method
    same = positive_interval([2.0**20] * 3, bootstrap.rng_for(0))
    assert (same.mean, same.lo, same.hi) == (2.0**20, 2.0**20, 2.0**20)  # exactly, not exp(log(x))
    runs = pd.DataFrame(
        {"status": "finished", "condition": "c", "regime": "int8", "algo": "dpo", "seed": [0, 1, 2], "kl_true": spread}
    )
    row = aggregate(runs, ["kl_true"]).iloc[0]
    assert row["kl_true_lo"] > 0 and row["kl_true_method"].startswith("geometric mean")


def test_margins_from_the_command_line():
    assert parse_margin("kl_true=10%") == ("kl_true", Margin(0.10, relative=True))
    assert parse_margin("reward_delta=0.02") == ("reward_delta", Margin(0.02))
    cfg = build_config(["kl_true=20%", "ppl=1"], alpha=0.1, n_boot=500)
    assert cfg.margins["kl_true"].resolve(2.0) == pytest.approx(0.4) and cfg.margins["win_rate"].value == 0.05
    assert cfg.metrics() == ["reward_delta", "win_rate", "kl_true", "length", "ppl"]
    for bad in ("kl_true", "kl_true=abc", "kl_true=-1", "=0.1"):
        with pytest.raises(ValueError):
            parse_margin(bad)


def test_a_regime_identical_on_every_sample_is_a_determinism_check_not_a_test(tmp_path):
    """``cached`` writes the baseline's very samples (the same code path): no verdict, no p-value, out of the counts
    and of Holm's family, and the null-control section says the report has no control that can fail; ``nf4``, 0.02
    off on every prompt, is still a test."""
    from analysis.equivalence import null_control
    from analysis.report_verdicts import verdict_findings

    for seed in (0, 1):
        write_run(tmp_path, "full", seed, samples(seed, 12))
        write_run(tmp_path, "cached", seed, samples(seed, 12))
        write_run(tmp_path, "nf4", seed, samples(seed, 12, shift=0.02))
    cfg = ReportConfig(n_boot=1000)
    v = _verdicts(tmp_path, cfg)
    cached = v.loc["cached"]
    assert set(cached["verdict"]) == {"determinism check"}
    assert cached["p_diff"].isna().all() and cached["p_holm"].isna().all() and cached["power_tost"].isna().all()
    assert all("identical to the baseline on every sample" in n for n in cached["note"])
    assert v.loc[("nf4", "reward_delta"), "verdict"] == "equivalent" and v.loc["nf4", "p_holm"].notna().all()
    # Holm's family is nf4's rows alone: its smallest p is multiplied by their count, not by twice it
    nf4 = v.loc["nf4"]
    assert nf4["p_holm"].min() == pytest.approx(min(1.0, nf4["p_diff"].min() * nf4["p_diff"].notna().sum()))
    found = verdict_findings(v.reset_index(), cfg)
    assert f"Of {len(nf4)} verdicts:" in found[-2] and "Not counted: 4 rows of `cached` (all runs)" in found[-1]
    assert not any("`cached` vs" in line for line in found)
    (line,) = null_control(v.reset_index(), cfg)
    assert line.startswith("- **No null control that can fail (all runs)**")


def test_a_relative_metric_is_read_as_a_log_ratio_per_seed(tmp_path):
    """nf4's true KL is 1.2x full's on every prompt of seed 0 and 1.1x on seed 1: the row is the mean of the two log
    ratios against ±log(1.1), its seed-level t interval (1 degree of freedom) mean ± 12.706 x |log 1.2 - log 1.1| / 2;
    int8's, 1.02x everywhere, is equivalent; reward stays a difference; ``relative="difference"`` the old rule."""
    for seed, factor in ((0, 1.2), (1, 1.1)):
        write_run(tmp_path, "full", seed, samples(seed, 12))
        write_run(tmp_path, "nf4", seed, samples(seed, 12, kl=factor))
        write_run(tmp_path, "int8", seed, samples(seed, 12, kl=1.02))
    v = _verdicts(tmp_path)
    nf4 = v.loc[("nf4", "kl_true")]
    mean, half = (math.log(1.2) + math.log(1.1)) / 2, 12.7062 * (math.log(1.2) - math.log(1.1)) / 2
    assert nf4["scale"] == "log ratio" and nf4["diff"] == pytest.approx(mean)
    assert nf4["margin"] == pytest.approx(math.log(1.1))
    assert (nf4["seed_t_lo"], nf4["seed_t_hi"]) == pytest.approx((mean - half, mean + half), abs=1e-4)
    assert math.log(1.1) - 1e-12 <= nf4["boot_lo"] <= nf4["boot_hi"] <= math.log(1.2) + 1e-12
    assert nf4["verdict"] == "inconclusive" and nf4["method"].startswith("log ratio: two-way bootstrap of both means")
    assert v.loc[("nf4", "length"), "verdict"] == "determinism check" or v.loc[("nf4", "length"), "diff"] == 0
    int8 = v.loc[("int8", "kl_true")]
    assert (int8["lo"], int8["hi"]) == pytest.approx((math.log(1.02), math.log(1.02))) and int8[
        "verdict"
    ] == "equivalent"
    assert v.loc[("nf4", "reward_delta"), "scale"] == "difference"
    old = _verdicts(tmp_path, ReportConfig(n_boot=1000, relative="difference")).loc[("nf4", "kl_true")]
    assert old["scale"] == "difference" and old["margin"] == pytest.approx(0.1 * old["baseline_mean"])
