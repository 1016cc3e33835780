"""Run one operation: claim → stage → verify → fenced completion (DESIGN.md "Architecture").

:func:`execute_operation` is the one entry point every executor calls (a local worker process,
Celery task, ``packhorse run-operation``). It never raises for an operation failure: the
failure goes through the single failure path (:func:`~packhorse.engine.outcome.record_failure`).
"""

from __future__ import annotations

import contextlib
import enum
import time
from collections.abc import Callable, Iterable
from typing import Any

import structlog
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from packhorse.db.models import FailureEvent, Operation, PhysicalCopy, utcnow
from packhorse.db.session import retry_while
from packhorse.domain import WAITING_DELETION_RULE, WAITING_LOCATION, WAITING_SPACE, NotificationLevel, OperationKind
from packhorse.engine.outcome import build_error_context, complete_in, complete_many, record_failure
from packhorse.errors import (
    DeletionNotSafeError,
    DestinationWriteError,
    LeaseLostError,
    LeaseNotRenewedError,
    LocationUnavailableError,
    NeverFitsError,
    OperationDeferred,
    TransientDatabaseError,
)
from packhorse.notify.outbox import enqueue
from packhorse.operations.batching import batchable
from packhorse.operations.lease import LeaseKeeper
from packhorse.operations.lifecycle import Claim, backoff_seconds, claim, claim_many, defer
from packhorse.rules.availability import check_operation, record_outage, storage_fault, wait_seconds
from packhorse.rules.space import free_bytes, never_fits
from packhorse.runtime.context import ProcessContext
from packhorse.stages import PRELOADS, STAGES, deletion
from packhorse.stages.base import Recorder, Records, Work

log = structlog.get_logger(__name__)


class Outcome(str, enum.Enum):
    """What :func:`execute_operation` did."""

    SKIPPED = "skipped"      # not runnable: done, running under another lease, or not yet due
    COMPLETED = "completed"
    RETRY = "retry"          # failed, reset to PENDING for a retry after backoff
    FAILED = "failed"        # failed permanently
    STALE = "stale"          # this attempt lost its lease; nothing it did was recorded
    DEFERRED = "deferred"    # waits (a cold-storage restore): PENDING again until not_before


def _record_stale(ctx: ProcessContext, c: Claim, exc: BaseException) -> None:
    ctx_dict = build_error_context(exc, kind=c.kind, operation_id=c.operation_id, task_id=f"{c.owner}#{c.attempt}",
                                   retry_count=0, will_retry=False)

    def tx(s: Session) -> None:
        s.add(FailureEvent(operation_id=c.operation_id, kind=c.kind.value, attempt=c.attempt, retry_count=0,
                           error_type=type(exc).__name__, message=str(exc)[:4000], will_retry=False,
                           error_context=ctx_dict, created_at=utcnow()))

    ctx.db.transact(tx)


def execute_operation(ctx: ProcessContext, operation_id: int, owner: str, *, token: int | None = None,
                      min_attempt: int | None = None) -> Outcome:
    """Claim and run operation ``operation_id`` as ``owner`` (``host:pid:thread``).

    Args:
        token: the fencing token the operation was dispatched at (the embedded runner's
            dispatch; :func:`~packhorse.operations.lifecycle.claim`). ``None``: the current one.
        min_attempt: run only as attempt ``min_attempt`` or later (a broker message's "at
            attempt ≥ A"; see :func:`~packhorse.operations.lifecycle.claim`). ``None``: any attempt.

    Returns:
        the :class:`Outcome`. A duplicate delivery (already done, under a lease not expired, at
        a newer attempt, or not yet due) returns ``SKIPPED`` without doing anything (I3).

    Raises:
        TransientDatabaseError: the database was unreachable while claiming (nothing was
            claimed; the caller may try again later).
    """
    c = claim(ctx.db, operation_id, owner, ctx.settings.recovery.lease_timeout_seconds, token=token,
              min_attempt=min_attempt)
    if c is None:
        return Outcome.SKIPPED
    # every log line of the task carries these (structlog contextvars)
    with structlog.contextvars.bound_contextvars(**_log_context(c)):
        return _run_claimed(ctx, c)


def task_id(c: Claim) -> str:
    """The task id of a claimed attempt, ``owner#attempt`` (logs, error context)."""
    return f"{c.owner}#{c.attempt}"


def _run_claimed(ctx: ProcessContext, c: Claim) -> Outcome:
    operation_id = c.operation_id
    op = c.operation if c.operation is not None else ctx.db.read(lambda s: s.get(Operation, operation_id))
    assert op is not None
    log.debug("operation_claimed")
    keeper = _keeper(ctx, c)
    work = Work(ctx, c, op, keeper)
    started = time.monotonic()
    # the attempt's units of work ride out a database outage while its lease may hold
    with keeper, retry_while(keeper.may_hold):
        try:
            recorder = _run_stage(ctx, work)

            def finish(s: Session) -> None:
                if not complete_in(s, c, keeper.bytes_done):
                    raise LeaseLostError(f"operation {operation_id}: attempt {c.attempt} is stale; completion rejected")
                recorder(s)

            ctx.db.transact(finish)
        except Exception as exc:
            outcome = _failed(ctx, c, exc, work.info, salvage=work.salvage)
            _finished(ctx, work, started, outcome)
            return outcome
    _completed(work.info)
    _finished(ctx, work, started, Outcome.COMPLETED)
    return Outcome.COMPLETED


def _finished(ctx: ProcessContext, work: Work, started: float, outcome: "Outcome") -> None:
    """Hand a finished attempt (completed, or failed: retried or not) to the metrics sink
    (:mod:`packhorse.runtime.influx`; only queued, never blocks or raises); deferred and stale attempts
    are not finished."""
    if outcome not in (Outcome.COMPLETED, Outcome.RETRY, Outcome.FAILED):
        return
    try:
        sink = ctx.metrics_sink()
        if sink is None:
            return
        op = work.op
        sink.operation_finished(
            kind=work.claim.kind.value, duration_seconds=time.monotonic() - started,
            success=outcome is Outcome.COMPLETED, size_bytes=work.lease.bytes_done,
            source=ctx.location_name(op.source_location_id) if op.source_location_id is not None else None,
            destination=(ctx.location_name(op.destination_location_id)
                         if op.destination_location_id is not None else None))
    except Exception as e:  # noqa: BLE001 - metrics never fail an operation
        log.warning("metrics_sink_failed", error=str(e))


def _run_stage(ctx: ProcessContext, work: Work) -> Recorder:
    """Run the stage of a claimed attempt and return what its completion records; nothing is
    recorded here. Raises what the stage raises, :class:`~packhorse.errors.LocationUnavailableError`
    before anything is read if a location it touches is unavailable (storage that is absent is
    not empty: wait, write nothing), and :class:`~packhorse.errors.LeaseLostError` if the lease
    was lost meanwhile."""
    unavailable = _unavailable_location(ctx, work.op)
    if unavailable is not None:
        raise unavailable
    recorder = STAGES[work.claim.kind](work)
    work.check()
    return recorder


def _completed(info: dict[str, Any]) -> None:
    log.info("operation_completed", **{k: v for k, v in info.items() if isinstance(v, (str, int))})


def _failed(ctx: ProcessContext, c: Claim, exc: Exception, info: dict[str, Any],
            salvage: Callable[[Session], None] | None = None) -> Outcome:
    """What an attempt that raised ``exc`` comes to (the one place that decides it): a lost
    lease is recorded as a stale attempt; a deferral hands the operation back; a database
    outage leaves it to lease recovery; anything else goes through the single failure path."""
    rec = ctx.settings.recovery
    if isinstance(exc, (TransientDatabaseError, LeaseNotRenewedError)):
        # not the operation's failure (DESIGN.md "Architecture"), and no stall: the database
        # (or this process) was away for as long as the lease could last
        return hand_back(ctx, c, exc, info)
    if isinstance(exc, LeaseLostError):
        log.warning("operation_attempt_stale", error=str(exc))
        _record_stale(ctx, c, exc)
        return Outcome.STALE
    if isinstance(exc, DeletionNotSafeError):
        return _wait_for_deletion_rule(ctx, c, exc)
    if isinstance(exc, OperationDeferred):
        if not defer(ctx.db, c, exc.seconds):
            return Outcome.STALE
        log.info("operation_deferred", reason=str(exc), seconds=exc.seconds)
        return Outcome.DEFERRED
    if not isinstance(exc, (TransientDatabaseError, LocationUnavailableError)) and c.operation is not None:
        # a stage that failed because its location went away under it (a source folder
        # unmounted mid-read: "file not found") waits for the location like one that saw it first;
        # so does one whose write the storage refused (EROFS, EIO, EACCES, AccessDenied)
        exc = _unavailable_location(ctx, c.operation, quiet=True) or storage_fault(ctx, c.operation, exc) or exc
    if isinstance(exc, LocationUnavailableError):
        return _wait_for_location(ctx, c, exc, salvage)
    if isinstance(exc, DestinationWriteError) and exc.out_of_space:
        never = _never_fits(ctx, c, exc)
        if never is None:
            return _wait_for_space(ctx, c, exc, salvage)
        exc = never  # waiting cannot release it: a failure, and a human is told
    result = record_failure(ctx.db, c, exc, backoff_base=rec.retry_backoff_base_seconds,
                            backoff_max=rec.retry_backoff_max_seconds, operation_info=info,
                            notification_cooldown_seconds=rec.notification_cooldown_seconds,
                            notification_gather_seconds=ctx.settings.notifications.digest_gather_seconds,
                            notify_retries=ctx.settings.notifications.development_mode, salvage=salvage,
                            recovery=rec)
    if result.status is None:
        log.warning("operation_attempt_stale", error=str(exc))
        return Outcome.STALE
    level = log.warning if result.will_retry else log.error
    level("operation_failed", error_type=type(exc).__name__, error=str(exc), will_retry=result.will_retry)
    return Outcome.RETRY if result.will_retry else Outcome.FAILED


def hand_back(ctx: ProcessContext, c: Claim, exc: Exception, info: dict[str, Any] | None = None) -> Outcome:
    """Hand back an attempt that stopped because the database was away for as long as its lease
    could last (``exc``: a :class:`~packhorse.errors.TransientDatabaseError` that outlived the
    lease, or :class:`~packhorse.errors.LeaseNotRenewedError`, docs/recovery.md "Layer 2"), as
    soon as the database answers again: ``PENDING``, due at once, lease cleared, no retry
    counted, and no stall on the circuit breaker (the operation is no suspect: its worker lost
    the database, not the work). Why is recorded in the same transaction as a failure event
    (``will_retry`` true, ``error_type`` the exception's). Both executors come here
    (:func:`execute_operation`, :func:`execute_task`).

    The hand-back is a compare-and-set on :func:`~packhorse.operations.lifecycle.fenced` (the
    attempt and ``IN_PROGRESS``, through :func:`~packhorse.operations.lifecycle.defer`): if the
    monitor or another worker took the operation over meanwhile, it changes nothing and the
    attempt is recorded as stale (a ``LeaseLostError`` failure event). The database is tried
    for up to ``lease_timeout_seconds`` (s) more, a try at most
    :data:`~packhorse.db.session.PATIENT_RETRY_MAX_DELAY` apart; an outage longer than that
    leaves the operation ``IN_PROGRESS`` to lease recovery (the monitor, a stall counted), as
    before.

    Returns:
        ``DEFERRED`` when handed back, else ``STALE``.
    """
    rec = ctx.settings.recovery
    started = time.monotonic()
    give_up = started + rec.lease_timeout_seconds
    op = c.operation
    event = build_error_context(exc, kind=c.kind, operation_id=c.operation_id, task_id=task_id(c),
                                retry_count=op.retry_count if op is not None else 0, will_retry=True,
                                operation_info=info, auto_diagnosis=(
                                    "the ops database was unreachable for as long as the lease could last; "
                                    "the operation was handed back when it answered again (no action needed)"))

    def record(s: Session) -> None:  # in the hand-back's own transaction
        s.add(FailureEvent(operation_id=c.operation_id, kind=c.kind.value, attempt=c.attempt,
                           retry_count=event["retry_count"], error_type=type(exc).__name__,
                           message=str(exc)[:4000], will_retry=True, error_context=event, created_at=utcnow()))

    log.warning("operation_stopped_database_unavailable", error=str(exc))
    try:
        with retry_while(lambda: time.monotonic() < give_up):
            handed = defer(ctx.db, c, 0.0, also=record)
    except TransientDatabaseError as e:
        log.error("operation_abandoned_database_unavailable", error=str(e),
                  waited_seconds=round(time.monotonic() - started, 1))
        return Outcome.STALE
    if not handed:  # taken over meanwhile: recorded as any stale attempt is
        stale = LeaseLostError(f"operation {c.operation_id}: attempt {c.attempt} is no longer the operation's "
                               f"current attempt; not handed back ({type(exc).__name__}: {exc})")
        log.warning("operation_attempt_stale", error=str(stale))
        with contextlib.suppress(Exception):  # the record of a stale attempt is best effort here
            _record_stale(ctx, c, stale)
        return Outcome.STALE
    log.warning("operation_handed_back_database_unavailable", waited_seconds=round(time.monotonic() - started, 1))
    return Outcome.DEFERRED


def _unavailable_location(ctx: ProcessContext, op: Operation, *, quiet: bool = False
                          ) -> LocationUnavailableError | None:
    """The first unavailable location ``op`` touches (:func:`packhorse.rules.availability.check_operation`),
    else ``None``. With ``quiet`` (after a failure) a location that cannot even be looked at
    counts as available: the original failure is then the one recorded."""
    if not quiet:
        return check_operation(ctx, op)
    try:
        return check_operation(ctx, op)
    except Exception as e:  # noqa: BLE001 - the stage's own failure is the one to record
        log.debug("location_check_after_failure_failed", error=str(e))
        return None


def _waiting_note(ctx: ProcessContext, c: Claim, exc: Exception, waiting: str, diagnosis: str,
                  location: str | None = None) -> dict[str, Any]:
    """The ``error_context`` of an attempt handed back to wait (:func:`defer`): the one
    error-context dict (DESIGN.md "Error context") with ``waiting`` (what it waits for:
    :data:`~packhorse.domain.WAITING_DELETION_RULE`, ``WAITING_LOCATION``,
    ``WAITING_SPACE``), the ``attempt`` handed back, ``waiting_since`` (ISO 8601 UTC: when it
    first waited for the same thing — kept from the note of an earlier hand-back for the same
    cause and location, so a BLOCKED line's "since" is the start of the wait, not the latest
    look) and, for a location, its name and ``location_id`` (what ``run --until-idle``,
    ``status`` and ``diagnose`` go by)."""
    note = build_error_context(exc, kind=c.kind, operation_id=c.operation_id, task_id=task_id(c),
                               retry_count=c.operation.retry_count if c.operation is not None else 0,
                               will_retry=True, auto_diagnosis=diagnosis)
    prev = (c.operation.error_context if c.operation is not None else None) or {}
    same = prev.get("waiting") == waiting and prev.get("location") == location
    note.update(waiting=waiting, attempt=c.attempt,
                waiting_since=(prev.get("waiting_since") if same else None) or utcnow().isoformat())
    if location is not None:
        note.update(location=location, location_id=ctx.topology.location_ids.get(location))
    return note


def _wait_for_deletion_rule(ctx: ProcessContext, c: Claim, exc: DeletionNotSafeError) -> Outcome:
    """Hand back a deletion whose rule (I1) does not hold now (nothing was deleted): ``PENDING``
    until a backoff growing with its attempts has passed (``[recovery]`` base and cap; no retry
    counted, no failure event), with a note of why it waits in its ``error_context``
    (``waiting = "deletion_rule"``). It is never FAILED for it: its preconditions changed after
    it was planned (a copy being made again, a fixity finding being repaired), and the deletion
    manager makes it due again as soon as the rule holds
    (:func:`packhorse.managers.deletions.wake_safe_deletions`); the stage checks the rule again
    before any byte goes."""
    rec = ctx.settings.recovery
    seconds = (backoff_seconds(max(c.attempt - 1, 0), rec.retry_backoff_base_seconds, rec.retry_backoff_max_seconds)
               if exc.backoff else exc.seconds)
    note = _waiting_note(ctx, c, exc, WAITING_DELETION_RULE, "not safe yet: it is checked again once the copies it "
                         "waits for are there (no action needed)")
    if not defer(ctx.db, c, seconds, note=note):
        return Outcome.STALE
    log.info("deletion_waits_for_rule", reason=str(exc), seconds=round(seconds, 3))
    return Outcome.DEFERRED


def _wait_for_location(ctx: ProcessContext, c: Claim, exc: LocationUnavailableError,
                       salvage: Callable[[Session], None] | None = None) -> Outcome:
    """Defer the attempt while ``exc.location`` is unavailable (DESIGN.md "Architecture": work
    on an unavailable location waits and resumes by itself): the outage is recorded (one
    notification per outage), no retry is counted, no failure event is written; what the
    attempt published and verified before (``salvage``) is recorded with the deferral."""
    since = record_outage(ctx, exc)
    seconds = wait_seconds(ctx, since)
    # which location it waits for, whether or not it is the operation's source or destination
    # (availability.waiting_for: run --until-idle, status and the outage's end go by it)
    note = _waiting_note(ctx, c, exc, WAITING_LOCATION, f"waits for data location {exc.location} to be available "
                         "again; resumes by itself (no action needed here)", location=exc.location)
    if not defer(ctx.db, c, seconds, note=note, salvage=salvage):
        return Outcome.STALE
    log.info("operation_waits_for_location", location=exc.location, reason=exc.reason, seconds=round(seconds, 3))
    return Outcome.DEFERRED


def _never_fits(ctx: ProcessContext, c: Claim, exc: DestinationWriteError) -> NeverFitsError | None:
    """A :class:`~packhorse.errors.NeverFitsError` when what the attempt that met a full file
    system must hold at once is larger than that whole file system
    (:func:`packhorse.rules.space.never_fits`), else ``None`` (it waits for space). A check
    that itself fails counts as "may fit": waiting is the safe side."""
    location = exc.host
    if c.operation is None or not location:
        return None
    try:
        why = never_fits(ctx, c.operation, location)
    except Exception as e:  # noqa: BLE001 - the wait for space is the safe outcome
        log.debug("never_fits_check_failed", error=repr(e))
        return None
    if why is None:
        return None
    return NeverFitsError(why, step=exc.step, side="destination", path=exc.path, host=location,
                          diagnosis=(f"give data location {location} a larger file system, then `packhorse reset "
                                     f"{c.kind.value} {c.operation_id}` (what a package or bundle holds is fixed once "
                                     "made; group_depth and bundle_target_bytes shape only later ones)"))


def _wait_for_space(ctx: ProcessContext, c: Claim, exc: DestinationWriteError,
                    salvage: Callable[[Session], None] | None = None) -> Outcome:
    """Hand back an attempt whose write met a full data location (the partial file is already
    removed): ``PENDING`` until a backoff growing with its attempts has passed (``[recovery]``
    base and cap), no retry counted, no failure event, with ``error_context["waiting"] =
    "space"`` and the location: space comes back by itself (deletions under disk pressure,
    docs/deletion.md) or from an operator, and a full disk must not end in a FAILED operation
    that only ``packhorse reset`` releases (DESIGN.md I5: every state has an owner). Listed
    blocked meanwhile (:func:`packhorse.status.blocked_work.location_full`, exit 4); one WARNING
    notification per location and cooldown. What the attempt published and verified before the
    disk filled up (``salvage``: an unpack's first packages) is recorded with the deferral, so
    those copies are archived and freed, which may be the space it waits for."""

    rec = ctx.settings.recovery
    seconds = backoff_seconds(max(c.attempt - 1, 0), rec.retry_backoff_base_seconds, rec.retry_backoff_max_seconds)
    location = exc.host or "?"
    note = _waiting_note(ctx, c, exc, WAITING_SPACE, f"data location {location} is full: it waits for space and "
                         "goes on by itself (no action needed unless it stays full)", location=location)

    # what was free once the partial file was removed: more later means space was freed
    # (packhorse.rules.space.space_freed makes it due at once)
    note.update(free_bytes=free_bytes(ctx, location) if location != "?" else None)

    def tell(s: Session) -> None:  # in the hand-back's own transaction
        enqueue(s, level=NotificationLevel.WARNING, event="location_full",
                subject=f"Data location {location} is full: work waits for space",
                body=(f"{exc}\n\nThe operation waits for space at {location} and goes on by itself once there "
                      "is some. At a buffer packhorse frees its own copies once they are archived (under disk "
                      "pressure first: docs/deletion.md); archives it never frees. `packhorse status` lists what "
                      "waits and what releases it."),
                context={"location": location, "path": exc.path}, cooldown_seconds=rec.notification_cooldown_seconds,
                key=f"location_full:{location}")

    if not defer(ctx.db, c, seconds, note=note, salvage=salvage, also=tell):
        return Outcome.STALE
    log.warning("operation_waits_for_space", location=location, key=exc.path, seconds=round(seconds, 3))
    return Outcome.DEFERRED


def execute_task(ctx: ProcessContext, operations: list[tuple[int, int | None]], owner: str) -> list[Outcome]:
    """Run one task of an executor: ``[(operation id, dispatched fencing token or None), …]``.

    One operation runs through :func:`execute_operation`. Several are claimed in one
    transaction (:func:`~packhorse.operations.lifecycle.claim_many`, each a compare-and-set at its own
    token, I3), then buffer-copy deletions run as :func:`execute_deletions` runs them and every
    other operation as :func:`_run_claimed_together` does: each keeps its own row, lease,
    fencing token, stage run, read-back verification (I4) and outcome. Which operations share
    a task is :mod:`packhorse.operations.batching`'s (both executors: a pool task, a broker message).

    Returns:
        the :class:`Outcome` of each operation, in order (``SKIPPED``: not claimed).

    Raises:
        TransientDatabaseError: the database was unreachable while claiming (nothing was
            claimed; the caller may try again later).
    """
    if len(operations) == 1:
        return [execute_operation(ctx, operations[0][0], owner, token=operations[0][1])]
    claims = claim_many(ctx.db, dict(operations), owner, ctx.settings.recovery.lease_timeout_seconds)
    outcomes = {i: Outcome.SKIPPED for i, _ in operations}
    deletions = {i: c for i, c in claims.items()
                 if c.operation is not None and batchable(c.kind.value, c.operation.physical_copy_id)}
    if deletions:
        outcomes.update(_run_deletions(ctx, deletions))
    others = {i: c for i, c in claims.items() if i not in deletions}
    if others:
        outcomes.update(_run_claimed_together(ctx, others))
    return [outcomes[i] for i, _ in operations]


def _preload(works: Iterable[Work]) -> None:
    """Each kind's first reads for all its operations of a task at once (:data:`PRELOADS`).
    Where that fails (the database away), each stage reads for itself, and fails or waits as
    it would alone."""
    by_kind: dict[OperationKind, list[Work]] = {}
    for w in works:
        by_kind.setdefault(w.claim.kind, []).append(w)
    for kind, ws in by_kind.items():
        if kind in PRELOADS:
            try:
                PRELOADS[kind](ws)
            except Exception as e:  # noqa: BLE001 - the stages read for themselves
                log.debug("task_preload_failed", operation_kind=kind.value, error=repr(e))


def _run_claimed_together(ctx: ProcessContext, claims: dict[int, Claim]) -> dict[int, Outcome]:
    """Run claimed attempts one after the other and complete every one that succeeded in one
    transaction: every operation's row in one statement (:func:`complete_many`, each a
    compare-and-set at its own fencing token, I3), then what the stages record, those of one
    kind that can together (:class:`~packhorse.stages.base.Records`: builds, archive copies)
    with a few statements for all of them. When one completion is
    refused (stale or conflicting), the transaction is rolled back and run again with each
    completion in its own savepoint, so the refused one changes nothing of the others'. Across
    a long link every statement is a round trip (a savepoint and its release two more an
    operation): docs/benchmarks.md. Each destination folder is synced once for the task, before
    the completion transaction (a failed folder sync fails every operation of the task). Every
    lease is renewed by its heartbeats while its attempt waits its turn. Nothing is recorded
    before that transaction, so a worker killed mid-task leaves only leases to expire (lease
    recovery), as a single attempt would; a failure of one goes through the single failure path
    (:func:`_failed`) and the others go on."""
    works = {op_id: Work(ctx, c, c.operation if c.operation is not None
                         else ctx.db.read(lambda s, i=op_id: s.get(Operation, i)), _keeper(ctx, c))
             for op_id, c in claims.items()}
    started = time.monotonic()
    outcomes: dict[int, Outcome] = {}
    done: dict[int, Recorder] = {}
    failed: dict[int, Exception] = {}
    with contextlib.ExitStack() as leases:
        for w in works.values():
            leases.enter_context(w.lease)
        leases.enter_context(retry_while(lambda: all(w.lease.may_hold() for w in works.values())))
        try:
            # each folder the task published into is synced once, after its last object and
            # before anything is recorded (StorageBackend.deferred_sync; each object's bytes
            # are still synced before it is published, I2)
            with contextlib.ExitStack() as syncs:
                for location_id in sorted({w.op.destination_location_id for w in works.values()
                                           if w.op.destination_location_id is not None}):
                    syncs.enter_context(ctx.backend(ctx.location_name(location_id)).deferred_sync())
                _preload(works.values())
                for op_id, w in works.items():
                    with structlog.contextvars.bound_contextvars(**_log_context(w.claim)):
                        log.debug("operation_claimed")
                        try:
                            done[op_id] = _run_stage(ctx, w)
                        except Exception as exc:
                            failed[op_id] = exc
        except OSError as exc:  # a folder sync failed: nothing the task published is recorded
            failed.update((op_id, exc) for op_id in done)
            done = {}

        def finish(s: Session, *, savepoints: bool) -> dict[int, Exception]:
            refused: dict[int, Exception] = {}
            if not savepoints:  # every completion in one statement; a stale one: again, each alone
                completed = complete_many(s, [works[i].claim for i in done],
                                          {i: works[i].lease.bytes_done for i in done})
                if stale := sorted(set(done) - completed):
                    raise LeaseLostError(f"operations {stale}: attempts stale; completion rejected")
            together: dict[Callable[[Session, list[Any]], None], list[Any]] = {}
            for op_id, recorder in done.items():
                if not savepoints and isinstance(recorder, Records):  # with the others of its kind, below
                    together.setdefault(recorder.record_many, []).append(recorder.item)
                    continue
                w = works[op_id]
                try:
                    with s.begin_nested() if savepoints else contextlib.nullcontext():
                        if savepoints and not complete_in(s, w.claim, w.lease.bytes_done):
                            raise LeaseLostError(f"operation {op_id}: attempt {w.claim.attempt} is stale; "
                                                 "completion rejected")
                        recorder(s)
                except SQLAlchemyError:
                    raise  # the database's trouble, not this operation's: every one of the task
                except Exception as exc:  # noqa: BLE001 - this operation's own, as if run alone
                    if not savepoints:
                        raise  # roll the whole back; the next run gives each its savepoint
                    refused[op_id] = exc
            for record_many, items in together.items():  # a few statements for all of them
                record_many(s, items)  # one item's refusal: rolled back, each again in its savepoint
            return refused

        if done:
            try:
                try:  # every completion at once; only when one is refused, each in its savepoint
                    refused = ctx.db.transact(lambda s: finish(s, savepoints=False))
                except (SQLAlchemyError, TransientDatabaseError):
                    raise  # the database's trouble: every operation of the task
                except Exception:  # noqa: BLE001 - one operation's own: again, each alone
                    refused = ctx.db.transact(lambda s: finish(s, savepoints=True))
            except Exception as exc:  # each operation's failure, as if run alone
                refused = {op_id: exc for op_id in done}
            for op_id in done:
                if op_id in refused:
                    failed[op_id] = refused[op_id]
                    continue
                with structlog.contextvars.bound_contextvars(**_log_context(works[op_id].claim)):
                    _completed(works[op_id].info)
                outcomes[op_id] = Outcome.COMPLETED
        for op_id, exc in failed.items():
            w = works[op_id]
            with structlog.contextvars.bound_contextvars(**_log_context(w.claim)):
                outcomes[op_id] = _failed(ctx, w.claim, exc, w.info, salvage=w.salvage)
    for op_id, outcome in outcomes.items():  # the task's time, shared by its operations
        _finished(ctx, works[op_id], started, outcome)
    return outcomes


def execute_deletions(ctx: ProcessContext, operation_ids: list[int], owner: str,
                      tokens: list[int | None] | None = None) -> list[Outcome]:
    """Run several buffer-copy ``deletion`` operations together, with the database work of one:
    one transaction claims them all, one checks the deletion rules and marks every copy
    (:func:`~packhorse.stages.deletion.mark_copies`), one completes them all after their bytes
    went (:func:`~packhorse.engine.outcome.complete_many`: one fenced statement). Each operation
    keeps its own row, lease, fencing token and outcome: a copy the rules block, a failed
    delete or a stale attempt goes through the same failure path as a single operation
    (:func:`_failed`) and the others go on. A small deletion costs a few milliseconds
    of database time; three transactions for each were most of that (benchmark (b)).

    ``tokens``: the fencing token each was dispatched at (``None`` or left out: the current one).

    Returns:
        the :class:`Outcome` of each of ``operation_ids``, in order (``SKIPPED``: not claimed).

    Raises:
        TransientDatabaseError: the database was unreachable while claiming.
    """
    rec = ctx.settings.recovery
    wanted = dict(zip(operation_ids, tokens if tokens is not None else [None] * len(operation_ids)))
    claims = claim_many(ctx.db, wanted, owner, rec.lease_timeout_seconds)
    outcomes = {i: Outcome.SKIPPED for i in operation_ids}
    outcomes.update(_run_deletions(ctx, claims))
    return [outcomes[i] for i in operation_ids]


def _run_deletions(ctx: ProcessContext, claims: dict[int, Claim]) -> dict[int, Outcome]:
    """The claimed deletions of :func:`execute_deletions`: their outcomes by operation id."""
    outcomes: dict[int, Outcome] = {}
    works: dict[int, Work] = {}
    started = time.monotonic()
    for c in claims.values():
        assert c.operation is not None and c.operation.physical_copy_id is not None
        works[c.operation_id] = Work(ctx, c, c.operation, _keeper(ctx, c))
    with contextlib.ExitStack() as leases:
        for w in works.values():
            leases.enter_context(w.lease)
        leases.enter_context(retry_while(lambda: all(w.lease.may_hold() for w in works.values())))

        def mark(s: Session) -> tuple[dict[int, PhysicalCopy], dict[int, Exception]]:
            # the rules of every raw package copy checked in one pass, each as if the copies
            # before it were marked (mark_copies); a blocked copy changes nothing, the others go on
            verdicts = deletion.mark_copies(s, ctx, [w.op.physical_copy_id for w in works.values()])  # type: ignore[misc]
            marked: dict[int, PhysicalCopy] = {}
            blocked: dict[int, Exception] = {}
            for op_id, w in works.items():
                v = verdicts[w.op.physical_copy_id]  # type: ignore[index]
                if isinstance(v, Exception):
                    blocked[op_id] = v
                else:
                    marked[op_id] = v
            return marked, blocked

        waiting: dict[int, Work] = {}
        for op_id, w in list(works.items()):  # a copy on an unavailable location is not touched
            try:
                err = _unavailable_location(ctx, w.op)
            except Exception as exc:  # noqa: BLE001 - as if run alone
                err = exc  # type: ignore[assignment]
            if err is not None:
                waiting[op_id] = works.pop(op_id)
                w.info["_waiting_error"] = err
        if works:
            ctx.hooks.hit("deletion.start")  # hooks: claimed, the rules not checked yet
        try:
            marked, failed = ctx.db.transact(mark) if works else ({}, {})
        except Exception as exc:  # each operation's failure, as if run alone
            failed, marked = {op_id: exc for op_id in works}, {}
        deleted: list[int] = []
        # each folder the batch deleted from is synced once, when the last copy went and
        # before any deletion is recorded (StorageBackend.deferred_sync)
        try:
            with contextlib.ExitStack() as syncs:
                synced: set[int] = set()
                for op_id, copy in marked.items():
                    w = works[op_id]
                    if copy.location_id not in synced:
                        synced.add(copy.location_id)
                        syncs.enter_context(ctx.backend(ctx.location_name(copy.location_id)).deferred_sync())
                    with structlog.contextvars.bound_contextvars(**_log_context(w.claim)):
                        try:
                            deletion.delete_bytes(w, copy)
                            w.check()
                            deleted.append(op_id)
                        except Exception as exc:
                            failed[op_id] = exc
        except OSError as exc:  # a folder sync failed: none of these deletions is recorded as done
            failed.update((op_id, exc) for op_id in deleted)
            deleted = []

        def finish(s: Session) -> list[int]:
            completed = complete_many(s, [works[op_id].claim for op_id in deleted],
                                      {op_id: works[op_id].lease.bytes_done for op_id in deleted})
            stale = []
            for op_id in deleted:
                if op_id in completed:
                    deletion.record_deleted(s, works[op_id].op.physical_copy_id)  # type: ignore[arg-type]
                else:
                    stale.append(op_id)
            return stale

        try:
            for op_id in ctx.db.transact(finish):
                deleted.remove(op_id)
                failed[op_id] = LeaseLostError(
                    f"operation {op_id}: attempt {works[op_id].claim.attempt} is stale; completion rejected")
        except Exception as exc:
            failed.update((op_id, exc) for op_id in deleted)
            deleted = []
        for op_id in deleted:
            with structlog.contextvars.bound_contextvars(**_log_context(works[op_id].claim)):
                _completed(works[op_id].info)
            outcomes[op_id] = Outcome.COMPLETED
        for op_id, w in waiting.items():
            works[op_id] = w
            failed[op_id] = w.info.pop("_waiting_error")
        for op_id, exc in failed.items():
            w = works[op_id]
            with structlog.contextvars.bound_contextvars(**_log_context(w.claim)):
                outcomes[op_id] = _failed(ctx, w.claim, exc, w.info)
    for op_id, outcome in outcomes.items():  # the batch's time, shared by its deletions
        _finished(ctx, works[op_id], started, outcome)
    return outcomes


def _keeper(ctx: ProcessContext, c: Claim) -> LeaseKeeper:
    """The lease keeper of a claimed attempt, with the ``[recovery]`` timings."""
    rec = ctx.settings.recovery
    return LeaseKeeper(ctx.db, c, lease_seconds=rec.lease_timeout_seconds,
                       interval_seconds=rec.heartbeat_interval_seconds, deadline_seconds=rec.renewal_deadline_seconds)


def _log_context(c: Claim) -> dict[str, Any]:
    """The fields every log line of an attempt carries."""
    return dict(operation_kind=c.kind.value, operation_id=c.operation_id, attempt=c.attempt, task_id=task_id(c))
