"""The permanent-failure mail's ``Host:`` line names the machine the failing attempt ran on
(the worker's host), not the data location; the location has a line of its own."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from packhorse.db.models import DataLocation, Notification, RawDataPackage, Site
from packhorse.db.session import Database
from packhorse.domain import OperationKind
from packhorse.engine.outcome import record_failure
from packhorse.errors import DestinationWriteError
from packhorse.operations.lifecycle import claim, create_operation


@pytest.fixture
def db(empty_db: Database) -> Database:
    def tx(s) -> None:  # type: ignore[no-untyped-def]
        s.add(Site(id=1, name="cologne"))
        s.flush()
        s.add(DataLocation(id=1, name="cologne-buffer", site_id=1, role="buffer", storage_type="disk", uri="/b"))
        s.add(DataLocation(id=2, name="cologne-lta", site_id=1, role="long_term_archive", storage_type="disk",
                           uri="/l"))
        s.flush()
        s.add(RawDataPackage(id=1, name="cam/obs1", group_path="cam/obs1", source_location_id=1,
                             bagging_date="2026-12-05", file_count=1, payload_bytes=10))

    empty_db.transact(tx)
    return empty_db


def test_the_failure_mail_names_the_worker_host_and_the_location_apart(db: Database) -> None:
    op = db.transact(lambda s: create_operation(s, kind=OperationKind.LONG_TERM_ARCHIVE, dedup_key="lta:1",
                                                site_id=1, max_retries=0, raw_data_package_id=1,
                                                source_location_id=1, destination_location_id=2))
    c = claim(db, op.id, "lta-node7:4242:worker", 30)
    assert c is not None
    exc = DestinationWriteError("cologne-lta: publish of raw/cam/obs1.tar failed: EIO", step="publish",
                                side="destination", path="raw/cam/obs1.tar", host="cologne-lta")
    record_failure(db, c, exc, backoff_base=0, backoff_max=0)
    [body] = db.read(lambda s: list(s.scalars(select(Notification.body))))
    lines = body.splitlines()
    assert "Host: lta-node7" in lines  # where: the machine
    assert "Host: cologne-lta" not in lines
    assert "Location: cologne-lta" in lines  # the error context names the location on its own line
    assert "Destination location: cologne-lta" in lines
