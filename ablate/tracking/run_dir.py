"""Per-run output folder: resolved config, metrics log, samples and summary.

All whole-file writes are atomic (temp file in the same directory, fsync,
``os.replace``), so a killed job never leaves a half-written file.

``summary.json``, ``metrics.jsonl`` and ``samples.jsonl`` are strict JSON: a
value that is not a finite number (NaN, +inf, -inf) is written as ``null``.
The summary says why in ``nan_reasons`` (key -> reason; a non-finite value
that came without a reason gets one saying what it was), as does each line of
``metrics.jsonl`` (its own ``nan_reasons``). The readers here
(:func:`load_summary`, :meth:`RunFolder.read_metrics`) turn those nulls back
into NaN, or into the infinity the reason says it was, and still read
files of older runs that hold the non-standard ``NaN``/``Infinity``/``-Infinity``
tokens. W&B is given NaN as it is.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from ablate.tracking import schema
from ablate.tracking.schema import STATUSES

__all__ = [
    "SUMMARY_DOCS",
    "SUMMARY_KEYS",
    "STATUSES",
    "RunFolder",
    "atomic_write_json",
    "atomic_write_text",
    "load_summary",
    "metrics_from_json",
    "null_for_nonfinite",
    "strict_dumps",
    "summary_from_json",
    "to_python",
]

#: The keys every summary.json holds, and what each summary key measures (units: nats are summed over a
#: response, then averaged over responses; ``<key>_step0`` is the same figure at step 0, where the policy is the
#: SFT model): both read from the metric schema, ``ablate.tracking.schema``.
SUMMARY_KEYS: tuple[str, ...] = schema.required_keys()
SUMMARY_DOCS: dict[str, str] = schema.docs()

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
SUMMARY_FILE = "summary.json"
LOCK_FILE = ".lock"  # held (flock) by the process running the job: a second one on the same folder is refused


def _is_torch_tensor(value: Any) -> bool:
    """True for a torch.Tensor, without importing torch."""
    cls = type(value)
    return cls.__module__.startswith("torch") and hasattr(value, "detach")


def to_python(value: Any) -> Any:
    """Convert numpy/torch scalars and arrays (recursively) to plain Python.

    Scalars become ``int``/``float``/``bool``/``str``; arrays and multi-element
    tensors become lists; mappings and sequences are converted element-wise;
    ``Path`` becomes ``str``. Anything else is returned unchanged.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.item() if value.ndim == 0 else value.tolist()
    if _is_torch_tensor(value):
        t = value.detach().cpu()
        return t.item() if t.dim() == 0 else t.tolist()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if OmegaConf.is_config(value):
        return to_python(OmegaConf.to_container(value, resolve=True))
    if isinstance(value, Mapping):
        return {str(k): to_python(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_python(v) for v in value]
    return value


def _dumps(obj: Any, **kwargs: Any) -> str:
    """json.dumps with NaN/inf as the non-standard ``NaN`` tokens and unknown objects stringified."""
    return json.dumps(to_python(obj), allow_nan=True, default=str, **kwargs)


def null_for_nonfinite(value: Any) -> Any:
    """``value`` (plain Python, as :func:`to_python` gives it) with every NaN/inf float, at any depth, as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: null_for_nonfinite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [null_for_nonfinite(v) for v in value]
    return value


def strict_dumps(obj: Any, **kwargs: Any) -> str:
    """Strict JSON of ``obj``: NaN/inf written as ``null``, unknown objects stringified."""
    return json.dumps(null_for_nonfinite(to_python(obj)), allow_nan=False, default=str, **kwargs)


#: the reason a summary records for an infinity that came without one, by its sign; the reader restores the value
INFINITY_REASONS = {sign: f"{sign}inf (JSON has no infinity: written as null)" for sign in "+-"}


def nonfinite_reason(value: float) -> str:
    """The reason a summary records for a value that is not a finite number and came without one."""
    if math.isnan(value):
        return "NaN, with no reason given by the code that computed it"
    return INFINITY_REASONS["+" if value > 0 else "-"]


def _nonfinite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _line_with_reasons(record: dict[str, Any], reasons: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A ``metrics.jsonl`` record with ``nan_reasons`` for its values that are not finite numbers (and only
    those): the line's own where it has them, then ``reasons``, then :func:`with_reasons`' default."""
    given = {**(reasons or {}), **(record.get("nan_reasons") or {})}
    given = {k: why for k, why in given.items() if _nonfinite(record.get(k))}
    bare = {k: v for k, v in record.items() if k != "nan_reasons"}
    return with_reasons({**bare, "nan_reasons": given} if given else bare)


def with_reasons(summary: dict[str, Any]) -> dict[str, Any]:
    """``summary`` (plain Python) with a ``nan_reasons`` entry for every top-level value that is not a finite
    number; reasons already given are kept."""
    reasons = dict(summary.get("nan_reasons") or {})
    for key, value in summary.items():
        if _nonfinite(value):
            reasons.setdefault(key, nonfinite_reason(value))
    return {**summary, "nan_reasons": reasons} if reasons or "nan_reasons" in summary else summary


def _nan_for_null(record: dict[str, Any], keys: Any, infinite: Mapping[str, float] | None = None) -> dict[str, Any]:
    """``record`` with NaN in place of each null whose key is in ``keys`` (``infinite``: the keys whose null was an
    infinity, with its value)."""
    infinite = infinite or {}
    return {k: infinite.get(k, math.nan) if v is None and k in keys else v for k, v in record.items()}


def summary_from_json(text: str) -> dict[str, Any]:
    """A parsed ``summary.json``, strict (null) or older (``NaN`` tokens): the nulls of the schema's numeric
    keys and of the keys with a reason in ``nan_reasons`` come back as NaN, or as +inf/-inf where the reason is
    the one the writer gives an infinity (:data:`INFINITY_REASONS`). Raises JSONDecodeError when the text is not
    a JSON object."""
    summary = json.loads(text)
    if not isinstance(summary, dict):
        raise json.JSONDecodeError("summary.json does not hold a JSON object", text, 0)
    reasons = summary.get("nan_reasons")
    numeric = set(schema.report_columns()) | (set(reasons) if isinstance(reasons, Mapping) else set())
    return _nan_for_null(summary, numeric, _infinities(reasons))


def load_summary(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a ``summary.json`` (see :func:`summary_from_json`)."""
    return summary_from_json(Path(path).read_text(encoding="utf-8"))


_INFINITY_OF_REASON = {why: float(f"{sign}inf") for sign, why in INFINITY_REASONS.items()}


def _infinities(reasons: Any) -> dict[str, float]:
    """The keys whose reason is the writer's for an infinity, with that infinity."""
    if not isinstance(reasons, Mapping):
        return {}
    return {
        k: _INFINITY_OF_REASON[why] for k, why in reasons.items() if isinstance(why, str) and why in _INFINITY_OF_REASON
    }


def metrics_from_json(line: str) -> Any:
    """One parsed line of ``metrics.jsonl``, strict (null) or older (``NaN`` tokens): every value there but its
    ``nan_reasons`` is a number, so each null comes back as NaN, or as the infinity its reason says it was."""
    row = json.loads(line)
    return _nan_for_null(row, row.keys(), _infinities(row.get("nan_reasons"))) if isinstance(row, dict) else row


def _fsync_dir(directory: Path) -> None:
    """Best-effort fsync of a directory so a rename survives a crash."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` atomically (temp file + fsync + replace)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(target.parent)
    return target


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, strict: bool = False) -> Path:
    """Write ``obj`` as indented JSON atomically. ``strict``: NaN/inf as ``null``; otherwise as the ``NaN``
    tokens Python's json reads back exactly (a checkpoint's own state)."""
    text = strict_dumps(obj, indent=2) if strict else _dumps(obj, indent=2)
    return atomic_write_text(path, text + "\n")


class FolderLock:
    """An exclusive ``flock`` on ``<run>/.lock`` for as long as a job runs in the folder: a second process on the
    same folder (two shells, a sweep and a single run sharing ``hydra.run.dir``) is refused in one line before any
    model loads, instead of both appending to one ``metrics.jsonl``. The kernel drops the lock when the holder exits
    by any means (a SIGKILL too), so a stale file never blocks a rerun. Unix only; elsewhere no lock is taken."""

    def __init__(self, folder: Path, take: bool = True) -> None:
        from ablate.errors import AblateError

        self.file = None
        if not take:  # a process other than rank 0 of the job: rank 0 holds it
            return
        try:
            import fcntl
        except ImportError:  # not Unix
            return
        handle = open(folder / LOCK_FILE, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise AblateError(
                f"{folder}: {holder} is running a job in this folder now: wait for it to end, or give this one "
                "another hydra.run.dir"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} (since {time.strftime('%Y-%m-%d %H:%M:%S')})")
        handle.flush()
        self.file = handle

    def release(self) -> None:
        if self.file is not None:
            self.file.close()  # closing the descriptor drops the flock
            self.file = None


def held(folder: Path) -> bool | None:
    """Whether a process on this machine holds ``folder``'s :class:`FolderLock` now (a job is running in it), read
    from ``/proc/locks`` without touching the lock; None where that cannot be told (no lock file, not Linux)."""
    lock, table = Path(folder) / LOCK_FILE, Path("/proc/locks")
    if not lock.is_file() or not table.is_file():
        return None
    st = lock.stat()
    me = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    fields = (line.split() for line in table.read_text().splitlines())
    return any(len(f) > 5 and f[1] == "FLOCK" and me in f for f in fields)


class RunFolder:
    """One run's output directory (created on construction)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def samples_path(self) -> Path:
        return self.path / SAMPLES_FILE

    @property
    def summary_path(self) -> Path:
        return self.path / SUMMARY_FILE

    def lock(self) -> FolderLock:
        """Hold the folder for this process's job (:class:`FolderLock`); raises AblateError when another holds it."""
        return FolderLock(self.path)

    def write_config(self, cfg: DictConfig | Mapping[str, Any]) -> Path:
        """Write the resolved config to ``config.yaml`` atomically."""
        if not OmegaConf.is_config(cfg):
            cfg = OmegaConf.create(to_python(dict(cfg)))
        return atomic_write_text(self.config_path, OmegaConf.to_yaml(cfg, resolve=True))

    def log_metrics(self, step: int, metrics: Mapping[str, Any], reasons: Mapping[str, str] | None = None) -> None:
        """Append ``{"step", "time", **metrics}`` as one fsynced strict JSON line (NaN/inf as null, each with its
        reason in the line's ``nan_reasons``: from ``reasons``, by logged name, or one saying what it was).

        If the file ends in a partial line (killed writer), a newline is added
        first so the new record stays parseable.
        """
        clash = {"step", "time", "nan_reasons"} & set(metrics)
        if clash:
            raise ValueError(f"metric names reserved by log_metrics: {sorted(clash)}")
        record = {"step": int(to_python(step)), "time": time.time(), **to_python(dict(metrics))}
        line = strict_dumps(_line_with_reasons(record, reasons)) + "\n"
        with open(self.metrics_path, "a+b") as fh:
            if fh.tell() > 0:
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    line = "\n" + line
            fh.write(line.encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())

    def read_metrics(self) -> list[dict[str, Any]]:
        """Read ``metrics.jsonl`` (nulls and older ``NaN`` tokens as NaN); unparseable (e.g. truncated) lines
        are skipped with a warning."""
        if not self.metrics_path.exists():
            return []
        rows: list[dict[str, Any]] = []
        text = self.metrics_path.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = metrics_from_json(line)
            except json.JSONDecodeError:
                warnings.warn(
                    f"{self.metrics_path}:{lineno}: skipping truncated/corrupt line",
                    RuntimeWarning,
                    stacklevel=2,
                )
                continue
            if isinstance(row, dict):
                rows.append(row)
        return rows

    def truncate_metrics(self, step: int) -> None:
        """Keep only the records up to ``step`` (a job resuming from its checkpoint at ``step`` logs the
        later ones again); rewritten atomically."""
        rows = [r for r in self.read_metrics() if int(r.get("step", 0)) <= step]
        atomic_write_text(self.metrics_path, "".join(strict_dumps(_line_with_reasons(r)) + "\n" for r in rows))

    def write_samples(self, rows: list[Mapping[str, Any]]) -> Path:
        """Write generation samples to ``samples.jsonl`` atomically (strict JSON: NaN/inf as null)."""
        text = "".join(strict_dumps(dict(r)) + "\n" for r in rows)
        return atomic_write_text(self.samples_path, text)

    def read_samples(self) -> list[dict[str, Any]]:
        """The rows of ``samples.jsonl`` (none when there is no file)."""
        if not self.samples_path.exists():
            return []
        text = self.samples_path.read_text(encoding="utf-8")
        return [r for r in (json.loads(x) for x in text.splitlines() if x.strip()) if isinstance(r, dict)]

    def add_samples(self, rows: list[Mapping[str, Any]]) -> Path:
        """Add one evaluation's samples (each row has its ``step``) to those of the job's earlier evaluations; rows
        of the same step are replaced (an evaluation written again). Rewritten atomically: the curves of a report
        are recomputed from every evaluation's samples (analysis/recheck_curves.py)."""
        steps = {int(r["step"]) for r in rows}
        kept = [r for r in self.read_samples() if int(r.get("step", 0)) not in steps]
        return self.write_samples([*kept, *rows])

    def truncate_samples(self, step: int) -> None:
        """Keep only the evaluations up to ``step`` (as :meth:`truncate_metrics`, for a job resuming there)."""
        if self.samples_path.exists():
            self.write_samples([r for r in self.read_samples() if int(r.get("step", 0)) <= step])

    def write_summary(self, summary: Mapping[str, Any]) -> Path:
        """Validate and atomically write ``summary.json``.

        Every required key of the schema (``SUMMARY_KEYS``) must be present (values may be NaN/None);
        ``status`` must be in ``STATUSES``. Extra keys (e.g. ``nan_reasons``,
        a dict metric -> reason) are kept. Strict JSON: NaN/inf are written as null, each with its reason in
        ``nan_reasons`` (one saying what the value was where none was given).
        """
        missing = [k for k in schema.required_keys() if k not in summary]
        if missing:
            raise ValueError(f"summary is missing required keys: {', '.join(missing)}")
        status = summary["status"]
        if status not in STATUSES:
            raise ValueError(f"summary status {status!r} not in {STATUSES}")
        reasons = summary.get("nan_reasons")
        if reasons is not None and not isinstance(reasons, Mapping):
            raise ValueError("summary 'nan_reasons' must be a mapping of key -> reason")
        return atomic_write_json(self.summary_path, with_reasons(to_python(dict(summary))), strict=True)

    def read_summary(self) -> dict[str, Any] | None:
        """Return the parsed ``summary.json`` (see :func:`summary_from_json`), or None if it does not exist."""
        if not self.summary_path.exists():
            return None
        return load_summary(self.summary_path)


class ReadOnlyFolder(RunFolder):
    """The run folder as a process other than rank 0 of a multi-process job sees it: it reads, and every write is
    left to rank 0 (which writes the same values: the processes agree on every metric)."""

    def lock(self) -> FolderLock:
        return FolderLock(self.path, take=False)  # rank 0 holds the folder for the job

    def write_config(self, cfg: DictConfig | Mapping[str, Any]) -> Path:
        return self.config_path

    def log_metrics(self, step: int, metrics: Mapping[str, Any], reasons: Mapping[str, str] | None = None) -> None:
        pass

    def truncate_metrics(self, step: int) -> None:
        pass

    def write_samples(self, rows: list[Mapping[str, Any]]) -> Path:
        return self.samples_path

    def add_samples(self, rows: list[Mapping[str, Any]]) -> Path:
        return self.samples_path

    def truncate_samples(self, step: int) -> None:
        pass

    def write_summary(self, summary: Mapping[str, Any]) -> Path:
        return self.summary_path


def run_folder(path: str | os.PathLike[str]) -> RunFolder:
    """This process's view of the run folder: rank 0 writes it, other processes of the same job only read it."""
    from ablate.distributed import is_main

    return RunFolder(path) if is_main() else ReadOnlyFolder(path)
