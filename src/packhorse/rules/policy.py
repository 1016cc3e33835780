"""When is a package archived, and when may a copy go (DESIGN.md I1).

* A raw data package is *archived* when every active ``long_term_archive`` location of every
  destination site of its route holds a present, verified copy.
* A buffer copy of a raw data package may be deleted only when at least
  ``deletion.archive_copies_required`` (default: that same number of archives) verified
  archive copies exist elsewhere, and the buffer's ``retention_seconds`` has passed.
* A bundle copy may be deleted only when every destination site holds a present, verified
  copy of every raw data package the bundle carries (and, again, after retention).
* Source files go only with ``delete_source_files = true``, once the package is archived.

Whatever the disk pressure, :func:`deletion_blockers` must find nothing: never the
last verified copy of any content, never a copy that is the source (or target) of an
operation still in flight (a transfer waiting between retries included), never a copy whose
archive copies failed their last fixity check (latest archive copy ``corrupt`` or
``missing``). The manager applies them when it creates a deletion operation and the stage
again just before the bytes go.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import func, inspect, or_, select, update
from sqlalchemy.orm import Session

from packhorse.db.models import (
    DataLocation,
    DataTransferPackage,
    Operation,
    PhysicalCopy,
    RawDataPackage,
    UTCDateTime,
    utcnow,
)
from packhorse.domain import ACTIVE_STATUSES, CopyStatus, LocationRole, OperationKind, Status
from packhorse.runtime.context import ProcessContext


def source_site_of_package(ctx: ProcessContext, pkg: RawDataPackage) -> str:
    """The site of the package's source location."""
    return ctx.topology.location_site[ctx.location_name(pkg.source_location_id)]


def archive_locations(ctx: ProcessContext, source_site: str) -> list[str]:
    """Names of every active long-term archive of every destination site of the route."""
    route = ctx.settings.route_from(source_site)
    if route is None:
        return []
    return [l.name for d in route.destination_sites for l in ctx.settings.locations_at(d, LocationRole.LONG_TERM_ARCHIVE)]


def archive_copies_required(ctx: ProcessContext, source_site: str) -> int:
    """Verified archive copies needed before buffer copies of the site's packages may go."""
    configured = ctx.settings.deletion.archive_copies_required
    return configured if configured is not None else len(archive_locations(ctx, source_site))


def is_archived(session: Session, ctx: ProcessContext, pkg: RawDataPackage) -> bool:
    """True when every required archive location holds a present, verified copy."""
    return _holds_every_archive(session, ctx, pkg.id, pkg.source_location_id)


def _archives_needed(ctx: ProcessContext, source_location_id: int) -> set[int]:
    """The location ids of the long-term archives a package from ``source_location_id`` needs."""
    return {ctx.topology.location_ids[n] for n in archive_locations(
        ctx, ctx.topology.location_site[ctx.location_name(source_location_id)])}


def _holds_every_archive(session: Session, ctx: ProcessContext, pkg_id: int, source_location_id: int) -> bool:
    needed = _archives_needed(ctx, source_location_id)
    if not needed:
        return False
    c = PhysicalCopy.__table__
    have = set(session.connection().execute(select(c.c.location_id).where(
        c.c.raw_data_package_id == pkg_id, c.c.status == CopyStatus.PRESENT.value,
        c.c.verified_at.is_not(None))).scalars())
    return needed <= have


def mark_archived_if_complete(session: Session, ctx: ProcessContext, pkg_id: int) -> bool:
    """Set ``archived_at`` once the package is archived; returns whether it is
    (:func:`mark_archived_many` of one package)."""
    return pkg_id in mark_archived_many(session, ctx, [pkg_id])


def mark_archived_many(session: Session, ctx: ProcessContext, pkg_ids: list[int]) -> set[int]:
    """Set ``archived_at`` of each of ``pkg_ids`` that every archive it needs now holds (a
    present, verified copy), in the caller's transaction; returns the ids of those archived
    (before or now). Three statements at most, however many packages: across a long link each
    is a round trip.

    The package rows are locked first, in id order (``SELECT … FOR NO KEY UPDATE`` on
    PostgreSQL, which does not conflict with the key-share lock a copy's foreign key took): two
    archive completions of one package at two sites commit concurrently, and without the lock
    neither would see the other's copy, so the package would never be marked archived (and its
    buffer copies never freed, I1). The second waits for the first and then sees its copy.
    """
    ids = sorted(set(pkg_ids))
    if not ids:
        return set()
    t, c = RawDataPackage.__table__, PhysicalCopy.__table__
    conn = session.connection()
    rows = conn.execute(select(t.c.id, t.c.archived_at, t.c.source_location_id).where(t.c.id.in_(ids))
                        .order_by(t.c.id).with_for_update(key_share=True)).all()
    archived = {r.id for r in rows if r.archived_at is not None}
    pending = [r for r in rows if r.archived_at is None]
    if not pending:
        return archived
    have: dict[int, set[int]] = {}
    for pkg_id, location_id in conn.execute(select(c.c.raw_data_package_id, c.c.location_id).where(
            c.c.raw_data_package_id.in_([r.id for r in pending]), c.c.status == CopyStatus.PRESENT.value,
            c.c.verified_at.is_not(None))):
        have.setdefault(pkg_id, set()).add(location_id)
    done = [r.id for r in pending
            if (needed := _archives_needed(ctx, r.source_location_id)) and needed <= have.get(r.id, set())]
    if done:
        conn.execute(update(t).where(t.c.id.in_(done)).values(archived_at=utcnow()))
    return archived | set(done)


def refresh_archived(session: Session, ctx: ProcessContext, pkg_ids: list[int]) -> int:
    """Recompute ``archived_at`` of ``pkg_ids`` from their copies now, in the caller's
    transaction (rows locked as in :func:`mark_archived_many`): set when every required
    archive holds a present, verified copy, cleared when one does not. Called in the same
    transaction as every change of an archive copy's status (:mod:`packhorse.rules.fixity`, the
    archive and repair stages) and by the fixity manager's sweep, so "archived" is always what
    the copies say (DESIGN.md "Converging"; I1: buffer deletions and source deletions read it,
    and check the verified archive copies again before the bytes go). Returns how many changed."""
    t = RawDataPackage.__table__
    conn = session.connection()
    changed = 0
    for pkg_id in sorted(set(pkg_ids)):
        row = conn.execute(select(t.c.archived_at, t.c.source_location_id).where(t.c.id == pkg_id)
                           .with_for_update(key_share=True)).first()
        if row is None:
            continue
        archived = _holds_every_archive(session, ctx, pkg_id, row.source_location_id)
        if archived and row.archived_at is None:
            conn.execute(update(t).where(t.c.id == pkg_id).values(archived_at=utcnow()))
            changed += 1
        elif not archived and row.archived_at is not None:
            conn.execute(update(t).where(t.c.id == pkg_id).values(archived_at=None))
            changed += 1
    return changed


def may_delete_bundle_copy(session: Session, ctx: ProcessContext, dtp_id: int, source_site: str) -> bool:
    """Whether a bundle copy may go: every destination site holds a verified copy of every
    package (at a buffer or long-term archive; a staged folder at a processing location does
    not count, I1)."""
    route = ctx.settings.route_from(source_site)
    if route is None:
        return False
    pkg_ids = list(session.scalars(select(RawDataPackage.id).where(RawDataPackage.data_transfer_package_id == dtp_id)))
    if not pkg_ids:
        return False
    for dest in route.destination_sites:
        loc_ids = [i for n, i in ctx.topology.location_ids.items() if ctx.topology.location_site.get(n) == dest
                   and holds_artifact_bytes(ctx, n)]  # staged folders do not count
        covered = set(session.scalars(
            select(PhysicalCopy.raw_data_package_id).where(
                PhysicalCopy.raw_data_package_id.in_(pkg_ids), PhysicalCopy.location_id.in_(loc_ids),
                PhysicalCopy.status == CopyStatus.PRESENT.value, PhysicalCopy.verified_at.is_not(None))
        ))
        if covered != set(pkg_ids):
            return False
    return True


#: Latest archive-copy statuses that mean "failed its last fixity check" (set by the audit).
FIXITY_FAILED = (CopyStatus.CORRUPT.value, CopyStatus.MISSING.value)


def _package_ids(session: Session, copy: PhysicalCopy) -> list[int]:
    """The raw data packages whose content ``copy`` holds (itself, or those a bundle carries)."""
    if copy.raw_data_package_id is not None:
        return [copy.raw_data_package_id]
    return list(session.scalars(select(RawDataPackage.id)
                                .where(RawDataPackage.data_transfer_package_id == copy.data_transfer_package_id)))


def operations_in_flight(session: Session, copy: PhysicalCopy) -> list[Operation]:
    """Unfinished operations (PENDING — a retry waiting for its backoff included —, SCHEDULED,
    IN_PROGRESS), other than deletions, that read or write ``copy``'s artifact at its location
    (for a raw package copy, its bundle's operations too)."""
    bundle_id = None
    if copy.raw_data_package_id is not None:
        bundle_id = session.scalar(
            select(RawDataPackage.data_transfer_package_id).where(RawDataPackage.id == copy.raw_data_package_id))
    return _in_flight(session, [(copy, bundle_id)])[copy.id]


def _in_flight(session: Session, copies: list[tuple[PhysicalCopy, int | None]]) -> dict[int, list[Operation]]:
    """:func:`operations_in_flight` of many ``(copy, its package's bundle id or None)`` at
    once, by copy id: one query for all of their artifacts, then the rule per copy (the same
    artifact, at the copy's location)."""
    raw_ids = sorted({c.raw_data_package_id for c, _ in copies if c.raw_data_package_id is not None})
    dtp_ids = sorted({c.data_transfer_package_id for c, _ in copies if c.data_transfer_package_id is not None}
                     | {b for c, b in copies if c.raw_data_package_id is not None and b is not None})
    by_raw: dict[int, list[Operation]] = {}
    by_dtp: dict[int, list[Operation]] = {}
    for k in range(0, max(len(raw_ids), len(dtp_ids)), 500):
        about = [col.in_(ids[k:k + 500]) for col, ids in ((Operation.raw_data_package_id, raw_ids),
                                                          (Operation.data_transfer_package_id, dtp_ids))
                 if ids[k:k + 500]]
        for op in session.scalars(select(Operation).where(
                or_(*about), Operation.kind != OperationKind.DELETION.value,
                Operation.status.in_([s.value for s in ACTIVE_STATUSES]))):
            if op.raw_data_package_id is not None:
                by_raw.setdefault(op.raw_data_package_id, []).append(op)
            if op.data_transfer_package_id is not None:
                by_dtp.setdefault(op.data_transfer_package_id, []).append(op)
    out: dict[int, list[Operation]] = {}
    for c, bundle in copies:
        if c.raw_data_package_id is not None:
            about_it = by_raw.get(c.raw_data_package_id, []) + (by_dtp.get(bundle, []) if bundle is not None else [])
        else:
            about_it = by_dtp.get(c.data_transfer_package_id, [])  # type: ignore[arg-type]
        # the same artifact at the copy's location (an operation on a package and its bundle once)
        mine = {op.id: op for op in about_it if c.location_id in (op.source_location_id, op.destination_location_id)}
        out[c.id] = [mine[i] for i in sorted(mine)]
    return out


def failed_fixity(session: Session, pkg_ids: list[int]) -> list[tuple[int, int, str]]:
    """``(package, archive location, status)`` for every archive location whose latest copy of
    one of ``pkg_ids`` is ``corrupt`` or ``missing`` (its last fixity check failed)."""
    if not pkg_ids:
        return []
    return _failed_latest(session.execute(
        select(PhysicalCopy.raw_data_package_id, PhysicalCopy.id, PhysicalCopy.location_id, PhysicalCopy.status,
               DataLocation.role)
        .join(DataLocation, DataLocation.id == PhysicalCopy.location_id)
        .where(PhysicalCopy.raw_data_package_id.in_(pkg_ids),
               DataLocation.role == LocationRole.LONG_TERM_ARCHIVE.value)).all())


def _failed_latest(copies: list[Any]) -> list[tuple[int, int, str]]:
    """The rule of :func:`failed_fixity` over copy rows (``raw_data_package_id``, ``id``,
    ``location_id``, ``status``, ``role``): per package and archive location, the latest copy
    (highest id) holds the last fixity verdict."""
    latest: dict[tuple[int, int], Any] = {}
    for c in copies:
        key = (c.raw_data_package_id, c.location_id)
        if c.role == LocationRole.LONG_TERM_ARCHIVE.value and c.id > getattr(latest.get(key), "id", -1):
            latest[key] = c
    return [(c.raw_data_package_id, c.location_id, c.status) for c in latest.values() if c.status in FIXITY_FAILED]


def deletion_blockers(session: Session, ctx: ProcessContext, copy: PhysicalCopy) -> list[str]:
    """Why ``copy`` may not be deleted now, whatever the disk pressure (empty: it may).

    The rules (DESIGN.md I1): archive copies are never deleted; a raw data package
    copy needs ``archive_copies_required`` verified archive copies and another verified copy
    elsewhere (never the last one); a bundle copy needs verified copies of every package it
    carries at every destination; no operation may be in flight on it; none of its packages'
    archive copies may have failed the last fixity check, nor, for a raw package copy at its
    source site's buffer, those of the other packages of its bundle (the bundle may be rebuilt
    from it, :func:`_siblings_failed_fixity`). Staged folders (processing
    locations) count for none of these: they are working copies, not the package's bytes.
    """
    return deletion_blockers_many(session, ctx, [copy])[copy.id]


def deletion_blockers_many(session: Session, ctx: ProcessContext, copies: list[PhysicalCopy], *,
                           leaving: set[int] | None = None) -> dict[int, list[str]]:
    """:func:`deletion_blockers` of every one of ``copies``, by copy id, in a few queries
    whatever their number (the raw package copies' packages, all their copies, and the
    operations in flight on any of them, each read once; bundle copies one by one). The
    deletion manager's verdicts come from a read (:meth:`packhorse.db.session.Database.read`:
    each statement sees what was committed when it started); they only propose. The worker
    decides again in the fenced transaction that marks the copies (``leaving``, below).

    ``leaving``: for a transaction that marks the copies that may go (a worker's batch of
    deletions, :func:`packhorse.stages.deletion.mark_copies`). The raw package copies are then
    decided one after the other in the order given, each copy that may go is added to
    ``leaving``, and the later copies' rules count the copies in ``leaving`` as gone: the
    verdicts marking them one by one would give (a package's last verified copy is never
    marked with another of its copies in one batch, I1). Bundle copies are not decided so;
    pass them without ``leaving``, after the raw copies are marked.

    Raises:
        ValueError: ``leaving`` with a bundle copy among ``copies``.
    """
    out: dict[int, list[str]] = {}
    raw: list[PhysicalCopy] = []
    for copy in copies:
        loc = ctx.location_name(copy.location_id)
        if ctx.topology.location_role.get(loc) is LocationRole.LONG_TERM_ARCHIVE:
            out[copy.id] = [f"{loc} is a long-term archive: archive copies are never deleted"]
        elif copy.raw_data_package_id is not None:
            raw.append(copy)
        elif leaving is not None:
            raise ValueError(f"copy {copy.id} is a bundle copy: its rule reads the marks of the raw package copies")
        else:
            dtp = session.get(DataTransferPackage, copy.data_transfer_package_id)
            assert dtp is not None
            reasons: list[str] = []
            if not may_delete_bundle_copy(session, ctx, dtp.id, ctx.topology.site_name(dtp.source_site_id)):
                reasons.append("not every destination holds verified copies of every package the bundle carries")
            out[copy.id] = reasons + _in_flight_and_fixity(
                ctx, _in_flight(session, [(copy, None)])[copy.id], failed_fixity(session, _package_ids(session, copy)))
    if not raw:
        return out
    pkg_ids = sorted({c.raw_data_package_id for c in raw if c.raw_data_package_id is not None})
    pkgs: dict[int, RawDataPackage] = {}
    # every copy of the packages, once: the three rules below read the same rows
    rows_of: dict[int, list[Any]] = {i: [] for i in pkg_ids}
    # packages the caller loaded into this session already (the deletion manager and a batch
    # of deletions do) are taken from it; the others are read here, in one query per chunk
    mapper = inspect(RawDataPackage)
    for i in pkg_ids:
        loaded = session.identity_map.get(mapper.identity_key_from_primary_key((i,)))
        if loaded is not None:
            pkgs[i] = loaded
    missing = [i for i in pkg_ids if i not in pkgs]
    for k in range(0, len(missing), 500):
        pkgs.update((p.id, p) for p in session.scalars(select(RawDataPackage).where(
            RawDataPackage.id.in_(missing[k:k + 500]))))
    for k in range(0, len(pkg_ids), 500):
        chunk = pkg_ids[k:k + 500]
        for row in session.execute(
                select(PhysicalCopy.raw_data_package_id, PhysicalCopy.id, PhysicalCopy.location_id,
                       PhysicalCopy.status, PhysicalCopy.verified_at, DataLocation.role)
                .join(DataLocation, DataLocation.id == PhysicalCopy.location_id)
                .where(PhysicalCopy.raw_data_package_id.in_(chunk))):
            rows_of[row.raw_data_package_id].append(row)
    in_flight = _in_flight(session, [(c, pkgs[c.raw_data_package_id].data_transfer_package_id)  # type: ignore[index]
                                     for c in raw])
    siblings_failed = _siblings_failed_fixity(session, ctx, raw, pkgs)
    gone = leaving if leaving is not None else set()
    for copy in raw:
        pkg = pkgs[copy.raw_data_package_id]  # type: ignore[index]
        rows = rows_of[pkg.id]
        reasons = []
        # a staged folder (processing location) is a working copy, not a copy of the package's bytes
        present = [c for c in rows if c.status == CopyStatus.PRESENT.value and c.verified_at is not None
                   and c.role != LocationRole.PROCESSING.value and c.id not in gone]
        have = sum(1 for c in present if c.role == LocationRole.LONG_TERM_ARCHIVE.value)
        need = archive_copies_required(ctx, source_site_of_package(ctx, pkg))
        if have < need or need < 1:
            reasons.append(f"only {have} of {need} required verified archive copies exist")
        if not any(c.id != copy.id and c.location_id != copy.location_id for c in present):
            reasons.append("it is the last verified copy of the package")
        flying = in_flight[copy.id]
        if flying and _archived_at_copy_site(ctx, copy, rows):
            # an unpack of its bundle waiting to run again (for space, after a failure) reads
            # past a package archived at every archive of the site (stages/unpack.archived_at_site):
            # it will not need this copy, whose space may be what it waits for; one running may
            flying = [op for op in flying if not (op.kind == OperationKind.UNPACK.value
                                                  and op.status != Status.IN_PROGRESS.value
                                                  and op.raw_data_package_id is None)]
        out[copy.id] = reasons + _in_flight_and_fixity(ctx, flying, _failed_latest(rows))
        out[copy.id] += [f"the archive copy of package {other} of its bundle at {ctx.location_name(loc)} is {status} "
                         "(failed its last fixity check): the bundle may be rebuilt from this copy"
                         for other, loc, status in siblings_failed.get(copy.id, [])]
        if leaving is not None and not out[copy.id]:
            leaving.add(copy.id)
    return out


def _archived_at_copy_site(ctx: ProcessContext, copy: PhysicalCopy, rows: list[Any]) -> bool:
    """Whether the package of raw package ``copy`` has a ``present`` copy at every active
    long-term archive of the copy's site (``rows``: every copy of the package, as
    :func:`deletion_blockers_many` reads them): the rule an unpack reads past a package by
    (:func:`packhorse.stages.unpack.archived_at_site`). A site without an archive: ``False``."""
    site = ctx.topology.location_site[ctx.location_name(copy.location_id)]
    archives = {ctx.topology.location_ids[loc.name] for loc in ctx.settings.locations
                if loc.site == site and loc.active and loc.role is LocationRole.LONG_TERM_ARCHIVE}
    held = {r.location_id for r in rows if r.status == CopyStatus.PRESENT.value}
    return bool(archives) and archives <= held


def _siblings_failed_fixity(session: Session, ctx: ProcessContext, raw: list[PhysicalCopy],
                            pkgs: dict[int, RawDataPackage]) -> dict[int, list[tuple[int, int, str]]]:
    """By copy id, for the raw package copies among ``raw`` that lie at their source site's
    buffer: the other packages of the same bundle whose archive copy failed its last fixity
    check (:func:`failed_fixity`), as ``(package, archive location, status)``.

    A package whose every good copy is gone is shipped again by rebuilding its bundle at the
    source site's buffer from every package the bundle carries (:mod:`packhorse.rules.convergence`,
    step 4; the absent ones are rebuilt from their source files first). Its siblings' copies
    there are that build's input: freed as soon as they were rebuilt (``retention_seconds =
    0``), they would be rebuilt and freed again for ever before the bundle could be built. They
    are kept until the repair has brought the failed copy back (I1; DESIGN.md "Converging")."""
    at_source: dict[int, int] = {}  # copy id -> bundle id
    for c in raw:
        pkg = pkgs[c.raw_data_package_id]  # type: ignore[index]
        if pkg.data_transfer_package_id is None:
            continue
        sbuf = ctx.settings.buffer_of(source_site_of_package(ctx, pkg))
        if sbuf is not None and ctx.topology.location_ids.get(sbuf.name) == c.location_id:
            at_source[c.id] = pkg.data_transfer_package_id
    if not at_source:
        return {}
    bundles = sorted(set(at_source.values()))
    members: dict[int, list[int]] = {}
    for k in range(0, len(bundles), 500):
        for pid, bid in session.execute(select(RawDataPackage.id, RawDataPackage.data_transfer_package_id).where(
                RawDataPackage.data_transfer_package_id.in_(bundles[k:k + 500]))):
            members.setdefault(bid, []).append(pid)
    all_members = sorted(p for ms in members.values() for p in ms)
    failed: dict[int, list[tuple[int, int, str]]] = {}
    for k in range(0, len(all_members), 500):
        for pid, loc, status in failed_fixity(session, all_members[k:k + 500]):
            failed.setdefault(pid, []).append((pid, loc, status))
    out: dict[int, list[tuple[int, int, str]]] = {}
    for c in raw:
        bid = at_source.get(c.id)
        if bid is None:
            continue
        found = [f for m in members.get(bid, []) if m != c.raw_data_package_id for f in failed.get(m, [])]
        if found:
            out[c.id] = found
    return out


def _in_flight_and_fixity(ctx: ProcessContext, in_flight: list[Operation],
                          failed: list[tuple[int, int, str]]) -> list[str]:
    reasons = [f"{op.kind} operation {op.id} ({op.status}) still needs it" for op in in_flight]
    for pkg_id, loc_id, status in failed:
        reasons.append(f"the archive copy of package {pkg_id} at {ctx.location_name(loc_id)} is {status} "
                       "(failed its last fixity check)")
    return reasons


def last_used_times(session: Session, location_id: int, copies: list[PhysicalCopy]) -> dict[int, dt.datetime]:
    """When each of ``copies`` (all at ``location_id``) was last used, by copy id: its creation
    or verification, or the latest operation that read or wrote its artifact at that location
    (for least-recently-used order). Two grouped queries, whatever the number of copies."""
    used = func.max(func.coalesce(Operation.finished_at, Operation.started_at, Operation.created_at),
                    type_=UTCDateTime())
    here = (Operation.kind != OperationKind.DELETION.value,
            or_(Operation.source_location_id == location_id, Operation.destination_location_id == location_id))
    by_raw = dict(session.execute(select(Operation.raw_data_package_id, used).where(
        *here, Operation.raw_data_package_id.is_not(None)).group_by(Operation.raw_data_package_id)).all())
    by_dtp = dict(session.execute(select(Operation.data_transfer_package_id, used).where(
        *here, Operation.data_transfer_package_id.is_not(None)).group_by(Operation.data_transfer_package_id)).all())
    out: dict[int, dt.datetime] = {}
    for c in copies:
        op_time = by_raw.get(c.raw_data_package_id) if c.raw_data_package_id is not None else \
            by_dtp.get(c.data_transfer_package_id)
        out[c.id] = max(t for t in (c.created_at, c.verified_at, op_time) if t is not None)
    return out


def holds_artifact_bytes(ctx: "ProcessContext", location: str) -> bool:
    """Whether a copy recorded at ``location`` is its artifact's bytes (one object with the
    recorded size and sha256: a buffer or long-term-archive copy). A copy at a ``processing``
    location is not: it is a folder ``packhorse stage`` extracted the package into, a working
    copy the processing team may change. It is never a source of a package's bytes, never
    checked or repaired as one, and never counts for or against archiving, repairs, dead ends
    or deletions (I1; :mod:`packhorse.rules.staged_copies` checks staged folders)."""
    return ctx.topology.location_role.get(location) is not LocationRole.PROCESSING
