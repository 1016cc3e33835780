"""``packhorse locate`` says who found a copy bad: ``packhorse verify`` (the operator's audit)
or the scheduled fixity check — also when a scheduled check of the same copy finished right
after the operator's audit found it (it then repaired it)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from packhorse.config import load_config
from packhorse.db.models import Operation, PhysicalCopy, RawDataPackage, utcnow
from packhorse.db.session import Database
from packhorse.domain import OperationKind
from packhorse.rules.availability import mark_locations
from packhorse.rules.fixity import Finding, record_findings
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from packhorse.status.locate import locate
from packhorse.status.reporting import verify_copies
from support import write_site_config

GOOD = b"the package's bytes"
KEY = "raw/cam/obs1.tar"


def _ctx(tmp_path: Path) -> ProcessContext:
    settings = load_config(write_site_config(tmp_path / "site"))
    db = Database(settings.database_url)
    db.upgrade()
    ctx = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    mark_locations(ctx)
    return ctx


def _package_with_a_rotted_copy(ctx: ProcessContext) -> int:
    """cam/obs1 archived at cologne-lta (rotted on disk since) and cornell-lta (good)."""
    loc = ctx.topology.location_ids
    sha = hashlib.sha256(GOOD).hexdigest()
    for name, data in (("cologne-lta", b"the package's bytez"), ("cornell-lta", GOOD)):
        path = Path(ctx.settings.location_path(name)) / KEY
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def tx(s) -> int:  # type: ignore[no-untyped-def]
        pkg = RawDataPackage(name="cam/obs1", group_path="cam/obs1", source_location_id=loc["fyst-source"],
                             bagging_date="2026-12-05", file_count=1, payload_bytes=len(GOOD), size=len(GOOD),
                             sha256=sha)
        s.add(pkg)
        s.flush()
        bad = PhysicalCopy(raw_data_package_id=pkg.id, location_id=loc["cologne-lta"], path=KEY, size=len(GOOD),
                           sha256=sha, status="present", verified_at=utcnow())
        s.add_all([bad, PhysicalCopy(raw_data_package_id=pkg.id, location_id=loc["cornell-lta"], path=KEY,
                                     size=len(GOOD), sha256=sha, status="present", verified_at=utcnow())])
        s.flush()
        return bad.id

    return ctx.db.transact(tx)


def _scheduled_check_finished(ctx: ProcessContext, copy_id: int) -> int:
    """The scheduled fixity check of that copy, finished just now (it repaired the copy)."""
    def tx(s) -> int:  # type: ignore[no-untyped-def]
        now = utcnow()
        op = Operation(kind=OperationKind.FIXITY_CHECK.value, status="COMPLETED",
                       dedup_key=f"fixity_check:copy{copy_id}@1.0->cologne-lta", site_id=ctx.topology.site_ids["cologne"],
                       attempt=1, retry_count=0, max_retries=3, stall_count=0, created_at=now, updated_at=now,
                       finished_at=now, bytes_done=0, physical_copy_id=copy_id,
                       raw_data_package_id=s.get(PhysicalCopy, copy_id).raw_data_package_id,
                       destination_location_id=ctx.topology.location_ids["cologne-lta"])
        s.add(op)
        s.flush()
        return op.id

    return ctx.db.transact(tx)


def _found(ctx: ProcessContext) -> str:
    r = ctx.db.read(lambda s: locate(s, "cam/obs1"))
    [e] = [e for e in r["packages"][0]["timeline"] if e["event"].startswith("found ")]
    return f"{e['event']}: {e['detail']}"


def test_a_copy_found_by_verify_is_said_to_be_found_by_verify(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    copy_id = _package_with_a_rotted_copy(ctx)
    report = verify_copies(ctx, "cologne-lta")  # what `packhorse verify --location cologne-lta` runs
    assert [c["path"] for c in report["corrupt"]] == [KEY]
    _scheduled_check_finished(ctx, copy_id)
    assert _found(ctx) == ("found corrupt: the package's copy (raw/cam/obs1.tar), by `packhorse verify` (the "
                           "operator's audit); now corrupt")


def test_a_copy_found_by_the_scheduled_check_keeps_its_label(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    copy_id = _package_with_a_rotted_copy(ctx)
    op_id = _scheduled_check_finished(ctx, copy_id)
    bad = Finding(copy_id, "cologne-lta", KEY, len(GOOD), hashlib.sha256(GOOD).hexdigest(), "corrupt",
                  raw_data_package_id=1)
    ctx.db.transact(lambda s: record_findings(s, ctx, [bad], operation_id=op_id))
    assert _found(ctx) == ("found corrupt: the package's copy (raw/cam/obs1.tar), by the scheduled fixity check; "
                           "now corrupt")
