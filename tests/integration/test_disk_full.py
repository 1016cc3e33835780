"""A full disk location, for real (a small tmpfs): the usage figure is ``df``'s, a write that
fails on ENOSPC leaves no partial file and names the location and key, and the next writes
succeed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from packhorse.errors import DestinationWriteError
from packhorse.storage.base import PARTIAL_SUFFIX
from packhorse.storage.disk import DiskBackend
from packhorse.storage.usage import filesystem_usage
from tmpfs_support import df_percent, mount_tmpfs

MiB = 1 << 20


def test_usage_is_dfs_figure_of_a_half_full_tmpfs(tmp_path: Path) -> None:
    with mount_tmpfs(tmp_path / "buf", 16) as root:
        (root / "ballast").write_bytes(os.urandom(8 * MiB))
        u = filesystem_usage("fyst-buffer", root)
        st = os.statvfs(root)
        assert u.total == st.f_blocks * st.f_frsize
        assert u.used == (st.f_blocks - st.f_bfree) * st.f_frsize
        assert u.free == st.f_bavail * st.f_frsize
        assert u.percent == pytest.approx(df_percent(root))
        assert 49 <= u.percent <= 51


def test_a_write_failing_on_enospc_removes_its_partial_file_and_names_location_and_key(tmp_path: Path) -> None:
    with mount_tmpfs(tmp_path / "buf", 4) as root:
        backend = DiskBackend("fyst-buffer", root)
        w = backend.open_write("raw/cam/obs1.tar")
        with pytest.raises(DestinationWriteError) as err:
            with w:
                for _ in range(8):  # 8 MiB into 4 MiB
                    w.write(os.urandom(MiB))
                w.publish()
        msg = str(err.value)
        assert "fyst-buffer" in msg and "'raw/cam/obs1.tar'" in msg and "full" in msg
        assert err.value.path == "raw/cam/obs1.tar" and err.value.host == "fyst-buffer"
        assert err.value.is_retryable and err.value.diagnosis
        assert not [p for p in root.rglob("*") if p.name.endswith(PARTIAL_SUFFIX)]
        assert df_percent(root) < 5  # the space is back at once
        # the small packages after it are written as usual
        for i in range(7):
            with backend.open_write(f"raw/cam/small{i}.tar") as small:
                small.write(b"x" * 100_000)
                small.publish()
        assert len(list(backend.list("raw/"))) == 7


def test_enospc_at_the_final_flush_also_removes_the_partial_file(tmp_path: Path) -> None:
    # under the write buffer's size the bytes first fail when publish flushes them
    with mount_tmpfs(tmp_path / "buf", 1) as root:
        (root / "ballast").write_bytes(b"b" * (1 * MiB - 64 * 1024))  # leave less than the buffer
        backend = DiskBackend("fyst-buffer", root)
        w = backend.open_write("raw/x.tar")
        w.write(b"y" * 200_000)
        with pytest.raises(DestinationWriteError):
            w.publish()
        assert not [p for p in root.rglob("*") if p.name.endswith(PARTIAL_SUFFIX)]
        assert backend.stat("raw/x.tar") is None


def test_an_s3_upload_whose_local_spool_fills_up_frees_it_and_names_location_and_key(tmp_path: Path) -> None:
    from packhorse.storage.s3 import S3Backend

    with mount_tmpfs(tmp_path / "spool", 2) as spool:
        # nothing reaches the store: the spool fills before publish (no client needed)
        backend = S3Backend("cologne-s3", None, "bucket", "lta", multipart_threshold_bytes=1, spool_dir=str(spool))
        w = backend.open_write("raw/cam/obs1.tar")
        with pytest.raises(DestinationWriteError) as err:
            with w:
                for _ in range(4):
                    w.write(os.urandom(MiB))
        assert "cologne-s3" in str(err.value) and "'raw/cam/obs1.tar'" in str(err.value)
        assert df_percent(spool) < 5
