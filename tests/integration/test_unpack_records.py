"""An unpack records the buffer copies of all its bundle's raw data packages with a few
statements, not one a package (a site whose database is across a long link pays every
statement in a round trip: docs/benchmarks.md), and every copy row is there and right. The
embedded pipeline on SQLite, in threads of this process."""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any

import pytest
from sqlalchemy import event, select

from packhorse.db.models import PhysicalCopy, RawDataPackage
from packhorse.domain import OperationKind
from packhorse.executors.local import LocalRunner
from packhorse.runtime.context import ProcessContext
from support import write_settled


def test_an_unpack_records_its_bundles_copies_in_a_few_statements(pipeline_ctx: ProcessContext,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = pipeline_ctx
    import packhorse.stages as stages

    real = stages.STAGES[OperationKind.UNPACK]
    recording = threading.local()
    counted: list[list[str]] = []

    def unpack(work: Any) -> Any:
        recorder = real(work)

        def record(s: Any) -> None:
            recording.statements = []
            try:
                recorder(s)
            finally:
                counted.append(recording.statements)
                recording.statements = None

        return record

    def seen(conn: Any, cursor: Any, statement: str, *a: Any) -> None:
        if getattr(recording, "statements", None) is not None:
            recording.statements.append(statement)

    monkeypatch.setitem(stages.STAGES, OperationKind.UNPACK, unpack)
    event.listen(ctx.db.engine, "before_cursor_execute", seen)
    source = ctx.settings.location_path("fyst-source")
    for g in range(6):
        for i in range(2):
            write_settled(source / "night-1" / f"obs-{g}" / f"frame-{i}.dat", os.urandom(200 + i))
    LocalRunner(ctx).run(until_idle=True)
    event.remove(ctx.db.engine, "before_cursor_execute", seen)

    pkgs = ctx.db.read(lambda s: {p.id: (p.name, p.size, p.sha256) for p in s.scalars(select(RawDataPackage))})
    assert len(pkgs) == 6
    assert counted and all(len(c) <= 3 for c in counted), counted  # was one a package
    for buffer in ("cologne-buffer", "cornell-buffer"):
        loc = ctx.topology.location_ids[buffer]
        rows = ctx.db.read(lambda s, loc=loc: list(s.execute(select(
            PhysicalCopy.raw_data_package_id, PhysicalCopy.path, PhysicalCopy.size, PhysicalCopy.sha256)
            .where(PhysicalCopy.location_id == loc, PhysicalCopy.raw_data_package_id.is_not(None)))))
        assert {r.raw_data_package_id for r in rows} == set(pkgs)
        for r in rows:  # the row says what the bytes are (freed once archived: those still there)
            name, size, sha = pkgs[r.raw_data_package_id]
            assert (r.size, r.sha256) == (size, sha) and r.path.endswith(f"{name}.tar")
            path = ctx.settings.location_path(buffer) / r.path
            if path.exists():
                assert hashlib.sha256(path.read_bytes()).hexdigest() == sha
