"""Thin Weights & Biases wrapper that defaults to offline mode.

Offline is the default because, without network, ``wandb.init`` either blocks
on a login prompt (no key) or hangs for minutes (key set). Runs are always
finished, also on failure (``exit_code=1``), since Hydra's joblib launcher
reuses worker processes and a dangling run would leak into the next job.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from ablate.tracking.run_dir import to_python

__all__ = ["MODES", "NullLogger", "WandbLogger", "flatten_config"]

MODES: tuple[str, ...] = ("offline", "online", "disabled")


def flatten_config(d: Mapping[str, Any], sep: str = "/") -> dict[str, Any]:
    """Flatten nested mappings: ``{"a": {"b": 1}} -> {"a/b": 1}``; values via ``to_python``."""
    out: dict[str, Any] = {}

    def _walk(prefix: str, node: Mapping[str, Any]) -> None:
        for key, value in node.items():
            name = f"{prefix}{sep}{key}" if prefix else str(key)
            if isinstance(value, Mapping) and value:
                _walk(name, value)
            else:
                out[name] = to_python(value)

    _walk("", to_python(d))
    return out


def _table_columns(rows: list[Mapping[str, Any]]) -> list[str]:
    """Union of row keys in first-seen order."""
    cols: dict[str, None] = {}
    for row in rows:
        for key in row:
            cols.setdefault(str(key), None)
    return list(cols)


class WandbLogger:
    """One W&B run; use as a context manager or call ``start``/``finish``."""

    def __init__(
        self,
        project: str,
        mode: str = "offline",
        group: str | None = None,
        job_type: str | None = None,
        name: str | None = None,
        tags: list[str] | None = None,
        entity: str | None = None,
        dir: str | os.PathLike[str] | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"wandb mode {mode!r} not in {MODES}")
        if not project:
            raise ValueError("wandb project must be a non-empty string")
        self.project = project
        self.mode = mode
        self.group = group
        self.job_type = job_type
        self.name = name
        self.tags = list(tags) if tags else None
        self.entity = entity
        self.dir = Path(dir).resolve() if dir is not None else None
        self.config = dict(config) if config else None
        self._run: Any = None
        self._run_dir: Path | None = None
        self.exit_code: int | None = None

    @property
    def active(self) -> bool:
        """True between ``start`` and ``finish``."""
        return self._run is not None

    @property
    def run_dir(self) -> Path | None:
        """Local run directory (``.../wandb/offline-run-*``); None if disabled or never started."""
        return self._run_dir

    def start(self) -> WandbLogger:
        """Init the run (finishing any other active run in this process)."""
        if self._run is not None:
            return self
        self.exit_code = None
        os.environ["WANDB_SILENT"] = "true"
        import wandb

        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
        run = wandb.init(
            project=self.project,
            entity=self.entity,
            group=self.group,
            job_type=self.job_type,
            name=self.name,
            tags=self.tags,
            dir=str(self.dir) if self.dir is not None else None,
            config=to_python(self.config) if self.config else None,
            mode=self.mode,
            reinit="finish_previous",
            settings=wandb.Settings(console="off"),
        )
        self._run = run
        if self.mode != "disabled":
            self._run_dir = Path(run.settings.sync_dir).resolve()
        return self

    def _require_run(self) -> Any:
        if self._run is None:
            raise RuntimeError("WandbLogger is not started; call start() first")
        return self._run

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Log scalar metrics at ``step``."""
        self._require_run().log(to_python(dict(metrics)), step=int(to_python(step)))

    def log_table(self, key: str, rows: list[Mapping[str, Any]], step: int | None = None) -> None:
        """Log rows (dicts) as a ``wandb.Table``; missing cells become None."""
        run = self._require_run()
        import wandb

        columns = _table_columns(rows)
        data = [[to_python(row.get(c)) for c in columns] for row in rows]
        table = wandb.Table(columns=columns, data=data)
        if step is None:
            run.log({key: table})
        else:
            run.log({key: table}, step=int(step))

    def summary(self, d: Mapping[str, Any]) -> None:
        """Set run summary entries."""
        run = self._require_run()
        for key, value in to_python(dict(d)).items():
            run.summary[key] = value

    def finish(self, failed: bool = False) -> None:
        """Finish the run (``exit_code=1`` if failed); no-op when not active."""
        run, self._run = self._run, None
        if run is not None:
            self.exit_code = 1 if failed else 0
            run.finish(exit_code=self.exit_code)

    def __enter__(self) -> WandbLogger:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if exc_type is None:
            self.finish(failed=False)
            return False
        try:
            self.finish(failed=True)
        except Exception as err:  # never mask the original exception
            warnings.warn(f"wandb finish failed: {err!r}", RuntimeWarning, stacklevel=2)
        return False


class NullLogger:
    """Logger with the WandbLogger interface that does nothing (logger=none)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._active = False

    @property
    def active(self) -> bool:
        return self._active

    @property
    def run_dir(self) -> Path | None:
        return None

    def start(self) -> NullLogger:
        self._active = True
        return self

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        pass

    def log_table(self, key: str, rows: list[Mapping[str, Any]], step: int | None = None) -> None:
        pass

    def summary(self, d: Mapping[str, Any]) -> None:
        pass

    def finish(self, failed: bool = False) -> None:
        self._active = False

    def __enter__(self) -> NullLogger:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self.finish(failed=exc_type is not None)
        return False
