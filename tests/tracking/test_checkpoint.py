"""Checkpoint bookkeeping and the resume decision, on plain folders (no model)."""

import json

from omegaconf import OmegaConf

from ablate.tracking import checkpoint
from ablate.tracking.resume import decide
from ablate.tracking.run_dir import SUMMARY_KEYS, RunFolder


def _ckpt(root, step, complete=True):
    d = root / "checkpoints" / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"weights")
    if complete:
        (d / checkpoint.MARKER).write_text(json.dumps({"steps": step}))
    return d


def test_latest_skips_a_checkpoint_interrupted_while_being_written(tmp_path):
    _ckpt(tmp_path, 10)
    _ckpt(tmp_path, 20, complete=False)  # killed mid-save: no marker
    path, state = checkpoint.latest(tmp_path)
    assert path.name == "checkpoint-10" and state == {"steps": 10}


def test_complete_writes_the_marker_last_and_prunes_the_others(tmp_path):
    _ckpt(tmp_path, 10)
    new = _ckpt(tmp_path, 20, complete=False)
    checkpoint.complete(new, {"steps": 20})
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["checkpoint-20"]
    assert checkpoint.latest(tmp_path)[1] == {"steps": 20}


def _summary(status):
    s = {k: float("nan") for k in SUMMARY_KEYS}
    s.update(status=status, steps=3)
    return s


def test_decide_skip_resume_or_archive(tmp_path):
    cfg = OmegaConf.create({"seed": 0, "algo": {"beta": 0.1}})
    folder = RunFolder(tmp_path / "job")
    assert decide(folder, cfg).finished is None  # empty folder: start

    folder.write_config(cfg)
    folder.write_summary(_summary("finished"))
    assert decide(folder, cfg).finished["status"] == "finished"  # same config, finished: skip

    folder.write_summary(_summary("failed"))
    _ckpt(folder.path, 2)
    d = decide(folder, cfg)
    assert d.finished is None and d.checkpoint[0].name == "checkpoint-2"  # failed with a checkpoint: resume

    other = OmegaConf.create({"seed": 0, "algo": {"beta": 0.2}})
    d = decide(folder, other)  # another config: what is there is moved aside, nothing deleted
    assert d.finished is None and d.checkpoint is None
    moved = folder.path / "previous" / "1"
    assert (moved / "summary.json").is_file() and (moved / "checkpoints" / "checkpoint-2").is_dir()
    assert not folder.summary_path.exists() and not (folder.path / "checkpoints").exists()


def test_truncate_metrics_keeps_steps_up_to_the_checkpoint(tmp_path):
    folder = RunFolder(tmp_path)
    for step in (0, 1, 2, 3):
        folder.log_metrics(step, {"train/loss": float(step)})
    folder.truncate_metrics(2)
    assert [r["step"] for r in folder.read_metrics()] == [0, 1, 2]


def test_save_policy_by_steps_by_time_and_never_the_last_step_unless_kept():
    from ablate.tracking.checkpoint import SavePolicy

    steps = SavePolicy(interval=2, minutes=0, last=0.0)
    assert [s for s in range(1, 7) if steps.due(s, 6, now=1e9)] == [2, 4]  # not 6: the last step
    timed = SavePolicy(interval=0, minutes=1.0, last=100.0)
    assert not timed.due(1, 6, now=159.0) and timed.due(1, 6, now=160.0)
    timed.saved(now=160.0)
    assert not timed.due(2, 6, now=219.0) and timed.due(2, 6, now=220.0)
    assert not timed.due(6, 6, now=1e9)  # a finished job's summary is its result
    kept = SavePolicy(interval=0, minutes=0, keep=True)
    assert kept.due(6, 6) and not kept.due(5, 6) and kept.ever
    assert not SavePolicy(interval=0, minutes=0).ever
