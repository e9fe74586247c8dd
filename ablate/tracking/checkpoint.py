"""Resumable jobs: ``<run>/checkpoints/checkpoint-<step>/`` plus what ablate needs on top of the trainer's state.

:class:`SavePolicy` decides when (by steps and by wall time, never the last step unless kept).

The trainer (TRL's, or our PPO) writes its checkpoint folder (weights, optimiser, scheduler, RNG); then
:func:`complete` adds the regime's state (``reference.pt``: EMA / snapshot weights, cost counters) and,
last and atomically, ``ablate_state.json`` (evaluations so far, KL coefficient, wall time). A checkpoint
without that file was interrupted while being written and is never resumed from; older complete
checkpoints are pruned only after a newer one is complete, so a kill at any moment leaves one to use.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate.tracking.run_dir import atomic_write_json

CHECKPOINTS = "checkpoints"
MARKER = "ablate_state.json"
REFERENCE_STATE = "reference.pt"
_NAME = re.compile(r"^checkpoint-(\d+)$")


@dataclass
class SavePolicy:
    """When a job saves a checkpoint (``cfg.checkpoint``): every ``interval`` steps, and at the first step end
    after ``minutes`` of wall time since the attempt started or the last save; at the last step only to ``keep``
    it (a finished job's summary is its result, and its checkpoints are deleted)."""

    interval: int = 0
    minutes: float = 10.0
    keep: bool = False
    last: float = field(default_factory=time.monotonic)  # when the attempt started or last saved

    @classmethod
    def from_config(cls, ckpt) -> SavePolicy:
        return cls(interval=ckpt.interval, minutes=ckpt.minutes, keep=ckpt.keep)

    @property
    def ever(self) -> bool:
        """Whether this policy can save at all."""
        return bool(self.interval or self.minutes or self.keep)

    def due(self, step: int, max_steps: int, now: float | None = None) -> bool:
        if step >= max_steps:
            return self.keep
        if self.interval and step % self.interval == 0:
            return True
        now = time.monotonic() if now is None else now
        return self.minutes > 0 and now - self.last >= 60.0 * self.minutes

    def saved(self, now: float | None = None) -> None:
        self.last = time.monotonic() if now is None else now


def checkpoints_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / CHECKPOINTS


def _steps(out_dir: str | Path) -> list[tuple[int, Path]]:
    root = checkpoints_dir(out_dir)
    found = []
    if root.is_dir():
        for p in root.iterdir():
            m = _NAME.match(p.name)
            if m and p.is_dir():
                found.append((int(m.group(1)), p))
    return sorted(found)


def latest(out_dir: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest complete checkpoint and its ablate state, or None."""
    for _, path in reversed(_steps(out_dir)):
        marker = path / MARKER
        if marker.is_file():
            try:
                return path, json.loads(marker.read_text())
            except json.JSONDecodeError:  # cannot happen with atomic writes; treat as incomplete
                continue
    return None


def complete(path: Path, state: dict[str, Any], reference=None) -> None:
    """Finish a checkpoint the trainer just wrote, then drop every other one."""
    import torch

    if reference is not None:
        ref_state = reference.state_dict()
        if ref_state:
            tmp = path / (REFERENCE_STATE + ".tmp")
            torch.save(ref_state, tmp)
            tmp.replace(path / REFERENCE_STATE)
    atomic_write_json(path / MARKER, state)
    for _, other in _steps(path.parent.parent):  # <run>/checkpoints/checkpoint-N -> <run>
        if other != path:
            shutil.rmtree(other, ignore_errors=True)


def load_reference(path: Path, reference) -> None:
    import torch

    f = path / REFERENCE_STATE
    if f.is_file():
        reference.load_state_dict(torch.load(f, map_location="cpu", weights_only=True))


def remove_all(out_dir: str | Path) -> None:
    shutil.rmtree(checkpoints_dir(out_dir), ignore_errors=True)
