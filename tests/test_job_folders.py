"""ablate.job_folders: a sweep's job folders stay within a file name's length, naming what differs between jobs."""

from __future__ import annotations

from ablate.compose import compose_raw
from ablate.job_folders import NAME_MAX, dirname, folder_overrides

EXCLUDE = ["hydra.run.dir", "hydra.sweep.dir", "out_dir", "sweep"]
LONG = [f"task.path={'x' * 120}.jsonl", f"model.name_or_path={'y' * 120}", "+sweep=drift"]


def test_hydra_s_own_names_are_kept_when_they_fit():
    jobs = [["ref=full", "seed=0"], ["ref=none", "seed=0"]]
    assert dirname(jobs[0], set(EXCLUDE)) == "ref=full,seed=0"
    assert folder_overrides(jobs, EXCLUDE) == ([], "")


def test_too_long_names_keep_what_differs_and_hydra_takes_the_override():
    jobs = [[*LONG, f"ref={r}", f"seed={s}"] for r in ("full", "none") for s in (0, 1)]
    assert len(dirname(jobs[0], set(EXCLUDE)).encode()) > NAME_MAX
    extra, said = folder_overrides(jobs, EXCLUDE)
    assert said.startswith("the jobs' folder names would run to ") and "(ref=full,seed=0, ...)" in said
    keep = list(compose_raw(*extra, hydra=True).hydra.job.config.override_dirname.exclude_keys)
    assert keep == [*EXCLUDE, "model.name_or_path", "task.path"]
    assert sorted(dirname(job, set(keep)) for job in jobs) == [
        "ref=full,seed=0",
        "ref=full,seed=1",
        "ref=none,seed=0",
        "ref=none,seed=1",
    ]


def test_what_differs_too_long_or_nothing_at_all_names_the_folders_by_number():
    varying = [[f"task.path={c * 300}.jsonl"] for c in "ab"]
    one_job = [LONG]
    for jobs in (varying, one_job):
        extra, said = folder_overrides(jobs, EXCLUDE)
        assert extra == ["hydra.sweep.subdir=job_${hydra.job.num}"] and "(job_0, ...)" in said
        hydra = compose_raw(*extra, hydra=True).hydra
        assert hydra.sweep._get_node("subdir")._value() == "job_${hydra.job.num}"


def test_a_path_s_slashes_make_folders_each_name_within_the_limit():
    jobs = [[f"task.path=/{'d' * 200}/{'e' * 200}.jsonl", f"ref={r}"] for r in ("full", "none")]
    assert folder_overrides(jobs, EXCLUDE) == ([], "")


def test_the_names_are_the_ones_hydra_gives():
    """The contract with Hydra this module restates: a job's folder name (``hydra.job.override_dirname``)."""
    for job in (["ref=int8", "seed=1", "+sweep=regimes", "algo.beta=0.3", "model=tiny"], ["~logger", "ref=ema"]):
        hydra = compose_raw(*job, hydra=True).hydra
        assert dirname(job, set(hydra.job.config.override_dirname.exclude_keys)) == hydra.job.override_dirname
