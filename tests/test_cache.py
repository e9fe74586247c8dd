"""Content-addressed cache entries: atomic build, checksum verification, corruption detected and rebuilt."""

from __future__ import annotations

import pytest

from ablate.cache import CacheEntry, stable_hash
from ablate.errors import CacheCorrupted


def _build(entry: CacheEntry, text: str = "payload") -> None:
    with entry.build() as tmp:
        (tmp / "data.txt").write_text(text)


def test_key_order_does_not_matter_and_any_change_does(tmp_path):
    assert stable_hash({"a": 1, "b": 2}) == stable_hash({"b": 2, "a": 1})
    a = CacheEntry(tmp_path, "k", {"model": "m1", "max_length": 256})
    assert a.path == CacheEntry(tmp_path, "k", {"max_length": 256, "model": "m1"}).path
    assert a.path != CacheEntry(tmp_path, "k", {"model": "m1", "max_length": 257}).path
    assert a.path != CacheEntry(tmp_path, "other", {"model": "m1", "max_length": 256}).path


def test_build_then_valid(tmp_path):
    e = CacheEntry(tmp_path, "k", {"x": 1})
    assert not e.valid()
    _build(e)
    assert e.valid()
    assert (e.path / "data.txt").read_text() == "payload"
    assert e.meta["key"] == {"x": 1}
    assert [p.name for p in e.path.parent.iterdir()] == [e.path.name]  # no temp folders left


def test_failed_build_leaves_nothing(tmp_path):
    e = CacheEntry(tmp_path, "k", {"x": 1})
    with pytest.raises(RuntimeError):
        with e.build() as tmp:
            (tmp / "data.txt").write_text("half")
            raise RuntimeError("killed mid-build")
    assert not e.exists()
    assert list(e.path.parent.iterdir()) == []


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "meta"])
def test_corruption_is_detected_and_entry_removed(tmp_path, damage):
    e = CacheEntry(tmp_path, "k", {"x": 1})
    _build(e)
    f = e.path / "data.txt"
    if damage == "flip":
        f.write_text("paylOad")
    elif damage == "truncate":
        f.write_text("pay")
    elif damage == "delete":
        f.unlink()
    else:
        (e.path / "meta.json").write_text("{not json")
    with pytest.raises(CacheCorrupted):
        e.verify()
    assert not e.valid()  # reported, removed ...
    assert not e.path.exists()
    _build(e)  # ... and rebuilt
    assert e.valid()


def test_folder_without_meta_is_a_partial_entry(tmp_path):
    e = CacheEntry(tmp_path, "k", {"x": 1})
    e.path.mkdir(parents=True)
    (e.path / "data.txt").write_text("partial")
    assert not e.valid()
    assert not e.path.exists()


def test_two_jobs_building_one_entry_keep_the_first(tmp_path):
    """Two jobs of a parallel sweep miss the same entry and both build it: the one that finishes second must not
    delete the entry the first published (that job may be reading it); its own copy is dropped."""
    first, second = CacheEntry(tmp_path, "k", {"x": 1}), CacheEntry(tmp_path, "k", {"x": 1})
    with second.build() as tmp_second:
        (tmp_second / "data.txt").write_text("second")
        _build(first, "first")  # published while the second job is still building
        reader = (first.path / "data.txt").open()
    assert reader.read() == "first" and (first.path / "data.txt").read_text() == "first"
    reader.close()
    assert second.valid() and not tmp_second.exists()
    assert [p.name for p in first.path.parent.iterdir()] == [first.path.name]  # no temp folders left
