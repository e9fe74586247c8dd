"""The independent recomputation (analysis/recheck.py): every committed report survives it, and it catches a
summary figure, a difference or an interval that does not follow from the samples. No model runs."""

from __future__ import annotations

import json
import shlex
import shutil

import pandas as pd
import pytest

from analysis import pvalues
from analysis.__main__ import main
from analysis.load import load_runs
from analysis.recheck import PER_PROMPT, Findings, recheck, recheck_primary, recheck_report
from tests.analysis.synthetic import samples, write_run
from tests.conftest import REPO

DPO = REPO / "reports" / "dpo_regimes"
FULL, INT8 = "logger=none,ref=full,seed=0", "logger=none,ref=int8,seed=0"
JOBS = "report_dpo*/logger=none,ref=*,seed=*"  # seeds 0-3 in runs/report_dpo, the re-runs in report_dpo_s4 ... _b6
SEEDS = len(list((DPO / "runs").glob(JOBS.replace("ref=*", "ref=full"))))


def _report_args(name: str) -> tuple[list[str], dict]:
    """The folders and options of a committed report's own `python -m analysis report` command."""
    text = (REPO / "reports" / name / "report.md").read_text()
    line = [ln for ln in text.split("```")[1].splitlines() if ln.startswith("python -m analysis report ")][-1]
    argv = shlex.split(line)[4:]
    folders = argv[: next(i for i, a in enumerate(argv) if a.startswith("--"))]
    opts = {k: argv[argv.index(f"--{k}") + 1] for k in ("baseline", "regimes", "seeds", "fold") if f"--{k}" in argv}
    return folders, opts


def _seeds(opts: dict) -> list[int] | None:
    """A report command's ``--seeds``, parsed; None where it reads every seed."""
    return [int(x) for x in opts["seeds"].split(",")] if "seeds" in opts else None


REPORTS = [  # the reports `python -m analysis report` made (calibration's is `analysis calibration`'s)
    d.name
    for d in sorted((REPO / "reports").iterdir())
    if (d / "runs").is_dir() and any((d / f).is_file() for f in ("equivalence.csv", "overoptimisation.csv"))
]


@pytest.mark.slow
@pytest.mark.parametrize("name", REPORTS)
def test_every_committed_report_agrees_with_its_samples(name, monkeypatch):
    folders, opts = _report_args(name)
    monkeypatch.chdir(REPO)
    regimes = opts["regimes"].split(",") if "regimes" in opts else None
    seeds = _seeds(opts)
    report = REPO / "reports" / name
    # the CLI's 4000 resamples: with three seeds a two-way bootstrap's ends move by more than the tolerance at 1000
    fold = opts["fold"].split(",") if "fold" in opts else None
    found = recheck(folders, report, opts.get("baseline", "full"), regimes, seeds=seeds, fold=fold)
    assert found.errors == []
    names = ("equivalence.csv", "conditions.csv", "primary.csv")
    tables = [pd.read_csv(report / t) for t in names if (report / t).is_file()]
    boot = sum(int(t["method"].str.contains("bootstrap").sum()) for t in tables)  # hierarchical or two-way
    for extra in ("sensitivity.csv", "overoptimisation.csv"):  # the beta report's rows, a drift report's: each too
        if (report / extra).is_file():
            boot += len(pd.read_csv(report / extra))
    assert found.rows == boot >= 1  # every bootstrap row of the three tables was checked
    assert found.runs == pd.read_csv(report / "summary.csv")["n_runs"].sum()  # and every run the report counts


@pytest.fixture
def two_runs(tmp_path):
    """full and int8 (every seed) of the committed DPO report, and its equivalence rows for int8 alone (a family of
    their own: their Holm-adjusted p-values adjusted over those rows)."""
    sweep = tmp_path / "sweep"
    for job in (DPO / "runs").glob(JOBS):
        if job.name.split(",")[1] in ("ref=full", "ref=int8"):
            shutil.copytree(job, sweep / job.name)
    report = tmp_path / "report"
    report.mkdir()
    table = pd.read_csv(DPO / "equivalence.csv")
    table = table[table["regime"] == "int8"].copy()
    table["p_holm"] = pvalues.holm(table["p_diff"])
    table.to_csv(report / "equivalence.csv", index=False)
    return sweep, report


def test_the_copied_runs_agree(two_runs):
    found = recheck([two_runs[0]], two_runs[1], n_boot=1000)
    assert found.errors == [] and found.runs == 2 * SEEDS and found.rows == 4


def test_a_summary_figure_that_does_not_follow_from_the_samples_is_caught(two_runs):
    sweep, _ = two_runs
    f = sweep / INT8 / "summary.json"
    summary = json.loads(f.read_text())
    summary["kl_true"] *= 1 + 1e-6
    f.write_text(json.dumps(summary))
    found = recheck([sweep], None)
    assert len(found.errors) == 1 and found.errors[0].startswith(f"{INT8}: kl_true: reported")


@pytest.mark.parametrize("column,change", [("diff", 1e-6), ("lo", -0.5), ("hi", 0.5)])
def test_a_difference_or_interval_that_the_samples_do_not_give_is_caught(two_runs, column, change):
    sweep, report = two_runs
    table = pd.read_csv(report / "equivalence.csv")
    width = table.loc[0, "hi"] - table.loc[0, "lo"]
    table.loc[0, column] += change * (abs(table.loc[0, "diff"]) if column == "diff" else width)
    table.to_csv(report / "equivalence.csv", index=False)
    found = recheck([sweep], report, n_boot=1000)
    assert len(found.errors) == 1 and f"int8 - full: {table.loc[0, 'metric']}" in found.errors[0]


def test_a_comparison_report_without_its_equivalence_table_is_caught(two_runs):
    """A report of no comparisons yet (a partial calibration) is rechecked without equivalence.csv; one whose runs
    compare a regime with the baseline must have it."""
    sweep, report = two_runs
    (report / "equivalence.csv").unlink()
    found = recheck([sweep], report, n_boot=1000)
    assert found.errors == ["no equivalence.csv, though the runs compare int8 with full"]


@pytest.mark.parametrize("column", ["p_diff", "p_tost", "p_holm"])
def test_a_p_value_that_its_own_tests_do_not_give_is_caught(two_runs, column):
    """A p below its row's t test (the union's p is the largest of its methods'), or a Holm adjustment that is not
    the table's."""
    sweep, report = two_runs
    table = pd.read_csv(report / "equivalence.csv")
    table.loc[0, column] = 0.0 if column != "p_holm" else table.loc[0, "p_holm"] / 2
    table.to_csv(report / "equivalence.csv", index=False)
    found = recheck([sweep], report, n_boot=1000)
    assert any(f": {column}" in e for e in found.errors), found.errors


def test_the_command_line_exits_1_on_a_disagreement_and_2_on_bad_input(two_runs, capsys):
    sweep, report = two_runs
    assert main(["recheck", str(sweep), "--report", str(report), "--boot", "500"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith(f"recheck: {2 * SEEDS} runs' summaries and 4 report rows")
    f = sweep / FULL / "summary.json"
    f.write_text(f.read_text().replace('"length": ', '"length": 1 + '))  # not JSON: the run is not finished
    assert main(["recheck", str(sweep), "--report", str(report), "--boot", "500"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    bad = [ln for ln in out if ln.startswith("DISAGREES  ")]  # int8's seed 0 has no full to pair with
    assert {m for m in PER_PROMPT if any(f"int8 - full: {m}:" in ln for ln in bad)} == set(PER_PROMPT)
    assert "; 1 runs not finished or without samples, not checked" in out[-1]
    assert main(["recheck", str(sweep), "--report", str(sweep)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"analysis: error: no report (report.md or equivalence.csv) in {sweep}"
    ]


def test_a_condition_difference_that_the_samples_do_not_give_is_caught(tmp_path):
    """conditions.csv: `full` under each condition against the reference condition (GRPO: k2, k3 against k1)."""
    committed = REPO / "reports" / "grpo_kl"
    shutil.copytree(committed / "runs", tmp_path / "runs")
    for f in ("equivalence.csv", "report.md"):  # report.md: its rules (multiplicity)
        shutil.copy(committed / f, tmp_path / f)
    table = pd.read_csv(committed / "conditions.csv")
    row = table.index[(table["regime"] == "algo.kl_estimator=k2") & (table["metric"] == "kl_true")][0]
    table.loc[row, "diff"] += 1e-6
    table.to_csv(tmp_path / "conditions.csv", index=False)
    opts = _report_args("grpo_kl")[1]  # its seeds: the report may read fewer than its archive holds
    seeds = _seeds(opts)
    found = recheck(sorted((tmp_path / "runs").iterdir()), tmp_path, seeds=seeds, n_boot=300, itol=1.0)
    assert found.errors == [found.errors[0]]
    assert found.errors[0].startswith("full: algo.kl_estimator=k2 - algo.kl_estimator=k1: kl_true: reported")


@pytest.mark.slow
@pytest.mark.parametrize(
    "design, column",
    [("nested", c) for c in (None, "seed_t_lo", "boot_hi", "lo", "seed_diffs")]
    + [("crossed", c) for c in (None, "crossed_t_hi", "seed_t_lo", "boot_hi", "lo")],
)
def test_several_seeds_the_union_and_each_of_its_parts_are_rechecked(tmp_path, design, column):
    """Three seeds whose int8 - full differences disagree (shifts 0, 0.5, 1, against prompt noise of about 0.1 in
    a seed's mean: a t interval is the wider), on the 24 prompts every seed shares, under each design:
    the report's rows agree with the recomputation, and a changed end of a t interval, of the
    bootstrap's, of the union the verdict used or of a seed's own difference is caught."""
    sweep, report = tmp_path / "sweep", tmp_path / "report"
    for seed in range(3):
        write_run(sweep, "full", seed, samples(seed, 24))
        write_run(sweep, "int8", seed, samples(seed + 10, 24, shift=0.5 * seed))  # other draws: noisy differences
    assert main(["report", str(sweep), "--out", str(report), "--boot", "500", "--design", design]) == 0
    table = pd.read_csv(report / "equivalence.csv")
    row = table.index[table["metric"] == "reward_delta"][0]
    method = "two-way bootstrap, two-way t and seed-level t" if design == "crossed" else "hierarchical bootstrap and"
    assert table.loc[row, "method"].startswith(f"union of {method}")
    t_lo = table.loc[row, "seed_t_lo"] if design == "nested" else min(table.loc[row, ["seed_t_lo", "crossed_t_lo"]])
    assert table.loc[row, "lo"] == t_lo < table.loc[row, "boot_lo"]
    assert [float(x.split(":")[1]) for x in table.loc[row, "seed_diffs"].split(";")] == pytest.approx(
        [0.0, 0.5, 1.0], abs=0.3
    )
    if column == "seed_diffs":  # seed 2's difference
        table.loc[row, column] = table.loc[row, column].replace(";2:", ";2:1")
        table.to_csv(report / "equivalence.csv", index=False)
    elif column is not None:
        table.loc[row, column] -= 0.5 * (table.loc[row, "hi"] - table.loc[row, "lo"])
        table.to_csv(report / "equivalence.csv", index=False)
    found = Findings()
    opts = {"rtol": 1e-9, "itol": 0.1, "n_boot": 1000, "seed": 1, "alpha": 0.05}
    recheck_report(load_runs(sweep).runs, report, "full", found, opts)
    assert found.rows == int(table["method"].str.contains("bootstrap").sum()) >= 3
    if column is None:
        assert found.errors == []
    else:
        assert len(found.errors) == 1 and "int8 - full: reward_delta" in found.errors[0], found.errors


@pytest.mark.slow
@pytest.mark.parametrize("column, change", [(None, 0), ("estimate", 1e-6), ("lo", -0.5), ("hi", 0.5)])
def test_a_regimes_own_interval_is_rechecked(tmp_path, column, change):
    """primary.csv: each regime's own value with its interval (three seeds: the union with the seed-level t
    interval, on the log scale for the true KL). A changed estimate or interval end is caught."""
    sweep, report = tmp_path / "sweep", tmp_path / "report"
    for seed in range(3):
        write_run(sweep, "full", seed, samples(seed, 24, shift=0.3 * seed, kl=1.0 + seed))
    assert main(["report", str(sweep), "--out", str(report), "--boot", "500"]) == 0
    table = pd.read_csv(report / "primary.csv")
    kl = table.index[table["metric"] == "kl_true"][0]
    assert table.loc[kl, "method"].startswith("union of hierarchical bootstrap and seed-level t (3 seeds")
    if column is not None:
        table.loc[kl, column] += change * (table.loc[kl, "hi"] - table.loc[kl, "lo"])
        table.to_csv(report / "primary.csv", index=False)
    found = Findings()
    recheck_primary(
        load_runs(sweep).runs, report, found, {"rtol": 1e-9, "itol": 0.1, "n_boot": 1000, "seed": 1, "alpha": 0.05}
    )
    assert found.rows == 4
    if column is None:
        assert found.errors == []
    else:
        assert len(found.errors) == 1 and found.errors[0].startswith("all runs: full: kl_true:"), found.errors


def test_a_number_typed_in_the_notes_that_no_table_holds_is_caught(two_runs):
    """Numbers in the prose must be cells of the report's tables or of its runs, at the digits given; placeholders
    and code spans are not prose."""
    sweep, report = two_runs
    row = pd.read_csv(report / "equivalence.csv").iloc[0]
    true = f"{row['diff']:.3g}"
    (report / "notes.md").write_text(
        f"int8 moved by {true} ({100 * row['margin']:.0f}% margin); {{{{eq:int8:kl_true:span}}}}; `lr 0.7777`.\n"
    )
    assert recheck([sweep], report, n_boot=1000).errors == []
    (report / "notes.md").write_text(f"int8 moved by {true}, then by 0.7777 nats.\n")
    errors = recheck([sweep], report, n_boot=1000).errors
    assert errors == ["notes.md: the number 0.7777 is in no table of the report nor any run"]


def test_a_determinism_check_that_is_not_identical_is_caught(two_runs):
    sweep, report = two_runs
    table = pd.read_csv(report / "equivalence.csv")
    table.loc[0, "verdict"] = "determinism check"
    table.to_csv(report / "equivalence.csv", index=False)
    errors = recheck([sweep], report, n_boot=1000).errors
    assert len(errors) == 1 and "a determinism check in the report, but not identical" in errors[0]


@pytest.mark.parametrize("column,change", [("diff", 1e-6), ("lo", -0.5), ("seed_t_hi", 1e-6)])
def test_a_log_ratio_row_is_rechecked_from_both_runs_means(two_runs, tmp_path, column, change):
    """A report made under the default rule reads true KL and length as per-seed log ratios: the recheck
    recomputes them (estimate, seed-level t, a separate bootstrap of both means) and catches a changed cell."""
    from analysis.__main__ import main

    sweep, _ = two_runs
    out = tmp_path / "lr"
    assert main(["report", str(sweep), "--out", str(out), "--boot", "500"]) == 0
    assert recheck([sweep], out, n_boot=500).errors == []
    table = pd.read_csv(out / "equivalence.csv")
    i = table.index[(table["metric"] == "kl_true") & (table["regime"] == "int8")][0]
    assert table.loc[i, "scale"] == "log ratio"
    width = table.loc[i, "hi"] - table.loc[i, "lo"]
    table.loc[i, column] += change * (abs(table.loc[i, column]) if column != "lo" else width)
    table.to_csv(out / "equivalence.csv", index=False)
    errors = recheck([sweep], out, n_boot=500).errors
    assert len(errors) == 1 and "int8 - full: kl_true" in errors[0], errors


def test_the_bootstrap_loops_mean_is_numpy_s_to_the_last_bit():
    import numpy as np

    from analysis.recheck import _avg

    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 63, 64, 65, 200, 5000):
        for scale in (1e-3, 1.0, 1e6):
            x = rng.standard_normal(n) * scale
            assert _avg(x) == x.mean(), (n, scale)
