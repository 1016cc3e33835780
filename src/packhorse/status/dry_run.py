"""What ``packhorse run`` would do now, found without doing any of it (``run --dry-run``).

Read-only: source locations are listed, the ops database is only read, and when it does not
exist yet it is not created (every settled file is then new). A registered file whose size or
mtime differs now is decided as the scan decides it
(:func:`~packhorse.managers.scan.look_at_change`: hashed, read only, when its size is the
same), so a ``touch`` is no new version here either. Nothing is written to any data location,
no file is registered, no operation is created. The plan is what the next run would start
with, in pipeline order:

* ``register``: per source location, the settled files not registered yet that its
  ``include`` / ``exclude`` patterns accept, and the registered ones the scan would register
  again (not packaged yet and modified: in place; packaged and new bytes: a new ``version``);
  files still settling; paths that would be skipped. Asked for (``run --dry-run -v``), also
  every file listed with its decision (``decisions``: registered and into which package, left
  out by which pattern, skipped and why, settling, unchanged).
* ``package``: the raw data packages those files and the registered, unpackaged ones would
  form (one per group and version, split at ``bags.packaging.max_package_bytes``; names as the
  package manager gives them: :func:`~packhorse.managers.packages.plan_group`).
* ``ship`` / ``archive``: per package, the destination sites' buffers and the long-term
  archives it would be written to (new packages, and registered ones not archived yet).
* ``delete``: buffer copies of archived packages that no deletion has been created for yet,
  with the time their retention ends (``now`` when it has). The deletion rules
  (``docs/deletion.md``) still decide at run time; a copy they would keep is listed with why.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import exists, select
from sqlalchemy.orm import Session

from packhorse.config import Settings
from packhorse.db.models import (
    DataLocation,
    Installation,
    Operation,
    PhysicalCopy,
    RawDataFile,
    RawDataPackage,
    utcnow,
)
from packhorse.domain import CopyStatus, LocationRole, StorageType
from packhorse.errors import LocationUnavailableError
from packhorse.managers.listing import registered_files
from packhorse.managers.packages import name_for as _name_for
from packhorse.managers.packages import names_taken, package_base, plan_group
from packhorse.managers.scan import (
    FUTURE_MTIME_TOLERANCE_SECONDS,
    Change,
    group_of,
    list_source,
    look_at_change,
    open_source,
    plan_changes,
)
from packhorse.storage.identity import check_fingerprint, check_identity, read_marker
from packhorse.storage.registry import backend_for


@dataclass
class _File:
    relative_path: str
    size: int
    version: int = 1


def _unpackaged(session: Session, location: str) -> list[tuple[str, str, int, int]]:
    q = (select(RawDataFile.relative_path, RawDataFile.group_path, RawDataFile.size, RawDataFile.version)
         .join(DataLocation, DataLocation.id == RawDataFile.location_id)
         .where(DataLocation.name == location, RawDataFile.raw_data_package_id.is_(None)))
    return [(r.relative_path, r.group_path, r.size, r.version) for r in session.execute(q)]


def _location_id(session: Session, location: str) -> int | None:
    return session.scalar(select(DataLocation.id).where(DataLocation.name == location))


def _destinations(settings: Settings, site: str) -> dict[str, Any]:
    route = settings.route_from(site)
    if route is None:
        return {"ship_to": [], "archive_at": []}
    return {"ship_to": [settings.buffer_of(d).name for d in route.destination_sites],
            "archive_at": [l.name for d in route.destination_sites
                           for l in settings.locations_at(d, LocationRole.LONG_TERM_ARCHIVE)]}


def plan_run(settings: Settings, db: Any | None, *, now: float | None = None,
             per_file: bool = False) -> dict[str, Any]:
    """The plan of the next run (see the module docstring) as a JSON-able dict:

    ``{"database": "existing" | "none yet", "register": [{"location", "files", "bytes",
    "settling", "skipped": [{"path", "reason"}], "unavailable": reason (only when the location
    is not there: the run would wait for it)}], "package": [{"name", "location", "files",
    "bytes", "ship_to": [location], "archive_at": [location]}], "continue": [{"name",
    "archive_at", "missing_at": [location]}], "delete": [{"location", "package", "path", "bytes",
    "when": ISO time or "now"}], "totals": {"files", "bytes", "packages", "shipments",
    "archive_copies", "deletions"}}``. Sizes are bytes. ``shipments`` counts packages times
    destination buffers: how the packages are bundled, hence how many transfers carry them, is
    decided at run time.

    With ``per_file`` each ``register`` entry also holds ``"decisions"``: every file of the
    listing, in path order, as ``{"path", "decision", "reason" (or null), "package" (or
    null)}``, the decision one of ``register`` (``package``: the raw data package it would go
    to), ``excluded`` (``reason``: the ``include`` / ``exclude`` pattern, :mod:`packhorse.scanfilter`),
    ``skipped`` (``reason``: a symlink, not a regular file, not readable, a name not allowed...),
    ``settling`` (modified too recently, or changing) and ``unchanged`` (registered already;
    ``package`` when it is not packaged yet and would be now).

    Args:
        db: the ops database (read only), or ``None`` when it does not exist yet.
        now: the time (epoch seconds) that decides which files are settled.
    """
    t = time.time() if now is None else now
    p = settings.packaging
    register, packages = [], []
    taken: dict[str, set[str]] = {}  # package names in use, by base name (package_base)
    for loc in settings.locations:
        if loc.role is not LocationRole.SOURCE or not loc.active or loc.storage is not StorageType.DISK:
            continue
        backend = backend_for(settings, loc.name)
        loc_id = db.read(lambda s: _location_id(s, loc.name)) if db is not None else None
        if loc_id is not None:
            # as the run looks before it scans: storage that is absent (or an empty folder
            # where it was) is not empty; the run would wait for it (exit 4), register nothing
            try:
                fingerprint = db.read(lambda s: s.scalar(
                    select(DataLocation.fingerprint).where(DataLocation.id == loc_id)))
                if fingerprint is not None and not backend.root_missing() and read_marker(backend) is None:
                    check_fingerprint(backend, loc.name, fingerprint)  # a read-only source: no marker there
                else:
                    check_identity(backend, loc.name, db.read(lambda s: s.scalar(
                        select(DataLocation.marker_uuid).where(DataLocation.id == loc_id))),
                        db.read(lambda s: s.scalar(select(Installation.uuid).where(Installation.id == 1))))
            except LocationUnavailableError as e:
                register.append({"location": loc.name, "files": 0, "bytes": 0, "settling": 0, "skipped": [],
                                 "unavailable": str(e)})
                continue
        left_out: list[tuple[str, str]] | None = [] if per_file else None
        found, skipped, _seen, _full = list_source(settings, loc.name, backend=backend, left_out=left_out)
        # the decision per file (per_file): path -> [decision, reason, version]
        decided: dict[str, list[Any]] = {}
        # the scan's own reading of the registrations (a touched file's confirmed mtime counts)
        known = db.read(lambda s: registered_files(s.connection(), loc_id)) if loc_id is not None else {}
        differs = [path for path, st_ in found
                   if (k := known.get(path)) is not None and k != (st_.size, st_.mtime_ns)]
        changes = plan_changes(db, loc_id, differs) if loc_id is not None else {}
        new: list[_File] = []
        settling = 0
        for path, st_ in found:
            change: Change | None = None
            if path in known:
                change = changes.get(path)
                if change is None:
                    decided[path] = ["unchanged", None, None]
                    continue  # unchanged (or registered again since it was listed)
            age = t - st_.mtime_ns / 1e9
            # as the scan decides it: a file from a clock ahead of ours settles by being seen
            # unchanged for settle_seconds (a run's first look), at once when that is 0
            ahead = age < -FUTURE_MTIME_TOLERANCE_SECONDS
            if (ahead and p.settle_seconds > 0) or (not ahead and age < p.settle_seconds):
                settling += 1
                decided[path] = ["settling", f"modified {max(age, 0):.0f} s ago; settled after "
                                 f"{p.settle_seconds:g} s unchanged", None]
                continue
            if change is not None and change.action != "update":
                # packaged: a new version, or (package not built yet) taken out by the package
                # stage and registered again, only for new bytes; the scan's own decision
                state, reason = look_at_change(backend, path, st_, change)
                if state == "same":
                    decided[path] = ["unchanged", "touched: same bytes", None]
                    continue  # a touch
                if state == "changed":
                    settling += 1
                    decided[path] = ["settling", "changing while it was read", None]
                    continue
                if state == "error":
                    skipped.append((path, str(reason)))
                    continue
            # as the scan finds it when it hashes the file: one it cannot open is skipped
            opened = open_source(backend, path)
            if isinstance(opened, str):
                skipped.append((path, opened))
                continue
            opened.close()
            new.append(_File(path, st_.size, 1 if change is None else change.version))
            decided[path] = ["register", None if change is None else f"changed: version {change.version}",
                             new[-1].version]
        entry: dict[str, Any] = {"location": loc.name, "files": len(new), "bytes": sum(f.size for f in new),
                                 "settling": settling, "skipped": [{"path": a, "reason": b} for a, b in skipped]}
        register.append(entry)
        package_of: dict[tuple[str, int], str] = {}  # (path, version) -> the package it would go to
        # keyed by (path, version): a registration the scan updates in place is packaged once
        groups: dict[str, dict[tuple[str, int], _File]] = {}
        if db is not None:
            for path, group, size, version in db.read(lambda s: _unpackaged(s, loc.name)):
                groups.setdefault(group, {})[(path, version)] = _File(path, size, version)
        for f in new:
            groups.setdefault(group_of(f.relative_path, p.group_depth), {})[(f.relative_path, f.version)] = f
        dest = _destinations(settings, loc.site)
        for group in sorted(groups):
            for version, part in plan_group(list(groups[group].values()), p.max_package_bytes,
                                            settings.extraction.max_members):
                base = package_base(group, version)
                if base not in taken:
                    taken[base] = db.read(lambda s: names_taken(s, base)) if db is not None else set()
                name = _name_for(group, taken[base], version)
                taken[base].add(name)
                package_of.update({(f.relative_path, f.version): name for f in part})
                packages.append({"name": name, "location": loc.name, "files": len(part),
                                 "bytes": sum(f.size for f in part), **dest})
        if per_file:
            entry["decisions"] = _decisions(decided, skipped, left_out or [], package_of)
    cont = db.read(lambda s: _not_archived(s, settings)) if db is not None else []
    delete = db.read(lambda s: _deletable(s, settings)) if db is not None else []
    totals = {
        "files": sum(r["files"] for r in register), "bytes": sum(r["bytes"] for r in register),
        "packages": len(packages),
        "shipments": sum(len(x["ship_to"]) for x in packages),
        "archive_copies": sum(len(x["archive_at"]) for x in packages) + sum(len(x["missing_at"]) for x in cont),
        "deletions": len(delete),
    }
    return {"database": "existing" if db is not None else "none yet", "register": register, "package": packages,
            "continue": cont, "delete": delete, "totals": totals}


def _decisions(decided: dict[str, list[Any]], skipped: list[tuple[str, str]], left_out: list[tuple[str, str]],
               package_of: dict[tuple[str, int], str]) -> list[dict[str, Any]]:
    """The ``decisions`` of one source location (see :func:`plan_run`), in path order."""
    out: dict[str, dict[str, Any]] = {}
    for path, reason in left_out:
        out[path] = {"path": path, "decision": "excluded", "reason": reason, "package": None}
    for path, reason in skipped:
        out[path] = {"path": path, "decision": "skipped", "reason": reason, "package": None}
    unpackaged: dict[str, str] = {}  # registered, not packaged yet: the package it would go to now
    for (path, _version), name in package_of.items():
        unpackaged[path] = name
    for path, (decision, reason, version) in decided.items():
        if path in out:
            continue  # skipped when it was opened
        package = package_of.get((path, version)) if version is not None else None
        if decision == "unchanged":
            package = unpackaged.get(path)
        out[path] = {"path": path, "decision": decision, "reason": reason, "package": package}
    return [out[p] for p in sorted(out)]


def _not_archived(session: Session, settings: Settings) -> list[dict[str, Any]]:
    """Registered packages not archived yet: the archives still missing their copy."""
    names = {i: n for i, n in session.execute(select(DataLocation.id, DataLocation.name))}
    pending = select(RawDataPackage.id).where(RawDataPackage.archived_at.is_(None))
    have: dict[int, set[str]] = {}
    for pkg_id, loc_id in session.execute(
            select(PhysicalCopy.raw_data_package_id, PhysicalCopy.location_id)
            .where(PhysicalCopy.raw_data_package_id.in_(pending), PhysicalCopy.status == CopyStatus.PRESENT.value)):
        have.setdefault(pkg_id, set()).add(names[loc_id])
    out = []
    for pkg_id, name, src_loc in session.execute(
            select(RawDataPackage.id, RawDataPackage.name, RawDataPackage.source_location_id)
            .where(RawDataPackage.archived_at.is_(None)).order_by(RawDataPackage.name)):
        try:
            site = settings.location(names[src_loc]).site
        except KeyError:
            continue
        wanted = _destinations(settings, site)["archive_at"]
        got = have.get(pkg_id, set())
        out.append({"name": name, "archive_at": wanted, "missing_at": [w for w in wanted if w not in got]})
    return out


def _deletable(session: Session, settings: Settings) -> list[dict[str, Any]]:
    """Buffer copies of archived packages with no deletion operation yet, and when their
    retention (``locations[].retention_seconds`` after archiving) ends."""
    buffers = {l.name: l for l in settings.locations if l.role is LocationRole.BUFFER}
    now = utcnow()
    no_deletion = ~exists().where(Operation.physical_copy_id == PhysicalCopy.id)
    out = []
    for loc, pkg, path, size, archived_at in session.execute(
            select(DataLocation.name, RawDataPackage.name, PhysicalCopy.path, PhysicalCopy.size,
                   RawDataPackage.archived_at)
            .join(PhysicalCopy, PhysicalCopy.location_id == DataLocation.id)
            .join(RawDataPackage, RawDataPackage.id == PhysicalCopy.raw_data_package_id)
            .where(PhysicalCopy.status == CopyStatus.PRESENT.value, DataLocation.name.in_(list(buffers)),
                   RawDataPackage.archived_at.is_not(None), no_deletion)
            .order_by(DataLocation.name, PhysicalCopy.path)):
        ends = archived_at + dt.timedelta(seconds=buffers[loc].retention_seconds)
        out.append({"location": loc, "package": pkg, "path": path, "bytes": int(size),
                    "when": "now" if ends <= now else ends.isoformat()})
    return out


def database_exists(settings: Settings) -> bool:
    """False for a SQLite database whose file does not exist (the dry run does not create it)."""
    url = settings.database_url
    return not url.startswith("sqlite:///") or os.path.exists(url[len("sqlite:///"):])
