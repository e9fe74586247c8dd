"""The report's sections for sweeps that vary a setting, on synthetic sweeps with known effects: the baseline across
conditions (``analysis/conditions.py``) and beta sensitivity (``analysis/sensitivity.py``); and the report
command's ``--regimes`` filter that lets one report read part of another's sweep."""

import pandas as pd
import pytest

from analysis.archive import reproduce_lines
from analysis.load import load_runs
from tests.analysis.synthetic import samples, write_run
from tests.conftest import REPO

# (regime, beta) -> (margin error sd, reward shift): only nf4 at beta 0.3 (beta x sd = 3) moves the behaviour
POINTS = {
    ("full", 0.03): (0.3, 0.0),
    ("int8", 0.03): (2.0, 0.0),
    ("nf4", 0.03): (10.0, 0.0),
    ("full", 0.3): (0.3, 0.0),
    ("int8", 0.3): (2.0, 0.0),
    ("nf4", 0.3): (10.0, 0.3),
}


BASE = {0.03: 0.2, 0.3: 0.0}  # every regime at beta 0.03 gains 0.2 more reward: full's own change with beta


def _sweeps(root):
    for (regime, beta), (sd, shift) in POINTS.items():
        for seed in (0, 1):
            write_run(
                root / f"beta{beta}",
                regime,
                seed,
                samples(seed, 12, shift=BASE[beta] + shift),
                config={"algo": {"beta": beta}},
                margin_err_sd=sd + 0.01 * seed,
            )
    write_run(root / "beta0.3", "cached", 0, samples(0, 12), config={"algo": {"beta": 0.3}}, margin_err_sd=0.3)
    return root


def _report(*args) -> int:
    """``python -m analysis report`` in this process (its imports are paid once for the module's tests)."""
    from analysis.__main__ import main

    return main(["report", *map(str, args), "--boot", "200"])


@pytest.mark.slow
def test_the_section_orders_points_by_beta_times_sd_and_finds_the_first_difference(tmp_path):
    root, out = _sweeps(tmp_path / "sweeps"), tmp_path / "report"
    assert _report(root / "beta0.03", root / "beta0.3", "--out", out, "--regimes", "full,int8,nf4") == 0
    text = (out / "report.md").read_text()
    assert "## When is a cheap reference safe?" in text and "](figures/sensitivity.png)" in text
    assert (out / "figures" / "sensitivity.png").stat().st_size > 10_000
    f = pd.read_csv(out / "sensitivity.csv")
    assert set(f["regime"]) == {"int8", "nf4"}  # cached filtered out; the baseline is not a point
    pts = f[f["metric"] == "reward_delta"].set_index(["regime", "beta"])
    assert pts["scaled"].to_numpy() == pytest.approx([0.03 * 2.005, 0.03 * 10.005, 0.3 * 2.005, 0.3 * 10.005])
    assert pts.loc[("nf4", 0.3), "verdict"] == "different"
    assert pts.loc[("nf4", 0.3), "rel_diff"] == pytest.approx(0.3 / 0.05)
    assert pts.drop(("nf4", 0.3))["verdict"].isin(["equivalent", "determinism check"]).all()  # identical: a check
    assert "up to **0.601** is equivalent to `full`" in text
    assert "the smallest beta x sd with a difference is **3**" in text and "`nf4` at algo.beta=0.3" in text
    assert "margin error (its precision's zero line): 0.305 at beta 0.03, 0.305 at beta 0.3" in text
    rho = [ln for ln in text.splitlines() if ln.startswith("- `reward_delta`: Spearman's rho")]
    assert len(rho) == 1 and "over 4 points" in rho[0]
    # full itself across beta: 0.3 against 0.03 (the first of two with as many seeds), paired by seed and prompt
    across = pd.read_csv(out / "conditions.csv").set_index("metric")
    assert across.loc["reward_delta", "regime"] == "algo.beta=0.3"
    assert across.loc["reward_delta", "diff"] == pytest.approx(-0.2)
    assert across.loc["reward_delta", "verdict"] == "different" and across.loc["kl_true", "verdict"] == "equivalent"
    assert "against **algo.beta=0.03** (the one with the most `full` seeds)" in text
    assert "- `kl_true`: no rank correlation over 4 points (too few, or every difference the same)." in text


def test_reports_without_varying_beta_have_no_such_section(tmp_path):
    root = _sweeps(tmp_path / "sweeps")
    runs = load_runs(root / "beta0.3").runs
    assert "cached" in set(runs["regime"])
    assert _report(root / "beta0.3", "--out", tmp_path / "r") == 0
    text = (tmp_path / "r" / "report.md").read_text()
    assert "cheap reference safe" not in text and "across conditions" not in text
    assert not (tmp_path / "r" / "sensitivity.csv").exists() and not (tmp_path / "r" / "conditions.csv").exists()


def test_an_unknown_regime_in_the_filter_is_one_line(tmp_path, capsys):
    root = _sweeps(tmp_path / "sweeps")
    assert _report(root / "beta0.03", "--out", tmp_path / "r", "--regimes", "full,emma") == 2
    assert not (tmp_path / "r").exists()
    assert capsys.readouterr().err.strip() == f"analysis: error: no runs of regime emma below {root / 'beta0.03'}"


def test_reproduce_lines_archive_each_report_s_copies():
    out = REPO / "reports" / "dpo_beta"
    sweeps = [
        {"path": str(out / "runs" / "report_beta"), "command": "python -m ablate -m +sweep=report_beta"},
        {"path": str(REPO / "reports" / "dpo_regimes" / "runs" / "report_dpo"), "command": "python -m ablate -m x"},
    ]
    lines = reproduce_lines(sweeps, out)
    assert lines[2:] == [
        f"python -m analysis archive runs/sweeps/report_beta --out {out / 'runs'}",
        f"python -m analysis archive runs/sweeps/report_dpo --out {REPO / 'reports' / 'dpo_regimes' / 'runs'}",
    ]


def test_conditions_come_in_natural_order_whatever_the_order_of_the_folders(tmp_path, monkeypatch):
    from analysis import report_figures
    from analysis.load import natural_key

    assert sorted(["steps=10", "steps=9", "beta=0.3", "beta=0.03", "beta=1e-05"], key=natural_key) == [
        "beta=1e-05",
        "beta=0.03",
        "beta=0.3",
        "steps=9",
        "steps=10",
    ]
    # a hyphen inside a name is text, not a minus sign; a sign after "=" is one
    names = ["m=pythia-410m", "m=pythia-70m", "m=pythia-160m", "lr=1e+20", "lr=5.0", "lr=-1"]
    assert sorted(names, key=natural_key) == [
        "lr=-1", "lr=5.0", "lr=1e+20", "m=pythia-70m", "m=pythia-160m", "m=pythia-410m",
    ]  # fmt: skip
    root, out = _sweeps(tmp_path / "sweeps"), tmp_path / "report"
    (out / "figures").mkdir(parents=True)
    (out / "figures" / "training.png").write_bytes(b"")  # from an earlier run of the report: not drawn this time
    (out / "figures" / "mine.png").write_bytes(b"")  # added by hand: not the report's, left alone
    failed = write_run(root / "beta1", "int8", 0, status="failed", reason="boom", config={"algo": {"beta": 1.0}})
    handed, draw = {}, report_figures.frontier_by_condition  # what the frontier is given: finished runs' curves

    def frontier(curves, path, baseline, colors, markers):
        handed.update(paths=set(curves["path"]), markers=markers)
        return draw(curves, path, baseline, colors, markers)

    monkeypatch.setattr(report_figures, "frontier_by_condition", frontier)
    assert _report(root / "beta0.3", root / "beta1", root / "beta0.03", "--out", out, "--regimes", "full,int8") == 0
    text = (out / "report.md").read_text()
    assert text.index("## algo.beta=0.03:") < text.index("## algo.beta=0.3:")
    across = text.split("across conditions: what the setting itself does")[1]
    assert across.index("| `algo.beta=0.03` |") < across.index("| `algo.beta=0.3` |")
    assert "against **algo.beta=0.03** (the one with the most `full` seeds)" in across  # the tie goes to the first
    # the figures: the frontier by condition; training and drift one figure per condition, in natural order
    assert "![frontier by condition](figures/frontier.png)" in text and "marker the condition" in text
    assert text.index("](figures/training_1.png)") < text.index("](figures/training_2.png)")
    assert "![training, algo.beta=0.03](figures/training_1.png)" in text and "![drift, algo.beta=0.3]" in text
    assert sorted(p.name for p in (out / "figures").iterdir()) == [
        "drift_1.png", "drift_2.png", "equivalence.png", "frontier.png", "kl_error.png", "mine.png", "pareto.png",
        "sensitivity.png", "training_1.png", "training_2.png",
    ]  # fmt: skip
    assert (out / "figures" / "frontier.png").stat().st_size > 10_000
    assert str(failed) not in handed["paths"] and len(handed["paths"]) == 8  # 2 betas x 2 regimes x 2 seeds
    assert handed["markers"] == {"algo.beta=0.03": "o", "algo.beta=0.3": "s"}  # the failed beta 1.0 takes none


def test_the_frontier_across_conditions_joins_a_numeric_setting_s_points_at_each_run_s_last_evaluation():
    from analysis.figures import KL_TRUE, REWARD_GOLD
    from analysis.figures_frontier import final_points, numeric_setting

    assert numeric_setting(["algo.beta=0.3", "algo.beta=0.03"]) == "algo.beta"
    assert numeric_setting(["algo.kl_estimator=k1, algo.kl_placement=reward", "algo.kl_estimator=k2"]) is None
    assert numeric_setting(["algo.beta=0.1", "algo.learning_rate=1e-05"]) is None  # two settings: no line
    curves = pd.DataFrame(
        {
            "path": ["a", "a", "b", "b", "c"],
            "step": [0, 20, 0, 20, 20],
            "condition": ["beta=0.1"] * 4 + ["beta=0.3"],
            "regime": ["full"] * 5,
            KL_TRUE: [0.0, 1.0, 0.0, 3.0, 0.5],
            REWARD_GOLD: [0.1, 0.2, 0.1, 0.4, 0.15],
        }
    )
    pts = final_points(curves).set_index("condition")
    assert pts.loc["beta=0.1", KL_TRUE] == 2.0 and pts.loc["beta=0.1", f"{KL_TRUE}_min"] == 1.0  # step 0 left out
    assert pts.loc["beta=0.1", f"{REWARD_GOLD}_max"] == pytest.approx(0.4) and pts.loc["beta=0.3", KL_TRUE] == 0.5


def test_a_regime_keeps_its_colour_under_every_condition():
    from analysis.figures import regime_colors
    from analysis.report_figures import label_colors

    colors = label_colors(["beta=0.03 | int8", "beta=0.3 | int8", "beta=0.3 | full", "beta=0.03 | full"])
    assert colors["beta=0.03 | int8"] == colors["beta=0.3 | int8"] == regime_colors(["full", "int8"])["int8"]
    assert colors["beta=0.3 | full"] == regime_colors(["full"])["full"] != colors["beta=0.3 | int8"]


@pytest.mark.slow
def test_the_sensitivity_table_is_rechecked_and_a_changed_figure_caught(tmp_path):
    from analysis.recheck import recheck

    root, out = _sweeps(tmp_path / "sweeps"), tmp_path / "report"
    assert _report(root / "beta0.03", root / "beta0.3", "--out", out, "--regimes", "full,int8,nf4") == 0
    folders = [root / "beta0.03", root / "beta0.3"]

    def sensitivity_errors() -> list[str]:  # (the synthetic runs' summaries do not follow from their samples)
        found = recheck(folders, out, regimes=["full", "int8", "nf4"], n_boot=200, itol=1.0)
        return [e for e in found.errors if e.startswith("sensitivity: ")]

    assert sensitivity_errors() == []
    table = pd.read_csv(out / "sensitivity.csv")
    said = {"scaled": "beta x sd", "rel_hi": "rel_hi", "sd": "margin error sd", "verdict": "verdict"}
    for column, change in (("scaled", 1e-6), ("rel_hi", 1e-6), ("sd", 1e-3), ("verdict", None)):
        bad = table.copy()
        bad.loc[0, column] = "different" if change is None else bad.loc[0, column] + change
        bad.to_csv(out / "sensitivity.csv", index=False)
        errors = sensitivity_errors()
        assert len(errors) >= 1 and f": {said[column]}" in errors[0], (column, errors)
    table.iloc[1:].to_csv(out / "sensitivity.csv", index=False)  # a row left out
    assert [e.split(" [")[0] for e in sensitivity_errors()] == ["sensitivity: rows missing"]
    (out / "sensitivity.csv").unlink()  # the whole table
    assert sensitivity_errors() == ["sensitivity: the runs vary beta and measured the margin error: no sensitivity.csv"]


def test_one_order_of_regimes_in_tables_and_figures():
    from analysis.figures import ordered

    labels = ["topk(k=10)", "zzz", "ema(alpha=0.1)", "topk(k=9)", "full", "ema(alpha=0.03)", "int8"]
    assert ordered(labels) == ["full", "int8", "topk(k=9)", "topk(k=10)", "ema(alpha=0.03)", "ema(alpha=0.1)", "zzz"]
    by_condition = ["beta=0.3 | full", "beta=0.03 | nf4", "beta=0.03 | int8", "beta=0.03 | full"]
    assert ordered(by_condition) == ["beta=0.03 | full", "beta=0.03 | int8", "beta=0.03 | nf4", "beta=0.3 | full"]


def test_the_sensitivity_figure_s_beta_markers_are_the_beta_conditions_markers():
    from analysis.figure_style import condition_handles, condition_markers
    from analysis.load import natural_key

    betas = [0.3, 0.03, 1.0, 0.1]  # the sensitivity figure: ascending beta; the other figures: the names' natural order
    names = sorted((f"algo.beta={b:g}" for b in betas), key=natural_key)
    by_name, by_beta = condition_markers(names), condition_markers(sorted(betas))
    assert [by_name[f"algo.beta={b:g}"] for b in sorted(betas)] == list(by_beta.values()) == ["o", "s", "^", "D"]
    handles = condition_handles(by_name)
    assert [(h.get_label(), h.get_marker()) for h in handles] == list(by_name.items())


def test_seeds_keep_only_those_seeds_and_an_absent_one_is_one_line(tmp_path, capsys):
    root = _sweeps(tmp_path / "sweeps")
    both = load_runs(root / "beta0.03", root / "beta0.3").runs
    one = load_runs(root / "beta0.03", root / "beta0.3", seeds=[1]).runs
    assert sorted(set(both["seed"])) == [0, 1] and set(one["seed"]) == {1}
    assert len(one) == len(both[both["seed"] == 1])
    out = tmp_path / "report"
    assert _report(root / "beta0.03", "--out", out, "--seeds", "0,7") == 2
    assert capsys.readouterr().err.strip() == f"analysis: error: no runs of seed 7 below {root / 'beta0.03'}"
    assert _report(root / "beta0.03", "--out", out, "--seeds", "zero") == 2
    assert "--seeds takes integers" in capsys.readouterr().err
    assert _report(root / "beta0.03", "--out", out, "--seeds", "1") == 0
    text = (out / "report.md").read_text()
    assert "; seeds 1;" in text and "--seeds 1" in text  # the command, hence its reproduction, keeps the filter


@pytest.mark.slow
def test_a_chosen_reference_condition_is_the_one_the_others_are_compared_with(tmp_path, capsys):
    root, out = _sweeps(tmp_path / "sweeps"), tmp_path / "report"
    args = (root / "beta0.03", root / "beta0.3", "--out", out, "--regimes", "full,int8")
    assert _report(*args, "--reference-condition", "algo.beta=0.3") == 0
    across = pd.read_csv(out / "conditions.csv").set_index("metric")
    assert across.loc["reward_delta", "regime"] == "algo.beta=0.03"  # 0.03 against the chosen 0.3: the sign flips
    assert across.loc["reward_delta", "diff"] == pytest.approx(0.2)
    assert "against **algo.beta=0.3** (chosen)" in (out / "report.md").read_text()
    assert _report(*args, "--reference-condition", "algo.beta=1") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("analysis: error: --reference-condition algo.beta=1: no finished full runs under it")
    assert len(err.splitlines()) == 1


def test_fold_compares_a_stand_in_at_another_beta_with_the_baseline_at_the_common_one(tmp_path):
    """--fold algo.beta: ema at 0.4 is the regime ``ema(algo.beta=0.4)`` of the one condition and is compared with
    full at 0.04 (the common value), paired by seed; without it, beta 0.4 is a condition without a baseline. The
    recheck, given the same --fold, agrees with every row; a setting no run has is one line."""
    from analysis.__main__ import main
    from analysis.recheck import recheck

    for beta, regimes in ((0.04, ("full", "ema")), (0.4, ("ema",))):
        for regime in regimes:
            for seed in (0, 1):
                shift = 0.3 if beta == 0.4 else 0.0
                write_run(tmp_path / f"beta={beta}", regime, seed, samples(seed, 8, shift=shift),
                          config={"algo": {"beta": beta}})  # fmt: skip
    folders = [str(tmp_path / "beta=0.04"), str(tmp_path / "beta=0.4")]
    runs = load_runs(*folders, fold=["algo.beta"]).runs
    assert sorted(runs["regime"].unique()) == ["ema", "ema(algo.beta=0.4)", "full"]
    assert set(runs["condition"]) == {"all runs"}
    assert set(load_runs(*folders).runs["condition"]) == {"algo.beta=0.04", "algo.beta=0.4"}
    out = tmp_path / "report"
    assert main(["report", *folders, "--out", str(out), "--fold", "algo.beta", "--boot", "200"]) == 0
    eq = pd.read_csv(out / "equivalence.csv")
    moved = eq[(eq["regime"] == "ema(algo.beta=0.4)") & (eq["metric"] == "reward_delta")].iloc[0]
    assert moved["diff"] == pytest.approx(0.3, abs=0.1) and moved["verdict"] == "different"
    assert "--fold algo.beta" in (out / "report.md").read_text()  # its command, for the recheck and a reader
    found = recheck([tmp_path / "beta=0.04", tmp_path / "beta=0.4"], out, fold=["algo.beta"], n_boot=400)
    rows = [e for e in found.errors if not e.startswith("ref=")]  # the synthetic summaries are placeholders
    assert rows == [] and found.rows > 0
    unfolded = recheck([tmp_path / "beta=0.04", tmp_path / "beta=0.4"], out, n_boot=400)  # without the report's --fold
    assert [e for e in unfolded.errors if not e.startswith("ref=")]
    with pytest.raises(ValueError, match="--fold algo.betta: no run has the setting algo.betta"):
        load_runs(*folders, fold=["algo.betta"])


def test_fold_keeps_each_label_without_its_folded_beta(tmp_path):
    """``unfolded``: a regime's label without the folded beta, its own settings and other folded ones kept."""
    for alpha, beta in ((0.1, 0.1), (0.1, 0.3), (0.3, 0.1)):
        write_run(tmp_path / f"ema{alpha}_{beta}", "ema", 0, samples(0, 8),
                  config={"algo": {"beta": beta}, "ref": {"name": "ema", "alpha": alpha}})  # fmt: skip
    write_run(tmp_path / "full", "full", 0, samples(0, 8), config={"algo": {"beta": 0.1}})
    runs = load_runs(tmp_path, fold=["algo.beta"]).runs.sort_values("regime")
    assert list(zip(runs["regime"], runs["unfolded"])) == [
        ("ema(alpha=0.1)", "ema(alpha=0.1)"),
        ("ema(alpha=0.1, algo.beta=0.3)", "ema(alpha=0.1)"),
        ("ema(alpha=0.3)", "ema(alpha=0.3)"),
        ("full", "full"),
    ]
    # another folded setting stays in: only the beta is taken out
    write_run(tmp_path / "ema_lr", "ema", 0, samples(0, 8),
              config={"algo": {"beta": 0.3, "learning_rate": 1e-4}, "ref": {"name": "ema", "alpha": 0.1}})  # fmt: skip
    runs = load_runs(tmp_path, fold=["algo.beta", "algo.learning_rate"]).runs
    moved = runs[runs["cfg.algo.learning_rate"] == 1e-4].iloc[0]
    assert (moved["regime"], moved["unfolded"]) == (
        "ema(alpha=0.1, algo.beta=0.3, algo.learning_rate=0.0001)",
        "ema(alpha=0.1, algo.learning_rate=0.0001)",
    )


def test_fold_leaves_the_name_of_a_run_that_did_not_use_the_setting(tmp_path):
    """GRPO's ``none`` trains without a KL term (kl_coef_final 0) whatever its config's beta: folded beside
    stand-ins at 0.1 and 0.3 it stays ``none``, not ``none(algo.beta=0.04)``, and 0.04 does not count towards the
    common value."""
    for regime, beta, coef in (("none", 0.04, 0.0), ("full", 0.1, 0.1), ("ema", 0.1, 0.1), ("ema", 0.3, 0.3)):
        for seed in (0, 1):
            write_run(tmp_path / f"{regime}{beta}", regime, seed, samples(seed, 8), kl_coef_final=coef,
                      config={"algo": {"beta": beta}})  # fmt: skip
    for regime in ("none", "none2"):  # two none runs more: 0.04 the most common value
        for seed in (2, 3):
            write_run(tmp_path / regime, "none", seed, samples(seed, 8), kl_coef_final=0.0,
                      config={"algo": {"beta": 0.04}})  # fmt: skip
    runs = load_runs(tmp_path, fold=["algo.beta"]).runs
    assert sorted(runs["regime"].unique()) == ["ema", "ema(algo.beta=0.3)", "full", "none"]
    assert set(load_runs(tmp_path).runs["condition"]) != {"all runs"}  # unfolded: ema at 0.3 is a condition
    # unfolded and without ema at 0.3 (reports/drift: none at 0.04 beside the rest at 0.1): one condition
    assert set(load_runs(*(tmp_path / d for d in ("none0.04", "full0.1", "ema0.1", "none"))).runs["condition"]) == {
        "all runs"
    }
    # full at beta 0 used its beta (no KL term by choice): folded it is full(algo.beta=0), not full
    write_run(tmp_path / "full0", "full", 0, samples(0, 8), kl_coef_final=0.0, config={"algo": {"beta": 0.0}})
    # an unfinished none run (no summary) is labelled as its finished runs are
    write_run(tmp_path / "none_running", "none", 4, status="unfinished", config={"algo": {"beta": 0.04}})
    runs = load_runs(tmp_path, fold=["algo.beta"]).runs
    assert sorted(runs["regime"].unique()) == ["ema", "ema(algo.beta=0.3)", "full", "full(algo.beta=0.0)", "none"]
