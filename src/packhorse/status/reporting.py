"""Read-only reports shared by the CLI (and later the API): status, failed operations, verify.

Shapes are documented on each function; sizes are bytes, times ISO 8601 UTC.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from packhorse.db.models import (
    DataLocation,
    Operation,
    PhysicalCopy,
    RawDataFile,
    RawDataPackage,
    SkippedFile,
    WithdrawnFile,
    utcnow,
)
from packhorse.domain import LIVE_COPY_STATUSES, CopyStatus, LocationRole, Status
from packhorse.errors import LocationUnavailableError
from packhorse.managers.scan import hash_source
from packhorse.managers.source_audit import AuditResult, audit_source, audit_summaries
from packhorse.operations.lifecycle import counts_by_kind_status
from packhorse.recovery.monitor import lease_holder_gone, provably_gone
from packhorse.rules.availability import probe, record_outage, release_of
from packhorse.rules.convergence import superseded_failures
from packhorse.rules.disk_usage import latest_usage
from packhorse.rules.fixity import check_copy, recognise_returned, record_findings
from packhorse.runtime import audit
from packhorse.runtime.audit import cli_actor
from packhorse.runtime.context import ProcessContext
from packhorse.status.blocked_work import blocked_items
from packhorse.status.problems import problem_lines


def failed_operations(session: Session) -> list[dict[str, Any]]:
    """``[{"id", "kind", "error_type", "message", "diagnosis", "path", "failed_at"}]`` (``failed_at``:
    ISO 8601 UTC, when it went FAILED) for every FAILED
    operation whose work is still undone: a FAILED operation that a later repair of the same
    kind, artifact and destination COMPLETED (:func:`packhorse.rules.convergence.superseded_failures`,
    e.g. the transfer of a bundle that was lost and rebuilt) is history, not work for a human
    (it stays in ``packhorse history`` and its failure events)."""
    out = []
    failed = list(session.scalars(select(Operation).where(Operation.status == Status.FAILED.value)
                                  .order_by(Operation.id)))
    done = superseded_failures(session, failed)
    for op in failed:
        if op.id in done:
            continue
        ec = op.error_context or {}
        at = op.finished_at or op.updated_at
        out.append({"id": op.id, "kind": op.kind, "error_type": ec.get("error_type"), "message": ec.get("message"),
                    "diagnosis": ec.get("diagnosis"), "path": ec.get("path"),
                    "failed_at": at.isoformat() if at else None})
    return out


def _orphaned(s: Session) -> list[dict[str, Any]]:
    """``IN_PROGRESS`` operations whose lease holder is gone from this host
    (:func:`packhorse.recovery.monitor.lease_holder_gone`: a killed run's or worker's):
    ``[{"kind", "id", "owner", "lease_expires_at", "taken_over"}]``; ``taken_over``: at the
    next recovery pass of a running service of this host (``"next_recovery_pass"``, the holder
    was in this pid namespace), else ``"lease_expiry"``."""
    out = []
    for op_id, kind, owner, expires in s.execute(
            select(Operation.id, Operation.kind, Operation.lease_owner, Operation.lease_expires_at)
            .where(Operation.status == Status.IN_PROGRESS.value).order_by(Operation.id)):
        if lease_holder_gone(owner):
            out.append({"kind": kind, "id": op_id, "owner": owner,
                        "lease_expires_at": expires.isoformat() if expires else None,
                        "taken_over": "next_recovery_pass" if provably_gone(owner) else "lease_expiry"})
    return out


def status_report(ctx: ProcessContext) -> dict[str, Any]:
    """The ``packhorse status --json`` document.

    ``{"operations": {kind: {STATUS: n}}, "packages": {"total", "archived", "failed"}`` (failed:
    not archived and an operation of the package or its bundle is FAILED),
    ``"copies": {location: {"count", "bytes"}}, "source_files": {source location: {"count",
    "bytes"}}`` (every registered version of a file there, whether or not it is still on disk),
    ``"skipped": [{"location", "path", "reason"}]``
    (paths the scan could not register, then registrations taken out of their package because
    the file changed or vanished before it was built and not registered again),
    ``"files": {"registered", "bytes", "unpackaged"}, "failed_operations": [...],
    "failed_superseded": n`` (FAILED operations a later repair completed: counted under
    ``operations``, left out of ``failed_operations``),
    "source_filters": {location: {"include": [glob], "exclude": [glob]}},
    "blocked": [BlockedItem.as_json()], "orphaned": [...] (``IN_PROGRESS`` operations whose
    holder no longer runs on this host: :func:`_orphaned`), "problems": [...] (one line per kind
    of problem, most urgent first: :func:`packhorse.status.problems.problem_lines`),
    "quarantine": {"bytes": n,
    "locations": {location: {"bytes", "measured_at"}}}`` (bytes under each location's
    ``_packhorse/quarantine/`` at its latest disk usage sample; locations never measured are
    left out; ``packhorse quarantine list`` reads the disks now), ``"source_audits": {source
    location: {"started_at", "completed_at", "files_checked", "bytes_checked", "changed", "gone",
    "changed_total"}}`` (:func:`packhorse.managers.source_audit.audit_summaries`; locations
    never audited are left out), ``"generated_at": ISO time}``.
    ``copies`` counts present copies only; ``source_filters`` lists the source locations that
    have include / exclude patterns (:mod:`packhorse.scanfilter`).
    """
    def tx(s: Session) -> dict[str, Any]:
        ops = counts_by_kind_status(s)
        total = s.scalar(select(func.count()).select_from(RawDataPackage)) or 0
        archived = s.scalar(select(func.count()).select_from(RawDataPackage)
                            .where(RawDataPackage.archived_at.is_not(None))) or 0
        failed_ops = select(Operation.raw_data_package_id, Operation.data_transfer_package_id).where(
            Operation.status == Status.FAILED.value).subquery()
        # a package is failed while it is not archived and one of its operations (or its
        # bundle's) is FAILED; a failed deletion of an archived package's buffer copy is not
        # a failed package (it is listed in failed_operations)
        failed = s.scalar(select(func.count(func.distinct(RawDataPackage.id))).where(
            RawDataPackage.archived_at.is_(None),
            RawDataPackage.id.in_(select(failed_ops.c.raw_data_package_id))
            | RawDataPackage.data_transfer_package_id.in_(select(failed_ops.c.data_transfer_package_id)))) or 0
        copies: dict[str, dict[str, int]] = {}
        for name, n, b in s.execute(
            select(DataLocation.name, func.count(PhysicalCopy.id), func.coalesce(func.sum(PhysicalCopy.size), 0))
            .join(PhysicalCopy, PhysicalCopy.location_id == DataLocation.id)
            .where(PhysicalCopy.status == CopyStatus.PRESENT.value).group_by(DataLocation.name)
        ):
            copies[name] = {"count": int(n), "bytes": int(b)}
        for loc in ctx.settings.locations:
            copies.setdefault(loc.name, {"count": 0, "bytes": 0})
        rows = list(s.execute(
            select(DataLocation.name, SkippedFile.relative_path, SkippedFile.reason)
            .join(DataLocation, DataLocation.id == SkippedFile.location_id).order_by(SkippedFile.relative_path)))
        # registrations taken out of their package (changed or vanished before it was built)
        # that are not registered again: not archived either (I1), unless an operator said the
        # file is gone for good (packhorse skipped forget)
        rows += s.execute(
            select(DataLocation.name, WithdrawnFile.relative_path, WithdrawnFile.reason)
            .join(DataLocation, DataLocation.id == WithdrawnFile.location_id)
            .where(WithdrawnFile.listed()).order_by(WithdrawnFile.relative_path, WithdrawnFile.id))
        # one entry per path, every reason it is not archived for (a link now, and taken out of
        # its package for it)
        by_path: dict[tuple[str, str], list[str]] = {}
        for loc, path, reason in rows:
            reasons = by_path.setdefault((loc, path), [])
            if reason not in reasons:
                reasons.append(reason)
        skipped = [{"location": loc, "path": path, "reason": "; ".join(reasons)}
                   for (loc, path), reasons in by_path.items()]
        # a source location holds raw files, not package copies: its registrations instead
        source_files = {loc.name: {"count": 0, "bytes": 0} for loc in ctx.settings.locations
                        if loc.role is LocationRole.SOURCE}
        for name, n, b in s.execute(
            select(DataLocation.name, func.count(RawDataFile.id), func.coalesce(func.sum(RawDataFile.size), 0))
            .join(RawDataFile, RawDataFile.location_id == DataLocation.id).group_by(DataLocation.name)
        ):
            source_files[name] = {"count": int(n), "bytes": int(b)}
        nfiles = sum(f["count"] for f in source_files.values())
        nbytes = sum(f["bytes"] for f in source_files.values())
        unpackaged = s.scalar(select(func.count()).select_from(RawDataFile)
                              .where(RawDataFile.raw_data_package_id.is_(None))) or 0
        quarantine = {name: {"bytes": int(u.quarantined_bytes), "measured_at": u.measured_at.isoformat()}
                      for name, u in sorted(latest_usage(s).items()) if u.quarantined_bytes is not None}
        return {
            "operations": ops,
            "packages": {"total": total, "archived": archived, "failed": failed},
            "copies": copies,
            "source_files": source_files,
            "skipped": skipped,
            "files": {"registered": int(nfiles), "bytes": int(nbytes), "unpackaged": unpackaged},
            "failed_operations": (failed := failed_operations(s)),
            # FAILED operations a later repair of the same work completed: history, counted in
            # "operations" but not work for a human (failed_operations)
            "failed_superseded": sum(c.get(Status.FAILED.value, 0) for c in ops.values()) - len(failed),
            "orphaned": _orphaned(s),
            "source_filters": {loc.name: {"include": list(loc.include), "exclude": list(loc.exclude)}
                               for loc in ctx.settings.locations
                               if loc.role is LocationRole.SOURCE and (loc.include or loc.exclude)},
            "blocked": (blocked := [b.as_json() for b in blocked_items(s, ctx)]),
            "problems": problem_lines(failed, blocked),
            "quarantine": {"bytes": sum(q["bytes"] for q in quarantine.values()), "locations": quarantine},
            "source_audits": audit_summaries(s),
            "generated_at": utcnow().isoformat(),
        }

    return ctx.db.read(tx)


def audit_source_location(ctx: ProcessContext, location: str) -> AuditResult:
    """A whole source audit pass of source location ``location`` now (``packhorse verify
    --location SOURCE``): its registered files still there re-hashed, content changed behind an
    unchanged size and mtime registered as a new version
    (:func:`packhorse.managers.source_audit.audit_source`).

    Raises:
        KeyError: ``location`` is not configured.
        ValueError: it is not a source location.
    """
    return audit_source(ctx, location, hash_source)


def sources_not_audited(ctx: ProcessContext) -> list[dict[str, Any]]:
    """The configured, active source locations a ``packhorse verify`` without ``--location``
    does not re-hash (their files are a pass of their own: :func:`audit_source_location`):
    ``[{"location", "last_completed_at"`` (the last source audit pass, ISO 8601 UTC, or
    ``None``: never), ``"interval_seconds"`` (the scheduled audit's cadence,
    ``source_audit_interval_seconds``, seconds, or ``None``: off)``}]``. Read-only."""
    audits = ctx.db.read(audit_summaries)
    return [{"location": loc.name, "last_completed_at": audits.get(loc.name, {}).get("completed_at"),
             "interval_seconds": loc.source_audit_interval_seconds}
            for loc in ctx.settings.locations if loc.role is LocationRole.SOURCE and loc.active]


def verify_copies(ctx: ProcessContext, location: str | None = None, *, actor: str | None = None) -> dict[str, Any]:
    """Re-read every present copy (optionally of one location) through its backend (I4) and
    record what was found exactly as the fixity audit does (:func:`packhorse.rules.fixity.record_findings`:
    ``verified_at`` for good copies; ``missing`` / ``corrupt`` plus an ERROR notification for
    bad ones, or one CRITICAL notification when every copy of a package is bad). Repairs are
    left to the audit (``packhorse run``). Copies recorded ``missing`` or ``corrupt`` (with no
    live copy at their location) are read back too: bytes that are back and match the recorded
    size and sha256 (a remounted disk, a good copy put back by hand under its key) are
    recognised, the copy is ``present`` again (:func:`packhorse.rules.fixity.recognise_returned`);
    still bad, they stay as recorded (listed under ``unrepaired``).

    A location that is unavailable (root or identity marker missing, :mod:`packhorse.rules.availability`)
    is not judged: its copies are neither checked nor marked, it is listed under
    ``unavailable`` and its outage recorded.

    Returns ``{"checked": n, "ok": n, "missing": [{"location", "path"[, "error"]}], "corrupt":
    [{"location", "path", "expected", "actual"}], "awaiting_restore": [{"location", "path"}],
    "recognised": [{"location", "path", "recorded"}], "unavailable": [{"location", "reason", "copies",
    "release"}], "unrepaired": [...]}``. ``awaiting_restore``: copies in cold storage that are
    not restored; a restore is requested and they are not checked now (not a problem by itself,
    but nothing was read of them: ``packhorse verify`` exits 5, incomplete, for them).
    ``unrepaired``: see :func:`unrepaired_copies`. A copy whose storage could not be asked
    (an unknown location, an unreachable store) is listed under ``missing`` with ``error`` but
    not recorded: that is not evidence about the copy.

    Every copy it marks bad gets an audit entry (:data:`packhorse.runtime.audit.COPY_FOUND_BAD`,
    by ``actor``, default :func:`~packhorse.runtime.audit.cli_actor`) in the same transaction:
    ``packhorse locate`` says it was found by ``packhorse verify``, not by the scheduled check.
    """
    def load(s: Session) -> list[tuple[PhysicalCopy, str]]:
        q = (select(PhysicalCopy, DataLocation.name).join(DataLocation, DataLocation.id == PhysicalCopy.location_id)
             .where(PhysicalCopy.status.in_([CopyStatus.PRESENT.value, CopyStatus.MISSING.value,
                                             CopyStatus.CORRUPT.value]),
                    DataLocation.role != LocationRole.PROCESSING.value)  # staged folders: verified at staging
             .order_by(PhysicalCopy.id))
        if location:
            q = q.where(DataLocation.name == location)
        live = {(c.location_id, c.raw_data_package_id, c.data_transfer_package_id) for c in s.scalars(
            select(PhysicalCopy).where(PhysicalCopy.status.in_([x.value for x in LIVE_COPY_STATUSES])))}
        return [(c, n) for c, n in s.execute(q)
                if c.status == CopyStatus.PRESENT.value
                or (c.location_id, c.raw_data_package_id, c.data_transfer_package_id) not in live]

    rows = ctx.db.read(load)
    report: dict[str, Any] = {"checked": 0, "ok": 0, "missing": [], "corrupt": [], "awaiting_restore": [],
                              "recognised": [], "unavailable": []}
    findings = []
    returned = []
    was: dict[int, str] = {}  # copy id -> its recorded status, for the copies found back
    away: dict[str, LocationUnavailableError | None] = {}
    skipped: dict[str, int] = {}
    for copy, loc in rows:
        if loc not in away:
            try:
                away[loc] = probe(ctx, loc)
            except Exception:  # unknown location, unreachable store: reported per copy below
                away[loc] = None
            if away[loc] is not None:
                record_outage(ctx, away[loc])  # type: ignore[arg-type]
        if away[loc] is not None:
            skipped[loc] = skipped.get(loc, 0) + 1
            continue
        was_missing = copy.status != CopyStatus.PRESENT.value  # recorded missing or corrupt: bytes back?
        try:
            backend = ctx.backend(loc, fixity=True)
            if backend.cold and backend.stat(copy.path) is not None and not backend.restore_ready(copy.path):
                backend.request_restore(copy.path)  # verify cannot wait; the audit (or a later verify) reads it
                report["awaiting_restore"].append({"location": loc, "path": copy.path})
                continue
            if not was_missing:
                report["checked"] += 1
            f = check_copy(backend, copy, loc)
        except LocationUnavailableError as e:  # went away while verifying: not evidence either
            away[loc] = e
            record_outage(ctx, e)
            skipped[loc] = skipped.get(loc, 0) + 1
            continue
        except Exception as e:  # unknown location, unreachable store: a problem, but not a finding
            if not was_missing:
                report["missing"].append({"location": loc, "path": copy.path, "error": str(e)})
            continue
        if was_missing:
            if not f.bad:
                was[copy.id] = copy.status  # what it was recorded as: missing or corrupt
                returned.append(f)
            continue  # still missing: listed under "unrepaired"
        findings.append(f)
        if f.status == "ok":
            report["ok"] += 1
        elif f.status == CopyStatus.MISSING.value:
            report["missing"].append({"location": loc, "path": copy.path, **({"error": f.error} if f.error else {})})
        else:
            report["corrupt"].append({"location": loc, "path": copy.path, "expected": f.expected, "actual": f.actual})

    who = actor or cli_actor()

    def record(s: Session) -> list[Any]:
        for f in record_findings(s, ctx, findings)["recorded"]:
            audit.add(s, actor=who, action=audit.COPY_FOUND_BAD, target=audit.copy_target(f.copy_id),
                      details={"location": f.location, "path": f.path, "status": f.status})
        return recognise_returned(s, ctx, returned)

    back = ctx.db.transact(record)
    report["recognised"] = [{"location": f.location, "path": f.path, "recorded": was.get(f.copy_id)} for f in back]
    report["unavailable"] = [{"location": loc, "reason": err.reason, "copies": skipped.get(loc, 0),
                              "release": release_of(ctx, loc, err.marker_only, err.fault)}
                             for loc, err in away.items() if err is not None]
    report["unrepaired"] = ctx.db.read(lambda s: unrepaired_copies(s, location))
    return report


def unrepaired_copies(session: Session, location: str | None = None) -> list[dict[str, Any]]:
    """Archive copies recorded ``corrupt`` / ``missing`` with no live copy of the same artifact
    at their location yet: ``[{"location", "path", "status"}]``, one per copy owed (its latest
    record: a copy repaired and bad again is listed once), what ``verify`` exits 1 for until
    the audit repairs it or a human does. A lost buffer copy is not listed: a buffer
    only passes bytes on, and the pipeline ships them again from another source while they are
    still needed (:mod:`packhorse.rules.convergence`)."""
    live = {(c.location_id, c.raw_data_package_id, c.data_transfer_package_id) for c in session.scalars(
        select(PhysicalCopy).where(PhysicalCopy.status.in_([x.value for x in LIVE_COPY_STATUSES])))}
    q = (select(PhysicalCopy, DataLocation.name).join(DataLocation, DataLocation.id == PhysicalCopy.location_id)
         .where(PhysicalCopy.status.in_([CopyStatus.CORRUPT.value, CopyStatus.MISSING.value]),
                DataLocation.role == LocationRole.LONG_TERM_ARCHIVE.value)
         .order_by(DataLocation.name, PhysicalCopy.id))
    if location:
        q = q.where(DataLocation.name == location)
    latest: dict[tuple[Any, ...], dict[str, Any]] = {}  # one entry per copy owed: its latest record
    for c, name in session.execute(q):
        owed = (c.location_id, c.raw_data_package_id, c.data_transfer_package_id)
        if owed not in live:
            latest.pop(owed, None)  # an older record of the same copy (repaired, then bad again)
            latest[owed] = {"location": name, "path": c.path, "status": c.status}
    return sorted(latest.values(), key=lambda r: r["location"])
