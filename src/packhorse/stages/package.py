"""``raw_data_package``: build a raw data package's BagIt tar at the source site's buffer.

The tar is deterministic (DESIGN.md I3): a rebuild after a crash yields the same bytes and
meets "already there". Source bytes are checked against the sha256 registered by the scan
while they stream into the tar (I4); the published tar is re-read and verified.
"""

from __future__ import annotations

import calendar
import datetime as dt
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from ..db.models import RawDataFile, RawDataPackage
from ..errors import DestinationConflictError
from ..packaging import PayloadFile, write_bag_tar
from ..topology import raw_package_key
from .base import Recorder, Work, already_there, clear_partials, publish_verified, record_copy


def bag_dir_name(name: str) -> str:
    """Top folder of a package's bag inside its tar: the name's folders joined by ``__``
    (``instrument-00/obs-0003`` → ``instrument-00__obs-0003``).

    One-to-one, so two packages never unpack into one folder (``a__b/c`` and ``a/b__c`` both
    read ``a__b__c`` joined plainly, and the second bag extracted over the first broke both):
    ``%`` is written ``%25``, and an ``_`` that would touch a ``__`` — one next to another
    ``_``, or at a folder's end that meets the joint — is written ``%5F``. Names without
    ``%``, ``__`` or such an edge ``_`` come out as before."""
    parts = name.split("/")
    out = []
    for k, part in enumerate(parts):
        part = part.replace("%", "%25")
        chars = list(part)
        for i, ch in enumerate(part):
            if ch != "_":
                continue
            double = (i > 0 and part[i - 1] == "_") or (i + 1 < len(part) and part[i + 1] == "_")
            at_joint = (i == 0 and k > 0) or (i == len(part) - 1 and k < len(parts) - 1)
            if double or at_joint:
                chars[i] = "%5F"
        out.append("".join(chars))
    return "__".join(out)


def _epoch(d: dt.datetime) -> int:
    return calendar.timegm(d.utctimetuple())


def _bagging_day_epoch(bagging_date: str) -> int:
    """Midnight UTC of the Bagging-Date (``YYYY-MM-DD``), used as the tag files' mtime.

    The tar's bytes then depend on the Bagging-Date only, not on the second the package row
    was created (I3): the same files packaged again on the same day give the same bytes and
    meet "already there" at a destination instead of a conflict.
    """
    return _epoch(dt.datetime.strptime(bagging_date, "%Y-%m-%d").replace(tzinfo=dt.timezone.utc))


def run(work: Work) -> Recorder:
    """Build, publish and verify the package tar; record its size, sha256 and buffer copy."""
    ctx = work.ctx
    pkg_id = work.op.raw_data_package_id

    def load(s: Session) -> tuple[RawDataPackage, list[Any]]:
        pkg = s.get(RawDataPackage, pkg_id)
        assert pkg is not None
        # plain rows, not ORM objects: a package may hold thousands of files
        files = s.execute(select(RawDataFile.relative_path, RawDataFile.size, RawDataFile.sha256,
                                 RawDataFile.mtime_ns).where(RawDataFile.raw_data_package_id == pkg_id)).all()
        return pkg, files

    pkg, files = ctx.db.read(load)
    src = ctx.backend(ctx.location_name(work.op.source_location_id))
    dst_name = ctx.location_name(work.op.destination_location_id)
    dst = ctx.backend(dst_name)
    key = raw_package_key(pkg.name)
    work.info.update(package=pkg.name, destination=dst_name, key=key)

    if already_there(dst, key, pkg.size, pkg.sha256):
        size, sha = pkg.size, pkg.sha256
    else:
        payload = [
            PayloadFile(path=f.relative_path, size=f.size, sha256=f.sha256, mtime=f.mtime_ns // 1_000_000_000,
                        open=(lambda p=f.relative_path: src.open_read(p)))
            for f in files
        ]
        loc = ctx.settings.location(ctx.location_name(pkg.source_location_id))
        bag_info = {
            "Packhorse-Group": pkg.group_path,
            "Packhorse-Source-Site": loc.site,
            "Packhorse-Source-Location": loc.name,
        }
        clear_partials(dst, key)
        with dst.open_write(key) as w:
            write_bag_tar(w, bag_dir=bag_dir_name(pkg.name), files=payload, bag_info=bag_info,
                          bagging_date=pkg.bagging_date, external_identifier=pkg.name,
                          tag_mtime=_bagging_day_epoch(pkg.bagging_date), on_bytes=work.progress)
            result = publish_verified(work, w, dst, expected_sha256=pkg.sha256, point="raw_data_package")
        size, sha = result.size, result.sha256
    assert size is not None and sha is not None
    location_id = ctx.topology.location_ids[dst_name]

    def record(s: Session) -> None:
        t = RawDataPackage.__table__
        row = s.connection().execute(select(t.c.name, t.c.sha256).where(t.c.id == pkg_id)).first()
        assert row is not None
        if row.sha256 is None:
            s.connection().execute(update(t).where(t.c.id == pkg_id).values(size=size, sha256=sha))
        elif row.sha256 != sha:
            raise DestinationConflictError(f"package {row.name!r} rebuilt with sha256 {sha}, recorded {row.sha256}")
        record_copy(s, location_id=location_id, key=key, size=size, sha256=sha, raw_data_package_id=pkg_id)

    return record
