"""The stalled-task monitor (seed 002 "Stalled Task Detection & Recovery").

One cycle (:func:`check_stalled`):

1. let one attempt through every open circuit breaker whose cool-down passed (half-open:
   the held operation is reset to ``PENDING``; INFO notification each);
2. for every ``IN_PROGRESS`` operation whose lease expired (a *stalled* operation), or whose
   lease holder is certainly gone before it expired (:func:`provably_gone`: a process of this
   host and pid namespace that no longer runs, say a ``packhorse run`` killed and restarted;
   its lease could never be renewed, so nothing is gained by waiting it out): append a
   ``Stalled`` failure event and count the stall on its breaker — once per attempt, and not
   when the operation is no suspect (:func:`excuse`): the attempt's embedded runner is gone
   with it (the whole service was stopped), the database restarted after the holder's last
   renewal, or no worker of the operation's site has been heard from since (the site is cut
   off from the centre) — the holder lost the database, the operation did nothing wrong, so a
   site cut off, however long and however often, opens no breaker of the work it had in hand,
   and its operations are handed back without a page each (the cut is notified once, as the
   site's: :mod:`packhorse.recovery.site_reachability`);
3. if the breaker is open (``max_stall_count`` stalls, or the attempt let through after a
   cool-down stalled): leave the operation for the cool-down and queue one ERROR notification
   per cooldown window; otherwise run the recovery handler registered for the
   operation's kind, which resets it to ``PENDING`` for re-dispatch (fenced on the attempt, so
   a worker that renewed meanwhile is never disturbed) and queue a WARNING notification;
4. a kind with no registered handler (the seeds' bug #69) is never skipped silently: ERROR
   notification, operation left for a human.

Every state change and its notification share one transaction. A lost dispatch or stall never
counts as a retry: ``retry_count`` is left alone. Any number of monitors may run at once (high
availability, :mod:`packhorse.engine.pipeline`): each stalled operation's row is locked and re-checked
before it is handled (a row another monitor is handling is skipped, not waited for), so a stall
is counted, recorded and notified once.

:data:`RECOVERY_HANDLERS` is the live registration the owners test (I5) reads.
"""

from __future__ import annotations

import datetime as dt
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog
from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session

from packhorse.config import RecoveryConfig, Settings
from packhorse.db.models import FailureEvent, Operation, ServiceHeartbeat, Site, utcnow
from packhorse.db.session import Database, bound_idle_in_transaction
from packhorse.domain import BreakerState, NotificationLevel, OperationKind, Status
from packhorse.notify.outbox import enqueue
from packhorse.operations.attempts import claim_words
from packhorse.operations.identity import (
    NAMESPACE_TAG,
    holder_processes,
    namespace_of,
    process_namespace,
    runner_of,
)
from packhorse.operations.lifecycle import fenced
from packhorse.recovery import breakers
from packhorse.recovery.health import process_alive
from packhorse.recovery.link_reachability import track_links
from packhorse.recovery.reconciler import reconcile
from packhorse.recovery.site_reachability import track_sites

if TYPE_CHECKING:
    from packhorse.recovery.reconciler import BrokerWatch

log = structlog.get_logger(__name__)

#: ``handler(session, op, now) -> None``: move a stalled operation on (inside the monitor's
#: transaction; ``op`` is locked by the fenced check of the caller).
RecoveryHandler = Callable[[Session, Operation, dt.datetime], None]


def reset_for_redispatch(session: Session, op: Operation, now: dt.datetime) -> None:
    """The standard recovery: ``IN_PROGRESS`` → ``PENDING``, lease cleared, dispatchable now.

    The next attempt cleans the stalled attempt's partial outputs before it writes (the disk
    backend removes partial files of the same key), so nothing else needs undoing here.
    """
    session.execute(update(Operation).where(fenced(op.id, op.attempt))
                    .values(status=Status.PENDING.value, lease_owner=None, lease_expires_at=None,
                            not_before=None, updated_at=now))


#: Recovery handler per operation kind: every kind a worker can run must have one (I5).
RECOVERY_HANDLERS: dict[OperationKind, RecoveryHandler] = {}


def register_recovery_handler(kind: OperationKind, handler: RecoveryHandler = reset_for_redispatch) -> None:
    """Register ``handler`` as the stalled-operation recovery of ``kind``."""
    RECOVERY_HANDLERS[kind] = handler


def _register_defaults() -> None:
    # every operation kind: its stalled attempt is handed back for another dispatch (a kind
    # with no stage has no dispatcher, and the I5 owner map shows it as an orphan)
    for kind in OperationKind:
        register_recovery_handler(kind)


_register_defaults()


@dataclass
class MonitorReport:
    """What one monitor cycle did (operation ids)."""
    reset: list[int] = field(default_factory=list)
    blocked: list[int] = field(default_factory=list)      # left: breaker open
    unhandled: list[int] = field(default_factory=list)    # left: no recovery handler
    #: let through: an open breaker's cool-down passed (half-open, one attempt)
    let_through: list[int] = field(default_factory=list)


def _stall_event(op: Operation, now: dt.datetime, *, gone: bool = False) -> FailureEvent:
    expires = op.lease_expires_at.isoformat() if op.lease_expires_at else "-"
    message = (f"lease of attempt {op.attempt} ({op.lease_owner or 'unknown worker'}) "
               + (f"taken over before it expired at {expires}: its holder's process is gone from this host"
                  if gone else f"expired at {expires} without completion"))
    ctx = {"error_type": "Stalled", "message": message,
           "operation_kind": op.kind, "operation_id": op.id, "task_id": f"{op.lease_owner}#{op.attempt}",
           "task_name": f"packhorse.{op.kind}", "retry_count": op.retry_count, "will_retry": True,
           "timestamp": now.isoformat(), "operation_info": {"bytes_done": op.bytes_done}, "step": "lease",
           "worker_host": (op.lease_owner or "").split(":")[0] or None}
    return FailureEvent(operation_id=op.id, kind=op.kind, attempt=op.attempt, retry_count=op.retry_count,
                        error_type="Stalled", message=ctx["message"], will_retry=True, error_context=ctx,
                        created_at=now)


def _here(host: str, owner: str | None) -> bool:
    """Whether ``owner``'s pids are this host's to look at: it names this host and, when it
    names a process namespace (:func:`~packhorse.operations.identity.namespace_of`), this process's."""
    if host != socket.gethostname():
        return False
    ns = namespace_of(owner)
    return ns is None or ns == process_namespace()


def died_with_its_runner(owner: str | None) -> bool:
    """Whether a stalled attempt's lease holder was an embedded runner of this host that is gone
    (:func:`~packhorse.operations.identity.runner_of`; its pid no longer runs): the whole service stopped
    (killed, a host reboot, a crash loop), so the operation is not a suspect and no stall is
    counted on its circuit breaker. A worker process dying under a live runner, a Celery pool
    child, a holder on another host or in another container (another process namespace) or a
    pid now reused count as before (DESIGN.md "Circuit breaker": the breaker holds an operation
    that keeps killing or hanging its worker)."""
    held = runner_of(owner)
    return held is not None and _here(held[0], owner) and not process_alive(held[1])


def lease_holder_gone(owner: str | None) -> bool:
    """Whether the process holding an attempt's lease is gone from this host: the owner names
    this host (and this process namespace, when it names one) and one of the processes it names
    no longer runs (:func:`~packhorse.operations.identity.holder_processes`) — the embedded runner, its
    worker process (``worker-<pid>``), or a Celery pool child (``celery-<task id>``). Its lease
    can then never be renewed: the attempt is over, though the lease has not expired yet (what
    ``packhorse diagnose`` tells the operator). An owner on another host, or of another form, is
    never taken for gone."""
    held = holder_processes(owner)
    return held is not None and _here(held[0], owner) and not all(process_alive(p) for p in held[1])


def provably_gone(owner: str | None) -> bool:
    """Whether an attempt's lease holder is certainly gone, so its operation may be taken over
    before the lease expires: :func:`lease_holder_gone`, and the owner names this very process
    namespace (:func:`~packhorse.operations.identity.process_namespace`: the same kernel boot and pid
    namespace, where a pid that does not run is a process that ended). A hostname alone is not
    proof (two containers may share one, each with its own pids); an owner without a namespace
    (an older version's) waits for its lease to expire as before. A pid reused meanwhile makes
    the holder look alive: the lease is then waited out (the safe side). Taking over is safe
    whatever the holder still did: every write of its attempt is fenced (I3)."""
    ns = process_namespace()
    return ns is not None and namespace_of(owner) == ns and lease_holder_gone(owner)


@dataclass(frozen=True)
class Circumstances:
    """What one monitor cycle knows about the whole installation when it judges stalls:
    ``site_heard_at``, the latest health heartbeat of any worker of each site ({site id:
    UTC}; sites whose workers never sent one are absent), and ``database_started_at``, when the
    database server last started (PostgreSQL's ``pg_postmaster_start_time()``, UTC; ``None``
    for SQLite, which has no server)."""

    site_heard_at: dict[int, dt.datetime] = field(default_factory=dict)
    database_started_at: dt.datetime | None = None


def circumstances(session: Session) -> Circumstances:
    """Read the :class:`Circumstances` of this cycle (two small queries)."""
    heard = dict(session.execute(
        select(Site.id, func.max(ServiceHeartbeat.last_seen)).join(ServiceHeartbeat, ServiceHeartbeat.site == Site.name)
        .where(ServiceHeartbeat.kind == "worker").group_by(Site.id)).tuples().all())
    started = None
    if session.get_bind().dialect.name == "postgresql":
        started = session.scalar(text("SELECT pg_postmaster_start_time()"))
    return Circumstances(heard, started)


#: :func:`excuse`'s answer when the attempt's embedded runner is gone with it (still notified:
#: the service was stopped on this host).
RUNNER_GONE = "Its runner is gone (the whole service stopped): no stall is counted against the operation."


def excuse(op: Operation, seen: Circumstances, rec: RecoveryConfig) -> str | None:
    """Why the stalled attempt of ``op`` is no suspect (no stall is counted on its circuit
    breaker and nobody is paged about it), or ``None`` when it is one.
    DESIGN.md "Circuit breaker": the breaker holds an operation that keeps killing or hanging
    its worker, not one whose worker lost the database:

    * its embedded runner is gone with it (:func:`died_with_its_runner`);
    * the database started after the holder's last renewal (``heartbeat_at``, the database's
      clock): nobody could renew a lease while it was down;
    * no worker of its site has been heard from since the attempt's last renewal (plus one
      ``heartbeat_interval_seconds``): the site is cut off from the centre, or all its workers
      stopped — the centre cannot tell the two apart, and either way the operation did nothing.
      A live site's workers send a health heartbeat every ``service_heartbeat_interval_seconds``,
      so this is judged only where that interval plus ``heartbeat_interval_seconds`` fits in
      the lease (the defaults: 30 + 60 ≤ 300 s): a live site has then certainly been heard
      from by the time the lease expired. With a longer health interval it is not judged.

    A worker that dies alone under a live site and a running database is still a suspect."""
    if died_with_its_runner(op.lease_owner):
        return RUNNER_GONE
    renewed = op.heartbeat_at or op.started_at
    if renewed is None:
        return None
    if seen.database_started_at is not None and renewed < seen.database_started_at:
        return (f"The database restarted at {seen.database_started_at.isoformat()}, after the attempt's last "
                "renewal: no stall is counted against the operation.")
    heard = seen.site_heard_at.get(op.site_id)
    judged = rec.service_heartbeat_interval_seconds + rec.heartbeat_interval_seconds <= rec.lease_timeout_seconds
    if judged and heard is not None and heard <= renewed + dt.timedelta(seconds=rec.heartbeat_interval_seconds):
        return (f"No worker of its site has been heard from since {heard.isoformat()} (the site is cut off from "
                "the centre, or its workers stopped): no stall is counted against the operation.")
    return None


def _handle_one(db: Database, settings: Settings, op_id: int, attempt: int, report: MonitorReport, *,
                gone_owner: str | None = None, seen: Circumstances = Circumstances()) -> None:
    """Handle one stalled attempt (module docstring, steps 2–4): its lease expired, or, with
    ``gone_owner``, it is still held by that owner, whose process is gone
    (:func:`provably_gone`). ``seen``: this cycle's :class:`Circumstances` (:func:`excuse`)."""
    rec = settings.recovery

    def tx(s: Session) -> str | None:
        bound_idle_in_transaction(s, rec.lease_timeout_seconds)  # a hung monitor lets go of the row
        now = utcnow()
        held = (Operation.lease_owner == gone_owner) if gone_owner is not None else (Operation.lease_expires_at < now)
        op = s.scalars(select(Operation).where(Operation.id == op_id, Operation.attempt == attempt,
                                               Operation.status == Status.IN_PROGRESS.value, held)
                         # locked and re-checked: another monitor handling the same stall right
                         # now skips it (one stall event, count, notification)
                         .with_for_update(skip_locked=True)).first()
        if op is None:
            return None  # renewed, finished or recovered meanwhile (by this or another monitor)
        gone = gone_owner is not None and op.lease_expires_at is not None and op.lease_expires_at >= now
        if gone and not provably_gone(gone_owner):
            return None  # looked again under the row lock: not certain any more, the lease is waited out
        b = breakers.get_breaker(s, op.kind, op.id)
        # a holder provably gone from this host: only its runner's death excuses it (its site is
        # this host's, alive)
        excused = excuse(op, Circumstances() if gone else seen, rec)
        was_open = b is not None and b.state == BreakerState.OPEN.value
        if b is None or b.last_stall_attempt != op.attempt:
            s.add(_stall_event(op, now, gone=gone))
            if excused is None:
                b = breakers.count_stall(s, op, rec, now)
        if b is not None and b.state == BreakerState.OPEN.value:
            if not was_open:  # opened by this stall: one page; later passes only keep it held
                breakers.notify_open(s, b, op, rec, now)
            return "blocked"
        handler = RECOVERY_HANDLERS.get(OperationKind(op.kind))
        if handler is None:
            enqueue(s, level=NotificationLevel.ERROR, event="missing_recovery_handler",
                    subject=f"No recovery handler for {op.kind}: operation {op.id} stays stalled",
                    body=(f"Operation: {op.kind} {op.id}\nStatus: IN_PROGRESS, lease expired\n"
                          f"No stalled-task recovery handler is registered for kind {op.kind!r}; "
                          "this is a packhorse bug (I5). Reset it by hand: packhorse retry "
                          f"{op.kind} {op.id} --reason '...'"),
                    context={"operation_kind": op.kind, "operation_id": op.id}, operation_kind=op.kind,
                    operation_id=op.id, cooldown_seconds=rec.notification_cooldown_seconds, now=now)
            return "unhandled"
        context = {**(breakers.jsonable(breakers.breaker_row(b)) if b is not None else {}), "attempt": op.attempt,
                   "lease_owner": op.lease_owner}
        counted = (excused if excused is not None
                   else f"Stall count: {b.stall_count} of {rec.max_stall_count} before the circuit breaker opens."
                   if b is not None else "No stall is counted against the operation.")
        ended = ("ended: its process is gone from this host, so it was taken over before its lease expired"
                 if gone else "stopped renewing its lease")
        held = claim_words(op.attempt, op.retry_count, explain=False)
        body = (f"Operation: {op.kind} {op.id}\n{held[0].upper()}{held[1:]} by {op.lease_owner or '-'} {ended}"
                f" ({op.retry_count} retries counted before it).\n"
                f"{counted}\nThe operation was reset to PENDING and will be dispatched again.")
        kind, oid = op.kind, op.id
        handler(s, op, now)
        if excused is None or excused == RUNNER_GONE:
            # a database restart or a cut site: no suspect and nothing for anyone to do here (the
            # site's cut is notified once, as such)
            enqueue(s, level=NotificationLevel.WARNING, event="stalled_recovered",
                    subject=f"Stalled {kind} {oid} recovered", body=body, context=context,
                    operation_kind=kind, operation_id=oid, cooldown_seconds=rec.notification_cooldown_seconds,
                    now=now)
        else:
            log.info("stalled_operation_excused", operation_id=oid, kind=kind, why=excused)
        return "reset"

    outcome = db.transact(tx)
    if outcome == "reset":
        report.reset.append(op_id)
        log.warning("stalled_operation_reset", operation_id=op_id, attempt=attempt)
    elif outcome == "blocked":
        report.blocked.append(op_id)
    elif outcome == "unhandled":
        report.unhandled.append(op_id)
        log.error("stalled_operation_without_handler", operation_id=op_id)


def check_stalled(db: Database, settings: Settings) -> MonitorReport:
    """Run one stalled-task monitor cycle (see the module docstring).

    Returns:
        the :class:`MonitorReport`. Raises only on a database error that outlived the retries
        of its unit of work (the service loop counts it).
    """
    report = MonitorReport()
    report.let_through = db.transact(lambda s: breakers.let_trials_through(s, settings.recovery))
    now = utcnow()
    stalled = db.read(lambda s: [(r.id, r.attempt) for r in s.execute(
        select(Operation.id, Operation.attempt).where(Operation.status == Status.IN_PROGRESS.value,
                                                     Operation.lease_expires_at < now).order_by(Operation.id))])
    seen = db.read(circumstances) if stalled else Circumstances()
    for op_id, attempt in stalled:
        _handle_one(db, settings, op_id, attempt, report, seen=seen)
    for op_id, attempt, owner in _held_by_the_gone(db, now):
        _handle_one(db, settings, op_id, attempt, report, gone_owner=owner, seen=seen)
    return report


def _held_by_the_gone(db: Database, now: dt.datetime) -> list[tuple[int, int, str]]:
    """``[(operation id, attempt, lease owner)]`` of the ``IN_PROGRESS`` operations whose lease
    has not expired but whose holder is certainly gone (:func:`provably_gone`: it names this
    process namespace and one of its processes no longer runs). Only owners of this namespace
    are read (at most a few per worker of this host); none at all without one."""
    ns = process_namespace()
    if ns is None:
        return []
    rows = db.read(lambda s: s.execute(
        select(Operation.id, Operation.attempt, Operation.lease_owner).where(
            Operation.status == Status.IN_PROGRESS.value, Operation.lease_expires_at >= now,
            Operation.lease_owner.contains(f":{NAMESPACE_TAG}{ns}", autoescape=True)).order_by(Operation.id)).all())
    return [(r.id, r.attempt, r.lease_owner) for r in rows if provably_gone(r.lease_owner)]


def recovery_cycle(db: Database, settings: Settings, *, exclude: tuple[int, ...] | set[int] = (),
                   broker: BrokerWatch | None = None) -> MonitorReport:
    """One full recovery pass: the stalled-task monitor, the reconciler, then the sites' and the
    links' reachability (:func:`packhorse.recovery.site_reachability.track_sites`,
    :func:`packhorse.recovery.link_reachability.track_links`; ``packhorse monitor`` and the lease
    recovery of ``packhorse run`` both run exactly this).

    ``exclude``: operation ids queued in this process right now (not lost dispatches).
    ``broker``: the broker's view of its queues (distributed mode): work still queued there
    is not lost (:func:`packhorse.recovery.reconciler.reconcile`).
    The reconciler's re-dispatched ids are added to ``report.reset``.
    """
    report = check_stalled(db, settings)
    report.reset += reconcile(db, settings, exclude=exclude, broker=broker)
    track_sites(db, settings)  # a site cut off: one notification per cut, one when it heals
    track_links(db, settings)  # a link between sites cut: likewise
    return report
