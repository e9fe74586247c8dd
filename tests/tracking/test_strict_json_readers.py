"""Strict JSON in run folders: every reader of ``summary.json`` (the resume decision, ``ablate.status``, the
sweep's final line, the bench's peak-memory reader) loads a strict file (``null`` + reason) and an older file
with ``NaN`` tokens to the same numbers, NaN as a float."""

import json
import math
from pathlib import Path

from omegaconf import OmegaConf

from ablate.tracking.resume import decide
from ablate.tracking.run_dir import SUMMARY_KEYS, RunFolder

NAN_KEYS = ("kl_approx", "ref_ms_per_step", "peak_rss_train_bytes")


def _summary() -> dict[str, object]:
    s: dict[str, object] = {k: 0.5 for k in SUMMARY_KEYS}
    s.update(status="finished", steps=3, peak_rss_bytes=2.0e9, reason="")
    s.update({k: float("nan") for k in NAN_KEYS})
    s["nan_reasons"] = {k: f"{k} cannot exist here" for k in NAN_KEYS}
    return s


def _write_both(root: Path) -> tuple[RunFolder, RunFolder]:
    """The same summary in a strict file (as written now) and with NaN tokens (as older runs wrote it)."""
    cfg = OmegaConf.create({"seed": 0})
    new, old = RunFolder(root / "new"), RunFolder(root / "old")
    for folder in (new, old):
        folder.write_config(cfg)
    new.write_summary(_summary())
    old.summary_path.write_text(json.dumps(_summary(), indent=2))
    assert "null" in new.summary_path.read_text() and "NaN" in old.summary_path.read_text()
    return new, old


def _nan_floats(s: dict) -> bool:
    return all(isinstance(s[k], float) and math.isnan(s[k]) for k in NAN_KEYS)


def test_resume_decision_gives_the_finished_summary_with_nan(tmp_path):
    new, old = _write_both(tmp_path)
    cfg = OmegaConf.create({"seed": 0})
    a, b = decide(new, cfg).finished, decide(old, cfg).finished
    assert a is not None and b is not None and _nan_floats(a) and _nan_floats(b)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_status_prints_the_same_line_for_both(tmp_path, capsys):
    from ablate.status import main

    _write_both(tmp_path)
    assert main([str(tmp_path)]) == 0
    header, line_new, line_old = capsys.readouterr().out.splitlines()
    assert line_new.removesuffix("new") == line_old.removesuffix("old") and "nan" in line_new.split()


def test_sweep_final_line_reads_both(tmp_path):
    from ablate.sweep.report import final_line, job_statuses

    _write_both(tmp_path / "a")
    assert sorted(job_statuses(tmp_path)) == [("finished", "a/new", ""), ("finished", "a/old", "")]
    assert final_line(tmp_path)[2] == 0


def test_bench_peak_memory_reader_gives_nan_floats(tmp_path):
    from ablate.bench.peak_memory import read_peaks

    new, old = _write_both(tmp_path)
    (whole_new, train_new), (whole_old, train_old) = read_peaks(new.summary_path), read_peaks(old.summary_path)
    assert whole_new == whole_old == 2.0e9 and math.isnan(train_new) and math.isnan(train_old)
