"""``data_transfer_package``: bundle raw data packages into one bag tar at the source buffer.

The bundle's payload is the raw package tars, ``data/<package name>.tar``; its manifest
carries their sha256 so the destination verifies each one on unpack.

A raw package tar that is gone from the buffer (``SourceMissingError``), or whose bytes are not
its recorded size and sha256 (``SourceChangedError``: it rotted, or another file was put under
its name), fails the build permanently; the failure also records that copy ``missing`` (a bad
one is first moved into the buffer's quarantine, never overwritten: I2), fenced with the
failure (I3). The desired state then rebuilds the package from its source files and builds the
bundle again (:mod:`packhorse.rules.convergence`), whose completion makes this failure history.
"""

from __future__ import annotations

import calendar

from sqlalchemy import select
from sqlalchemy.orm import Session

from packhorse.bags.packaging import PayloadFile, write_bag_tar
from packhorse.db.models import DataTransferPackage, RawDataPackage
from packhorse.errors import DestinationConflictError, SourceChangedError, SourceMissingError
from packhorse.runtime.topology import bundle_key, raw_package_key
from packhorse.stages.base import (
    Recorder,
    Work,
    clear_partials,
    note_corrupt_source,
    note_lost_source,
    publish_verified,
    record_copy,
    there_or_moved_aside,
)


def run(work: Work) -> Recorder:
    """Build, publish and verify the bundle tar; record its size, sha256 and buffer copy."""
    ctx = work.ctx
    dtp_id = work.op.data_transfer_package_id

    def load(s: Session) -> tuple[DataTransferPackage, list[RawDataPackage]]:
        dtp = s.get(DataTransferPackage, dtp_id)
        assert dtp is not None
        pkgs = list(s.scalars(select(RawDataPackage).where(RawDataPackage.data_transfer_package_id == dtp_id)))
        return dtp, pkgs

    dtp, pkgs = ctx.db.read(load)
    buf_name = ctx.location_name(work.op.destination_location_id)
    buf = ctx.backend(buf_name)
    key = bundle_key(dtp.name)
    work.info.update(bundle=dtp.name, destination=buf_name, key=key)
    ctx.hooks.hit("data_transfer_package.start")  # hooks: claimed, nothing read yet
    if there_or_moved_aside(buf, key, dtp.size, dtp.sha256, work.ctx):
        size, sha = dtp.size, dtp.sha256
    else:
        mtime = calendar.timegm(dtp.created_at.utctimetuple())
        payload = [
            PayloadFile(path=f"{p.name}.tar", size=p.size or 0, sha256=p.sha256 or "", mtime=mtime,
                        open=(lambda k=raw_package_key(p.name): buf.open_read(k)))  # noqa: B008 (binds each key)
            for p in pkgs
        ]
        site = ctx.topology.site_name(dtp.source_site_id)
        clear_partials(buf, key)
        try:
            with buf.open_write(key) as w:
                write_bag_tar(w, bag_dir=dtp.name, files=payload,
                              bag_info={"Packhorse-Source-Site": site, "Packhorse-Package-Count": str(len(pkgs))},
                              bagging_date=dtp.bagging_date, external_identifier=dtp.name, tag_mtime=mtime,
                              on_bytes=work.progress)
                result = publish_verified(work, w, buf, expected_sha256=dtp.sha256, point="data_transfer_package")
        except SourceMissingError:  # a package tar is gone from the buffer: recorded, so it is rebuilt
            buf_id = work.op.destination_location_id
            for p in pkgs:
                note_lost_source(work, buf, raw_package_key(p.name), location_id=buf_id, raw_data_package_id=p.id)
            raise
        except SourceChangedError as e:  # a package tar is not its recorded bytes: quarantined, rebuilt
            bad = next((p for p in pkgs if f"{p.name}.tar" == e.path), None)
            if bad is None or bad.sha256 is None:
                raise
            pkey = raw_package_key(bad.name)
            moved = note_corrupt_source(work, buf, pkey, expected_sha256=bad.sha256,
                                        location_id=work.op.destination_location_id, raw_data_package_id=bad.id)
            raise SourceChangedError(
                f"{buf_name}:{pkey}: the raw package tar is not its recorded bytes ({e})", step="data_transfer_package",
                side="source", path=pkey, host=buf_name,
                diagnosis=("the package tar was damaged or replaced in the buffer: moved into the buffer's quarantine; "
                           "the package is rebuilt from its source files and the bundle built again" if moved else
                           e.diagnosis)) from e
        size, sha = result.size, result.sha256
    assert size is not None and sha is not None
    location_id = ctx.topology.location_ids[buf_name]

    def record(s: Session) -> None:
        row = s.get(DataTransferPackage, dtp_id)
        assert row is not None
        if row.sha256 is None:
            row.size, row.sha256 = size, sha
        elif row.sha256 != sha:
            raise DestinationConflictError(f"bundle {row.name!r} rebuilt with sha256 {sha}, recorded {row.sha256}")
        record_copy(s, location_id=location_id, key=key, size=size, sha256=sha, data_transfer_package_id=dtp_id)

    return record
