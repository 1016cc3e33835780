"""Diagnostic reports: the "why" of one operation, for admins (seed 002 "Diagnosing and
Resetting a Stuck or Failed Operation").

* :func:`diagnose_operation` — the database-only report of one operation: the row snapshot
  (with its cached error context), every failure event newest first (they survive resets),
  the physical-copy presence of its artifacts at every data location, and one cause-oriented
  **diagnosis** line that cross-references the database (e.g. "the copy … was removed by
  deletion operation 17 at …").
* :func:`diagnose_package` — the reports of every operation on a raw data package or a data
  transfer package, by name.
* Live filesystem check — :func:`request_live_check` stores a ``pending`` check under a fresh
  correlation id, :func:`run_live_check` stats the expected objects at every *disk* location
  now (object and cold storage are listed as ``skipped``) and stores the result,
  :func:`get_live_check` returns it until it expires (``api.live_check_ttl_seconds``, 900 s).
  The check is best effort: when it fails, the database report still stands.

Times are ISO 8601 UTC strings; sizes bytes.
"""

from __future__ import annotations

import datetime as dt
import secrets
import socket
from pathlib import Path
from typing import Any

from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from packhorse.db.models import (
    DataLocation,
    DataTransferPackage,
    FailureEvent,
    LiveCheck,
    LocationOutage,
    Operation,
    PhysicalCopy,
    RawDataFile,
    RawDataPackage,
    Site,
    utcnow,
)
from packhorse.db.session import Database
from packhorse.domain import (
    ACTIVE_STATUSES,
    LIVE_COPY_STATUSES,
    WAITING_LOCATION,
    WAITING_SPACE,
    CopyStatus,
    LocationRole,
    OperationKind,
    Status,
    StorageType,
)
from packhorse.errors import UnknownPackageError
from packhorse.operations.attempts import claim_words, failure_words
from packhorse.operations.lifecycle import get_operation
from packhorse.recovery.breakers import breaker_row, get_breaker, jsonable
from packhorse.recovery.health import DEAD_AFTER_SECONDS, list_services
from packhorse.recovery.link_reachability import LINK_CUT
from packhorse.recovery.monitor import lease_holder_gone, provably_gone
from packhorse.rules.fixity import live_copy_at, parse_repair_key
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import bundle_key, raw_package_key

#: Error types whose cause is "the bytes to read are gone".
MISSING_ERRORS = ("SourceMissingError", "FileNotFoundError")
#: At most this many raw files are stat'ed per live check of a raw data package's source.
LIVE_CHECK_MAX_FILES = 1000




def _iso(t: dt.datetime | None) -> str | None:
    return t.isoformat() if t else None


def _location_names(session: Session) -> dict[int, str]:
    return dict(session.execute(select(DataLocation.id, DataLocation.name)).all())


def snapshot(session: Session, op: Operation, now: dt.datetime | None = None) -> dict[str, Any]:
    """The operation row as a dict, with names resolved and ``stalled`` computed.

    Shape: ``{"id", "kind", "status", "stalled", "attempt", "attempt_words", "retry_count", "max_retries",
    "stall_count", "site", "source_location", "destination_location", "raw_data_package",
    "data_transfer_package", "physical_copy_id", "lease_owner", "lease_expires_at",
    "heartbeat_at", "not_before", "created_at", "updated_at", "scheduled_at", "started_at",
    "finished_at", "bytes_done", "error_context"}``. ``attempt`` is the fencing token (one more
    per claim, waits included); ``attempt_words`` says it as an operator reads it
    (:func:`~packhorse.operations.attempts.claim_words`: "claim N" when claims that waited came
    between, "attempt N" otherwise).
    """
    now = now or utcnow()
    locs = _location_names(session)
    rdp = session.get(RawDataPackage, op.raw_data_package_id) if op.raw_data_package_id else None
    dtp = session.get(DataTransferPackage, op.data_transfer_package_id) if op.data_transfer_package_id else None
    site = session.get(Site, op.site_id)
    return {
        "id": op.id, "kind": op.kind, "status": op.status, "stalled": is_stalled(op, now),
        "attempt": op.attempt, "attempt_words": claim_words(op.attempt, op.retry_count, explain=False),
        "retry_count": op.retry_count, "max_retries": op.max_retries,
        "stall_count": op.stall_count, "site": site.name if site else None,
        "source_location": locs.get(op.source_location_id) if op.source_location_id else None,
        "destination_location": locs.get(op.destination_location_id) if op.destination_location_id else None,
        "raw_data_package": rdp.name if rdp else None, "data_transfer_package": dtp.name if dtp else None,
        "physical_copy_id": op.physical_copy_id, "lease_owner": op.lease_owner,
        "lease_expires_at": _iso(op.lease_expires_at), "heartbeat_at": _iso(op.heartbeat_at),
        "not_before": _iso(op.not_before), "created_at": _iso(op.created_at), "updated_at": _iso(op.updated_at),
        "scheduled_at": _iso(op.scheduled_at), "started_at": _iso(op.started_at),
        "finished_at": _iso(op.finished_at), "bytes_done": op.bytes_done, "error_context": op.error_context,
    }


def is_stalled(op: Operation, now: dt.datetime) -> bool:
    """``IN_PROGRESS`` with an expired lease (DESIGN.md "Stalled operation")."""
    return (op.status == Status.IN_PROGRESS.value and op.lease_expires_at is not None
            and op.lease_expires_at < now)


def failure_events(session: Session, operation_id: int) -> list[dict[str, Any]]:
    """Every failure event of the operation, newest first: ``[{"id", "created_at", "attempt",
    "failure", "retry_count", "error_type", "message", "will_retry", "error_context"}]`` (the
    error context carries the traceback; ``failure``: "failure K (claim N)",
    :func:`~packhorse.operations.attempts.failure_words`)."""
    q = select(FailureEvent).where(FailureEvent.operation_id == operation_id).order_by(
        FailureEvent.created_at.desc(), FailureEvent.id.desc())
    return [{"id": e.id, "created_at": _iso(e.created_at), "attempt": e.attempt,
             "failure": failure_words(e.attempt, e.retry_count), "retry_count": e.retry_count,
             "error_type": e.error_type, "message": e.message, "will_retry": e.will_retry,
             "error_context": e.error_context} for e in session.scalars(q)]


def _artifacts(session: Session, op: Operation) -> list[tuple[str, int, str]]:
    """``[(artifact type, id, name)]`` the operation works on (its package, bundle or copy's)."""
    out: list[tuple[str, int, str]] = []
    rdp_id, dtp_id = op.raw_data_package_id, op.data_transfer_package_id
    if op.physical_copy_id:
        pc = session.get(PhysicalCopy, op.physical_copy_id)
        if pc is not None:
            rdp_id = rdp_id or pc.raw_data_package_id
            dtp_id = dtp_id or pc.data_transfer_package_id
    if rdp_id:
        p = session.get(RawDataPackage, rdp_id)
        if p:
            out.append(("raw_data_package", p.id, p.name))
    if dtp_id:
        d = session.get(DataTransferPackage, dtp_id)
        if d:
            out.append(("data_transfer_package", d.id, d.name))
    return out


def copy_presence(session: Session, op: Operation) -> list[dict[str, Any]]:
    """Per data location (every location that is not a source; for a bundle, every buffer: a
    bundle is never kept anywhere else), whether each artifact of the operation has a physical
    copy there according to the database.

    Shape: ``[{"artifact", "name", "location", "site", "role", "storage", "status"
    (a copy status or "absent"), "copy_id", "path", "size", "sha256", "verified_at",
    "deleted_at"}]``; the live copy is shown if there is one, else the newest row.
    """
    locations = session.execute(
        select(DataLocation.id, DataLocation.name, DataLocation.role, DataLocation.storage_type, Site.name)
        .join(Site, Site.id == DataLocation.site_id).where(DataLocation.role != LocationRole.SOURCE.value)
        .order_by(DataLocation.id)).all()
    out = []
    live = {s.value for s in LIVE_COPY_STATUSES}
    for artifact, art_id, name in _artifacts(session, op):
        col = PhysicalCopy.raw_data_package_id if artifact == "raw_data_package" else PhysicalCopy.data_transfer_package_id
        copies: dict[int, PhysicalCopy] = {}
        for c in session.scalars(select(PhysicalCopy).where(col == art_id).order_by(PhysicalCopy.id)):
            best = copies.get(c.location_id)
            if best is None or c.status in live or best.status not in live:
                copies[c.location_id] = c
        for loc_id, loc_name, role, storage, site in locations:
            c = copies.get(loc_id)
            if c is None and artifact == "data_transfer_package" and role != LocationRole.BUFFER.value:
                continue  # a bundle is only ever kept in buffers: "absent" from an archive says nothing
            out.append({"artifact": artifact, "name": name, "location": loc_name, "site": site, "role": role,
                        "storage": storage, "status": c.status if c else "absent", "copy_id": c.id if c else None,
                        "path": c.path if c else None, "size": c.size if c else None,
                        "sha256": c.sha256 if c else None, "verified_at": _iso(c.verified_at) if c else None,
                        "deleted_at": _iso(c.deleted_at) if c else None})
    return out


def _removed_copies(session: Session, op: Operation, copies: list[dict[str, Any]]) -> list[str]:
    """Cause lines for copies of the operation's artifacts that are gone or damaged."""
    lines = []
    for c in copies:
        if c["status"] == CopyStatus.DELETED.value:
            deleter = session.scalars(select(Operation).where(
                Operation.kind == OperationKind.DELETION.value, Operation.physical_copy_id == c["copy_id"])
                .order_by(Operation.id.desc())).first()
            by = (f" by deletion operation {deleter.id}" if deleter else "") + (
                f" at {c['deleted_at']}" if c["deleted_at"] else "")
            lines.append(f"the copy of {c['name']} at {c['location']} was removed{by}")
        elif c["status"] in (CopyStatus.MISSING.value, CopyStatus.CORRUPT.value):
            lines.append(f"the copy of {c['name']} at {c['location']} is marked {c['status']}")
    if op.kind == OperationKind.RAW_DATA_PACKAGE.value and op.raw_data_package_id:
        row = session.execute(select(RawDataFile.source_deleted_at).where(
            RawDataFile.raw_data_package_id == op.raw_data_package_id, RawDataFile.source_deleted_at.is_not(None))
            .order_by(RawDataFile.source_deleted_at)).first()
        if row is not None:
            lines.append(f"raw files of this package were deleted from the source at {_iso(row[0])}")
    return lines


def _waiting_for_dispatch(session: Session, now: dt.datetime, dead_after_seconds: float) -> str:
    """A due ``PENDING`` operation: it waits for a dispatcher (``packhorse run`` embedded,
    ``packhorse manager`` distributed) to hand it to a worker; says so when no dispatcher's
    heartbeat is alive (:func:`packhorse.recovery.health.list_services` with
    ``dead_after_seconds``, as ``packhorse health`` judges it)."""
    alive = [sv["service"] for sv in list_services(session, now, dead_after_seconds=dead_after_seconds)
             if sv["alive"] and sv["kind"] in ("runner", "manager")]
    if alive:
        return f"waiting to be handed to a worker by {', '.join(sorted(alive))} at its next cycle"
    return ("waiting to be handed to a worker, but no `packhorse run` or `packhorse manager` is alive "
            "(`packhorse health`): start one")


def fixity_doing(session: Session, op: Operation) -> str | None:
    """What a ``fixity_check`` operation is doing, from its physical copy's row: ``"checking the
    fixity of copy KEY at LOCATION"`` while the copy is ``present``, ``"repairing the corrupt
    copy KEY at LOCATION from SOURCE (the bad object moved aside to …)"`` once it was found bad
    (by this check, an earlier one or ``packhorse verify``; SOURCE is the copy a repair
    operation names, else "a verified good copy"). ``None`` for another operation kind or a
    copy that is gone from the database."""
    if op.kind != OperationKind.FIXITY_CHECK.value or op.physical_copy_id is None:
        return None
    copy = session.get(PhysicalCopy, op.physical_copy_id)
    if copy is None:
        return None
    names = _location_names(session)
    here = f"copy {copy.path} at {names.get(copy.location_id, copy.location_id)}"
    if copy.status not in (CopyStatus.CORRUPT.value, CopyStatus.MISSING.value):
        return f"checking the fixity of {here} (reading it back against its recorded sha256)"
    repair = parse_repair_key(op.dedup_key)
    source = session.get(PhysicalCopy, repair[1]) if repair else None
    frm = (f"{names.get(source.location_id, source.location_id)}:{source.path}" if source is not None
           else "a verified good copy (another archive, or one at its own site)")
    return (f"repairing the {copy.status} {here} from {frm}"
            + (f" (the bad object moved aside to {copy.quarantined_as})" if copy.quarantined_as else ""))


def _fixity_left(session: Session, op: Operation) -> str | None:
    """For a completed ``fixity_check`` whose copy is still recorded bad with no live copy at its
    location: what comes next (the repair operation in flight, or the one the fixity manager
    creates), instead of "nothing to do". ``None`` otherwise."""
    if op.kind != OperationKind.FIXITY_CHECK.value or op.physical_copy_id is None:
        return None
    copy = session.get(PhysicalCopy, op.physical_copy_id)
    if copy is None or copy.status not in (CopyStatus.CORRUPT.value, CopyStatus.MISSING.value):
        return None
    if live_copy_at(session, copy.location_id, copy.raw_data_package_id,
                    copy.data_transfer_package_id) is not None:
        return None  # repaired since
    where = f"{_location_names(session).get(copy.location_id, copy.location_id)}:{copy.path}"
    repair = session.scalars(select(Operation).where(
        Operation.kind == OperationKind.FIXITY_CHECK.value, Operation.physical_copy_id == copy.id,
        Operation.id != op.id, Operation.status.in_([x.value for x in ACTIVE_STATUSES]))
        .order_by(Operation.id.desc())).first()
    if repair is not None:
        return (f"the copy {where} is recorded {copy.status}; its repair is fixity_check {repair.id} "
                f"({repair.status}: packhorse diagnose fixity_check {repair.id})")
    return (f"the copy {where} is recorded {copy.status} and not repaired yet: the fixity manager's next cycle "
            "repairs it from a good copy (packhorse status lists it if there is none)")


def diagnosis_line(session: Session, op: Operation, copies: list[dict[str, Any]],
                   events: list[dict[str, Any]], now: dt.datetime | None = None, *,
                   dead_after_seconds: float = DEAD_AFTER_SECONDS) -> tuple[str, str]:
    """The cause-oriented diagnosis of an operation and where it came from.
    ``dead_after_seconds``: when a service's heartbeat makes it dead (``[recovery]
    service_dead_after_seconds``; a due ``PENDING`` operation names its live dispatcher).

    Returns:
        ``(diagnosis, source)``; ``source`` is ``"db"`` (derived from the database state now),
        the failure's recorded ``diagnosis_source`` (``"boundary"``: the error carried it,
        ``"auto-db"``: derived when it failed), or that source ``+db`` when both contribute.
    """
    now = now or utcnow()
    last = events[0] if events else None
    ctx = op.error_context or (last["error_context"] if last else None) or {}
    what = f"{ctx.get('error_type')}: {ctx.get('message')}" if ctx.get("error_type") else None
    st = op.status
    if st == Status.COMPLETED.value:
        done = f"completed at {_iso(op.finished_at)} ({claim_words(op.attempt, op.retry_count)})"
        after = _fixity_left(session, op)
        return (f"{done}; {after}" if after else f"{done}; nothing to do"), "db"
    if st == Status.IN_PROGRESS.value:
        doing = fixity_doing(session, op)
        was = f"; it was {doing}" if doing else ""
        if is_stalled(op, now):
            line = (f"stalled: {claim_words(op.attempt, op.retry_count)} held by {op.lease_owner} stopped renewing its lease "
                    f"(last heartbeat {_iso(op.heartbeat_at)}, lease expired {_iso(op.lease_expires_at)}); "
                    "lease recovery resets it to PENDING on its next pass")
            if op.stall_count:
                line += f"; it has stalled {op.stall_count} time(s) before — check its circuit breaker"
            return line + was, "db"

        if lease_holder_gone(op.lease_owner):
            when = ("at its next recovery pass, without waiting for the lease (which expires at "
                    f"{_iso(op.lease_expires_at)}): the holder was in this pid namespace" if provably_gone(op.lease_owner)
                    else f"once its lease expires at {_iso(op.lease_expires_at)}")
            return (f"its worker is gone: {claim_words(op.attempt, op.retry_count)} was held by {op.lease_owner}, a process that no "
                    f"longer runs on this host (killed, or the host restarted); lease recovery by a running "
                    f"`packhorse run`, `packhorse monitor` or `packhorse manager` of this host hands it out "
                    f"again {when}; or now: packhorse retry {op.kind} {op.id}{was}"), "db"
        return ((f"running: {doing}; " if doing else "running: ")
                + f"{claim_words(op.attempt, op.retry_count)} by {op.lease_owner}, lease valid until "
                f"{_iso(op.lease_expires_at)}, {op.bytes_done} bytes done"), "db"
    if st == Status.SCHEDULED.value:
        return (f"queued for a worker since {_iso(op.scheduled_at)}; if no worker claims it, "
                "the reconciler dispatches it again"), "db"
    if st == Status.PENDING.value:
        outage = (session.get(LocationOutage, ctx["location_id"])
                  if ctx.get("waiting") == WAITING_LOCATION and isinstance(ctx.get("location_id"), int) else None)
        if outage is not None:  # handed back because a location it needs is away, which it still is
            return (f"waiting for data location {ctx.get('location')}, unavailable since {_iso(outage.since)} "
                    f"({outage.reason}); it runs again by itself once the location is back (no retry is "
                    "counted; packhorse status lists the location as blocked)"), "db"
        if ctx.get("waiting") == WAITING_SPACE:
            return (f"waiting for space at data location {ctx.get('location')}: its write at claim "
                    f"{ctx.get('attempt', op.attempt)} met a full file system ({ctx.get('message')}); it looks "
                    f"again at {_iso(op.not_before)} and goes on by itself once there is space (no retry is "
                    "counted; packhorse status lists the location as blocked)"), "db"
        if op.not_before is not None and op.not_before > now and ctx.get("error_type") == LINK_CUT:
            return (f"waiting for the link to {ctx.get('host') or 'the source site'}: its SSH connection could not be "
                    f"made or was cut ({ctx.get('message')}); it tries again at {_iso(op.not_before)}, for as long "
                    f"as the link stays cut ({op.retry_count} tries so far, no limit), and resumes from its partial "
                    "by itself once the link is back (packhorse status lists the link as blocked)"), "db"
        if op.not_before is not None and op.not_before > now:
            line = (f"waiting for its retry backoff until {_iso(op.not_before)} "
                    f"(retry {op.retry_count} of {op.max_retries})")
            if last:
                line += f"; last failure: {last['error_type']}: {last['message']}"
            return line, "db"
        return _waiting_for_dispatch(session, now, dead_after_seconds), "db"
    # FAILED
    causes = _removed_copies(session, op, copies)
    boundary = ctx.get("diagnosis")
    etype = ctx.get("error_type")
    if etype == "DestinationConflictError":
        line = (f"the destination {ctx.get('host') or ''}:{ctx.get('path') or ''} already holds different bytes "
                "that this database has no copy of; packhorse never overwrites: find out who wrote that object. "
                "If the ops database was restored from a backup older than the archive, it may be this "
                "package's earlier archived content (a file changed at the source since): keep it (move it "
                "aside inside the archive, not away), then reset")
    elif etype in MISSING_ERRORS or (what and "missing" in what.lower()):
        line = "the bytes to read are gone" + (f": {'; '.join(causes)}" if causes else
                                               f" ({ctx.get('path') or 'path unknown'}), and the database records no deletion")
    elif etype == "TransferCommandError":
        line = (f"the route's transfer command failed ({ctx.get('message')}); check the command, the network "
                f"and the destination host; gave up after {op.retry_count} retries (max_retries {op.max_retries})")
    elif etype == "VerificationError":
        line = (f"bytes read back at {ctx.get('host') or 'the destination'} did not match the recorded sha256 "
                f"(a disk or transfer problem); gave up after {op.retry_count} retries")
    elif ctx.get("will_retry") is False and op.retry_count >= op.max_retries and etype not in (None, "Stalled"):
        line = f"gave up after {op.retry_count} retries (max_retries {op.max_retries}); last error {what}"
    else:
        line = f"failed permanently: {what or 'no error context recorded'}"
    if causes and etype not in MISSING_ERRORS:
        line += "; also: " + "; ".join(causes)
    if boundary:
        recorded = ctx.get("diagnosis_source") or "boundary"
        if etype in MISSING_ERRORS:  # the recorded diagnosis already names the cause
            return boundary, recorded
        return f"{boundary} — {line}", f"{recorded}+db"
    return line, "db"


def diagnose_operation(session: Session, kind: OperationKind, operation_id: int,
                       now: dt.datetime | None = None, *,
                       dead_after_seconds: float = DEAD_AFTER_SECONDS) -> dict[str, Any]:
    """The diagnostic report of one operation (database only). ``dead_after_seconds``: the
    configured ``[recovery] service_dead_after_seconds`` (:func:`diagnosis_line`).

    Returns:
        ``{"operation": snapshot(), "failure_events": [...] newest first, "copies":
        copy_presence(), "breaker": {...} | None, "diagnosis": str, "diagnosis_source": str,
        "generated_at": ISO}``.

    Raises:
        UnknownOperationError: no operation of ``kind`` with ``operation_id``.
    """
    now = now or utcnow()
    op = get_operation(session, kind, operation_id)
    events = failure_events(session, op.id)
    copies = copy_presence(session, op)
    line, source = diagnosis_line(session, op, copies, events, now, dead_after_seconds=dead_after_seconds)
    mates = task_mates(session, op)
    if mates:
        shown = ", ".join(f"{k} {i}" for k, i in mates[:10]) + (f" and {len(mates) - 10} more" if len(mates) > 10 else "")
        line += (f"; it runs in one task (one message, one worker) with {shown}, which share its lease holder "
                 "and stop or stall with it")
    breaker = _breaker(session, op)
    if breaker and breaker["state"] == "open" and op.status != Status.COMPLETED.value:
        line = (f"recovery is blocked by its open circuit breaker ({breaker['stall_count']} stalls) until "
                f"{breaker['next_attempt_at']}, when one attempt is let through by itself; fix why it stalls, "
                f"then reset the breaker or force a retry — {line}")
    elif breaker and breaker["state"] == "half_open" and op.status != Status.COMPLETED.value:
        line = (f"its circuit breaker is half-open ({breaker['stall_count']} stalls): one attempt was let through "
                f"at {breaker['half_open_at']}; it closes if that attempt succeeds — {line}")
    return {"operation": snapshot(session, op, now), "failure_events": events, "copies": copies,
            "breaker": breaker, "diagnosis": line, "diagnosis_source": source, "generated_at": now.isoformat()}


def task_mates(session: Session, op: Operation) -> list[tuple[str, int]]:
    """``[(kind, operation id)]`` of the other ``IN_PROGRESS`` operations held by the same lease
    owner as ``op``: those of one task (a batch of :mod:`packhorse.operations.batching`, one broker message
    in distributed mode); empty when ``op`` is not in progress or runs alone."""
    if op.status != Status.IN_PROGRESS.value or not op.lease_owner:
        return []
    return [(k, i) for k, i in session.execute(
        select(Operation.kind, Operation.id).where(Operation.status == Status.IN_PROGRESS.value,
                                                   Operation.lease_owner == op.lease_owner, Operation.id != op.id)
        .order_by(Operation.id))]


def _breaker(session: Session, op: Operation) -> dict[str, Any] | None:
    """The operation's circuit breaker (``state``, ``stall_count``, ``last_stall_at``,
    ``opened_at``, ``next_attempt_at``, …: :func:`packhorse.recovery.breakers.breaker_row`), or
    ``None`` if it never stalled."""
    b = get_breaker(session, op.kind, op.id)
    return jsonable(breaker_row(b)) if b is not None else None


def diagnose_package(session: Session, name: str, now: dt.datetime | None = None, *,
                     dead_after_seconds: float = DEAD_AFTER_SECONDS) -> dict[str, Any]:
    """The reports of every operation on the package called ``name``.

    A raw data package's operations include those of the bundle that carries it; a bundle's
    include the operations on the raw packages it carries.

    Returns:
        ``{"package": name, "type": "raw_data_package" | "data_transfer_package",
        "reports": [diagnose_operation(), ...] by operation id}``.

    Raises:
        UnknownPackageError: no package has that name.
    """
    rdp = session.scalars(select(RawDataPackage).where(RawDataPackage.name == name)).first()
    if rdp is not None:
        ptype = "raw_data_package"
        cond = or_(Operation.raw_data_package_id == rdp.id,
                   Operation.physical_copy_id.in_(select(PhysicalCopy.id).where(PhysicalCopy.raw_data_package_id == rdp.id)))
        if rdp.data_transfer_package_id:
            cond = or_(cond, Operation.data_transfer_package_id == rdp.data_transfer_package_id)
    else:
        dtp = session.scalars(select(DataTransferPackage).where(DataTransferPackage.name == name)).first()
        if dtp is None:
            raise UnknownPackageError(f"no raw data package or data transfer package called {name!r}")
        ptype = "data_transfer_package"
        members = select(RawDataPackage.id).where(RawDataPackage.data_transfer_package_id == dtp.id)
        cond = or_(Operation.data_transfer_package_id == dtp.id, Operation.raw_data_package_id.in_(members),
                   Operation.physical_copy_id.in_(select(PhysicalCopy.id).where(
                       (PhysicalCopy.data_transfer_package_id == dtp.id) | PhysicalCopy.raw_data_package_id.in_(members))))
    ops = session.scalars(select(Operation).where(cond).order_by(Operation.id)).all()
    return {"package": name, "type": ptype,
            "reports": [diagnose_operation(session, OperationKind(o.kind), o.id, now,
                                           dead_after_seconds=dead_after_seconds) for o in ops]}


# ------------------------------------------------------------------------------ live check


#: What a live check expects of an object: ``present`` (a live copy: the bytes must be there,
#: a missing one is an alarm), ``folder`` (a staged copy: a folder holding ``bagit.txt``), ``file``
#: (a registered raw file at a source location) or ``not_required`` (a copy deletion removed on
#: purpose, the destination of an unfinished operation: looked at and reported, never an alarm).
EXPECT_PRESENT, EXPECT_FOLDER, EXPECT_FILE, EXPECT_NOT_REQUIRED = "present", "folder", "file", "not_required"


def _expected_objects(session: Session, op: Operation) -> dict[str, list[tuple[str, int | None, str, str | None]]]:
    """``{location name: [(key, expected size, expectation, note)]}`` to look at for the operation.

    What the database says must exist is a *live* physical copy (present or deletion pending:
    DESIGN.md I3); a copy that a deletion operation removed is reported as removed, not
    missing; the destination of an unfinished operation may not hold anything yet; a staged
    copy is a folder; a source location holds raw files, never a package tar.
    """
    locs = _location_names(session)
    roles = dict(session.execute(select(DataLocation.name, DataLocation.role)).all())
    want: dict[str, list[tuple[str, int | None, str, str | None]]] = {}
    live = {s.value for s in LIVE_COPY_STATUSES}
    for artifact, art_id, _name in _artifacts(session, op):
        if artifact == "raw_data_package":
            pkg = session.get(RawDataPackage, art_id)
            key, size, col = raw_package_key(pkg.name), pkg.size, PhysicalCopy.raw_data_package_id  # type: ignore[union-attr]
        else:
            dtp = session.get(DataTransferPackage, art_id)
            key, size, col = bundle_key(dtp.name), dtp.size, PhysicalCopy.data_transfer_package_id  # type: ignore[union-attr]
        newest: dict[int, PhysicalCopy] = {}
        for c in session.scalars(select(PhysicalCopy).where(col == art_id).order_by(PhysicalCopy.id)):
            best = newest.get(c.location_id)
            if best is None or c.status in live or best.status not in live:
                newest[c.location_id] = c
        for loc_id, c in newest.items():
            loc = locs[loc_id]
            if c.status in live:
                expect = EXPECT_FOLDER if roles.get(loc) == LocationRole.PROCESSING.value else EXPECT_PRESENT
                want.setdefault(loc, []).append((c.path, c.size, expect, None))
            elif c.status == CopyStatus.DELETED.value:
                note = f"removed on purpose at {_iso(c.deleted_at)}" if c.deleted_at else "removed on purpose"
                want.setdefault(loc, []).append((c.path, None, EXPECT_NOT_REQUIRED, note))
            else:
                want.setdefault(loc, []).append((c.path, c.size, EXPECT_NOT_REQUIRED, f"already marked {c.status}"))
        if op.status != Status.COMPLETED.value and op.destination_location_id is not None:
            dest = locs.get(op.destination_location_id)
            if dest is not None and op.destination_location_id not in newest and roles.get(dest) != LocationRole.SOURCE.value:
                dkey = _name if roles.get(dest) == LocationRole.PROCESSING.value and artifact == "raw_data_package" else key
                want.setdefault(dest, []).append((dkey, size, EXPECT_NOT_REQUIRED, "not written yet"))
    if op.kind == OperationKind.RAW_DATA_PACKAGE.value and op.raw_data_package_id and op.source_location_id:
        files = session.execute(select(RawDataFile.relative_path, RawDataFile.size).where(
            RawDataFile.raw_data_package_id == op.raw_data_package_id, RawDataFile.source_deleted_at.is_(None))
            .order_by(RawDataFile.relative_path).limit(LIVE_CHECK_MAX_FILES)).all()
        if op.status == Status.COMPLETED.value:  # built: its bytes are the tar's; the files matter to a rebuild only
            want.setdefault(locs[op.source_location_id], []).extend(
                (p, s, EXPECT_NOT_REQUIRED, "a source file of the built package: needed only to rebuild it")
                for p, s in files)
        else:
            want.setdefault(locs[op.source_location_id], []).extend((p, s, EXPECT_FILE, None) for p, s in files)
    return want


def _look(backend: Any, root: Path, key: str, size: int | None, expect: str, note: str | None) -> dict[str, Any]:
    """Look at one object now; ``ok`` is false only when the database requires it and it is
    absent or of another size (or, for a staged copy, not a bag folder)."""
    out: dict[str, Any] = {"path": key, "expected_size": size, "expect": expect, "note": note}
    if expect == EXPECT_FOLDER:
        folder = (root / key)
        inside = folder.resolve().is_relative_to(root.resolve())
        exists = inside and folder.is_dir()
        out.update(exists=exists, size=None, ok=exists and (folder / "bagit.txt").is_file())
        return out
    if expect == EXPECT_NOT_REQUIRED:
        try:
            info = backend.stat(key)
        except Exception:  # a folder where a file was: not required either way
            info = None
        out.update(exists=info is not None, size=info.size if info else None, ok=True)
        return out
    info = backend.stat(key)
    out.update(exists=info is not None, size=info.size if info else None,
               ok=info is not None and (size is None or info.size == size))
    return out


def live_check(ctx: ProcessContext, kind: OperationKind, operation_id: int) -> dict[str, Any]:
    """Look, now, at every object the database has for the operation at every disk location.

    A live copy must be there with its recorded size; a staged copy must be a bag folder; a
    registered raw file at its source; a copy removed by a deletion operation, or the
    destination of an unfinished operation, is looked at and reported but never counts as a
    fault (no false alarm for a healthy package).

    Returns:
        ``{"checked": [{"location", "storage", "ok", "error", "objects": [{"path",
        "expected_size", "expect" (present | folder | file | not_required), "note", "exists",
        "size", "ok"}]}], "skipped": [{"location", "storage", "reason"}], "host",
        "checked_at": ISO}``. A location whose root cannot be read is listed with its
        ``error`` and ``ok = false``; ``host`` is where the check ran (the API's host: a
        location not mounted there is reported unreachable, not missing).

    Raises:
        UnknownOperationError: no such operation.
    """
    def load(s: Session) -> dict[str, list[tuple[str, int | None, str, str | None]]]:
        return _expected_objects(s, get_operation(s, kind, operation_id))

    want = ctx.db.read(load)
    checked, skipped = [], []
    for loc, objects in sorted(want.items()):
        try:
            cfg = ctx.settings.location(loc)
        except KeyError:
            skipped.append({"location": loc, "storage": None, "reason": "not in the configuration any more"})
            continue
        if cfg.storage is not StorageType.DISK:
            kind_word = "object storage" if cfg.storage in (StorageType.S3, StorageType.AZURE) else "cold storage"
            skipped.append({"location": loc, "storage": cfg.storage.value,
                            "reason": f"{kind_word} is not filesystem-checkable"})
            continue
        entry: dict[str, Any] = {"location": loc, "storage": cfg.storage.value, "ok": True, "error": None, "objects": []}
        root = ctx.settings.location_path(loc)
        if not root.is_dir():  # not mounted here: "missing" would be a false alarm
            required = any(e != EXPECT_NOT_REQUIRED for _k, _s, e, _n in objects)
            entry["ok"] = not required
            entry["error"] = f"the location's root {root} is not reachable from {socket.gethostname()}"
            checked.append(entry)
            continue
        try:
            backend = ctx.backend(loc)
            for key, size, expect, note in objects:
                found = _look(backend, root, key, size, expect, note)
                entry["objects"].append(found)
                entry["ok"] = entry["ok"] and found["ok"]
        except Exception as e:  # unreachable mount, unsafe key: report it for this location
            entry["ok"], entry["error"] = False, f"{type(e).__name__}: {e}"
        checked.append(entry)
    return {"checked": checked, "skipped": skipped, "host": socket.gethostname(), "checked_at": utcnow().isoformat()}


def _purge_expired(s: Session, now: dt.datetime) -> None:
    s.execute(delete(LiveCheck).where(LiveCheck.expires_at < now))


def request_live_check(db: Database, kind: OperationKind, operation_id: int, *, requested_by: str,
                       ttl_seconds: float) -> dict[str, Any]:
    """Store a pending live check; returns ``{"correlation_id", "state": "pending", "expires_at"}``.

    Raises:
        UnknownOperationError: no such operation.
    """
    cid = secrets.token_urlsafe(18)

    def tx(s: Session) -> dict[str, Any]:
        now = utcnow()
        get_operation(s, kind, operation_id)
        _purge_expired(s, now)
        exp = now + dt.timedelta(seconds=ttl_seconds)
        s.add(LiveCheck(correlation_id=cid, kind=kind.value, operation_id=operation_id, requested_by=requested_by,
                        requested_at=now, expires_at=exp, state="pending"))
        return {"correlation_id": cid, "state": "pending", "expires_at": exp.isoformat()}

    return db.transact(tx)


def run_live_check(ctx: ProcessContext, correlation_id: str) -> None:
    """Run the pending check ``correlation_id`` and store its result (``done``) or the error
    that stopped it (``failed``). Never raises: the database report stands either way."""
    row = ctx.db.read(lambda s: s.get(LiveCheck, correlation_id))
    if row is None:
        return
    try:
        result, state = live_check(ctx, OperationKind(row.kind), row.operation_id), "done"
    except Exception as e:
        result, state = {"error": f"{type(e).__name__}: {e}"}, "failed"
    ctx.db.transact(lambda s: s.execute(update(LiveCheck).where(LiveCheck.correlation_id == correlation_id)
                                        .values(state=state, result=result)))


def get_live_check(session: Session, correlation_id: str, now: dt.datetime | None = None) -> dict[str, Any] | None:
    """The check ``correlation_id``: ``{"correlation_id", "kind", "operation_id", "state",
    "requested_at", "expires_at", "result"}``, or ``None`` if unknown or expired."""
    now = now or utcnow()
    row = session.get(LiveCheck, correlation_id)
    if row is None or row.expires_at < now:
        return None
    return {"correlation_id": row.correlation_id, "kind": row.kind, "operation_id": row.operation_id,
            "state": row.state, "requested_at": _iso(row.requested_at), "expires_at": _iso(row.expires_at),
            "result": row.result}
