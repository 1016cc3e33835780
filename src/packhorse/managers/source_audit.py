"""The source audit: re-hash the registered files still at a source location.

The scan sees a change by a file's size or mtime (as rsync does without ``--checksum``), so a
rewrite that keeps both (an in-place edit followed by ``touch -r``) is never noticed once the
file is packaged (README "Versions"). The source audit reads every registered file that is still
there and whose size and mtime are still the registered ones, and compares its sha256 with the
registration's — the fixity check of a source location:

* the same bytes: nothing to do;
* other bytes behind an unchanged size and mtime: registered exactly as the scan registers a
  changed file (:func:`packhorse.managers.scan.plan_changes`): its package built → a new
  ``version`` (``found_by = "source_audit"``, :data:`FOUND_BY`; archived in a package
  ``<group>+v<N>`` by the usual managers; the earlier version stays archived, written once);
  not packaged yet → the new bytes in place of the registration; in a package planned but not
  built → left to the ``raw_data_package`` stage, which hashes every file it packs and takes it
  out. ``packhorse locate PATH`` shows the new version and why (:data:`REASON`);
* a different size or mtime: left to the scan, which registers it (not hashed here);
* gone (deleted on purpose, moved): reported, never an error; files packhorse deleted itself
  (``delete_source_files``) are not looked for.

A *pass* audits every registration of the location in path order. ``packhorse verify
--location SOURCE`` makes one whole pass now; ``packhorse run`` (and the distributed scan task)
makes passes every ``source_audit_interval_seconds`` of the location (off by default), a slice
of at most :func:`slice_seconds` after each scan, going on from the path it reached
(``source_audits.cursor``). Reads keep to the location's ``fixity_bytes_per_second`` (the
storage stack's read-rate layer: ``ctx.backend(location, fixity=True)``). Every pass is kept in
:class:`~packhorse.db.models.SourceAudit` (``packhorse status``). No transaction is open while
a file is read.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from packhorse.db.models import RawDataFile, RawDataPackage, SourceAudit, utcnow
from packhorse.db.session import insert_ignoring_conflicts
from packhorse.domain import LocationRole
from packhorse.errors import UnsafePathError
from packhorse.rules.availability import look, record_outage
from packhorse.runtime.context import ProcessContext
from packhorse.storage.base import Entry, EntryKind, StorageBackend

log = structlog.get_logger(__name__)

#: ``raw_data_files.found_by`` of a version the source audit registered
FOUND_BY = "source_audit"
#: why such a version exists (``packhorse locate``)
REASON = "content changed behind an unchanged size and mtime (found by the source audit)"
#: registrations read from the database at a time
BATCH = 500

#: ``hasher(backend, path, entry) -> ("ok", sha256) | ("changed", None) | ("error", reason)``:
#: :func:`packhorse.managers.scan.hash_source`, passed in (the scan calls this module)
Hasher = Callable[[StorageBackend, str, Entry], tuple[str, str | None]]


@dataclass
class AuditResult:
    """What one call of :func:`audit_source` did at one source location.

    Attributes:
        location: the source data location.
        checked: files hashed (bytes read: ``bytes_checked``).
        changed: ``[{"path", "version", "registered_sha256", "sha256", "action"}]``: files
            whose bytes differ behind an unchanged size and mtime; ``action``: ``"version"``
            (registered as version ``version``), ``"update"`` (registered in place: not
            packaged yet) or ``"left_to_package_stage"``.
        gone: paths registered and no longer there.
        left_to_scan: paths whose size or mtime differ (the scan registers them).
        unreadable: ``[{"path", "reason"}]``.
        unavailable: why the location could not be audited (root or identity marker missing),
            else ``None``: nothing was judged then.
        completed: the pass reached the end of the location (``False``: a slice ran out of time).
    """

    location: str
    checked: int = 0
    bytes_checked: int = 0
    changed: list[dict[str, Any]] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    left_to_scan: list[str] = field(default_factory=list)
    unreadable: list[dict[str, str]] = field(default_factory=list)
    unavailable: str | None = None
    completed: bool = False

    def as_json(self) -> dict[str, Any]:
        """The result as plain data (keys as the attributes)."""
        return {"location": self.location, "checked": self.checked, "bytes_checked": self.bytes_checked,
                "changed": self.changed, "gone": self.gone, "left_to_scan": self.left_to_scan,
                "unreadable": self.unreadable, "unavailable": self.unavailable, "completed": self.completed}


def slice_seconds(ctx: ProcessContext) -> float:
    """How long the audit slice after one scan may read: the managers' poll interval, between
    1 and 30 seconds."""
    return min(30.0, max(1.0, ctx.settings.managers.poll_interval_seconds))


def is_due(row: SourceAudit | None, interval_seconds: float, now: dt.datetime) -> bool:
    """Whether a pass should run (or go on) now: the location was never audited (``row``
    ``None``), a pass is under way (``cursor`` set), or the last one completed
    ``interval_seconds`` ago or more (``now``: UTC)."""
    if row is None or row.completed_at is None:
        return True
    return (now - row.completed_at).total_seconds() >= interval_seconds


def audit_due(ctx: ProcessContext, location: str, hasher: Hasher) -> AuditResult | None:
    """The scheduled slice after a scan: audit ``location`` for at most :func:`slice_seconds`
    when its pass is due (``source_audit_interval_seconds`` of the location; off when unset),
    else nothing. Returns the slice's result, or ``None`` when nothing was due."""
    loc = ctx.settings.location(location)
    interval = loc.source_audit_interval_seconds
    if interval is None or loc.role is not LocationRole.SOURCE:
        return None
    now = utcnow()
    if not ctx.db.read(lambda s: is_due(s.get(SourceAudit, location), interval, now)):
        return None
    return audit_source(ctx, location, hasher, budget_seconds=slice_seconds(ctx))


def audit_source(ctx: ProcessContext, location: str, hasher: Hasher, *,
                 budget_seconds: float | None = None) -> AuditResult:
    """Audit source location ``location``: a whole pass from its first path (``budget_seconds``
    ``None``: ``packhorse verify --location``), or a slice of the pass under way that stops
    after ``budget_seconds`` of reading and records the path it reached. Files are read through
    ``ctx.backend(location, fixity=True)`` (confined, ``O_NOFOLLOW``, at the location's
    ``fixity_bytes_per_second``) and hashed by ``hasher``.

    An unavailable location (:func:`packhorse.rules.availability.look`) is not judged: its
    outage is recorded and ``unavailable`` says why.

    Raises:
        KeyError: ``location`` is not configured.
        ValueError: ``location`` is not a source location.
    """
    loc = ctx.settings.location(location)
    if loc.role is not LocationRole.SOURCE:
        raise ValueError(f"{location} is a {loc.role.value} location, not a source location")
    result = AuditResult(location)
    err = look(ctx, location)
    if err is not None:
        record_outage(ctx, err)
        result.unavailable = str(err)
        return result
    loc_id = ctx.topology.location_ids[location]
    backend = ctx.backend(location, fixity=True)
    start = time.monotonic()
    now = utcnow()

    def begin(s: Session) -> str:
        row = s.get(SourceAudit, location)
        if row is None:
            row = SourceAudit(location=location, changed_total=0)
            s.add(row)
        if budget_seconds is not None and row.cursor is not None and row.completed_at is None:
            return row.cursor  # the pass under way goes on
        row.started_at, row.completed_at, row.cursor = now, None, ""
        row.files_checked, row.bytes_checked, row.changed, row.gone = 0, 0, 0, 0
        return ""

    cursor = ctx.db.transact(begin)
    while True:
        rows = ctx.db.read(lambda s: _latest_after(s, loc_id, cursor))
        if not rows:
            result.completed = True
            break
        for r in rows:
            _audit_one(ctx, backend, hasher, loc_id, r, result)
            cursor = r.relative_path
            if budget_seconds is not None and time.monotonic() - start >= budget_seconds:
                break
        else:
            continue
        break
    _record(ctx, location, result, None if result.completed else cursor)
    if result.changed or result.gone:
        log.warning("source_audit_found", location=location, changed=len(result.changed), gone=len(result.gone),
                    checked=result.checked)
    return result


def _latest_after(s: Session, loc_id: int, cursor: str) -> list[Any]:
    """The next :data:`BATCH` latest registrations of location ``loc_id`` after path ``cursor``
    (code-point order as the database sorts it), not deleted by packhorse, with their package's
    state."""
    latest = (select(RawDataFile.relative_path, func.max(RawDataFile.version).label("version"))
              .where(RawDataFile.location_id == loc_id, RawDataFile.relative_path > cursor)
              .group_by(RawDataFile.relative_path).order_by(RawDataFile.relative_path).limit(BATCH).subquery())
    q = (select(RawDataFile.id, RawDataFile.relative_path, RawDataFile.group_path, RawDataFile.version,
                RawDataFile.size, RawDataFile.mtime_ns, RawDataFile.confirmed_mtime_ns, RawDataFile.sha256,
                RawDataFile.raw_data_package_id, RawDataFile.source_deleted_at,
                RawDataPackage.sha256.label("package_sha256"))
         .join(latest, (latest.c.relative_path == RawDataFile.relative_path) & (latest.c.version == RawDataFile.version))
         .outerjoin(RawDataPackage, RawDataPackage.id == RawDataFile.raw_data_package_id)
         .where(RawDataFile.location_id == loc_id).order_by(RawDataFile.relative_path))
    return list(s.execute(q))


def _audit_one(ctx: ProcessContext, backend: StorageBackend, hasher: Hasher, loc_id: int, r: Any,
               result: AuditResult) -> None:
    if r.source_deleted_at is not None:
        return  # packhorse deleted it (delete_source_files): not looked for
    path = r.relative_path
    try:
        info = backend.stat(path)
    except (OSError, UnsafePathError) as e:
        result.unreadable.append({"path": path, "reason": str(e)})
        return
    if info is None:
        result.gone.append(path)
        return
    mtime_ns = info.mtime_ns if info.mtime_ns is not None else int(info.mtime * 1e9)
    if (info.size, mtime_ns) != (r.size, r.confirmed_mtime_ns or r.mtime_ns):
        result.left_to_scan.append(path)
        return
    state, value = hasher(backend, path, Entry(path, EntryKind.FILE, info.size, mtime_ns))
    if state == "changed":
        result.left_to_scan.append(path)  # written to while read: the scan sees it
        return
    if state != "ok" or value is None:
        result.unreadable.append({"path": path, "reason": str(value)})
        return
    result.checked += 1
    result.bytes_checked += info.size
    if value == r.sha256:
        return
    found = {"path": path, "version": r.version, "registered_sha256": r.sha256, "sha256": value}
    if r.raw_data_package_id is not None and r.package_sha256 is None:
        result.changed.append({**found, "action": "left_to_package_stage"})
        return
    stamp = utcnow()
    if r.raw_data_package_id is None:
        def in_place(s: Session) -> bool:
            t = RawDataFile.__table__
            res = s.execute(update(t).where(t.c.id == r.id, t.c.raw_data_package_id.is_(None), t.c.sha256 == r.sha256)
                            .values(sha256=value, mtime_ns=mtime_ns, confirmed_mtime_ns=None, registered_at=stamp,
                                    found_by=FOUND_BY))
            return bool(res.rowcount)

        if ctx.db.transact(in_place):
            result.changed.append({**found, "action": "update"})
        return

    def new_version(s: Session) -> None:
        t = RawDataFile.__table__
        s.execute(insert_ignoring_conflicts(s, t, t.c.location_id, t.c.relative_path, t.c.version),
                  [dict(location_id=loc_id, relative_path=path, group_path=r.group_path, size=info.size,
                        sha256=value, mtime_ns=mtime_ns, version=r.version + 1, registered_at=stamp,
                        found_by=FOUND_BY)])

    ctx.db.transact(new_version)
    log.warning("source_content_changed", location=ctx.location_name(loc_id), path=path, version=r.version + 1,
                registered_sha256=r.sha256, sha256=value)
    result.changed.append({**found, "version": r.version + 1, "action": "version"})


def _record(ctx: ProcessContext, location: str, result: AuditResult, cursor: str | None) -> None:
    """Add the slice's counts to the pass of ``location``; ``cursor`` ``None``: the pass completed."""
    def tx(s: Session) -> None:
        row = s.get(SourceAudit, location)
        assert row is not None
        row.files_checked += result.checked
        row.bytes_checked += result.bytes_checked
        found = sum(1 for c in result.changed if c["action"] != "left_to_package_stage")
        row.changed += found
        row.changed_total += found
        row.gone += len(result.gone)
        row.cursor = cursor
        if cursor is None:
            row.completed_at = utcnow()

    ctx.db.transact(tx)


def audit_summaries(s: Session) -> dict[str, dict[str, Any]]:
    """Every source location's audit, by name: ``{"started_at", "completed_at"`` (ISO 8601 UTC;
    ``completed_at`` ``None`` while a pass runs), ``"files_checked", "bytes_checked"`` (bytes),
    ``"changed", "gone"`` (of that pass), ``"changed_total"}`` (read-only; ``packhorse status``)."""
    return {a.location: {"started_at": a.started_at.isoformat() if a.started_at else None,
                         "completed_at": a.completed_at.isoformat() if a.completed_at else None,
                         "files_checked": a.files_checked, "bytes_checked": a.bytes_checked, "changed": a.changed,
                         "gone": a.gone, "changed_total": a.changed_total}
            for a in s.scalars(select(SourceAudit).order_by(SourceAudit.location))}
