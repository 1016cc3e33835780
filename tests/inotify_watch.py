"""Test support (importable as ``inotify_watch``): record every entry created, moved in,
written or deleted in a folder, through Linux inotify (ctypes; no dependency).

Unlike comparing listings before and after, a watch also sees an entry that was created and
removed again in between (a temporary folder a failed attempt cleaned up).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
from pathlib import Path

IN_MODIFY, IN_ATTRIB, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x2, 0x4, 0x80, 0x100, 0x200
IN_NONBLOCK = os.O_NONBLOCK
_EVENT = struct.Struct("iIII")


class FolderWatch:
    """Watch ``folder`` (not its subfolders: anything below it must first be created in it)."""

    def __init__(self, folder: Path) -> None:
        self._libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self.fd = self._libc.inotify_init1(IN_NONBLOCK)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        mask = IN_CREATE | IN_MOVED_TO | IN_MODIFY | IN_ATTRIB | IN_DELETE
        if self._libc.inotify_add_watch(self.fd, os.fsencode(folder), mask) < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {folder}")

    def events(self) -> list[tuple[int, str]]:
        """Every ``(mask, name)`` recorded since the watch began (or since the last call)."""
        out: list[tuple[int, str]] = []
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return out
            except OSError as e:  # pragma: no cover
                if e.errno == errno.EAGAIN:
                    return out
                raise
            i = 0
            while i < len(buf):
                _wd, mask, _cookie, length = _EVENT.unpack_from(buf, i)
                name = buf[i + _EVENT.size: i + _EVENT.size + length].rstrip(b"\0").decode(errors="replace")
                out.append((mask, name))
                i += _EVENT.size + length

    def close(self) -> None:
        os.close(self.fd)
