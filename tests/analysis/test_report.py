"""``python -m analysis report`` on a real tiny sweep: report, figures, CSV and LaTeX, failed jobs listed."""

import math
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


def test_findings_say_how_many_seeds_were_infinite_at_step_0():
    """The drift report's topk: its divergence infinite at step 0 in one seed of two. The finding says +inf and in
    how many seeds, not the other seed's number as if it were the mean of both."""
    from analysis.report import cell, findings
    from analysis.stats import aggregate
    from tests.analysis.test_stats import _infinite_at_step0

    agg = aggregate(_infinite_at_step0(), ["kl_true", "kl_abs_err_step0", "kl_abs_err"])
    [line] = findings(agg, "full")
    assert "+inf nats at step 0 (in 1 of 2 seeds) and 12.5 [" in line and "22.1 nats" not in line
    assert line.endswith("n = 2 seeds).")
    assert cell(agg.set_index("regime").loc["topk"], "kl_abs_err_step0") == "+inf (1 of 2 seeds)"


def test_the_latex_table_gives_an_infinite_mean_its_sign_and_seed_count():
    """The end error infinite in topk's seed 0: LaTeX's +infinity with the count; -infinity likewise; seeds whose
    infinities disagree give an undefined sign (\\pm), never a number."""
    from analysis.report import latex_table
    from analysis.stats import aggregate
    from tests.analysis.test_stats import _infinite_at_step0

    runs = _infinite_at_step0().drop(columns="kl_abs_err").rename(columns={"kl_abs_err_step0": "kl_abs_err"})
    topk_row = lambda tex: next(line for line in tex.splitlines() if " & topk & " in line)  # noqa: E731
    assert r"$+\infty$ (1/2 seeds)" in topk_row(latex_table(aggregate(runs, ["kl_true", "kl_abs_err"]), "c"))
    runs.loc[runs.kl_abs_err == math.inf, "kl_abs_err"] = -math.inf
    assert r"$-\infty$ (1/2 seeds)" in topk_row(latex_table(aggregate(runs, ["kl_true", "kl_abs_err"]), "c"))
    runs.loc[(runs.regime == "topk") & (runs.seed == 1), "kl_abs_err"] = math.inf
    assert r"$\pm\infty$ (2/2 seeds)" in topk_row(latex_table(aggregate(runs, ["kl_true", "kl_abs_err"]), "c"))


def test_the_kl_error_figure_marks_an_infinite_seed_instead_of_averaging_it_away(tmp_path, monkeypatch):
    from analysis import figures
    from tests.analysis.test_stats import _infinite_at_step0

    runs = _infinite_at_step0()
    runs["kl_approx"] = runs["kl_true"] + runs["kl_abs_err"]
    drawn = {}
    monkeypatch.setattr(figures, "_save", lambda fig, path: drawn.setdefault("fig", fig) and path)
    figures.kl_error(runs, tmp_path / "kl_error.png")
    ax = drawn["fig"].axes[1]
    assert [t.get_text() for t in ax.texts] == ["+inf\n1 of 2\nseeds"]
    heights = sorted(round(b.get_height(), 3) for b in ax.patches)
    assert heights == [0.0, 0.0, 13.65, 22.1]  # the bars: the finite seeds (arithmetic means)
    assert ax.get_ylim()[1] > 22.1 * 3 and math.isfinite(ax.get_ylim()[1])
