"""A small ops-database world for the dashboard's data tests (history, failure groups, locate),
on SQLite or PostgreSQL: ``world(ctx)`` writes it and returns the ids; times are around ``NOW``."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from packhorse.config import load_config
from packhorse.db.models import (
    DataTransferPackage,
    DiskUsageSample,
    FailureEvent,
    Operation,
    PhysicalCopy,
    RawDataFile,
    RawDataPackage,
)
from packhorse.domain import OperationKind
from packhorse.rules.availability import mark_locations
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from support import write_site_config

NOW = dt.datetime(2026, 12, 1, 12, 0, 30, tzinfo=dt.timezone.utc)


def make_ctx(tmp_path: Path, db) -> ProcessContext:
    settings = load_config(write_site_config(tmp_path / "site"))
    ctx = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    mark_locations(ctx)  # as `packhorse init` does: every location root exists and is marked
    return ctx


def _op(s, ctx, kind: OperationKind, status: str, n: int, at: dt.datetime, **kw) -> Operation:
    op = Operation(kind=kind.value, status=status, dedup_key=f"{kind.value}:{n}", site_id=ctx.topology.site_ids["fyst"],
                   attempt=1, retry_count=0, max_retries=0, stall_count=0, created_at=at, updated_at=at,
                   finished_at=at if status == "COMPLETED" else None, bytes_done=kw.pop("bytes_done", 0), **kw)
    s.add(op)
    s.flush()
    return op


def world(ctx: ProcessContext) -> dict[str, int]:
    """Package cam/obs1 (2 files) in a bundle shipped to cologne and cornell; the cornell
    transfer of a second bundle and two transfers to cologne FAILED for two causes."""
    loc = ctx.topology.location_ids

    def tx(s) -> dict[str, int]:
        t = NOW - dt.timedelta(minutes=10)
        dtp = DataTransferPackage(name="fyst-b1", source_site_id=ctx.topology.site_ids["fyst"], bagging_date="2026-12-01",
                                  package_count=1, size=3000, sha256="d" * 64, created_at=t)
        s.add(dtp)
        s.flush()
        pkg = RawDataPackage(name="cam/obs1", group_path="cam/obs1", source_location_id=loc["fyst-source"],
                             bagging_date="2026-12-01", file_count=2, payload_bytes=10, size=2048, sha256="b" * 64,
                             data_transfer_package_id=dtp.id, created_at=t, archived_at=NOW - dt.timedelta(minutes=2))
        later = RawDataPackage(name="cam/obs1+2", group_path="cam/obs1", source_location_id=loc["fyst-source"],
                               bagging_date="2026-12-01", file_count=1, payload_bytes=3, created_at=t)
        s.add_all([pkg, later])
        s.flush()
        for i, name in enumerate(("cam/obs1/a.dat", "cam/obs1/b.dat")):
            s.add(RawDataFile(location_id=loc["fyst-source"], relative_path=name, group_path="cam/obs1", size=5,
                              sha256=str(i) * 64, mtime_ns=10**18, raw_data_package_id=pkg.id, registered_at=t))
        s.add(RawDataFile(location_id=loc["fyst-source"], relative_path="cam/obs1/c.dat", group_path="cam/obs1", size=3,
                          sha256="c" * 64, mtime_ns=10**18, raw_data_package_id=later.id, registered_at=t))
        buf = PhysicalCopy(raw_data_package_id=pkg.id, location_id=loc["fyst-buffer"], path="raw/cam/obs1.tar", size=2048,
                           sha256="b" * 64, status="deleted", deleted_at=NOW - dt.timedelta(minutes=1))
        lta = PhysicalCopy(raw_data_package_id=pkg.id, location_id=loc["cologne-lta"], path="raw/cam/obs1.tar",
                           size=2048, sha256="b" * 64, status="present", verified_at=NOW - dt.timedelta(minutes=3))
        s.add_all([buf, lta])
        s.flush()
        ids = {"pkg": pkg.id}
        ids["packaged"] = _op(s, ctx, OperationKind.RAW_DATA_PACKAGE, "COMPLETED", 1, NOW - dt.timedelta(minutes=9),
                              raw_data_package_id=pkg.id, source_location_id=loc["fyst-source"],
                              destination_location_id=loc["fyst-buffer"], bytes_done=2048).id
        ids["bundled"] = _op(s, ctx, OperationKind.DATA_TRANSFER_PACKAGE, "COMPLETED", 2, NOW - dt.timedelta(minutes=8),
                             data_transfer_package_id=dtp.id, destination_location_id=loc["fyst-buffer"],
                             bytes_done=3000).id
        for n, dest in ((3, "cologne-buffer"), (4, "cornell-buffer")):
            _op(s, ctx, OperationKind.TRANSFER, "COMPLETED", n, NOW - dt.timedelta(minutes=7), data_transfer_package_id=dtp.id,
                source_location_id=loc["fyst-buffer"], destination_location_id=loc[dest], bytes_done=3000)
        _op(s, ctx, OperationKind.LONG_TERM_ARCHIVE, "COMPLETED", 5, NOW - dt.timedelta(minutes=3),
            raw_data_package_id=pkg.id, destination_location_id=loc["cologne-lta"], bytes_done=2048)
        _op(s, ctx, OperationKind.DELETION, "COMPLETED", 6, NOW - dt.timedelta(minutes=1), physical_copy_id=buf.id)
        failed = []
        for n, dest, etype in ((7, "cologne-buffer", "TransferCommandError"), (8, "cologne-buffer", "TransferCommandError"),
                               (9, "cologne-buffer", "VerificationError"), (10, "cornell-buffer", "TransferCommandError")):
            op = _op(s, ctx, OperationKind.TRANSFER, "FAILED", n, NOW - dt.timedelta(minutes=n - 6),
                     data_transfer_package_id=dtp.id, source_location_id=loc["fyst-buffer"],
                     destination_location_id=loc[dest])
            op.error_context = {"error_type": etype, "message": f"secret-{n}", "will_retry": False}
            s.add(FailureEvent(operation_id=op.id, kind="transfer", attempt=1, retry_count=0, error_type=etype,
                               message=f"secret-{n}", will_retry=False, error_context={}, created_at=op.updated_at))
            failed.append(op.id)
        ids["failed"] = failed  # type: ignore[assignment]
        for minutes, pct in ((5, 50.0), (2, 72.0)):
            s.add(DiskUsageSample(location_id=loc["cologne-lta"], measured_at=NOW - dt.timedelta(minutes=minutes),
                                  total_bytes=100, used_bytes=int(pct), free_bytes=100 - int(pct), percent=pct,
                                  level="normal", alert_level="normal"))
        return ids

    return ctx.db.transact(tx)


