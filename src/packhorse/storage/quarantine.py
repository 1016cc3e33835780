"""The quarantine of a disk data location: what packhorse moved aside instead of overwriting or
deleting it (I2) — bad archive copies a fixity repair replaced, damaged buffer copies, staged
folders found damaged, another installation's identity marker.

Every entry sits under ``<root>/_packhorse/quarantine/`` at the key
:meth:`~packhorse.storage.base.StorageBackend.quarantine_key` gave it,
``<original key>.<UTC stamp>-<8 hex>`` (stamp ``YYYYmmddTHHMMSS.ffffffZ``): the stamp is when it
was moved aside, so its age never depends on a modification time (a quarantined file keeps the
mtime it had). :func:`list_quarantine` lists them, read-only; :func:`remove_quarantined` removes
one, and nothing outside the quarantine folder. Which entries may go, and when, is decided above
(:mod:`packhorse.actions.quarantine`: never inside ``[quarantine] min_retention_seconds``).

Object stores (S3, Azure) keep quarantined objects under the same prefix in their bucket or
container; they are not listed here.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from packhorse.errors import UnsafePathError
from packhorse.names import quoted
from packhorse.storage.base import QUARANTINE_PREFIX, check_key

#: ``<original key>.<UTC stamp>-<random>``, as :meth:`StorageBackend.quarantine_key` names entries
_NAME = re.compile(r"^(?P<original>.+)\.(?P<stamp>\d{8}T\d{6}\.\d{6}Z)-[0-9a-f]{8}$")


@dataclass(frozen=True)
class QuarantinedEntry:
    """One entry of a disk location's quarantine.

    Attributes:
        key: its key under the location root (``_packhorse/quarantine/raw/cam/obs1.tar.<stamp>-<hex>``).
        original_key: the key it had before it was moved aside (``raw/cam/obs1.tar``); ``None``
            when its name is not one packhorse gives (put there by hand).
        quarantined_at: when it was moved aside (UTC, from its name); ``None`` when the name
            carries no stamp — such an entry is never old enough to purge.
        kind: ``file``, ``folder`` (a staged bag folder moved aside whole) or ``other`` (a
            symbolic link or special file moved aside whole, never followed).
        size: bytes: a file's size; the sum of the regular files in a folder; 0 otherwise.
    """

    key: str
    original_key: str | None
    quarantined_at: dt.datetime | None
    kind: str
    size: int

    def age_seconds(self, now: dt.datetime) -> float | None:
        """Seconds from ``quarantined_at`` to ``now`` (UTC), ``None`` when not known."""
        return None if self.quarantined_at is None else (now - self.quarantined_at).total_seconds()


def parse_name(rel: str) -> tuple[str | None, dt.datetime | None]:
    """``(original key, quarantined at UTC)`` of a path relative to the quarantine folder, or
    ``(None, None)`` when it is not ``<key>.<stamp>-<hex>``."""
    m = _NAME.match(rel)
    if m is None:
        return None, None
    at = dt.datetime.strptime(m["stamp"], "%Y%m%dT%H%M%S.%fZ").replace(tzinfo=dt.timezone.utc)
    return m["original"], at


def list_quarantine(root: Path) -> list[QuarantinedEntry]:
    """Every entry of the quarantine of the disk location at folder ``root``, by key; ``[]``
    when it has no quarantine folder. A folder whose name is a quarantine name is one entry (a
    staged folder moved aside whole); other folders are walked into. Links are never followed.
    Read-only.

    Raises:
        OSError: the folder cannot be read (a dead mount).
    """
    top = root / QUARANTINE_PREFIX.rstrip("/")
    if not top.is_dir() or top.is_symlink():
        return []
    out: list[QuarantinedEntry] = []
    _walk(top, "", out)
    return sorted(out, key=lambda e: e.key)


def _walk(folder: Path, rel: str, out: list[QuarantinedEntry]) -> None:
    with os.scandir(folder) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        sub = f"{rel}{e.name}"
        original, at = parse_name(sub)
        st = e.stat(follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode) and original is None:
            _walk(Path(e.path), sub + "/", out)
            continue
        if stat.S_ISREG(st.st_mode):
            kind, size = "file", st.st_size
        elif stat.S_ISDIR(st.st_mode):
            kind, size = "folder", _folder_bytes(e.path)
        else:
            kind, size = "other", 0
        out.append(QuarantinedEntry(key=QUARANTINE_PREFIX + sub, original_key=original, quarantined_at=at,
                                    kind=kind, size=size))


def _folder_bytes(path: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):  # links to folders are not followed
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def remove_quarantined(root: Path, key: str) -> None:
    """Remove the quarantine entry ``key`` of the disk location at folder ``root`` (a file, a
    link, or a folder with everything in it, links not followed), then the folders above it
    left empty, up to the quarantine folder (kept). A key already gone is no error.

    Raises:
        UnsafePathError: ``key`` is not a safe key under ``_packhorse/quarantine/``, or a folder
            on its way is a symbolic link (nothing removed).
        OSError: the removal failed (permissions, a dead mount).
    """
    check_key(key)
    if not key.startswith(QUARANTINE_PREFIX) or key == QUARANTINE_PREFIX:
        raise UnsafePathError(f"{quoted(key)} is not in the quarantine ({QUARANTINE_PREFIX})", path=key)
    top = root / QUARANTINE_PREFIX.rstrip("/")
    path = root / key
    folder = path.parent
    while folder != root:  # no link on the way (I6): the entry must be inside this quarantine
        if folder.is_symlink():
            raise UnsafePathError(f"{quoted(key)}: {folder} is a symbolic link; not removed", path=key)
        folder = folder.parent
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)  # fd-based on Linux: links inside are removed, never followed
    else:
        os.unlink(path)
    folder = path.parent
    while folder != top:
        try:
            folder.rmdir()
        except OSError:
            break
        folder = folder.parent
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
