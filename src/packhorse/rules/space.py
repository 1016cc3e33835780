"""Space at data locations: work that met a full file system waits for space, is woken when
space is freed, and fails when it can never fit (DESIGN.md I5: every state has an owner).

* A write that meets ``ENOSPC``/``EDQUOT`` hands its operation back to wait
  (:func:`packhorse.engine.worker._wait_for_space`: ``error_context["waiting"] = "space"``);
  :func:`waiting_for_space` is the one condition for it (the idle check of ``run
  --until-idle``, the blocked list).
* It is made due again at once when packhorse freed space there (:func:`space_freed`, every
  manager cycle of both executors), when a new ``packhorse run`` starts
  (:func:`look_for_space_again`), else after its backoff.
* What can never fit (:func:`space_needed` larger than the whole file system:
  :func:`never_fits`) fails instead, and a human is told.
* A package is built into its source buffer only while the buffer keeps room for the bundle
  of what waits there to be bundled (:func:`room_to_bundle`): packages written faster than
  they are bundled would otherwise fill the buffer so that no bundle fits and nothing can be
  freed.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session, aliased

from packhorse.db.models import DataTransferPackage, Operation, PhysicalCopy, RawDataFile, RawDataPackage, utcnow
from packhorse.domain import WAITING_SPACE, CopyStatus, OperationKind, Status
from packhorse.domain import OperationKind as K
from packhorse.errors import ConfigError, DestinationWriteError, NeverFitsError
from packhorse.storage.usage import provider_for

if TYPE_CHECKING:
    from packhorse.runtime.context import ProcessContext

log = structlog.get_logger(__name__)


def waiting_for_space(*, in_backoff: bool = True) -> Any:
    """The SQL condition "a ``PENDING`` operation handed back because the data location it
    writes to was full" (:func:`packhorse.engine.worker._wait_for_space`: ``error_context["waiting"] =
    "space"``), with ``in_backoff`` only while its backoff lasts (``not_before`` in the future).
    Within it, it waits for the world outside like one waiting for an unavailable location:
    ``run --until-idle`` does not wait for it alone (exit 4); once due it is work like any
    other (it looks for space again). ``status`` lists its location either way until it got
    its space (``in_backoff=False``, :func:`packhorse.status.blocked_work.location_full`)."""
    return and_(Operation.status == Status.PENDING.value,
                Operation.error_context["waiting"].as_string() == WAITING_SPACE,
                *([Operation.not_before > utcnow()] if in_backoff else []))


def look_for_space_again(ctx: "ProcessContext") -> int:
    """Make every operation waiting for space (:func:`waiting_for_space`) due now: a run that
    starts looks again at once (space may have been freed since the last one gave up), instead
    of ending idle before their backoff passed. Returns how many were made due."""
    def tx(s: Session) -> int:
        now = utcnow()
        return int(s.execute(update(Operation).where(waiting_for_space()).values(not_before=now, updated_at=now))
                   .rowcount)

    return ctx.db.transact(tx)


def free_bytes(ctx: "ProcessContext", location: str) -> int | None:
    """The bytes free for packhorse at disk location ``location`` now
    (:func:`location_usage`); ``None`` for an object store or a root that cannot be measured."""
    usage = location_usage(ctx, location)
    return None if usage is None else int(usage.free)


def space_freed(ctx: "ProcessContext") -> int:
    """Make due at once every operation waiting for space in its backoff
    (:func:`waiting_for_space`) at a data location where space was freed since it was handed
    back: a deletion completed there, or the location has more bytes free than when it was
    handed back (its ``error_context["free_bytes"]``: an operator freed some, or a file system
    grew) and at least what it must still write (:func:`still_to_write`; unknown: 1 MiB more),
    so that a few bytes freed by anything else on that file system do not start a write that
    can only fail again; or, for a transfer or a package build, its admission would let it in
    now (:func:`fits_now`: the work let in before it, which it waited for, has gone, though the
    disk's free bytes are what they were when it gave up: a ``run --until-idle`` ended with
    exit 4 and an empty buffer that way, under load in CI). It looks again now instead of
    after its backoff (up to ``[recovery]
    retry_backoff_max_seconds``), and ``run --until-idle`` goes on instead of ending with
    work that would fit now (exit 4). Both executors run it in every manager cycle
    (:func:`packhorse.engine.pipeline.manager_cycle`): a read of the few operations waiting for space,
    and one ``statvfs`` per location they wait for. Returns how many were made due."""
    def waiting(s: Session) -> list[tuple[int, Any, Any, Any, Any, str, Any, Any]]:
        return [tuple(r) for r in s.execute(select(  # type: ignore[misc]
            Operation.id, Operation.updated_at, Operation.error_context["location_id"].as_integer(),
            Operation.error_context["location"].as_string(), Operation.error_context["free_bytes"].as_integer(),
            Operation.kind, Operation.data_transfer_package_id, Operation.raw_data_package_id)
            .where(waiting_for_space())).all()]

    rows = ctx.db.read(waiting)
    if not rows:
        return 0
    free_now: dict[str, int | None] = {}
    due = []
    for op_id, since, loc_id, location, free_then, kind, bundle_id, pkg_id in rows:
        # it waited for room kept for work let in before it: that work may have gone since with
        # the disk's bytes back where they were (nothing freed, nothing "more free")
        if location and fits_now(ctx, op_id, kind, location, bundle_id=bundle_id, raw_data_package_id=pkg_id):
            due.append(op_id)
            continue
        if location and free_then is not None:
            if location not in free_now:
                free_now[location] = free_bytes(ctx, location)
            now_free = free_now[location]
            # more free than when it gave up, and enough for what it must write next (else a
            # few bytes freed by anything on that file system would start a write that can
            # only fail again)
            if now_free is not None and now_free > free_then:
                need = ctx.db.read(lambda s, op_id=op_id: still_to_write(s, s.get(Operation, op_id)))
                if now_free >= (need if need is not None else free_then + MIN_FREED_BYTES):
                    due.append(op_id)
                    continue
        if loc_id is not None and ctx.db.read(lambda s, loc_id=loc_id, since=since: s.scalar(
                select(Operation.id).where(Operation.status == Status.COMPLETED.value, Operation.finished_at > since,
                                           Operation.kind == OperationKind.DELETION.value,
                                           Operation.source_location_id == loc_id).limit(1))) is not None:
            due.append(op_id)
    if not due:
        return 0

    def tx(s: Session) -> int:
        now = utcnow()
        return int(s.execute(update(Operation).where(Operation.id.in_(due), waiting_for_space())
                             .values(not_before=now, updated_at=now)).rowcount)

    n = ctx.db.transact(tx)
    if n:
        log.info("space_freed_operations_due", operations=n)
    return n


#: Bytes more free than when it gave up that make an operation of unknown need look again.
MIN_FREED_BYTES = 1 << 20


def still_to_write(s: Session, op: Operation | None) -> int | None:
    """The bytes ``op`` must still write at the location it writes to, beyond what lies there
    already (a lower bound, bytes; ``None``: unknown): a package's payload; a bundle, its
    packages' bytes (they lie there already); a transfer, the bundle; an unpack, its largest
    package (the bundle lies there already); an archive copy or a repair, the package tar."""
    if op is None:
        return None

    kind = op.kind
    if kind == K.RAW_DATA_PACKAGE.value and op.raw_data_package_id is not None:
        n = s.scalar(select(func.sum(RawDataFile.size)).where(RawDataFile.raw_data_package_id == op.raw_data_package_id))
    elif kind == K.DATA_TRANSFER_PACKAGE.value and op.data_transfer_package_id is not None:
        n = s.scalar(select(func.sum(RawDataPackage.size)).where(
            RawDataPackage.data_transfer_package_id == op.data_transfer_package_id))
    elif kind == K.TRANSFER.value and op.data_transfer_package_id is not None:
        n = s.scalar(select(DataTransferPackage.size).where(DataTransferPackage.id == op.data_transfer_package_id))
    elif kind == K.UNPACK.value and op.data_transfer_package_id is not None:
        n = s.scalar(select(func.max(RawDataPackage.size)).where(
            RawDataPackage.data_transfer_package_id == op.data_transfer_package_id))
    elif kind in (K.LONG_TERM_ARCHIVE.value, K.FIXITY_CHECK.value) and op.raw_data_package_id is not None:
        n = s.scalar(select(RawDataPackage.size).where(RawDataPackage.id == op.raw_data_package_id))
    else:
        return None
    return int(n) if n else None


def space_needed(s: Session, op: Operation) -> tuple[int, str] | None:
    """The fewest bytes ``op`` must hold at once at the data location it writes to, with what
    they are (for the message); ``None`` when its kind writes nothing of known size. A lower
    bound (a tar is larger than its payload; inputs on another location of the same file
    system are not counted), so that it is never larger than the truth:

    * a raw data package: its payload files' bytes;
    * a bundle: its packages' tars, which lie in the same buffer until the bundle is verified
      and shipped, and the bundle of them: twice their bytes;
    * a transfer: the bundle;
    * an unpack: the bundle, which stays in the buffer until every package is out, and its
      largest package (those published before can be archived and freed meanwhile);
    * a long-term archive copy or a repair: the package's tar.
    """
    kind = op.kind
    if kind == K.RAW_DATA_PACKAGE.value and op.raw_data_package_id is not None:
        n = s.scalar(select(func.sum(RawDataFile.size)).where(RawDataFile.raw_data_package_id == op.raw_data_package_id))
        return (int(n), "the package's payload files") if n else None
    if kind == K.DATA_TRANSFER_PACKAGE.value and op.data_transfer_package_id is not None:
        n = s.scalar(select(func.sum(RawDataPackage.size)).where(
            RawDataPackage.data_transfer_package_id == op.data_transfer_package_id))
        return (2 * int(n), "the bundle's package tars and the bundle") if n else None
    if kind in (K.TRANSFER.value, K.UNPACK.value) and op.data_transfer_package_id is not None:
        bundle = s.scalar(select(DataTransferPackage.size).where(DataTransferPackage.id == op.data_transfer_package_id))
        if not bundle:
            return None
        if kind == K.TRANSFER.value:
            return int(bundle), "the bundle"
        largest = s.scalar(select(func.max(RawDataPackage.size)).where(
            RawDataPackage.data_transfer_package_id == op.data_transfer_package_id)) or 0
        return int(bundle) + int(largest), "the bundle and its largest package"
    if kind in (K.LONG_TERM_ARCHIVE.value, K.FIXITY_CHECK.value) and op.raw_data_package_id is not None:
        n = s.scalar(select(RawDataPackage.size).where(RawDataPackage.id == op.raw_data_package_id))
        return (int(n), "the package tar") if n else None
    return None


def never_fits(ctx: "ProcessContext", op: Operation, location: str) -> str | None:
    """Why ``op`` can never be done at disk location ``location`` however much space is freed
    there (:func:`space_needed` is larger than the whole file system holding its root), else
    ``None`` (it may fit once space is freed: it waits). Asked once a write met a full file
    system (:func:`packhorse.engine.worker._wait_for_space`); a location that cannot be measured (an
    object store, a root not there) counts as one it may fit in. Sizes from
    :func:`location_usage`."""
    usage = location_usage(ctx, location)
    if usage is None:
        return None
    total = int(usage.total)
    need = ctx.db.read(lambda s: space_needed(s, op))
    if need is None or need[0] <= total:
        return None
    what = ctx.db.read(lambda s: artifact_named(s, op))
    return (f"{what + ' ' if what else ''}needs at least {need[0]:,} bytes at once at data location {location} "
            f"({need[1]}), more than its whole file system holds ({total:,} bytes): it can never fit there, "
            "whatever is freed")


def artifact_named(s: Session, op: Operation) -> str | None:
    """``"bundle <name>"`` or ``"package <name>"``: the artifact ``op`` works on, by the name
    every other message and command gives it (never its database id); ``None`` when it has
    none."""
    if op.data_transfer_package_id is not None:
        name = s.scalar(select(DataTransferPackage.name).where(DataTransferPackage.id == op.data_transfer_package_id))
        return f"bundle {name}" if name else None
    if op.raw_data_package_id is not None:
        name = s.scalar(select(RawDataPackage.name).where(RawDataPackage.id == op.raw_data_package_id))
        return f"package {name}" if name else None
    return None


def location_usage(ctx: "ProcessContext", location: str) -> Any:
    """The :class:`~packhorse.storage.usage.Usage` (bytes) of disk location ``location`` now, or
    ``None`` (an object store, a root that cannot be measured): the one measurement of this
    module, from ``statvfs`` of its root or a test's hooks (:func:`packhorse.storage.usage.provider_for`)."""
    from pathlib import Path


    try:
        if ctx.settings.location(location).object_store_uri is not None:
            return None
        return provider_for(ctx.hooks)(location, Path(ctx.settings.location_path(location)))
    except (KeyError, ConfigError, OSError):
        return None


def _admit(ctx: "ProcessContext", location: str, what: str, need: int, beside: int, at_once: int,
           reserved: str, release: str, operation: str) -> None:
    """Admit a write of ``what`` into ``location`` when ``need`` bytes (its own and what must
    be written beside it) plus ``beside`` (reserved for work there before it) are free.

    ``operation``: ``"<kind> <id>"``, for the command that releases it.

    Raises:
        NeverFitsError: ``at_once`` (what it and the next stage at that location need at once)
            is larger than the whole file system: waiting cannot help (a human is told).
        DestinationWriteError: ``out_of_space``: not room enough now; it waits for space (woken
            when space is freed there), the message naming the bytes and ``reserved``.
    """
    usage = location_usage(ctx, location)
    if usage is None:
        return
    if at_once > usage.total:
        raise NeverFitsError(
            f"{what} needs at least {at_once:,} bytes at once at data location {location} ({reserved}), more "
            f"than its whole file system holds ({usage.total:,} bytes): it can never fit there, whatever is freed",
            step="admission", side="destination", host=location,
            diagnosis=f"give data location {location} a larger file system, then `packhorse reset {operation}`")
    if usage.free >= need + beside:
        return
    raise DestinationWriteError(
        f"{location}: {what} waits for space: the {usage.free:,} bytes free must hold {need:,} bytes for it "
        f"({reserved}) and {beside:,} bytes kept for work there before it; {release}",
        step="admission", side="destination", host=location, out_of_space=True,
        diagnosis=(f"data location {location} keeps room for the work in flight there; this goes on once that "
                   "work has left (no action needed unless the location stays full)"))


def room_to_bundle(ctx: "ProcessContext", op_id: int, package: str, size: int, location: str) -> None:
    """Admission of the package build ``op_id`` (``size`` bytes of payload, package
    ``package``) into the disk buffer ``location``: its free space must hold the package and
    then the bundle of it and of every package there whose bundle is not written yet, and of
    the package builds into ``location`` claimed before it (lower operation ids: one order
    every build agrees on, so the first always goes and none waits for a later one). A bundle
    is written beside its package tars, which stay until it is shipped and archived: packages
    built faster than they were bundled filled a small buffer so that no bundle fitted and
    nothing could ever be freed (a deadlock, found by a trial; then again with 4 builds
    admitted at once). An object store or a root that cannot be measured: admitted.

    Raises:
        NeverFitsError: the package and its bundle (twice its payload) are larger than the
            whole file system.
        DestinationWriteError: ``out_of_space``: not room enough now (it waits for space).
    """
    if ctx.settings.location(location).object_store_uri is not None:
        return
    there, building = _before_bundling(ctx, location, below=op_id)
    # written packages need only their bundle's room more; builds before this one both
    _admit(ctx, location, f"package {package} ({size:,} bytes)", need=2 * size, beside=there + 2 * building,
           at_once=2 * size, reserved="the package, then the bundle of it beside it",
           release=(f"the {there + building:,} bytes of packages there or being built before it are bundled, "
                    "shipped and freed first"), operation=f"raw_data_package {op_id}")


def room_to_bundle_together(ctx: "ProcessContext", builds: dict[int, int], location: str) -> bool:
    """Admission of several package builds of one task into the disk buffer ``location`` at
    once (``builds``: payload bytes by operation id), in one statement instead of one a build
    (a database across a long link pays each in a round trip): their free space must hold
    every one of them and its bundle, beside what :func:`room_to_bundle` keeps for the packages
    there and for every other build into ``location`` claimed before the task's last (a
    superset of what each build's own admission keeps, so whatever this admits, each build's
    own admission would admit too: the rule against a full buffer's deadlock is unchanged).

    Returns:
        ``True``: every build is admitted (an object store or a root that cannot be measured:
        always); ``False``: not all at once now, and each build must go through
        :func:`room_to_bundle` itself (which waits, or says it can never fit). Never raises for
        want of room.
    """
    if ctx.settings.location(location).object_store_uri is not None:
        return True
    if not builds:
        return True
    there, building = _before_bundling(ctx, location, below=max(builds), besides=set(builds))
    usage = location_usage(ctx, location)
    return usage is None or usage.free >= 2 * sum(builds.values()) + there + 2 * building


def _before_bundling(ctx: "ProcessContext", location: str, below: int,
                     besides: Collection[int] = ()) -> tuple[int, int]:
    """``(bytes of the packages at ``location`` whose bundle is not written there yet, payload
    bytes of the package builds into it in progress with an operation id below ``below``, not
    in ``besides``)``, in one statement (one round trip)."""
    loc_id = ctx.topology.location_ids[location]
    bundle_copy = aliased(PhysicalCopy)
    bundle_here = (select(bundle_copy.id).where(
        bundle_copy.data_transfer_package_id == RawDataPackage.data_transfer_package_id,
        bundle_copy.location_id == loc_id, bundle_copy.status == CopyStatus.PRESENT.value)
        .correlate(RawDataPackage).exists())

    def read(s: Session) -> tuple[int, int]:
        # the packages there whose bundle is not written there yet (not bundled, or bundled and
        # waiting for the build: their bundle is written beside them), and the builds before
        # these still writing theirs; both sums in one statement
        there = (select(func.coalesce(func.sum(RawDataPackage.size), 0))
                 .join(PhysicalCopy, PhysicalCopy.raw_data_package_id == RawDataPackage.id)
                 .where(PhysicalCopy.location_id == loc_id, PhysicalCopy.status == CopyStatus.PRESENT.value,
                        or_(RawDataPackage.data_transfer_package_id.is_(None), ~bundle_here)))
        building = (select(func.coalesce(func.sum(RawDataPackage.payload_bytes), 0))
                    .join(Operation, Operation.raw_data_package_id == RawDataPackage.id)
                    .where(Operation.kind == OperationKind.RAW_DATA_PACKAGE.value,
                           Operation.status == Status.IN_PROGRESS.value, Operation.id < below,
                           Operation.destination_location_id == loc_id))
        if besides:
            building = building.where(Operation.id.not_in(sorted(besides)))
        row = s.execute(select(there.scalar_subquery(), building.scalar_subquery())).one()
        return int(row[0] or 0), int(row[1] or 0)

    return ctx.db.read(read)


def _before_unpacking(ctx: "ProcessContext", op_id: int, bundle_id: int, location: str) -> tuple[str, int, int, int]:
    """``(bundle name, its bytes, its largest package's bytes, bytes kept for the work there
    before it)`` of :func:`room_to_unpack`, in one read."""
    loc_id = ctx.topology.location_ids[location]

    def largest(s: Session, bid: int) -> int:
        return int(s.scalar(select(func.max(RawDataPackage.size))
                            .where(RawDataPackage.data_transfer_package_id == bid)) or 0)

    def read(s: Session) -> tuple[str, int, int, int]:
        name, size = s.execute(select(DataTransferPackage.name, DataTransferPackage.size)
                               .where(DataTransferPackage.id == bundle_id)).one_or_none() or (str(bundle_id), 0)
        size = int(size or 0)
        unpacked = select(Operation.data_transfer_package_id).where(
            Operation.kind == OperationKind.UNPACK.value, Operation.status == Status.COMPLETED.value,
            Operation.destination_location_id == loc_id)
        here = s.scalars(select(PhysicalCopy.data_transfer_package_id).where(
            PhysicalCopy.location_id == loc_id, PhysicalCopy.status == CopyStatus.PRESENT.value,
            PhysicalCopy.data_transfer_package_id.is_not(None), PhysicalCopy.data_transfer_package_id != bundle_id,
            PhysicalCopy.data_transfer_package_id.not_in(unpacked))).all()
        before = s.execute(select(Operation.data_transfer_package_id, DataTransferPackage.size)
                           .join(DataTransferPackage, DataTransferPackage.id == Operation.data_transfer_package_id)
                           .where(Operation.kind == OperationKind.TRANSFER.value,
                                  Operation.status == Status.IN_PROGRESS.value, Operation.id < op_id,
                                  Operation.destination_location_id == loc_id)).all()
        beside = sum(largest(s, b) for b in here) + sum(int(sz or 0) + largest(s, b) for b, sz in before)
        return name, size, largest(s, bundle_id), beside

    return ctx.db.read(read)


def fits_now(ctx: "ProcessContext", op_id: int, kind: str, location: str, *, bundle_id: int | None = None,
             raw_data_package_id: int | None = None) -> bool:
    """Whether the admission of transfer or package build ``op_id`` into disk location
    ``location`` (:func:`room_to_unpack`, :func:`room_to_bundle`) would let it in now, by the
    same arithmetic, without raising. ``False`` for any other kind (its wait is for bytes the
    disk lacked: :func:`space_freed`'s other rules), an object store, a root that cannot be
    measured, or a row it cannot read."""
    if kind not in (K.TRANSFER.value, K.RAW_DATA_PACKAGE.value):
        return False
    try:
        usage = location_usage(ctx, location)
        if usage is None:
            return False
        if kind == K.TRANSFER.value and bundle_id is not None:
            _, size, big, beside = _before_unpacking(ctx, op_id, bundle_id, location)
            return bool(size) and usage.free >= size + big + beside
        if kind == K.RAW_DATA_PACKAGE.value and raw_data_package_id is not None:
            payload = ctx.db.read(lambda s: s.scalar(select(RawDataPackage.payload_bytes).where(
                RawDataPackage.id == raw_data_package_id)))
            there, building = _before_bundling(ctx, location, below=op_id)
            return payload is not None and usage.free >= 2 * int(payload) + there + 2 * building
    except (KeyError, ConfigError):
        return False
    return False


def room_to_unpack(ctx: "ProcessContext", op_id: int, bundle_id: int, location: str) -> None:
    """Admission of the transfer ``op_id`` of bundle ``bundle_id`` into the disk buffer
    ``location``: its free space must hold the bundle and then its largest package (the
    unpack writes the packages beside the bundle; those published before can be archived and
    freed meanwhile), plus the largest package of every bundle there not unpacked yet and the
    bundle and largest package of every transfer into ``location`` claimed before it (lower
    operation ids). Four bundles transferred at once filled a small buffer so that no unpack
    could write a package and nothing could ever be freed (a deadlock, found by a trial).

    Raises:
        NeverFitsError: the bundle and its largest package are larger than the whole file
            system (the unpack could never run there).
        DestinationWriteError: ``out_of_space``: not room enough now (it waits for space).
    """
    if ctx.settings.location(location).object_store_uri is not None:
        return
    name, size, big, beside = _before_unpacking(ctx, op_id, bundle_id, location)
    if not size:
        return
    _admit(ctx, location, f"bundle {name} ({size:,} bytes)", need=size + big, beside=beside,
           at_once=size + big, reserved="the bundle, then its largest package unpacked beside it",
           release="the bundles there before it are unpacked and their packages archived and freed first",
           operation=f"transfer {op_id}")
