"""Unavailable data locations: work waits for them instead of failing (DESIGN.md "Architecture").

Storage that is absent is not empty. A data location is *available* when its root is there
and carries the identity marker that names it (:mod:`packhorse.storage.identity`, written by
``packhorse init``). Otherwise — an unmounted disk, a renamed folder, a deleted bucket, an
empty mount point, the wrong disk mounted — it is *unavailable*, and:

* an operation touching it (its source or destination location) is not run and not failed:
  the worker defers it (``PENDING`` with ``not_before``, no retry counted) with a growing
  pause (:func:`wait_seconds`: the outage's age, between ``[recovery]
  retry_backoff_base_seconds`` and ``retry_backoff_max_seconds``) — before the stage runs
  (:func:`check_operation`) and also when the stage failed while the location went away
  under it;
* the outage is recorded once (:class:`~packhorse.db.models.LocationOutage`), with one
  notification per outage, and listed by ``packhorse status`` as blocked work
  (:func:`packhorse.status.blocked_work.location_unavailable`);
* every open outage is looked at again (:func:`check_outages`) by the processes that can see
  the storage — the embedded runner's cycle (every location), the distributed managers' cycle
  (object stores only) and each site worker's periodic look at its own site's disks; when the
  location is back the outage ends and the operations waiting on it are due at once
  (resumed by themselves; nothing to reset).

A location whose root and marker are there but whose storage refuses writes — a file system
remounted read-only (``EROFS``), a failing disk (``EIO``), permissions changed under the writer
(``EACCES``), an object store answering ``AccessDenied`` (:mod:`packhorse.storage.faults`) — is
unavailable the same way (:func:`storage_fault`): its outage records the ``fault`` and ends
only when a write there succeeds again (:meth:`~packhorse.storage.base.StorageBackend.write_fault`).

A scan of a source location whose root is missing records the outage and registers, skips
and forgets nothing (:mod:`packhorse.managers.scan`); the fixity audit and ``verify`` judge no
copy on an unavailable location.
"""

from __future__ import annotations

import datetime as dt
import os
import uuid
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.orm import Session

from packhorse import __version__
from packhorse.db.models import (
    DataLocation,
    Installation,
    LocationOutage,
    Operation,
    PhysicalCopy,
    RawDataFile,
    RawDataPackage,
    utcnow,
)
from packhorse.db.session import insert_if_absent, insert_ignoring_conflicts
from packhorse.domain import (
    LIVE_COPY_STATUSES,
    WAITING_LOCATION,
    CopyStatus,
    LocationRole,
    OperationKind,
    Status,
    StorageType,
    TransferMethod,
)
from packhorse.errors import ConfigError, LocationUnavailableError, StorageServiceError
from packhorse.notify.messages import location_available as notify_available
from packhorse.notify.messages import location_unavailable as notify_unavailable
from packhorse.rules.policy import refresh_archived
from packhorse.storage.faults import fault_of
from packhorse.storage.identity import (
    FINGERPRINT_SAMPLE,
    InitResult,
    check_fingerprint,
    check_identity,
    mark_location,
    other_installation,
    read_marker,
    root_fingerprint,
    root_read_only,
)
from packhorse.storage.registry import backend_for

if TYPE_CHECKING:
    from packhorse.config import Settings
    from packhorse.db.session import Database
    from packhorse.runtime.context import ProcessContext

log = structlog.get_logger(__name__)
#: locations this process saw unavailable (name -> whether for a storage fault, which a
#: write must clear): a worker that finds one back ends its outage
_seen_out: dict[str, bool] = {}


def probe(ctx: "ProcessContext", location: str, *, writable: bool = False) -> LocationUnavailableError | None:
    """Look at ``location`` now: ``None`` if it is available, else the reason as a
    :class:`~packhorse.errors.LocationUnavailableError` (a stat of the root and a read of the
    small marker; never creates anything). With ``writable`` (the location's outage is a
    storage fault: ``EROFS``, ``EIO``, ``EACCES``, ``AccessDenied``) a small probe object is
    also written and removed under the reserved prefix
    (:meth:`~packhorse.storage.base.StorageBackend.write_fault`) — never at a location
    configured ``read_only``, which is never written to.

    Raises:
        ConfigError: ``location`` is not configured or its store is refused.
        StorageServiceError: an object store could not be asked (not an outage of the location).
    """
    backend = ctx.backend(location)
    installation = ctx.topology.installation
    if fingerprinted(ctx, location, backend):
        try:
            check_fingerprint(backend, location, ctx.topology.location_fingerprint.get(location),
                              lambda: registered_sample(ctx, location))
        except LocationUnavailableError as e:
            return e
        return None
    try:
        check_identity(backend, location, ctx.topology.location_marker.get(location), installation)
    except LocationUnavailableError as e:
        if not e.wrong_uuid:
            return e
        # `packhorse init --replace` (or `--adopt`) may have marked the storage since this
        # process started
        recorded = ctx.db.read(lambda s: s.scalar(select(DataLocation.marker_uuid).where(
            DataLocation.name == location)))
        ctx.topology.location_marker[location] = recorded
        try:
            check_identity(backend, location, recorded, installation)
        except LocationUnavailableError as again:
            return again
    if writable and not is_read_only(ctx, location):
        return backend.write_fault()
    return None


def is_read_only(ctx: "ProcessContext", location: str) -> bool:
    """``location`` is never written to: a source configured ``read_only = true`` (exported
    read-only), or a source whose root is on a read-only file system now
    (:func:`packhorse.storage.identity.root_read_only`; :func:`read_only_sources` warns about it
    at start-up). Only sources: packhorse must write to every other location, and one that
    refuses writes is unavailable instead (:func:`storage_fault`)."""
    if ctx.topology.location_role.get(location) is not LocationRole.SOURCE:
        return False
    loc = next((x for x in ctx.settings.locations if x.name == location), None)
    if loc is None:
        return False
    return loc.read_only or root_read_only(ctx.backend(location))


def fingerprinted(ctx: "ProcessContext", location: str, backend: Any) -> bool:
    """``location`` is told by its recorded fingerprint instead of a marker: a source with a
    fingerprint recorded by ``packhorse init`` (read-only: nothing was written there) and no
    marker at its root, or a read-only source with neither (then unavailable until ``init``
    records one). A read-only root that does carry a marker (marked before it was exported
    read-only) is checked by its marker."""
    if ctx.topology.location_role.get(location) is not LocationRole.SOURCE:
        return False
    recorded = ctx.topology.location_fingerprint.get(location)
    if recorded is None and not is_read_only(ctx, location):
        return False
    if backend.root_missing() is not None:
        return True  # check_fingerprint says so
    try:
        return read_marker(backend) is None
    except ValueError:
        return False  # check_identity reports the bad marker


def registered_sample(ctx: "ProcessContext", location: str) -> list[tuple[str, int, int]]:
    """Up to :data:`~packhorse.storage.identity.FINGERPRINT_SAMPLE` raw data files registered at
    ``location`` whose source file packhorse did not delete, newest first, as ``(key, bytes,
    mtime ns)``: what a remounted read-only source must still hold (read-only)."""
    loc_id = ctx.topology.location_ids.get(location)
    if loc_id is None:
        return []
    return ctx.db.read(lambda s: [(str(p), int(n), int(m)) for p, n, m in s.execute(
        select(RawDataFile.relative_path, RawDataFile.size,
               func.coalesce(RawDataFile.confirmed_mtime_ns, RawDataFile.mtime_ns))
        .where(RawDataFile.location_id == loc_id, RawDataFile.source_deleted_at.is_(None))
        .order_by(RawDataFile.id.desc()).limit(FINGERPRINT_SAMPLE))])


def read_only_sources(ctx: "ProcessContext") -> list[str]:
    """The active source locations packhorse never writes to (:func:`is_read_only`), checked at
    start-up (``packhorse init`` and ``run``). A source found read-only without ``read_only =
    true`` is logged as a WARNING (``source_found_read_only``) and treated as read-only.

    Raises:
        ConfigError: ``[deletion] delete_source_files`` is on and a source is read-only (the
            message names it): packhorse would never be able to free it, and deleting there
            must not be tried at all.
    """
    found = []
    for loc in ctx.settings.locations:
        if loc.role is not LocationRole.SOURCE or not loc.active or loc.name not in ctx.topology.location_ids:
            continue
        if is_read_only(ctx, loc.name):
            found.append(loc.name)
            if not loc.read_only:
                log.warning("source_found_read_only", location=loc.name, path=root_of(ctx, loc.name),
                            advice="packhorse writes nothing there; set read_only = true to say so")
    if found and ctx.settings.deletion.delete_source_files:
        raise ConfigError(
            f"[deletion] delete_source_files = true, but source location(s) {', '.join(found)} are read-only "
            f"({'; '.join(f'{n}: {root_of(ctx, n)}' for n in found)}): packhorse never writes or deletes there. "
            "Set delete_source_files = false, or make the source writable")
    return found


def storage_fault(ctx: "ProcessContext", op: Operation, exc: BaseException) -> LocationUnavailableError | None:
    """The location ``op`` must wait for when its attempt raised ``exc`` because the storage
    refused a write (:func:`packhorse.storage.faults.fault_of`: ``EROFS``, ``EIO``, ``EACCES``,
    ``AccessDenied``), else ``None`` (the failure is the operation's own: retried or failed).

    The location is the one the error names (``exc.host``) when ``op`` writes there — its
    destination, or, for a deletion, the location it deletes from — else ``op``'s
    destination. A fault met only *reading* another location is not taken as that location's
    outage here (one unreadable file is not a missing disk; a root that cannot be reached is
    already one: :func:`probe`). Invariant: a write refused by the storage never becomes an
    operation's failure; the work waits, no retry counted, and resumes when a write succeeds.
    """
    found = fault_of(exc)
    if found is None:
        return None
    fault, text = found
    names = ctx.topology.location_names
    written = [names[i] for i in (op.destination_location_id,) if i is not None and i in names]
    if op.kind == OperationKind.DELETION.value and op.source_location_id in names:
        written.append(names[op.source_location_id])
    host = getattr(exc, "host", None)
    location = host if host in written else (written[0] if written else None)
    if location is None:
        return None
    why = f"writing at {root_of(ctx, location)} fails: {text}"
    return LocationUnavailableError(f"data location {location}: {why}", location=location, reason=why,
                                    fault=fault, path=getattr(exc, "path", None))


def wait_seconds(ctx: "ProcessContext", since: dt.datetime | None, now: dt.datetime | None = None) -> float:
    """How long an operation waits before looking at an unavailable location again (seconds):
    the outage's age so far, at least ``retry_backoff_base_seconds`` and at most
    ``retry_backoff_max_seconds`` of ``[recovery]`` (a short blip is retried soon, a long outage
    is not polled hard)."""
    rec = ctx.settings.recovery
    age = 0.0 if since is None else ((now or utcnow()) - since).total_seconds()
    return max(rec.retry_backoff_base_seconds, min(rec.retry_backoff_max_seconds, age))


def record_outage(ctx: "ProcessContext", error: LocationUnavailableError) -> dt.datetime:
    """Record that ``error.location`` is unavailable; returns since when (UTC).

    The first record of an outage inserts its row and queues one WARNING notification in the
    same transaction; later records only refresh ``checked_at`` and the reason.
    """
    loc_id = ctx.topology.location_ids[error.location]
    _seen_out[error.location] = _seen_out.get(error.location, False) or error.fault is not None

    def tx(s: Session) -> dt.datetime:
        now = utcnow()
        t = LocationOutage.__table__
        if insert_if_absent(s, t, [t.c.location_id], dict(
                location_id=loc_id, reason=error.reason[:2000], marker_only=error.marker_only, since=now,
                checked_at=now, fault=error.fault)):
            log.warning("location_unavailable", location=error.location, reason=error.reason, fault=error.fault)
            notify_unavailable(s, location=error.location, reason=error.reason, since=now,
                               release=release_of(ctx, error.location, error.marker_only, error.fault))
            return now
        # a fault, once seen, stays until a write succeeds (a later look at the root alone
        # does not clear it)
        s.execute(update(LocationOutage).where(LocationOutage.location_id == loc_id).values(
            checked_at=now, reason=error.reason[:2000], marker_only=error.marker_only,
            **({"fault": error.fault} if error.fault is not None else {})))
        since = s.scalar(select(LocationOutage.since).where(LocationOutage.location_id == loc_id))
        return since or now

    return ctx.db.transact(tx)


def waiting_for(location_ids: Any, statuses: tuple[Status, ...] = (Status.PENDING,)) -> Any:
    """The SQL condition "a ``PENDING`` operation waiting for one of ``location_ids``" (a list
    of ids or a subquery of them): its source or destination is one, or it was handed back
    because one it needed was unavailable (:func:`packhorse.engine.worker._wait_for_location`:
    ``error_context["waiting"] = "location"`` with its ``location_id``; a repair reading
    another site's copy, for one). One definition for the idle check of ``run --until-idle``,
    the blocked list and the release when the location is back. ``statuses``: the blocked list
    counts ``SCHEDULED`` ones too (queued by a run that stopped, or in a worker's queue: they
    wait for the location as well)."""
    return and_(Operation.status.in_([x.value for x in statuses]), or_(
        Operation.source_location_id.in_(location_ids), Operation.destination_location_id.in_(location_ids),
        and_(Operation.error_context["waiting"].as_string() == WAITING_LOCATION,
             Operation.error_context["location_id"].as_integer().in_(location_ids))))


def end_outage(ctx: "ProcessContext", location: str) -> int | None:
    """The location is available again: delete its outage and make the operations waiting on
    it due now. Returns how many operations were released, ``None`` if there was no outage."""
    loc_id = ctx.topology.location_ids[location]

    def tx(s: Session) -> int | None:
        row = s.get(LocationOutage, loc_id)
        if row is None:
            return None
        since = row.since
        if s.execute(delete(LocationOutage).where(LocationOutage.location_id == loc_id)).rowcount != 1:
            return None  # another process ended it
        now = utcnow()
        res = s.execute(update(Operation).where(waiting_for([loc_id]), Operation.not_before > now)
                        .values(not_before=now, updated_at=now))
        notify_available(s, location=location, since=since, until=now)
        log.warning("location_available_again", location=location, since=since.isoformat(),
                    operations_released=res.rowcount)
        return int(res.rowcount)

    return ctx.db.transact(tx)


def open_outages(ctx: "ProcessContext") -> dict[str, LocationOutage]:
    """The open outages by location name (read-only)."""
    def tx(s: Session) -> dict[str, LocationOutage]:
        rows = list(s.scalars(select(LocationOutage)))
        for r in rows:
            s.expunge(r)
        return {ctx.topology.location_names[r.location_id]: r for r in rows
                if r.location_id in ctx.topology.location_names}

    return ctx.db.read(tx)


def check_outages(ctx: "ProcessContext", *, every_location: bool = False,
                  sites: Collection[str] | None = None) -> list[str]:
    """Look at every location with an open outage that this process can see again: end those
    that are back (their waiting operations become due at once). Returns the locations that
    came back. A location that cannot be looked at (its object store unreachable) stays as it is.

    Only a process that sees a storage judges it (DESIGN.md "Across sites"): with ``sites`` (a
    site worker's periodic look, :class:`packhorse.executors.celery_app.LocationOutageWatch`) the
    locations of those sites, whatever their storage; without (the distributed managers) only
    object stores (S3, Azure), reached over the network — a manager runs on a host of its own,
    where a site's folder is absent or is another folder of the same path, so it would keep an
    outage that is over or end one that is not.

    With ``every_location`` (the embedded runner, which sees all storage) every active
    location is looked at, every site's disks included, so an outage is recorded (and
    notified) as soon as a cycle sees it, before any operation meets it."""
    back = []
    outages = open_outages(ctx)
    if every_location:
        names = list(outages)
        names += [l.name for l in ctx.settings.locations if l.active and l.name not in names
                  and l.name in ctx.topology.location_ids]
    else:
        names = [name for name in outages if visible_here(ctx, name, sites)]
    out = set(outages)
    for name in names:
        try:
            err = probe(ctx, name, writable=name in outages and outages[name].fault is not None)
        except (ConfigError, StorageServiceError) as e:
            log.info("location_check_failed", location=name, error=str(e))
            continue
        if err is None:
            _seen_out.pop(name, None)
            if name in out and end_outage(ctx, name) is not None:
                back.append(name)
        else:
            record_outage(ctx, err)
    return back


def visible_here(ctx: "ProcessContext", location: str, sites: Collection[str] | None) -> bool:
    """A process of ``sites`` judges ``location``'s availability when the location is one of
    those sites' (a site's folders are on its own hosts; its object stores are reached from
    them); a process of no site (``None``: a manager's host) judges only object stores, reached
    over the network from anywhere. A location no longer configured is judged by nobody here."""
    try:
        loc = ctx.settings.location(location)
    except KeyError:
        return False
    if sites is not None:
        return loc.site in sites
    return loc.storage is not StorageType.DISK


def look(ctx: "ProcessContext", location: str) -> LocationUnavailableError | None:
    """:func:`probe` ``location``; if it is available and this process saw it away, end its
    outage (once; a no-op if another process ended it): a worker or a scan may see the
    location back before the managers do (distributed: only the site's workers may see its
    storage). Unavailable: the outage is *not* recorded here (the caller does, once it decided
    to wait)."""
    err = probe(ctx, location, writable=_seen_out.get(location, False))
    if err is None and location in _seen_out:
        _seen_out.pop(location, None)
        end_outage(ctx, location)
    return err


def check_operation(ctx: "ProcessContext", op: Operation) -> LocationUnavailableError | None:
    """The first unavailable location among those ``op`` touches (its source and destination
    locations; :func:`look`), or ``None`` if all are available."""
    for loc_id in dict.fromkeys((op.source_location_id, op.destination_location_id)):
        if loc_id is None or loc_id not in ctx.topology.location_names:
            continue
        if loc_id == op.source_location_id and _reached_over_ssh(ctx, op):
            continue  # another site's storage: the transfer checks it there (storage.sftp.SftpSource.connect)
        err = look(ctx, ctx.location_name(loc_id))
        if err is not None:
            return err
    return None


def _reached_over_ssh(ctx: "ProcessContext", op: Operation) -> bool:
    """``op`` is a transfer on a route with ``method = "sftp"``: its source location belongs to
    another site, reached over SSH, never through a local path (DESIGN.md "Across sites")."""
    if op.kind != OperationKind.TRANSFER.value or op.source_location_id is None:
        return False
    try:
        site = ctx.settings.location(ctx.location_name(op.source_location_id)).site
    except KeyError:  # a location no longer configured: looked at as any other
        return False
    route = ctx.settings.route_from(site)
    return route is not None and route.method is TransferMethod.SFTP


def release_of(ctx: "ProcessContext", location: str, marker_only: bool, fault: str | None = None) -> str:
    """What releases an outage of ``location``: mounting its storage back (packhorse resumes by
    itself); when only its marker is missing, also the two ``packhorse init`` cases (a root with
    data from before markers; ``--replace`` for new empty storage); for a storage ``fault``
    (``EROFS``, ``EIO``, ``EACCES``, ``AccessDenied``) making it writable again."""
    if fault is not None:
        return (f"make {root_of(ctx, location)} writable again ({fault}: remount it read-write, repair or replace the "
                f"failing disk, or restore the permissions or access policy); packhorse resumes by itself once a "
                f"write there succeeds")
    if marker_only:
        return (f"mount the storage of {location} (packhorse resumes by itself); if its root holds data from "
                f"before identity markers, `packhorse init -c CONFIG` marks it and keeps the data; new empty "
                f"storage replacing lost storage: `packhorse init -c CONFIG --replace {location}`")
    return f"remount / restore {root_of(ctx, location)}; packhorse resumes by itself"


def root_of(ctx: "ProcessContext", location: str) -> str:
    """The location's root as an operator names it: its folder, or ``s3://bucket/prefix``."""
    loc = ctx.settings.location(location)
    if loc.object_store_uri is not None:
        return loc.object_store_uri
    return str(ctx.settings.location_path(location))


def _recorded_copies(ctx: "ProcessContext", location: str) -> int:
    """How many copies the ops database records at ``location`` whose bytes should be in its
    root (0 for a location not registered yet): the evidence that an empty, unmarked root is
    an unmounted disk rather than new storage.

    * live copies (``present``, ``deletion_pending``) count;
    * a ``missing`` copy counts only while it is still *owed* there: no later copy of the same
      artifact was recorded at that location (it was made again there, whatever became of it
      since), and, at a buffer, its package is not archived (a buffer copy of an archived
      package would be freed anyway; for a bundle: every package it carries archived). A
      missing copy superseded so is history, not bytes that may come back;
    * ``deleted`` and ``corrupt`` copies do not (packhorse removed the one and quarantined
      the other).
    """
    loc_id = ctx.topology.location_ids.get(location)
    if loc_id is None:
        return 0
    buffer = ctx.topology.location_role.get(location) is LocationRole.BUFFER
    here = PhysicalCopy.location_id == loc_id

    def read(s: Any) -> int:
        live = s.scalar(select(func.count()).select_from(PhysicalCopy).where(
            here, PhysicalCopy.status.in_([c.value for c in LIVE_COPY_STATUSES]))) or 0
        missing = s.execute(select(PhysicalCopy.id, PhysicalCopy.raw_data_package_id,
                                   PhysicalCopy.data_transfer_package_id).where(
            here, PhysicalCopy.status == CopyStatus.MISSING.value)).all()
        if not missing:
            return int(live)
        # the newest copy of each artifact recorded here, and (at a buffer) whether every
        # package of it is archived: one grouped read per kind of artifact, not one per copy
        newest: dict[tuple[str, int], int] = {}
        archived: dict[tuple[str, int], bool] = {}
        for kind, col, pkg_col in (("raw", PhysicalCopy.raw_data_package_id, RawDataPackage.id),
                                   ("dtp", PhysicalCopy.data_transfer_package_id,
                                    RawDataPackage.data_transfer_package_id)):
            ids = sorted({getattr(m, col.key) for m in missing if getattr(m, col.key) is not None})
            if not ids:
                continue
            newest.update(((kind, a), n) for a, n in s.execute(
                select(col, func.max(PhysicalCopy.id)).where(here, col.in_(ids)).group_by(col)))
            if buffer:
                archived.update(((kind, a), bool(total) and total == done) for a, total, done in s.execute(
                    select(pkg_col, func.count(), func.count(RawDataPackage.archived_at))
                    .where(pkg_col.in_(ids)).group_by(pkg_col)))
        owed = 0
        for m in missing:
            subject = ("raw", m.raw_data_package_id) if m.raw_data_package_id is not None else \
                ("dtp", m.data_transfer_package_id)
            if newest.get(subject, m.id) > m.id:
                continue  # made again there since
            if archived.get(subject, False):
                continue  # its packages are archived: the buffer copy is owed nowhere
            owed += 1
        return int(live) + owed

    return ctx.db.read(read)


def _refuse_empty_root_with_copies(ctx: "ProcessContext", location: str, backend: Any, *, replacing: bool,
                                   root_missing: bool = False) -> None:
    """Refuse to mark an empty, unmarked root, or to create a missing one, where the database
    records copies (an unmounted mount point looks exactly like that, and so does the folder
    of a disk mounted below it when the disk is not: DESIGN.md "Storage that is absent is not
    empty"), unless the operator said it replaces lost storage (``packhorse init --replace
    LOCATION``).

    Args:
        root_missing: the root itself is not there (``init`` would create it).

    Raises:
        ConfigError: naming the location, its root, the copies recorded and both ways on.
    """
    if replacing:
        return
    if not root_missing and next(iter(backend.list()), None) is not None:
        return  # a root with data and no marker: an existing deployment, adopted as it is
    n = _recorded_copies(ctx, location)
    if n:
        state = "is missing" if root_missing else "is empty and unmarked"
        raise ConfigError(
            f"data location {location}: the root {root_of(ctx, location)} {state}, but the ops "
            f"database records {n} copy(ies) there — an unmounted disk or a missing bucket? Mount the storage "
            f"that holds them (packhorse resumes by itself). If this really is new, empty storage replacing lost "
            f"storage, run `packhorse init --replace {location}`: its copies are recorded missing and made again "
            "from good sources")


def _record_copies_missing(ctx: "ProcessContext", location: str) -> None:
    """After ``init --replace``: every live copy recorded at ``location`` is recorded
    ``missing`` (the storage holding it is gone), and "archived" is recomputed in the same
    transaction, so convergence makes the copies again (DESIGN.md "Converging")."""
    loc_id = ctx.topology.location_ids.get(location)
    if loc_id is None:
        return
    live = [c.value for c in LIVE_COPY_STATUSES]

    def tx(s: Any) -> None:
        pkgs = [p for p in s.scalars(select(PhysicalCopy.raw_data_package_id).where(
            PhysicalCopy.location_id == loc_id, PhysicalCopy.status.in_(live))) if p is not None]
        s.execute(update(PhysicalCopy).where(PhysicalCopy.location_id == loc_id, PhysicalCopy.status.in_(live))
                  .values(status=CopyStatus.MISSING.value, found_bad_at=utcnow()))
        refresh_archived(s, ctx, pkgs)

    ctx.db.transact(tx)


def _record_marker_uuid(ctx: "ProcessContext", location: str, marker: dict[str, Any] | None, *,
                        replacing: bool) -> None:
    """Record the uuid of ``location``'s identity marker in the ops database (``packhorse
    init``), so that storage carrying a marker of the same name but another uuid, or none, is
    never taken for it (:func:`probe`). A marker in cold storage (unreadable) records nothing.

    Args:
        replacing: the marker replaces the recorded one (``init --replace``, or a root marked
            by this ``init`` after the checks for recorded copies).

    Raises:
        ConfigError: the database already records another uuid and ``replacing`` is false
            (storage of another installation, or a marker copied onto blank storage).
    """
    if marker is None or marker.get("in_cold_storage"):
        return  # nothing readable to compare or record
    found = marker.get("uuid")
    loc_id = ctx.topology.location_ids.get(location)
    recorded = ctx.topology.location_marker.get(location)
    if loc_id is None or found == recorded:
        return
    if recorded is not None and not replacing:
        raise ConfigError(
            f"data location {location}: the root {root_of(ctx, location)} carries an identity marker of "
            f"{location!r} with uuid {found}, but this installation marked {location!r} with uuid {recorded} — "
            "storage of another installation, or a marker copied onto other storage? Mount the storage that "
            f"belongs there; if this storage really replaces the old, run `packhorse init --replace {location}`")
    uuid_ = found if isinstance(found, str) else None  # a hand-made marker without one: nothing to compare

    def tx(s: Session) -> None:
        s.execute(update(DataLocation).where(DataLocation.id == loc_id).values(marker_uuid=uuid_))

    ctx.db.transact(tx)
    ctx.topology.location_marker[location] = uuid_


def _mark_one(ctx: "ProcessContext", loc: Any, backend: Any, ours: str, done: list["InitResult"], *,
              replacing: bool, adopting: bool, every_site: bool) -> None:
    """Check and mark the root of one data location ``loc`` for :func:`mark_locations` (its
    rules), appending what was done to ``done``.

    Raises:
        ConfigError: the root is refused (the message names the location and what to do).
    """

    if loc.role is LocationRole.SOURCE and is_read_only(ctx, loc.name) and not root_missing_of(backend):
        if read_marker_or_none(backend) is None:
            done.append(_identify_read_only(ctx, loc.name, backend, replacing=replacing))
            return
    root_missing = backend.root_missing() is not None
    try:
        marker = None if root_missing else read_marker(backend)
    except ValueError as e:  # a marker that is not one: never re-marked, never taken as ours
        raise ConfigError(f"{e}; move it aside if this storage belongs to {loc.name!r}") from None
    if loc.role is not LocationRole.SOURCE:
        if root_missing or marker is None:
            _refuse_empty_root_with_copies(ctx, loc.name, backend, replacing=replacing, root_missing=root_missing)
    if marker is not None and marker.get("location") == loc.name:
        _refuse_another_installations(ctx, loc.name, marker, ours, adopting=adopting)
    try:
        done.append(mark_location(backend, location=loc.name, site=loc.site, role=loc.role.value,
                                  storage=loc.storage.value, version=__version__, installation=ours,
                                  take_over=adopting))
    except ConfigError as e:
        if every_site and ctx.settings.executor.kind == "celery":
            raise ConfigError(f"{e} (distributed: each site's folders are on its own hosts; run `packhorse "
                              f"init --site SITE` on a host of each site)") from None
        raise
    # a root marked just now passed the checks above (nothing owed there is hidden): its new
    # marker is the location's from now on; one found marked must carry the recorded uuid
    _record_marker_uuid(ctx, loc.name, read_marker(backend), replacing=replacing or done[-1].action != "already marked")
    if replacing:
        _record_copies_missing(ctx, loc.name)
    if loc.name in ctx.topology.location_ids:
        end_outage(ctx, loc.name)


def root_missing_of(backend: Any) -> bool:
    """The backend's root is not there (:meth:`~packhorse.storage.base.StorageBackend.root_missing`)."""
    return backend.root_missing() is not None


def read_marker_or_none(backend: Any) -> dict[str, Any] | None:
    """:func:`~packhorse.storage.identity.read_marker`, with a marker that is not one taken as
    present (an empty dict): it is reported where the marker is checked, never written over."""
    try:
        return read_marker(backend)
    except ValueError:
        return {}


def _identify_read_only(ctx: "ProcessContext", location: str, backend: Any, *, replacing: bool) -> InitResult:
    """``packhorse init`` for a read-only source without a marker: write nothing there, record
    its identity in the ops database instead (:class:`~packhorse.db.models.DataLocation`
    ``marker_uuid`` and ``fingerprint``: :func:`~packhorse.storage.identity.root_fingerprint`).
    A fingerprint already recorded is kept when the root still matches it (refreshed: a remount
    may have changed the device number); a root that matches it no more while files are
    registered there is refused (an unmounted mount point, another export), unless
    ``replacing`` (``init --replace``). Result action ``"identified"`` or ``"already identified"``.

    Raises:
        ConfigError: the root is not the recorded one (the message names the location and the
            way on).
    """
    recorded = ctx.topology.location_fingerprint.get(location)
    uuid_ = ctx.topology.location_marker.get(location)
    if recorded is not None and not replacing:
        try:
            check_fingerprint(backend, location, recorded, lambda: registered_sample(ctx, location))
        except LocationUnavailableError as e:
            if registered_sample(ctx, location) or recorded.get("sample"):
                raise ConfigError(f"{e}. Mount the read-only source that belongs there (packhorse resumes by itself); "
                                  f"if this really is another source replacing it, run `packhorse init --replace "
                                  f"{location}`") from None
    action = "already identified" if recorded is not None and not replacing else "identified"
    if uuid_ is None or replacing:
        uuid_ = str(uuid.uuid4())
    fingerprint = root_fingerprint(backend, location=location, uuid_=uuid_,
                                   sample=None if recorded is None or replacing else
                                   [tuple(x) for x in (recorded.get("sample") or [])][:FINGERPRINT_SAMPLE] or None)
    loc_id = ctx.topology.location_ids[location]

    def tx(s: Session) -> None:
        s.execute(update(DataLocation).where(DataLocation.id == loc_id).values(marker_uuid=uuid_,
                                                                               fingerprint=fingerprint))

    ctx.db.transact(tx)
    ctx.topology.location_marker[location] = uuid_
    ctx.topology.location_fingerprint[location] = fingerprint
    end_outage(ctx, location)
    return InitResult(location, action)


def installation_uuid(ctx: "ProcessContext") -> str:
    """The uuid of this installation (:class:`~packhorse.db.models.Installation`), created by
    the first call (``packhorse init``); concurrent first calls agree on one row."""

    def tx(s: Session) -> str:
        found = s.scalar(select(Installation.uuid).where(Installation.id == 1))
        if found is None:
            s.execute(insert_ignoring_conflicts(s, Installation.__table__, Installation.__table__.c.id),
                      [{"id": 1, "uuid": str(uuid.uuid4()), "created_at": utcnow()}])
            found = s.scalar(select(Installation.uuid).where(Installation.id == 1))
        return str(found)

    return ctx.db.transact(tx)


def _refuse_another_installations(ctx: "ProcessContext", location: str, marker: dict[str, Any] | None,
                                  ours: str, adopting: bool) -> None:
    """Refuse a root already marked, as ``location``, by another installation, when this
    database has recorded no marker for it yet (a fresh database meeting a root some other
    ops database owns: its archive, its source), unless ``adopting`` (``init --adopt``: this
    database takes that installation's place).

    Raises:
        ConfigError: naming the location, its root, the other installation and the way out.
    """
    if marker is None or adopting or ctx.topology.location_marker.get(location) is not None:
        return
    other = other_installation(marker, ours)
    if other is not None:
        raise ConfigError(
            f"data location {location}: the root {root_of(ctx, location)} is marked by another packhorse "
            f"installation (installation {other}, marker uuid {marker.get('uuid')}); refusing to take it over: "
            "its copies belong to that installation's ops database. Check the path or bucket in the "
            "configuration; if this database really replaces that installation's (its database was lost), run "
            f"`packhorse init --adopt {location}`")


def mark_locations(ctx: "ProcessContext", replace: Collection[str] = (),
                   sites: Collection[str] | None = None, adopt: Collection[str] = ()) -> list["InitResult"]:
    """Create and mark the root of every configured data location (``packhorse init``; the
    only code that creates a location root). An existing root with data and no marker is
    adopted as it is (migrating an existing deployment); an open outage of a location marked
    here is ended. Returns what was done per location.

    ``sites``: mark only the locations of these sites (``packhorse init --site``: in a
    distributed deployment each site's folders are on its own hosts); ``None``: every site.

    A root already marked as its location by *another installation* (the marker's
    ``installation`` is not :func:`installation_uuid`) is refused while this database records
    no marker for it, unless its location is in ``adopt`` (``init --adopt LOCATION``: this
    database replaces that installation's).

    An *empty* unmarked root, or a *missing* one, where the database records copies is refused
    (an unmounted mount point looks like the first, the folder of a disk mounted below it like
    the second: neither is ever created or marked over its copies) unless its location is in ``replace`` (``init --replace LOCATION``:
    new storage replacing lost storage; its recorded copies become ``missing`` and are made
    again by convergence).

    A *source* root is never created (instruments write there; an empty folder would hide a
    typo in its path): a missing one is reported after every other location was marked.

    Raises:
        ConfigError: a root is marked as another location, or as this location with another
            uuid than the one recorded (without ``replace``), an empty root would hide recorded
            copies, ``replace`` names no location (or one of a site not in ``sites``), ``sites``
            names no site, a source folder or an S3 bucket is
            missing (packhorse never creates either); the message names the location.
    """

    for option, names in (("--replace", replace), ("--adopt", adopt)):
        unknown = sorted(set(names) - {loc.name for loc in ctx.settings.locations})
        if unknown:
            raise ConfigError(f"{option} names no configured data location: {', '.join(unknown)}")
    ours = installation_uuid(ctx)
    if sites is not None:
        unknown = sorted(set(sites) - {s.name for s in ctx.settings.sites})
        if unknown:
            raise ConfigError(f"--site names no configured site: {', '.join(unknown)}")
        elsewhere = sorted(name for name in replace if ctx.settings.location(name).site not in sites)
        if elsewhere:
            raise ConfigError(f"--replace names a location of a site not marked here (--site): {', '.join(elsewhere)}")
    done: list["InitResult"] = []
    missing_sources = []
    refused: list[str] = []  # every refused location is named at once, not one per `init`
    for loc in ctx.settings.locations:
        if sites is not None and loc.site not in sites:
            continue  # another site's folders are on its own hosts
        backend = ctx.backend(loc.name)
        if loc.role is LocationRole.SOURCE and backend.root_missing() is not None:
            # instruments write there: an empty folder made by packhorse would hide a typo in the
            # path (or an unmounted disk) as "nothing to archive"
            missing_sources.append(f"{loc.name}: {root_of(ctx, loc.name)}")
            continue
        try:
            _mark_one(ctx, loc, backend, ours, done, replacing=loc.name in replace, adopting=loc.name in adopt,
                      every_site=sites is None)
        except ConfigError as e:
            refused.append(str(e))
    if missing_sources:
        refused.append("source location folder(s) do not exist: " + "; ".join(missing_sources)
                       + " — packhorse does not create a source folder (a typo in the path or an unmounted disk must "
                         "not look like nothing to archive); fix the path or mount the disk, then run `packhorse init` "
                         "again (every other location is marked)")
    if len(refused) == 1:
        raise ConfigError(refused[0])
    if refused:
        raise ConfigError(f"{len(refused)} refusals (every other data location is marked; fix each, then run "
                          "`packhorse init` again):\n  " + "\n  ".join(refused))
    return done


def _uncreatable_root(root: Path) -> str | None:
    """Why the missing folder ``root`` could not be created (the nearest folder above it that
    exists is not writable and searchable for this user), else ``None``."""
    above = root.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not os.access(above, os.W_OK | os.X_OK):
        return f"its root folder {root} does not exist and cannot be created: no write permission in {above}"
    return None


def unreachable_stores(settings: "Settings", db: "Database", sites: Collection[str] | None = None) -> list[str]:
    """What ``packhorse init`` checks before it creates anything (the ops database, a root, a
    marker), so that a refused init leaves nothing behind and its re-run starts clean: the
    storage of every data location it will mark (``sites``: of those sites only; ``None``: every
    site) must answer. Its backend is built (:func:`~packhorse.storage.registry.backend_for`, with
    ``db`` for per-object leases, which are not taken here: credentials, an account that is the
    connection string's, the write-once probe, immutability and Object Lock checks) and asked
    whether its root is there (read-only: ``root_missing``). A missing root is not refused here:
    marking creates a folder, and refuses a missing bucket or container naming it. A missing
    disk root that could not be created (no write permission above it) is refused here too,
    whatever the storage type the same way.

    Returns:
        one line per location whose store cannot be reached or refuses the configuration
        (``"<location>: <why>"``), in configuration order; empty when every one answered.
    """
    refused = []
    for loc in settings.locations:
        if sites is not None and loc.site not in sites:
            continue  # another site's storage is reached from its own hosts
        try:
            backend = backend_for(settings, loc.name, db=db)
            why = backend.root_missing()
        except (ConfigError, StorageServiceError, LocationUnavailableError, OSError) as e:
            why = str(e)  # the error names the location itself most often: say it once
            refused.append(why if why.startswith(f"{loc.name}:") else f"{loc.name}: {why}")
            continue
        if why is not None and loc.storage is StorageType.DISK and loc.role is not LocationRole.SOURCE:
            cannot = _uncreatable_root(settings.location_path(loc.name))
            if cannot is not None:
                refused.append(f"{loc.name}: {cannot}")
    return refused
