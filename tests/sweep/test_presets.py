"""Sweep presets: every one composes into valid jobs, combines with others and the command line, and its
W&B sweep file is the one generated from it (no drift)."""

import pandas as pd
import pytest
import yaml

from ablate import presets
from ablate.cli import _job_overrides, preflight
from ablate.errors import ConfigError
from ablate.paths import sweeps_dir
from ablate.refs import regime_names
from ablate.sweep.wandb_file import render, wandb_sweep
from ablate.workers import workers
from tests.conftest import run_cli

NAMES = sorted(presets.preset_files())


def test_the_presets_the_issue_names_exist():
    assert {"regimes", "algos", "beta", "ema", "topk", "seeds"} <= set(NAMES)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_every_preset_job_composes_and_validates(name):
    n = preflight(["-m", f"+sweep={name}", "model=tiny"])
    grid = presets.grid([name])
    expected = 1
    for spec in grid.values():
        expected *= len(spec.split(","))
    assert n == expected > 1


def test_presets_combine_and_the_command_line_wins():
    assert len(_job_overrides(["-m", "+sweep=[regimes,seeds]"])) == 3 * len(regime_names("sweep"))  # 3 seeds
    jobs = _job_overrides(["-m", "+sweep=regimes", "ref=full,none"])  # a command-line sweep replaces the grid's
    assert sorted(j[0] for j in jobs) == ["ref=full", "ref=none"]
    assert all("+sweep=regimes" in j for j in jobs)
    # a preset's first seed alone (the report queue runs seed 0 of every report first): the same jobs, a third
    first = _job_overrides(["-m", "+sweep=report_grpo_kl", "seed=0"])
    every = _job_overrides(["-m", "+sweep=report_grpo_kl"])
    assert len(first) == 9 and len(every) == 27
    assert {frozenset(j) for j in first} == {frozenset(j) for j in every if "seed=0" in j}


@pytest.mark.parametrize("name", NAMES)
def test_each_presets_grid_is_the_one_hydra_composes(name):
    """The grid the pre-flight checks and the W&B file read (presets.grid) is Hydra's own, key order included (the
    order the basic sweeper runs the jobs in), also for a preset that extends another."""
    from ablate.compose import compose_raw

    hydra = compose_raw(f"+sweep={name}", "model=tiny", hydra=True).hydra
    assert {str(k): str(v) for k, v in hydra.sweeper.params.items()} == presets.grid([name])
    assert list(hydra.sweeper.params) == list(presets.grid([name]))


def test_a_preset_extends_another_and_wins_on_its_keys():
    from tests.conftest import compose

    assert presets.parents(presets.load("report_drift")) == ["drift_calibration"]
    grid = presets.grid(["report_drift"])
    assert (grid["algo"], grid["algo.reward"], grid["algo.learning_rate"]) == ("grpo", "learned", "3e-05")
    assert list(grid)[-1] == "seed" and "none" not in grid["ref"]
    cfg = compose("+sweep=report_drift", "algo=grpo", "ref=int8")
    assert (cfg.algo.max_steps, cfg.model.precision, cfg.eval.interval) == (160, "fp32", 20)
    assert "algo.max_steps=160" in presets.fixed_overrides("report_drift")


def test_report_drift_runs_pool_with_the_calibrations_in_one_condition():
    """reports/drift reads drift_calibration's full runs at beta 0.1 (and its none runs, which use no beta) as its
    own: every setting the analysis counts as a condition (all but the reference, seed, threads, plan ...) is the
    same in both presets' jobs at lr 3e-5 and beta 0.1."""
    from omegaconf import OmegaConf

    from analysis.load import NOT_A_CONDITION
    from tests.conftest import compose

    def settings(preset: str, *extra: str) -> dict:
        cfg = compose(
            f"+sweep={preset}", "algo=grpo", "algo.reward=learned", "algo.learning_rate=3e-5", "ref=full", *extra
        )
        flat = pd.json_normalize(OmegaConf.to_container(cfg, resolve=False), sep=".").iloc[0].to_dict()
        return {k: v for k, v in flat.items() if not f"cfg.{k}".startswith(NOT_A_CONDITION)}

    assert settings("report_drift") == settings("drift_calibration", "algo.beta=0.1")
    assert settings("report_drift") != settings("drift_calibration")  # the calibration's own beta is 0.04


def test_a_preset_that_extends_itself_is_one_line(tmp_path, monkeypatch):
    from ablate.errors import ConfigError

    (tmp_path / "a.yaml").write_text("defaults:\n  - b\n  - _self_\n")
    (tmp_path / "b.yaml").write_text("defaults:\n  - a\n")
    monkeypatch.setattr(presets, "sweeps_dir", lambda: tmp_path)
    with pytest.raises(ConfigError, match="sweep 'a' extends itself: a -> b -> a"):
        presets.load("a")


def test_a_preset_fixes_its_settings():
    from tests.conftest import compose

    cfg = compose("+sweep=ema", "model=tiny")
    assert cfg.ref.name == "ema"
    cfg = compose("+sweep=report_dpo", "ref=int8")
    assert (cfg.algo.max_steps, cfg.algo.learning_rate, cfg.eval.interval, cfg.ref.name) == (20, 1e-5, 0, "int8")


@pytest.mark.parametrize("name", NAMES)
def test_wandb_sweep_file_matches_its_preset(name):
    f = sweeps_dir() / "wandb" / f"{name}.yaml"
    assert f.read_text() == render([name]), f"regenerate: python -m ablate.sweep wandb {name} --write"
    spec = yaml.safe_load(f.read_text())
    assert spec["method"] == "grid"
    assert f"+sweep={name}" in spec["command"] and "${args_no_hyphens}" in spec["command"]
    n = 1
    for p in spec["parameters"].values():
        n *= len(p["values"])
    assert n == len(_job_overrides(["-m", f"+sweep={name}"]))


def test_wandb_sweep_values_are_typed():
    params = wandb_sweep(["ema"])["parameters"]
    assert params["ref.alpha"]["values"] == [0.1, 0.3, 0.6, 1.0]
    assert params["ref.tau"]["values"] == [1, 5, 10, 20]


def test_a_sweep_w_and_b_cannot_list_is_one_line():
    from ablate.sweep.wandb_file import _values

    assert _values("seed", "range(0,3)") == [0, 1, 2]
    with pytest.raises(ConfigError, match=r"^algo.learning_rate=interval\(1e-5,1e-4\): a sweep W&B cannot list"):
        _values("algo.learning_rate", "interval(1e-5,1e-4)")


@pytest.mark.slow
def test_unknown_preset_is_one_line(tmp_path):
    res = run_cli("-m", "+sweep=nope", "model=tiny", cwd=tmp_path, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "ablate: error: unknown sweep 'nope' (choose from: " + ", ".join(NAMES) + ")"
    ]


def test_workers_respect_cores_and_memory():
    assert workers(1, 0.1) >= 1
    assert workers(10_000, 1) == 1  # more threads than cores: still one worker
    assert workers(1, 10_000_000) == 1  # more memory than the machine: still one
    assert workers(1, 0.1) >= workers(2, 0.1)
    assert workers(None, 0.1) == workers(2, 0.1)  # threads=null: two cores a job
