"""The p-values beside each verdict: each method's p agrees with its own interval, the union's is the largest,
Holm's adjustment is statsmodels' and turns a lone weak *different* among many tests into *inconclusive*."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis import pvalues
from analysis.equivalence import compare
from analysis.load import load_runs
from analysis.report_config import ReportConfig
from analysis.samples import prompt_frame
from analysis.stats import t_interval
from tests.analysis.synthetic import samples, write_run
from tests.conftest import REPO


def test_holm_known_numbers():
    assert pvalues.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    adj = pvalues.holm([float("nan"), 0.2])
    assert math.isnan(adj[0]) and adj[1] == pytest.approx(0.2)


@pytest.mark.parametrize("seed", range(20))
def test_t_test_rejects_exactly_where_its_intervals_do(seed):
    """p_diff < 0.05 iff the 95% t interval excludes 0; p_tost < 0.05 iff the 90% interval is inside the margin."""
    rng = np.random.default_rng(seed)
    x = rng.normal(rng.uniform(-0.1, 0.1), rng.uniform(0.01, 0.1), int(rng.integers(3, 9)))
    margin = float(rng.uniform(0.02, 0.12))
    t = pvalues.TTest(float(x.mean()), float(x.std(ddof=1)) / math.sqrt(len(x)), len(x) - 1)
    p_diff, p_tost = t.p(margin)
    outer, inner = t_interval(x, 0.95), t_interval(x, 0.90)
    assert (p_diff < 0.05) == (outer.lo > 0 or outer.hi < 0)
    assert (p_tost < 0.05) == (-margin < inner.lo and inner.hi < margin)
    assert p_diff == pytest.approx(stats.ttest_1samp(x, 0).pvalue)


def test_bootstrap_p_is_the_share_of_replicates_beyond_each_bound():
    reps = np.arange(-99, 900) / 1000.0  # 999: 100 at or below 0, none at or below -0.1, 800 at or above 0.1
    p_diff, p_tost = pvalues.BootTest(reps).p(0.1)
    assert p_diff == pytest.approx(2 * 100 / 999)
    assert p_tost == pytest.approx(800 / 999)
    assert pvalues.BootTest(reps + 1).p(0.1)[0] == 0  # none at or below 0: below 1 / n_boot
    assert pvalues.BootTest(np.full(10, math.nan)).p(0.1) == (pytest.approx(math.nan, nan_ok=True),) * 2


def test_union_p_is_the_largest_of_its_methods():
    a, b = pvalues.TTest(0.05, 0.01, 4), pvalues.TTest(0.05, 0.03, 4)
    assert pvalues.union([a, None, b], 0.1) == (max(a.p(0.1)[0], b.p(0.1)[0]), max(a.p(0.1)[1], b.p(0.1)[1]))
    assert all(math.isnan(v) for v in pvalues.union([None], 0.1))
    assert math.isnan(pvalues.union([a], math.nan)[1])


def test_holm_turns_a_weak_difference_among_many_tests_inconclusive(tmp_path):
    """One regime shifted by a little (0.04, 0.06, 0.035 by seed: seed-level t 5.9 on 2 degrees of freedom, p 0.028:
    different on its own), eight regimes
    in all (32 tests): after Holm's adjustment it is inconclusive, with a note; the strong one stays different."""
    shifts = {"int8": 0.3, "nf4": (0.04, 0.06, 0.035), **{f"r{i}": 0.0 for i in range(6)}}
    for seed in range(3):
        write_run(tmp_path, "full", seed, samples(seed, 12))
        for regime, shift in shifts.items():
            s = shift[seed] if isinstance(shift, tuple) else shift
            write_run(tmp_path, regime, seed, samples(seed, 12, shift=s))
    runs = load_runs(tmp_path).runs
    none = compare(runs, prompt_frame(runs), ReportConfig(n_boot=1000, multiplicity="none"))
    holm = compare(runs, prompt_frame(runs), ReportConfig(n_boot=1000))
    row = dict(regime="nf4", metric="reward_delta")
    weak = none.set_index(["regime", "metric"]).loc[tuple(row.values())]
    assert weak["verdict"] == "different" and 0.0125 < weak["p_diff"] < 0.05
    adjusted = holm.set_index(["regime", "metric"]).loc[tuple(row.values())]
    assert adjusted["p_holm"] >= 0.05 and adjusted["verdict"] == "inconclusive"
    assert "different before Holm's adjustment over" in adjusted["note"]
    assert holm.set_index(["regime", "metric"]).loc[("int8", "reward_delta"), "verdict"] == "different"
    assert (holm["p_holm"].dropna() >= holm["p_diff"].dropna()).all()
    assert none["p_holm"].tolist() == pytest.approx(holm["p_holm"].tolist(), nan_ok=True)


@pytest.mark.parametrize("name", ["dpo_regimes", "dpo_beta", "grpo_kl"])
def test_the_committed_verdicts_follow_holms_rule(name):
    """docs/statistics.md: the committed reports are read under Holm's rule (no --multiplicity none), so a row is
    *different* exactly where its adjusted p is below 0.05, and a nominal difference that does not survive the
    adjustment is *inconclusive*."""
    table = pd.read_csv(REPO / "reports" / name / "equivalence.csv")
    assert "--multiplicity none" not in (REPO / "reports" / name / "report.md").read_text()
    nominal = table[(table["p_diff"] < 0.05) & (table["verdict"] != "equivalent")]
    assert len(nominal) and set(nominal["verdict"]) <= {"different", "inconclusive"}
    assert ((nominal["verdict"] == "different") == (nominal["p_holm"] < 0.05)).all()
