"""Sweeps on model=tiny through the real launchers: every job its own W&B offline run in one group, a
rerun does no training, and a failing or diverging job is recorded while the others finish."""

import re

import pytest

from ablate.tracking.wandb_offline import offline_runs, read_offline_run
from tests.conftest import LONG_NAME_TAGS, TINY_FAST, run_cli

# TINY_FAST without logger=none: these tests read the W&B offline runs; no fidelity audit (half a tiny job's evaluation
# time, and not what these tests are about)
FAST = [o for o in TINY_FAST if not o.startswith("logger=")] + [
    "threads=1",
    "logger.mode=offline",
    "eval.fidelity=false",
]
TWO = ["ref=ema,none"]  # a stateful regime and a reference-free one (two jobs: one round of the 2 workers)


def _final_line(res) -> str:
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("ablate: sweep ")]
    assert lines, res.stdout[-2000:] + res.stderr[-2000:]
    return lines[-1]


def _check_two(sweep, res):
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert _final_line(res).endswith("2 jobs: 2 finished, 0 failed, 0 diverged, 0 unfinished")
    runs = [read_offline_run(p) for p in offline_runs(sweep)]
    assert len(runs) == 2
    assert {r.group for r in runs} == {sweep.name}  # the sweep's id
    assert {r.job_type for r in runs} == {"dpo"}
    assert all(r.exit_code == 0 and r.summary["status"] == "finished" for r in runs)
    assert sorted(r.name for r in runs) == sorted({r.name for r in runs})  # names: each job's overrides
    assert {t for r in runs for t in r.tags} >= {"ref=ema", "ref=none", "algo=dpo"}
    assert all(r.config["algo/name"] == "dpo" and "ref/name" in r.config for r in runs)  # flattened config
    return runs


@pytest.mark.slow
def test_joblib_sweep_then_a_rerun_does_no_training(tmp_path):
    sweep = tmp_path / "sweep_joblib"
    args = [
        "-m",
        *FAST,
        *TWO,
        LONG_NAME_TAGS,
        "hydra/launcher=parallel",
        "hydra.launcher.n_jobs=2",
        f"hydra.sweep.dir={sweep}",
    ]
    _check_two(sweep, run_cli(*args, cwd=tmp_path, timeout=900))
    assert all(len(p.parent.name) == 255 for p in sweep.rglob("summary.json"))  # cut to fit, found again below
    summaries = {p: p.stat().st_mtime_ns for p in sweep.rglob("summary.json")}
    assert len(summaries) == 2

    again = run_cli(*args, cwd=tmp_path, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _final_line(again).endswith("2 jobs: 2 finished, 0 failed, 0 diverged, 0 unfinished")
    assert {p: p.stat().st_mtime_ns for p in sweep.rglob("summary.json")} == summaries  # untouched
    assert len(offline_runs(sweep)) == 2  # no new W&B run: nothing was trained
    logs = "".join(p.read_text() for p in sweep.rglob("ablate.log"))
    assert logs.count("already finished, not rerun") == 2


@pytest.mark.slow
def test_submitit_local_sweep(tmp_path):
    pytest.importorskip("submitit")
    sweep = tmp_path / "sweep_submitit"
    res = run_cli(
        "-m",
        *FAST,
        *TWO,
        LONG_NAME_TAGS,
        "hydra/launcher=submitit",
        "hydra.launcher.cpus_per_task=1",
        "hydra.launcher.mem_gb=2",
        "hydra.launcher.timeout_min=15",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
        timeout=900,
    )
    _check_two(sweep, res)


@pytest.mark.slow
def test_failed_and_diverged_jobs_are_recorded_and_the_sweep_goes_on(tmp_path):
    garbage = tmp_path / "not_a_model"
    garbage.mkdir()
    (garbage / "config.json").write_text("{ not json")
    sweep = tmp_path / "sweep_faults"
    res = run_cli(
        "-m",
        *FAST,
        "model=tiny,hf",
        f"model.name_or_path={garbage}",
        "divergence.max_kl=1e-9,null",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
        timeout=900,
    )
    assert res.returncode == 1
    assert _final_line(res).endswith("4 jobs: 1 finished, 2 failed, 1 diverged, 0 unfinished")
    assert re.search(r"diverged: .*model=tiny.*\(true KL .* > divergence.max_kl=1e-09 at step 2\)", res.stdout)
    runs = {r.name: r for r in map(read_offline_run, offline_runs(sweep))}
    assert len(runs) == 4
    status = {name: (r.summary["status"], r.exit_code) for name, r in runs.items()}
    assert sorted(status.values()) == [("diverged", 1), ("failed", 1), ("failed", 1), ("finished", 0)]
    for d in sweep.glob("*model=hf*"):
        assert (d / "error.txt").is_file()
