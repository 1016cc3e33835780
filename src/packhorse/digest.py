"""Streaming sha256 without per-call buffer allocation.

``hashlib.file_digest`` allocates (and zeroes) a 256 KiB buffer on every call, which dominates
hashing many small files; :func:`sha256_stream` reuses one 1 MiB buffer per thread.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import BinaryIO

CHUNK_BYTES = 1 << 20
_local = threading.local()


def _buffer() -> bytearray:
    buf = getattr(_local, "buf", None)
    if buf is None:
        buf = _local.buf = bytearray(CHUNK_BYTES)
    return buf


def hash_stream(f: BinaryIO) -> "hashlib._Hash":
    """Read ``f`` to its end; return the sha256 hash object of what was read (more may be added)."""
    h = hashlib.sha256()
    readinto = getattr(f, "readinto", None)
    if readinto is None:
        while True:
            data = f.read(CHUNK_BYTES)
            if not data:
                return h
            h.update(data)
    buf = _buffer()
    view = memoryview(buf)
    while True:
        n = readinto(buf)
        if not n:
            return h
        h.update(view[:n])


def hash_fd(fd: int) -> tuple[int, "hashlib._Hash"]:
    """Read the open file ``fd`` from byte 0 to its end with ``pread`` (its offset is left
    alone); return ``(bytes read, sha256 hash object)``.

    Raises:
        OSError: the read failed.
    """
    h = hashlib.sha256()
    buf = _buffer()
    view = memoryview(buf)
    at = 0
    while True:
        n = os.preadv(fd, [buf], at)
        if not n:
            return at, h
        h.update(view[:n])
        at += n


def sha256_stream(f: BinaryIO) -> str:
    """Read ``f`` to its end and return the sha256 (hex) of what was read."""
    return hash_stream(f).hexdigest()
