"""Diagnostic reports: the diagnosis line cross-references the database, failure
events come newest first, stalled operations are recognised, and the live check skips object
storage."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from packhorse.config import load_config
from packhorse.db.models import (
    DataTransferPackage,
    FailureEvent,
    Operation,
    PhysicalCopy,
    RawDataPackage,
    utcnow,
)
from packhorse.domain import OperationKind
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from packhorse.status.diagnose import diagnose_operation, live_check
from support import no_such_pid, write_site_config

S3_LOCATION = '[[locations]]\nname = "cologne-s3"\nsite = "cologne"\nrole = "long_term_archive"\nstorage = "s3"\nbucket = "cologne-archive"\nactive = false\n'


def _ctx(tmp_path: Path, db) -> ProcessContext:
    settings = load_config(write_site_config(tmp_path / "site", extra=S3_LOCATION))
    return ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))


def _op(s, ctx, kind: OperationKind, status: str, **kw) -> Operation:
    now = utcnow()
    op = Operation(kind=kind.value, status=status, dedup_key=f"{kind.value}:{kw}:{status}", site_id=ctx.topology.site_ids["fyst"],
                   attempt=1, retry_count=0, max_retries=3, stall_count=0, created_at=now, updated_at=now, bytes_done=0, **kw)
    s.add(op)
    s.flush()
    return op


def _world(ctx: ProcessContext) -> dict[str, int]:
    """A bundle whose fyst-buffer copy a deletion removed, and a transfer that then failed."""
    loc = ctx.topology.location_ids
    t0 = utcnow() - dt.timedelta(hours=1)

    def tx(s) -> dict[str, int]:
        dtp = DataTransferPackage(name="fyst-bundle-1", source_site_id=ctx.topology.site_ids["fyst"], bagging_date="2026-11-30",
                                  package_count=1, size=10, sha256="a" * 64)
        s.add(dtp)
        s.flush()
        pkg = RawDataPackage(name="cam/obs1", group_path="cam/obs1", source_location_id=loc["fyst-source"],
                             bagging_date="2026-11-30", file_count=1, payload_bytes=5, size=20, sha256="b" * 64,
                             data_transfer_package_id=dtp.id)
        s.add(pkg)
        s.flush()
        copy = PhysicalCopy(data_transfer_package_id=dtp.id, location_id=loc["fyst-buffer"], path="bundles/fyst-bundle-1.tar",
                            size=10, sha256="a" * 64, status="deleted", deleted_at=t0, verified_at=t0)
        s3 = PhysicalCopy(raw_data_package_id=pkg.id, location_id=loc["cologne-s3"], path="raw/cam/obs1.tar", size=20,
                          sha256="b" * 64, status="present", verified_at=t0)
        s.add_all([copy, s3])
        s.flush()
        deletion = _op(s, ctx, OperationKind.DELETION, "COMPLETED", physical_copy_id=copy.id)
        transfer = _op(s, ctx, OperationKind.TRANSFER, "FAILED", data_transfer_package_id=dtp.id,
                       source_location_id=loc["fyst-buffer"], destination_location_id=loc["cologne-buffer"])
        ctx_err = {"error_type": "SourceMissingError", "message": "bundles/fyst-bundle-1.tar is gone", "will_retry": False,
                   "path": "bundles/fyst-bundle-1.tar", "traceback": "Traceback ..."}
        transfer.error_context = ctx_err
        for i, (etype, when) in enumerate([("VerificationError", t0), ("SourceMissingError", t0 + dt.timedelta(minutes=5))]):
            s.add(FailureEvent(operation_id=transfer.id, kind="transfer", attempt=i + 1, retry_count=i, error_type=etype,
                               message=etype, will_retry=i == 0, error_context={**ctx_err, "error_type": etype}, created_at=when))
        archive = _op(s, ctx, OperationKind.LONG_TERM_ARCHIVE, "IN_PROGRESS", raw_data_package_id=pkg.id,
                      destination_location_id=loc["cologne-lta"])
        archive.lease_owner, archive.lease_expires_at, archive.heartbeat_at = "host:1:worker", t0, t0
        return {"deletion": deletion.id, "transfer": transfer.id, "archive": archive.id}

    return ctx.db.transact(tx)


def test_the_diagnosis_names_the_deletion_that_removed_the_source(tmp_path: Path, empty_db) -> None:
    ctx = _ctx(tmp_path, empty_db)
    ids = _world(ctx)
    rep = empty_db.read(lambda s: diagnose_operation(s, OperationKind.TRANSFER, ids["transfer"]))
    assert rep["diagnosis"].startswith("the bytes to read are gone")
    assert f"was removed by deletion operation {ids['deletion']} at" in rep["diagnosis"]
    assert rep["diagnosis_source"] == "db"
    assert [e["error_type"] for e in rep["failure_events"]] == ["SourceMissingError", "VerificationError"]
    fyst = [c for c in rep["copies"] if c["location"] == "fyst-buffer"]
    assert fyst[0]["status"] == "deleted" and fyst[0]["artifact"] == "data_transfer_package"
    # a bundle is only ever kept in buffers: the report does not list it "absent" from the archives
    roles = {c["location"]: (c["role"], c["status"]) for c in rep["copies"]}
    assert {loc for loc, (role, _) in roles.items()} == {"fyst-buffer", "cologne-buffer", "cornell-buffer"}
    assert roles["cologne-buffer"] == ("buffer", "absent")


def test_a_conflict_at_an_archive_warns_that_the_object_may_be_earlier_archived_content(tmp_path: Path,
                                                                                          empty_db) -> None:
    # the diagnosis said "find out who wrote that object and move it aside": after an ops
    # database restored from an older backup, the object is the package's earlier archived
    # content, and moving it away loses it (found by a trial)
    ctx = _ctx(tmp_path, empty_db)
    loc = ctx.topology.location_ids

    def tx(s) -> int:
        op = _op(s, ctx, OperationKind.LONG_TERM_ARCHIVE, "FAILED", destination_location_id=loc["cologne-lta"])
        op.error_context = {"error_type": "DestinationConflictError", "will_retry": False, "host": "cologne-lta",
                            "path": "raw/cam/obs9.tar", "message": "cologne-lta: 'raw/cam/obs9.tar' already holds "
                                                                   "different bytes"}
        return op.id

    op_id = ctx.db.transact(tx)
    rep = empty_db.read(lambda s: diagnose_operation(s, OperationKind.LONG_TERM_ARCHIVE, op_id))
    assert rep["diagnosis"].startswith("the destination cologne-lta:raw/cam/obs9.tar already holds different bytes")
    assert "restored from a backup older than the archive" in rep["diagnosis"]
    assert "keep it" in rep["diagnosis"]


def test_a_stalled_operation_is_diagnosed_as_stalled(tmp_path: Path, empty_db) -> None:
    ctx = _ctx(tmp_path, empty_db)
    ids = _world(ctx)
    rep = empty_db.read(lambda s: diagnose_operation(s, OperationKind.LONG_TERM_ARCHIVE, ids["archive"]))
    assert rep["operation"]["stalled"] is True
    assert rep["diagnosis"].startswith("stalled: attempt 1 held by host:1:worker")


def test_an_attempt_whose_worker_is_gone_says_so_and_how_to_hand_it_out_now(tmp_path: Path, empty_db) -> None:
    # right after a kill -9 of `packhorse run`, of one of its worker processes or of a Celery
    # pool child, its leases are still valid for minutes: the diagnosis says the holder is gone
    # (its pid no longer runs on this host), when lease recovery takes it back, and the
    # command that does it now
    import socket

    from sqlalchemy import update

    ctx = _ctx(tmp_path, empty_db)
    ids = _world(ctx)
    gone = no_such_pid()
    later = utcnow() + dt.timedelta(minutes=4)
    host, me = socket.gethostname(), __import__("os").getpid()
    for owner, expect in ((f"{host}:{gone}:worker-{me}:MainThread", "its worker is gone"),  # the runner
                          (f"{host}:{me}:worker-{gone}:MainThread", "its worker is gone"),  # its worker process
                          (f"{host}:{gone}:celery-0f3a9c2e", "its worker is gone"),  # a Celery pool child
                          (f"{host}:{me}:worker-{me}:MainThread", "running:"),
                          (f"{host}:{me}:celery-0f3a9c2e", "running:"),
                          (f"elsewhere:{gone}:worker-{gone}:MainThread", "running:")):
        empty_db.transact(lambda s, o=owner: s.execute(update(Operation).where(Operation.id == ids["archive"]).values(
            lease_owner=o, lease_expires_at=later, heartbeat_at=utcnow())))
        rep = empty_db.read(lambda s: diagnose_operation(s, OperationKind.LONG_TERM_ARCHIVE, ids["archive"]))
        assert rep["diagnosis"].startswith(expect), (owner, rep["diagnosis"])
        if expect == "its worker is gone":
            assert f"packhorse retry long_term_archive {ids['archive']}" in rep["diagnosis"]


def test_the_live_check_skips_object_storage_and_finds_missing_files(tmp_path: Path, empty_db) -> None:
    ctx = _ctx(tmp_path, empty_db)
    ids = _world(ctx)
    unmounted = live_check(ctx, OperationKind.LONG_TERM_ARCHIVE, ids["archive"])["checked"]
    assert unmounted[0]["location"] == "cologne-lta" and "is not reachable from" in unmounted[0]["error"]
    ctx.settings.location_path("cologne-lta").mkdir(parents=True)
    res = live_check(ctx, OperationKind.LONG_TERM_ARCHIVE, ids["archive"])
    assert res["skipped"] == [{"location": "cologne-s3", "storage": "s3", "reason": "object storage is not filesystem-checkable"}]
    checked = {c["location"]: c for c in res["checked"]}
    # the archive operation has not written its copy yet: looked at, not an alarm
    assert checked["cologne-lta"]["objects"] == [{"path": "raw/cam/obs1.tar", "expected_size": 20, "exists": False,
                                                  "size": None, "ok": True, "expect": "not_required",
                                                  "note": "not written yet"}]
    # the bundle's buffer copy that a deletion removed on purpose is no alarm either
    ctx.settings.location_path("fyst-buffer").mkdir(parents=True)
    transfer = {c["location"]: c for c in live_check(ctx, OperationKind.TRANSFER, ids["transfer"])["checked"]}
    assert transfer["fyst-buffer"]["objects"][0]["note"].startswith("removed on purpose at")
    assert transfer["fyst-buffer"]["ok"] is True
    # a recorded present copy that is gone is one
    empty_db.transact(lambda s: s.add(PhysicalCopy(raw_data_package_id=s.get(Operation, ids["archive"]).raw_data_package_id,
                                                   location_id=ctx.topology.location_ids["cologne-lta"],
                                                   path="raw/cam/obs1.tar", size=20, sha256="b" * 64, status="present")))
    gone = {c["location"]: c for c in live_check(ctx, OperationKind.LONG_TERM_ARCHIVE, ids["archive"])["checked"]}
    assert gone["cologne-lta"]["ok"] is False and gone["cologne-lta"]["objects"][0]["expect"] == "present"
    target = ctx.settings.location_path("cologne-lta") / "raw" / "cam" / "obs1.tar"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"x" * 20)
    again = {c["location"]: c for c in live_check(ctx, OperationKind.LONG_TERM_ARCHIVE, ids["archive"])["checked"]}
    assert again["cologne-lta"]["ok"] is True
    target.write_bytes(b"x" * 19)
    short = {c["location"]: c for c in live_check(ctx, OperationKind.LONG_TERM_ARCHIVE, ids["archive"])["checked"]}
    assert short["cologne-lta"]["ok"] is False and short["cologne-lta"]["objects"][0]["size"] == 19


PROCESSING = '[[locations]]\nname = "cologne-processing"\nsite = "cologne"\nrole = "processing"\npath = "sites/cologne/processing"\n'


def test_the_live_check_of_a_healthy_package_raises_no_alarm(tmp_path: Path, empty_db) -> None:
    """A package packaged from its source, whose buffer copy a deletion removed on purpose, that
    is archived and staged into a processing folder: every operation on it checks ok, and a
    real fault (the archive copy gone) is still found."""
    from packhorse.db.models import RawDataFile

    settings = load_config(write_site_config(tmp_path / "site", extra=PROCESSING))
    ctx = ProcessContext(settings=settings, db=empty_db, topology=sync_topology(empty_db, settings))
    loc = ctx.topology.location_ids
    src = settings.location_path("fyst-source") / "cam" / "obs1"
    src.mkdir(parents=True)
    (src / "a.dat").write_bytes(b"alpha")
    archived = settings.location_path("cologne-lta") / "raw" / "cam" / "obs1.tar"
    archived.parent.mkdir(parents=True)
    archived.write_bytes(b"t" * 20)
    staged = settings.location_path("cologne-processing") / "cam" / "obs1"
    staged.mkdir(parents=True)
    (staged / "bagit.txt").write_text("BagIt-Version: 1.0\n")
    settings.location_path("fyst-buffer").mkdir(parents=True)
    t0 = utcnow() - dt.timedelta(hours=1)

    def tx(s) -> dict[str, int]:
        pkg = RawDataPackage(name="cam/obs1", group_path="cam/obs1", source_location_id=loc["fyst-source"],
                             bagging_date="2026-11-30", file_count=1, payload_bytes=5, size=20, sha256="b" * 64)
        s.add(pkg)
        s.flush()
        s.add(RawDataFile(location_id=loc["fyst-source"], relative_path="cam/obs1/a.dat", group_path="cam/obs1", size=5,
                          sha256="c" * 64, mtime_ns=0, raw_data_package_id=pkg.id))
        buf = PhysicalCopy(raw_data_package_id=pkg.id, location_id=loc["fyst-buffer"], path="raw/cam/obs1.tar", size=20,
                           sha256="b" * 64, status="deleted", deleted_at=t0)
        lta = PhysicalCopy(raw_data_package_id=pkg.id, location_id=loc["cologne-lta"], path="raw/cam/obs1.tar", size=20,
                           sha256="b" * 64, status="present", verified_at=t0)
        stg = PhysicalCopy(raw_data_package_id=pkg.id, location_id=loc["cologne-processing"], path="cam/obs1", size=20,
                           sha256="b" * 64, status="present", verified_at=t0)
        s.add_all([buf, lta, stg])
        s.flush()
        return {
            "package": _op(s, ctx, OperationKind.RAW_DATA_PACKAGE, "COMPLETED", raw_data_package_id=pkg.id,
                           source_location_id=loc["fyst-source"], destination_location_id=loc["fyst-buffer"]).id,
            "archive": _op(s, ctx, OperationKind.LONG_TERM_ARCHIVE, "COMPLETED", raw_data_package_id=pkg.id,
                           source_location_id=loc["cologne-buffer"], destination_location_id=loc["cologne-lta"]).id,
            "staging": _op(s, ctx, OperationKind.STAGING, "COMPLETED", raw_data_package_id=pkg.id,
                           destination_location_id=loc["cologne-processing"]).id,
            "deletion": _op(s, ctx, OperationKind.DELETION, "COMPLETED", physical_copy_id=buf.id).id,
        }

    ids = empty_db.transact(tx)
    kinds = {"package": OperationKind.RAW_DATA_PACKAGE, "archive": OperationKind.LONG_TERM_ARCHIVE,
             "staging": OperationKind.STAGING, "deletion": OperationKind.DELETION}
    for name, kind in kinds.items():
        res = live_check(ctx, kind, ids[name])
        assert res["checked"] and all(c["ok"] for c in res["checked"]), (name, res["checked"])
    by_loc = {c["location"]: c for c in live_check(ctx, OperationKind.RAW_DATA_PACKAGE, ids["package"])["checked"]}
    assert [o["path"] for o in by_loc["fyst-source"]["objects"]] == ["cam/obs1/a.dat"]  # raw files, no tar
    assert by_loc["cologne-processing"]["objects"][0]["expect"] == "folder"
    archived.unlink()
    (staged / "bagit.txt").unlink()
    (src / "a.dat").unlink()  # a source file removed after its package was built: no fault (a trial saw "PROBLEM")
    by_loc = {c["location"]: c for c in live_check(ctx, OperationKind.RAW_DATA_PACKAGE, ids["package"])["checked"]}
    assert not by_loc["cologne-lta"]["ok"] and not by_loc["cologne-processing"]["ok"] and by_loc["fyst-source"]["ok"]
    [source_file] = by_loc["fyst-source"]["objects"]
    assert (source_file["exists"], source_file["expect"]) == (False, "not_required") and "rebuild" in source_file["note"]


def test_the_overview_places_a_deletion_at_its_copy_location(tmp_path: Path, empty_db) -> None:
    from packhorse.status.overview import pipeline_overview

    ids = _world(_ctx(tmp_path, empty_db))
    counts = empty_db.read(lambda s: pipeline_overview(s))["counts"]
    assert {"kind": "deletion", "location": "fyst-buffer", "status": "COMPLETED", "count": 1} in counts
    ops = empty_db.read(lambda s: pipeline_overview(s))["operations"]
    assert [(o["operation_id"], o["status"], o["stalled"]) for o in ops] == [
        (ids["transfer"], "FAILED", False), (ids["archive"], "IN_PROGRESS", True)]


def test_a_due_pending_operation_names_its_dispatcher_or_says_none_is_alive(tmp_path: Path, empty_db) -> None:
    """PENDING and due: only `packhorse run` (embedded) or `packhorse manager` (distributed)
    hands it to a worker; with neither alive the diagnosis says so instead of "waiting for a
    worker"."""
    import os
    import socket

    from sqlalchemy import update

    from packhorse.recovery.health import record_heartbeat

    ctx = _ctx(tmp_path, empty_db)
    ids = _world(ctx)
    empty_db.transact(lambda s: s.execute(update(Operation).where(Operation.id == ids["archive"]).values(
        status="PENDING", lease_owner=None, lease_expires_at=None, heartbeat_at=None)))

    def diagnosis() -> str:
        return empty_db.read(lambda s: diagnose_operation(s, OperationKind.LONG_TERM_ARCHIVE, ids["archive"]))["diagnosis"]

    assert diagnosis().startswith("waiting to be handed to a worker, but no `packhorse run` or `packhorse manager` "
                                  "is alive")
    record_heartbeat(empty_db, "worker:cologne@x", kind="worker", host=socket.gethostname(), pid=os.getpid())
    assert "no `packhorse run` or `packhorse manager` is alive" in diagnosis()  # a worker does not dispatch
    record_heartbeat(empty_db, "manager@x", kind="manager", host=socket.gethostname(), pid=os.getpid())
    assert diagnosis() == "waiting to be handed to a worker by manager@x at its next cycle"
    # its last heartbeat 120 s ago: dead by the default 90 s, alive by a configured 300 s
    # ([recovery] service_dead_after_seconds, as `packhorse health` judges it)
    record_heartbeat(empty_db, "manager@x", kind="manager", host=socket.gethostname(), pid=os.getpid(),
                     now=utcnow() - dt.timedelta(seconds=120))
    assert "no `packhorse run` or `packhorse manager` is alive" in diagnosis()
    configured = empty_db.read(lambda s: diagnose_operation(s, OperationKind.LONG_TERM_ARCHIVE, ids["archive"],
                                                            dead_after_seconds=300))["diagnosis"]
    assert configured == "waiting to be handed to a worker by manager@x at its next cycle"


def test_an_operation_running_in_a_batch_names_its_batch_mates(tmp_path: Path, empty_db) -> None:
    """Operations of one task (a batch: one broker message in distributed mode) share their
    lease holder and stop or stall together: the diagnosis of one names the others."""
    from sqlalchemy import update

    ctx = _ctx(tmp_path, empty_db)
    ids = _world(ctx)
    later = utcnow() + dt.timedelta(minutes=4)
    owner = "elsewhere:4242:celery-0f3a9c2e"
    for op_id in (ids["archive"], ids["deletion"]):
        empty_db.transact(lambda s, i=op_id: s.execute(update(Operation).where(Operation.id == i).values(
            status="IN_PROGRESS", lease_owner=owner, lease_expires_at=later, heartbeat_at=utcnow())))
    rep = empty_db.read(lambda s: diagnose_operation(s, OperationKind.LONG_TERM_ARCHIVE, ids["archive"]))
    assert rep["diagnosis"].startswith("running:")
    assert f"it runs in one task (one message, one worker) with deletion {ids['deletion']}," in rep["diagnosis"]
    alone = empty_db.read(lambda s: diagnose_operation(s, OperationKind.TRANSFER, ids["transfer"]))
    assert "one task" not in alone["diagnosis"]
