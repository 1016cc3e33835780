"""Disk publications inside :func:`packhorse.storage.syncbatch.deferred_folder_syncs` fsync each
folder once, at the end of the block, and before anything is recorded; a failed folder fsync
records nothing of the batch."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from packhorse.errors import DestinationWriteError
from packhorse.storage import syncbatch
from packhorse.storage.disk import DiskBackend
from packhorse.storage.syncbatch import deferred_folder_syncs
from packhorse.worker import Outcome, execute_batch

from test_archive_batch import Buffer


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Folders fsynced (in order)."""
    calls: list[str] = []
    real = syncbatch.fsync_folder

    def spy(path):  # type: ignore[no-untyped-def]
        calls.append(os.fspath(path))
        real(path)

    monkeypatch.setattr(syncbatch, "fsync_folder", spy)
    return calls


def _publish(backend: DiskBackend, key: str, data: bytes) -> None:
    with backend.open_write(key) as w:
        w.write(data)
        w.publish(hashlib.sha256(data).hexdigest())


def test_each_folder_is_synced_once_at_the_end_of_the_block(tmp_path: Path, synced: list[str]) -> None:
    b = DiskBackend("buf", tmp_path / "root")
    _publish(b, "raw/alone.tar", b"0")
    assert synced == [str(tmp_path / "root" / "raw")]  # outside a block: at once
    synced.clear()
    with deferred_folder_syncs() as syncs:
        for i in range(5):
            _publish(b, f"raw/p{i}.tar", bytes([i]) * 10)
        _publish(b, "other/q.tar", b"q")
        with deferred_folder_syncs():  # nested: joins the outer block
            _publish(b, "raw/inner.tar", b"i")
        assert synced == []  # nothing yet: every name is published and readable already
        assert b.sha256("raw/p3.tar") == hashlib.sha256(bytes([3]) * 10).hexdigest()
    assert synced == [str(tmp_path / "root" / "raw"), str(tmp_path / "root" / "other")]
    assert syncs.folders == synced and not syncs.failed


def test_a_failed_folder_sync_is_raised_at_the_end_after_trying_every_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = DiskBackend("buf", tmp_path / "root")
    tried: list[str] = []

    def failing(path):  # type: ignore[no-untyped-def]
        tried.append(os.path.basename(path))
        if os.path.basename(path) == "raw":
            raise OSError(5, "Input/output error")

    monkeypatch.setattr(syncbatch, "fsync_folder", failing)
    syncs = deferred_folder_syncs()
    with pytest.raises(DestinationWriteError, match="raw.*Input/output error"):
        with syncs:
            _publish(b, "raw/a.tar", b"a")
            _publish(b, "other/b.tar", b"b")
    assert syncs.failed and tried == ["raw", "other"]


def test_an_archive_batch_whose_folder_sync_fails_records_nothing(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    buf = Buffer(tmp_path)
    try:
        ops = [buf.waiting(n, n.encode() * 100) for n in ("x", "y")]

        def failing(path):  # type: ignore[no-untyped-def]
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(syncbatch, "fsync_folder", failing)
        assert execute_batch(buf.ctx, ops, "w") == [Outcome.RETRY, Outcome.RETRY]
        assert buf.copy_rows() == set()
        assert buf.statuses(ops) == ["PENDING", "PENDING"]
    finally:
        buf.db.dispose()
