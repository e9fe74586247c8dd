"""The over-optimisation section (analysis/overoptimisation.py): where each run's gold reward peaked against
sqrt(KL), Gao et al.'s form fitted, the collapse, and the report's section, on run folders written as runs write
them. No model runs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from ablate.tracking.run_dir import SUMMARY_KEYS, RunFolder
from analysis import overoptimisation as oo
from analysis.__main__ import main
from analysis.load import load_runs

ALPHA, BETA = 0.30, 0.20  # gold = d (alpha - beta ln d): peaks at d* = exp(alpha / beta - 1), KL* = d*^2
KLS = (0.0, 0.5, 2.0, 4.0, 8.0, 16.0)  # each evaluation's true KL (steps 0, 20, ..., 100)


def _gao(kl: float) -> float:
    d = math.sqrt(kl)
    return d * (ALPHA - BETA * math.log(d)) if d > 0 else 0.0


PROMPTS = 4
DEGENERATE = "so happy so happy so happy"
#: one varied response per prompt: no bigram shared, none repeated
FINE = (
    "A calm and lovely day.",
    "The film was warm and kind.",
    "Bright music, fine actors too.",
    "Quiet scenes reward patience.",
)
TEMPLATE = "In the film, the director's use of light"  # not degenerate: the same words for every prompt


def _degenerate(i: int, seed: int, over: bool) -> int:
    """How many of the step's responses are degenerate: from 2 of 4 (the collapse) at step 20 * (4 - seed)."""
    return max(0, min(PROMPTS, i + seed - 2)) if over else 0


def _write(root, regime: str, seed: int, over: bool) -> None:
    """One run, its samples and the metrics the evaluator would log from them: ``over``: ``none``'s collapse (gold
    along Gao's curve, scaled per seed; proxy climbing; degenerate responses from step 20 * (4 - seed)); else a gold
    gain that keeps rising and no degeneration."""
    folder = RunFolder(root / f"ref={regime},seed={seed}")
    folder.write_config({"ref": {"name": regime}, "algo": {"name": "grpo"}, "model": {"name": "tiny"}, "seed": seed})
    s = {k: 0.5 for k in SUMMARY_KEYS}
    s.update(status="finished", reason="", steps=100, regime=regime, algo="grpo", model="tiny", seed=seed)
    scale = 1.0 + 0.1 * seed
    rows = []
    for i, kl in enumerate(KLS):
        kl = kl * scale if over else kl / 8
        gold = _gao(kl) if over else 0.05 * math.sqrt(kl)
        proxy = 1.0 + (0.3 * i if over else 0.05 * i)
        bad = _degenerate(i, seed, over)
        at = [
            {
                "step": 20 * i,
                "prompt": f"review of film {p}",
                "sample": 0,
                "policy_response": DEGENERATE if p < bad else FINE[p],
                "policy_reward": 0.1 * p + gold + 0.01 * (p - 1.5),
                "sft_reward": 0.1 * p,
                "policy_proxy_reward": proxy + 0.02 * (p - 1.5),
                "kl_true": kl * (1 + 0.1 * (p - 1.5)),
            }
            for p in range(PROMPTS)
        ]
        rows += at
        mean = lambda key, at=at: sum(r[key] for r in at) / PROMPTS  # noqa: E731
        folder.log_metrics(
            20 * i,
            {
                "kl/true": mean("kl_true"),
                "eval/reward_delta": sum(r["policy_reward"] - r["sft_reward"] for r in at) / PROMPTS,
                "eval/reward_proxy": mean("policy_proxy_reward"),
                "eval/degenerate_rate": bad / PROMPTS,
                "eval/distinct_2": 0.9 - (0.1 * i if over else 0.0),
                "train/loss": 0.1,
            },
        )
    folder.write_samples(rows)
    folder.write_summary(s)


@pytest.fixture
def sweep(tmp_path):
    for seed in range(3):
        _write(tmp_path / "sweep", "full", seed, over=False)
        _write(tmp_path / "sweep", "none", seed, over=True)
    return tmp_path / "sweep"


def test_each_runs_peak_end_and_collapse(sweep):
    ev = oo.evaluations(load_runs(sweep).curves)
    assert len(ev) == 6 * len(KLS)
    by = ev.set_index(["regime", "seed", "step"])["variety"]  # distinct bigrams of one response a prompt / step 0's
    assert by[("full", 0, 20 * (len(KLS) - 1))] == pytest.approx(1.0)
    # 3 of its 4 responses degenerate (5 bigrams, 2 distinct), the fourth FINE[3] (3 distinct)
    assert by[("none", 0, 20 * (len(KLS) - 1))] == pytest.approx((2 + 3) / (3 * 5 + 3))
    pts = oo.run_points(ev).set_index(["regime", "seed"])
    for seed in range(3):
        s = 1.0 + 0.1 * seed
        none = pts.loc[("none", seed)]
        kls = [k * s for k in KLS]
        golds = [_gao(k) for k in kls]
        best = int(np.argmax(golds))
        assert none["peak_step"] == 20 * best and none["peak_kl"] == pytest.approx(kls[best])
        assert none["peak_gold"] == pytest.approx(golds[best], abs=1e-12) and none["peaked_early"]
        assert none["end_kl"] == pytest.approx(kls[-1]) and none["end_gold"] == pytest.approx(golds[-1], abs=1e-12)
        assert none["end_proxy"] == pytest.approx(0.3 * (len(KLS) - 1))  # the gain over its own step 0
        assert none["collapse_step"] == 20 * (4 - seed)  # 2 of its 4 responses degenerate
        full = pts.loc[("full", seed)]
        assert full["peak_step"] == 100 and not full["peaked_early"] and math.isnan(full["collapse_step"])


def test_a_run_collapsed_onto_a_template_has_collapsed_though_no_response_repeats_itself(tmp_path):
    """Varied responses at steps 0 and 20, then the same words for every prompt from step 40 (nothing degenerate):
    the variety falls to a quarter and the run has collapsed at step 40; a run whose responses stay varied keeps its
    variety; the recheck, from the samples, agrees."""
    from analysis.recheck import recheck

    for regime, template_from in (("none", 2), ("full", None)):
        folder = RunFolder(tmp_path / "sweep" / f"ref={regime},seed=0")
        folder.write_config({"ref": {"name": regime}, "algo": {"name": "grpo"}, "model": {"name": "tiny"}, "seed": 0})
        rows = []
        for i in range(4):
            texts = [TEMPLATE] * PROMPTS if template_from is not None and i >= template_from else list(FINE)
            rows += [{"step": 20 * i, "prompt": f"p{p}", "sample": 0, "policy_response": t, "policy_reward": 0.1 * i,
                      "sft_reward": 0.0, "kl_true": 0.5 * i} for p, t in enumerate(texts)]  # fmt: skip
            folder.log_metrics(20 * i, {"kl/true": 0.5 * i, "eval/reward_delta": 0.1 * i, "eval/degenerate_rate": 0.0})
        folder.write_samples(rows)
        s = {k: 0.5 for k in SUMMARY_KEYS}
        s.update(status="finished", reason="", steps=60, regime=regime, algo="grpo", model="tiny", seed=0)
        folder.write_summary(s)
    ev = oo.evaluations(load_runs(tmp_path / "sweep").curves)
    pts = oo.run_points(ev).set_index("regime")
    assert pts.loc["none", "end_variety"] == pytest.approx(8 / 32) and pts.loc["none", "end_degenerate"] == 0
    assert pts.loc["none", "collapse_step"] == 40
    assert pts.loc["full", "end_variety"] == 1.0 and math.isnan(pts.loc["full", "collapse_step"])
    out = tmp_path / "report"
    assert main(["report", str(tmp_path / "sweep"), "--out", str(out), "--title", "template"]) == 0
    table = pd.read_csv(out / "overoptimisation.csv").set_index("regime")
    assert table.loc["none", "collapsed"] == 1 and table.loc["none", "end_variety_difference"] == pytest.approx(
        8 / 32 - 1
    )
    assert [e for e in recheck([tmp_path / "sweep"], out, n_boot=200).errors if e.startswith("overoptimisation")] == []


def test_runs_without_step_0_samples_say_the_template_rule_cannot_read_them(tmp_path):
    """No step-0 evaluation (eval.at_start=false): no variety, and the section says the collapse there counts
    degenerate responses only; the recheck agrees (it has no variety either)."""
    from analysis.recheck import recheck

    for regime in ("full", "none"):
        folder = RunFolder(tmp_path / "sweep" / f"ref={regime},seed=0")
        folder.write_config({"ref": {"name": regime}, "algo": {"name": "grpo"}, "model": {"name": "tiny"}, "seed": 0})
        rows = []
        for i in range(1, 4):
            rows += [{"step": 20 * i, "prompt": f"p{p}", "sample": 0, "policy_response": TEMPLATE, "policy_reward": 0.1,
                      "sft_reward": 0.0, "kl_true": 0.5 * i} for p in range(PROMPTS)]  # fmt: skip
            folder.log_metrics(20 * i, {"kl/true": 0.5 * i, "eval/reward_delta": 0.1, "eval/degenerate_rate": 0.0})
        folder.write_samples(rows)
        s = {k: 0.5 for k in SUMMARY_KEYS}
        s.update(status="finished", reason="", steps=60, regime=regime, algo="grpo", model="tiny", seed=0)
        folder.write_summary(s)
    out = tmp_path / "report"
    assert main(["report", str(tmp_path / "sweep"), "--out", str(out), "--title", "late"]) == 0
    text = (out / "report.md").read_text()
    assert "The template rule cannot read `full`, `none` (no responses at step 0" in text
    table = pd.read_csv(out / "overoptimisation.csv")
    assert table["end_variety"].isna().all() and (table["collapsed"] == 0).all()
    assert [e for e in recheck([tmp_path / "sweep"], out, n_boot=200).errors if e.startswith("overoptimisation")] == []


def test_the_regime_table_has_t_intervals_over_seeds_and_gaos_fit(sweep):
    ev = oo.evaluations(load_runs(sweep).curves)
    pts = oo.run_points(ev)
    table = oo.regime_table(ev, pts).set_index("regime")
    assert list(table.index) == ["full", "none"]  # the regimes' own order
    peaks = pts[pts["regime"] == "none"]["peak_kl"].to_numpy()
    half = stats.t.ppf(0.975, 2) * peaks.std(ddof=1) / math.sqrt(3)
    row = table.loc["none"]
    assert row["peak_kl"] == pytest.approx(peaks.mean())
    assert (row["peak_kl_lo"], row["peak_kl_hi"]) == pytest.approx((peaks.mean() - half, peaks.mean() + half))
    assert row["peaked_early"] == 3 and row["collapsed"] == 3
    # every evaluation lies on Gao's curve: the fit recovers it, and its peak
    assert (row["gao_alpha"], row["gao_beta"]) == pytest.approx((ALPHA, BETA), abs=1e-9)
    assert row["gao_peak_kl"] == pytest.approx(math.exp(2 * (ALPHA / BETA - 1)))
    assert math.isnan(table.loc["full", "gao_peak_kl"])  # d * sqrt: a curve that never turns down has no peak
    assert table.loc["full", "collapsed"] == 0 and math.isnan(table.loc["full", "collapse_step"])


def test_gaos_fit_is_the_least_squares_fit_and_needs_three_points():
    """On noisy points the fit is LAPACK's least squares to rounding (it solves the normal equations in exactly rounded
    sums, so that it does not move with the arrays' alignment); evaluations at KL 0 are left out, and fewer than three
    give NaN."""
    rng = np.random.default_rng(0)
    d = np.linspace(0.5, 6.0, 9)
    gold = d * (ALPHA - BETA * np.log(d)) + rng.normal(0, 0.05, d.size)
    ev = pd.DataFrame({"sqrt_kl": np.r_[0.0, d], "gold": np.r_[0.0, gold]})
    want, *_ = np.linalg.lstsq(np.column_stack([d, -d * np.log(d)]), gold, rcond=None)
    alpha, beta, _ = oo.gao_fit(ev)
    assert (alpha, beta) == pytest.approx(tuple(want), rel=1e-9)
    assert all(math.isnan(x) for x in oo.gao_fit(ev.iloc[:3]))  # KL 0 and two points


def test_each_regime_against_full_paired_by_seed(sweep):
    pts = oo.run_points(oo.evaluations(load_runs(sweep).curves))
    vs = oo.against_baseline(pts).set_index("regime")
    assert list(vs.index) == ["none"] and vs.loc["none", "n_paired"] == 3
    by = pts.set_index(["regime", "seed"])
    ratios = np.log([by.loc[("none", s), "end_kl"] / by.loc[("full", s), "end_kl"] for s in range(3)])
    half = stats.t.ppf(0.975, 2) * ratios.std(ddof=1) / math.sqrt(3)
    row = vs.loc["none"]
    assert row["end_kl_ratio"] == pytest.approx(math.exp(ratios.mean()))  # 8 x (1 + 0.1 seed): a geometric mean
    assert (row["end_kl_ratio_lo"], row["end_kl_ratio_hi"]) == pytest.approx(
        (math.exp(ratios.mean() - half), math.exp(ratios.mean() + half))
    )
    diffs = [by.loc[("none", s), "end_gold"] - by.loc[("full", s), "end_gold"] for s in range(3)]
    assert row["end_gold_difference"] == pytest.approx(np.mean(diffs))
    assert vs.columns.str.startswith("peak_kl_ratio").sum() == 3


def test_runs_without_three_evaluations_get_no_section(tmp_path):
    for seed in range(2):
        folder = RunFolder(tmp_path / f"ref=full,seed={seed}")
        folder.write_config({"ref": {"name": "full"}, "seed": seed})
        for step in (0, 40):
            folder.log_metrics(step, {"kl/true": 0.1 * step, "eval/reward_delta": 0.01 * step})
    out = tmp_path / "out"
    out.mkdir()
    assert oo.section(load_runs(tmp_path).curves, out) == ([], None)
    assert not (out / "overoptimisation.csv").exists()


def test_the_report_has_the_section_its_table_and_its_figure(sweep, tmp_path):
    out = tmp_path / "report"
    assert main(["report", str(sweep), "--out", str(out), "--title", "drift"]) == 0
    text = (out / "report.md").read_text()
    section = text.split("## Over-optimisation: where the gold reward peaked")[1].split("\n## ")[0]
    row = next(ln for ln in section.splitlines() if ln.startswith("| `none` |"))
    assert "| 3 of 3 |" in row and "3 of 3 (60)" in row  # peaked early, collapsed (steps 80, 60, 40: a whole step)
    paired = section.split("Against `full`, paired by seed")[1]
    assert next(ln for ln in paired.splitlines() if ln.startswith("| `none` | 3 |"))
    csv = pd.read_csv(out / "overoptimisation.csv")
    assert list(csv["regime"]) == ["full", "none"] and {"peak_kl_lo", "gao_peak_kl"} <= set(csv.columns)
    png = out / "figures" / "overoptimisation.png"
    assert png.stat().st_size > 10_000 and "](figures/overoptimisation.png)" in text


def test_the_recheck_recomputes_the_table_from_the_samples_and_catches_an_edit(sweep, tmp_path):
    from analysis.recheck import recheck

    out = tmp_path / "report"
    assert main(["report", str(sweep), "--out", str(out), "--title", "drift"]) == 0
    found = recheck([sweep], out, n_boot=200)
    over = [e for e in found.errors if e.startswith("overoptimisation")]
    assert over == [] and found.rows >= 2
    table = pd.read_csv(out / "overoptimisation.csv")
    table.loc[table["regime"] == "none", "peak_kl_hi"] += 0.01
    table.loc[table["regime"] == "none", "collapsed"] = 2
    table.loc[table["regime"] == "none", "end_kl_ratio_lo"] *= 1.01
    table.loc[table["regime"] == "none", "end_variety"] += 0.01
    table.to_csv(out / "overoptimisation.csv", index=False)
    errors = [e for e in recheck([sweep], out, n_boot=200).errors if e.startswith("overoptimisation")]
    assert sorted(e.split(": ")[3] for e in errors) == ["collapsed", "end_kl_ratio_lo", "end_variety", "peak_kl_hi"]


def test_the_recheck_does_not_import_the_code_it_checks():
    import subprocess
    import sys

    code = (
        "import sys, analysis.recheck; "
        "print(sorted(m for m in sys.modules if m in ('analysis.overoptimisation', 'analysis.samples', "
        "'analysis.bootstrap', 'ablate.eval.metrics')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.slow
def test_real_runs_curves_agree_with_their_samples(tmp_path):
    """Two tiny GRPO runs on the learned reward, evaluated at every step: the section reads what the evaluator logged,
    and the recheck, from the samples alone, agrees with every cell (the evaluator's metrics and the recheck's
    restated rules are the same rules)."""
    from analysis.recheck import recheck
    from tests.conftest import TINY_FAST, run_cli

    sweep = tmp_path / "sweep"
    res = run_cli(
        "-m", *TINY_FAST, "algo=grpo", "algo.num_generations=2", "algo.reward=learned", "algo.reward_model.epochs=1",
        "eval.interval=1", "ref=full,none", f"hydra.sweep.dir={sweep}", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    # its overrides would name each job's folder past a file name's 255 bytes: Hydra's names cut to fit
    folders = [p for p in sweep.iterdir() if p.is_dir()]
    assert len(folders) == 2 and all(len(p.name.encode()) == 255 for p in folders), res.stderr[-3000:]
    out = tmp_path / "report"
    assert main(["report", str(sweep), "--out", str(out), "--title", "tiny drift"]) == 0
    table = pd.read_csv(out / "overoptimisation.csv").set_index("regime")
    assert list(table.index) == ["full", "none"] and (table["n_seeds"] == 1).all()
    assert table["end_proxy"].notna().all() and table.loc["none", "n_paired"] == 1
    found = recheck([sweep], out, n_boot=200)
    errors = [e for e in found.errors if e.startswith("overoptimisation")]
    assert errors == [], "\n".join(errors)
    assert found.rows >= 2
