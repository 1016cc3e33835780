"""Layer 1: a permanent failure without a diagnosis gets one from the database alone
(``diagnosis_source = "auto-db"``), and a failing diagnoser never blocks recording/notifying."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from packhorse.db.models import (
    DataLocation,
    DataTransferPackage,
    FailureEvent,
    Notification,
    Operation,
    PhysicalCopy,
    Site,
    utcnow,
)
from packhorse.db.session import Database
from packhorse.domain import OperationKind
from packhorse.engine.outcome import record_failure
from packhorse.errors import DestinationConflictError, SourceMissingError
from packhorse.operations.lifecycle import claim, create_operation
from packhorse.recovery import diagnosis

SHA = "0" * 64


@pytest.fixture
def world(empty_db: Database) -> dict[str, int]:
    """A bundle whose fyst-buffer copy deletion operation 'del' removed; a transfer of it."""

    def tx(s: Session) -> dict[str, int]:
        site = Site(name="fyst")
        s.add(site)
        s.flush()
        buf = DataLocation(name="fyst-buffer", site_id=site.id, role="buffer", storage_type="disk", uri="/b")
        s.add(buf)
        s.flush()
        dtp = DataTransferPackage(name="b1", source_site_id=site.id, bagging_date="2026-11-30", package_count=1)
        s.add(dtp)
        s.flush()
        copy = PhysicalCopy(data_transfer_package_id=dtp.id, location_id=buf.id, path="bundles/b1.tar", size=1,
                            sha256=SHA, status="deleted", deleted_at=utcnow())
        s.add(copy)
        s.flush()
        d = create_operation(s, kind=OperationKind.DELETION, dedup_key="del", site_id=site.id, max_retries=3,
                             physical_copy_id=copy.id)
        assert d is not None
        d.status = "COMPLETED"
        d.finished_at = dt.datetime(2026, 11, 30, 1, 2, 3, tzinfo=dt.timezone.utc)
        t = create_operation(s, kind=OperationKind.TRANSFER, dedup_key="tr", site_id=site.id, max_retries=3,
                             data_transfer_package_id=dtp.id, source_location_id=buf.id)
        assert t is not None
        return {"deletion": d.id, "transfer": t.id}

    return empty_db.transact(tx) | {"_db": empty_db}  # type: ignore[return-value]


def fail(db: Database, op_id: int, exc: BaseException):
    c = claim(db, op_id, "w", 30)
    assert c is not None
    return record_failure(db, c, exc, backoff_base=0, backoff_max=0)


def test_source_missing_is_diagnosed_from_the_deletion_that_removed_it(world) -> None:
    db = world["_db"]
    out = fail(db, world["transfer"], SourceMissingError("fyst-buffer: 'bundles/b1.tar' does not exist",
                                                         side="source", path="bundles/b1.tar"))
    assert out.status is not None and out.status.value == "FAILED"
    want = (f"source missing: deletion operation {world['deletion']} removed fyst-buffer:bundles/b1.tar "
            "at 2026-11-30T01:02:03+00:00")
    assert out.error_context["diagnosis"] == want
    assert out.error_context["diagnosis_source"] == "auto-db"
    op = db.read(lambda s: s.get(Operation, world["transfer"]))
    assert op.error_context["diagnosis"] == want
    ev = db.read(lambda s: s.scalars(select(FailureEvent).where(FailureEvent.operation_id == op.id)).one())
    assert ev.error_context["diagnosis_source"] == "auto-db"
    note = db.read(lambda s: s.scalars(select(Notification).where(Notification.operation_id == op.id)).one())
    assert want in note.body and "Diagnosis source: auto-db" in note.body


def test_a_diagnosis_from_the_boundary_wins(world) -> None:
    db = world["_db"]
    out = fail(db, world["transfer"], DestinationConflictError("x", diagnosis="other bytes stored here"))
    assert (out.error_context["diagnosis"], out.error_context["diagnosis_source"]) == ("other bytes stored here",
                                                                                       "boundary")


def test_source_missing_nobody_removed_says_so(world) -> None:
    db = world["_db"]
    out = fail(db, world["transfer"], SourceMissingError("gone", side="source", path="bundles/other.tar"))
    assert out.error_context["diagnosis"].startswith("source missing: no packhorse operation removed bundles/other.tar")


def test_a_failing_diagnoser_never_blocks_recording_or_notifying(world, monkeypatch) -> None:
    db = world["_db"]

    def broken(*a, **k):
        raise RuntimeError("diagnoser bug")

    monkeypatch.setattr(diagnosis, "diagnose", broken)
    out = fail(db, world["transfer"], FileNotFoundError(2, "No such file", "/b/bundles/b1.tar"))
    assert out.status is not None and out.status.value == "FAILED"
    assert "diagnosis" not in out.error_context
    op_id = world["transfer"]
    assert db.read(lambda s: s.get(Operation, op_id)).status == "FAILED"
    assert db.read(lambda s: s.scalars(select(FailureEvent).where(FailureEvent.operation_id == op_id)).all())
    assert db.read(lambda s: s.scalars(select(Notification).where(Notification.operation_id == op_id)).all())


def test_retryable_failures_are_not_diagnosed(world) -> None:
    db = world["_db"]
    out = fail(db, world["transfer"], RuntimeError("network blip"))
    assert out.will_retry and "diagnosis" not in out.error_context
