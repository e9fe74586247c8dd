"""Content-addressed caches: one folder per key, built atomically, verified by checksum on every read.

An entry lives at ``<root>/<kind>/<sha256(key)[:24]>/`` and holds its payload files plus ``meta.json``
(the full key, and a sha256 per file). It is built in a temporary sibling folder and renamed into
place only when complete, so a crash leaves no half-written entry. A read re-checks every file's
checksum: a corrupted or partial entry is reported, removed and rebuilt, never silently used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ablate.errors import CacheCorrupted

log = logging.getLogger(__name__)

META = "meta.json"


def stable_hash(obj: Any) -> str:
    """sha256 of a JSON-serialisable object, independent of dict order."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


class CacheEntry:
    """One cache entry, addressed by the hash of ``key`` (every input that changes its bytes)."""

    def __init__(self, root: str | os.PathLike, kind: str, key: dict[str, Any]):
        self.kind = kind
        self.key = key
        self.digest = stable_hash({"kind": kind, **key})
        self.path = Path(root) / kind / self.digest[:24]

    def __repr__(self) -> str:
        return f"CacheEntry({self.kind}:{self.digest[:12]} at {self.path})"

    def exists(self) -> bool:
        return (self.path / META).is_file()

    def verify(self) -> None:
        """Raise CacheCorrupted if any payload file is missing or its checksum differs."""
        try:
            meta = json.loads((self.path / META).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise CacheCorrupted(f"cache entry {self.path} has an unreadable {META}: {e}") from e
        if meta.get("digest") != self.digest:
            raise CacheCorrupted(f"cache entry {self.path} belongs to another key")
        for name, expected in meta["files"].items():
            f = self.path / name
            if not f.is_file():
                raise CacheCorrupted(f"cache entry {self.path} is missing {name}")
            if file_sha256(f) != expected:
                raise CacheCorrupted(f"cache entry {self.path}: {name} failed its checksum")

    def valid(self) -> bool:
        """True when the entry exists and verifies; a corrupted entry is reported and removed."""
        if not self.exists():
            if self.path.exists():  # a folder without meta: partial, from some older crash
                shutil.rmtree(self.path, ignore_errors=True)
            return False
        try:
            self.verify()
        except CacheCorrupted as e:
            log.warning("%s; removing it and rebuilding", e)
            self.remove()
            return False
        return True

    def _publish(self, tmp: Path) -> None:
        """Rename the built folder into place. A job beside this one (a parallel sweep) may have built the same
        entry meanwhile: the first complete entry stands (another job may be reading it) and this copy is dropped;
        only a stale partial one is replaced."""
        if self.valid():
            shutil.rmtree(tmp, ignore_errors=True)
            return
        try:
            os.replace(tmp, self.path)
        except OSError:  # another job renamed its copy in between: keep theirs if it is whole
            if not self.valid():
                raise
            shutil.rmtree(tmp, ignore_errors=True)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def nbytes(self) -> int:
        return sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file()) if self.exists() else 0

    @property
    def meta(self) -> dict[str, Any]:
        return json.loads((self.path / META).read_text())

    @contextmanager
    def build(self, extra_meta: dict[str, Any] | None = None) -> Iterator[Path]:
        """Yield a temporary folder to write the payload into; on success it becomes the entry."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.", dir=self.path.parent))
        try:
            yield tmp
            files = {str(f.relative_to(tmp)): file_sha256(f) for f in sorted(tmp.rglob("*")) if f.is_file()}
            meta = {"kind": self.kind, "digest": self.digest, "key": self.key, "files": files, **(extra_meta or {})}
            (tmp / META).write_text(json.dumps(meta, indent=1, sort_keys=True, default=str))
            self._publish(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
