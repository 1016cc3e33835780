"""The dashboard's data: the history on one time grid (throughput from completed operations,
backlog from bounded samples, disk usage, failures), FAILED operations grouped by cause with a
bulk reset of one group, and "where is my file" with every copy and a timeline."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from packhorse.config import load_config
from packhorse.context import ProcessContext
from packhorse.db.models import (
    AuditEntry,
    BacklogSample,
    DataTransferPackage,
    DiskUsageSample,
    FailureEvent,
    Operation,
    PhysicalCopy,
    RawDataFile,
    RawDataPackage,
)
from packhorse.domain import OperationKind
from packhorse.failures import EmptyReasonError, failure_groups, reset_group
from packhorse.history import HistoryWindowError, history, record_backlog
from packhorse.locate import LocateQueryError, locate
from packhorse.topology import sync_topology
from support import write_site_config

NOW = dt.datetime(2026, 12, 1, 12, 0, 30, tzinfo=dt.timezone.utc)


def _ctx(tmp_path: Path, db) -> ProcessContext:
    settings = load_config(write_site_config(tmp_path / "site"))
    return ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))


def _op(s, ctx, kind: OperationKind, status: str, n: int, at: dt.datetime, **kw) -> Operation:
    op = Operation(kind=kind.value, status=status, dedup_key=f"{kind.value}:{n}", site_id=ctx.topology.site_ids["fyst"],
                   attempt=1, retry_count=0, max_retries=0, stall_count=0, created_at=at, updated_at=at,
                   finished_at=at if status == "COMPLETED" else None, bytes_done=kw.pop("bytes_done", 0), **kw)
    s.add(op)
    s.flush()
    return op


def _world(ctx: ProcessContext) -> dict[str, int]:
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


def test_history_puts_throughput_backlog_disk_and_failures_on_one_grid(tmp_path: Path, empty_db) -> None:
    ctx = _ctx(tmp_path, empty_db)
    _world(ctx)
    for minutes_ago in (4, 0):
        record_backlog(empty_db, interval_seconds=60, keep_days=7, now=NOW - dt.timedelta(minutes=minutes_ago))
    record_backlog(empty_db, interval_seconds=60, keep_days=7, now=NOW)  # a second sampler: one row per interval
    h = empty_db.read(lambda s: history(s, ctx.settings, minutes=15, now=NOW))
    n = len(h["times"])
    assert n == 15 and h["step_seconds"] == 60 and h["times"][-1] == int(NOW.timestamp()) // 60 * 60
    slot = lambda minutes_ago: n - 1 - minutes_ago  # noqa: E731
    tr = h["throughput"]["transfer"]
    assert tr["bytes_per_minute"][slot(7)] == 6000 and sum(tr["bytes_per_minute"]) == 6000
    assert tr["files_per_minute"][slot(7)] == 4  # two transfers of a bundle carrying 2 raw files
    assert h["throughput"]["raw_data_package"]["files_per_minute"][slot(9)] == 2
    assert h["throughput"]["deletion"]["files_per_minute"][slot(1)] == 2  # the copy's package
    backlog = h["backlog"]["transfer"]
    assert backlog["failed"][slot(0)] == 4 and backlog["failed"][slot(4)] == 4 and backlog["failed"][slot(2)] is None
    assert "unpack" not in h["backlog"]  # never had work
    assert sum(h["failures"]["transfer"]) == 4
    assert h["disk"]["cologne-lta"]["percent"][slot(2)] == 72.0 and h["disk"]["cologne-lta"]["percent"][slot(3)] is None
    assert h["thresholds"] == {"warning": 70.0, "critical": 85.0, "emergency": 95.0, "recovery": 60.0}
    assert "secret" not in repr(h)
    with pytest.raises(HistoryWindowError):
        history(empty_db.read(lambda s: s), ctx.settings, minutes=0)


def test_backlog_samples_are_one_per_interval_and_kind_and_pruned_after_keep_days(tmp_path: Path, empty_db) -> None:
    ctx = _ctx(tmp_path, empty_db)
    _world(ctx)
    old = NOW - dt.timedelta(days=8)
    record_backlog(empty_db, interval_seconds=60, keep_days=7, now=old)
    record_backlog(empty_db, interval_seconds=60, keep_days=7, now=old + dt.timedelta(seconds=10))
    count = lambda: empty_db.read(lambda s: s.query(BacklogSample).count())  # noqa: E731
    assert count() == len(OperationKind)
    record_backlog(empty_db, interval_seconds=60, keep_days=7, now=NOW)
    assert count() == len(OperationKind)  # the 8-day-old interval is gone
    # a later sample of the same interval (another process, or work that moved) replaces it
    empty_db.transact(lambda s: s.query(Operation).filter_by(status="FAILED").update({"status": "PENDING"}))
    record_backlog(empty_db, interval_seconds=60, keep_days=7, now=NOW + dt.timedelta(seconds=20))
    row = empty_db.read(lambda s: s.query(BacklogSample).filter_by(kind="transfer").one())
    assert (row.waiting, row.failed) == (4, 0)
    assert empty_db.read(lambda s: {b.measured_at for b in s.query(BacklogSample)}) == {NOW.replace(second=0)}


def test_failures_are_grouped_by_kind_location_and_error_type_and_a_group_resets(tmp_path: Path, empty_db) -> None:
    ctx = _ctx(tmp_path, empty_db)
    ids = _world(ctx)
    g = empty_db.read(failure_groups)
    assert g["failed"] == 4 and not g["truncated"]
    rows = [(x["kind"], x["location"], x["error_type"], x["count"]) for x in g["groups"]]
    assert rows == [("transfer", "cologne-buffer", "TransferCommandError", 2),
                    ("transfer", "cologne-buffer", "VerificationError", 1),
                    ("transfer", "cornell-buffer", "TransferCommandError", 1)]
    assert {o["operation_id"] for o in g["groups"][0]["operations"]} == set(ids["failed"][:2])
    with pytest.raises(EmptyReasonError):
        reset_group(ctx, OperationKind.TRANSFER, "cologne-buffer", "TransferCommandError", actor="t", reason=" ")
    done = reset_group(ctx, OperationKind.TRANSFER, "cologne-buffer", "TransferCommandError", actor="token:a",
                       reason="mount back")
    assert sorted(done) == sorted(ids["failed"][:2])
    status = empty_db.read(lambda s: {o.id: o.status for o in s.query(Operation).filter(Operation.id.in_(ids["failed"]))})
    assert [status[i] for i in ids["failed"]] == ["PENDING", "PENDING", "FAILED", "FAILED"]
    entry = empty_db.read(lambda s: s.query(AuditEntry).filter_by(action="operation.reset_group").one())
    assert entry.details["reason"] == "mount back" and sorted(entry.details["reset"]) == sorted(done)
    assert reset_group(ctx, OperationKind.TRANSFER, "cologne-buffer", "TransferCommandError", actor="t", reason="again") == []


def test_locate_a_source_file_shows_its_package_copies_and_timeline(tmp_path: Path, empty_db) -> None:
    ctx = _ctx(tmp_path, empty_db)
    _world(ctx)
    root = ctx.settings.location_path("fyst-source")
    for q in ("cam/obs1/a.dat", "fyst-source:cam/obs1/a.dat", f"{root}/cam/obs1/a.dat"):
        r = empty_db.read(lambda s: locate(s, q, settings=ctx.settings))
        assert r["matched"] == "file", q
        assert [(v["path"], v["package"]) for v in r["versions"]] == [("cam/obs1/a.dat", "cam/obs1")]
    p = r["packages"][0]
    assert p["name"] == "cam/obs1" and p["bundle"] == "fyst-b1"
    copies = {(c["location"], c["status"]): c for c in p["copies"]}
    assert copies[("cologne-lta", "present")]["verified_at"] == (NOW - dt.timedelta(minutes=3)).isoformat()
    assert ("fyst-buffer", "deleted") in copies
    events = [(e["event"], e["location"]) for e in p["timeline"]]
    assert events[:4] == [("registered", "fyst-source"), ("packaged", "fyst-buffer"), ("bundled", "fyst-buffer"),
                          ("shipped", "cologne-buffer")]
    assert ("archived", "cologne-lta") in events and ("deleted", "fyst-buffer") in events
    assert ("archived everywhere", None) in events and ("transfer failed", "cologne-buffer") in events
    times = [e["at"] for e in p["timeline"]]
    assert times == sorted(times)
    # observers see that an attempt failed, never why; admins see the error
    failed = [e for e in p["timeline"] if e["event"] == "attempt failed"]
    assert len(failed) == 4 and all(e["error_type"] is None and e["message"] is None for e in failed)
    admin = empty_db.read(lambda s: locate(s, "cam/obs1/a.dat", include_errors=True))
    assert {e["message"] for e in admin["packages"][0]["timeline"] if e["event"] == "attempt failed"} == {
        "secret-7", "secret-8", "secret-9", "secret-10"}


def test_locate_a_package_lists_its_versions_and_a_folder_its_packages(tmp_path: Path, empty_db) -> None:
    ctx = _ctx(tmp_path, empty_db)
    _world(ctx)
    r = empty_db.read(lambda s: locate(s, "cam/obs1"))
    assert r["matched"] == "package"
    assert [p["name"] for p in r["packages"]] == ["cam/obs1", "cam/obs1+2"]  # the later files' package too
    assert [v["path"] for v in r["versions"]] == ["cam/obs1/a.dat", "cam/obs1/b.dat"]
    b = empty_db.read(lambda s: locate(s, "fyst-b1"))
    assert b["matched"] == "bundle" and b["packages"][0]["members"] == ["cam/obs1"]
    assert [e["event"] for e in b["packages"][0]["timeline"]][:3] == ["bundled", "shipped", "shipped"]
    nothing = empty_db.read(lambda s: locate(s, "cam/none"))
    assert nothing["matched"] is None and nothing["packages"] == [] and nothing["versions"] == []
    with pytest.raises(LocateQueryError):
        empty_db.read(lambda s: locate(s, "  "))
