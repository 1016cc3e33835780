"""The operation lifecycle against a real SQLite database: idempotent creation, fenced claim /
heartbeat / completion / failure, lease recovery and the failure path (I3). The lease keeper's
renewal thread is tested in ``tests/integration/test_lease_threads.py``."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from packhorse.config import settings_from_dict
from packhorse.db.models import DataLocation, FailureEvent, Operation, Site, utcnow
from packhorse.db.session import Database
from packhorse.domain import OperationKind, Status
from packhorse.engine.outcome import complete_in, complete_many, record_failure
from packhorse.errors import SourceChangedError, UnsafePathError, VerificationError
from packhorse.operations.lifecycle import Claim, claim, claim_many, create_operation, dedup_key, heartbeat
from packhorse.recovery.monitor import check_stalled

#: monitor settings: breakers open late here (breakers have their own tests)
SETTINGS = settings_from_dict({"recovery": {"max_stall_count": 100}}, environ={})


def reset_stalled(db: Database) -> list[int]:
    """One stalled-task monitor cycle; the ids it reset."""
    return check_stalled(db, SETTINGS).reset

KIND = OperationKind.TRANSFER


@pytest.fixture
def db(empty_db: Database) -> Database:
    d = empty_db
    d.ensure_migrated()

    def topo(s: Session) -> None:
        site = Site(name="fyst")
        s.add(site)
        s.flush()
        s.add_all([DataLocation(name="fyst-buffer", site_id=site.id, role="buffer", storage_type="disk", uri="/b"),
                   DataLocation(name="cologne-buffer", site_id=site.id, role="buffer", storage_type="disk", uri="/c")])

    d.transact(topo)
    yield d
    d.dispose()


def site_id(db: Database) -> int:
    return db.transact(lambda s: s.scalar(select(Site.id).where(Site.name == "fyst")))


def new_op(db: Database, subject: str = "pkg-1", *, kind: OperationKind = KIND, max_retries: int = 3) -> int:
    sid = site_id(db)
    op = db.transact(lambda s: create_operation(s, kind=kind, dedup_key=dedup_key(kind, subject, "cologne"),
                                                site_id=sid, max_retries=max_retries))
    assert op is not None
    return op.id


def row(db: Database, op_id: int) -> Operation:
    op = db.transact(lambda s: s.get(Operation, op_id))
    assert op is not None
    return op


def snapshot(db: Database, op_id: int) -> dict[str, Any]:
    op = row(db, op_id)
    return {c.key: getattr(op, c.key) for c in Operation.__table__.columns}


def set_cols(db: Database, op_id: int, **values: Any) -> None:
    db.transact(lambda s: s.execute(update(Operation).where(Operation.id == op_id).values(**values)))


def events(db: Database, op_id: int) -> list[FailureEvent]:
    return db.transact(lambda s: list(s.scalars(
        select(FailureEvent).where(FailureEvent.operation_id == op_id).order_by(FailureEvent.id))))


def take_over(db: Database, c: Claim) -> Claim:
    """Another worker takes the operation: its lease expires, recovery resets it, a new claim."""
    set_cols(db, c.operation_id, lease_expires_at=utcnow() - dt.timedelta(seconds=1))
    assert reset_stalled(db) == [c.operation_id]
    c2 = claim(db, c.operation_id, "other-worker", 60)
    assert c2 is not None and c2.attempt == c.attempt + 1
    return c2


def raised(exc: BaseException) -> BaseException:
    """``exc`` with a real traceback (as a worker would catch it)."""
    def stage_step() -> None:
        raise exc
    try:
        stage_step()
    except BaseException as e:  # noqa: BLE001 - returned for the test
        return e
    raise AssertionError("unreachable")


# ------------------------------------------------------------------------------ create


def test_create_operation_is_idempotent_on_dedup_key(db: Database) -> None:
    first = new_op(db)
    sid = site_id(db)
    again = db.transact(lambda s: create_operation(s, kind=KIND, dedup_key=dedup_key(KIND, "pkg-1", "cologne"),
                                                   site_id=sid, max_retries=3))
    assert again is None
    assert db.transact(lambda s: s.scalar(select(func.count()).select_from(Operation))) == 1
    op = row(db, first)
    assert (op.kind, op.status, op.attempt, op.retry_count, op.dedup_key) == (
        "transfer", "PENDING", 0, 0, "transfer:pkg-1->cologne")


def test_create_operation_duplicate_within_one_transaction_keeps_the_rest(db: Database) -> None:
    sid = site_id(db)

    def tx(s: Session) -> tuple[object, object, object]:
        a = create_operation(s, kind=KIND, dedup_key="k1", site_id=sid, max_retries=3)
        b = create_operation(s, kind=KIND, dedup_key="k1", site_id=sid, max_retries=3)
        c = create_operation(s, kind=KIND, dedup_key="k2", site_id=sid, max_retries=3)
        return a, b, c

    a, b, c = db.transact(tx)
    assert a is not None and b is None and c is not None
    assert sorted(db.transact(lambda s: list(s.scalars(select(Operation.dedup_key))))) == ["k1", "k2"]


# ------------------------------------------------------------------------------- claim


def test_claim_increments_attempt_and_grants_lease(db: Database) -> None:
    op_id = new_op(db)
    before = utcnow()
    c = claim(db, op_id, "w1", 30)
    assert c is not None
    assert (c.operation_id, c.kind, c.attempt, c.owner) == (op_id, KIND, 1, "w1")
    op = row(db, op_id)
    assert (op.status, op.attempt, op.lease_owner) == ("IN_PROGRESS", 1, "w1")
    assert op.lease_expires_at is not None
    assert before + dt.timedelta(seconds=29) <= op.lease_expires_at <= utcnow() + dt.timedelta(seconds=30)
    assert op.lease_expires_at == c.expires_at


def test_claim_refused_while_in_progress(db: Database) -> None:
    op_id = new_op(db)
    assert claim(db, op_id, "w1", 30) is not None
    assert claim(db, op_id, "w2", 30) is None
    op = row(db, op_id)
    assert (op.attempt, op.lease_owner) == (1, "w1")


def test_claim_refused_when_completed_or_failed(db: Database) -> None:
    op_id = new_op(db)
    c = claim(db, op_id, "w1", 30)
    assert c is not None and db.transact(lambda s: complete_in(s, c)) is True
    assert claim(db, op_id, "w2", 30) is None
    assert (row(db, op_id).status, row(db, op_id).attempt) == ("COMPLETED", 1)
    other = new_op(db, "pkg-2")
    set_cols(db, other, status="FAILED")
    assert claim(db, other, "w2", 30) is None


def test_claim_refused_before_not_before(db: Database) -> None:
    op_id = new_op(db)
    set_cols(db, op_id, not_before=utcnow() + dt.timedelta(seconds=60))
    assert claim(db, op_id, "w1", 30) is None
    assert row(db, op_id).attempt == 0
    set_cols(db, op_id, not_before=utcnow() - dt.timedelta(seconds=1))
    assert claim(db, op_id, "w1", 30) is not None


def test_claim_of_scheduled_and_of_missing_operation(db: Database) -> None:
    op_id = new_op(db)
    set_cols(db, op_id, status="SCHEDULED")
    c = claim(db, op_id, "w1", 30)
    assert c is not None and c.attempt == 1
    assert claim(db, 9999, "w1", 30) is None


# ---------------------------------------------------------------- heartbeat / complete


def test_heartbeat_renews_and_reports_progress(db: Database) -> None:
    op_id = new_op(db)
    c = claim(db, op_id, "w1", 1)
    assert c is not None
    assert heartbeat(db, c, 120, bytes_done=4096) is True
    op = row(db, op_id)
    assert op.bytes_done == 4096
    assert op.lease_expires_at is not None and op.lease_expires_at > utcnow() + dt.timedelta(seconds=100)


def test_heartbeat_with_stale_token_returns_false(db: Database) -> None:
    op_id = new_op(db)
    c1 = claim(db, op_id, "w1", 30)
    assert c1 is not None
    c2 = take_over(db, c1)
    before = snapshot(db, op_id)
    assert heartbeat(db, c1, 999, bytes_done=1) is False
    assert snapshot(db, op_id) == before
    assert heartbeat(db, c2, 30) is True


def test_complete_in_with_stale_token_returns_false_and_leaves_row(db: Database) -> None:
    op_id = new_op(db)
    c1 = claim(db, op_id, "w1", 30)
    assert c1 is not None
    c2 = take_over(db, c1)
    before = snapshot(db, op_id)
    assert db.transact(lambda s: complete_in(s, c1, bytes_done=77)) is False
    assert snapshot(db, op_id) == before
    assert before["status"] == "IN_PROGRESS" and before["attempt"] == 2
    assert db.transact(lambda s: complete_in(s, c2, bytes_done=77)) is True
    op = row(db, op_id)
    assert (op.status, op.bytes_done, op.lease_owner, op.lease_expires_at) == ("COMPLETED", 77, None, None)
    assert op.finished_at is not None


def test_complete_twice_second_is_rejected(db: Database) -> None:
    op_id = new_op(db)
    c = claim(db, op_id, "w1", 30)
    assert c is not None
    assert db.transact(lambda s: complete_in(s, c)) is True
    assert db.transact(lambda s: complete_in(s, c)) is False


def _statements(db: Database, run: Any) -> tuple[Any, list[str]]:
    """``run()`` and the UPDATE statements it sent to ``db``."""
    from sqlalchemy import event

    sent: list[str] = []

    def capture(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().startswith("UPDATE"):
            sent.append(statement)

    event.listen(db.engine, "before_cursor_execute", capture)
    try:
        return run(), sent
    finally:
        event.remove(db.engine, "before_cursor_execute", capture)


def test_claim_many_claims_each_runnable_operation_at_its_token_in_one_statement(db: Database) -> None:
    ready, scheduled, unread, stale, running, later, done = (new_op(db, f"pkg-{i}") for i in range(7))
    set_cols(db, scheduled, status="SCHEDULED", attempt=2)
    set_cols(db, stale, status="SCHEDULED", attempt=3)  # dispatched again since token 2
    assert claim(db, running, "w0", 30) is not None
    set_cols(db, later, not_before=utcnow() + dt.timedelta(seconds=60))
    set_cols(db, done, status="COMPLETED")
    wanted: dict[int, int | None] = {ready: 0, scheduled: 2, unread: None, stale: 2, running: 0, later: 0, done: 0,
                                     9999: None, 9998: 0}
    claims, sent = _statements(db, lambda: claim_many(db, wanted, "w1", 30))
    assert len(sent) == 1, sent  # the whole batch in one UPDATE
    assert {i: c.attempt for i, c in claims.items()} == {ready: 1, scheduled: 3, unread: 1}
    for i, c in claims.items():
        op = row(db, i)
        assert (op.status, op.attempt, op.lease_owner, op.lease_expires_at) == ("IN_PROGRESS", c.attempt, "w1",
                                                                                c.expires_at)
        assert c.operation is not None and (c.operation.id, c.operation.attempt) == (i, c.attempt)
        assert (c.kind, c.owner) == (KIND, "w1")
    assert (row(db, stale).status, row(db, stale).attempt) == ("SCHEDULED", 3)
    assert (row(db, running).lease_owner, row(db, running).attempt) == ("w0", 1)
    assert row(db, later).attempt == 0 and row(db, done).status == "COMPLETED"
    assert claim_many(db, {ready: 0, scheduled: 2}, "w2", 30) == {}  # a duplicate delivery of the batch
    assert claim_many(db, {}, "w2", 30) == {}


def test_claim_many_of_more_than_one_statement_holds(db: Database) -> None:
    from packhorse.operations import lifecycle as operations

    ids = [new_op(db, f"many-{i}") for i in range(operations.BATCH_ROWS + 3)]
    claims, sent = _statements(db, lambda: claim_many(db, {i: 0 for i in ids}, "w1", 30))
    assert sorted(claims) == ids and len(sent) == 2
    done, sent = _statements(db, lambda: db.transact(lambda s: complete_many(s, claims.values())))
    assert done == set(ids) and len(sent) == 2


def test_complete_many_completes_the_current_attempts_in_one_statement_and_leaves_stale_ones(db: Database) -> None:
    a, b, c = (new_op(db, f"pkg-{i}") for i in range(3))
    claims = claim_many(db, {a: 0, b: 0, c: 0}, "w1", 30)
    c_now = take_over(db, claims[c])  # attempt 1 of c is stale
    before_c = snapshot(db, c)
    done, sent = _statements(db, lambda: db.transact(lambda s: complete_many(
        s, claims.values(), {a: 77, b: None})))
    assert done == {a, b} and len(sent) == 1, sent
    for i, counted in ((a, 77), (b, 0)):
        op = row(db, i)
        assert (op.status, op.bytes_done, op.lease_owner, op.lease_expires_at, op.error_context) == (
            "COMPLETED", counted, None, None, None)
        assert op.finished_at is not None
    assert snapshot(db, c) == before_c
    assert db.transact(lambda s: complete_many(s, claims.values())) == set()  # done once (I3)
    assert db.transact(lambda s: complete_many(s, [c_now])) == {c}
    assert db.transact(lambda s: complete_many(s, [])) == set()


# ---------------------------------------------------------------------- reset_stalled


def test_reset_stalled_resets_only_expired_leases(db: Database) -> None:
    expired, live, pending = new_op(db, "a"), new_op(db, "b"), new_op(db, "c")
    c_exp = claim(db, expired, "w1", 30)
    c_live = claim(db, live, "w2", 30)
    assert c_exp is not None and c_live is not None
    set_cols(db, expired, lease_expires_at=utcnow() - dt.timedelta(seconds=5))
    live_before = snapshot(db, live)
    pending_before = snapshot(db, pending)

    assert reset_stalled(db) == [expired]

    op = row(db, expired)
    assert (op.status, op.stall_count, op.attempt, op.lease_owner, op.lease_expires_at) == (
        "PENDING", 1, 1, None, None)
    assert op.retry_count == 0  # a stall is not a retry
    assert snapshot(db, live) == live_before
    assert snapshot(db, pending) == pending_before
    ev = events(db, expired)
    assert [(e.error_type, e.attempt, e.will_retry, e.kind) for e in ev] == [("Stalled", 1, True, "transfer")]
    assert ev[0].error_context["operation_id"] == expired
    assert "lease of attempt 1 (w1) expired" in ev[0].message
    assert events(db, live) == [] and events(db, pending) == []
    # the stalled attempt is fenced out from now on
    assert heartbeat(db, c_exp, 30) is False
    assert reset_stalled(db) == []  # nothing more to do


def test_reset_stalled_counts_every_stall(db: Database) -> None:
    op_id = new_op(db)
    c = claim(db, op_id, "w1", 30)
    assert c is not None
    for n in (1, 2, 3):
        c = take_over(db, c)
        assert row(db, op_id).stall_count == n
    assert [e.attempt for e in events(db, op_id)] == [1, 2, 3]


# ----------------------------------------------------------------------- record_failure


def test_retryable_failure_resets_for_retry_with_backoff(db: Database) -> None:
    op_id = new_op(db)
    c = claim(db, op_id, "w1", 30)
    assert c is not None
    start = utcnow()
    out = record_failure(db, c, raised(VerificationError("read-back differs", path="k")),
                         backoff_base=10, backoff_max=100)
    assert out.status is Status.PENDING and out.will_retry is True
    op = row(db, op_id)
    assert (op.status, op.retry_count, op.error_context, op.lease_owner, op.lease_expires_at) == (
        "PENDING", 1, None, None, None)
    assert op.not_before is not None
    # first retry: min(cap, base × 2^0) × [0.5, 1] = 5..10 s from now
    assert start + dt.timedelta(seconds=5) <= op.not_before <= utcnow() + dt.timedelta(seconds=10)
    assert claim(db, op_id, "w2", 30) is None  # not yet due
    ev = events(db, op_id)
    assert [(e.error_type, e.will_retry, e.retry_count, e.attempt) for e in ev] == [
        ("VerificationError", True, 0, 1)]
    assert ev[0].error_context["path"] == "k"


def test_plain_exception_is_retryable(db: Database) -> None:
    op_id = new_op(db)
    c = claim(db, op_id, "w1", 30)
    assert c is not None
    out = record_failure(db, c, raised(RuntimeError("flaky")), backoff_base=0, backoff_max=0)
    assert out.status is Status.PENDING and row(db, op_id).retry_count == 1


@pytest.mark.parametrize("exc", [
    FileNotFoundError(2, "No such file or directory", "/data/x.fits"),
    PermissionError(13, "Permission denied", "/data/y.fits"),
    SourceChangedError("source file 'x' changed", step="package", side="source", path="x",
                       diagnosis="the file was modified after it was registered"),
    UnsafePathError("tar member '../x' leaves the target folder", path="../x"),
], ids=["FileNotFoundError", "PermissionError", "SourceChangedError", "UnsafePathError"])
def test_permanent_failure_marks_failed_with_error_context(db: Database, exc: BaseException) -> None:
    op_id = new_op(db)
    c = claim(db, op_id, "w1", 30)
    assert c is not None
    out = record_failure(db, c, raised(exc), backoff_base=0, backoff_max=0, operation_info={"package": "pkg-1"})
    assert out.status is Status.FAILED and out.will_retry is False
    op = row(db, op_id)
    assert (op.status, op.retry_count, op.lease_owner) == ("FAILED", 0, None)
    assert op.finished_at is not None
    ctx = op.error_context
    assert ctx is not None
    assert ctx["error_type"] == type(exc).__name__
    assert ctx["message"] == str(exc)
    assert ctx["operation_kind"] == "transfer"
    assert ctx["operation_id"] == op_id
    assert ctx["will_retry"] is False
    assert ctx["retry_count"] == 0
    assert ctx["operation_info"] == {"package": "pkg-1"}
    assert ctx["traceback"].startswith("Traceback (most recent call last)")
    assert "stage_step" in ctx["traceback"] and type(exc).__name__ in ctx["traceback"]
    for field in ("task_id", "task_name", "timestamp"):
        assert ctx[field]
    if isinstance(exc, SourceChangedError):
        assert (ctx["step"], ctx["side"], ctx["path"], ctx["diagnosis_source"]) == (
            "package", "source", "x", "boundary")
    ev = events(db, op_id)
    assert len(ev) == 1 and ev[0].error_context == ctx and ev[0].will_retry is False
    assert claim(db, op_id, "w2", 30) is None


def test_traceback_is_capped_keeping_the_tail(db: Database) -> None:
    op_id = new_op(db)
    c = claim(db, op_id, "w1", 30)
    assert c is not None

    def deep(n: int) -> None:
        if n == 0:
            raise SourceChangedError("the very end")
        deep(n - 1)

    try:
        deep(300)
    except SourceChangedError as e:
        exc = e
    ctx = record_failure(db, c, exc, backoff_base=0, backoff_max=0).error_context
    assert len(ctx["traceback"]) <= 8000 + 100
    assert ctx["traceback"].rstrip().endswith("SourceChangedError: the very end")


def test_failed_after_max_retries(db: Database) -> None:
    op_id = new_op(db, max_retries=2)
    outcomes = []
    for attempt in (1, 2, 3):
        c = claim(db, op_id, "w1", 30)
        assert c is not None and c.attempt == attempt
        outcomes.append(record_failure(db, c, raised(VerificationError(f"bad {attempt}")),
                                       backoff_base=0, backoff_max=0).status)
    assert outcomes == [Status.PENDING, Status.PENDING, Status.FAILED]
    op = row(db, op_id)
    assert (op.status, op.retry_count, op.attempt) == ("FAILED", 2, 3)
    assert op.error_context is not None and op.error_context["message"] == "bad 3"
    assert op.error_context["retry_count"] == 2
    assert [(e.attempt, e.retry_count, e.will_retry) for e in events(db, op_id)] == [
        (1, 0, True), (2, 1, True), (3, 2, False)]
    assert claim(db, op_id, "w1", 30) is None


def test_error_own_max_retries_caps_retries(db: Database) -> None:
    op_id = new_op(db, max_retries=5)

    class OnceOnly(VerificationError):
        max_retries = 1

    statuses = []
    for _ in range(2):
        c = claim(db, op_id, "w1", 30)
        assert c is not None
        statuses.append(record_failure(db, c, OnceOnly("x"), backoff_base=0, backoff_max=0).status)
    assert statuses == [Status.PENDING, Status.FAILED]


def test_stale_attempt_failure_leaves_row_but_appends_event(db: Database) -> None:
    op_id = new_op(db)
    c1 = claim(db, op_id, "w1", 30)
    assert c1 is not None
    take_over(db, c1)
    before = snapshot(db, op_id)
    out = record_failure(db, c1, raised(SourceChangedError("late failure")), backoff_base=0, backoff_max=0)
    assert out.status is None
    assert snapshot(db, op_id) == before
    assert (before["status"], before["attempt"], before["error_context"]) == ("IN_PROGRESS", 2, None)
    ev = events(db, op_id)
    assert [(e.error_type, e.attempt) for e in ev] == [("Stalled", 1), ("SourceChangedError", 1)]
    assert ev[1].message == "late failure"


def test_stale_attempt_retryable_failure_event_says_no_retry(db: Database) -> None:
    # the stale attempt's failure resets nothing, so its event must not claim a retry
    op_id = new_op(db)
    c1 = claim(db, op_id, "w1", 30)
    assert c1 is not None
    take_over(db, c1)
    out = record_failure(db, c1, raised(VerificationError("late, retryable")), backoff_base=0, backoff_max=0)
    assert out.status is None and out.will_retry is False
    ev = events(db, op_id)[-1]
    assert (ev.error_type, ev.will_retry, ev.error_context["will_retry"]) == ("VerificationError", False, False)


def test_failure_event_survives_rollback_of_callers_transaction(db: Database) -> None:
    op_id = new_op(db)
    c = claim(db, op_id, "w1", 30)
    assert c is not None

    def callers_unit_of_work(s: Session) -> None:
        s.add(Site(name="written-by-the-stage"))
        record_failure(db, c, raised(SourceChangedError("boom")), backoff_base=0, backoff_max=0)
        s.flush()  # the caller's own write, in its own transaction
        raise RuntimeError("the caller's transaction rolls back")

    with pytest.raises(RuntimeError, match="rolls back"):
        db.transact(callers_unit_of_work)
    assert db.transact(lambda s: s.scalar(select(Site.id).where(Site.name == "written-by-the-stage"))) is None
    assert [e.error_type for e in events(db, op_id)] == ["SourceChangedError"]
    assert row(db, op_id).status == "FAILED"
