"""Unpack takes raw packages out of a bundle in memory (up to ``IN_MEMORY_BYTES``) or as a
stream (larger ones): either way the archives end up with the same verified bytes."""

from __future__ import annotations

import hashlib
import os
import tarfile

import pytest
from sqlalchemy import func, select

from packhorse.db.models import PhysicalCopy, RawDataPackage
from packhorse.executors.local import LocalRunner
from packhorse.stages import unpack
from packhorse.context import ProcessContext

from support import write_settled


@pytest.mark.parametrize("in_memory_bytes", [unpack.IN_MEMORY_BYTES, 0], ids=["in-memory", "streamed"])
def test_both_ways_archive_the_same_verified_bytes(pipeline_ctx: ProcessContext, monkeypatch: pytest.MonkeyPatch,
                                                   in_memory_bytes: int) -> None:
    ctx = pipeline_ctx
    monkeypatch.setattr(unpack, "IN_MEMORY_BYTES", in_memory_bytes)
    source = ctx.settings.location_path("fyst-source")
    files = {f"n/obs-{g}/f{i}.dat": os.urandom(1000 * i + g) for g in range(3) for i in range(5)}
    for rel, data in files.items():
        write_settled(source / rel, data)
    LocalRunner(ctx).run(until_idle=True)

    def archived(s):  # type: ignore[no-untyped-def]
        return list(s.execute(select(RawDataPackage.name, RawDataPackage.sha256.label("package_sha256"),
                                     PhysicalCopy.location_id, PhysicalCopy.path,
                                     PhysicalCopy.sha256.label("copy_sha256"), PhysicalCopy.verified_at)
                              .join(PhysicalCopy, PhysicalCopy.raw_data_package_id == RawDataPackage.id)
                              .where(PhysicalCopy.status == "present")))

    rows = ctx.db.read(archived)
    lta = {ctx.topology.location_ids["cologne-lta"], ctx.topology.location_ids["cornell-lta"]}
    assert sorted((r.name, r.location_id) for r in rows) == sorted((f"n/obs-{g}", loc) for g in range(3) for loc in lta)
    seen: dict[str, bytes] = {}
    for r in rows:
        assert r.verified_at is not None and r.copy_sha256 == r.package_sha256
        path = ctx.settings.location_path(ctx.location_name(r.location_id)) / r.path
        assert hashlib.sha256(path.read_bytes()).hexdigest() == r.package_sha256
        with tarfile.open(path) as tar:
            for m in tar.getmembers():
                if "/data/" in m.name:
                    f = tar.extractfile(m)
                    assert f is not None
                    seen[m.name.split("/data/", 1)[1]] = f.read()
    assert seen == files


def test_an_unpack_syncs_its_buffer_folder_once_and_records_nothing_when_that_fails(
        pipeline_ctx: ProcessContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every raw package of a bundle goes into the buffer's raw/ folder: one fsync of it for all
    of them (storage.syncbatch), before any copy is recorded. When that fsync fails the names
    may not survive a crash: the attempt records no copy there (not even the salvage of a failed
    unpack) and the retry publishes them again ("already there")."""
    from packhorse.storage import syncbatch

    ctx = pipeline_ctx
    source = ctx.settings.location_path("fyst-source")
    for g in range(3):
        write_settled(source / f"n/obs-{g}/f.dat", os.urandom(2000 + g))
    raw = str(ctx.settings.location_path("cologne-buffer") / "raw" / "n")  # keys raw/n/obs-G.tar
    synced: list[str] = []
    real = syncbatch.fsync_folder
    failures = {"left": 1}
    recorded_at_failure: list[int] = []

    def spy(path):  # type: ignore[no-untyped-def]
        synced.append(os.fspath(path))
        if os.fspath(path) == raw and failures["left"]:
            failures["left"] -= 1
            recorded_at_failure.append(len(copies_at_cologne_buffer()))
            raise OSError(5, "Input/output error")
        real(path)

    def copies_at_cologne_buffer() -> list[int]:
        loc = ctx.topology.location_ids["cologne-buffer"]
        return ctx.db.read(lambda s: list(s.scalars(select(PhysicalCopy.id).where(
            PhysicalCopy.location_id == loc, PhysicalCopy.raw_data_package_id.is_not(None)))))

    monkeypatch.setattr(syncbatch, "fsync_folder", spy)
    LocalRunner(ctx).run(until_idle=True)
    assert recorded_at_failure == [0]  # nothing recorded before the failed fsync
    from packhorse.db.models import Operation

    loc = ctx.topology.location_ids["cologne-buffer"]
    attempts = ctx.db.read(lambda s: s.scalar(select(func.sum(Operation.attempt)).where(
        Operation.kind == "unpack", Operation.destination_location_id == loc)))
    assert attempts >= 2  # the failed one and its retry
    unpacks = ctx.db.read(lambda s: s.scalar(select(func.count()).select_from(Operation).where(
        Operation.kind == "unpack", Operation.destination_location_id == loc)))
    # the three packages go into raw/n, one fsync of the folder per unpack operation (however
    # many of them its bundle carries); a retry finds them already there and publishes nothing
    assert synced.count(raw) == unpacks
    rows = ctx.db.read(lambda s: list(s.execute(select(RawDataPackage.name, RawDataPackage.archived_at))))
    assert len(rows) == 3 and all(r.archived_at is not None for r in rows)
