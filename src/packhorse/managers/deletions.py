"""Deletion manager: create ``deletion`` operations for copies that may go (rules in :mod:`.policy`).

Per buffer location, the candidates are the present copies without a deletion operation yet;
one is taken only if :func:`~.policy.deletion_blockers` lets it go (the safety rules, the same
at every disk level; asked only of copies about to be taken). Disk pressure — the level of the location's latest disk usage sample
(:mod:`packhorse.rules.disk_usage`; a sample older than ``stale_after_seconds`` counts as normal) —
changes only which of them go and in what order:

* **normal / warning**: copies whose package is archived (every required archive holds a
  verified copy) and whose location ``retention_seconds`` has passed, oldest first.
* **critical**: besides the expired ones, the oldest archived copies go before their
  retention, until usage would fall below ``recovery_percent``.
* **emergency**: every copy with enough verified archive copies (not necessarily at every
  archive), least recently used first, until usage would fall below ``recovery_percent``
  (expired copies go regardless).

"Would fall below" starts from the latest sample's used bytes and subtracts the bytes of the
copies deleted since that sample was measured (the sample does not know they went), of the
deletions still in flight at the location, and of the copies chosen so far; used and the
target are both taken over ``used + available`` (the ``df`` figure of :mod:`packhorse.rules.disk_usage`).
Under critical or emergency pressure, in embedded mode (the manager runs where the disks are), a
location whose copies were deleted since its latest sample is measured again first
(:func:`remeasure_under_pressure`), so an episode stops once usage is really back under
``recovery_percent`` (60 %), not after every copy an old sample asked for. Operations are created in the chosen order, so they are dispatched
in it. The manager also returns how long until the next copy's retention passes, so ``run
--until-idle`` knows that the only work left waits on a retention period.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, exists, func, select, update
from sqlalchemy.orm import Session

from packhorse.db.models import (
    DataTransferPackage,
    Operation,
    PhysicalCopy,
    RawDataFile,
    RawDataPackage,
    utcnow,
)
from packhorse.domain import ACTIVE_STATUSES, WAITING_DELETION_RULE, CopyStatus, DiskLevel, OperationKind, Status
from packhorse.managers.wanted import buffer_location_ids, create_missing, new_only
from packhorse.operations.lifecycle import dedup_key, fenced
from packhorse.rules.disk_usage import latest_usage, level_for, monitored_locations, record_sample
from packhorse.rules.policy import deletion_blockers, deletion_blockers_many, last_used_times
from packhorse.runtime.context import ProcessContext
from packhorse.storage.usage import provider_for


@dataclass
class Candidate:
    """A copy that may be deleted (no blocker) and what orders it."""

    copy: PhysicalCopy
    archived: bool           # raw: the package is archived; bundle: always (its rule is all-or-nothing)
    since: dt.datetime       # retention counts from here (archived_at, or the bundle copy's creation)
    last_used: dt.datetime | None = None


@dataclass(frozen=True)
class Pressure:
    """The disk level of one location and the figures the stop rule needs.

    ``total`` is ``used + available`` bytes (``df``'s denominator), ``used`` the used bytes of
    the sample, ``measured_at`` (UTC) when it was taken.
    """

    level: DiskLevel
    total: int = 0
    used: int = 0
    measured_at: dt.datetime | None = None


def location_pressure(ctx: ProcessContext, session: Session) -> dict[int, Pressure]:
    """The pressure of every location with a fresh disk usage sample, by location id."""
    cfg = ctx.settings.disk_usage
    out: dict[int, Pressure] = {}
    for name, s in latest_usage(session, max_age_seconds=cfg.stale_after_seconds).items():
        if name in ctx.topology.location_ids:
            out[ctx.topology.location_ids[name]] = Pressure(level_for(s.percent, cfg), s.used_bytes + s.free_bytes,
                                                            s.used_bytes, s.measured_at)
    return out


def _deleted_since(s: Session, location_id: int, since: dt.datetime | None) -> int:
    """Bytes of the copies at ``location_id`` recorded deleted after ``since`` (UTC)."""
    if since is None:
        return 0
    return int(s.scalar(select(func.coalesce(func.sum(PhysicalCopy.size), 0)).where(
        PhysicalCopy.location_id == location_id, PhysicalCopy.status == CopyStatus.DELETED.value,
        PhysicalCopy.deleted_at > since)) or 0)


def remeasure_under_pressure(ctx: ProcessContext) -> list[str]:
    """Measure again every disk location at critical or emergency level whose copies were
    deleted since its latest sample; returns the names measured.

    Only in embedded mode (``executor.kind = "local"``): there the manager runs on the host of
    the disks. Elsewhere the site's disk monitor measures every ``interval_seconds`` and the
    stop rule counts the deletions since its sample. A location that cannot be measured here
    is left to the disk monitor (which logs it).
    """
    if ctx.settings.executor.kind != "local":
        return []
    names = set(monitored_locations(ctx.settings))

    def stale(s: Session) -> list[str]:
        out = []
        for loc_id, p in location_pressure(ctx, s).items():
            name = ctx.location_name(loc_id)
            if name in names and p.level.rank >= DiskLevel.CRITICAL.rank and _deleted_since(s, loc_id, p.measured_at):
                out.append(name)
        return out

    measured = []
    provider = provider_for(ctx.hooks)
    for name in ctx.db.read(stale):
        try:
            usage = provider(name, ctx.settings.location_path(name))
        except (OSError, ValueError, KeyError):
            continue
        record_sample(ctx.db, ctx.settings, ctx.topology.location_ids[name], name, usage)
        measured.append(name)
    return measured


def choose(ctx: ProcessContext, candidates: list[Candidate], pressure: Pressure, pending_bytes: int,
           now: dt.datetime, retention_seconds: float,
           blocked: Callable[[Candidate], bool]) -> tuple[list[Candidate], list[float]]:
    """Pick, in order, the candidates of one location to delete at ``pressure``; also return
    the seconds until each archived, unexpired candidate's retention passes.

    ``blocked(c)`` (the safety rules, the costly part) is asked only of a candidate about to be
    taken, so copies that merely wait for their retention cost nothing per cycle."""
    level = pressure.level
    keep = dt.timedelta(seconds=retention_seconds)
    if level is DiskLevel.EMERGENCY:
        pool = sorted(candidates, key=lambda c: (c.last_used or c.since, c.copy.id))
    else:
        pool = sorted((c for c in candidates if c.archived), key=lambda c: (c.since, c.copy.id))
    target = ctx.settings.disk_usage.recovery_percent / 100.0 * pressure.total
    projected = pressure.used - pending_bytes
    chosen: list[Candidate] = []
    waits: list[float] = []
    for c in pool:
        expired = c.archived and now >= c.since + keep
        if expired or (level.rank >= DiskLevel.CRITICAL.rank and projected >= target):
            if not blocked(c):
                chosen.append(c)
                projected -= c.copy.size
        elif c.archived:
            waits.append((c.since + keep - now).total_seconds())
    return chosen, waits


def waiting_on_rule() -> Any:
    """The SQL condition "a deletion handed back because its rule (I1) did not hold, still
    within its backoff" (:func:`packhorse.engine.worker._wait_for_deletion_rule`): ``PENDING``,
    ``not_before`` in the future, ``error_context["waiting"] = "deletion_rule"``."""
    return and_(Operation.kind == OperationKind.DELETION.value, Operation.status == Status.PENDING.value,
                Operation.not_before > utcnow(),
                Operation.error_context["waiting"].as_string() == WAITING_DELETION_RULE)


def wake_safe_deletions(ctx: ProcessContext) -> int:
    """Make due at once every deletion waiting on its rule (:func:`waiting_on_rule`) for which
    the rule holds again now (:func:`~.policy.deletion_blockers`; source files: the package is
    archived), so a deletion held back while a lost copy was being made again runs as soon as
    that is done, not after its backoff. Each is a compare-and-set on the ``PENDING`` attempt
    read (:func:`~packhorse.operations.lifecycle.fenced`). The stage checks the rule again before any
    byte goes (I1). Returns how many were made due."""

    def find(s: Session) -> list[tuple[int, int]]:
        rows = s.execute(select(Operation.id, Operation.attempt, Operation.physical_copy_id,
                                Operation.raw_data_package_id).where(waiting_on_rule())).all()
        if not rows:
            return []
        copies = list(s.scalars(select(PhysicalCopy).where(
            PhysicalCopy.id.in_([r.physical_copy_id for r in rows if r.physical_copy_id is not None]))))
        blockers = deletion_blockers_many(s, ctx, copies) if copies else {}
        archived = set(s.scalars(select(RawDataPackage.id).where(
            RawDataPackage.id.in_([r.raw_data_package_id for r in rows if r.physical_copy_id is None]),
            RawDataPackage.archived_at.is_not(None))))
        return [(r.id, r.attempt) for r in rows
                if (r.physical_copy_id is None and r.raw_data_package_id in archived)
                or (r.physical_copy_id is not None and r.physical_copy_id in blockers
                    and not blockers[r.physical_copy_id])]

    due = ctx.db.read(find)
    if not due:
        return 0

    def tx(s: Session) -> int:
        now = utcnow()
        return sum(s.execute(update(Operation).where(fenced(op_id, attempt, Status.PENDING))
                             .values(not_before=now, updated_at=now)).rowcount or 0 for op_id, attempt in due)

    return ctx.db.transact(tx)


def manage(ctx: ProcessContext) -> tuple[int, float | None]:
    """Create deletion operations, and make due the waiting ones whose rule holds again
    (:func:`wake_safe_deletions`); returns ``(created + made due, seconds until the next
    retention ends)``."""

    def find(s: Session) -> tuple[dict[str, dict[str, Any]], float | None]:
        now = utcnow()
        waits: list[float] = []
        wanted: dict[str, dict[str, Any]] = {}
        no_deletion_yet = ~exists().where(Operation.physical_copy_id == PhysicalCopy.id)
        pressure = location_pressure(ctx, s)
        by_location: dict[int, list[Candidate]] = {}

        buffer_ids = buffer_location_ids(ctx)
        # a copy of a package not archived yet may go only in an emergency (with enough
        # archive copies): elsewhere the database leaves those rows out (most of them, while
        # a run is busy archiving)
        emergency = [i for i in buffer_ids if pressure.get(i, Pressure(DiskLevel.NORMAL)).level is DiskLevel.EMERGENCY]
        raw = s.execute(
            select(PhysicalCopy, RawDataPackage.archived_at, RawDataPackage.created_at)
            .join(RawDataPackage, RawDataPackage.id == PhysicalCopy.raw_data_package_id)
            .where(PhysicalCopy.status == CopyStatus.PRESENT.value, PhysicalCopy.location_id.in_(buffer_ids),
                   RawDataPackage.archived_at.is_not(None) | PhysicalCopy.location_id.in_(emergency),
                   no_deletion_yet)
        ).all()
        for copy, archived_at, created_at in raw:
            by_location.setdefault(copy.location_id, []).append(
                Candidate(copy, archived_at is not None, archived_at or created_at))
        bundles = s.execute(
            select(PhysicalCopy)
            .join(DataTransferPackage, DataTransferPackage.id == PhysicalCopy.data_transfer_package_id)
            .where(PhysicalCopy.status == CopyStatus.PRESENT.value, PhysicalCopy.location_id.in_(buffer_ids),
                   no_deletion_yet)
        ).scalars().all()
        for copy in bundles:
            by_location.setdefault(copy.location_id, []).append(Candidate(copy, True, copy.created_at))

        # the packages the rules will look up, in one query; then found in the session, whose
        # identity map holds objects only while something refers to them: `loaded` does
        pkg_ids = sorted({c.copy.raw_data_package_id for cs in by_location.values() for c in cs
                          if c.copy.raw_data_package_id})
        loaded: list[RawDataPackage] = []
        for i in range(0, len(pkg_ids), 500):
            loaded += s.scalars(select(RawDataPackage).where(RawDataPackage.id.in_(pkg_ids[i:i + 500])))
        for loc_id, candidates in by_location.items():
            p = pressure.get(loc_id, Pressure(DiskLevel.NORMAL))
            if p.level is DiskLevel.EMERGENCY:
                used = last_used_times(s, loc_id, [c.copy for c in candidates])
                for c in candidates:
                    c.last_used = used[c.copy.id]
            pending = 0
            if p.level.rank >= DiskLevel.CRITICAL.rank:  # only pressure stops at the recovery threshold
                pending = _deleted_since(s, loc_id, p.measured_at) + int(s.scalar(
                    select(func.coalesce(func.sum(PhysicalCopy.size), 0)).join(
                        Operation, Operation.physical_copy_id == PhysicalCopy.id)
                    .where(PhysicalCopy.location_id == loc_id, Operation.kind == OperationKind.DELETION.value,
                           Operation.status.in_([x.value for x in ACTIVE_STATUSES]))) or 0)
            loc = ctx.settings.location(ctx.location_name(loc_id))
            # the rules for every candidate past its retention (each of those is asked) in
            # one batch; one by one for those only disk pressure may take
            keep = dt.timedelta(seconds=loc.retention_seconds)
            known = deletion_blockers_many(s, ctx, [c.copy for c in candidates if c.archived and now >= c.since + keep])

            def blocked(c: Candidate) -> bool:
                reasons = known.get(c.copy.id)
                return bool(deletion_blockers(s, ctx, c.copy) if reasons is None else reasons)

            chosen, loc_waits = choose(ctx, candidates, p, int(pending), now, loc.retention_seconds, blocked)
            waits += loc_waits
            for c in chosen:
                copy = c.copy
                wanted[dedup_key(OperationKind.DELETION, f"copy{copy.id}")] = dict(
                    physical_copy_id=copy.id, source_location_id=copy.location_id,
                    site_id=ctx.topology.site_ids[loc.site], raw_data_package_id=copy.raw_data_package_id,
                    data_transfer_package_id=copy.data_transfer_package_id)
        if ctx.settings.deletion.delete_source_files:
            keep = dt.timedelta(seconds=ctx.settings.deletion.source_retention_seconds)
            pkgs = s.execute(
                select(RawDataPackage.id, RawDataPackage.source_location_id, RawDataPackage.archived_at)
                .where(RawDataPackage.archived_at.is_not(None),
                       RawDataPackage.id.in_(select(RawDataFile.raw_data_package_id)
                                             .where(RawDataFile.source_deleted_at.is_(None))))
            ).all()
            for pkg_id, loc_id, archived_at in pkgs:
                if now < archived_at + keep:
                    waits.append((archived_at + keep - now).total_seconds())
                    continue
                site = ctx.topology.location_site[ctx.location_name(loc_id)]
                wanted[dedup_key(OperationKind.DELETION, f"rdp{pkg_id}", "source")] = dict(
                    physical_copy_id=None, source_location_id=loc_id, site_id=ctx.topology.site_ids[site],
                    raw_data_package_id=pkg_id, data_transfer_package_id=None)
        return new_only(s, wanted), (min(waits) if waits else None)

    remeasure_under_pressure(ctx)
    woken = wake_safe_deletions(ctx)
    wanted, wait = ctx.db.read(find)
    return create_missing(ctx, OperationKind.DELETION, wanted) + woken, wait
