"""One directory fsync per folder for a batch of disk publications (DESIGN.md I2).

A disk publication fsyncs the object's bytes, links it under its final name (no-replace), then
fsyncs the folder so that the new name survives a crash (:mod:`packhorse.storage.disk`). When
one operation publishes many objects into one folder (an unpack writes every raw package of a
bundle into ``raw/``; a batch of long-term-archive operations writes several packages there),
the folder fsyncs can be made once per folder, at the end of the batch, instead of once per
object: inside :func:`deferred_folder_syncs` the disk backend records the folder instead of
syncing it, and the folders are fsynced when the block ends, whether it ends normally or with
an exception.

What does not change: each object's bytes are fsynced before it is linked (a crash never leaves
a name over incomplete bytes), publication is still a no-replace link (I2: written once), every
object is read back and verified after it is linked (I4). What the database records about the
objects (copy rows, completion) is written only after the block, i.e. after the folder fsyncs:
a crash before them can lose a name that nothing records yet, and the next attempt publishes it
again (deterministic bytes, I3). A folder fsync that fails is reported by
:attr:`FolderSyncs.failed` and raised as :class:`~packhorse.errors.DestinationWriteError` at the
end of the block; the caller then records nothing of the batch.

Deferral is per thread (a worker runs one operation or batch at a time) and does not nest: an
inner block joins the outer one.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import TracebackType

from ..errors import DestinationWriteError

_local = threading.local()


def fsync_folder(path: Path | str) -> None:
    """fsync folder ``path`` now (``O_DIRECTORY``).

    Raises:
        OSError: the folder cannot be opened or synced.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_folder(path: Path | str) -> None:
    """fsync folder ``path`` after a publication into it: now, or at the end of the enclosing
    :func:`deferred_folder_syncs` block of this thread (once per folder).

    Raises:
        OSError: (not deferred) the folder cannot be synced.
    """
    pending: dict[str, None] | None = getattr(_local, "folders", None)
    if pending is None:
        fsync_folder(path)
    else:
        pending[os.fspath(path)] = None


class FolderSyncs:
    """The context manager of :func:`deferred_folder_syncs`.

    Attributes:
        folders: the folders synced at the end (in the order first published into).
        failed: ``True`` once a folder fsync at the end failed (the caller must then record
            nothing of what was published inside the block).
    """

    def __init__(self) -> None:
        self.folders: list[str] = []
        self.failed = False
        self._outer = False

    def __enter__(self) -> "FolderSyncs":
        if getattr(_local, "folders", None) is not None:
            self._outer = True  # nested: the outer block syncs
            return self
        _local.folders = {}
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._outer:
            return
        pending: dict[str, None] = _local.folders
        _local.folders = None
        self.folders = list(pending)
        first: tuple[str, OSError] | None = None
        for folder in self.folders:
            try:
                fsync_folder(folder)
            except FileNotFoundError:
                continue  # pruned by a deletion meanwhile: nothing of it is left to make durable
            except OSError as e:
                self.failed = True
                first = first or (folder, e)
        if first is not None:
            folder, e = first
            raise DestinationWriteError(
                f"fsync of folder {folder} after publishing into it failed: {e.strerror or e}",
                step="publish", side="destination", path=folder) from e


def deferred_folder_syncs() -> FolderSyncs:
    """A block (``with``) in which disk publications of this thread fsync their folders once
    each, at its end (see the module docstring).

    Raises (at the end of the block):
        DestinationWriteError: a folder fsync failed (every folder is still tried).
    """
    return FolderSyncs()
