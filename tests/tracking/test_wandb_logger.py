"""Tests for ablate.tracking.wandb_logger using real wandb in offline mode."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from ablate.errors import MissingAsset
from ablate.tracking import wandb_offline
from ablate.tracking.wandb_logger import NullLogger, WandbLogger, flatten_config
from ablate.tracking.wandb_offline import OfflineRun, read_offline_run


@pytest.fixture(autouse=True)
def _wandb_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_PROJECT", "WANDB_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")


def _finished(wandb_file: Path, timeout: float = 5.0) -> OfflineRun:
    """The run as its transaction log holds it, once the exit record is there (wandb-core flushes asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        run = read_offline_run(wandb_file)
        if run.exit_code is not None or time.monotonic() > deadline:
            return run
        time.sleep(0.05)


def test_offline_run_lifecycle(tmp_path: Path) -> None:
    log = WandbLogger(
        project="ablate-test",
        group="g",
        job_type="train",
        name="r1",
        tags=["t"],
        dir=tmp_path / "wb",
        config={"lr": np.float32(0.5), "model": {"n": 2}},
    )
    assert log.run_dir is None and not log.active
    log.start()
    log.log({"loss": np.float32(1.0), "kl": float("nan")}, step=0)
    log.log({"loss": 0.5}, step=1)
    log.log_table("samples", [{"prompt": "a", "reward": 1.0}, {"prompt": "b", "extra": 2}])
    log.summary({"win_rate": np.float64(0.6), "status": "finished"})
    log.finish()
    log.finish()  # idempotent
    assert not log.active and log.exit_code == 0
    run_dir = log.run_dir
    assert run_dir is not None and run_dir.is_dir()
    assert run_dir.name.startswith("offline-run-")
    assert run_dir.parent == (tmp_path / "wb" / "wandb").resolve()
    files = list(run_dir.glob("run-*.wandb"))
    assert len(files) == 1
    run = _finished(files[0])
    assert run.exit_code == 0
    assert (run.project, run.group, run.job_type, run.name, run.tags) == ("ablate-test", "g", "train", "r1", ["t"])
    assert {k: v for k, v in run.config.items() if k != "_wandb"} == {"lr": 0.5, "model": {"n": 2}}
    assert [h["loss"] for h in run.history] == [1.0, 0.5] and run.summary["win_rate"] == 0.6
    assert list(run_dir.glob("files/media/table/samples_*.table.json"))


def test_context_manager_failure_marks_failed_and_reraises(tmp_path: Path) -> None:
    log = WandbLogger(project="ablate-test", dir=tmp_path)
    with pytest.raises(RuntimeError, match="boom"):
        with log:
            log.log({"loss": 1.0}, step=0)
            raise RuntimeError("boom")
    assert not log.active and log.exit_code == 1
    assert log.run_dir is not None
    (wandb_file,) = log.run_dir.glob("run-*.wandb")
    assert _finished(wandb_file).exit_code == 1


def test_sequential_runs_in_one_process(tmp_path: Path) -> None:
    dirs = []
    for i in range(2):
        with WandbLogger(project="ablate-test", dir=tmp_path, name=f"r{i}") as log:
            log.log({"x": i}, step=0)
        dirs.append(log.run_dir)
    assert dirs[0] != dirs[1]
    assert all(d is not None and list(d.glob("run-*.wandb")) for d in dirs)


def test_log_before_start_raises(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="start"):
        WandbLogger(project="p", dir=tmp_path).log({"a": 1.0}, step=0)


@pytest.mark.parametrize("mode", ["offlne", "shared", ""])
def test_invalid_mode(mode: str) -> None:
    with pytest.raises(ValueError, match="mode"):
        WandbLogger(project="p", mode=mode)


def test_default_mode_is_offline() -> None:
    assert WandbLogger(project="p").mode == "offline"


def test_null_logger_interface() -> None:
    public = {n for n in dir(WandbLogger) if not n.startswith("_") or n in ("__enter__", "__exit__")}
    public -= {"exit_code"}
    assert public <= set(dir(NullLogger))
    with pytest.raises(KeyError):
        with NullLogger(project="p") as log:
            log.log({"a": 1.0}, step=0)
            log.log_table("t", [{"a": 1}])
            log.summary({"a": 1})
            assert log.run_dir is None
            raise KeyError("x")


def test_flatten_config() -> None:
    cfg = {"model": {"name": "gpt2", "lora": {"r": np.int64(8)}}, "lr": 1e-5, "empty": {}}
    assert flatten_config(cfg) == {"model/name": "gpt2", "model/lora/r": 8, "lr": 1e-5, "empty": {}}
    assert flatten_config({"a": {"b": 1}}, sep=".") == {"a.b": 1}
    assert type(flatten_config(cfg)["model/lora/r"]) is int


def test_the_installed_wandb_has_every_field_the_offline_reader_reads():
    assert wandb_offline.problems() == []
    wandb_offline.check()


def test_a_schema_without_a_field_the_reader_reads_is_one_line(monkeypatch):
    # a wandb whose run record renamed run_group
    monkeypatch.setitem(wandb_offline._SCHEMA, "RunRecord", ("run_id", "group_name"))
    with pytest.raises(MissingAsset) as e:
        read_offline_run("/nonexistent")  # checked before any file is read
    line = str(e.value)
    assert "\n" not in line and line.startswith("wandb ") and "is incompatible with ablate" in line
    assert "RunRecord has no group_name" in line
