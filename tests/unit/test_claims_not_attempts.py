"""An operation that waited (a data location unavailable) before it ran is not shown as its
seventh failed attempt: ``diagnose`` and ``locate`` word its claims as claims and count its
failures as failures, while the fencing token (``attempt`` in the database) still grows with
every claim."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from packhorse.db.models import Operation
from packhorse.db.session import Database
from packhorse.domain import OperationKind
from packhorse.engine.outcome import complete_in, record_failure
from packhorse.errors import VerificationError
from packhorse.operations.lifecycle import claim, create_operation, defer
from packhorse.status.diagnose import diagnose_operation
from packhorse.status.locate import locate
from support import seed_rows

KIND = OperationKind.LONG_TERM_ARCHIVE


@pytest.fixture
def db(empty_db: Database) -> Database:
    seed_rows(empty_db, "fyst", [("fyst-source", "source"), ("cologne-lta", "long_term_archive")],
              [("fyst_inst_obs1", "inst/obs1")])
    return empty_db


def archived_after_an_outage(db: Database, *, waits: int, failures: int) -> int:
    """``waits`` claims handed back while the archive was unavailable (no retry counted), then
    ``failures`` retried failures, then the claim that archived it."""
    op = db.transact(lambda s: create_operation(s, kind=KIND, dedup_key="lta:1", site_id=1, max_retries=3,
                                                raw_data_package_id=1, destination_location_id=2))
    for _ in range(waits):
        c = claim(db, op.id, "w", 30)
        assert c is not None
        assert defer(db, c, 0, note={"waiting": "location", "message": "cologne-lta unavailable"})
    for _ in range(failures):
        c = claim(db, op.id, "w", 30)
        assert c is not None
        assert record_failure(db, c, VerificationError("read back other bytes"), backoff_base=0,
                              backoff_max=0).will_retry
    c = claim(db, op.id, "w", 30)
    assert c is not None and c.attempt == waits + failures + 1  # the fencing token grew with every claim
    assert db.transact(lambda s: complete_in(s, c))
    return op.id


def timeline(db: Database) -> list[tuple[str, str]]:
    r = db.read(lambda s: locate(s, "fyst_inst_obs1", include_errors=True))
    return [(e["event"], e["detail"]) for e in r["packages"][0]["timeline"] if e["operation_id"]]


def test_claims_after_waits_are_not_called_failed_attempts(db: Database, capsys: pytest.CaptureFixture[str]) -> None:
    from packhorse.cli.operator import _print_report

    op_id = archived_after_an_outage(db, waits=6, failures=0)
    assert db.read(lambda s: s.scalar(select(Operation.attempt).where(Operation.id == op_id))) == 7
    rep = db.read(lambda s: diagnose_operation(s, KIND, op_id))
    assert "attempt 7" not in rep["diagnosis"] and "7 attempt(s)" not in rep["diagnosis"]
    assert "(claim 7, after 0 retries (the other claims waited for a location or for space, or stalled: no " \
           "failure)); nothing to do" in rep["diagnosis"]
    assert rep["operation"]["attempt_words"] == "claim 7"
    _print_report(rep)  # what `packhorse diagnose` prints
    assert "COMPLETED, claim 7, retries 0/3, stalls 0" in capsys.readouterr().out
    [(event, detail)] = timeline(db)
    assert detail == "claim 7, after 0 retries (the other claims waited for a location or for space, or stalled: " \
                     "no failure)"


def test_a_failure_is_counted_as_the_operations_first_failure(db: Database) -> None:
    op_id = archived_after_an_outage(db, waits=2, failures=1)
    rep = db.read(lambda s: diagnose_operation(s, KIND, op_id))
    assert [e["failure"] for e in rep["failure_events"]] == ["failure 1 (claim 3)"]
    assert ("attempt failed", "failure 1 (claim 3), will retry") in timeline(db)
    assert rep["operation"]["attempt_words"] == "claim 4"  # 2 waits, 1 retry, then this claim


def test_claims_that_all_failed_are_still_attempts(db: Database) -> None:
    op_id = archived_after_an_outage(db, waits=0, failures=2)
    rep = db.read(lambda s: diagnose_operation(s, KIND, op_id))
    assert rep["operation"]["attempt_words"] == "attempt 3"
    assert [e["failure"] for e in rep["failure_events"]] == ["failure 2", "failure 1"]
    assert "(attempt 3); nothing to do" in rep["diagnosis"]


def test_the_stall_notification_of_a_claim_after_waits_calls_it_a_claim(db: Database) -> None:
    from ops_support import expire
    from packhorse.config import settings_from_dict
    from packhorse.db.models import Notification
    from packhorse.recovery.monitor import check_stalled

    op = db.transact(lambda s: create_operation(s, kind=KIND, dedup_key="lta:1", site_id=1, max_retries=3,
                                                raw_data_package_id=1, destination_location_id=2))
    for _ in range(2):  # the archive was away twice
        c = claim(db, op.id, "w", 30)
        assert c is not None and defer(db, c, 0, note={"waiting": "location"})
    assert claim(db, op.id, "dead-worker", 30) is not None
    expire(db, op.id)  # that worker died
    check_stalled(db, settings_from_dict({}, environ={}))
    [body] = db.read(lambda s: list(s.scalars(select(Notification.body).where(
        Notification.event == "stalled_recovered"))))
    assert "Claim 3 by dead-worker stopped renewing its lease (0 retries counted before it)." in body
    assert "Attempt 3" not in body
