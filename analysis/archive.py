"""``python -m analysis archive``: the part of a sweep folder a report is computed from, copied where it can be
committed (``reports/<name>/runs/``), so that the report regenerates from the repository alone.

Copied per job: ``config.yaml``, ``summary.json``, ``metrics.jsonl`` and ``samples.jsonl`` (the final evaluation's
per-sample values); per sweep: Hydra's ``multirun.yaml`` (the sweep's command). Never copied: checkpoints, saved
policies, logs, W&B files. Jobs without a ``summary.json`` (still running, killed) are left out and counted.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from ablate.tracking.run_dir import CONFIG_FILE, METRICS_FILE, SAMPLES_FILE, SUMMARY_FILE

JOB_FILES = (CONFIG_FILE, SUMMARY_FILE, METRICS_FILE, SAMPLES_FILE)
SWEEP_FILES = ("multirun.yaml",)


@dataclass
class Archived:
    jobs: int
    skipped: list[str]  # jobs left out: no summary.json yet
    bytes: int


def archive(folders: list[Path], out: Path) -> Archived:
    """Copy each sweep folder's report inputs to ``out/<folder name>/``; an existing copy is replaced whole."""
    from ablate.status import job_dirs

    names = [f.resolve().name for f in folders]
    if len(set(names)) != len(names):
        raise ValueError(f"two sweep folders with one name: {', '.join(names)}")
    jobs, skipped, size = 0, [], 0
    for folder, name in zip(folders, names):
        if not folder.is_dir():
            raise FileNotFoundError(f"no such folder: {folder}")
        dest = out / name
        tmp = out / f".{name}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for f in SWEEP_FILES:
            if (folder / f).is_file():
                size += _copy(folder / f, tmp / f)
        for job in job_dirs(folder):
            rel = job.relative_to(folder)
            if not (job / SUMMARY_FILE).is_file():
                skipped.append(f"{name}/{rel}")
                continue
            for f in JOB_FILES:
                if (job / f).is_file():
                    size += _copy(job / f, tmp / rel / f)
            jobs += 1
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    return Archived(jobs=jobs, skipped=skipped, bytes=size)


def _copy(src: Path, dst: Path) -> int:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return dst.stat().st_size


def reproduce_lines(sweeps: list[dict], out: Path) -> list[str]:
    """The Reproduce block's commands before the report's own: each sweep's command, and, for the folders it reads
    as archived copies (``reports/<name>/runs/<sweep>``: this report's or another's), the ``archive`` step from
    the sweeps' default folders (``runs/sweeps/<sweep>``, where the presets write) to those copies."""
    lines = [s["command"] for s in sweeps if s.get("command")] or ["# (sweep command not recorded)"]
    folders = [Path(s["path"]) for s in sweeps]
    archives: dict[Path, list[str]] = {}
    for f in folders:
        if f.parent.name == "runs" and (f.parent == out / "runs" or f.parent.parent.parent == out.parent):
            archives.setdefault(f.parent, []).append(f.name)
    if folders and len(archives) and sum(map(len, archives.values())) == len(folders):
        for dest, names in archives.items():
            lines.append("python -m analysis archive " + " ".join(f"runs/sweeps/{n}" for n in names) + f" --out {dest}")
    return lines
