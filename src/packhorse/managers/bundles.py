"""Data transfer package manager: bundle raw data packages for shipping.

Packages built at a source site's buffer and not yet bundled are taken in id order and
bundled once they reach ``bundle_target_bytes``, and never beyond half the buffer's file system
(a bundle is built beside its package tars). The rest waits until the oldest of them has
waited ``bundle_max_wait_seconds`` — or ships at once when ``flush`` is set (``run
--until-idle`` sets it when nothing else is pending), or while fewer than
``bundles_in_flight`` bundles of its site are in flight (:func:`in_flight`): a link with
nothing to carry does not wait for a bundle to fill, and the bundles made while it is busy
grow with what arrives meanwhile (as Nagle's algorithm does with a TCP connection's bytes).

A package to be shipped again whose old bundle is not rebuilt (:mod:`packhorse.rules.convergence`,
step 5) is first taken out of that bundle, then bundled like a new one.

Which raw packages go in which bundle is decided once, even with many managers running at the
same time (:mod:`packhorse.engine.pipeline`, high availability): one manager at a time bundles a
source site (a transaction-level advisory lock on PostgreSQL, taken without waiting: the others
skip the site this cycle; SQLite's write lock), the candidates are read again under row locks,
and each package joins a bundle only by a compare-and-set on its ``data_transfer_package_id``
(``… IS NULL``). A manager stopped inside that transaction loses it (and the lock) after a
lease (``idle_in_transaction_session_timeout``). A manager that
loses that race for any package of a bundle rolls the whole bundle back and looks again next
cycle, so no package is ever in two bundles and no bundle is built, shipped or unpacked twice.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from packhorse.bags.packaging import TAG_MEMBERS
from packhorse.db.models import DataTransferPackage, Operation, PhysicalCopy, RawDataPackage, utcnow
from packhorse.db.session import bound_idle_in_transaction, try_transaction_lock
from packhorse.domain import ACTIVE_STATUSES, CopyStatus, LocationRole, OperationKind, Status
from packhorse.errors import BundledElsewhereError
from packhorse.managers.wanted import create_missing, planned
from packhorse.operations.lifecycle import create_operation, dedup_key
from packhorse.rules.space import location_usage
from packhorse.runtime.context import ProcessContext

if TYPE_CHECKING:
    from packhorse.rules.convergence import Plan

log = structlog.get_logger(__name__)


def manage(ctx: ProcessContext, *, flush: bool = False, repairs: "Plan | None" = None) -> tuple[int, float | None]:
    """Create bundles; returns ``(created, seconds until a partial bundle is due or None)``.
    ``repairs``: the cycle's repair plan (:func:`packhorse.managers.wanted.planned`)."""
    created = 0
    due_in: float | None = None
    cfg = ctx.settings.packaging
    for site in {l.site for l in ctx.settings.locations if l.role is LocationRole.SOURCE}:
        if ctx.settings.route_from(site) is None:
            continue
        buf = ctx.settings.buffer_of(site).name
        buf_id = ctx.topology.location_ids[buf]
        site_id = ctx.topology.site_ids[site]
        _take_out(ctx, site, repairs)

        def find(s: Session, lock: bool = False) -> list[Any]:
            q = (select(RawDataPackage.id, RawDataPackage.size, PhysicalCopy.created_at)
                 .join(PhysicalCopy, PhysicalCopy.raw_data_package_id == RawDataPackage.id)
                 .where(RawDataPackage.data_transfer_package_id.is_(None), PhysicalCopy.location_id == buf_id,
                        PhysicalCopy.status == CopyStatus.PRESENT.value)
                 .order_by(RawDataPackage.id))
            if lock:  # another manager bundling the same packages waits here, then sees them taken
                q = q.with_for_update(of=RawDataPackage)
            return s.execute(q).all()

        if not ctx.db.read(find):  # most cycles: nothing to bundle, no write lock taken
            continue
        # a bundle is built beside its package tars: one of more than half the buffer's file
        # system could never be built there (a bundle of two packages that each fit alone
        # failed NeverFits, found by a trial)
        usage = location_usage(ctx, buf)
        fits = usage.total // 2 if usage is not None else float("inf")

        def tx(s: Session, find: Any = find) -> tuple[int, float | None]:
            # one manager bundles a site at a time; the others skip it this cycle, without waiting
            # (a manager stopped in here loses this transaction and the lock within a lease)
            bound_idle_in_transaction(s, ctx.settings.recovery.lease_timeout_seconds)
            if not try_transaction_lock(s, f"packhorse-bundle:{site}"):
                return 0, None
            rows = find(s, lock=True)  # again, locked: another manager may have bundled them
            groups: list[list[int]] = []
            cur: list[int] = []
            size = 0
            # what every destination's tar reader accepts ([extraction]): a bundle is a bag tar
            # of TAG_MEMBERS tag files and one member per package
            max_packages = max(1, ctx.settings.extraction.max_members - TAG_MEMBERS)
            max_bytes = ctx.settings.extraction.max_total_bytes
            for pkg_id, pkg_size, _ in rows:
                if cur and (size + (pkg_size or 0) > min(fits, max_bytes) or len(cur) >= max_packages):
                    # else its build could never fit there, or unpack would refuse it
                    groups.append(cur)
                    cur, size = [], 0
                cur.append(pkg_id)
                size += pkg_size or 0
                if size >= cfg.bundle_target_bytes:
                    groups.append(cur)
                    cur, size = [], 0
            wait: float | None = None
            if cur:
                oldest = min(r[2] for r in rows if r[0] in set(cur))
                age = (utcnow() - oldest).total_seconds()
                if (flush or age >= cfg.bundle_max_wait_seconds
                        or (cfg.bundles_in_flight
                            and in_flight(ctx, s, site) + len(groups) < cfg.bundles_in_flight)):
                    groups.append(cur)
                else:
                    wait = cfg.bundle_max_wait_seconds - age
            n = 0
            for ids in groups:
                now = utcnow()
                dtp = DataTransferPackage(name=f"tmp-{now.timestamp()}-{ids[0]}", source_site_id=site_id,
                                          created_at=now, bagging_date=now.strftime("%Y-%m-%d"),
                                          package_count=len(ids))
                s.add(dtp)
                s.flush()
                dtp.name = f"{site}-{now.astimezone(dt.timezone.utc):%Y%m%dT%H%M%SZ}-{dtp.id:06d}"
                joined = s.execute(update(RawDataPackage).where(RawDataPackage.id.in_(ids),
                                                                RawDataPackage.data_transfer_package_id.is_(None))
                                   .values(data_transfer_package_id=dtp.id)).rowcount
                if joined != len(ids):
                    raise BundledElsewhereError(f"{len(ids) - joined} of packages {ids} joined another bundle meanwhile")
                create_operation(s, kind=OperationKind.DATA_TRANSFER_PACKAGE,
                                 dedup_key=dedup_key(OperationKind.DATA_TRANSFER_PACKAGE, f"dtp{dtp.id}"),
                                 site_id=site_id, max_retries=ctx.settings.recovery.max_retries,
                                 data_transfer_package_id=dtp.id, destination_location_id=buf_id)
                n += 1
            return n, wait

        try:
            n, wait = ctx.db.transact(tx)
        except BundledElsewhereError as e:  # rolled back: nothing of this cycle's bundles was kept
            log.info("bundle_race_lost", site=site, reason=str(e))
            continue
        created += n
        if wait is not None:
            due_in = wait if due_in is None else min(due_in, wait)
    # a bundle lost before every destination got what it carries is rebuilt, byte-identical
    # (I3), once its packages are back at the source buffer (:mod:`packhorse.rules.convergence`)
    created += create_missing(ctx, OperationKind.DATA_TRANSFER_PACKAGE,
                              planned(ctx, OperationKind.DATA_TRANSFER_PACKAGE, repairs))
    return created, due_in


def in_flight(ctx: ProcessContext, s: Session, site: str) -> int:
    """How many bundles of source ``site`` are in flight: being built (an active
    ``data_transfer_package`` operation), being transferred (an active ``transfer``), or present at
    the site's buffer and not yet transferred to every destination of its route (built, its
    transfers not yet created or waiting to retry). A bundle whose transfer failed for good
    counts until an operator acts: its site's partial bundles then wait
    ``bundle_max_wait_seconds`` as they would with ``bundles_in_flight = 0``, never longer.
    Reads only live rows (active operations, present copies at one buffer)."""
    route = ctx.settings.route_from(site)
    site_id = ctx.topology.site_ids[site]
    buf_id = ctx.topology.location_ids[ctx.settings.buffer_of(site).name]
    kinds = [OperationKind.DATA_TRANSFER_PACKAGE.value, OperationKind.TRANSFER.value]
    busy = set(s.execute(
        select(Operation.data_transfer_package_id)
        .join(DataTransferPackage, DataTransferPackage.id == Operation.data_transfer_package_id)
        .where(Operation.kind.in_(kinds), Operation.status.in_([x.value for x in ACTIVE_STATUSES]),
               DataTransferPackage.source_site_id == site_id)).scalars())
    at_buffer = set(s.execute(
        select(PhysicalCopy.data_transfer_package_id)
        .where(PhysicalCopy.location_id == buf_id, PhysicalCopy.status == CopyStatus.PRESENT.value,
               PhysicalCopy.data_transfer_package_id.is_not(None))).scalars()) - busy
    if at_buffer and route is not None:
        shipped: dict[int, int] = {}
        for dtp_id, n in s.execute(
                select(Operation.data_transfer_package_id, func.count(func.distinct(Operation.destination_location_id)))
                .where(Operation.kind == OperationKind.TRANSFER.value, Operation.status == Status.COMPLETED.value,
                       Operation.data_transfer_package_id.in_(at_buffer))
                .group_by(Operation.data_transfer_package_id)):
            shipped[dtp_id] = n
        busy |= {d for d in at_buffer if shipped.get(d, 0) < len(route.destination_sites)}
    return len(busy)


def _take_out(ctx: ProcessContext, site: str, repairs: "Plan | None") -> int:
    """Take the packages of ``site`` the repair plan ships again in a bundle of their own out
    of their old bundle (:attr:`packhorse.rules.convergence.Plan.detach`): each a compare-and-set on
    its ``data_transfer_package_id`` (another manager may have done it), so that the bundling
    below takes them with whatever else waits at the source buffer. Returns how many."""
    mine = [(pid, bid) for pid, (bid, at) in (repairs.detach.items() if repairs is not None else []) if at == site]
    if not mine:
        return 0

    def tx(s: Session) -> int:
        return sum(s.execute(update(RawDataPackage).where(RawDataPackage.id == pid,
                                                          RawDataPackage.data_transfer_package_id == bid)
                             .values(data_transfer_package_id=None)).rowcount for pid, bid in mine)

    n = ctx.db.transact(tx)
    if n:
        log.info("packages_taken_out_of_their_bundle", site=site, packages=[pid for pid, _ in mine],
                 reason="shipped again in a bundle of their own: their bundle is not rebuilt")
    return n
