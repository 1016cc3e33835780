"""A small tmpfs mounted for one test (importable as ``tmpfs_support``): real ``ENOSPC`` and
real ``statvfs`` figures without filling the shared disk.

``mount_tmpfs(folder, size_mib)`` mounts and yields the folder; it is unmounted afterwards
even when the test fails. Mounting needs root (``CAP_SYS_ADMIN``): without it the test is
skipped with the reason, and fails under ``CI=true`` (where it must run).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def mount_tmpfs(folder: Path, size_mib: int) -> Iterator[Path]:
    """Mount a ``size_mib`` MiB tmpfs on ``folder`` (created if missing) for the ``with`` block."""
    folder.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(folder)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        reason = f"cannot mount a tmpfs on {folder} (needs root): {r.stderr.strip() or r.returncode}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def df_percent(folder: Path) -> float:
    """``df``'s Use% of the file system of ``folder``: used / (used + available) × 100."""
    st = os.statvfs(folder)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    return 100.0 * used / (used + st.f_bavail * st.f_frsize)
