"""Unpack takes raw packages out of a bundle in memory (up to ``IN_MEMORY_BYTES``) or as a
stream (larger ones): either way the archives end up with the same verified bytes."""

from __future__ import annotations

import hashlib
import os
import tarfile

import pytest
from sqlalchemy import select

from packhorse.db.models import PhysicalCopy, RawDataPackage
from packhorse.executors.local import LocalRunner
from packhorse.runtime.context import ProcessContext
from packhorse.stages import unpack
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
