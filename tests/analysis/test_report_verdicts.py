"""The report on synthetic run folders: its statistics section, the null control (and its warning), the
verdict tables, failed runs listed, captions under every figure, one colour per regime (no model runs)."""

import pandas as pd
import pytest
from matplotlib.colors import to_rgba

from analysis import figures, figures_equivalence
from analysis.__main__ import main
from analysis.load import load_runs
from analysis.report_figures import CAPTIONS, report_labels
from tests.analysis.synthetic import samples, write_run


def _sweep(root, cached_shift=0.001):
    for seed in (0, 1):
        write_run(root, "full", seed, samples(seed, 8))
        write_run(root, "cached", seed, samples(seed, 8, shift=cached_shift))
        write_run(root, "int8", seed, samples(seed, 8, shift=0.3))
    write_run(root, "nf4", 0, status="failed", reason="CUDA out of memory while quantising")
    write_run(root, "topk", 1, status="unfinished")
    return root


def _report(tmp_path, *flags, cached_shift=0.001):
    sweep = _sweep(tmp_path / "sweep", cached_shift)
    out = tmp_path / "report"
    assert main(["report", str(sweep), "--out", str(out), "--boot", "500", *flags]) == 0
    return (out / "report.md").read_text(), out


def test_report_states_its_statistics_and_verdicts(tmp_path, capsys):
    text, out = _report(tmp_path, "--margin", "kl_true=20%", "--boot-seed", "3")
    assert "8 jobs, 2 not finished" in capsys.readouterr().out
    assert "- primary metric: `reward_delta`; baseline `full`; null control `cached`" in text
    assert "`reward_delta` ±0.05 absolute, `win_rate` ±0.05 absolute, `kl_true` ±20% of the baseline's mean" in text
    assert "bootstrap: 500 resamples, seed 3" in text and "hierarchical bootstrap, percentile" in text
    assert "t interval on the log scale" in text  # how positive quantities get their intervals
    assert "came out **equivalent** to `full`" in text and "WARNING" not in text
    eq = pd.read_csv(out / "equivalence.csv").set_index(["regime", "metric"])
    assert eq.loc[("int8", "reward_delta"), "verdict"] == "different"
    assert eq.loc[("cached", "kl_true"), "verdict"] == "equivalent"
    # length, per prompt from samples.jsonl: the same lengths in every run, equivalent by the default 10% margin
    assert eq.loc[("int8", "length"), "verdict"] == "equivalent" and "bootstrap" in eq.loc[("int8", "length"), "method"]
    assert "| `int8` | `reward_delta` (primary) |" in text
    assert set(pd.read_csv(out / "primary.csv")["regime"]) == {"full", "cached", "int8"}


def test_null_control_that_is_not_equivalent_warns(tmp_path):
    text, _ = _report(tmp_path, cached_shift=0.2)
    (warning,) = [ln for ln in text.splitlines() if "WARNING" in ln]
    assert "the null control `cached` did NOT come out equivalent" in warning and "`reward_delta` different" in warning
    assert "no other verdict of this report should be trusted" in warning
    (floor,) = [ln for ln in text.splitlines() if "the noise floor" in ln]  # the null control's own differences
    assert "`cached` - `full`" in floor and "`reward_delta` 0.2 [0.2, 0.2]" in floor


def test_null_control_that_is_only_inconclusive_says_the_report_is_underpowered(tmp_path):
    """cached differs from full by +0.04 on seed 0 and -0.04 on seed 1: not different, but the seed-level t interval
    (1 degree of freedom) is far wider than the margin: underpowered, not a bias, and no warning."""
    sweep = tmp_path / "sweep"
    for seed, shift in ((0, 0.04), (1, -0.04)):
        write_run(sweep, "full", seed, samples(seed, 8))
        write_run(sweep, "cached", seed, samples(seed, 8, shift=shift))
    assert main(["report", str(sweep), "--out", str(tmp_path / "r"), "--boot", "500"]) == 0
    text = (tmp_path / "r" / "report.md").read_text()
    assert "WARNING" not in text
    (line,) = [ln for ln in text.splitlines() if "Null control (all runs)" in ln]
    assert "inconclusive on `reward_delta`" in line and "cannot yet tell an effect" in line
    assert "Equivalent, as it must be, on `win_rate`, `kl_true`, `length`." in line


def test_failed_and_unfinished_runs_are_listed(tmp_path):
    text, _ = _report(tmp_path)
    section = text.split("## Runs not finished")[1].split("\n## ")[0]
    assert "| failed | `ref=nf4,seed=0` | nf4 | 0 | CUDA out of memory while quantising |" in section
    assert "| unfinished | `ref=topk,seed=1` | topk | 1 |" in section


def _legend_colours(fig) -> dict:
    """label -> RGBA of every legend entry of a figure drawn as lines, error bars or scatters."""
    out = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            artist = handle[0] if isinstance(handle, tuple) or hasattr(handle, "lines") else handle
            if hasattr(artist, "get_offsets"):  # a scatter
                out[label] = to_rgba(artist.get_facecolor()[0])
            elif hasattr(artist, "get_color"):  # a line
                out[label] = to_rgba(artist.get_color())
    return out


def test_every_figure_has_a_caption_and_one_colour_per_regime(tmp_path, monkeypatch):
    drawn = {}
    original = figures._save

    def keep(fig, path):
        drawn[path.stem] = _legend_colours(fig)
        return original(fig, path)

    monkeypatch.setattr(figures, "_save", keep)
    monkeypatch.setattr(figures_equivalence, "_save", keep)
    text, out = _report(tmp_path)
    for name in ("equivalence", "frontier", "training", "drift", "kl_error"):
        assert (out / "figures" / f"{name}.png").stat().st_size > 5_000
        assert f"![{name}](figures/{name}.png)\n\n*Figure ({name}).* {CAPTIONS[name]}" in text
    labels = report_labels(load_runs(tmp_path / "sweep"), several=False)
    assert labels == ["cached", "full", "int8", "nf4", "topk"]  # failed and unfinished regimes too
    expected = {r: to_rgba(c) for r, c in figures.regime_colors(labels).items()}
    seen = 0
    for name, colours in drawn.items():
        for label, colour in colours.items():
            if label in expected:
                assert colour == expected[label], (name, label)
                seen += 1
    assert "cached" in drawn["kl_error"] and seen >= 9  # kl_error draws only 3 of the 5 regimes
    assert not any("nf4" in drawn[n] for n in ("frontier", "training", "drift"))  # failed: its curves stop early


def test_a_bad_margin_is_one_line(tmp_path, capsys):
    sweep = _sweep(tmp_path / "sweep")
    try:
        main(["report", str(sweep), "--out", str(tmp_path / "r"), "--margin", "kl_true=ten"])
    except SystemExit as e:
        assert e.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith(
        "error: margin kl_true='ten': a margin is a positive number (0.05) or a share of the baseline's mean (10%)"
    )


@pytest.mark.slow
def test_the_cost_section_comes_from_the_bench(tmp_path):
    """``--bench``: bytes against the fp32 full reference and a bf16 copy, time per step against full, from the
    bench's CSV (its code read from the Markdown beside it); a regime the bench lacks says so."""
    bench = tmp_path / "bench" / "smollm2.csv"
    bench.parent.mkdir()
    bench.write_text(
        "regime,setup_s,bytes_held,step_s\nfull,0.05,1048576000,1.0\nint8,0.25,429916160,1.9\ncached,2.0,0,0.001\n"
    )
    bench.with_suffix(".md").write_text("# Benchmark\n\nGenerated by `python -m ablate.bench`. Code 209dca4; torch\n")
    text, _ = _report(tmp_path, "--bench", str(bench))
    section = text.split("## Cost, from the bench")[1].split("\n## ")[0]
    assert f"(`{bench}`, code 209dca4)" in section
    assert "| `int8` | 410.0 | 0.41 | 0.82 | 1.9 | 1.9 | 0.25 |" in section
    assert "| `full` | 1,000 | 1 | 2 | 1 | 1 | 0.05 |" in section
    assert "| `cached` | 0 | 0 | 0 |" in section
    # the jobs' own reference times (shared cores, pauses counted) give way to the bench's in the tables and figure
    fidelity = text.split("## all runs: fidelity and cost of each reference")[1].split("\n## ")[0]
    assert "ref. ms/step" not in fidelity and "Reference time per step: the bench's" in fidelity
    assert "reference time per DPO training step from the bench" in text.split("*Figure (pareto).*")[1]
    plain, _ = _report(tmp_path / "no_bench")
    fidelity = plain.split("## all runs: fidelity and cost of each reference")[1].split("\n## ")[0]
    assert "| ref. ms/step |" in fidelity and "each job's own wall time" in fidelity
    assert (
        main(["report", str(tmp_path / "sweep"), "--out", str(tmp_path / "r2"), "--bench", str(tmp_path / "x.csv")])
        == 2
    )


def test_every_registered_regime_gets_its_own_colour():
    """11 regimes once shared tab10's 10 colours: trdpo_soft was drawn in full's blue."""
    from ablate.refs import REGISTRY

    colours = figures.regime_colors(list(REGISTRY) + ["ema(alpha=0.1)", "ema(alpha=0.5)"])
    assert len(set(colours.values())) == len(colours) and colours["full"] == figures.plt.get_cmap("tab10")(0)


def test_the_pareto_time_panel_reads_the_time_it_is_given(monkeypatch, tmp_path):
    """With a bench, the time axis is the bench's per regime; a regime the bench lacks leaves that panel only."""
    drawn = {}

    def keep(fig, path):  # the figure itself, instead of its PNG
        drawn["fig"] = fig
        return path

    monkeypatch.setattr(figures, "_save", keep)
    agg = pd.DataFrame(
        {
            "regime": ["full", "int8", "mine"],
            "ref_bytes_mean": [100.0 * 2**20, 40.0 * 2**20, 10.0 * 2**20],
            "ref_ms_per_step_mean": [9e6, 9e6, 9e6],  # the jobs' own: not drawn when the bench's are asked for
            "bench_ms_per_step_mean": [1000.0, 1900.0, float("nan")],
            **{f"margin_err_sd_{k}": [0.3, 2.0, 5.0] for k in ("mean", "lo", "hi")},
        }
    )
    figures.pareto(agg, tmp_path / "p.png", time=figures.BENCH_TIME)
    memory, time = drawn["fig"].axes
    xs = lambda ax: sorted(float(c.lines[0].get_xdata()[0]) for c in ax.containers)  # noqa: E731  (one per point)
    assert xs(memory) == [10.0, 40.0, 100.0] and xs(time) == [1000.0, 1900.0]
    assert time.get_xlabel() == figures.BENCH_TIME[1] and [t.get_text() for t in time.texts] == ["full", "int8"]


def test_the_report_states_its_compute():
    """Item 6 of the reports issue: wall time in all and per job, from the finished jobs' summaries."""
    from analysis.report import compute_line

    runs = pd.DataFrame({"status": ["finished", "finished", "finished", "failed"], "wall_s": [1200, 1800, 4200, 60]})
    line = compute_line(runs)
    assert line.startswith("- compute: 3 finished jobs, 2.0 h of job wall time in all, 30 min a job (median)")
    assert "any pause" in line
    assert compute_line(runs.assign(wall_s=float("nan"))) == "- compute: not recorded"


def test_a_cache_that_missed_gets_no_bench_time(monkeypatch, tmp_path):
    """The bench times a cache's hits; `cached` whose runs missed (GRPO's null control scores every fresh sample
    with a full copy) is not drawn at the bench's near-zero time."""
    from analysis import report_figures

    root = tmp_path / "sweep"
    for seed in (0, 1):
        write_run(root, "full", seed, samples(seed, 8))
        write_run(root, "cached", seed, samples(seed, 8), ref_misses=40.0)
    bench = tmp_path / "bench.csv"
    bench.write_text("regime,setup_s,bytes_held,step_s\nfull,0.05,1048576000,1.0\ncached,2.0,0,0.001\n")
    seen = {}

    def keep(agg, path, colors, time, **conditions):  # what the Pareto figure is handed
        seen["agg"] = agg
        return path

    monkeypatch.setattr(figures, "pareto", keep)
    data = load_runs(root)
    agg = pd.DataFrame({"condition": ["all runs"] * 2, "regime": ["full", "cached"]})
    report_figures.make_figures(data, agg, pd.DataFrame(), tmp_path / "out", report_figures.ReportConfig(), bench)
    times = dict(zip(seen["agg"]["regime"], seen["agg"]["bench_ms_per_step_mean"]))
    assert times["full"] == 1000.0 and pd.isna(times["cached"])


def test_one_wide_interval_does_not_squeeze_the_equivalence_panel():
    """Margin 0.05, estimates within 0.1, one interval ±13 (two seeds that disagree): the panel reaches past every
    estimate and seed but stops near the cap (4 margins, 1.5x the farthest point), not at 13; no margin: NaN."""
    c = pd.DataFrame(
        {
            "diff": [0.02, -0.1],
            "lo": [-0.01, -13.0],
            "hi": [0.05, 13.0],
            "seed_diffs": ["", "0:-0.12;1:-0.08"],
        }
    )
    reach = figures_equivalence.panel_reach(c, 0.05)
    assert 0.12 < reach <= 0.2 * 1.05 + 1e-12
    assert figures_equivalence.panel_reach(c.iloc[:1], 0.05) == 0.05 * 1.05  # all inside the margin: the margin
    assert figures_equivalence.panel_reach(c, float("nan")) != figures_equivalence.panel_reach(c, float("nan"))
