"""An object found already there (verified) clears the partial writes of its key a crashed
writer left (:func:`packhorse.stages.base.already_there`): a writer killed between publishing
its object (a link) and removing its partial left a whole bundle's partial file in a buffer,
holding its space unexplained, for at least a day (found by a trial)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from packhorse.stages.base import already_there
from packhorse.storage.disk import DiskBackend


def test_a_verified_object_clears_the_leftover_partials_of_its_key(tmp_path: Path) -> None:
    root = tmp_path / "buffer"
    (root / "bundles").mkdir(parents=True)
    data = os.urandom(10_000)
    (root / "bundles" / "b.tar").write_bytes(data)
    leftover = root / "bundles" / ".b.tar.t1.375c500a28a5.packhorse-partial"
    leftover.write_bytes(data)  # the same inode once: the link published, then the writer was killed
    other = root / "bundles" / ".c.tar.t1.375c500a28a5.packhorse-partial"  # another key's: not touched
    other.write_bytes(b"x")
    backend = DiskBackend("buffer", root)
    assert already_there(backend, "bundles/b.tar", len(data), hashlib.sha256(data).hexdigest())
    assert not leftover.exists() and other.exists()
    assert (root / "bundles" / "b.tar").read_bytes() == data


def test_an_object_not_there_leaves_the_partials_for_the_write_to_take_over(tmp_path: Path) -> None:
    root = tmp_path / "buffer"
    (root / "bundles").mkdir(parents=True)
    partial = root / "bundles" / ".b.tar.t1.375c500a28a5.packhorse-partial"
    partial.write_bytes(b"half")  # an interrupted transfer's: resumed from, not removed here
    assert not already_there(DiskBackend("buffer", root), "bundles/b.tar", 10, "a" * 64)
    assert partial.exists()
