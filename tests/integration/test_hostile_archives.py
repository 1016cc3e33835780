"""Hostile and tampered tars met by the real stages (DESIGN.md I6), on the embedded pipeline:

- staging from a tampered archive copy fails permanently (not retried) and the processing
  location never gets a single entry (watched with inotify while the stage runs);
- staging a package whose archived tar is itself hostile (the CVE-2025-4517 link chain, its
  sha256 the recorded one) is refused permanently and nothing outside changes;
- unpack of a bundle carrying a hostile raw package fails permanently, publishes nothing of
  it, and the rest of the pipeline goes on.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest
from sqlalchemy import select, update

from hostile_tars import cve_2025_4517_chain, snapshot, special
from inotify_watch import FolderWatch
from packhorse.config import load_config
from packhorse.db.models import FailureEvent, Operation, PhysicalCopy, RawDataPackage
from packhorse.db.session import Database
from packhorse.domain import OperationKind, Status
from packhorse.executors.local import LocalRunner
from packhorse.managers.staging import request_staging
from packhorse.rules.availability import mark_locations
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from packhorse.stages import unpack
from support import write_settled, write_site_config

PROCESSING = ('[[locations]]\nname = "cologne-processing"\nsite = "cologne"\nrole = "processing"\n'
              'path = "sites/cologne/processing"\n')


@pytest.fixture
def ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ProcessContext:
    monkeypatch.setenv("PACKHORSE_EXECUTOR__POOL", "thread")
    settings = load_config(write_site_config(tmp_path / "site", bundle_max_wait_seconds=0, extra=PROCESSING))
    db = Database(settings.database_url)
    db.upgrade()
    c = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    mark_locations(c)  # as `packhorse init` does: every location root exists and is marked
    yield c
    db.dispose()


def _fill_source(ctx: ProcessContext) -> None:
    source = ctx.settings.location_path("fyst-source")
    for unit in ("obs-1", "obs-2"):
        write_settled(source / "chai" / unit / "frame.fits", os.urandom(5000))
        write_settled(source / "chai" / unit / "log.txt", f"log of {unit}\n".encode())


def _ops(ctx: ProcessContext, kind: OperationKind) -> list[Operation]:
    return ctx.db.read(lambda s: list(s.scalars(select(Operation).where(Operation.kind == kind.value))))


def _failures(ctx: ProcessContext, op_id: int) -> list[FailureEvent]:
    return ctx.db.read(lambda s: list(s.scalars(select(FailureEvent).where(FailureEvent.operation_id == op_id))))


def _archive_copies(ctx: ProcessContext, name: str) -> list[Path]:
    def q(s):  # type: ignore[no-untyped-def]
        return list(s.execute(select(PhysicalCopy.location_id, PhysicalCopy.path)
                              .join(RawDataPackage, PhysicalCopy.raw_data_package_id == RawDataPackage.id)
                              .where(RawDataPackage.name == name)))
    out = []
    for loc_id, path in ctx.db.read(q):
        loc = ctx.location_name(loc_id)
        if loc.endswith("-lta"):
            out.append(ctx.settings.location_path(loc) / path)
    return out


def _replace(path: Path, data: bytes) -> None:
    os.chmod(path, 0o644)
    path.write_bytes(data)


def _members(data: bytes) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    out = []
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar.getmembers():
            f = tar.extractfile(m) if m.isreg() else None
            out.append((m, f.read() if f else None))
    return out


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for m, d in members:
            if d is not None:
                m.size = len(d)
            tar.addfile(m, io.BytesIO(d) if d is not None else None)
    return buf.getvalue()


def test_staging_a_tampered_archive_copy_fails_permanently_before_writing(ctx: ProcessContext) -> None:
    _fill_source(ctx)
    LocalRunner(ctx).run(until_idle=True)
    for path in _archive_copies(ctx, "chai/obs-1"):  # every archive copy: no good source left
        good = path.read_bytes()
        at = good.index(b"log of obs-1")
        _replace(path, good[:at] + b"LOG" + good[at + 3:])  # same size, other bytes
    root = ctx.settings.location_path("cologne-processing")
    root.mkdir(parents=True, exist_ok=True)
    watch = FolderWatch(root)
    try:
        request_staging(ctx, "chai/obs-1", "cologne-processing")
        LocalRunner(ctx).run(until_idle=True)
        events = watch.events()
    finally:
        watch.close()
    assert events == [], events  # not one entry created, written or removed
    (op,) = _ops(ctx, OperationKind.STAGING)
    assert op.status == Status.FAILED.value and op.retry_count == 0
    (failure,) = _failures(ctx, op.id)
    assert failure.error_type == "SourceChangedError" and failure.will_retry is False
    assert "raw/chai/obs-1.tar: the archive copy has" in failure.message
    assert "nothing was extracted" in failure.message


def test_staging_a_hostile_package_is_refused_and_nothing_outside_changes(ctx: ProcessContext) -> None:
    _fill_source(ctx)
    LocalRunner(ctx).run(until_idle=True)
    site = ctx.settings.base_dir
    outside = site / "sites" / "cologne" / "outside"
    outside.mkdir(parents=True)
    (outside / "sentinel.txt").write_bytes(b"keep")
    copies = _archive_copies(ctx, "chai/obs-1")
    good = copies[0].read_bytes()
    hostile = _tar([*_members(good), *cve_2025_4517_chain(str(outside), prefix="chai__obs-1/data/")])
    for path in copies:
        _replace(path, hostile)
    # the package as recorded is the hostile tar (it would pass any checksum)
    digest = hashlib.sha256(hostile).hexdigest()
    ctx.db.transact(lambda s: s.execute(update(RawDataPackage).where(RawDataPackage.name == "chai/obs-1")
                                        .values(sha256=digest, size=len(hostile))))
    ctx.db.transact(lambda s: s.execute(update(PhysicalCopy).where(PhysicalCopy.path == "raw/chai/obs-1.tar")
                                        .values(sha256=digest, size=len(hostile))))
    root = ctx.settings.location_path("cologne-processing")
    before = snapshot(site / "sites", skip=root)
    request_staging(ctx, "chai/obs-1", "cologne-processing")
    LocalRunner(ctx).run(until_idle=True)
    (op,) = _ops(ctx, OperationKind.STAGING)
    assert op.status == Status.FAILED.value and op.retry_count == 0
    (failure,) = _failures(ctx, op.id)
    assert failure.error_type == "UnsafePathError" and failure.will_retry is False
    assert "raw/chai/obs-1.tar: refused tar member " in failure.message and "is a symbolic link" in failure.message
    assert snapshot(site / "sites", skip=root) == before
    assert not list(outside.glob("evil*"))
    # nothing staged; only the location's own folder (its identity marker, `_packhorse/`) is there
    assert not root.exists() or [p.name for p in root.iterdir() if p.name != "_packhorse"] == []


def test_unpack_of_a_bundle_carrying_a_hostile_package_fails_permanently(ctx: ProcessContext,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _fill_source(ctx)
    real_unpack = unpack.unpack_bundle
    served: list[str] = []

    def hostile_bundle(work, stream, *, buf, **kw):  # type: ignore[no-untyped-def]
        """What the unpack stage reads at cologne-buffer: the bundle with a symlink added to one
        raw package (as if the transfer had carried a hostile package)."""
        if buf.location != "cologne-buffer":
            return real_unpack(work, stream, buf=buf, **kw)
        out = []
        for m, d in _members(stream.read()):
            if m.name.endswith("/data/chai/obs-1.tar") and d is not None:
                inner = _members(d)
                link = special(inner[0][0].name.split("/")[0] + "/data/link", tarfile.SYMTYPE, "/etc/passwd")
                d = _tar([*inner, link])
                served.append(m.name)
            out.append((m, d))
        return real_unpack(work, io.BytesIO(_tar(out)), buf=buf, **kw)

    monkeypatch.setattr(unpack, "unpack_bundle", hostile_bundle)
    LocalRunner(ctx).run(until_idle=True)
    assert served, "the bundle was never read at cologne-buffer"
    unpacks = [o for o in _ops(ctx, OperationKind.UNPACK)
               if ctx.location_name(o.destination_location_id) == "cologne-buffer"]
    failed = [o for o in unpacks if o.status == Status.FAILED.value]
    assert len(failed) == 1 and failed[0].retry_count == 0
    (failure,) = _failures(ctx, failed[0].id)
    assert failure.error_type == "UnsafePathError" and failure.will_retry is False
    assert "cologne-buffer:bundles/" in failure.message and ":chai/obs-1.tar: refused tar member " in failure.message
    assert "/data/link': is a symbolic link (to '/etc/passwd')" in failure.message
    buffer = ctx.settings.location_path("cologne-buffer")
    assert not list(buffer.rglob("*obs-1*"))  # neither published nor a partial write left
    # the other destination is not affected: both packages archived at cornell
    assert {p.parent.name + "/" + p.name for p in (ctx.settings.location_path("cornell-lta") / "raw").rglob("*.tar")} \
        == {"chai/obs-1.tar", "chai/obs-2.tar"}


def test_a_package_unpacked_before_a_hostile_one_is_recorded_and_archived(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # the bundle carries chai/obs-1 (good) then chai/obs-2 (hostile): obs-1 is published and
    # verified before obs-2 is refused; it used to stay in the buffer with no copy row, never
    # archived and never cleaned up (found by a new-user trial)
    monkeypatch.setenv("PACKHORSE_EXECUTOR__POOL", "thread")
    # both packages in one bundle: it closes at their joint size (well above one package)
    settings = load_config(write_site_config(tmp_path / "site", bundle_target_bytes=30000,
                                             bundle_max_wait_seconds=60))
    db = Database(settings.database_url)
    db.upgrade()
    ctx = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    mark_locations(ctx)  # as `packhorse init` does
    _fill_source(ctx)
    real_unpack = unpack.unpack_bundle

    def hostile_bundle(work, stream, *, buf, **kw):  # type: ignore[no-untyped-def]
        if buf.location != "cologne-buffer":
            return real_unpack(work, stream, buf=buf, **kw)
        out = []
        for m, d in _members(stream.read()):
            if m.name.endswith("/data/chai/obs-2.tar") and d is not None:
                inner = _members(d)
                d = _tar([*inner, special(inner[0][0].name.split("/")[0] + "/data/link", tarfile.SYMTYPE, "/")])
            out.append((m, d))
        return real_unpack(work, io.BytesIO(_tar(out)), buf=buf, **kw)

    monkeypatch.setattr(unpack, "unpack_bundle", hostile_bundle)
    LocalRunner(ctx).run(until_idle=True)
    unpacks = [o for o in _ops(ctx, OperationKind.UNPACK)
               if ctx.location_name(o.destination_location_id) == "cologne-buffer"]
    assert [o.status for o in unpacks] == [Status.FAILED.value]  # one bundle, refused at obs-2
    buffer_id = ctx.topology.location_ids["cologne-buffer"]

    def copies(s):  # type: ignore[no-untyped-def]
        return sorted(s.execute(select(RawDataPackage.name, PhysicalCopy.status).join(
            PhysicalCopy, PhysicalCopy.raw_data_package_id == RawDataPackage.id).where(
            PhysicalCopy.location_id == buffer_id)).all())

    assert [name for name, _ in ctx.db.read(copies)] == ["chai/obs-1"]  # its row, whatever its status now
    buffer = ctx.settings.location_path("cologne-buffer")
    assert not list(buffer.rglob("*obs-2*"))  # nothing of the hostile package, not even a partial
    cologne = {p.relative_to(ctx.settings.location_path("cologne-lta")).as_posix()
               for p in ctx.settings.location_path("cologne-lta").rglob("*.tar")}
    assert cologne == {"raw/chai/obs-1.tar"}
    db.dispose()
