"""The real ``python -m ablate`` entry: bad input gets one line and exit code 2 exactly as ``main()`` in-process
gives it (the battery of bad input is in tests/test_cli_errors.py); sweep expansion; config discovery."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ablate.cli import _job_overrides
from tests.conftest import REPO, run_cli
from tests.test_cli_errors import assert_one_line, run_main  # noqa: F401  (run_main is a fixture)


@pytest.mark.slow
def test_python_m_ablate_prints_what_main_prints(run_main, tmp_path):  # noqa: F811
    """The issue's case: a missing folder for model=hf traced from huggingface_hub after loading started."""
    args = ["model=hf", "model.name_or_path=/nonexistent/folder"]
    in_process = assert_one_line(*run_main(*args), "model.name_or_path=/nonexistent/folder: no such folder")
    res = run_cli(*args, cwd=tmp_path, timeout=120)
    assert assert_one_line(res.returncode, res.stderr, "") == in_process
    assert not (tmp_path / "runs").exists()


def test_a_package_missing_at_import_is_one_line(tmp_path):
    """Without torch (hidden from the import system) composing fails on an import: named, not traced."""
    code = (
        "import sys; sys.modules['torch'] = None; sys.argv = ['ablate', 'model=tiny']\n"
        "from ablate.cli import main; main()\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert_one_line(
        res.returncode,
        res.stderr,
        "missing package 'torch' (needed for everything); install it with: pip install torch==2.13.0",
    )
    assert not (tmp_path / "runs").exists()


def test_sweep_expansion_covers_every_job():
    jobs = _job_overrides(["-m", "ref=full", "seed=0,1,2", "algo.beta=0.1,0.2"])
    assert len(jobs) == 6
    assert ["ref=full", "seed=2", "algo.beta=0.2"] in jobs
    assert _job_overrides(["seed=1"]) == [["seed=1"]]  # without -m: one job (several values are refused)


@pytest.mark.slow
def test_conf_is_found_from_another_directory(tmp_path):
    res = run_cli("model=tiny", "--cfg", "job", cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "name: tiny" in res.stdout


def test_wheel_ships_the_configs(tmp_path):
    """A non-editable install finds conf/ inside the package: the wheel must carry it."""
    pytest.importorskip("hatchling")
    import zipfile

    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    (wheel,) = tmp_path.glob("ablate-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "ablate/conf/config.yaml" in names
    assert "ablate/conf/ref/full.yaml" in names
    assert "ablate/conf/hydra/launcher/parallel.yaml" in names
    assert "ablate/sweeps/regimes.yaml" in names
    assert "ablate/tasks/data/heldout.txt" in names
    assert any(n.startswith("analysis/") for n in names)
