"""Folder syncs gathered in a block (StorageBackend.deferred_sync, DiskBackend): every folder a
publication or deletion touched is fsynced once when the block ends, before the caller records
anything; outside a block each one is synced at once. What is durable is what was fsynced, so
the fsync calls on folders are the outcome tested here."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from packhorse.storage.disk import DiskBackend
from packhorse.storage.registry import compose


@pytest.fixture
def folder_syncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The folders fsynced, in order (their paths)."""
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def _put(backend: object, key: str, data: bytes) -> None:
    with backend.open_write(key) as w:  # type: ignore[attr-defined]
        w.write(data)
        w.publish()


def test_outside_a_block_every_publication_and_deletion_syncs_its_folder(tmp_path: Path,
                                                                          folder_syncs: list[str]) -> None:
    b = compose(DiskBackend("buf", tmp_path))
    for i in range(3):
        _put(b, f"raw/a/p{i}.tar", b"x")
    b.delete("raw/a/p0.tar")
    assert folder_syncs == [str(tmp_path / "raw/a")] * 4


def test_a_block_syncs_each_folder_once_when_it_ends(tmp_path: Path, folder_syncs: list[str]) -> None:
    b = compose(DiskBackend("buf", tmp_path))  # through the layers, as stages use it
    with b.deferred_sync():
        for i in range(3):
            _put(b, f"raw/a/p{i}.tar", b"x")
            _put(b, f"raw/b/p{i}.tar", b"y")
        b.delete("raw/a/p0.tar")
        with b.deferred_sync():  # nested: the outermost block syncs
            _put(b, "raw/c/p.tar", b"z")
        assert folder_syncs == []  # nothing yet: the caller records nothing before the end
    assert sorted(folder_syncs) == [str(tmp_path / f"raw/{f}") for f in "abc"]
    assert (tmp_path / "raw/b/p2.tar").read_bytes() == b"y"


def test_a_block_that_raises_still_syncs_what_it_published(tmp_path: Path, folder_syncs: list[str]) -> None:
    # an unpack that fails part way still records (salvage) the packages it published
    b = DiskBackend("buf", tmp_path)
    with pytest.raises(RuntimeError), b.deferred_sync():
        _put(b, "raw/a/p.tar", b"x")
        raise RuntimeError("a later member is refused")
    assert folder_syncs == [str(tmp_path / "raw/a")]


def test_a_folder_a_deletion_pruned_is_not_an_error(tmp_path: Path, folder_syncs: list[str]) -> None:
    b = DiskBackend("buf", tmp_path)
    _put(b, "raw/a/only.tar", b"x")
    folder_syncs.clear()
    with b.deferred_sync():
        assert b.delete("raw/a/only.tar")  # the folder, left empty, is pruned
    assert not (tmp_path / "raw/a").exists()
    assert folder_syncs == []
