"""The permanent-failure mail's ``Host:`` line names the machine the failing attempt ran on
(the worker's host), not the data location; the location has a line of its own."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from packhorse.db.models import Notification
from packhorse.db.session import Database
from packhorse.domain import OperationKind
from packhorse.engine.outcome import record_failure
from packhorse.errors import DestinationWriteError
from packhorse.operations.lifecycle import claim, create_operation
from support import seed_rows


@pytest.fixture
def db(empty_db: Database) -> Database:
    seed_rows(empty_db, "cologne", [("cologne-buffer", "buffer"), ("cologne-lta", "long_term_archive")],
              [("cam/obs1", "cam/obs1")])
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
