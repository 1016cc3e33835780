"""The pipeline: *what* runs, in both modes. An executor only decides *where* it runs.

One job: decide, for the embedded runner (:mod:`packhorse.executors.local`, ``packhorse run``)
and the distributed executor (:mod:`packhorse.executors.celery_app`, ``packhorse manager`` /
``worker`` / ``monitor``) alike,

* **which managers run, in which order** (:data:`STEPS`, run by :func:`manager_cycle`): scan,
  package, bundle, transfer, unpack, archive, staging, deletion, fixity. Every operation kind
  is created by exactly one step (staging on request: ``packhorse stage``);
* **which work is runnable and in what order it is handed out** (:data:`DISPATCH_ORDER`,
  :func:`take_runnable`): due ``PENDING`` operations of a kind with a stage, downstream kinds
  first, then oldest, each taken once (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, the write
  lock on SQLite) and marked ``SCHEDULED`` in the same transaction;
* **the recovery cycle** (:func:`recover`): the stalled-task monitor, then the reconciler;
* **the partial-file sweep** (:func:`sweep_partials`): partial writes a crashed writer left on
  disk (older than a lease) and incomplete S3 multipart uploads (older than a day).

The I5 owner map (:mod:`packhorse.engine.owners`) reads :data:`DISPATCH_ORDER` and
:data:`STEPS` from here.

**Many managers at once (high availability).** Any number of processes may run
:func:`manager_cycle`, :func:`take_runnable` and :func:`recover` against one database at the
same time; together they create exactly the work one would. There is no leader: every piece of
work is created idempotently under concurrency, so a second manager's write is harmless and a
killed manager leaves nothing half-decided for the others to wait out.

* operations carry a unique ``dedup_key`` and are inserted with ``ON CONFLICT DO NOTHING``
  (:func:`packhorse.operations.lifecycle.create_operations`);
* a bundle's composition (which raw packages it carries) is decided by a compare-and-set on
  each package's ``data_transfer_package_id`` (``… WHERE data_transfer_package_id IS NULL``):
  a manager that loses the race for any package of its bundle rolls the whole bundle back;
  one manager at a time bundles a site (an advisory lock the others skip without waiting)
  (:mod:`packhorse.managers.bundles`);
* the packaging of a source location runs under that location's scan lease (the scan task, :mod:`packhorse.operations.scan_lease`),
  and package names are unique;
* dispatch takes rows with ``SKIP LOCKED`` and a claim is a compare-and-set on the fencing token
  (a duplicate message is a no-op: I3);
* the monitor's and the reconciler's resets lock the operation row (``FOR UPDATE SKIP
  LOCKED``) and re-check it, so two monitors count a stall, write its failure event and notify
  once;
* a transaction holding such a lock ends itself when idle for a lease
  (:func:`packhorse.db.session.bound_idle_in_transaction`): a manager or monitor stopped
  inside one holds the others up for at most a lease; a killed one for no time at all.

Why not a leader lease: every write of the managers would have to carry the leader's fencing
token to make a stale leader harmless, which is what the unique keys already give for free; a
leader's death would stop all work for a lease; and the database already arbitrates. See
docs/design-notes.md "One pipeline, many managers".
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import structlog
from sqlalchemy import bindparam, case, or_, select, update
from sqlalchemy.engine import Connection

from packhorse.config import Settings
from packhorse.db.models import Operation, utcnow
from packhorse.domain import LocationRole, OperationKind, Status, StorageType
from packhorse.managers import (
    archives,
    bundles,
    deletions,
    packages,
    transfers,
    unpacks,
)
from packhorse.managers import (
    fixity_checks as fixity,
)
from packhorse.managers.scan import scan_location
from packhorse.operations import lifecycle as operations
from packhorse.recovery.monitor import MonitorReport, recovery_cycle
from packhorse.recovery.reconciler import BrokerWatch
from packhorse.rules.availability import check_outages
from packhorse.rules.convergence import Plan, plan
from packhorse.rules.space import space_freed
from packhorse.runtime.context import ProcessContext

log = structlog.get_logger(__name__)

#: Dispatch order: downstream first, so buffers drain before new packages fill them. Every kind
#: with a stage, once (the I5 owner map reads this: a kind missing here is never dispatched).
DISPATCH_ORDER: tuple[OperationKind, ...] = (
    OperationKind.DELETION, OperationKind.LONG_TERM_ARCHIVE, OperationKind.UNPACK, OperationKind.TRANSFER,
    OperationKind.DATA_TRANSFER_PACKAGE, OperationKind.RAW_DATA_PACKAGE, OperationKind.STAGING,
    OperationKind.FIXITY_CHECK,
)

#: Age after which an incomplete S3 multipart upload counts as abandoned (seconds): a day, not
#: a lease, since a large upload in flight may take longer than a lease.
S3_PARTIAL_AGE_SECONDS = 86400.0


def resumable_partial_age(settings: "Settings") -> float:
    """Seconds a resumable partial (a transfer's partial file named with its fencing token, an
    incomplete S3 multipart upload) is kept since its last write, so that the retries of the
    interrupted operation can still resume it: at least :data:`S3_PARTIAL_AGE_SECONDS`, and
    more than the whole retry schedule (each retry waits for the stall to be seen, a lease plus
    a monitor interval, and at most ``retry_backoff_max_seconds``; an open circuit breaker adds
    its longest cool-down, ``circuit_breaker_timeout_seconds`` or the first cool-down if that is
    longer). docs/reliability.md "Resumable transfers"."""
    r = settings.recovery
    schedule = ((r.max_retries + 1) * (r.lease_timeout_seconds + r.monitor_interval_seconds
                                       + r.retry_backoff_max_seconds)
                + max(r.circuit_breaker_timeout_seconds, r.circuit_breaker_cooldown_seconds))
    return max(S3_PARTIAL_AGE_SECONDS, 2 * schedule)


# ------------------------------------------------------------------------------ the managers


@dataclass
class CycleResult:
    """What one :func:`manager_cycle` did.

    Attributes:
        created: operations (and packages) created, by step name.
        bundle_wait: seconds until a partial bundle is due (``None``: none waits).
        retention_wait: seconds until the next buffer copy's retention passes (``None``: none).
        repairs: the repair plan of the desired state (:func:`packhorse.rules.convergence.plan`),
            derived once at the start of the cycle and read by every manager.
    """
    created: dict[str, int] = field(default_factory=dict)
    bundle_wait: float | None = None
    retention_wait: float | None = None
    repairs: Plan = field(default_factory=Plan)

    @property
    def total(self) -> int:
        """Operations created by every step together."""
        return sum(self.created.values())


@dataclass(frozen=True)
class CycleInput:
    """What a step may need besides the process context.

    Attributes:
        unsettled: per source location name, the groups still settling (from the latest scan);
            ``None`` skips packaging this cycle (that scan failed, or — distributed — packaging
            runs with the scan on the source's site, :func:`scan_and_package`).
        flush: ship a partial bundle now (``run --until-idle`` when nothing else is pending).
        on_commit: called after each committed packaging transaction (dispatch at once).
        look_at_all_locations: look at every active location's root and marker, not only
            those with an open outage (:func:`packhorse.rules.availability.check_outages`): the
            embedded runner, which sees every site's storage. Without it (the distributed
            managers, which see no site's folders) only object stores' outages are looked at;
            a site's disk outages are its workers' to judge
            (:class:`packhorse.executors.celery_app.LocationOutageWatch`).
        started_at: when the embedded runner started (epoch seconds; ``None`` for the
            distributed managers): bad archive copies with nothing to repair them from are read
            back once per start (:func:`packhorse.managers.fixity_checks.recheck_key`).
    """
    unsettled: dict[str, set[str]] | None = None
    flush: bool = False
    on_commit: Callable[[], None] | None = None
    look_at_all_locations: bool = False
    started_at: float | None = None


def _package(ctx: ProcessContext, inp: CycleInput, out: CycleResult) -> int:
    # rebuilds of lost packages from their source files run in every mode, every cycle
    rebuilt = packages.repair(ctx, out.repairs)
    if inp.unsettled is None:
        return rebuilt
    return rebuilt + packages.manage(ctx, inp.unsettled, on_commit=inp.on_commit)


def _bundle(ctx: ProcessContext, inp: CycleInput, out: CycleResult) -> int:
    n, out.bundle_wait = bundles.manage(ctx, flush=inp.flush, repairs=out.repairs)
    return n


def _delete(ctx: ProcessContext, inp: CycleInput, out: CycleResult) -> int:
    n, out.retention_wait = deletions.manage(ctx)
    return n


@dataclass(frozen=True)
class Step:
    """One manager of the pipeline.

    Attributes:
        name: the step's name (``scan``, ``package``, …; keys of :attr:`CycleResult.created`).
        kind: the operation kind it creates (``None``: the scan registers files, no operation).
        manage: ``manage(ctx, input, result) -> created``, run every cycle by
            :func:`manager_cycle`; ``None`` for a step that does not run in the cycle: the scan
            (the executor places it: the runner's thread, or a scan task on the source's site)
            and staging (created on request by ``packhorse stage``,
            :func:`packhorse.managers.staging.request_staging`).
    """

    name: str
    kind: OperationKind | None
    manage: Callable[[ProcessContext, CycleInput, CycleResult], int] | None


#: The managers in pipeline order (upstream first); :func:`manager_cycle` runs them in it.
STEPS: tuple[Step, ...] = (
    Step("scan", None, None),
    Step("package", OperationKind.RAW_DATA_PACKAGE, _package),
    Step("bundle", OperationKind.DATA_TRANSFER_PACKAGE, _bundle),
    Step("transfer", OperationKind.TRANSFER, lambda ctx, inp, out: transfers.manage(ctx, out.repairs)),
    Step("unpack", OperationKind.UNPACK, lambda ctx, inp, out: unpacks.manage(ctx, out.repairs)),
    Step("archive", OperationKind.LONG_TERM_ARCHIVE, lambda ctx, inp, out: archives.manage(ctx, out.repairs)),
    Step("staging", OperationKind.STAGING, None),
    Step("deletion", OperationKind.DELETION, _delete),
    Step("fixity", OperationKind.FIXITY_CHECK,
         lambda ctx, inp, out: fixity.manage(ctx, out.repairs, started_at=inp.started_at)),
)


def manager_cycle(ctx: ProcessContext, inp: CycleInput = CycleInput(), *,
                  after_step: Callable[[str, int], None] | None = None) -> CycleResult:
    """Run every manager of :data:`STEPS` once, in order; both modes run exactly this.

    Args:
        ctx: the process context.
        inp: the scan's unsettled groups, the bundle flush, a commit callback (:class:`CycleInput`).
        after_step: ``after_step(name, created)`` after each step (the embedded runner
            dispatches what a step created while the later steps run).

    Returns:
        the :class:`CycleResult`.

    Raises:
        whatever a manager raises (a database error outliving its unit of work's retries): the
        service loop counts it and the next cycle starts afresh.
    """

    check_outages(ctx, every_location=inp.look_at_all_locations)  # locations back from an outage: their waiting operations are due at once
    space_freed(ctx)  # locations where deletions freed space: the operations waiting for it are due at once
    # the desired state's repairs, derived once for every manager of the cycle (one small
    # query when no copy was lost)
    out = CycleResult(repairs=ctx.db.read(lambda s: plan(s, ctx)))
    for step in STEPS:
        if step.manage is None:
            continue
        n = step.manage(ctx, inp, out)
        out.created[step.name] = n
        if step.name == "package":
            ctx.hooks.hit("manager.cycle")  # hooks: e.g. a database error in the middle of a cycle
        if after_step is not None:
            after_step(step.name, n)
    return out


def scan_and_package(ctx: ProcessContext, location: str, pool: Executor) -> dict[str, int]:
    """The scan and package steps for one source location (the distributed scan task, on the
    source's site): register its settled files, creating the packages of its settled groups as
    each chunk of them is registered (:func:`packhorse.managers.scan.scan_location`), then of
    any settled group left.

    Returns:
        ``{"registered": files registered, "packages": packages created, "skipped": files skipped}``.
    """
    created = 0

    def package_now(loc: str, groups: list[str]) -> None:  # groups the scan has just registered
        nonlocal created
        created += packages.manage(ctx, {}, locations={loc}, groups=groups)

    result = scan_location(ctx, location, pool, on_registered=package_now)
    created += packages.manage(ctx, result.unsettled_groups, locations={location})
    return {"registered": result.registered, "packages": created, "skipped": len(result.skipped)}


# ------------------------------------------------------------------------------ runnable work

_OPS = Operation.__table__
#: Runnable operations: of a kind in DISPATCH_ORDER, in ``statuses``, due, not in ``exclude``;
#: downstream kinds first, then oldest; at most ``limit``. Locked with SKIP LOCKED on
#: PostgreSQL (two dispatchers never take the same row); SQLite holds the write lock. Built
#: once (Core, bound parameters): dispatch runs inside the database's write lock.
_RUNNABLE = (select(_OPS.c.id, _OPS.c.kind, _OPS.c.attempt, _OPS.c.site_id, _OPS.c.source_location_id,
                    _OPS.c.destination_location_id, _OPS.c.physical_copy_id, _OPS.c.status, _OPS.c.stall_count)
             .where(_OPS.c.status.in_(bindparam("statuses", expanding=True)),
                    _OPS.c.kind.in_(bindparam("kinds", expanding=True)),
                    or_(_OPS.c.not_before.is_(None), _OPS.c.not_before <= bindparam("now")),
                    _OPS.c.id.not_in(bindparam("exclude", expanding=True)))
             .order_by(case({k.value: i for i, k in enumerate(DISPATCH_ORDER)}, value=_OPS.c.kind,
                            else_=len(DISPATCH_ORDER)), _OPS.c.id)
             .limit(bindparam("limit"))
             .with_for_update(skip_locked=True))


def _schedule_statements() -> dict[str, Any]:
    """``→ SCHEDULED`` by the status read: a compare-and-set on
    :func:`packhorse.operations.lifecycle.fenced` at the token and status the dispatcher read (I3). Built
    once, as the claim and completion statements are (building them took a fifth of a dispatch);
    the chaos harness's unfenced variant rebuilds them (``tests/unfenced.py``)."""
    return {st.value: update(_OPS).where(operations.fenced(bindparam("op_id"), bindparam("token"), st))
            .values(status=Status.SCHEDULED.value, scheduled_at=bindparam("now"), updated_at=bindparam("now"))
            .returning(_OPS.c.id)
            for st in (Status.PENDING, Status.SCHEDULED)}


_SCHEDULE = _schedule_statements()


def runnable_statuses(*, executor_knows_its_queue: bool) -> list[str]:
    """The statuses a dispatcher takes work from.

    ``PENDING`` always. ``SCHEDULED`` too for an executor that holds every message it ever
    dispatched in its own memory (the embedded runner, the only dispatcher of its database): a
    ``SCHEDULED`` row that is not in its queue is queued nowhere (a previous run's, or one
    handed to a pool that broke). A broker's ``SCHEDULED`` rows may still be in the broker;
    only the reconciler, after the broker's visibility timeout, calls them lost.
    """
    if executor_knows_its_queue:
        return [Status.PENDING.value, Status.SCHEDULED.value]
    return [Status.PENDING.value]


def take_runnable(conn: Connection, *, limit: int, statuses: Sequence[str], exclude: Collection[int] = (),
                  choose: Callable[[list[Any]], list[int]] | None = None) -> list[Any]:
    """Take up to ``limit`` runnable operations and mark them ``SCHEDULED`` (one transaction:
    the caller's ``conn``). Both executors dispatch what this returns; they only decide where.

    Args:
        conn: the connection of the caller's write transaction.
        limit: rows to look at.
        statuses: from :func:`runnable_statuses`.
        exclude: operation ids queued in this process right now.
        choose: given the rows looked at (in dispatch order), the ids to take (default: all) —
            the embedded runner fills its free task slots, batching deletions.

    Returns:
        the rows taken (``id, kind, attempt, site_id, source_location_id,
        destination_location_id, physical_copy_id, status, stall_count`` — ``attempt`` is the fencing token
        the operation is dispatched at, ``status`` the one it had), in dispatch order. Each is
        marked ``SCHEDULED`` by a compare-and-set on :func:`packhorse.operations.lifecycle.fenced` at the
        token and status read: a row another writer changed since is not taken.
    """
    now = utcnow()
    rows = conn.execute(_RUNNABLE, dict(now=now, statuses=list(statuses), kinds=[k.value for k in DISPATCH_ORDER],
                                        exclude=sorted(exclude), limit=limit)).all()
    ids = [r.id for r in rows] if choose is None else choose(rows)
    if not ids:
        return []
    wanted = set(ids)
    schedule = _SCHEDULE
    taken: set[int] = set()
    for r in rows:  # each a compare-and-set on the row as it was read (fenced; I3)
        if r.id in wanted and conn.execute(schedule[r.status], dict(op_id=r.id, token=r.attempt,
                                                                    now=now)).first() is not None:
            taken.add(r.id)
    return [r for r in rows if r.id in taken]


# ------------------------------------------------------------------------------ recovery


def recover(ctx: ProcessContext, *, exclude: Collection[int] = (), broker: BrokerWatch | None = None) -> MonitorReport:
    """One recovery cycle: the stalled-task monitor (circuit breakers), then the reconciler.
    ``packhorse monitor``, ``packhorse run`` and any number of them at once run exactly this.

    Args:
        exclude: operation ids queued in this process right now (not lost dispatches).
        broker: the executor's broker, asked how many messages its queues still hold
            (distributed mode; :class:`packhorse.executors.celery_app.BrokerQueues`): work
            still queued there is not lost.

    Returns:
        the :class:`~packhorse.recovery.monitor.MonitorReport` (reset ids include the
        reconciler's re-dispatches).
    """
    report = recovery_cycle(ctx.db, ctx.settings, exclude=set(exclude), broker=broker)
    if report.reset:
        log.warning("stalled_operations_reset", operation_ids=report.reset)
    return report


def sweep_partials(ctx: ProcessContext, *, sites: Collection[str] | None = None) -> int:
    """Remove what crashed writers left at the active data locations of ``sites`` (default:
    every site), except sources: partial files on disk older than a lease
    (``recovery.lease_timeout_seconds``), except those of resumable writes (transfers), and
    incomplete S3 multipart uploads, both kept for :func:`resumable_partial_age` (at least
    :data:`S3_PARTIAL_AGE_SECONDS`) so a retry can resume them; a partial a live writer holds is
    never removed. A later attempt at the same object also removes its own
    partials; this sweep finds those of objects never attempted again. Run once per process
    start (the embedded runner; each site's worker for its own site's storage), since walking an
    archive may be long.

    A location that cannot be swept (unreachable) is logged and skipped; the rest go on.

    Returns:
        how many partial writes were removed.
    """
    removed = 0
    for loc in ctx.settings.locations:
        if loc.role is LocationRole.SOURCE or not loc.active or (sites is not None and loc.site not in sites):
            continue
        resumable = resumable_partial_age(ctx.settings)
        if loc.storage is StorageType.DISK:
            age = ctx.settings.recovery.lease_timeout_seconds
        elif loc.storage in (StorageType.S3, StorageType.AZURE):
            age = resumable
        else:
            continue
        try:
            removed += ctx.backend(loc.name).cleanup_partials(age, resumable_older_than_seconds=resumable)
        except Exception as e:  # noqa: BLE001 - one unreachable location must not stop the others
            log.warning("partial_sweep_failed", location=loc.name, error=repr(e))
    return removed
