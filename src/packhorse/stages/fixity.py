"""``fixity_check``: re-verify one archived copy; repair it from another verified copy.

The check and what is recorded follow :mod:`packhorse.rules.fixity` (shared with ``packhorse
verify``). A bad copy makes the stage check every other ``present`` copy of the same package
at once (rate limited like the first): if none is good, :func:`~packhorse.rules.fixity.record_findings`
queues one CRITICAL notification and no copy is repaired from another (a storage fault, not
rot; the desired state rebuilds it from its source files, :mod:`packhorse.rules.convergence`).
Otherwise every bad copy at a long-term archive is repaired from a copy just verified that it
may be repaired from (:func:`packhorse.rules.convergence.repair_sources`: an archive, or its own site):

1. the bad object is moved aside with :meth:`~packhorse.storage.base.StorageBackend.quarantine`
   (``_packhorse/quarantine/<key>.<UTC stamp>-<random>``; never overwriting), unless the key
   already holds exactly the right bytes (an earlier attempt's repair); a folder, a link or a
   special file standing at the key (the copy counts as missing) is moved aside whole, unread;
   where it went is recorded on the bad copy's row at once (``quarantined_as``, ``quarantined_at``:
   :func:`~packhorse.stages.base.note_quarantined`), shown by ``packhorse locate``;
2. the package is copied write-once from the good copy (bytes hashed while copied,
   compared before publishing, re-read after: I2, I4);
3. the completion transaction records the new ``present`` copy and an INFO notification.

An operation created for a copy already marked ``corrupt``/``missing`` (by ``packhorse
verify`` or an earlier attempt) reads that copy back first: if its bytes are back (a
remounted disk, a good copy put back by hand under its key) and match the recorded size and
sha256, the same copy is ``present`` again (:func:`~packhorse.rules.fixity.recognise_returned`),
nothing is written; otherwise it goes on to the repair.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from packhorse.db.models import DataLocation, PhysicalCopy
from packhorse.domain import LIVE_COPY_STATUSES, CopyStatus, LocationRole, NotificationLevel, OperationKind
from packhorse.errors import LocationUnavailableError, SourceMissingError, UnsafePathError
from packhorse.notify.outbox import enqueue
from packhorse.rules.availability import look
from packhorse.rules.convergence import repair_sources
from packhorse.rules.fixity import Finding, check_copy, recognise_returned, record_findings
from packhorse.rules.policy import mark_archived_if_complete
from packhorse.stages.base import Recorder, Work, copy_object, note_quarantined, record_copy
from packhorse.stages.staging import ensure_readable


def _copies_of(s: Session, copy: PhysicalCopy) -> list[PhysicalCopy]:
    """The other copies of ``copy``'s artifact that hold its bytes: staged folders at processing
    locations left out (:func:`packhorse.rules.policy.holds_artifact_bytes`: they are neither
    checked as package copies nor sources of a repair)."""
    q = (select(PhysicalCopy).join(DataLocation, DataLocation.id == PhysicalCopy.location_id)
         .where(PhysicalCopy.id != copy.id, DataLocation.role != LocationRole.PROCESSING.value))
    if copy.raw_data_package_id is not None:
        q = q.where(PhysicalCopy.raw_data_package_id == copy.raw_data_package_id)
    else:
        q = q.where(PhysicalCopy.data_transfer_package_id == copy.data_transfer_package_id)
    return list(s.scalars(q.order_by(PhysicalCopy.id)))


def _check(work: Work, copy: PhysicalCopy) -> Finding:
    loc = work.ctx.location_name(copy.location_id)
    backend = work.ctx.backend(loc, fixity=True)  # reads keep to fixity_bytes_per_second
    try:
        there = backend.stat(copy.path) is not None
    except UnsafePathError:
        there = False  # not a regular file at the key (a folder, a link): check_copy says missing
    if there:
        ensure_readable(work, backend, copy.path)  # a cold copy: restore first, come back later
    return check_copy(backend, copy, loc, on_bytes=work.progress)


def _check_sources(work: Work, copies: list[PhysicalCopy]) -> tuple[list[Finding], LocationUnavailableError | None]:
    """Check ``copies`` (the other copies of the package, or those a repair may read) and
    return the findings, plus the first unavailability met: a copy on a location that is
    unavailable now (:func:`packhorse.rules.availability.look`: its root or marker missing) is not
    judged (an empty mount point must not make it "missing") and the others are checked all
    the same, so a repair with a good source elsewhere does not wait for that location."""
    findings: list[Finding] = []
    away: LocationUnavailableError | None = None
    for c in copies:
        err = look(work.ctx, work.ctx.location_name(c.location_id))
        if err is None:
            try:
                findings.append(_check(work, c))
                continue
            except LocationUnavailableError as e:  # it went away while it was read
                err = e
        away = away or err
    return findings, away


def run(work: Work) -> Recorder:
    """Check the operation's copy; on a problem check its siblings and repair (see module)."""
    ctx = work.ctx
    op_id = work.op.id
    copy_id = work.op.physical_copy_id
    assert copy_id is not None
    copy, others = ctx.db.read(lambda s: (s.get(PhysicalCopy, copy_id), _copies_of(s, s.get(PhysicalCopy, copy_id))))
    assert copy is not None
    loc = ctx.location_name(copy.location_id)
    work.info.update(location=loc, key=copy.path)
    present = [c for c in others if c.status == CopyStatus.PRESENT.value]
    if copy.status == CopyStatus.PRESENT.value:
        first = _check(work, copy)
        if not first.bad:
            def stamp(s: Session) -> None:
                record_findings(s, ctx, [first], operation_id=op_id)

            return stamp
        others, away = _check_sources(work, present)
        findings = [first] + others
        outcome = ctx.db.transact(lambda s: record_findings(s, ctx, findings, operation_id=op_id))
        if outcome["all_bad"]:
            work.info.update(result="every copy bad: CRITICAL notification, no repair")
            return lambda s: None
        good = [f for f in findings if not f.bad]
        to_repair = list(outcome["recorded"])
    elif copy.status in (CopyStatus.CORRUPT.value, CopyStatus.MISSING.value):
        # the bytes may be back (a remounted disk, a good copy put back by hand): never rewrite them
        again = _check(work, copy)
        if not again.bad:
            work.info.update(result="copy back: recognised after read-back")

            def back(s: Session) -> None:
                recognise_returned(s, ctx, [again], operation_id=op_id)

            return back
        # only the copies it may be repaired from (an archive, or its own site)
        findings, away = _check_sources(work, repair_sources(ctx, loc, present))
        ctx.db.transact(lambda s: record_findings(s, ctx, findings, operation_id=op_id))
        good = [f for f in findings if not f.bad]
        to_repair = [Finding(copy.id, loc, copy.path, copy.size, copy.sha256, copy.status,
                             raw_data_package_id=copy.raw_data_package_id,
                             data_transfer_package_id=copy.data_transfer_package_id)]
    else:  # deleted or being deleted: nothing to audit
        return lambda s: None
    to_repair = [f for f in to_repair if ctx.topology.location_role[f.location] is LocationRole.LONG_TERM_ARCHIVE]
    if not good and to_repair and away is not None:
        # no good copy among those that could be read, one not read: wait for its location
        # (recorded above: what was found bad stays recorded; the retry repairs from it)
        raise away
    if not good or not to_repair:
        work.info.update(result="no verified copy to repair from" if not good else "nothing to repair")
        return lambda s: None
    good.sort(key=lambda f: ctx.settings.location(f.location).cold)  # warm sources first
    by_id = {c.id: c for c in present}
    repaired: list[tuple[Finding, str | None, Finding, bool]] = []
    for bad in to_repair:
        eligible = {c.id for c in repair_sources(ctx, bad.location, [by_id[f.copy_id] for f in good
                                                                     if f.copy_id in by_id])}
        source = next((f for f in good if f.copy_id in eligible), None)
        if source is None:
            continue  # no source it may be repaired from: re-shipped along the route first
        if ctx.db.read(lambda s, b=bad: _live_copy_at(s, b)):
            continue  # repaired meanwhile
        dst = ctx.backend(bad.location)
        quarantined = None
        try:
            info = dst.stat(bad.path)
            if info is not None and not (info.size == bad.size and dst.sha256(bad.path) == bad.expected):
                quarantined = dst.quarantine(bad.path)
        except SourceMissingError:
            pass  # moved aside meanwhile by a concurrent repair of the same copy: nothing left to move
        except UnsafePathError:
            # a folder, a link or a special file stands at the key: moved aside whole, unread
            quarantined = dst.quarantine(bad.path)

        if quarantined is not None:
            ctx.db.transact(lambda s, b=bad, q=quarantined: note_quarantined(s, b.copy_id, q))
        work.check()
        result = copy_object(work, ctx.backend(source.location), source.path, dst, bad.path, size=bad.size,
                             sha256=bad.expected, point="fixity_check")
        repaired.append((bad, quarantined, source, not result.already_there))
    work.info.update(repaired=[f"{b.location}:{b.path}" for b, _, _, _ in repaired],
                     source=sorted({src.location for _, _, src, _ in repaired}))

    def record(s: Session) -> None:
        for bad, quarantined, source, wrote in repaired:
            if _live_copy_at(s, bad):
                # a concurrent audit recorded the copy first: a repair of a sibling copy, or
                # the copy's own audit, which read back the bytes this repair had just written
                # (then this repair is still the one to report: it wrote them)
                if not wrote:
                    continue
            else:
                record_copy(s, location_id=ctx.topology.location_ids[bad.location], key=bad.path, size=bad.size,
                            sha256=bad.expected, raw_data_package_id=bad.raw_data_package_id,
                            data_transfer_package_id=bad.data_transfer_package_id)
                if bad.raw_data_package_id is not None:

                    mark_archived_if_complete(s, ctx, bad.raw_data_package_id)
            enqueue(s, level=NotificationLevel.INFO, event="fixity_repaired",
                    subject=f"Fixity: repaired {bad.location}:{bad.path}",
                    body="\n".join([f"The {bad.status} copy {bad.location}:{bad.path} was re-archived from "
                                    f"{source.location}:{source.path} and verified (sha256 {bad.expected}).",
                                    f"The bad object was moved aside to {quarantined}." if quarantined
                                    else "There was no object left to move aside."]),
                    context={"location": bad.location, "path": bad.path, "source": source.location,
                             "quarantined_as": quarantined, "sha256": bad.expected},
                    operation_kind=OperationKind.FIXITY_CHECK.value, operation_id=op_id, cooldown_seconds=0)

    return record


def _live_copy_at(s: Session, f: Finding) -> bool:
    q = select(PhysicalCopy.id).where(PhysicalCopy.location_id == s.scalar(
        select(PhysicalCopy.location_id).where(PhysicalCopy.id == f.copy_id)),
        PhysicalCopy.status.in_([x.value for x in LIVE_COPY_STATUSES]))
    if f.raw_data_package_id is not None:
        q = q.where(PhysicalCopy.raw_data_package_id == f.raw_data_package_id)
    else:
        q = q.where(PhysicalCopy.data_transfer_package_id == f.data_transfer_package_id)
    return s.scalar(q) is not None
