"""The operation lifecycle: create, claim, heartbeat, complete, fail, reset — every write fenced.

``PENDING → SCHEDULED → IN_PROGRESS → COMPLETED | FAILED`` (DESIGN.md "Vocabulary").

* :func:`create_operation` is idempotent on the operation's ``dedup_key`` (kind, subject,
  destination): managers may call it every cycle.
* :func:`claim` moves a ``PENDING``/``SCHEDULED`` operation to ``IN_PROGRESS``, increments
  ``attempt`` — the **fencing token** — and grants a lease until ``lease_expires_at``.
* :func:`heartbeat`, :func:`mark_completed_in` (:func:`mark_completed_many` for a batch), :func:`defer` and
  the engine's :func:`packhorse.engine.outcome.record_failure` are compare-and-set on :func:`fenced` — ``(id, attempt, status =
  IN_PROGRESS)`` —, the one fencing predicate: a stale attempt's writes change nothing (I3); its
  failure is still appended as a failure event. The status writes of other modules go through it
  too: the stalled-task monitor's reset (:mod:`packhorse.recovery.monitor`), the reconciler's
  reset of a lost dispatch and a forced retry (:mod:`packhorse.recovery.breakers`: the status it
  read), the Celery dispatcher's unscheduling (``fenced(id, attempt, Status.SCHEDULED)``) and
  the dispatch of both executors (:func:`packhorse.engine.pipeline.take_runnable`: ``PENDING`` or
  ``SCHEDULED`` → ``SCHEDULED`` at the token it read). A claim is a compare-and-set on the token
  it was dispatched at (``fenced(id, token, PENDING | SCHEDULED)``, then the token becomes
  ``token + 1``), :func:`reset_failed` on the token of the ``FAILED`` attempt it read: a write
  made on a stale reading of the row changes nothing.
* expired leases are handed back by the stalled-task monitor
  (:mod:`packhorse.recovery.monitor`, with circuit breakers), lost dispatches by the
  reconciler (:mod:`packhorse.recovery.reconciler`).

All times are UTC; durations are seconds.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy import BigInteger, ColumnElement, Integer, and_, bindparam, func, or_, select, union_all, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from packhorse.db.models import Operation, utcnow
from packhorse.db.session import Database, insert_ignoring_conflicts
from packhorse.domain import OperationKind, Status
from packhorse.errors import PackhorseError, ResetRefusedError, UnknownOperationError

if TYPE_CHECKING:
    pass

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Claim:
    """A granted lease: run operation ``operation_id`` as attempt ``attempt`` (the fencing token).

    ``operation`` is the row as the claim left it (a detached snapshot), so the worker needs no
    second read; ``None`` when the claim was built by hand.
    """

    operation_id: int
    kind: OperationKind
    attempt: int
    owner: str
    expires_at: dt.datetime
    operation: Operation | None = field(default=None, compare=False, repr=False)


def create_operation(
    session: Session,
    *,
    kind: OperationKind,
    dedup_key: str,
    site_id: int,
    max_retries: int,
    raw_data_package_id: int | None = None,
    data_transfer_package_id: int | None = None,
    physical_copy_id: int | None = None,
    source_location_id: int | None = None,
    destination_location_id: int | None = None,
) -> Operation | None:
    """Create a ``PENDING`` operation unless one with ``dedup_key`` exists.

    Returns:
        the new operation, or ``None`` if it already existed (idempotent).
    """
    if session.scalar(select(Operation.id).where(Operation.dedup_key == dedup_key)) is not None:
        return None
    now = utcnow()
    op = Operation(
        kind=kind.value, status=Status.PENDING.value, dedup_key=dedup_key, site_id=site_id,
        max_retries=max_retries, raw_data_package_id=raw_data_package_id,
        data_transfer_package_id=data_transfer_package_id, physical_copy_id=physical_copy_id,
        source_location_id=source_location_id, destination_location_id=destination_location_id,
        attempt=0, retry_count=0, stall_count=0, created_at=now, updated_at=now, bytes_done=0,
    )
    try:
        with session.begin_nested():
            session.add(op)
            session.flush()
    except IntegrityError:
        return None
    return op


def create_operations(session: Session, *, kind: OperationKind, max_retries: int,
                      wanted: dict[str, dict[str, Any]]) -> int:
    """Create many ``PENDING`` operations of one kind in one statement; returns how many were new.

    ``wanted`` maps each dedup key to the :func:`create_operation` keywords (``site_id`` and
    subject / location ids). A key that already names an operation is skipped by the database
    itself (``INSERT … ON CONFLICT (dedup_key) DO NOTHING`` on SQLite and PostgreSQL alike), so
    two managers racing create each operation once (I3).
    """
    if not wanted:
        return 0
    now = utcnow()
    rows = [dict(kind=kind.value, status=Status.PENDING.value, dedup_key=key, max_retries=max_retries,
                 raw_data_package_id=kw.get("raw_data_package_id"),
                 data_transfer_package_id=kw.get("data_transfer_package_id"),
                 physical_copy_id=kw.get("physical_copy_id"), source_location_id=kw.get("source_location_id"),
                 destination_location_id=kw.get("destination_location_id"), site_id=kw["site_id"],
                 attempt=0, retry_count=0, stall_count=0, created_at=now, updated_at=now, bytes_done=0)
            for key, kw in wanted.items()]
    stmt = insert_ignoring_conflicts(session, Operation.__table__, Operation.__table__.c.dedup_key)
    created = 0
    for i in range(0, len(rows), 500):
        created += len(session.execute(stmt.returning(Operation.id), rows[i:i + 500]).all())
    return created


def dedup_key(kind: OperationKind, subject: str, destination: str | None = None) -> str:
    """The unique key of an operation: ``kind:subject[->destination]``."""
    return f"{kind.value}:{subject}" + (f"->{destination}" if destination else "")


_OPS = Operation.__table__
#: The statuses a claim takes an operation from.
CLAIMABLE: tuple[Status, ...] = (Status.PENDING, Status.SCHEDULED)
_CLAIM_VALUES = dict(status=Status.IN_PROGRESS.value, attempt=_OPS.c.attempt + 1, lease_owner=bindparam("owner"),
                     lease_expires_at=bindparam("expires"), heartbeat_at=bindparam("now"),
                     started_at=bindparam("now"), updated_at=bindparam("now"), bytes_done=0)
_COMPLETE_VALUES = dict(status=Status.COMPLETED.value, finished_at=bindparam("now"), updated_at=bindparam("now"),
                        lease_owner=None, lease_expires_at=None, error_context=None)


def no_such_operation(kind: str, operation_id: int, found: Operation | None) -> str:
    """What to say when operation ``operation_id`` was asked for as a ``kind`` operation and
    ``found`` is the row with that id (``None``: no operation has it): ``"no transfer operation
    with id 21"``), and when the id is another kind's, which one (``"…: operation 21 is of kind
    long_term_archive"``), so the operator can ask again with the right kind."""
    text = f"no {kind} operation with id {operation_id}"
    return text if found is None else f"{text}: operation {operation_id} is of kind {found.kind}"


def get_operation(session: Session, kind: OperationKind, operation_id: int) -> Operation:
    """Operation ``operation_id``, which must be a ``kind`` operation (the one lookup of an
    operation named by kind and id: ``diagnose``, ``retry``, ``reset``, ``breaker reset``,
    ``run-operation``, the API).

    Raises:
        UnknownOperationError: no operation has that id, or it is of another kind (named in the
            message, :func:`no_such_operation`).
    """
    op = session.get(Operation, operation_id)
    if op is None or op.kind != kind.value:
        raise UnknownOperationError(no_such_operation(kind.value, operation_id, op))
    return op


def fenced(operation_id: Any, attempt: Any,
           status: Status | Collection[Status] = Status.IN_PROGRESS) -> ColumnElement[bool]:
    """The fencing predicate (DESIGN.md I3, "Lease"): the row is operation ``operation_id``,
    still at fencing token ``attempt`` and in ``status`` (one status, or any of several). Every
    status write of an operation is a compare-and-set on it, so a write made on a stale reading
    of the row (its token superseded by a newer claim, its status moved on) changes nothing.
    ``operation_id`` / ``attempt`` are values, bound parameters or the columns of a batch's
    rows (:func:`claim_many`, :func:`mark_completed_many`: each row is its own compare-and-set)."""
    if isinstance(status, Status):
        in_status: ColumnElement[bool] = _OPS.c.status == status.value
    else:
        in_status = _OPS.c.status.in_([s.value for s in status])
    return and_(_OPS.c.id == operation_id, _OPS.c.attempt == attempt, in_status)


def _complete_statements() -> dict[bool, Any]:
    """The completion statements, by "bytes counted" (built once: they run inside the write lock)."""
    return {counted: update(_OPS).where(fenced(bindparam("op_id"), bindparam("token")))
            .values(**_COMPLETE_VALUES, **({"bytes_done": bindparam("counted")} if counted else {}))
            for counted in (False, True)}


def _claim_statement() -> Any:
    """The claim statement: compare-and-set on :func:`fenced` at the dispatched token, among the
    :data:`CLAIMABLE` statuses, once its retry backoff has passed. Built once (Core, bound
    parameters): a claim runs inside the database's write lock, where building an ORM statement
    per call cost more than executing it."""
    return (update(_OPS).where(fenced(bindparam("op_id"), bindparam("token"), CLAIMABLE),
                               or_(_OPS.c.not_before.is_(None), _OPS.c.not_before <= bindparam("now")))
            .values(**_CLAIM_VALUES).returning(*_OPS.c))


_CLAIM = _claim_statement()
_TOKEN = select(_OPS.c.attempt).where(_OPS.c.id == bindparam("op_id"))
_TOKENS = select(_OPS.c.id, _OPS.c.attempt).where(_OPS.c.id.in_(bindparam("op_ids", expanding=True)))
_COMPLETE = _complete_statements()

#: Rows per batch statement (:func:`claim_many`, :func:`mark_completed_many`): 2–3 bound parameters a
#: row, far below SQLite's limit of 32,766.
BATCH_ROWS = 100
#: The batch statements by row count, built on first use (cleared by the test-only unfenced
#: variant, tests/unfenced.py, like the prebuilt statements above).
_CLAIM_MANY: dict[int, Any] = {}
_COMPLETE_MANY: dict[int, Any] = {}


def _batch_rows(n: int, name: str, *cols: tuple[str, Any]) -> Any:
    """``n`` rows of typed bound parameters ``:<col>_<k>`` as the subquery ``name(<cols>)``, for
    an ``UPDATE … FROM`` (PostgreSQL; SQLite ≥ 3.33). A ``UNION ALL`` of one-row ``SELECT`` s,
    not ``VALUES``: SQLite cannot name the columns of a ``VALUES`` subquery."""
    return union_all(*(select(*(bindparam(f"{c}_{k}", type_=t).label(c) for c, t in cols))
                       for k in range(n))).subquery(name)


def _claim_many_statement(n: int) -> Any:
    """The claim of ``n`` operations in one statement: :data:`_CLAIM` joined to ``n`` rows of
    (operation id, dispatched token), each row a compare-and-set on :func:`fenced` of its own."""
    wanted = _batch_rows(n, "wanted", ("op_id", Integer), ("token", Integer))
    return (update(_OPS).where(fenced(wanted.c.op_id, wanted.c.token, CLAIMABLE),
                               or_(_OPS.c.not_before.is_(None), _OPS.c.not_before <= bindparam("now")))
            .values(**_CLAIM_VALUES).returning(*_OPS.c))


def _complete_many_statement(n: int) -> Any:
    """The completion of ``n`` claimed attempts in one statement: :data:`_COMPLETE` joined to
    ``n`` rows of (operation id, token, bytes counted or NULL to keep), each row a
    compare-and-set on :func:`fenced` of its own."""
    done = _batch_rows(n, "done", ("op_id", Integer), ("token", Integer), ("counted", BigInteger))
    return (update(_OPS).where(fenced(done.c.op_id, done.c.token))
            .values(**_COMPLETE_VALUES, bytes_done=func.coalesce(done.c.counted, _OPS.c.bytes_done))
            .returning(_OPS.c.id))


def claim(db: Database, operation_id: int, owner: str, lease_seconds: float, *,
          token: int | None = None, min_attempt: int | None = None) -> Claim | None:
    """Try to take the lease on a runnable operation (a compare-and-set on :func:`fenced`).

    Succeeds only if the operation is ``PENDING`` or ``SCHEDULED``, still at fencing token
    ``token`` (the attempt it was dispatched at), and its retry backoff has passed; the claim
    then holds attempt ``token + 1``. Returns ``None`` otherwise (already running under a
    lease, finished, claimed and handed back since the dispatch, or not yet due): the caller
    must then do nothing (a duplicate or late delivery; I3).

    One statement, run without a transaction around it on PostgreSQL
    (:meth:`~packhorse.db.session.Database.statements`): the compare-and-set needs none.

    Args:
        token: the attempt the dispatcher read (:func:`packhorse.engine.pipeline.take_runnable`'s
            rows); ``None`` reads it just before the claim, which is then a compare-and-set
            on the token read (a claim by hand: the CLI, tests).
        min_attempt: a broker message's "run operation N at attempt ≥ A" (Celery): the
            message was dispatched at token ``A − 1`` (attempts only grow), so this is
            ``token = A − 1``. A late or duplicated message for an attempt that already ran
            changes nothing; the newer dispatch of that operation carries a higher ``A``.
    """
    if min_attempt is not None:
        if token is not None and token != min_attempt - 1:
            raise ValueError(f"token {token} and min_attempt {min_attempt} disagree")
        token = min_attempt - 1

    def run(conn: Connection) -> Claim | None:
        now = utcnow()
        expires = now + dt.timedelta(seconds=lease_seconds)
        current = token
        if current is None:
            current = conn.execute(_TOKEN, dict(op_id=operation_id)).scalar()
            if current is None:
                return None
        row = conn.execute(_CLAIM, dict(op_id=operation_id, token=current, now=now, owner=owner,
                                        expires=expires)).first()
        return None if row is None else _granted(row, owner, expires)

    return db.statements(run)


def _granted(row: Any, owner: str, expires: dt.datetime) -> Claim:
    """The claim of a row returned by a claim statement (a detached snapshot of the operation,
    never added to a session)."""
    op = Operation(**row._asdict())
    return Claim(op.id, OperationKind(op.kind), op.attempt, owner, expires, op)


def claim_many(db: Database, operations: dict[int, int | None], owner: str,
               lease_seconds: float) -> dict[int, Claim]:
    """:func:`claim` for several operations at once: ``operations`` maps each operation id to
    its dispatched token (``None``: read it here, then compare with what was read). Returns the
    granted claims by operation id (an operation that is not runnable at its token is left out,
    as :func:`claim` returns ``None`` for it).

    The claims are one statement per :data:`BATCH_ROWS` operations (``UPDATE operations … FROM``
    the rows (id, token)), each row of it a compare-and-set on :func:`fenced` at its own
    token, as :func:`claim` is, run without a transaction around it on PostgreSQL
    (:meth:`~packhorse.db.session.Database.statements`): one round trip for the batch. The ids
    are sent in ascending order, so two batches that share operations lock them in one order.
    """

    def run(conn: Connection) -> dict[int, Claim]:
        now = utcnow()
        expires = now + dt.timedelta(seconds=lease_seconds)
        tokens = {op_id: token for op_id, token in operations.items() if token is not None}
        unread = [op_id for op_id, token in operations.items() if token is None]
        if unread:
            tokens.update((op_id, token) for op_id, token in conn.execute(_TOKENS, dict(op_ids=unread)))
        out: dict[int, Claim] = {}
        wanted = sorted(tokens.items())
        for i in range(0, len(wanted), BATCH_ROWS):
            part = wanted[i:i + BATCH_ROWS]
            stmt = _CLAIM_MANY.get(len(part))
            if stmt is None:
                stmt = _CLAIM_MANY[len(part)] = _claim_many_statement(len(part))
            params: dict[str, Any] = dict(now=now, owner=owner, expires=expires)
            for k, (op_id, token) in enumerate(part):
                params[f"op_id_{k}"] = op_id
                params[f"token_{k}"] = token
            for row in conn.execute(stmt, params):
                out[row.id] = _granted(row, owner, expires)
        return out

    return db.statements(run)


def heartbeat(db: Database, claim: Claim, lease_seconds: float, bytes_done: int | None = None) -> bool:
    """Renew the lease of ``claim`` (fenced). Returns ``False`` if the token is no longer current."""

    def tx(s: Session) -> bool:
        now = utcnow()
        values: dict[str, Any] = dict(lease_expires_at=now + dt.timedelta(seconds=lease_seconds), heartbeat_at=now)
        if bytes_done is not None:
            values["bytes_done"] = bytes_done
        res = s.execute(
            update(Operation)
            .where(fenced(claim.operation_id, claim.attempt))
            .values(**values)
        )
        return res.rowcount == 1

    return db.transact(tx)


def mark_completed_in(session: Session, claim: Claim, bytes_done: int | None = None) -> bool:
    """Mark the claimed attempt ``COMPLETED`` inside the caller's transaction (fenced).

    Returns ``False`` if the attempt is stale; the caller must then roll back whatever else it
    wrote in the transaction (raise :class:`~packhorse.errors.LeaseLostError`). Only the
    operation's row: the engine's :func:`packhorse.engine.outcome.complete_in` also closes the
    circuit breaker of an operation that stalled before.
    """
    params: dict[str, Any] = dict(op_id=claim.operation_id, now=utcnow(), token=claim.attempt)
    if bytes_done is not None:
        params["counted"] = bytes_done
    stmt = _COMPLETE[bytes_done is not None]
    res = session.connection().execute(stmt, params)
    return res.rowcount == 1


def mark_completed_many(session: Session, claims: Iterable[Claim],
                        bytes_done: Mapping[int, int | None] | None = None) -> set[int]:
    """:func:`mark_completed_in` for several claimed attempts in one statement (per
    :data:`BATCH_ROWS`), inside the caller's transaction: each row of the statement is a
    compare-and-set on :func:`fenced` at its own claim's token.

    Args:
        claims: the claimed attempts (at most one per operation).
        bytes_done: bytes counted by operation id, written as the row's ``bytes_done``; an
            operation left out or mapped to ``None`` keeps its own (as :func:`mark_completed_in`
            without ``bytes_done``).

    Returns:
        the ids of the operations completed; an attempt that is stale is left out, and the
        caller must then roll back (or not write) whatever else it meant for it, as with
        :func:`mark_completed_in` returning ``False``. Only the rows: the engine's
        :func:`packhorse.engine.outcome.complete_many` also closes circuit breakers.
    """
    todo = sorted(claims, key=lambda c: c.operation_id)
    counted = bytes_done or {}
    now = utcnow()
    conn = session.connection()
    completed: set[int] = set()
    for i in range(0, len(todo), BATCH_ROWS):
        part = todo[i:i + BATCH_ROWS]
        stmt = _COMPLETE_MANY.get(len(part))
        if stmt is None:
            stmt = _COMPLETE_MANY[len(part)] = _complete_many_statement(len(part))
        params: dict[str, Any] = dict(now=now)
        for k, c in enumerate(part):
            params[f"op_id_{k}"] = c.operation_id
            params[f"token_{k}"] = c.attempt
            params[f"counted_{k}"] = counted.get(c.operation_id)
        completed.update(conn.execute(stmt, params).scalars())
    return completed


def record_salvage(s: Session, salvage: Callable[[Session], None] | None, operation_id: int) -> None:
    """Record an attempt's salvage (:attr:`~packhorse.stages.base.Work.salvage`) in the caller's
    transaction, the one that hands the attempt back (:func:`defer`) or records its failure
    (:func:`record_failure`); a refused one (e.g. a conflicting copy row) is logged and the
    hand-back or failure stands all the same."""
    if salvage is None:
        return
    try:
        salvage(s)
    except PackhorseError as e:
        log.error("operation_salvage_refused", operation_id=operation_id, error=str(e))


def defer(db: Database, claim: Claim, seconds: float, *, note: dict[str, Any] | None = None,
          salvage: Callable[[Session], None] | None = None, also: Callable[[Session], None] | None = None) -> bool:
    """Hand the claimed attempt back as ``PENDING`` until now + ``seconds`` (fenced), without
    counting a retry: the operation waits (a cold-storage restore, a deletion whose rule does
    not hold yet, a location that is away or full) without holding a worker. ``note``: why it
    waits, kept as the row's ``error_context`` (``{"waiting": …, "message": …}``; cleared by
    its completion) so ``diagnose`` and the idle check can tell; ``None`` leaves the column as
    it is. ``salvage`` (the attempt's :attr:`~packhorse.stages.base.Work.salvage`: what it
    published and verified before it stopped, e.g. the packages an unpack wrote before the
    buffer filled up) is recorded in the same transaction, as :func:`record_failure` does: those
    copies go on (archived, then freed) while the rest waits. ``also`` runs in that transaction
    too (the notification the hand-back causes: a crash cannot separate the two). Returns
    ``False`` if the attempt is stale (nothing recorded)."""

    def tx(s: Session) -> bool:
        now = utcnow()
        values: dict[str, Any] = dict(status=Status.PENDING.value, not_before=now + dt.timedelta(seconds=seconds),
                                      updated_at=now, lease_owner=None, lease_expires_at=None)
        if note is not None:
            values["error_context"] = note
        res = s.execute(update(Operation).where(fenced(claim.operation_id, claim.attempt)).values(**values))
        if res.rowcount != 1:
            return False
        record_salvage(s, salvage, claim.operation_id)
        if also is not None:
            also(s)
        return True

    return db.transact(tx)


# ------------------------------------------------------------------------------ failures


def backoff_seconds(retry_count: int, base: float, cap: float) -> float:
    """Exponential backoff with full jitter, capped: ``uniform(0.5, 1) × min(cap, base × 2^n)``."""
    return min(cap, base * (2 ** retry_count)) * (0.5 + random.random() / 2)


def counts_by_kind_status(session: Session) -> dict[str, dict[str, int]]:
    """``{kind: {STATUS: n}}`` over every operation."""
    out: dict[str, dict[str, int]] = {}
    for kind, status, n in session.execute(
        select(Operation.kind, Operation.status, func.count()).group_by(Operation.kind, Operation.status)
    ):
        out.setdefault(kind, {})[status] = n
    return out


def reset_failed(db: Database, kind: OperationKind, operation_id: int | None = None) -> list[int]:
    """Hand FAILED operations back to their owner after a human fixed the cause.

    Sets ``PENDING``, ``retry_count + 1``, clears the cached error context and any backoff;
    the failure events (the history) stay. Only ``FAILED`` operations are reset: a running one
    has an owner already. Each reset is a compare-and-set on :func:`fenced` at the ``FAILED``
    attempt it read (I3): an operation another reset or a claim moved on meanwhile is left out.

    Args:
        kind: the operation kind (must match the operation's).
        operation_id: one operation, or ``None`` for every FAILED operation of ``kind``.

    Returns:
        the ids reset.

    Raises:
        ResetRefusedError: ``operation_id`` names no operation of ``kind``, or it is not FAILED.
    """

    def tx(s: Session) -> list[int]:
        if operation_id is not None:
            op = s.get(Operation, operation_id)
            if op is None or op.kind != kind.value:
                raise ResetRefusedError(no_such_operation(kind.value, operation_id, op))
            if op.status != Status.FAILED.value:
                raise ResetRefusedError(f"{kind.value} {operation_id} is {op.status}, not FAILED; nothing to reset")
        where = [Operation.kind == kind.value, Operation.status == Status.FAILED.value]
        if operation_id is not None:
            where.append(Operation.id == operation_id)
        read = s.execute(select(Operation.id, Operation.attempt).where(*where).order_by(Operation.id)).all()
        ids: list[int] = []
        stamp = utcnow()
        for op_id, token in read:  # each a compare-and-set on the FAILED attempt read (I3)
            res = s.execute(update(Operation).where(fenced(op_id, token, Status.FAILED)).values(
                status=Status.PENDING.value, retry_count=Operation.retry_count + 1, error_context=None,
                not_before=None, finished_at=None, updated_at=stamp))
            if res.rowcount == 1:
                ids.append(op_id)
        return ids

    return db.transact(tx)
