"""Aggregation, intervals and paired tests on numbers worked out by hand (scipy's t quantiles)."""

import math

import pandas as pd
import pytest

from analysis.load import from_recorded
from analysis.stats import aggregate, paired_vs_baseline, t_interval
from tests.conftest import REPO

FIXTURE = REPO / "tests" / "analysis" / "fixtures" / "wandb_api_runs.json"


def test_t_interval_known_numbers():
    iv = t_interval([1.0, 2.0, 3.0])
    assert (iv.mean, iv.std, iv.n) == (2.0, 1.0, 3)
    half = 4.302652729911275 / math.sqrt(3)  # t(0.975, df=2)
    assert iv.lo == pytest.approx(2.0 - half) and iv.hi == pytest.approx(2.0 + half)


def test_t_interval_drops_nan_and_has_no_interval_for_one_value():
    iv = t_interval([float("nan"), 5.0])
    assert (iv.mean, iv.n) == (5.0, 1) and math.isnan(iv.lo) and math.isnan(iv.std)
    assert t_interval([]).n == 0 and math.isnan(t_interval([]).mean)


def test_aggregate_and_paired_test_on_the_recorded_runs():
    data = from_recorded(FIXTURE)
    agg = aggregate(data.runs, ["reward_gold", "kl_true"]).set_index("regime")
    assert agg.loc["full", "n_runs"] == 3 and agg.loc["int8", "n_runs"] == 3  # the failed int8 run is not data
    assert agg.loc["full", "reward_gold_mean"] == pytest.approx(2.0)
    assert agg.loc["full", "reward_gold_hi"] == pytest.approx(2.0 + 4.302652729911275 / math.sqrt(3))
    assert agg.loc["int8", "seeds"] == "0,1,2"

    cmp = paired_vs_baseline(data.runs, "reward_gold").set_index("regime")
    row = cmp.loc["int8"]  # differences 1, 2, 2: mean 5/3, sd 1/sqrt(3): t = 5, df = 2
    assert row["n_pairs"] == 3
    assert row["diff_mean"] == pytest.approx(5 / 3)
    assert row["t"] == pytest.approx(5.0)
    assert row["p"] == pytest.approx(0.037749551350623, rel=1e-6)
    assert row["d_z"] == pytest.approx((5 / 3) / (1 / math.sqrt(3)))
    assert row["note"] == "differs"


def test_identical_and_unpaired_regimes_are_not_tested():
    data = from_recorded(FIXTURE)
    runs = data.runs.copy()
    same = runs[runs["regime"] == "full"].assign(regime="snapshot")
    import pandas as pd

    cmp = paired_vs_baseline(pd.concat([runs, same]), "kl_true").set_index("regime")
    assert cmp.loc["snapshot", "note"] == "identical to the baseline in every seed"
    assert math.isnan(cmp.loc["snapshot", "p"])
    lone = runs[(runs["regime"] == "int8") & (runs["seed"] == 0)]
    cmp = paired_vs_baseline(pd.concat([runs[runs["regime"] == "full"], lone]), "kl_true").set_index("regime")
    assert cmp.loc["int8", "note"] == "n=1 paired seeds: no test"


def test_a_metric_the_schema_calls_signed_never_gets_an_interval_for_positive_quantities():
    """kl_penalty_err_mean (nats per token, a signed error) once got a log-scale interval: [1.6e-15, 12639]."""
    from ablate.tracking import schema
    from analysis.stats import is_positive

    signed = [m.key for m in schema.summary_metrics() if "signed" in m.meaning or "can be negative" in m.meaning]
    assert {"kl_true_k1", "kl_penalty_err_mean", "margin_err_mean"} <= set(signed)
    assert [k for k in signed if is_positive(k) or is_positive(f"{k}_step0")] == []


def _infinite_at_step0() -> pd.DataFrame:
    """Two regimes over two seeds; topk's stand-in divergence infinite at step 0 in seed 0 (its reference gave a
    token the policy had no mass), as the drift report's first topk run."""
    rows = [
        {
            "status": "finished",
            "condition": "all runs",
            "regime": r,
            "algo": "grpo",
            "seed": s,
            "kl_true": kl,
            "kl_abs_err_step0": e0,
            "kl_abs_err": e1,
        }
        for r, s, kl, e0, e1 in (
            ("full", 0, 12.0, 0.0, 0.0),
            ("full", 1, 14.0, 0.0, 0.0),
            ("topk", 0, 23.1, math.inf, 19.1),
            ("topk", 1, 21.0, 22.1, 8.2),
        )
    ]
    return pd.DataFrame(rows)


def test_a_seed_whose_value_is_infinite_makes_the_mean_infinite_and_is_counted():
    """Not the finite seeds' mean (22.1 over 'n = 2' would hide the infinity): +inf, every seed counted, no
    interval, and how many seeds were infinite."""
    agg = aggregate(_infinite_at_step0(), ["kl_abs_err_step0", "kl_abs_err"]).set_index("regime")
    row = agg.loc["topk"]
    assert row["kl_abs_err_step0_mean"] == math.inf and row["kl_abs_err_step0_n"] == 2
    assert math.isnan(row["kl_abs_err_step0_lo"]) and math.isnan(row["kl_abs_err_step0_hi"])
    assert row["kl_abs_err_step0_inf"] == 1 and agg.loc["full", "kl_abs_err_step0_inf"] == 0
    assert row["kl_abs_err_step0_method"] == "1 of 2 seeds +inf: the mean is +inf, no interval"
    assert row["kl_abs_err_mean"] == pytest.approx(math.sqrt(19.1 * 8.2))  # the end: finite, as before
    assert "kl_abs_err_inf" not in agg  # the count only where a seed was infinite: other reports keep their columns
    mixed = aggregate(_infinite_at_step0().replace({22.1: -math.inf}), ["kl_abs_err_step0"]).set_index("regime")
    assert math.isnan(mixed.loc["topk", "kl_abs_err_step0_mean"]) and mixed.loc["topk", "kl_abs_err_step0_inf"] == 2
