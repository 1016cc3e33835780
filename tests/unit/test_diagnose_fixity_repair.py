"""``packhorse diagnose`` of a fixity check that found its copy bad says what it is doing —
repairing that copy, from which copy — not "nothing to do"."""

from __future__ import annotations

import datetime as dt
import os
import socket

import pytest

from packhorse.db.models import DataLocation, Operation, PhysicalCopy, RawDataPackage, Site, utcnow
from packhorse.db.session import Database
from packhorse.domain import OperationKind
from packhorse.rules.fixity import live_copy_at
from packhorse.status.diagnose import diagnose_operation

KIND = OperationKind.FIXITY_CHECK
ME = f"{socket.gethostname()}:{os.getpid()}:worker"  # a live lease holder: this process


@pytest.fixture
def db(empty_db: Database) -> Database:
    def tx(s) -> None:  # type: ignore[no-untyped-def]
        s.add(Site(id=1, name="cologne"))
        s.add(Site(id=2, name="cornell"))
        s.flush()
        s.add(DataLocation(id=1, name="fyst-source", site_id=1, role="source", storage_type="disk", uri="/s"))
        s.add(DataLocation(id=2, name="cologne-lta", site_id=1, role="long_term_archive", storage_type="disk",
                           uri="/l"))
        s.add(DataLocation(id=3, name="cornell-lta", site_id=2, role="long_term_archive", storage_type="disk",
                           uri="/c"))
        s.flush()
        s.add(RawDataPackage(id=1, name="cam/obs1", group_path="cam/obs1", source_location_id=1,
                             bagging_date="2026-12-05", file_count=1, payload_bytes=10, size=20, sha256="b" * 64))
        s.flush()
        t = utcnow() - dt.timedelta(hours=1)
        s.add(PhysicalCopy(id=1, raw_data_package_id=1, location_id=2, path="raw/cam/obs1.tar", size=20,
                           sha256="b" * 64, status="corrupt", found_bad_at=t,
                           quarantined_as="_packhorse/quarantine/raw/cam/obs1.tar.20261206T0900Z-ab12",
                           quarantined_at=t))
        s.add(PhysicalCopy(id=2, raw_data_package_id=1, location_id=3, path="raw/cam/obs1.tar", size=20,
                           sha256="b" * 64, status="present", verified_at=t))

    empty_db.transact(tx)
    return empty_db


def fixity_op(db: Database, key: str, status: str) -> int:
    def tx(s) -> int:  # type: ignore[no-untyped-def]
        now = utcnow()
        op = Operation(kind=KIND.value, status=status, dedup_key=key, site_id=1, attempt=1, retry_count=0,
                       max_retries=3, stall_count=0, created_at=now, updated_at=now, bytes_done=4096,
                       physical_copy_id=1, raw_data_package_id=1, destination_location_id=2,
                       **(dict(lease_owner=ME, lease_expires_at=now + dt.timedelta(minutes=5), heartbeat_at=now)
                          if status == "IN_PROGRESS" else dict(finished_at=now) if status == "COMPLETED" else {}))
        s.add(op)
        s.flush()
        return op.id

    return db.transact(tx)


def test_a_repair_in_progress_says_what_it_repairs_and_from_where(db: Database) -> None:
    op_id = fixity_op(db, "fixity_check:repair-copy1@copy2->cologne-lta", "IN_PROGRESS")
    line = db.read(lambda s: diagnose_operation(s, KIND, op_id))["diagnosis"]
    assert "nothing to do" not in line
    assert line.startswith("running: repairing the corrupt copy raw/cam/obs1.tar at cologne-lta from "
                           "cornell-lta:raw/cam/obs1.tar (the bad object moved aside to "
                           "_packhorse/quarantine/raw/cam/obs1.tar.20261206T0900Z-ab12); attempt 1 by "), line


def test_a_completed_check_whose_copy_is_still_bad_names_the_repair(db: Database) -> None:
    check = fixity_op(db, "fixity_check:copy1@1.0->cologne-lta", "COMPLETED")
    repair = fixity_op(db, "fixity_check:repair-copy1@copy2->cologne-lta", "IN_PROGRESS")
    line = db.read(lambda s: diagnose_operation(s, KIND, check))["diagnosis"]
    assert "nothing to do" not in line
    assert line.endswith(f"the copy cologne-lta:raw/cam/obs1.tar is recorded corrupt; its repair is fixity_check "
                         f"{repair} (IN_PROGRESS: packhorse diagnose fixity_check {repair})"), line


def test_a_completed_check_whose_copy_was_repaired_since_has_nothing_to_do(db: Database) -> None:
    check = fixity_op(db, "fixity_check:copy1@1.0->cologne-lta", "COMPLETED")
    db.transact(lambda s: s.add(PhysicalCopy(id=3, raw_data_package_id=1, location_id=2, path="raw/cam/obs1.tar",
                                             size=20, sha256="b" * 64, status="present", verified_at=utcnow())))
    line = db.read(lambda s: diagnose_operation(s, KIND, check))["diagnosis"]
    assert line.endswith("; nothing to do"), line


def test_the_live_copy_query_is_per_artifact_and_location_and_leaves_out_the_copy_judged(db: Database) -> None:
    assert db.read(lambda s: live_copy_at(s, 3, 1, None)) == 2
    assert db.read(lambda s: live_copy_at(s, 3, 1, None, other_than=2)) is None
    assert db.read(lambda s: live_copy_at(s, 2, 1, None)) is None  # copy 1 there is corrupt
    assert db.read(lambda s: live_copy_at(s, 3, None, 1)) is None  # no data transfer package 1 there
