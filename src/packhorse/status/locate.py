"""Where is my file? Every version of a source path or package, its copies and its history.

:func:`locate` answers for ``packhorse locate``, ``GET /api/transfer/locate`` and the
dashboard's search box. The query is one of (tried in this order):

1. a raw data package or data transfer package name (``cam/obs1``, ``cam/obs1+2``,
   ``fyst-bundle-…``);
2. a registered source path: relative to its source location (``cam/obs1/a.dat``), prefixed
   with the location (``fyst-source:cam/obs1/a.dat``), or absolute under a source
   location's folder (``/data/fyst/source/cam/obs1/a.dat``, needs ``settings``);
3. a source folder (a group, ``cam/obs1``, or a folder above groups, ``cam``): the files
   registered under it (at most :data:`MAX_FILES`).

A *version* is one registered content of a path (one row of ``raw_data_files``, its
``version`` 1, 2, …: README "Versions"), newest last, each with the package that holds it
(``cam/obs1``, then ``cam/obs1+v2``, …); registrations taken out of their package before it
was built (the file changed or vanished meanwhile, ``withdrawn_files``) are listed too, with
``withdrawn`` set to the reason and no package. For a folder: each package built from it
(``cam/obs1``, ``cam/obs1+2``: files that appeared later, ``cam/obs1+v2``: new versions). For every
package involved: every physical copy with its location, status and when it was last verified,
and its **timeline** — registered, packaged, bundled, shipped, unpacked, archived, staged,
fixity checks, copies found corrupt or missing (by the scheduled fixity check, or by
``packhorse verify`` or a read-back), bad copies moved aside into the location's quarantine
(``quarantined``: where to, by which operation), repairs, deletions and failures — oldest first, from the operations and failure
events in the ops database (the single source of truth; nothing extra is recorded).

Error text (error type, message) of failures is included only with ``include_errors`` (an
admin, or the command line); an observer sees *that* an attempt failed, never why (the same
rule as the overview, :mod:`packhorse.status.overview`). Times are ISO 8601 UTC; sizes bytes.
"""

from __future__ import annotations

import datetime as dt
import os
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from packhorse.db.models import (
    AuditEntry,
    DataLocation,
    DataTransferPackage,
    FailureEvent,
    Operation,
    PhysicalCopy,
    RawDataFile,
    RawDataPackage,
    Site,
    SkippedFile,
    WithdrawnFile,
)
from packhorse.domain import DONE_WORD, CopyStatus, LocationRole, OperationKind, Status
from packhorse.errors import LocateQueryError
from packhorse.managers.source_audit import FOUND_BY as SOURCE_AUDIT
from packhorse.managers.source_audit import REASON as SOURCE_AUDIT_REASON
from packhorse.operations.attempts import claim_words, failure_words
from packhorse.rules.fixity import is_repair
from packhorse.runtime import audit
from packhorse.time_text import utc_text

if TYPE_CHECKING:
    from packhorse.config import Settings

#: At most this many files (versions of a folder query, or files of a package) are listed.
MAX_FILES = 200
#: At most this many packages are described (a folder split into many parts).
MAX_PACKAGES = 50

#: The timeline word of a completed operation of each kind (:data:`packhorse.domain.DONE_WORD`).
DONE_EVENT = {k.value: w for k, w in DONE_WORD.items()}


def _iso(t: dt.datetime | None) -> str | None:
    return t.isoformat() if t else None


def source_candidates(session: Session, query: str, settings: Settings | None) -> list[tuple[int, str]]:
    """``[(source location id, relative path)]`` a path the operator gave may name: ``LOCATION:PATH``,
    an absolute path under a source location's root, or a path relative to any source location."""
    sources = session.execute(select(DataLocation.id, DataLocation.name).where(
        DataLocation.role == LocationRole.SOURCE.value)).all()
    out: list[tuple[int, str]] = []
    for loc_id, name in sources:
        if query.startswith(name + ":"):
            out.append((loc_id, query[len(name) + 1:].lstrip("/")))
            continue
        if os.path.isabs(query) and settings is not None:
            try:
                root = str(settings.location_path(name))
            except (KeyError, AssertionError):
                continue
            if query.startswith(root.rstrip("/") + "/"):
                out.append((loc_id, query[len(root.rstrip("/")) + 1:]))
            continue
        out.append((loc_id, query.strip("/")))
    return out


def _file_dict(f: RawDataFile, loc_name: str, pkg_name: str | None) -> dict[str, Any]:
    return {"location": loc_name, "path": f.relative_path, "version": f.version, "size": f.size,
            "sha256": f.sha256, "mtime": dt.datetime.fromtimestamp(f.mtime_ns / 1e9, dt.timezone.utc).isoformat(),
            "registered_at": _iso(f.registered_at), "source_deleted_at": _iso(f.source_deleted_at),
            "package": pkg_name, "withdrawn": None, "found_by": f.found_by,
            "why": SOURCE_AUDIT_REASON if f.found_by == SOURCE_AUDIT else None}


def _withdrawn_dict(w: WithdrawnFile, loc_name: str) -> dict[str, Any]:
    """A registration taken out of its package before it was built: as a version, no package."""
    return {"location": loc_name, "path": w.relative_path, "version": w.version, "size": w.size,
            "sha256": w.sha256, "mtime": dt.datetime.fromtimestamp(w.mtime_ns / 1e9, dt.timezone.utc).isoformat(),
            "registered_at": _iso(w.registered_at), "source_deleted_at": None, "package": None,
            "found_by": None, "why": None,
            "withdrawn": f"{w.cause} at {utc_text(w.withdrawn_at)} UTC: {w.reason}" + (
                f"; forgotten at {utc_text(w.forgotten_at)} UTC by {w.forgotten_by}: {w.forgotten_reason}"
                if w.forgotten_at else "")}


def _skipped_dict(k: SkippedFile, loc_name: str, include_errors: bool) -> dict[str, Any]:
    # the reason may hold an OS error's text: an observer sees that it was skipped, not why
    reason = k.reason if include_errors else "skipped by the scan (an admin sees why)"
    return {"location": loc_name, "path": k.relative_path, "reason": reason,
            "first_seen_at": _iso(k.first_seen_at), "last_seen_at": _iso(k.last_seen_at)}


def _copies(session: Session, col: Any, art_id: int) -> list[dict[str, Any]]:
    rows = session.execute(
        select(PhysicalCopy, DataLocation.name, DataLocation.role, Site.name)
        .join(DataLocation, DataLocation.id == PhysicalCopy.location_id).join(Site, Site.id == DataLocation.site_id)
        .where(col == art_id).order_by(PhysicalCopy.id)).all()
    return [{"artifact": "data_transfer_package" if c.data_transfer_package_id else "raw_data_package",
             "location": loc, "site": site, "role": role, "status": c.status, "path": c.path, "size": c.size,
             "sha256": c.sha256, "created_at": _iso(c.created_at), "verified_at": _iso(c.verified_at),
             "deleted_at": _iso(c.deleted_at), "found_bad_at": _iso(c.found_bad_at),
             "quarantined_as": c.quarantined_as, "quarantined_at": _iso(c.quarantined_at)}
            for c, loc, role, site in rows]


def _copy_locations(session: Session, cond: Any) -> dict[int, tuple[int, bool]]:
    """``{copy id: (location id, is a bundle's copy)}`` of the copies matching ``cond``."""
    return {cid: (loc, dtp is not None) for cid, loc, dtp in session.execute(
        select(PhysicalCopy.id, PhysicalCopy.location_id, PhysicalCopy.data_transfer_package_id).where(cond))}


def _timeline(session: Session, ops: list[Operation], locs: dict[int, str], copy_loc: dict[int, tuple[int, bool]],
              include_errors: bool, first: tuple[str, dt.datetime | None, str | None] | None,
              archived_at: dt.datetime | None) -> list[dict[str, Any]]:
    """Events oldest first: ``[{"at", "event", "kind", "operation_id", "status", "location",
    "detail", "error_type", "message"}]``."""
    events: list[dict[str, Any]] = []

    def add(at: dt.datetime | None, event: str, op: Operation | None = None, location: str | None = None,
            detail: str | None = None, error_type: str | None = None, message: str | None = None) -> None:
        events.append({"at": _iso(at), "event": event, "kind": op.kind if op else None,
                       "operation_id": op.id if op else None, "status": op.status if op else None,
                       "location": location, "detail": detail, "error_type": error_type, "message": message})

    if first is not None:
        add(first[1], "registered", location=first[2], detail=first[0])
    for op in ops:
        loc_id = op.destination_location_id or op.source_location_id
        what = None
        if op.physical_copy_id in copy_loc:
            loc_id, bundle_copy = copy_loc[op.physical_copy_id]
            what = "the bundle's copy" if bundle_copy else "the package's copy"
        loc = locs.get(loc_id) if loc_id else None
        word = DONE_EVENT[op.kind]
        if op.kind == OperationKind.FIXITY_CHECK.value and is_repair(op.dedup_key):
            word = "repaired"
        if op.status == Status.COMPLETED.value:
            add(op.finished_at, word, op, loc,
                detail=(f"{what}, " if what else "") + claim_words(op.attempt, op.retry_count))
        elif op.status == Status.FAILED.value:
            add(op.updated_at, f"{op.kind} failed", op, loc, detail=f"gave up after {op.retry_count} retries")
        else:
            add(op.created_at, f"{op.kind} {op.status.lower().replace('_', ' ')}", op, loc)
    if ops:
        by_id = {op.id: op for op in ops}
        for e in session.scalars(select(FailureEvent).where(FailureEvent.operation_id.in_(list(by_id)))
                                 .order_by(FailureEvent.id)):
            op = by_id[e.operation_id]
            loc_id = op.destination_location_id or op.source_location_id
            add(e.created_at, "attempt failed", op, locs.get(loc_id) if loc_id else None,
                detail=failure_words(e.attempt, e.retry_count) + (", will retry" if e.will_retry else ", gave up"),
                error_type=e.error_type if include_errors else None, message=e.message if include_errors else None)
    # detections: a copy the fixity audit, `packhorse verify` or a read-back found bad (the
    # repair that followed is an operation above; the detection is only on the copy's row)
    fixity_done = [op for op in ops if op.kind == OperationKind.FIXITY_CHECK.value
                   and not is_repair(op.dedup_key) and op.finished_at is not None]
    for c in (session.scalars(select(PhysicalCopy).where(PhysicalCopy.id.in_(list(copy_loc)),
                                                         PhysicalCopy.found_bad_at.is_not(None))
                              .order_by(PhysicalCopy.found_bad_at)) if copy_loc else []):
        loc_id, bundle_copy = copy_loc[c.id]
        what = "the bundle's copy" if bundle_copy else "the package's copy"
        # `packhorse verify` leaves an audit entry in the transaction that marked the copy: the
        # operator's audit found it, even when a scheduled check of the copy finished right after
        verified = session.scalar(select(AuditEntry.at).where(
            AuditEntry.action == audit.COPY_FOUND_BAD, AuditEntry.target == audit.copy_target(c.id),
            AuditEntry.at >= c.found_bad_at - dt.timedelta(seconds=60),
            AuditEntry.at <= c.found_bad_at + dt.timedelta(seconds=60)).limit(1)) is not None
        by = None if verified else next((op for op in fixity_done if op.physical_copy_id == c.id
                                         and abs((op.finished_at - c.found_bad_at).total_seconds()) < 60), None)
        word = f"found {c.status}" if c.status in (CopyStatus.CORRUPT.value, CopyStatus.MISSING.value) else "found bad"
        add(c.found_bad_at, word, by, locs.get(loc_id),
            detail=f"{what} ({c.path}), by " + ("`packhorse verify` (the operator's audit)" if verified else
                                                "the scheduled fixity check" if by else
                                                "packhorse verify or a read-back") + f"; now {c.status}")
        # the copy that replaced it at the same location (a repair inside the fixity check writes
        # it without an operation of its own): "repaired", unless a repair operation says so
        new = session.scalars(select(PhysicalCopy).where(
            PhysicalCopy.location_id == loc_id, PhysicalCopy.id != c.id, PhysicalCopy.created_at >= c.found_bad_at,
            PhysicalCopy.raw_data_package_id.is_(c.raw_data_package_id) if c.raw_data_package_id is None
            else PhysicalCopy.raw_data_package_id == c.raw_data_package_id,
            PhysicalCopy.data_transfer_package_id.is_(None) if c.data_transfer_package_id is None
            else PhysicalCopy.data_transfer_package_id == c.data_transfer_package_id)
            .order_by(PhysicalCopy.created_at).limit(1)).first()
        said = any(e["event"] == "repaired" and e["location"] == locs.get(loc_id) and e["at"] is not None
                   and new is not None and abs((dt.datetime.fromisoformat(e["at"]) - new.created_at).total_seconds()) < 120
                   for e in events)
        if new is not None and not said:
            add(new.created_at, "repaired", None, locs.get(loc_id),
                detail=f"{what} rewritten from a verified copy ({new.path}); now {new.status}")
    # quarantines: the bad copy's bytes moved aside (never deleted, I2) by the repair that
    # replaced it, or by the read-back that found them rotted; the key says where they are
    for c in (session.scalars(select(PhysicalCopy).where(PhysicalCopy.id.in_(list(copy_loc)),
                                                         PhysicalCopy.quarantined_at.is_not(None))
                              .order_by(PhysicalCopy.quarantined_at)) if copy_loc else []):
        loc_id, bundle_copy = copy_loc[c.id]
        what = "the bundle's copy" if bundle_copy else "the package's copy"
        at = c.quarantined_at
        running = [op for op in ops if op.created_at <= at and (op.finished_at is None or op.finished_at >= at)]
        # the copy's own repair; else the work that wrote the key again at that location, or
        # that read the copy from there and found it rotted
        by = (next((op for op in running if op.physical_copy_id == c.id), None)
              or next((op for op in running if op.destination_location_id == loc_id), None)
              or next((op for op in running if op.source_location_id == loc_id), None))
        who = f"by {by.kind} operation {by.id}" if by else "before the copy was written again"
        add(at, "quarantined", by, locs.get(loc_id),
            detail=f"{what} ({c.path}) moved aside to {c.quarantined_as}, {who}")
    if archived_at is not None:
        add(archived_at, "archived everywhere", detail="every archive location of every destination holds a verified copy")
    events.sort(key=lambda x: (x["at"] or "", x["operation_id"] or 0))
    return events


def _raw_package(session: Session, pkg: RawDataPackage, locs: dict[int, str], include_errors: bool,
                 files_listed: bool) -> dict[str, Any]:
    copy_ids = select(PhysicalCopy.id).where(PhysicalCopy.raw_data_package_id == pkg.id)
    cond = or_(Operation.raw_data_package_id == pkg.id, Operation.physical_copy_id.in_(copy_ids))
    bundle = session.get(DataTransferPackage, pkg.data_transfer_package_id) if pkg.data_transfer_package_id else None
    if bundle is not None:  # the bundle's own operations: bundled, shipped, unpacked, its deletions
        bundle_copies = select(PhysicalCopy.id).where(PhysicalCopy.data_transfer_package_id == bundle.id)
        cond = or_(cond, (Operation.data_transfer_package_id == bundle.id) & Operation.raw_data_package_id.is_(None),
                   Operation.physical_copy_id.in_(bundle_copies))
    ops = list(session.scalars(select(Operation).where(cond).order_by(Operation.id)))
    copy_loc = _copy_locations(session, or_(PhysicalCopy.raw_data_package_id == pkg.id,
                                            PhysicalCopy.data_transfer_package_id == (bundle.id if bundle else -1)))
    reg = session.execute(select(func.min(RawDataFile.registered_at), func.max(RawDataFile.registered_at),
                                 func.count()).where(RawDataFile.raw_data_package_id == pkg.id)).one()
    first = (f"{reg[2]} file(s), the last at {utc_text(reg[1])} UTC", reg[0], locs.get(pkg.source_location_id)) if reg[2] else None
    out: dict[str, Any] = {
        "name": pkg.name, "type": "raw_data_package", "version": pkg.version, "group": pkg.group_path,
        "size": pkg.size,
        "sha256": pkg.sha256, "file_count": pkg.file_count, "payload_bytes": pkg.payload_bytes,
        "created_at": _iso(pkg.created_at), "archived_at": _iso(pkg.archived_at),
        "bundle": bundle.name if bundle else None,
        "copies": _copies(session, PhysicalCopy.raw_data_package_id, pkg.id),
        "bundle_copies": _copies(session, PhysicalCopy.data_transfer_package_id, bundle.id) if bundle else [],
        "timeline": _timeline(session, ops, locs, copy_loc, include_errors, first, pkg.archived_at),
        "files": [],
    }
    if files_listed:
        out["files"] = [_file_dict(f, locs[f.location_id], pkg.name) for f in session.scalars(
            select(RawDataFile).where(RawDataFile.raw_data_package_id == pkg.id)
            .order_by(RawDataFile.relative_path).limit(MAX_FILES))]
    return out


def _bundle(session: Session, dtp: DataTransferPackage, locs: dict[int, str], include_errors: bool) -> dict[str, Any]:
    copy_ids = select(PhysicalCopy.id).where(PhysicalCopy.data_transfer_package_id == dtp.id)
    ops = list(session.scalars(select(Operation).where(or_(
        (Operation.data_transfer_package_id == dtp.id) & Operation.raw_data_package_id.is_(None),
        Operation.physical_copy_id.in_(copy_ids))).order_by(Operation.id)))
    copy_loc = _copy_locations(session, PhysicalCopy.data_transfer_package_id == dtp.id)
    members = list(session.scalars(select(RawDataPackage.name).where(RawDataPackage.data_transfer_package_id == dtp.id)
                                   .order_by(RawDataPackage.name).limit(MAX_FILES)))
    return {"name": dtp.name, "type": "data_transfer_package", "version": None, "group": None, "size": dtp.size, "sha256": dtp.sha256,
            "file_count": dtp.package_count, "payload_bytes": None, "created_at": _iso(dtp.created_at),
            "archived_at": None, "bundle": None, "members": members,
            "copies": _copies(session, PhysicalCopy.data_transfer_package_id, dtp.id), "bundle_copies": [],
            "timeline": _timeline(session, ops, locs, copy_loc, include_errors, None, None), "files": []}


def locate(session: Session, query: str, *, include_errors: bool = False,
           settings: Settings | None = None) -> dict[str, Any]:
    """Every version of what ``query`` names, with its packages, copies and history.

    Args:
        query: a package name, a source path (relative, ``location:path`` or absolute) or a
            source folder (see the module docstring).
        include_errors: include failures' error type and message (admins, the CLI).
        settings: needed to resolve an absolute path against the source locations' folders.

    Returns:
        ``{"query", "matched": "package" | "bundle" | "file" | "folder" | None,
        ("also_folder": bool, for a package: its name is also a folder holding other groups,
        which ``QUERY/`` lists),
        "versions": [{"location", "path", "version", "size", "sha256", "mtime", "registered_at",
        "source_deleted_at", "package", "withdrawn", "found_by", "why"}]`` (``found_by``:
        ``"source_audit"`` for a version the source audit registered, ``None``: the scan;
        ``why``: the reason such a version exists), ``"packages": [{"name", "type", "version", "group", "size",
        "sha256", "file_count", "payload_bytes", "created_at", "archived_at", "bundle",
        "copies": [{"artifact", "location", "site", "role", "status", "path", "size", "sha256",
        "created_at", "verified_at", "deleted_at", "found_bad_at", "quarantined_as",
        "quarantined_at"}], "bundle_copies": [...], "timeline":
        [{"at", "event", "kind", "operation_id", "status", "location", "detail",
        "error_type", "message"}], "files": [...]} (+ "members" for a bundle)],
        "truncated": bool, "skipped": [{"location", "path", "reason", "first_seen_at",
        "last_seen_at"}]}``; ``matched`` is ``None`` when nothing matched (empty lists), and
        ``"skipped"`` when the path is only one the scan could not register (a symlink, a
        special file, an unreadable one: ``status --skipped``): never archived, with the reason.
        ``skipped`` also lists a registered path that is skipped now (it became a symlink).

    Raises:
        LocateQueryError: ``query`` is empty or longer than 4096 characters.
    """
    q = query.strip()
    if not q or len(q) > 4096:
        raise LocateQueryError("give a source path or a package name of 1 to 4096 characters")
    locs = dict(session.execute(select(DataLocation.id, DataLocation.name)).all())
    out: dict[str, Any] = {"query": q, "matched": None, "versions": [], "packages": [], "truncated": False,
                           "skipped": []}

    pkg = session.scalars(select(RawDataPackage).where(RawDataPackage.name == q)).first()
    if pkg is not None:
        out["matched"] = "package"
        siblings = list(session.scalars(select(RawDataPackage).where(RawDataPackage.group_path == pkg.group_path,
                                                                     RawDataPackage.id != pkg.id)
                                        .order_by(RawDataPackage.id).limit(MAX_PACKAGES)))
        out["packages"] = [_raw_package(session, pkg, locs, include_errors, files_listed=True)]
        out["packages"] += [_raw_package(session, p, locs, include_errors, files_listed=False) for p in siblings]
        out["versions"] = out["packages"][0]["files"]
        # the name is also a folder holding other groups (package "chai" of the file chai/notes.txt
        # and the groups chai/obs_0001, …): say so, `locate chai/` lists those
        rel = q.rstrip("/")
        out["also_folder"] = session.scalar(select(RawDataFile.id).where(
            RawDataFile.location_id == pkg.source_location_id,  # the (location_id, group_path) index
            RawDataFile.group_path > rel + "/", RawDataFile.group_path < rel + "0").limit(1)) is not None
        return out
    dtp = session.scalars(select(DataTransferPackage).where(DataTransferPackage.name == q)).first()
    if dtp is not None:
        out["matched"] = "bundle"
        out["packages"] = [_bundle(session, dtp, locs, include_errors)]
        return out

    files: list[RawDataFile] = []
    withdrawn: list[WithdrawnFile] = []
    for loc_id, rel in source_candidates(session, q, settings):
        files += list(session.scalars(select(RawDataFile).where(RawDataFile.location_id == loc_id,
                                                                RawDataFile.relative_path == rel)
                                      .order_by(RawDataFile.version)))
        withdrawn += list(session.scalars(select(WithdrawnFile).where(WithdrawnFile.location_id == loc_id,
                                                                      WithdrawnFile.relative_path == rel)
                                          .order_by(WithdrawnFile.id)))
    for loc_id, rel in source_candidates(session, q, settings):
        out["skipped"] += [_skipped_dict(k, locs[k.location_id], include_errors) for k in session.scalars(
            select(SkippedFile).where(SkippedFile.location_id == loc_id, SkippedFile.relative_path == rel))]
    matched = "file"
    if not files and not withdrawn and out["skipped"]:
        out["matched"] = "skipped"
        return out
    if not files and withdrawn:
        out["matched"] = matched
        out["versions"] = [_withdrawn_dict(w, locs[w.location_id]) for w in withdrawn]
        return out
    if not files:
        for loc_id, rel in source_candidates(session, q, settings):
            rel = rel.rstrip("/")
            # the group itself, or every group under the folder: a range on the
            # (location_id, group_path) index ('0' sorts right after '/'), not LIKE, which
            # would take '_' and '%' in names for wildcards
            under = (RawDataFile.group_path > rel + "/") & (RawDataFile.group_path < rel + "0")
            files += list(session.scalars(select(RawDataFile).where(
                RawDataFile.location_id == loc_id, (RawDataFile.group_path == rel) | under)
                .order_by(RawDataFile.relative_path).limit(MAX_FILES + 1)))
        matched = "folder"
    if not files:
        return out
    out["matched"] = matched
    out["truncated"] = len(files) > MAX_FILES
    files = files[:MAX_FILES]
    pkg_ids = sorted({f.raw_data_package_id for f in files if f.raw_data_package_id is not None})
    pkgs = {p.id: p for p in session.scalars(select(RawDataPackage).where(RawDataPackage.id.in_(pkg_ids)))}
    out["versions"] = [_file_dict(f, locs[f.location_id], pkgs[f.raw_data_package_id].name
                                  if f.raw_data_package_id in pkgs else None) for f in files]
    # a withdrawn registration sits before the registration that replaced it (same version)
    for w in withdrawn:
        at = next((i for i, v in enumerate(out["versions"])
                   if v["location"] == locs[w.location_id] and v["version"] >= w.version), len(out["versions"]))
        out["versions"].insert(at, _withdrawn_dict(w, locs[w.location_id]))
    out["truncated"] = out["truncated"] or len(pkg_ids) > MAX_PACKAGES
    out["packages"] = [_raw_package(session, pkgs[i], locs, include_errors, files_listed=False)
                       for i in pkg_ids[:MAX_PACKAGES]]
    return out
