"""``long_term_archive``: write a raw data package once into a long-term archive, verified.

Idempotent (I3): if the archive already holds the same bytes the operation completes without
rewriting; different bytes raise :class:`~packhorse.errors.DestinationConflictError` (I2).
Publication is conditional (no-replace) and the object is re-read through its backend before
the copy is recorded (I4). The package is marked archived when every long-term archive of
every destination site of its route holds a verified copy (:func:`record_archive_copies`, once
for every archive copy completed in one transaction).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from packhorse.db.models import RawDataPackage
from packhorse.errors import SourceMissingError, VerificationError
from packhorse.rules.policy import mark_archived_many
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import raw_package_key
from packhorse.stages.base import (
    Recorder,
    Records,
    Work,
    copy_object,
    note_corrupt_source,
    note_lost_source,
    record_copies_at,
)


def preload(works: list[Work]) -> None:
    """Read the packages of every archive copy of one task in one statement, not one a copy
    (:attr:`~packhorse.stages.base.Work.preloaded`)."""
    ids = [w.op.raw_data_package_id for w in works]
    ctx = works[0].ctx
    pkgs = ctx.db.read(lambda s: {p.id: p for p in s.scalars(select(RawDataPackage).where(RawDataPackage.id.in_(ids)))})
    for w in works:
        w.preloaded = pkgs.get(w.op.raw_data_package_id)


def run(work: Work) -> Recorder:
    """Copy the package from the destination buffer to the archive; record the archive copy."""
    ctx = work.ctx
    pkg = work.preloaded if work.preloaded is not None else ctx.db.read(
        lambda s: s.get(RawDataPackage, work.op.raw_data_package_id))
    assert pkg is not None and pkg.size is not None and pkg.sha256 is not None
    src_name = ctx.location_name(work.op.source_location_id)
    dst_name = ctx.location_name(work.op.destination_location_id)
    key = raw_package_key(pkg.name)
    work.info.update(package=pkg.name, source=src_name, destination=dst_name, key=key)
    src = ctx.backend(src_name)
    ctx.hooks.hit("long_term_archive.start")  # hooks: claimed, nothing read yet
    try:
        copy_object(work, src, key, ctx.backend(dst_name), key, size=pkg.size, sha256=pkg.sha256,
                    point="long_term_archive")
    except SourceMissingError:  # the buffer copy is gone: recorded, so it is shipped again
        note_lost_source(work, src, key, location_id=work.op.source_location_id, raw_data_package_id=pkg.id)
        raise
    except VerificationError:  # the buffer copy rotted: quarantined and recorded missing, shipped again
        note_corrupt_source(work, src, key, expected_sha256=pkg.sha256, location_id=work.op.source_location_id,
                            raw_data_package_id=pkg.id)
        raise
    location_id = ctx.topology.location_ids[dst_name]
    return Records(record_archive_copies, (ctx, location_id, pkg.id, key, pkg.size, pkg.sha256))


def record_archive_copies(s: Session, items: list[tuple[ProcessContext, int, int, str, int, str]]) -> None:
    """Record archive copies ``(process context, archive location id, raw data package id, key,
    size in bytes, sha256)`` (:func:`~packhorse.stages.base.record_copies_at`) and then mark each of
    their packages archived once every archive it needs holds a verified copy
    (:func:`~packhorse.rules.policy.mark_archived_many`): a few statements for a whole task of
    copies, not a few a copy.

    Raises:
        DestinationConflictError: a live copy at an archive has other bytes (I2).
    """
    record_copies_at(s, [item[1:] for item in items])
    if items:
        mark_archived_many(s, items[0][0], [item[2] for item in items])
