"""A copy found gone is recorded ``missing`` only if it was recorded before its key was found
empty (:func:`packhorse.stages.base.mark_lost` ``seen_gone_at``): a failing transfer of a lost
bundle marked the bundle a rebuild had just made again ``missing``, and the bundle was built
a third time for nothing (seen in CI under load)."""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from packhorse.config import load_config
from packhorse.db.models import DataTransferPackage, PhysicalCopy, utcnow
from packhorse.db.session import Database
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from packhorse.stages.base import Work, mark_lost, note_corrupt_source
from support import write_site_config


def test_only_a_copy_recorded_before_the_look_is_marked_missing(tmp_path: Path) -> None:
    settings = load_config(write_site_config(tmp_path / "site"))
    db = Database(settings.database_url)
    db.upgrade()
    ctx = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    buf = ctx.topology.location_ids["fyst-buffer"]
    looked = utcnow()

    def add(s: Session, created: dt.datetime) -> int:
        dtp = DataTransferPackage(name=f"b{created.timestamp()}", source_site_id=ctx.topology.site_ids["fyst"],
                                  bagging_date="2026-12-01", package_count=1)
        s.add(dtp)
        s.flush()
        s.add(PhysicalCopy(data_transfer_package_id=dtp.id, location_id=buf, path=f"bundles/{dtp.name}.tar",
                           size=1, sha256="a" * 64, status="present", created_at=created))
        return dtp.id

    old = db.transact(lambda s: add(s, looked - dt.timedelta(seconds=5)))
    new = db.transact(lambda s: add(s, looked + dt.timedelta(seconds=1)))  # a rebuild, after the look
    for dtp in (old, new):
        db.transact(lambda s: mark_lost(s, location_id=buf, data_transfer_package_id=dtp, seen_gone_at=looked))
    status = dict(db.read(lambda s: s.execute(select(PhysicalCopy.data_transfer_package_id, PhysicalCopy.status)).all()))
    assert status == {old: "missing", new: "present"}
    db.transact(lambda s: mark_lost(s, location_id=buf, data_transfer_package_id=new))  # no look given: as before
    assert db.read(lambda s: s.scalar(select(PhysicalCopy.status).where(
        PhysicalCopy.data_transfer_package_id == new))) == "missing"


def test_where_a_rotten_source_went_is_recorded_even_when_another_attempt_recorded_it_missing_first(
        tmp_path: Path) -> None:
    # two transfers of one bundle (to two destinations) both met its rotten bytes: one moved them
    # aside, the other then found the key empty and its failure recorded the copy missing first;
    # the mover's failure (a compare-and-set on "present") then recorded nothing, and `locate`
    # never said where the bytes went (seen in CI)
    settings = load_config(write_site_config(tmp_path / "site"))
    db = Database(settings.database_url)
    db.upgrade()
    ctx = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    buf = ctx.topology.location_ids["fyst-buffer"]
    backend = ctx.backend("fyst-buffer")
    backend.create_root()
    key = "bundles/b1.tar"
    good = b"the bundle's bytes"
    w = backend.open_write(key)
    w.write(b"rotten bundle bytes")
    w.publish()

    def add(s: Session) -> int:
        dtp = DataTransferPackage(name="b1", source_site_id=ctx.topology.site_ids["fyst"],
                                  bagging_date="2026-12-01", package_count=1)
        s.add(dtp)
        s.flush()
        s.add(PhysicalCopy(data_transfer_package_id=dtp.id, location_id=buf, path=key, size=len(good),
                           sha256=hashlib.sha256(good).hexdigest(), status="present"))
        return dtp.id

    dtp = db.transact(add)
    mover = Work(ctx, None, None, None)  # type: ignore[arg-type]  # only its context and salvage are used
    ordered = note_corrupt_source(mover, backend, key, expected_sha256=hashlib.sha256(good).hexdigest(),
                                  location_id=buf, data_transfer_package_id=dtp)
    assert ordered and backend.stat(key) is None
    # the other attempt's failure commits first; then the mover's
    db.transact(lambda s: mark_lost(s, location_id=buf, data_transfer_package_id=dtp))
    assert mover.salvage is not None
    db.transact(mover.salvage)

    copy = db.read(lambda s: s.execute(select(PhysicalCopy.status, PhysicalCopy.quarantined_as)).one())
    assert copy.status == "missing" and copy.quarantined_as is not None, copy
    with backend.open_read(copy.quarantined_as) as f:
        assert f.read() == b"rotten bundle bytes"
