"""ablate.job_folders: a sweep's job folders keep Hydra's names where they fit a file name, and are cut to fit where
they do not, as a function of the job's own overrides."""

from __future__ import annotations

import subprocess
import sys

from omegaconf import OmegaConf

from ablate.compose import compose_raw
from ablate.job_folders import NAME_MAX, folder_name
from tests.conftest import LONG_NAME_TAGS


def test_a_name_that_fits_is_hydra_s():
    assert folder_name("algo.beta=0.3,ref=int8,seed=1") == "algo.beta=0.3,ref=int8,seed=1"
    assert folder_name("") == ""
    long_path = f"task.path=/{'d' * 200}/{'e' * 200}.jsonl"  # each part of the path fits: nested folders, as Hydra's
    assert folder_name(long_path) == long_path


def test_a_name_that_does_not_fit_is_cut_and_stays_distinct():
    names = [f"{'x' * 300},ref={r}" for r in ("full", "none")] + [f"task.path=/{'d' * 300}.jsonl,ref=full"]
    cut = [folder_name(n) for n in names]
    assert all(len(c.encode()) == NAME_MAX and "/" not in c for c in cut)
    assert cut[0].startswith("x" * 200) and len(set(cut)) == 3
    assert [folder_name(n) for n in names] == cut  # a rerun names them the same
    assert len(folder_name("é" * 200).encode()) <= NAME_MAX  # never a split character


def test_hydra_names_a_job_s_folder_through_it():
    short = compose_raw("ref=int8", "seed=1", hydra=True)
    assert OmegaConf.select(short, "hydra.sweep.subdir") == "ref=int8,seed=1"
    long = compose_raw("ref=int8", LONG_NAME_TAGS, hydra=True)
    name = OmegaConf.select(long, "hydra.sweep.subdir")
    assert len(name.encode()) == NAME_MAX and name == folder_name(long.hydra.job.override_dirname)


def test_importing_ablate_registers_the_resolver():
    """A launcher's worker process has the resolver once it imports ablate, as it does to unpickle its job."""
    code = "import ablate; from omegaconf import OmegaConf; print(OmegaConf.has_resolver('ablate_job_folder'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"
