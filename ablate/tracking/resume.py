"""What to do with a run folder that already has something in it: the decision behind resumable sweeps.

- same resolved config, ``finished`` or ``diverged`` (a result, not an accident): nothing to do;
- same config, a complete checkpoint: continue from it (an interrupted or failed job);
- anything else (another config, no checkpoint): start afresh, after moving what is there to
  ``previous/<n>/``, so nothing is lost.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ablate.tracking import checkpoint
from ablate.tracking.run_dir import RunFolder
from ablate.tracking.schema import FINAL

log = logging.getLogger(__name__)

# what a job writes into its folder (Hydra's own .hydra/ and log file belong to the current attempt)
JOB_FILES = (
    "config.yaml",
    "metrics.jsonl",
    "samples.jsonl",
    "summary.json",
    "error.txt",
    "wandb",
    "policy",
    checkpoint.CHECKPOINTS,
)


@dataclass
class Decision:
    finished: dict[str, Any] | None = None  # the summary of a job that needs no work
    checkpoint: tuple[Path, dict[str, Any]] | None = None  # where to resume from


def _summary(folder: RunFolder) -> dict[str, Any] | None:
    try:
        return folder.read_summary()
    except (json.JSONDecodeError, OSError):
        return None


def archive(folder: RunFolder) -> Path | None:
    """Move the job files in ``folder`` to ``previous/<n>/``; returns where, or None if there were none."""
    present = [folder.path / name for name in JOB_FILES if (folder.path / name).exists()]
    if not present:
        return None
    n = 1
    while (folder.path / "previous" / str(n)).exists():
        n += 1
    dest = folder.path / "previous" / str(n)
    dest.mkdir(parents=True)
    for p in present:
        shutil.move(str(p), dest / p.name)
    log.warning("%s held another attempt; moved it to %s", folder.path, dest)
    return dest


def decide(folder: RunFolder, raw: DictConfig) -> Decision:
    same = folder.config_path.is_file() and folder.config_path.read_text() == OmegaConf.to_yaml(raw, resolve=True)
    if same:
        summary = _summary(folder)
        if summary is not None and summary.get("status") in FINAL:
            return Decision(finished=summary)
        found = checkpoint.latest(folder.path)
        if found is not None:
            return Decision(checkpoint=found)
    archive(folder)
    return Decision()
