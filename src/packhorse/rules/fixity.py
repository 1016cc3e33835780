"""Fixity: re-read a physical copy and prove its sha256 still matches (I4).

One set of rules, used by the ``fixity_check`` stage (the standing audit) and by
``packhorse verify`` alike:

* :func:`check_copy` re-reads one copy through its backend (callers hand in the location's
  fixity stack, ``ctx.backend(location, fixity=True)``, whose read-rate layer keeps to
  ``fixity_bytes_per_second``; :mod:`packhorse.storage.layers`) and returns a :class:`Finding`: ``ok``, ``missing``
  (no object) or ``corrupt`` (other size or sha256).
* :func:`record_findings` writes what was found, in the caller's transaction: ``ok`` copies
  get a fresh ``verified_at``; a bad copy is marked ``missing`` / ``corrupt`` and an ERROR
  notification is queued with it. If after these findings a package has no ``present`` copy
  left anywhere, every copy looked bad at once: that is a storage fault, not rot, so instead
  of the ERRORs one CRITICAL notification is queued, and no copy is repaired from another
  (none is good): the desired state (:mod:`packhorse.rules.convergence`) re-archives the package
  from its source files while they exist — the bad objects quarantined, never overwritten —
  or reports the package blocked (``no_good_source``) when nothing is left to rebuild from.

* :func:`recognise_returned` records a copy marked ``missing`` or ``corrupt`` whose bytes are
  back (a remounted disk, a restored folder, a good copy put back by hand under its key) and
  read back with the recorded size and sha256: the same copy is ``present`` again with a fresh
  ``verified_at`` — recognised, never written again — and "archived" follows it.
  Copies on an unavailable location are never judged (:mod:`packhorse.rules.availability`): a
  missing root or marker is not evidence about a copy.

Repairs (moving the bad object aside, re-archiving from a verified copy) are the stage's
job: :mod:`packhorse.stages.fixity`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from packhorse.db.models import DataLocation, DataTransferPackage, Notification, PhysicalCopy, RawDataPackage, utcnow
from packhorse.domain import LIVE_COPY_STATUSES, CopyStatus, LocationRole, NotificationLevel, OperationKind
from packhorse.errors import SourceMissingError, UnsafePathError
from packhorse.notify.messages import DIGEST_BODY_MAX
from packhorse.notify.outbox import enqueue
from packhorse.operations.lifecycle import dedup_key
from packhorse.rules.policy import refresh_archived
from packhorse.storage.base import CHUNK_BYTES, StorageBackend

if TYPE_CHECKING:
    from packhorse.runtime.context import ProcessContext

OK, MISSING, CORRUPT = "ok", CopyStatus.MISSING.value, CopyStatus.CORRUPT.value


#: The dedup key of a repair operation: ``fixity_check:repair-copyC@copyS->LOCATION``, bad copy
#: ``C`` at ``LOCATION`` repaired from copy ``S`` (:func:`repair_key`).
_REPAIR_KEY = re.compile(rf"{re.escape(OperationKind.FIXITY_CHECK.value)}:repair-copy(\d+)@copy(\d+)(?:->.*)?",
                         re.DOTALL)


def repair_key(copy_id: int, source_copy_id: int, location: str) -> str:
    """The dedup key of the ``fixity_check`` operation that repairs bad copy ``copy_id`` at
    data location ``location`` (its name) from copy ``source_copy_id``: one operation per
    (bad copy, source copy), so a repair whose source turned out bad too is followed by one
    from the next good source (DESIGN.md "Converging"). Read back by :func:`parse_repair_key`."""
    return dedup_key(OperationKind.FIXITY_CHECK, f"repair-copy{copy_id}@copy{source_copy_id}", location)


def parse_repair_key(key: str | None) -> tuple[int, int] | None:
    """``(copy_id, source_copy_id)`` of a repair operation's dedup key (:func:`repair_key`), or
    ``None`` for any other key (an audit, a recheck, another kind, ``None``). Raises nothing."""
    m = _REPAIR_KEY.fullmatch(key or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def is_repair(key: str | None) -> bool:
    """Whether ``key`` is a repair operation's dedup key (:func:`repair_key`), not an audit's or
    a recheck's."""
    return parse_repair_key(key) is not None


@dataclass
class Finding:
    """What re-reading one copy showed. ``status``: ``ok``, ``missing`` or ``corrupt``;
    ``actual``: the sha256 read (corrupt copies); ``error``: why it could not be read."""

    copy_id: int
    location: str
    path: str
    size: int
    expected: str
    status: str
    actual: str | None = None
    error: str | None = None
    raw_data_package_id: int | None = None
    data_transfer_package_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def bad(self) -> bool:
        return self.status != OK


def check_copy(backend: StorageBackend, copy: PhysicalCopy | Any, location: str, *,
               on_bytes: Callable[[int], None] | None = None) -> Finding:
    """Re-read ``copy`` (a :class:`PhysicalCopy` or a row with the same fields) through
    ``backend`` and compare size and sha256 (never an ETag or mtime; I4).

    The read keeps to whatever rate ``backend``'s layers hold it to; ``on_bytes(n)`` is called per block read
    (progress, lease checks). A key that cannot be read safely (I6) counts as missing.
    """
    f = Finding(copy.id, location, copy.path, copy.size, copy.sha256, OK,
                raw_data_package_id=copy.raw_data_package_id, data_transfer_package_id=copy.data_transfer_package_id)
    try:
        info = backend.stat(copy.path)
    except UnsafePathError as e:
        f.status, f.error = MISSING, str(e)
        return f
    if info is None:
        f.status = MISSING
        return f
    h = hashlib.sha256()
    try:
        stream = backend.open_read(copy.path)
    except SourceMissingError:  # gone since stat (e.g. moved aside by a concurrent repair)
        f.status = MISSING
        return f
    with stream:
        while True:
            block = stream.read(CHUNK_BYTES)
            if not block:
                break
            h.update(block)
            if on_bytes is not None:
                on_bytes(len(block))
    f.actual = h.hexdigest()
    if info.size != copy.size or f.actual != copy.sha256:
        f.status = CORRUPT
    return f


def _package_of(s: Session, f: Finding) -> tuple[str, str]:
    """``(what, name)`` of ``f``'s artifact: ``("raw data package", "cam/obs1")`` or ``("data
    transfer package", …)``; the name is what ``packhorse locate`` takes."""
    if f.raw_data_package_id is not None:
        p = s.get(RawDataPackage, f.raw_data_package_id)
        return "raw data package", p.name if p else str(f.raw_data_package_id)
    d = s.get(DataTransferPackage, f.data_transfer_package_id)
    return "data transfer package", d.name if d else str(f.data_transfer_package_id)


def _present_copies(s: Session, f: Finding) -> int:
    """Present copies of ``f``'s artifact that hold its bytes (a staged folder at a processing
    location is not one: :func:`packhorse.rules.policy.holds_artifact_bytes`)."""
    q = (select(func.count()).select_from(PhysicalCopy).join(DataLocation, DataLocation.id == PhysicalCopy.location_id)
         .where(PhysicalCopy.status == CopyStatus.PRESENT.value, DataLocation.role != LocationRole.PROCESSING.value))
    if f.raw_data_package_id is not None:
        q = q.where(PhysicalCopy.raw_data_package_id == f.raw_data_package_id)
    else:
        q = q.where(PhysicalCopy.data_transfer_package_id == f.data_transfer_package_id)
    return int(s.scalar(q) or 0)


def record_findings(session: Session, ctx: "ProcessContext", findings: Iterable[Finding], *,
                    operation_id: int | None = None) -> dict[str, list[Finding]]:
    """Record ``findings`` in the caller's transaction (see the module docstring).

    A bad finding only changes a copy that is still ``present`` with the same sha256 (a
    compare-and-set: a copy repaired or deleted meanwhile is left alone).

    Returns:
        ``{"recorded": [bad findings whose copy was marked], "all_bad": [bad findings of
        packages with no present copy left (CRITICAL, no repair)]}``.
    """
    now = utcnow()
    cooldown = ctx.settings.recovery.notification_cooldown_seconds
    marked: list[Finding] = []
    for f in findings:
        copy = session.get(PhysicalCopy, f.copy_id)
        if copy is None or copy.status != CopyStatus.PRESENT.value or copy.sha256 != f.expected:
            continue
        if not f.bad:
            copy.verified_at = now
            continue
        copy.status, copy.found_bad_at = f.status, now
        marked.append(f)
    session.flush()
    if marked:  # "archived" follows the copies in the same transaction (DESIGN.md "Converging")

        refresh_archived(session, ctx, [f.raw_data_package_id for f in marked if f.raw_data_package_id is not None])
    all_bad: list[Finding] = []
    by_package: dict[tuple[int | None, int | None], list[Finding]] = {}
    for f in marked:
        by_package.setdefault((f.raw_data_package_id, f.data_transfer_package_id), []).append(f)
    kind = OperationKind.FIXITY_CHECK.value
    for group in by_package.values():
        what, name = _package_of(session, group[0])
        label = f"{what} {name}"
        lines = [f"{g.status.upper()} {g.location}:{g.path} (expected sha256 {g.expected}, size {g.size}"
                 + (f"; read sha256 {g.actual}" if g.actual else "") + (f"; {g.error}" if g.error else "") + ")"
                 for g in group]
        context = {"package": label, "name": name, "copies": [{"location": g.location, "path": g.path, "status": g.status,
                                                 "expected": g.expected, "actual": g.actual} for g in group]}
        if _present_copies(session, group[0]) == 0:
            all_bad.extend(group)
            _all_copies_bad(session, label, lines, context, kind=kind, cooldown=cooldown, now=now,
                            gather=ctx.settings.notifications.digest_gather_seconds)
            continue
        for g, line in zip(group, lines):
            enqueue(session, level=NotificationLevel.ERROR, event=f"fixity_{g.status}",
                    subject=f"Fixity: {g.status} copy {g.location}:{g.path}",
                    body="\n".join([f"A copy of {label} failed its fixity check.", line,
                                    "A repair from another verified copy follows where one exists; "
                                    f"`packhorse locate {shlex.quote(name)}` shows its copies and "
                                    "their history."]),
                    context={**context, "copies": [c for c in context["copies"] if c["path"] == g.path
                                                   and c["location"] == g.location]},
                    operation_kind=kind, operation_id=operation_id, cooldown_seconds=cooldown, now=now)
    return {"recorded": marked, "all_bad": all_bad}


def live_copy_at(session: Session, location_id: int, raw_data_package_id: int | None,
                 data_transfer_package_id: int | None, *, other_than: int | None = None) -> int | None:
    """The id of a live copy (``LIVE_COPY_STATUSES``) of one artifact at ``location_id``, or
    ``None``: whether a bad copy there still needs its repair, or was repaired meanwhile (the
    unique constraint on live copies, I3, allows one per artifact and location).

    The artifact is the raw data package ``raw_data_package_id`` when it is not ``None``, else the
    data transfer package ``data_transfer_package_id`` (the column a physical copy fills).
    ``other_than``: a copy id to leave out (the copy being judged). One query, in the caller's
    session; raises nothing of its own."""
    col = PhysicalCopy.raw_data_package_id if raw_data_package_id is not None else \
        PhysicalCopy.data_transfer_package_id
    subject = raw_data_package_id if raw_data_package_id is not None else data_transfer_package_id
    q = select(PhysicalCopy.id).where(col == subject, PhysicalCopy.location_id == location_id,
                                      PhysicalCopy.status.in_([x.value for x in LIVE_COPY_STATUSES]))
    if other_than is not None:
        q = q.where(PhysicalCopy.id != other_than)
    return session.scalar(q.limit(1))


def recognise_returned(session: Session, ctx: "ProcessContext", findings: Iterable[Finding], *,
                       operation_id: int | None = None) -> list[Finding]:
    """Mark copies recorded ``missing`` or ``corrupt`` whose read-back was ``ok`` (the recorded
    size and sha256, I4) as ``present`` again, in the caller's transaction (DESIGN.md
    "Architecture": storage that was absent is not lost; a good copy put back under its key is
    the release of a package with no good source left). A copy is changed only while it is
    still ``missing``/``corrupt`` with the same sha256 and no other live copy of its artifact is
    at its location (a repair meanwhile wins; the unique constraint on live copies, I3).
    ``archived_at`` of the packages concerned is recomputed in the same transaction
    (:func:`packhorse.rules.policy.refresh_archived`). Queues one INFO notification
    (``fixity_copy_back``) per copy recognised; returns those findings."""
    now = utcnow()
    back: list[Finding] = []
    for f in findings:
        if f.bad:
            continue
        copy = session.get(PhysicalCopy, f.copy_id)
        if copy is None or copy.status not in (MISSING, CORRUPT) or copy.sha256 != f.expected:
            continue
        was = copy.status
        if live_copy_at(session, copy.location_id, copy.raw_data_package_id, copy.data_transfer_package_id,
                        other_than=copy.id) is not None:
            continue
        copy.status, copy.verified_at = CopyStatus.PRESENT.value, now
        back.append(f)
        enqueue(session, level=NotificationLevel.INFO, event="fixity_copy_back",
                subject=f"Fixity: copy back {f.location}:{f.path}",
                body=(f"The copy {f.location}:{f.path}, recorded {was}, holds its bytes again and read back with "
                      f"its recorded size {f.size} and sha256 {f.expected}: it counts as present (not rewritten)."),
                context={"location": f.location, "path": f.path, "sha256": f.expected, "was": was},
                operation_kind=OperationKind.FIXITY_CHECK.value, operation_id=operation_id, cooldown_seconds=0)
    session.flush()
    if back:  # "archived" follows the copies in the same transaction (DESIGN.md "Converging")

        refresh_archived(session, ctx, [f.raw_data_package_id for f in back if f.raw_data_package_id is not None])
    return back


def _render_all_bad(packages: list[dict[str, Any]]) -> tuple[str, str]:
    """Subject and body of the CRITICAL "every copy bad" message for ``packages`` (each
    ``{"package"`` (its label: "raw data package NAME" or "bundle NAME")``, "name", "lines",
    "locations"}``): one digest per set of locations, packages in name order (so the message
    reads the same whichever package's finding was recorded first)."""
    packages = sorted(packages, key=lambda p: str(p.get("name", p["package"])))
    first = packages[0]["package"]
    locations = sorted({loc for p in packages for loc in p["locations"]})
    subject = (f"Every copy of {first} looks bad at once" if len(packages) == 1 else
               f"Every copy looks bad at once: {len(packages)} packages at {', '.join(locations)}")
    body = [f"Every copy of {len(packages)} package(s) failed its fixity check at the same time.",
            "That pattern means a storage or configuration fault (a mount gone, credentials, a bucket), "
            "not bit rot: no copy is repaired from another. Where the source files still exist the package is "
            "rebuilt from them and re-archived (bad objects are quarantined, never overwritten); where they do not, "
            "`packhorse status` lists it as blocked (no_good_source).", ""]
    for p in packages[:DIGEST_BODY_MAX]:
        body += [f"{p['package']}:", *(f"  {line}" for line in p["lines"])]
    if len(packages) > DIGEST_BODY_MAX:
        body.append(f"… and {len(packages) - DIGEST_BODY_MAX} more packages (`packhorse verify`)")
    body += ["", f"Next: check that {', '.join(locations)} are mounted and reachable (`packhorse usage --measure`, "
                 "`packhorse verify`), then `packhorse diagnose --package "
                 + shlex.quote(packages[0].get("name", first)) + "`."]
    return subject, "\n".join(body)


def _all_copies_bad(session: Session, label: str, lines: list[str], context: dict[str, Any], *, kind: str,
                    cooldown: float, now: dt.datetime, gather: float) -> None:
    """Queue (or fold into the waiting digest of the same locations) the CRITICAL message for a
    package whose every copy failed at once: one root cause (a mount gone) hitting many
    packages is one message per cooldown window, listing them."""
    entry = {"package": label, "name": context["name"], "lines": lines,
             "locations": sorted({c["location"] for c in context["copies"]})}
    subject, body = _render_all_bad([entry])

    def merge(row: Notification) -> tuple[str, str, dict[str, Any]]:
        merged = {**(row.context or {})}
        merged["packages"] = [*merged.get("packages", []), entry]
        s, b = _render_all_bad(merged["packages"])
        return s, b, merged

    enqueue(session, level=NotificationLevel.CRITICAL, event="fixity_all_copies_bad", subject=subject, body=body,
            context={**context, "packages": [entry]}, operation_kind=kind, cooldown_seconds=cooldown, now=now,
            key="fixity_all_copies_bad:" + ",".join(entry["locations"]), gather_seconds=gather, merge=merge)


def location_name(session: Session, location_id: int) -> str:
    """Name of data location ``location_id``."""
    loc = session.get(DataLocation, location_id)
    assert loc is not None
    return loc.name
