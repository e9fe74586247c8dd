"""Reading the user's data into records, each labelled ``file:row`` for the one-line errors of
:mod:`ablate.tasks.dataset`: JSONL (one object a line), JSON (an array of objects), CSV (pandas, every cell text),
Parquet (pyarrow), or a Hugging Face dataset id (``datasets.load_dataset``, offline from its local cache)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ablate.errors import AblateError, MissingAsset

FILE_KINDS = {".jsonl": "jsonl", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


class DataError(AblateError):
    """The task's data cannot be used as it is: one line naming the file, the row and the field."""


def type_name(value) -> str:
    """The JSON name of a parsed value's type."""
    names = {dict: "an object", list: "an array", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def is_local_file(path: str) -> bool:
    """Whether ``task.path`` names a file (read here) rather than a dataset: a hub id, or a folder of data files
    that ``datasets`` splits by their names (``train.jsonl``, ``test.jsonl``, ...)."""
    p = Path(path).expanduser()
    if p.is_dir():
        return False
    return p.exists() or p.suffix.lower() in FILE_KINDS or path.startswith(("/", "./", "../", "~"))


def read_records(path: str) -> tuple[list[tuple[str, dict]], str]:
    """The records of a local file, each with its ``file:row`` label, and the sha256 of the file's bytes."""
    p = Path(path).expanduser()
    kind = FILE_KINDS.get(p.suffix.lower())
    if not p.exists():
        raise DataError(f"task.path={path}: no such file (a .jsonl, .json, .csv or .parquet file, or a dataset id)")
    if p.is_dir() or kind is None:
        raise DataError(f"task.path={path}: not a .jsonl, .json, .csv or .parquet file")
    raw = p.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if kind in ("jsonl", "json"):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: not UTF-8 text (byte {e.start})") from None
        records = _json_records(path, text, kind)
    elif kind == "csv":
        records = _csv_records(path)
    else:
        records = _parquet_records(path)
    if not records:
        raise DataError(f"{path}: empty, no rows")
    return records, digest


def _json_records(path: str, text: str, kind: str) -> list[tuple[str, dict]]:
    if kind == "json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(data, list):
            raise DataError(f"{path}: a .json file must hold an array of objects (or use JSONL: one object a line)")
        items = [(f"{path}: item {i}", obj) for i, obj in enumerate(data, 1)]
    else:
        items = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                items.append((f"{path}:{n}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{n}: not valid JSON ({e.msg} at column {e.colno})") from None
    for where, obj in items:
        if not isinstance(obj, dict):
            raise DataError(f"{where}: {type_name(obj)}, not a JSON object with the data's columns")
    return items


def _csv_records(path: str) -> list[tuple[str, dict]]:
    import pandas as pd

    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: empty, no rows") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: not a readable CSV file ({str(e).splitlines()[0]})") from None
    # an empty cell is an empty string here: a null response is written as the literal `null` or left out
    rows = frame.to_dict("records")
    return [(f"{path}:{i + 2}", {k: (None if v == "null" else v) for k, v in r.items()}) for i, r in enumerate(rows)]


def _parquet_records(path: str) -> list[tuple[str, dict]]:
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:  # noqa: BLE001  (pyarrow raises several kinds for a damaged file)
        raise DataError(f"{path}: not a readable Parquet file ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    return [(f"{path}: row {i + 1}", r) for i, r in enumerate(rows)]


def read_hub(dataset_id: str) -> tuple[dict[str, list[tuple[str, dict]]], str]:
    """A dataset id's splits (``datasets.load_dataset``, offline from its local cache when HF_DATASETS_OFFLINE
    or HF_HUB_OFFLINE is set), and a digest of its cached files."""
    try:
        import datasets
    except ModuleNotFoundError:
        raise MissingAsset(
            "task.path names a dataset id: it needs the package 'datasets' (pip install datasets)"
        ) from None
    folder = Path(dataset_id).expanduser()
    try:
        loaded = datasets.load_dataset(str(folder) if folder.is_dir() else dataset_id)
    except FileNotFoundError as e:
        raise DataError(
            f"task.path={dataset_id}: no such file, and no such dataset ({str(e).splitlines()[0]})"
        ) from None
    except Exception as e:  # noqa: BLE001  (offline, gated, missing: datasets raises many kinds)
        raise MissingAsset(
            f"task.path={dataset_id}: the dataset cannot be loaded ({type(e).__name__}: {str(e).splitlines()[0]}); "
            "download it on a machine with network into the local cache, or pass a file"
        ) from None
    h = hashlib.sha256()
    out = {}
    for name, split in loaded.items():
        for f in split.cache_files:
            h.update(f["filename"].encode())
        out[name] = [(f"{dataset_id}[{name}]: row {i + 1}", r) for i, r in enumerate(split.to_list())]
    return out, h.hexdigest()
