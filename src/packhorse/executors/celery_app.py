"""Distributed mode: Celery workers per site, a Redis or RabbitMQ broker.

Same pipeline as the embedded mode (:mod:`packhorse.engine.pipeline`: which managers run and in which
order, which work is runnable, the recovery cycle, the partial-file sweep); this module only
decides *where* an operation runs: a Celery queue of the operation's site. A Celery task only
calls :func:`packhorse.engine.worker.execute_task`, exactly like a worker process of the local
runner, with the same tasks (:mod:`packhorse.operations.batching`; DESIGN.md "Architecture").

**Messages.** A message carries only "run operation N at attempt ≥ A" (``[N, A]``, JSON), or
for a task of several small operations of one queue (buffer-copy deletions, archive copies of
small packages) the list of them (``[[[N, A], …]]``, task ``packhorse.run_operations``). The
ops database is the single source of truth: a message can be lost, duplicated or delivered
late without harm. A task that finds its operation done, under a lease not expired, or already
at attempt A or later returns without doing anything (the claim is a compare-and-set on the
fencing token, :func:`packhorse.operations.lifecycle.claim`). Work whose message was lost is found again
by the reconciler (``SCHEDULED`` → ``PENDING``; it asks the broker, :class:`BrokerQueues`,
so a message still waiting in its queue is never taken for lost) and the stalled-task monitor
(expired lease → ``PENDING``); :func:`dispatch_pending` then publishes a new message with a
higher A. Workers, managers and monitors outlive a broker restart (reconnecting; Celery is
pinned to a version whose worker does, ``pyproject.toml``).

**Queues** are routed per (site, data location, operation kind) and named
``<site>_<location>_<kind>``, e.g. ``cologne_cologne-lta_long_term_archive``; the location is
the one the operation writes to (its destination, or its source for a deletion), and the site
is the operation's site: transfers belong to the destination site, whose workers pull the
bundle. The scan of a source location is the task ``packhorse.scan`` on the queue
``<site>_<location>_scan`` of the source's site. ``packhorse worker --site NAME`` consumes
exactly its site's queues (:func:`site_queues`), so a worker only writes to its own site's
storage.

**Celery settings** (:func:`make_app`): ``task_acks_late`` and ``task_reject_on_worker_lost``
(a message is acknowledged only after its task returned; a worker that dies gives it back),
``worker_prefetch_multiplier = 1`` (a worker holds no message it is not running), JSON only,
no result backend, the broker's ``visibility_timeout`` from ``[executor]
visibility_timeout_seconds`` (Redis; the reconciler floor is never below it).

**Processes.** Each prefork pool child builds its own :class:`~packhorse.runtime.context.ProcessContext`
and database engine on first use (:func:`process_context`); nothing database-related crosses
a fork.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import structlog
from celery import Celery
from celery.bin.celery import celery as celery_cli
from kombu import Exchange, Queue
from sqlalchemy import update
from sqlalchemy.orm import Session

from packhorse import logs
from packhorse.config import Settings
from packhorse.db.models import Operation, utcnow
from packhorse.db.session import Database, retry_while
from packhorse.domain import LocationRole, OperationKind, Status, StorageType
from packhorse.engine import pipeline
from packhorse.engine.worker import execute_task
from packhorse.errors import ConfigError, TransientDatabaseError
from packhorse.executors.poison_messages import CONSUMER, REDIS_TRANSPORT
from packhorse.operations.batching import group_tasks, in_flight, small_operations
from packhorse.operations.identity import CELERY_OWNER_TAG, worker_identity
from packhorse.operations.lifecycle import fenced
from packhorse.operations.scan_lease import not_due, scan_lease
from packhorse.recovery.health import HeartbeatThread
from packhorse.recovery.loop import ErrorCounter
from packhorse.rules.availability import check_outages
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.hooks import hooks_for
from packhorse.runtime.settings import RuntimeSettings
from packhorse.runtime.topology import load_topology
from packhorse.stages import STAGES

log = structlog.get_logger(__name__)

#: The queue suffix and task of the scan of a source location (not an operation kind: a scan
#: registers files, it owns no operation row).
SCAN = "scan"
RUN_OPERATION_TASK = "packhorse.run_operation"
#: The task of several small operations of one queue run together (:mod:`packhorse.operations.batching`).
RUN_OPERATIONS_TASK = "packhorse.run_operations"
SCAN_TASK = "packhorse.scan"
#: Operation kinds a Celery worker can run (every kind with a stage).
RUNNABLE_KINDS: tuple[OperationKind, ...] = tuple(k for k in OperationKind if k in STAGES)
#: The one direct exchange every queue is bound to (routing key = queue name).
EXCHANGE = Exchange("packhorse", type="direct", durable=True)
#: Operations one dispatch cycle claims at most (one ``FOR UPDATE SKIP LOCKED`` batch).
DISPATCH_BATCH = 200
#: A broker's ``SCHEDULED`` operations may still be in the broker: only ``PENDING`` is taken
#: (:func:`packhorse.engine.pipeline.runnable_statuses`); lost messages are the reconciler's.
_STATUSES = pipeline.runnable_statuses(executor_knows_its_queue=False)


def queue_name(site: str, location: str, kind: OperationKind | str) -> str:
    """``<site>_<location>_<kind>``, e.g. ``cologne_cologne-lta_long_term_archive``."""
    k = kind.value if isinstance(kind, OperationKind) else kind
    return f"{site}_{location}_{k}"


def kinds_for(role: LocationRole) -> list[str]:
    """The work a location of ``role`` can receive: every runnable kind, plus ``scan`` for a source."""
    kinds = [k.value for k in RUNNABLE_KINDS]
    return kinds + [SCAN] if role is LocationRole.SOURCE else kinds


def site_queues(settings: Settings, site: str, kinds: Sequence[str] | None = None) -> list[str]:
    """Every queue a worker of ``site`` consumes (optionally only for ``kinds``).

    Raises:
        ConfigError: ``site`` is not configured, or a kind is unknown.
    """
    if site not in {s.name for s in settings.sites}:
        raise ConfigError(f"--site: unknown site {site!r} (one of {', '.join(s.name for s in settings.sites)})")
    known = {k.value for k in RUNNABLE_KINDS} | {SCAN}
    for k in kinds or ():
        if k not in known:
            raise ConfigError(f"--kinds: unknown kind {k!r} (one of {', '.join(sorted(known))})")
    out = []
    for loc in settings.locations:
        if loc.site != site or not loc.active:
            continue
        for k in kinds_for(loc.role):
            if kinds is None or k in kinds:
                out.append(queue_name(site, loc.name, k))
    return out


def all_queues(settings: Settings) -> list[str]:
    """Every queue of every site (the manager declares them before publishing)."""
    return [q for s in settings.sites for q in site_queues(settings, s.name)]


def operation_queue(ctx: ProcessContext, site_id: int, source_location_id: int | None,
                    destination_location_id: int | None, kind: str) -> str:
    """The queue of one operation: its site, the location it writes to, its kind."""
    loc_id = destination_location_id if destination_location_id is not None else source_location_id
    return queue_name(ctx.topology.site_name(site_id), ctx.location_name(loc_id), kind)


# ------------------------------------------------------------------------------ the app


def transport_options(visibility_timeout: float) -> dict[str, Any]:
    """Broker transport options: the visibility timeout (s), and for Redis a sweep for unacked
    messages often enough to honour it (kombu sweeps every 10 × 10 s by default; with a short
    timeout it sweeps every ``timeout / 2`` s, at least every second)."""
    opts: dict[str, Any] = {"visibility_timeout": visibility_timeout}
    if visibility_timeout < 100:
        opts.update(unacked_restore_interval=max(1, int(visibility_timeout / 2)), unacked_restore_throttle=1)
    return opts



def make_app(settings: Settings) -> Celery:
    """The Celery app of ``settings`` (broker, queues, reliability settings, tasks).

    Raises:
        ConfigError: ``executor.kind`` is not ``"celery"`` or ``executor.broker_url`` is missing.
    """
    ex = settings.executor
    if ex.kind != "celery":
        raise ConfigError(f"executor.kind: is {ex.kind!r}; the distributed services need \"celery\"")
    if not ex.broker_url:
        raise ConfigError("executor.broker_url: required with executor.kind = \"celery\" "
                          "(e.g. redis://host:6379/0 or amqp://user:password@host:5672/vhost)")
    app = Celery("packhorse", broker=ex.broker_url, set_as_current=False)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        result_backend=None,
        broker_transport_options=transport_options(ex.visibility_timeout_seconds),
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        task_queues=[Queue(q, EXCHANGE, routing_key=q) for q in all_queues(settings)],
        task_default_exchange=EXCHANGE.name,
        task_default_exchange_type=EXCHANGE.type,
        # nothing is published without an explicit queue; a stray message would wait here
        task_default_queue="packhorse_unrouted",
        task_create_missing_queues=True,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        task_send_sent_event=False,
        worker_cancel_long_running_tasks_on_connection_loss=False,
        enable_utc=True,
        # a message a worker cannot read is dropped and counted, never fatal (poison_messages)
        worker_consumer=CONSUMER,
        **({"broker_transport": REDIS_TRANSPORT} if ex.broker_url.startswith("redis://") else {}),
    )
    app.packhorse_hooks = hooks_for(settings)  # type: ignore[attr-defined]
    _SETTINGS[id(app)] = settings
    app.task(name=RUN_OPERATION_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)(run_operation_task)
    app.task(name=RUN_OPERATIONS_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)(run_operations_task)
    app.task(name=SCAN_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)(scan_task)
    return app


# settings of each app in this process (tasks find theirs through ``self.app``)
_SETTINGS: dict[int, Settings] = {}
_CONTEXTS: dict[tuple[int, int], ProcessContext] = {}
_CTX_LOCK = threading.Lock()


def process_context(settings: Settings) -> ProcessContext:
    """The process context of this process: database engine and backends built here, after any fork."""
    key = (os.getpid(), id(settings))
    with _CTX_LOCK:
        ctx = _CONTEXTS.get(key)
        if ctx is None:
            db = Database.from_settings(settings)
            ctx = _CONTEXTS[key] = ProcessContext(settings=settings, db=db, topology=load_topology(db, settings))
        return ctx


def _owner(task_id: str | None) -> str:
    """The lease owner of this pool child for task ``task_id`` (:func:`~packhorse.operations.identity.worker_identity`)."""
    return worker_identity(f"{CELERY_OWNER_TAG}{(task_id or '-')[:8]}")


def _retry_later(task: Any, exc: BaseException) -> Any:
    """Give the message back to the broker for later: the database was unreachable (not the
    operation's failure; DESIGN.md "Architecture")."""
    delay = min(30.0, 2.0 * (2 ** min(task.request.retries, 4)))
    log.warning("task_database_unavailable", task=task.name, retry_in_seconds=delay, error=str(exc))
    return task.retry(exc=exc, countdown=delay, max_retries=None)


def run_operation_task(self: Any, operation_id: int, min_attempt: int) -> str:
    """Celery task: run operation ``operation_id`` at attempt ≥ ``min_attempt``; returns the outcome."""
    return run_operations_task(self, [[operation_id, min_attempt]])[0]


def run_operations_task(self: Any, operations: list[list[int]]) -> list[str]:
    """Celery task: run ``[[operation id, min attempt], …]`` together, a task of
    :mod:`packhorse.operations.batching` (small operations of one queue; :func:`packhorse.engine.worker.execute_task`,
    as the embedded runner runs its pool's tasks); returns each one's outcome, in order.

    A message for attempt ≥ ``A`` was dispatched at fencing token ``A − 1``: each claim is a
    compare-and-set on it (I3), so a late or duplicated message changes nothing. The database
    unreachable while claiming gives the whole message back to the broker for later (nothing
    was claimed)."""
    ctx = process_context(_SETTINGS[id(self.app)])
    wanted = [(int(op_id), int(min_attempt) - 1) for op_id, min_attempt in operations]
    try:
        outcomes = execute_task(ctx, wanted, _owner(self.request.id))  # type: ignore[arg-type]
    except TransientDatabaseError as exc:
        raise _retry_later(self, exc) from exc
    for (op_id, token), outcome in zip(wanted, outcomes):
        if outcome.value == "skipped":
            with contextlib.suppress(Exception):
                log.info("task_skipped", operation_id=op_id, min_attempt=token + 1,
                         reason=skip_reason(ctx.db, op_id, token + 1))
    return [o.value for o in outcomes]


def skip_reason(db: Database, operation_id: int, min_attempt: int) -> str:
    """Why a message for operation ``operation_id`` at attempt ≥ ``min_attempt`` did nothing."""
    op = db.read(lambda s: s.get(Operation, operation_id))
    now = utcnow()
    if op is None:
        return "no such operation"
    if op.status in (Status.COMPLETED.value, Status.FAILED.value):
        return f"done ({op.status})"
    if op.status == Status.IN_PROGRESS.value and op.lease_expires_at is not None and op.lease_expires_at > now:
        return f"leased by {op.lease_owner} until {op.lease_expires_at.isoformat()} (attempt {op.attempt})"
    if op.attempt >= min_attempt:
        return f"at a newer attempt ({op.attempt}, status {op.status})"
    if op.not_before is not None and op.not_before > now:
        return f"not due before {op.not_before.isoformat()}"
    return f"not runnable (status {op.status}, attempt {op.attempt})"


def scan_location_and_package(ctx: ProcessContext, location: str) -> dict[str, int]:
    """The scan and package steps of the pipeline for one source location, on its own site
    (:func:`packhorse.engine.pipeline.scan_and_package`, on a thread pool for hashing).

    Returns:
        ``{"registered": files registered, "packages": packages created, "skipped": files skipped}``.
    """
    with ThreadPoolExecutor(max(2, min(8, os.cpu_count() or 2)), thread_name_prefix="scan") as pool:
        return pipeline.scan_and_package(ctx, location, pool)


def scan_expired(expires_at: str | None, now: dt.datetime) -> bool:
    """A scan request stamped ``expires_at`` (ISO 8601, UTC, by the database's clock; ``None``:
    never) is stale at ``now`` (the database's clock, as this process sees it: ``utcnow``).

    Both times are the database's: a worker whose host clock runs ahead of the manager's judges
    the request as the manager meant it. Celery's own ``expires`` is not used for this: it is
    stamped with the sender's host clock and compared with the receiver's, so a worker whose
    clock runs ahead by more than the expiry drops every scan request (nothing is ever scanned
    at its site)."""
    if expires_at is None:
        return False
    when = dt.datetime.fromisoformat(expires_at)
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return now > when


def scan_task(self: Any, location: str, expires_at: str | None = None, rest_seconds: float = 0.0) -> dict[str, int]:
    """Celery task: scan source location ``location`` and package what settled, under the
    location's scan lease (:mod:`packhorse.operations.scan_lease`: at most one scan of a
    location at a time; a holder that stops renewing for ``[recovery] lease_timeout_seconds``
    loses it to the next worker's scan). A scan whose lease another holder keeps is skipped
    (INFO ``scan_skipped_already_running``), and so is one while the last completed scan rests
    (at least ``rest_seconds``, the sender's poll interval: every manager sends one each poll;
    DEBUG ``scan_skipped_resting``), and one received after ``expires_at`` (ISO 8601 UTC, the
    database's clock: :func:`dispatch_scans`; INFO ``scan_skipped_expired``). While the lease
    holds, a unit of work that meets an unreachable database keeps trying
    (:func:`packhorse.db.session.retry_while`); once it is lost, the task is given back to the
    broker for later."""
    ctx = process_context(_SETTINGS[id(self.app)])
    rec = ctx.settings.recovery
    if scan_expired(expires_at, utcnow()):
        log.info("scan_skipped_expired", location=location, expires_at=expires_at)
        return {"registered": 0, "packages": 0, "skipped": 0}
    try:
        with scan_lease(ctx.db, location, _owner(self.request.id), lease_seconds=rec.lease_timeout_seconds,
                        heartbeat_seconds=rec.heartbeat_interval_seconds, min_rest_seconds=rest_seconds) as held:
            if held is None:
                return {"registered": 0, "packages": 0, "skipped": 0}
            ctx.hooks.hit("scan.started")  # tests: a holder paused or hung with the lease held
            # a database out of reach (a site cut off from the centre) is waited out while the
            # lease holds, as an operation's holder does; after that the scan is sent again
            with retry_while(lambda: not held.lost.is_set()):
                return scan_location_and_package(ctx, location)
    except TransientDatabaseError as exc:
        raise _retry_later(self, exc) from exc


# ------------------------------------------------------------------------------ dispatch


@dataclass(frozen=True)
class Dispatched:
    """One message published: operation ``operation_id`` at attempt ≥ ``min_attempt`` to ``queue``."""
    operation_id: int
    min_attempt: int
    queue: str


def dispatch_pending(ctx: ProcessContext, app: Celery, *, batch: int = DISPATCH_BATCH) -> list[Dispatched]:
    """Publish every due ``PENDING`` operation (up to ``batch``): ``PENDING`` → ``SCHEDULED``.

    The rows are the pipeline's runnable work (:func:`packhorse.engine.pipeline.take_runnable`, in
    its dispatch order; ``SELECT … FOR UPDATE SKIP LOCKED`` on PostgreSQL, so any number of
    managers never pick the same operation); the status change commits *before* publishing.
    They go in tasks as the embedded runner's do (:func:`packhorse.operations.batching.group_tasks`, each
    task's operations of one queue; a queue's builds and archive copies of small packages spread over
    ``executor.workers`` messages first, the worker processes of a site by default, less those its
    operations already queued or running keep busy: :func:`packhorse.operations.batching.in_flight`): a task of one operation is one ``run_operation``
    message, a batch of small ones one ``run_operations`` message. A publish that fails
    (broker down) hands its operations back to ``PENDING`` (each fenced on ``SCHEDULED`` and its
    attempt), so the next cycle tries again; if even that write fails, the reconciler finds the
    ``SCHEDULED`` rows after its floor.

    Returns:
        the operations published, one :class:`Dispatched` each.
    """
    def queue_of(r: Any) -> str:
        return operation_queue(ctx, r.site_id, r.source_location_id, r.destination_location_id, r.kind)

    def pick(s: Session) -> tuple[list[Any], list[list[int]]]:
        tasks: list[list[int]] = []

        def choose(rows: list[Any]) -> list[int]:
            small = small_operations(s, rows)
            tasks[:] = group_tasks(rows, small, key=queue_of, spread=ctx.settings.executor.workers,
                                   busy=in_flight(s, queue_of) if small else None)
            return [i for task in tasks for i in task]

        return pipeline.take_runnable(s.connection(), limit=batch, statuses=_STATUSES, choose=choose), tasks

    rows, tasks = ctx.db.transact(pick)
    by_id = {r.id: r for r in rows}
    out: list[Dispatched] = []
    messages = 0
    for task in tasks:
        taken = [by_id[i] for i in task if i in by_id]
        if not taken:
            continue
        ds = [Dispatched(r.id, r.attempt + 1, queue_of(r)) for r in taken]
        try:
            publish(app, ds)
        except Exception as exc:
            log.error("dispatch_publish_failed", operation_ids=[d.operation_id for d in ds], queue=ds[0].queue,
                      error=repr(exc))
            for r in taken:
                _unschedule(ctx.db, r.id, r.attempt)
            continue
        out.extend(ds)
        messages += 1
    if out:
        log.info("operations_dispatched", operations=len(out), messages=messages,
                 kinds=dict(Counter(by_id[d.operation_id].kind for d in out)))
    return out


def publish(app: Celery, task: Dispatched | Sequence[Dispatched]) -> None:
    """Send one task to its queue: "run operation N at attempt ≥ A" (``run_operation``, JSON
    ``[N, A]``), or for several operations of one queue "run each of them at its attempt"
    (``run_operations``, JSON ``[[[N, A], …]]``).

    Raises:
        ValueError: the operations of ``task`` are not of one queue.
    """
    ds = [task] if isinstance(task, Dispatched) else list(task)
    queue = ds[0].queue
    if any(d.queue != queue for d in ds):
        raise ValueError(f"one message goes to one queue: {sorted({d.queue for d in ds})}")
    if len(ds) == 1:
        name, args = RUN_OPERATION_TASK, [ds[0].operation_id, ds[0].min_attempt]
    else:
        name, args = RUN_OPERATIONS_TASK, [[[d.operation_id, d.min_attempt] for d in ds]]
    app.send_task(name, args=args, queue=queue, routing_key=queue,
                  retry=True, retry_policy={"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5})


def _unschedule(db: Database, operation_id: int, attempt: int) -> None:
    def tx(s: Session) -> None:
        s.execute(update(Operation).where(fenced(operation_id, attempt, Status.SCHEDULED))
                  .values(status=Status.PENDING.value, updated_at=utcnow()))

    with contextlib.suppress(Exception):
        db.transact(tx)


def dispatch_scans(ctx: ProcessContext, app: Celery, poll_seconds: float | None = None) -> list[str]:
    """Publish one scan of every active source disk location to its site's scan queue.

    A scan request expires after three poll intervals (``poll_seconds``, the one in force;
    default ``managers.poll_interval_seconds``; at least a minute), by the database's clock
    (:func:`scan_expired`): while a site's workers are down, the requests that wait for them
    are skipped once they are back, not run as a backlog of useless scans (the next one sent
    does the work). The expiry is not Celery's ``expires``, which the receiving worker judges
    by its own host clock: a site whose clock runs ahead would drop every request. The request
    carries the poll interval too: a scan completed less than that ago (or than three times
    its own duration) rests, so N managers cause one scan per interval, not N
    (:func:`packhorse.operations.scan_lease.acquire`).

    Only requests a worker would act on are sent: none to a location whose scan runs (its
    lease is live) or rests (:func:`packhorse.operations.scan_lease.not_due`, read from the
    database; the worker decides again when the request arrives), and none to one whose scan
    queue still holds a request (:func:`queue_depths`; a broker that cannot say: one is sent).
    Every request a site's worker takes costs one of its pool processes the broker's round
    trips (fetch, acknowledgement), a good part of a second across a long link: on the test bed
    with the database and broker 100 ms away, two managers polling every 0.5 s kept fyst's two
    processes taking and skipping requests between their packaging operations (926 requests
    in a run of 200 s, 887 of them expired, docs/benchmarks.md). Two managers may each send
    one at once; never more pile up.
    """
    sent = []
    poll = ctx.settings.managers.poll_interval_seconds if poll_seconds is None else poll_seconds
    expires_at = (utcnow() + dt.timedelta(seconds=max(60.0, 3 * poll))).isoformat()
    wanted = {queue_name(loc.site, loc.name, SCAN): loc for loc in ctx.settings.locations
              if loc.role is LocationRole.SOURCE and loc.active and loc.storage is StorageType.DISK}
    skip = ctx.db.read(lambda s: not_due(s, [loc.name for loc in wanted.values()], min_rest_seconds=poll))
    wanted = {q: loc for q, loc in wanted.items() if loc.name not in skip}
    try:
        waiting = queue_depths(app, list(wanted))
    except Exception as exc:  # noqa: BLE001 - the broker could not say: send, as before
        log.debug("scan_queue_depth_unknown", error=str(exc))
        waiting = {}
    for q, loc in wanted.items():
        if waiting.get(q, 0):
            continue
        app.send_task(SCAN_TASK, args=[loc.name, expires_at, poll], queue=q, routing_key=q,
                      retry=True, retry_policy={"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5})
        sent.append(q)
    return sent


def declare_queues(app: Celery, queues: Sequence[str]) -> None:
    """Declare ``queues`` on the broker (RabbitMQ drops a message published to no queue)."""
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=3)
        channel = conn.default_channel
        for q in queues:
            app.amqp.queues[q](channel).declare()


class BrokerQueues:
    """The broker's own view of its queues for the reconciler
    (:class:`packhorse.recovery.reconciler.BrokerView`): how many messages wait in each
    operation queue right now, by a passive queue declaration (AMQP ``queue.declare`` with
    ``passive``; on Redis the length of the queue's lists). A queue the broker does not know
    holds nothing (a restarted Redis, a reset RabbitMQ node).

    One short-lived connection per call, with ``timeout_seconds`` (s) for connecting and for
    every broker call, so a broker that is down or hangs costs the monitor's cycle at most
    that, never the cycle itself: :meth:`depths` then raises and the reconciler treats every
    queue as unknown (not lost).

    Args:
        ctx: the process context (topology: site and location names of the queues).
        app: the Celery app (:func:`make_app`).
        timeout_seconds: connect and socket timeout (s).
    """
    def __init__(self, ctx: ProcessContext, app: Celery, *, timeout_seconds: float = 5.0) -> None:
        self.ctx = ctx
        self.app = app
        self.timeout = timeout_seconds
        #: Redis: the depths count the messages workers took and did not acknowledge too
        #: (:func:`queue_depths`; :attr:`packhorse.recovery.reconciler.BrokerView.counts_delivered`)
        self.counts_delivered = _is_redis(app)

    def queue(self, key: tuple[int, int, str]) -> str:
        """The queue name of ``(site id, location id, operation kind)``."""
        site_id, loc, kind = key
        return operation_queue(self.ctx, site_id, None, loc, kind)

    def depths(self, keys: Collection[tuple[int, int, str]]) -> dict[tuple[int, int, str], int | None]:
        """Messages waiting in the queue of each key (see the class docstring).

        Raises:
            any of the broker client's connection errors (the broker is unreachable).
        """
        out: dict[tuple[int, int, str], int | None] = {}
        names: dict[tuple[int, int, str], str] = {}
        for key in keys:
            try:
                names[key] = self.queue(key)
            except Exception:  # noqa: BLE001 - a location no longer configured: unknown
                out[key] = None
        waiting = queue_depths(self.app, set(names.values()), timeout_seconds=self.timeout)
        out.update((key, waiting[name]) for key, name in names.items())
        return out


def _is_redis(app: Celery) -> bool:
    """Whether ``app``'s broker is Redis (``redis://``, ``rediss://``, ``redis+socket://``)."""
    return str(app.conf.broker_url or "").split("://", 1)[0].split("+", 1)[0] in ("redis", "rediss")


def queue_depths(app: Celery, queues: Collection[str], *, timeout_seconds: float = 5.0) -> dict[str, int]:
    """How many messages each of ``queues`` holds now: waiting ones, by a passive queue
    declaration (AMQP ``queue.declare`` with ``passive``; on Redis the length of the queue's
    lists), and on Redis also those a worker has taken and not acknowledged (kombu's
    ``unacked`` hash, by routing key): Redis gives back nothing else, so a message in neither is
    gone for good. On RabbitMQ those a worker holds are not counted (the broker requeues them
    itself if the worker goes). One short-lived connection with ``timeout_seconds`` (s) for
    connecting and for every broker call. A queue the broker does not know holds 0.

    Raises:
        any of the broker client's connection errors (the broker is unreachable).
    """
    from kombu.exceptions import ChannelError

    t = timeout_seconds
    out: dict[str, int] = {}
    if not queues:
        return out
    with app.connection_for_read(connect_timeout=t, transport_options={
            "socket_timeout": t, "socket_connect_timeout": t}) as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=t)
        for name in queues:
            channel = conn.channel()
            try:
                out[name] = int(channel.queue_declare(queue=name, passive=True).message_count)
            except (ChannelError, *conn.channel_errors):
                out[name] = 0  # no such queue: it holds nothing
            finally:
                with contextlib.suppress(Exception):
                    channel.close()
        if _is_redis(app):
            channel = conn.channel()
            try:
                for raw in channel.client.hvals(channel.unacked_key):
                    try:
                        routing_key = json.loads(raw)[2]
                    except (ValueError, TypeError, IndexError):
                        continue  # not a message of kombu's: not ours to count
                    if routing_key in out:
                        out[routing_key] += 1
            finally:
                with contextlib.suppress(Exception):
                    channel.close()
    return out


# ------------------------------------------------------------------------------ services


class Manager:
    """``packhorse manager``: the managers of every stage and the dispatcher, in a loop.

    Every ``managers.poll_interval_seconds`` (the runtime setting when one is set, re-read every
    ``managers.runtime_settings_refresh_seconds``): publish a scan of each source location to its
    site (the scan and package steps run there, :func:`scan_location_and_package`), run the
    pipeline's other managers (:func:`packhorse.engine.pipeline.manager_cycle`), publish every due
    ``PENDING`` operation (dispatch runs at least every second). Any number of managers may run
    against one database at once (high availability; :mod:`packhorse.engine.pipeline`): together they
    create and publish what one would. A failed cycle (database or broker unreachable) is
    logged and counted (:class:`~packhorse.recovery.loop.ErrorCounter`: CRITICAL log and
    notification after ``managers.max_consecutive_errors`` in a row) and the next cycle starts
    afresh: the manager never needs a restart. It records its health as service kind
    ``manager``.

    Args:
        settings: a configuration with ``executor.kind = "celery"``.
        app: the Celery app (default: :func:`make_app`).
    """
    def __init__(self, settings: Settings, app: Celery | None = None, *, instance: str | None = None) -> None:
        self.settings = settings
        #: the instance name of this manager among several on one host (its health identity)
        self.instance = instance
        self.app = app or make_app(settings)
        self.stop = threading.Event()
        self.cycles = 0
        self.dispatched = 0

    def cycle(self, *, scan: bool, poll_seconds: float | None = None) -> int:
        """One cycle; returns how many operations it dispatched. ``poll_seconds``: the poll
        interval in force (the runtime setting when one is set), for the scans' expiry."""
        ctx = process_context(self.settings)
        if scan:
            dispatch_scans(ctx, self.app, poll_seconds)
        # packaging runs with the scan on the source's site: no unsettled groups here
        pipeline.manager_cycle(ctx, pipeline.CycleInput(unsettled=None, flush=False))
        return len(dispatch_pending(ctx, self.app))

    def run(self, *, max_seconds: float | None = None) -> None:
        """Loop until :attr:`stop` is set (or ``max_seconds`` passed)."""
        ctx = process_context(self.settings)
        errors = ErrorCounter(ctx.db, "manager", max_consecutive_errors=self.settings.managers.max_consecutive_errors,
                              notification_cooldown_seconds=self.settings.recovery.notification_cooldown_seconds,
                              retry_seconds=1.0)
        rec = self.settings.recovery
        health = HeartbeatThread(ctx.db, "manager", instance=self.instance,
                                 interval_seconds=rec.service_heartbeat_interval_seconds,
                                 forget_after_seconds=rec.service_forget_after_seconds).start()
        runtime = RuntimeSettings(ctx.db, self.settings)  # `packhorse config set` reaches a running manager
        poll = self.settings.managers.poll_interval_seconds
        started = time.monotonic()
        last_scan = float("-inf")
        declared = False
        log.info("manager_started", instance=self.instance, poll_interval_seconds=poll,
                 queues=len(all_queues(self.settings)))
        try:
            while not self.stop.is_set():
                t0 = time.monotonic()
                if max_seconds is not None and t0 - started > max_seconds:
                    break
                self.cycles += 1
                runtime.refresh()  # rate-limited: re-reads every managers.runtime_settings_refresh_seconds
                poll = runtime.poll_interval_seconds
                try:
                    if not declared:
                        declare_queues(self.app, all_queues(self.settings))
                        declared = True
                    scan = t0 - last_scan >= poll
                    self.dispatched += self.cycle(scan=scan, poll_seconds=poll)
                    if scan:
                        last_scan = t0
                    errors.succeeded()
                except Exception as exc:  # a failed cycle is never fatal
                    errors.failed(exc)
                    # the broker may have restarted (a reset node forgets its queues): declare
                    # them again before the next publish
                    declared = False
                # dispatch at least every second: finished work makes new work between polls
                self.stop.wait(max(0.05, min(poll, 1.0) - (time.monotonic() - t0)))
        finally:
            health.stop(remove=True)


class LocationOutageWatch:
    """The site worker's look at the open outages of its own site's data locations (a thread of
    ``packhorse worker``'s main process; not a site outage, a site cut off from the centre, which
    :mod:`packhorse.recovery.site_reachability` judges): every ``managers.poll_interval_seconds``
    (seconds) it runs :func:`packhorse.rules.availability.check_outages` for the locations of
    ``site`` — a data location of the site that is back has its outage ended and its waiting
    operations made due at once, one still away has its outage's ``checked_at`` and reason
    refreshed. Only the site's own hosts see its folders; the managers judge no site's disk
    (DESIGN.md "Across sites"). Several workers of a site may all look: the outage ends once. A
    look that fails (the database away) is logged (INFO ``location_outage_check_failed``) and
    made again at the next interval; it never stops the worker."""

    def __init__(self, settings: Settings, site: str, *, interval_seconds: float | None = None) -> None:
        self.settings = settings
        self.site = site
        self.interval_seconds = interval_seconds or settings.managers.poll_interval_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ctx: ProcessContext | None = None

    def look_once(self) -> list[str]:
        """Look at the open outages of the site's data locations now; returns the locations
        whose outage ended.

        The watch has a process context of its own (its own database engine), never the shared
        one of :func:`process_context`: the prefork pool forks its children while this thread
        runs, and a child forked while the thread held that function's lock (building the
        context: connecting, loading the topology) would wait for it forever."""
        if self._ctx is None:
            db = Database.from_settings(self.settings)
            self._ctx = ProcessContext(settings=self.settings, db=db, topology=load_topology(db, self.settings))
        return check_outages(self._ctx, sites={self.site})

    def _run(self) -> None:
        while not self._stop.wait(self.interval_seconds):
            try:
                self.look_once()
            except Exception as e:  # noqa: BLE001 - the next look tries again
                log.info("location_outage_check_failed", site=self.site, error=repr(e))

    def start(self) -> "LocationOutageWatch":
        """Start the thread (a daemon); returns ``self``."""
        self._thread = threading.Thread(target=self._run, name=f"outage-watch-{self.site}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (waits up to 5 s for a look under way)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._ctx is not None and (self._thread is None or not self._thread.is_alive()):
            self._ctx.db.dispose()


def cleanup_site_partials(settings: Settings, site: str) -> int:
    """The pipeline's partial-file sweep (:func:`packhorse.engine.pipeline.sweep_partials`) of
    ``site``'s data locations (disk partials older than a lease, S3 multipart uploads older
    than a day), run when a worker of the site starts: the site's storage is reachable from
    its workers. Returns how many partial writes were removed."""
    db = Database.from_settings(settings)
    try:
        ctx = ProcessContext(settings=settings, db=db, topology=load_topology(db, settings))
        return pipeline.sweep_partials(ctx, sites={site})
    finally:
        db.dispose()


def celery_main(app: Celery, argv: list[str]) -> int:
    """Run the ``celery`` command line ``argv`` (e.g. ``["worker", …]``) with ``app``; returns
    its exit code. ``app.worker_main`` and ``app.start`` return nothing: click hands them the
    exit code of a worker stopped by "Unrecoverable error" (1) as a return value they drop, so
    the process would exit 0 and a ``Restart=on-failure`` unit would leave it dead."""
    celery_cli.params[0].default = app
    try:
        code = celery_cli.main(args=argv, standalone_mode=False)
    finally:
        celery_cli.params[0].default = None
    return code if isinstance(code, int) else 0


def run_worker(settings: Settings, site: str, *, kinds: Sequence[str] | None = None, concurrency: int | None = None,
               loglevel: str = "INFO", pool: str = "prefork", instance: str | None = None) -> int:
    """Start a Celery worker of ``site`` in this process (blocks until it is stopped); returns
    its exit code: 0 after a stop that was asked for (SIGTERM, SIGINT), non-zero when the
    worker had to stop (Celery's "Unrecoverable error"), so a service manager restarts it
    (``packhorse worker`` exits with it; docs/deployment.md). A message it cannot read never
    stops it (:mod:`packhorse.executors.poison_messages`).

    It consumes exactly :func:`site_queues` of ``site``; ``concurrency`` pool processes
    (default ``executor.workers``), each with its own database engine. Its health identity is
    ``worker:SITE[:INSTANCE]@host`` (:func:`packhorse.recovery.health.service_identity`).

    Raises:
        ConfigError: wrong site, kind or executor settings, or a bad ``instance`` name.
    """
    queues = site_queues(settings, site, kinds)
    if not queues:
        raise ConfigError(f"--site {site}: no queues to consume (no active location at this site for these kinds)")

    logs.configure(loglevel)
    app = make_app(settings)
    try:
        cleanup_site_partials(settings, site)
    except Exception as e:  # noqa: BLE001 - a sweep that cannot run must not keep the worker from starting
        log.warning("partial_sweep_failed", site=site, error=repr(e))
    n = concurrency or settings.executor.workers
    # the worker's main process records its health: service kind "worker" of its site (one row
    # per site, host and instance, taken over by a restarted worker)
    db = Database.from_settings(settings)
    rec = settings.recovery
    health = HeartbeatThread(db, "worker", site=site, instance=instance,
                             interval_seconds=rec.service_heartbeat_interval_seconds,
                             forget_after_seconds=rec.service_forget_after_seconds).start()
    outages = LocationOutageWatch(settings, site).start()
    try:
        code = celery_main(app, [
            "worker", "--queues", ",".join(queues), "--concurrency", str(n), "--pool", pool,
            "--hostname", f"packhorse-{site}-{os.getpid()}@{socket.gethostname()}", "--loglevel", loglevel,
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ])
    finally:
        outages.stop()
        health.stop(remove=True)
    if code:
        log.critical("worker_stopped_on_error", site=site, exit_code=code)
    return int(code or 0)
