"""The dashboard's data: the history on one time grid (throughput from completed operations,
backlog from bounded samples, disk usage, failures), FAILED operations grouped by cause with a
bulk reset of one group, and "where is my file" with every copy and a timeline."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from dashboard_support import NOW, make_ctx, world
from packhorse.actions.failure_groups import failure_groups, reset_group
from packhorse.db.models import AuditEntry, BacklogSample, Operation
from packhorse.domain import OperationKind
from packhorse.errors import EmptyReasonError, HistoryWindowError, LocateQueryError
from packhorse.status.history import history, record_backlog
from packhorse.status.locate import locate


def test_history_puts_throughput_backlog_disk_and_failures_on_one_grid(tmp_path: Path, empty_db) -> None:
    ctx = make_ctx(tmp_path, empty_db)
    world(ctx)
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
    ctx = make_ctx(tmp_path, empty_db)
    world(ctx)
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
    ctx = make_ctx(tmp_path, empty_db)
    ids = world(ctx)
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
    ctx = make_ctx(tmp_path, empty_db)
    world(ctx)
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
    ctx = make_ctx(tmp_path, empty_db)
    world(ctx)
    r = empty_db.read(lambda s: locate(s, "cam/obs1"))
    assert r["matched"] == "package" and r["also_folder"] is False
    assert [p["name"] for p in r["packages"]] == ["cam/obs1", "cam/obs1+2"]  # the later files' package too
    assert [v["path"] for v in r["versions"]] == ["cam/obs1/a.dat", "cam/obs1/b.dat"]
    b = empty_db.read(lambda s: locate(s, "fyst-b1"))
    assert b["matched"] == "bundle" and b["packages"][0]["members"] == ["cam/obs1"]
    assert [e["event"] for e in b["packages"][0]["timeline"]][:3] == ["bundled", "shipped", "shipped"]
    folder = empty_db.read(lambda s: locate(s, "cam/"))  # a folder above the groups
    assert folder["matched"] == "folder" and [p["name"] for p in folder["packages"]] == ["cam/obs1", "cam/obs1+2"]
    assert len(folder["versions"]) == 3
    assert empty_db.read(lambda s: locate(s, "ca"))["matched"] is None  # a name prefix is not a folder
    nothing = empty_db.read(lambda s: locate(s, "cam/none"))
    assert nothing["matched"] is None and nothing["packages"] == [] and nothing["versions"] == []
    with pytest.raises(LocateQueryError):
        empty_db.read(lambda s: locate(s, "  "))


def test_a_package_whose_name_is_also_a_folder_of_other_groups_says_so(tmp_path: Path, empty_db) -> None:
    # package "cam" (a file right under cam/) and the groups cam/obs1, …: `locate cam` found the
    # package and said nothing of the folder (found by a trial)
    from packhorse.db.models import RawDataFile, RawDataPackage

    ctx = make_ctx(tmp_path, empty_db)
    world(ctx)
    src = ctx.topology.location_ids["fyst-source"]

    def tx(s) -> None:  # type: ignore[no-untyped-def]
        top = RawDataPackage(name="cam", group_path="cam", source_location_id=src, bagging_date="2026-12-01",
                             file_count=1, payload_bytes=4)
        s.add(top)
        s.flush()
        s.add(RawDataFile(location_id=src, relative_path="cam/notes.txt", group_path="cam", size=4, sha256="e" * 64,
                          mtime_ns=10**18, raw_data_package_id=top.id, registered_at=NOW))

    empty_db.transact(tx)
    r = empty_db.read(lambda s: locate(s, "cam"))
    assert r["matched"] == "package" and r["also_folder"] is True
    assert [v["path"] for v in r["versions"]] == ["cam/notes.txt"]
    folder = empty_db.read(lambda s: locate(s, "cam/"))
    assert folder["matched"] == "folder" and "cam/obs1" in [p["name"] for p in folder["packages"]]


def test_history_looks_up_the_files_carried_in_bounded_id_lists(tmp_path: Path, empty_db, monkeypatch) -> None:
    """A week of completed operations can exceed SQLite's bound-parameter limit: the lookups of
    their packages go in chunks, with the same answer."""
    import packhorse.status.history

    ctx = make_ctx(tmp_path, empty_db)
    world(ctx)
    whole = empty_db.read(lambda s: history(s, ctx.settings, minutes=15, now=NOW))
    monkeypatch.setattr(packhorse.status.history, "IN_CHUNK", 1)
    chunked = empty_db.read(lambda s: history(s, ctx.settings, minutes=15, now=NOW))
    assert chunked == whole and sum(whole["throughput"]["transfer"]["files_per_minute"]) == 4
