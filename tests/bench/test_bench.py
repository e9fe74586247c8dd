"""``python -m ablate.bench`` on model=tiny: the report and CSV exist, with every regime's ratios to full
and every target judged; the figures it prints are computed, not placeholders."""

import subprocess
import sys

import pandas as pd
import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_bench_on_tiny(tmp_path):
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "ablate.bench",
            "model=tiny",
            "threads=1",
            "regimes=[full,int8,shared,cached,none]",
            "trainers=[dpo]",
            "repeats=2",
            "trainer_steps=2",
            "trainer_rounds=1",
            "peak_memory=false",
            "task.max_new_tokens=16",  # the sampling rows decode 16 tokens, not 64 (-9 s)
            f"out={tmp_path}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    csv = pd.read_csv(tmp_path / "tiny.csv").set_index("regime")
    assert list(csv.index) == ["full", "int8", "shared", "cached", "none"]
    assert csv.loc["full", "bytes_held_vs_full"] == 1.0
    assert csv.loc["shared", "bytes_held"] == 0 and csv.loc["none", "bytes_held"] == 0
    assert csv.loc["cached", "step_s_vs_full"] < 0.5  # a lookup, not a forward
    assert (csv["step_s"] > 0).all() and csv.loc["cached", "cache_bytes"] > 0
    # own state: fp32 weights + gradient + two AdamW moments of every trainable parameter + the reference
    assert csv.loc["full", "own_bytes"] == csv.loc["none", "own_bytes"] + csv.loc["full", "bytes_held"]
    assert csv.loc["shared", "own_bytes"] < csv.loc["none", "own_bytes"]  # only the adapter trains
    md = (tmp_path / "tiny.md").read_text()
    for needle in (
        "## Targets",
        "int8 reference bytes / full",
        "KL audit / one reference forward",
        "dpo: harness / stock TRL step time",
        "fraction of the bf16 matmul ceiling",
        "GFLOP/s",
        "| own MiB |",
        "evaluation's sampler",
        "with the sampler's kept logits",
        "on the generate call's cached prompts",
    ):
        assert needle in md, needle
    assert "n/a" not in next(ln for ln in md.splitlines() if "with the sampler's kept logits" in ln)
    cached = next(ln for ln in md.splitlines() if "cached prompts" in ln)
    assert "n/a" not in cached and float(cached.split("largest logit difference ")[1].split(";")[0]) < 1e-4
    rows = [ln for ln in md.splitlines() if ln.startswith("| ") and ("met" in ln or "missed" in ln)]
    assert len(rows) >= 6


def test_the_bench_covers_every_regime():
    """Its default regimes are the registry's list (a new regime is benchmarked without touching the bench)."""
    from dataclasses import fields

    from ablate.bench.config import BenchConfig
    from ablate.refs import REGISTRY, regime_names

    default = next(f for f in fields(BenchConfig) if f.name == "regimes").default_factory()
    assert default == regime_names("all") and sorted(default) == sorted(REGISTRY)
    assert default[0] == "full"  # the ratios' denominator first


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, says",
    [
        (["model=tiny", "regimes=[full,int3]"], "int3"),
        # the CLI's source check, before any model loads (not a from_pretrained traceback)
        (["model=hf", "model.name_or_path=/nonexistent/folder", "regimes=[full]"], "no such folder"),
    ],
)
def test_bench_bad_input_is_one_line(tmp_path, args, says):
    res = subprocess.run(
        [sys.executable, "-m", "ablate.bench", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and says in res.stderr


def test_bench_help_lists_its_settings_and_runs_nothing(capsys):
    from ablate.bench.__main__ import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m ablate.bench") and "  repeats=5" in out and "model=tiny" in out
