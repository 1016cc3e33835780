"""Disk usage measurement: how full the file system under a disk location is, in bytes.

:func:`filesystem_usage` asks the file system (``os.statvfs``, as ``df`` does);
:func:`provider_for` picks the process's provider: the file system's, unless the process's fault
hooks supply one (tests; any object with a ``disk_usage()`` method, :class:`UsageHooks`). The
samples, their thresholds and alerts are kept by :mod:`packhorse.rules.disk_usage`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import structlog

from packhorse.storage.base import QUARANTINE_PREFIX

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Usage:
    """One measurement of a file system, in bytes.

    ``total`` is the size of the file system, ``used`` the bytes in use, ``free`` the bytes
    still *available* to packhorse (not counting blocks reserved for root). With reserved
    blocks ``used + free < total``.
    """

    total: int
    used: int
    free: int

    @property
    def percent(self) -> float:
        """``used / (used + free) × 100``, as ``df`` reports "Use%" (0 for an empty file system)."""
        room = self.used + self.free
        return 100.0 * self.used / room if room > 0 else 0.0


#: ``(location name, root folder) -> Usage``; raises ``OSError`` if it cannot measure.
UsageProvider = Callable[[str, Path], Usage]


def filesystem_usage(location: str, root: Path) -> Usage:
    """The usage of the file system holding folder ``root``, from ``os.statvfs`` as ``df``
    reads it: total = ``f_blocks``, used = ``f_blocks − f_bfree``, free = ``f_bavail`` (all
    × ``f_frsize``, bytes).

    Raises:
        FileNotFoundError: ``root`` does not exist (nothing is measured in its place).
        OSError: the file system cannot be asked (permissions, a dead mount).
    """
    if not root.is_dir():
        raise FileNotFoundError(f"{location}: root folder {root} does not exist; not measured")
    st = os.statvfs(root)
    return Usage(total=st.f_blocks * st.f_frsize, used=(st.f_blocks - st.f_bfree) * st.f_frsize,
                 free=st.f_bavail * st.f_frsize)


def quarantined_bytes(root: Path) -> int:
    """Bytes held in the quarantine of the disk location at folder ``root``: every regular file
    under ``_packhorse/quarantine/`` (bad copies, markers and foreign objects packhorse moved
    aside instead of overwriting or deleting them, I2), by ``lstat`` size, links not followed.
    0 when there is no quarantine folder. Read-only.

    Raises:
        OSError: the folder cannot be read (a dead mount).
    """
    top = root / QUARANTINE_PREFIX.rstrip("/")
    if not top.is_dir():
        return 0
    total = 0
    for dirpath, _dirs, files in os.walk(top, onerror=_raise):
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def _raise(e: OSError) -> None:
    raise e


class UsageHooks(Protocol):
    """What :func:`provider_for` needs of the process's fault hooks
    (:class:`packhorse.runtime.hooks.Hooks` is one)."""

    def disk_usage(self) -> "UsageProvider | None":
        """The provider to use instead of the file system's, or ``None``."""


def provider_for(hooks: "UsageHooks | None") -> UsageProvider:
    """The provider in effect: the hooks' (tests), else the file system's."""
    provided = hooks.disk_usage() if hooks is not None else None
    return provided if provided is not None else filesystem_usage
