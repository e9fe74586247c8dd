"""Read a W&B offline run (``wandb/offline-run-*/run-<id>.wandb``) without the network.

The file is W&B's transaction log: a 7-byte header (``:W&B``, magic, version) and then LevelDB's log
format (32 KiB blocks of records, each with a 7-byte header: crc32c, length, type FULL/FIRST/MIDDLE/LAST),
every record a ``wandb_internal_pb2.Record``. This is what ``wandb sync`` uploads, so reading it shows
exactly what W&B would show: the run's group, job type, name, tags, config, history and summary.

Neither the log's layout nor ``wandb.proto`` is W&B's documented API: :func:`problems` checks the installed
wandb's ``Record`` schema for every field read here, before the first file is read, and fails with one line.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_BLOCK = 32768
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _payloads(data: bytes) -> Iterator[bytes]:
    if data[:4] != b":W&B":
        raise ValueError("not a W&B transaction log (no ':W&B' header)")
    pos, pending = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # block trailer: zero padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        body = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind == 0 and length == 0:  # zero-filled rest of a block
            pos += left - _HEADER
            continue
        if kind == _FULL:
            yield body
        elif kind == _FIRST:
            pending = body
        elif kind == _MIDDLE:
            pending += body
        elif kind == _LAST:
            yield pending + body
            pending = b""


#: message -> the fields of it read here (``Record``: the kinds of record, its ``record_type`` oneof)
_SCHEMA = {
    "Record": ("run", "config", "history", "summary", "exit"),
    "RunRecord": ("run_id", "project", "run_group", "job_type", "display_name", "tags", "config"),
    "ConfigRecord": ("update",),
    "HistoryRecord": ("item",),
    "SummaryRecord": ("update",),
    "ConfigItem": ("key", "nested_key", "value_json"),
    "HistoryItem": ("key", "nested_key", "value_json"),
    "SummaryItem": ("key", "nested_key", "value_json"),
    "RunExitRecord": ("exit_code",),
}


def problems() -> list[str]:
    """What the installed wandb's transaction-log schema lacks of what this reader reads, one phrase each."""
    try:
        from wandb.proto import wandb_internal_pb2 as pb
    except ImportError as e:
        return [f"wandb.proto.wandb_internal_pb2 is missing ({e})"]
    found = []
    for message, names in _SCHEMA.items():
        descriptor = getattr(getattr(pb, message, None), "DESCRIPTOR", None)
        if descriptor is None:
            found.append(f"{message} is missing")
            continue
        missing = [n for n in names if n not in descriptor.fields_by_name]
        if missing:
            found.append(f"{message} has no {', '.join(missing)}")
    oneof = pb.Record.DESCRIPTOR.oneofs_by_name.get("record_type") if hasattr(pb, "Record") else None
    if oneof is None or not set(_SCHEMA["Record"]) <= {f.name for f in oneof.fields}:
        found.append("Record's record_type no longer holds run, config, history, summary and exit")
    return found


def check() -> None:
    """Raise :class:`MissingAsset` (one line) when the installed wandb's schema lacks what this reader reads."""
    from ablate.errors import MissingAsset
    from ablate.versions import incompatible

    found = problems()
    if found:
        raise MissingAsset(incompatible("wandb", found))


def _items(items) -> dict[str, Any]:
    out = {}
    for it in items:
        key = it.key or "/".join(it.nested_key)
        try:
            out[key] = json.loads(it.value_json)
        except json.JSONDecodeError:
            out[key] = it.value_json
    return out


@dataclass
class OfflineRun:
    id: str = ""
    project: str = ""
    group: str = ""
    job_type: str = ""
    name: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None  # None: the run was never finished


def read_offline_run(path: str | Path) -> OfflineRun:
    """``path``: an ``offline-run-*`` folder or its ``.wandb`` file."""
    check()  # before the import: a wandb without it is one line too
    from wandb.proto import wandb_internal_pb2 as pb

    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.wandb"))
        if not files:
            raise FileNotFoundError(f"no .wandb file in {path}")
        path = files[0]
    run = OfflineRun()
    for payload in _payloads(path.read_bytes()):
        rec = pb.Record()
        rec.ParseFromString(payload)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            r = rec.run
            run.id, run.project, run.group, run.job_type = r.run_id, r.project, r.run_group, r.job_type
            run.name, run.tags = r.display_name, list(r.tags)
            run.config.update(_items(r.config.update))
        elif kind == "config":
            run.config.update(_items(rec.config.update))
        elif kind == "history":
            run.history.append(_items(rec.history.item))
        elif kind == "summary":
            run.summary.update(_items(rec.summary.update))
        elif kind == "exit":
            run.exit_code = rec.exit.exit_code
    run.config = {k: (v.get("value", v) if isinstance(v, dict) else v) for k, v in run.config.items()}
    return run


def offline_runs(root: str | Path) -> list[Path]:
    """Every offline run folder below ``root``."""
    return sorted(p for p in Path(root).rglob("offline-run-*") if p.is_dir())
