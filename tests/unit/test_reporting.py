"""``status_report``: package counts mean what an operator reads into them."""

from __future__ import annotations

from pathlib import Path

from packhorse.config import load_config
from packhorse.db.models import Operation, RawDataPackage, utcnow
from packhorse.db.session import Database
from packhorse.domain import OperationKind, Status
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from packhorse.status.reporting import status_report
from support import write_site_config


def _ctx(tmp_path: Path) -> ProcessContext:
    settings = load_config(write_site_config(tmp_path))
    db = Database(settings.database_url)
    db.upgrade()
    return ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))


def _package(ctx: ProcessContext, name: str, *, archived: bool, failed_kind: OperationKind) -> None:
    def tx(s):  # type: ignore[no-untyped-def]
        pkg = RawDataPackage(name=name, group_path=name, source_location_id=ctx.topology.location_ids["fyst-source"],
                             bagging_date="2026-11-29", file_count=1, payload_bytes=1,
                             archived_at=utcnow() if archived else None)
        s.add(pkg)
        s.flush()
        s.add(Operation(kind=failed_kind.value, status=Status.FAILED.value, dedup_key=f"{failed_kind.value}:{name}",
                        site_id=ctx.topology.site_ids["fyst"], raw_data_package_id=pkg.id, attempt=1,
                        retry_count=0, max_retries=3, stall_count=0, bytes_done=0,
                        error_context={"error_type": "X", "message": "boom"}))

    ctx.db.transact(tx)


def test_failed_deletion_of_an_archived_package_is_not_a_failed_package(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    _package(ctx, "a/archived", archived=True, failed_kind=OperationKind.DELETION)
    _package(ctx, "a/stuck", archived=False, failed_kind=OperationKind.LONG_TERM_ARCHIVE)
    r = status_report(ctx)
    assert r["packages"] == {"total": 2, "archived": 1, "failed": 1}
    assert sorted(f["kind"] for f in r["failed_operations"]) == ["deletion", "long_term_archive"]


def test_a_path_skipped_and_taken_out_of_its_package_is_one_entry_with_both_reasons(tmp_path: Path) -> None:
    from packhorse.db.models import SkippedFile, WithdrawnFile

    ctx = _ctx(tmp_path)
    src = ctx.topology.location_ids["fyst-source"]
    now = utcnow()

    def tx(s):  # type: ignore[no-untyped-def]
        s.add(SkippedFile(location_id=src, relative_path="i/o/f", reason="symbolic link (not followed)"))
        s.add(SkippedFile(location_id=src, relative_path="i/o/g", reason="not a regular file"))
        s.add(WithdrawnFile(location_id=src, relative_path="i/o/f", version=1, size=3, sha256="a" * 64, mtime_ns=1,
                            registered_at=now, package_name="i/o", cause="vanished", withdrawn_at=now,
                            reason="no longer a regular file in the location (a symbolic link?) (taken out of package i/o)"))

    ctx.db.transact(tx)
    r = status_report(ctx)
    assert r["skipped"] == [
        {"location": "fyst-source", "path": "i/o/f",
         "reason": "symbolic link (not followed); no longer a regular file in the location (a symbolic link?) "
                   "(taken out of package i/o)"},
        {"location": "fyst-source", "path": "i/o/g", "reason": "not a regular file"}]
