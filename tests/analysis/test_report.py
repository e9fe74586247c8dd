"""``python -m analysis report`` on a real tiny sweep: report, figures, CSV and LaTeX, failed jobs listed."""

import subprocess
import sys

import pandas as pd
import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_report_from_a_tiny_sweep(tiny_sweep, tmp_path):
    out = tmp_path / "report"
    res = subprocess.run(
        [sys.executable, "-m", "analysis", "report", str(tiny_sweep), "--out", str(out), "--title", "tiny"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "8 jobs, 2 not finished" in res.stdout
    text = (out / "report.md").read_text()
    assert text.startswith("# tiny")
    # reproducible: the sweep command, the analysis command, code, versions, hardware, seeds
    assert "python -m ablate -m " in text and f"python -m analysis report {tiny_sweep}" in text
    for needle in ("code the runs were made with: ", "torch 2.", "trl 1.", "hardware: cpu", "seeds 0, 1"):
        assert needle in text, needle
    # what DPO consumed (margin error, gradient cosine) in its own table; GRPO's penalty error is not measured here
    consumed = text.split("what training consumed from its reference")[1].split("## ")[0]
    assert "| margin err. sd |" in consumed and "| grad. cosine |" in consumed and "penalty" not in consumed
    assert "left out of the tables: penalty err., penalty err. sd." in text
    failed_rows = [ln for ln in text.splitlines() if ln.startswith("| failed |")]
    assert len(failed_rows) == 2  # listed, never dropped
    for fig in ("frontier", "kl_error", "pareto", "training", "drift"):
        png = out / "figures" / f"{fig}.png"
        assert png.stat().st_size > 10_000 and f"](figures/{fig}.png)" in text
    summary = pd.read_csv(out / "summary.csv")
    assert sorted(summary["regime"]) == ["full", "int8", "none"]
    assert (summary["n_runs"] == 2).all() and (summary["seeds"] == "0,1").all()
    assert {"kl_true_mean", "kl_true_lo", "kl_true_hi", "win_rate_n"} <= set(summary.columns)
    cmp = pd.read_csv(out / "comparisons.csv")
    assert set(cmp["regime"]) == {"int8", "none"} and (cmp["n_pairs"] == 2).all()
    tex = (out / "table.tex").read_text()
    assert r"\begin{tabular}" in tex and r"\bottomrule" in tex and tex.count(r"\\") >= 4


def test_report_on_a_missing_folder_is_one_line(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "analysis", "report", str(tmp_path / "nope"), "--out", str(tmp_path / "r")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2
    assert res.stderr.strip() == f"analysis: error: no such folder: {tmp_path / 'nope'}"


def test_report_with_no_finished_job_is_one_line(tmp_path):
    from tests.analysis.synthetic import write_run

    sweep = tmp_path / "sweep"
    write_run(sweep, "none", 0, status="unfinished")  # still running: a config, no summary
    write_run(sweep, "full", 0, status="failed", reason="diverged at step 3")
    res = subprocess.run(
        [sys.executable, "-m", "analysis", "report", str(sweep), "--out", str(tmp_path / "r")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr[-2000:]
    line = res.stderr.strip()
    assert line.startswith(f"analysis: error: no finished jobs below {sweep} yet (")
    assert "1 unfinished" in line and "1 failed" in line and not (tmp_path / "r").exists()
