"""Files the transfer benchmarks move: random bytes written once, and their sha256 read back."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

#: Bytes per write and per read unit (1 MiB).
BLOCK = 1 << 20


def make_source(path: Path, mib: int) -> str:
    """Write ``mib`` MiB of random bytes (incompressible, as instrument data often is) to
    ``path``; return their sha256 (hex)."""
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for _ in range(mib):
            b = os.urandom(BLOCK)
            h.update(b)
            f.write(b)
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    """The sha256 (hex) of the file at ``path``, read in 8 MiB units."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(8 * BLOCK):
            h.update(b)
    return h.hexdigest()
