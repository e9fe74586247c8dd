"""Committed reports regenerate byte for byte from the run data committed beside them (``reports/<name>/runs/``),
with the command their own Reproduce section gives. No model runs."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pandas as pd
import pytest

from analysis.__main__ import main
from tests.conftest import REPO

REPORTS = [d.name for d in sorted((REPO / "reports").iterdir()) if (d / "runs").is_dir()]


@pytest.mark.slow
@pytest.mark.parametrize("name", REPORTS)
def test_a_committed_report_regenerates_from_its_runs(name, tmp_path, monkeypatch):
    committed = REPO / "reports" / name
    text = (committed / "report.md").read_text()
    # the report's own command: the last analysis line of its Reproduce block (an archive step may come before)
    line = [ln for ln in text.split("```")[1].splitlines() if ln.startswith("python -m analysis ")][-1]
    argv = shlex.split(line)[3:]
    copy = tmp_path / "reports" / name
    shutil.copytree(committed / "runs", copy / "runs")
    for arg in argv:  # run data of another report it reads too (the beta report reads report_dpo's beta-0.1 jobs)
        if (REPO / arg).is_dir() and arg.startswith("reports/") and not (tmp_path / arg).exists():
            shutil.copytree(REPO / arg, tmp_path / arg)
    for reading in ("notes.md", "headline.md"):  # the report's own text, filled from its tables
        if (committed / reading).is_file():
            shutil.copy(committed / reading, copy / reading)
    if "--bench" in argv:  # the bench's CSV and the .md beside it (its code), where the command names them
        csv = argv[argv.index("--bench") + 1]
        for f in (csv, str(Path(csv).with_suffix(".md"))):
            (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / f, tmp_path / f)
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 0
    made = sorted(p.name for p in copy.iterdir() if p.is_file() and p.suffix in (".md", ".csv", ".tex"))
    assert "report.md" in made
    # a figure the runs did not measure is left out of a sentence, not printed as "n/a" (runs evaluated only at the end)
    assert "n/a nats at step 0" not in (copy / "report.md").read_text()
    for f in made:
        assert (copy / f).read_bytes() == (committed / f).read_bytes(), f"reports/{name}/{f} differs when regenerated"


def test_there_is_a_committed_report_with_runs():
    assert "calibration" in REPORTS


def test_the_drift_beta_stage_runs_the_stand_ins_its_declared_rule_selects():
    """sweeps/report_drift.yaml's beta stage (amended 2026-12-06, before any beta job): the stand-ins whose end true
    KL ratio to full's lies above the null control's whole interval, at most three, largest first, once every
    regime has its three seeds. `none` is no stand-in (no reference: beta does nothing to it); the placebo is the
    control. What was queued (sweeps/report_drift.yaml's record) must be what the committed table selects, and any
    beta run in the report one of them."""
    oo = pd.read_csv(REPO / "reports/drift/overoptimisation.csv")
    base = oo[~oo.regime.str.contains("(", regex=False)]
    assert (base.n_seeds >= 3).all(), "the rule applies once every regime has its three seeds"
    ceiling = base.loc[base.regime == "placebo", "end_kl_ratio_hi"].item()
    above = base[~base.regime.isin(["full", "placebo", "none"]) & (base.end_kl_ratio > ceiling)]
    selected = above.sort_values("end_kl_ratio", ascending=False).regime.head(3).tolist()
    assert selected == ["snapshot", "ema", "distilled"]
    folded = oo.regime[oo.regime.str.contains("(algo.beta=", regex=False)]
    assert set(folded.str.split("(").str[0]) <= set(selected)
