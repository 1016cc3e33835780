"""Source trees that turn hostile while the embedded pipeline runs (DESIGN.md I6: bad input
gets a clear error naming the file, and the rest of the work goes on):

- a FIFO swapped in for a source file between the listing and the open must not hang the
  scan: the path is listed as skipped with its reason and every other file is archived;
- a folder some 2,000 levels deep is scanned: its files are registered, and so are the
  location's other folders; `packhorse validate` checks a bag folder that deep, the start-up
  sweep removes a partial folder that deep, and a package that deep is staged and verified;
- a source folder swapped for a symbolic link for a moment while its package is built takes
  its files out of the package (registered again later), never failing the package for good.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from pathlib import Path
from typing import BinaryIO

import pytest
from sqlalchemy import select

from packhorse.config import load_config
from packhorse.db.models import Operation, PhysicalCopy, RawDataFile, RawDataPackage, SkippedFile, WithdrawnFile
from packhorse.db.session import Database
from packhorse.domain import OperationKind, Status
from packhorse.engine.pipeline import sweep_partials
from packhorse.executors.local import LocalRunner
from packhorse.managers.staging import request_staging
from packhorse.rules.availability import mark_locations
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.hooks import Hooks
from packhorse.runtime.topology import sync_topology
from packhorse.storage.base import StorageBackend
from packhorse.storage.disk import remove_tree
from packhorse.storage.layers import Layer
from support import run_packhorse, write_settled, write_site_config

#: seconds a whole embedded run of these small trees may take before it is taken for hung
HUNG_AFTER = 30.0


@pytest.fixture(autouse=True)
def _no_deep_leftovers(tmp_path: Path) -> None:
    """Empty ``tmp_path`` after each test with a removal of any depth: pytest removes old
    temporary folders with ``shutil.rmtree``, which raises ``RecursionError`` on a 2,000-level
    tree and would break the next test session of anyone sharing ``/tmp/pytest-of-<user>``."""
    yield
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in os.listdir(fd):
            remove_tree(fd, name)
    finally:
        os.close(fd)


@pytest.fixture
def ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ProcessContext:
    monkeypatch.setenv("PACKHORSE_EXECUTOR__POOL", "thread")
    settings = load_config(write_site_config(tmp_path / "s", bundle_max_wait_seconds=0, settle_seconds=0))
    db = Database(settings.database_url)
    db.upgrade()
    c = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    mark_locations(c)  # as `packhorse init` does
    c._backends.clear()  # the test hands in its own hooks afterwards
    yield c
    db.dispose()


def _source(ctx: ProcessContext) -> Path:
    return ctx.settings.location_path("fyst-source")


def _registered(ctx: ProcessContext) -> set[str]:
    return set(ctx.db.read(lambda s: list(s.scalars(select(RawDataFile.relative_path)))))


def _skipped(ctx: ProcessContext) -> dict[str, str]:
    return dict(ctx.db.read(lambda s: list(s.execute(select(SkippedFile.relative_path, SkippedFile.reason)))))


def _failed(ctx: ProcessContext) -> list[tuple[str, object]]:
    return ctx.db.read(lambda s: list(s.execute(select(Operation.kind, Operation.error_context)
                                                .where(Operation.status == Status.FAILED.value))))


def _run_in_thread(ctx: ProcessContext, unblock: Path | None = None) -> None:
    """Run the embedded pipeline until idle; fail the test if it is still running after
    :data:`HUNG_AFTER` (then a FIFO at ``unblock`` gets a writer, so the run can end)."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            LocalRunner(ctx).run(until_idle=True)
        except BaseException as e:  # noqa: BLE001 (re-raised in the test's thread)
            errors.append(e)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(HUNG_AFTER)
    if t.is_alive():
        if unblock is not None:
            fd = os.open(unblock, os.O_WRONLY | os.O_NONBLOCK)  # the blocked reader's open returns
            os.close(fd)
            t.join(HUNG_AFTER)
        pytest.fail(f"the run did not end within {HUNG_AFTER} s (hung in the scan)")
    if errors:
        raise errors[0]


class _FifoSwap(Hooks):
    """Storage layer of the source: right before the first read of ``victim``, the file is
    replaced by a FIFO (``mkfifo`` + rename, as an attacker with write access would do between
    the scan's listing and its open)."""

    def __init__(self, victim: str) -> None:
        self.victim = victim
        self.swapped: Path | None = None

    def storage_layer(self, backend: StorageBackend) -> StorageBackend:
        hooks = self

        class Swap(Layer):
            def open_read(self, key: str) -> BinaryIO:
                if key == hooks.victim and hooks.swapped is None and self.location == "fyst-source":
                    path = Path(self.inner.local_path(key))  # type: ignore[attr-defined]
                    fifo = path.with_name(".fifo")
                    os.mkfifo(fifo)
                    os.replace(fifo, path)
                    hooks.swapped = path
                return self.inner.open_read(key)

        return Swap(backend)


def test_a_fifo_swapped_in_for_a_source_file_is_skipped_and_the_scan_goes_on(ctx: ProcessContext) -> None:
    root = _source(ctx)
    for rel in ("inst/obs/victim.dat", "inst/obs/other.dat", "inst/obs2/b.dat"):
        write_settled(root / rel, rel.encode() * 10)
    ctx.hooks = hooks = _FifoSwap("inst/obs/victim.dat")
    _run_in_thread(ctx, unblock=root / "inst/obs/victim.dat")
    assert hooks.swapped is not None, "the swap never happened"
    assert _registered(ctx) == {"inst/obs/other.dat", "inst/obs2/b.dat"}
    assert "not a regular file" in _skipped(ctx).get("inst/obs/victim.dat", ""), _skipped(ctx)
    assert _failed(ctx) == []


DEPTH = 2000


def _deep_tree(top: Path, depth: int, leaf: str, data: bytes) -> str:
    """Make ``depth`` nested one-letter folders under ``top`` (each made relative to its
    parent's descriptor: no long path, no recursion) with file ``leaf`` at the bottom; returns
    the file's path relative to ``top``."""
    top.mkdir(parents=True, exist_ok=True)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        old = os.stat(fd).st_mtime - 60  # every folder and the file a minute old (settled, and no live write)
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            os.utime(fd, (old, old))
            nfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        wfd = os.open(leaf, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=fd)
        with os.fdopen(wfd, "wb") as f:
            f.write(data)
        os.utime(leaf, (old, old), dir_fd=fd)
        os.utime(fd, (old, old))
    finally:
        os.close(fd)
    return "/".join(["d"] * depth + [leaf])


@pytest.fixture
def short_root(tmp_path: Path) -> Path:
    """A source root with a short path: 2,000 levels of ``d/`` then fit in ``PATH_MAX`` (4,096
    bytes), as they would under a real mount point such as ``/data``."""
    root = Path(tempfile.mkdtemp(prefix="ph", dir="/tmp"))
    yield root
    fd = os.open(root.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        remove_tree(fd, root.name)  # (shutil.rmtree recurses: RecursionError at this depth)
    finally:
        os.close(fd)


@pytest.mark.long  # seconds of real processes: out of the default selection
def test_a_source_tree_2000_levels_deep_is_registered_with_the_rest_of_the_location(
        tmp_path: Path, short_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PACKHORSE_EXECUTOR__POOL", "thread")
    source = short_root / "src"
    settings = load_config(write_site_config(tmp_path / "s", source=str(source), settle_seconds=0,
                                             bundle_max_wait_seconds=0))
    write_settled(source / "inst/shallow/a.dat", b"a shallow file")
    deep = "inst/deep/" + _deep_tree(source / "inst/deep", DEPTH - 2, "bottom.dat", b"at the bottom")
    db = Database(settings.database_url)
    db.upgrade()
    c = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    try:
        mark_locations(c)
        _run_in_thread(c)
        assert _registered(c) == {"inst/shallow/a.dat", deep}
        assert _skipped(c) == {}
        assert _failed(c) == []
    finally:
        db.dispose()


def test_packhorse_validate_accepts_a_bag_folder_2000_levels_deep(short_root: Path) -> None:
    bag = short_root / "bag"
    data = b"deep payload\n"
    rel = _deep_tree(bag / "data", DEPTH - 1, "f.dat", data)
    (bag / "bagit.txt").write_bytes(b"BagIt-Version: 1.0\nTag-File-Character-Encoding: UTF-8\n")
    (bag / "manifest-sha256.txt").write_text(f"{hashlib.sha256(data).hexdigest()}  data/{rel}\n")
    r = run_packhorse("validate", str(bag))
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert r.stdout.startswith(f"VALID {bag} (BagIt 1.0"), r.stdout


def test_the_start_up_sweep_removes_a_partial_folder_2000_levels_deep(ctx: ProcessContext) -> None:
    # what a staging attempt of a deep package that crashed leaves in its location
    buffer = ctx.settings.location_path("cologne-buffer")
    partial = buffer / ".inst__obs.0123456789ab.packhorse-partial"
    _deep_tree(partial, DEPTH, "f.dat", b"left behind")
    os.utime(partial, (1_700_000_000, 1_700_000_000))
    assert sweep_partials(ctx) >= 1
    assert not partial.exists()
    assert sorted(p.name for p in buffer.iterdir()) == ["_packhorse"]  # only the identity marker's folder


class _FolderSwap(Hooks):
    """Storage layer of the source: at the second read of ``victim`` (the first is the scan's,
    the second the package build's), the folder holding it is swapped for a symbolic link to
    a folder outside the location for the time of that read, then put back."""

    def __init__(self, victim: str, outside: Path) -> None:
        self.victim = victim
        self.outside = outside
        self.reads = 0

    def storage_layer(self, backend: StorageBackend) -> StorageBackend:
        hooks = self

        class Swap(Layer):
            def open_read(self, key: str) -> BinaryIO:
                if key != hooks.victim or self.location != "fyst-source":
                    return self.inner.open_read(key)
                hooks.reads += 1
                if hooks.reads != 2:
                    return self.inner.open_read(key)
                folder = Path(self.inner.local_path(key)).parent  # type: ignore[attr-defined]
                aside = folder.with_name(folder.name + ".aside")
                os.rename(folder, aside)
                os.symlink(hooks.outside, folder)
                try:
                    return self.inner.open_read(key)
                finally:
                    os.unlink(folder)
                    os.rename(aside, folder)

        return Swap(backend)


def test_a_source_folder_swapped_for_a_symlink_while_packaged_is_taken_out_and_registered_again(
        ctx: ProcessContext, tmp_path: Path) -> None:
    root = _source(ctx)
    write_settled(root / "inst/obs/sub/victim.dat", b"victim bytes")
    write_settled(root / "inst/obs/sibling.dat", b"sibling bytes")
    outside = tmp_path / "outside"
    write_settled(outside / "victim.dat", b"not the source's bytes")
    ctx.hooks = hooks = _FolderSwap("inst/obs/sub/victim.dat", outside)
    _run_in_thread(ctx)
    assert hooks.reads >= 2, "the package build never read the file"
    assert _failed(ctx) == []
    withdrawn = ctx.db.read(lambda s: list(s.execute(select(WithdrawnFile.relative_path, WithdrawnFile.reason))))
    assert [p for p, _ in withdrawn] == ["inst/obs/sub/victim.dat"], withdrawn
    assert "not a regular file inside the location" in withdrawn[0][1]
    packages = dict(ctx.db.read(lambda s: list(s.execute(
        select(RawDataFile.relative_path, RawDataPackage.name)
        .join(RawDataPackage, RawDataFile.raw_data_package_id == RawDataPackage.id)))))
    assert packages == {"inst/obs/sibling.dat": "inst/obs", "inst/obs/sub/victim.dat": "inst/obs+2"}
    archived = ctx.db.read(lambda s: set(s.scalars(
        select(RawDataPackage.name).join(PhysicalCopy, PhysicalCopy.raw_data_package_id == RawDataPackage.id)
        .where(PhysicalCopy.location_id == ctx.topology.location_ids["cologne-lta"]))))
    assert archived == {"inst/obs", "inst/obs+2"}


PROCESSING = ('[[locations]]\nname = "cologne-processing"\nsite = "cologne"\nrole = "processing"\n'
              'path = "sites/cologne/processing"\n')


@pytest.mark.long  # seconds of real processes: out of the default selection
def test_a_package_2000_levels_deep_is_staged_and_verified(tmp_path: Path, short_root: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # the processing location's root is a long path: the staged bag's deepest names are longer
    # than PATH_MAX from there, so the extracted folder must be read below descriptors
    monkeypatch.setenv("PACKHORSE_EXECUTOR__POOL", "thread")
    source = short_root / "src"
    settings = load_config(write_site_config(tmp_path / ("s" * 60), source=str(source), settle_seconds=0,
                                             bundle_max_wait_seconds=0, extra=PROCESSING))
    deep = "inst/deep/" + _deep_tree(source / "inst/deep", DEPTH - 2, "bottom.dat", b"at the bottom")
    db = Database(settings.database_url)
    db.upgrade()
    c = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    try:
        mark_locations(c)
        _run_in_thread(c)
        assert _registered(c) == {deep}
        request_staging(c, "inst/deep", "cologne-processing")
        _run_in_thread(c)
        assert _failed(c) == []
        staged = c.db.read(lambda s: list(s.execute(
            select(Operation.status, Operation.retry_count).where(Operation.kind == OperationKind.STAGING.value))))
        assert staged == [(Status.COMPLETED.value, 0)]
        processing = settings.location_path("cologne-processing")
        assert not [p for p in processing.iterdir() if p.name.endswith(".packhorse-partial")]
    finally:
        db.dispose()
