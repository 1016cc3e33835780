"""One root cause, many packages: when an archive location vanishes, every copy of many
packages fails its fixity check at once; that is one CRITICAL message per cooldown window
listing them (a digest), not one per package (found by a new-user trial: six mails)."""

from __future__ import annotations

import os

from sqlalchemy import select

from packhorse.db.models import Notification, PhysicalCopy, RawDataPackage
from packhorse.domain import LocationRole
from packhorse.executors.local import LocalRunner
from packhorse.rules.fixity import Finding, record_findings
from packhorse.runtime.context import ProcessContext
from support import write_settled


def test_every_copy_of_many_packages_bad_at_once_is_one_critical_digest(pipeline_ctx: ProcessContext) -> None:
    ctx = pipeline_ctx
    source = ctx.settings.location_path("fyst-source")
    for unit in ("obs-1", "obs-2", "obs-3"):
        write_settled(source / "cam" / unit / "frame.fits", os.urandom(2000))
    LocalRunner(ctx).run(until_idle=True)
    archives = {name for name, role in ctx.topology.location_role.items() if role is LocationRole.LONG_TERM_ARCHIVE}

    def archive_copies(s):  # type: ignore[no-untyped-def]
        return [(c, name) for c, name in s.execute(
            select(PhysicalCopy, RawDataPackage.name).join(RawDataPackage,
                                                           PhysicalCopy.raw_data_package_id == RawDataPackage.id))
                if ctx.location_name(c.location_id) in archives]

    copies = ctx.db.read(archive_copies)
    assert len({name for _, name in copies}) == 3
    # the archive mounts are gone: every archive copy of every package reads as missing; the
    # findings arrive last package first, and the digest still reads in name order
    copies.sort(key=lambda pair: pair[1], reverse=True)
    findings = [Finding(c.id, ctx.location_name(c.location_id), c.path, c.size, c.sha256, "missing",
                        error="not found", raw_data_package_id=c.raw_data_package_id) for c, _ in copies]
    ctx.db.transact(lambda s: record_findings(s, ctx, findings))

    notes = ctx.db.read(lambda s: list(s.scalars(select(Notification).where(
        Notification.event == "fixity_all_copies_bad"))))
    assert len(notes) == 1 and notes[0].level == "CRITICAL"
    (note,) = notes
    assert "3 packages" in note.subject
    for name in ("cam/obs-1", "cam/obs-2", "cam/obs-3"):
        assert name in note.body
    # the command as it runs: the package's name, not its label ("raw data package cam/obs-1")
    assert "`packhorse diagnose --package cam/obs-1`" in note.body
