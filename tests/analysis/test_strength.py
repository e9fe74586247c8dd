"""The report's beta section (analysis/strength.py): a stand-in run at several betas (``--fold algo.beta``), its end
point against the baseline at the common beta, side by side by beta, with the null control and no reference for
scale; on run folders written as runs write them. No model runs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from ablate.tracking.run_dir import SUMMARY_KEYS, RunFolder
from analysis import overoptimisation as oo
from analysis import strength
from analysis.__main__ import main
from analysis.load import base_regime, load_runs

STEPS = (0, 20, 40)
#: each run's end true KL: (regime, beta) -> per seed; full at 0.1 is the baseline
END_KL = {
    ("full", 0.1): (1.0, 2.0),
    ("placebo", 0.1): (1.1, 1.8),
    ("none", 0.1): (8.0, 9.0),
    ("snapshot", 0.1): (4.0, 6.0),
    ("snapshot", 1.0): (1.5, 2.0),
}


def _write(root, regime: str, beta: float, seed: int, lr: float = 1e-5) -> None:
    end = END_KL[(regime, beta)][seed]
    folder = RunFolder(root / f"ref={regime},algo.beta={beta},algo.learning_rate={lr},seed={seed}")
    algo = {"name": "grpo", "beta": beta, "learning_rate": lr}
    folder.write_config({"ref": {"name": regime}, "algo": algo, "model": {"name": "tiny"}, "seed": seed})
    s = {k: 0.5 for k in SUMMARY_KEYS}
    s.update(status="finished", reason="", steps=40, regime=regime, algo="grpo", model="tiny", seed=seed)
    s["kl_coef_final"] = 0.0 if regime == "none" else beta  # GRPO without a reference has no KL term
    folder.write_summary(s)
    for i, step in enumerate(STEPS):
        folder.log_metrics(
            step,
            {
                "kl/true": end * i / 2,
                "eval/reward_delta": 0.1 * i - (0.05 * end if i == 2 else 0.0),
                "eval/degenerate_rate": 0.75 if regime == "none" and i == 2 else 0.0,
            },
        )


@pytest.fixture
def sweep(tmp_path):
    for (regime, beta), kls in END_KL.items():
        for seed in range(len(kls)):
            _write(tmp_path / "sweep", regime, beta, seed)
    return tmp_path / "sweep"


def _table(sweep, out):
    runs = load_runs(sweep, fold=["algo.beta"])
    out.mkdir(parents=True, exist_ok=True)
    oo.section(runs.curves, out)
    return runs.runs, pd.read_csv(out / "overoptimisation.csv")


def test_the_stand_ins_rows_are_the_over_optimisation_tables_by_beta(sweep, tmp_path):
    runs, table = _table(sweep, tmp_path / "out")
    f = strength.frame(runs, table)
    assert list(zip(f["regime"], f["beta"])) == [("snapshot", 0.1), ("snapshot(algo.beta=1.0)", 1.0)]
    assert set(f["stand_in"]) == {"snapshot"}  # full (the baseline), placebo and none are not stand-ins here
    at_1 = f.set_index("beta").loc[1.0]
    ratios = np.log([1.5 / 1.0, 2.0 / 2.0])  # against full at 0.1, seed by seed
    assert at_1["end_kl_ratio"] == pytest.approx(math.exp(ratios.mean()))
    row = table.set_index("regime").loc["snapshot(algo.beta=1.0)"]
    for col in ("end_kl_ratio", "end_kl_ratio_lo", "end_gold_difference_hi", "collapsed"):
        assert at_1[col] == row[col]  # the table's own numbers, nothing recomputed


def test_no_section_where_no_stand_in_ran_at_two_betas(sweep, tmp_path):
    for seed in range(2):  # snapshot at 1 only: compared with full in the over-optimisation table, but no line to draw
        for f in sweep.glob(f"ref=snapshot,algo.beta=0.1,*,seed={seed}"):
            for p in f.iterdir():
                p.unlink()
            f.rmdir()
    runs, table = _table(sweep, tmp_path / "out")
    assert "snapshot(algo.beta=1.0)" in set(table["regime"])
    assert strength.frame(runs, table).empty
    assert strength.section(runs, table, tmp_path / "out") == ([], {})


def test_the_report_has_the_section_and_its_figure_and_drops_them_without_beta_runs(sweep, tmp_path):
    out = tmp_path / "report"
    assert main(["report", str(sweep), "--out", str(out), "--title", "beta", "--fold", "algo.beta"]) == 0
    text = (out / "report.md").read_text()
    section = text.split("## Beta: does a larger beta hold the stand-in?")[1].split("\n## ")[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| `")]
    assert [r.split(" | ")[:3] for r in rows] == [
        ["| `snapshot`", "0.1", "2"],
        ["| `snapshot`", "1", "2"],
        ["| `placebo`", "0.1", "2"],
        ["| `none`", "unused", "2"],  # GRPO without a reference: its beta is not a strength
    ]
    assert rows[-1].endswith("| 2 of 2 |")  # none collapsed in both seeds (3 of 4 responses degenerate at the end)
    assert "`full` at beta 0.1" in section
    png = out / "figures" / "strength.png"
    assert png.stat().st_size > 10_000 and "](figures/strength.png)" in text
    assert "*Figure (strength).*" in text
    for f in sweep.glob("ref=snapshot,algo.beta=1.0,*"):  # the beta runs gone: no section, the stale figure removed
        for p in f.iterdir():
            p.unlink()
        f.rmdir()
    assert main(["report", str(sweep), "--out", str(out), "--title", "beta", "--fold", "algo.beta"]) == 0
    assert "## Beta: does a larger beta" not in (out / "report.md").read_text() and not png.exists()


def test_each_condition_gets_its_table_and_figure_in_natural_order(sweep, tmp_path):
    """Runs at a second learning rate are another condition: each has its stand-in table under its own heading and
    its own figure, named and numbered as the report's training figures (conditions in natural order: 3e-06 before
    1e-05, which text order would reverse)."""
    for (regime, beta), kls in END_KL.items():
        for seed in range(len(kls)):
            _write(sweep, regime, beta, seed, lr=3e-6)
    out = tmp_path / "report"
    assert main(["report", str(sweep), "--out", str(out), "--title", "beta", "--fold", "algo.beta"]) == 0
    text = (out / "report.md").read_text()
    section = text.split("## Beta: does a larger beta hold the stand-in?")[1].split("\n## ")[0]
    heads = [ln for ln in section.splitlines() if ln.startswith("### ")]
    conds = ["algo.learning_rate=3e-06", "algo.learning_rate=1e-05"]
    assert heads == [f"### {c}: `full` at beta 0.1" for c in conds]
    for i, cond in enumerate(conds, 1):
        assert (out / "figures" / f"strength_{i}.png").stat().st_size > 10_000
        assert f"](figures/strength_{i}.png)\n\n*Figure (strength, {cond}).* {strength.CAPTION}" in text
        assert (out / "figures" / f"training_{i}.png").exists()  # the same condition's number
    assert not (out / "figures" / "strength.png").exists()


def test_a_stand_in_with_its_own_settings_is_one_line_across_betas():
    """``ema(alpha=0.1)`` at 0.1 and 1 is one stand-in; ``ema(alpha=0.3)``, at one beta only, is not in the section;
    the references and the baseline are not stand-ins; ``none``'s unused beta is no beta."""
    labels = ["full", "ema(alpha=0.1, algo.beta=1.0)", "ema(alpha=0.1)", "ema(alpha=0.3)", "placebo", "none"]
    runs = pd.DataFrame(
        {
            "condition": "all runs",
            "regime": labels,
            "ref_name": [base_regime(x) for x in labels],
            "unfolded": [x.replace(", algo.beta=1.0", "") for x in labels],
            "algo": "grpo",
            "cfg.algo.beta": [0.1, 1.0, 0.1, 0.1, 0.1, 0.1],
            "kl_coef_final": [0.1, 1.0, 0.1, 0.1, 0.1, 0.0],
        }
    )
    cols = {f"{c}{e}": 1.0 for c, _ in strength.SHOWN for e in ("", "_lo", "_hi")}
    table = pd.DataFrame([{"condition": "all runs", "regime": x, "n_paired": 2, "collapsed": 0, "n_seeds": 2, **cols}
                          for x in labels if x != "full"])  # fmt: skip
    f = strength.frame(runs, table)
    assert list(zip(f["stand_in"], f["beta"])) == [("ema(alpha=0.1)", 0.1), ("ema(alpha=0.1)", 1.0)]
    assert strength._betas(runs).isna().tolist() == [False] * 5 + [True]
    only_none = table[table["regime"] == "none"]  # nothing left once its unused beta is dropped: no error
    assert strength.frame(runs, only_none).empty


def test_a_beta_with_fewer_seeds_has_no_interval_and_the_section_says_so(sweep, tmp_path):
    """snapshot at beta 1 in one seed only: its row is the estimate alone (no interval over seeds), and the section
    says that its betas rest on different seeds."""
    for p in (f := next(sweep.glob("ref=snapshot,algo.beta=1.0,*,seed=1"))).iterdir():
        p.unlink()
    f.rmdir()
    out = tmp_path / "report"
    assert main(["report", str(sweep), "--out", str(out), "--title", "beta", "--fold", "algo.beta"]) == 0
    section = (out / "report.md").read_text().split("## Beta: does a larger beta hold the stand-in?")[1]
    section = section.split("\n## ")[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| `snapshot` |")]
    assert [r.split(" | ")[1:3] for r in rows] == [["0.1", "2"], ["1", "1"]]
    assert "[" in rows[0] and "[" not in rows[1]  # one seed: the estimate alone
    assert "The betas of `snapshot` do not all have the same seeds yet" in section
