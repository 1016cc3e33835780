"""A copy found gone is recorded ``missing`` only if it was recorded before its key was found
empty (:func:`packhorse.stages.base.mark_lost` ``seen_gone_at``): a failing transfer of a lost
bundle marked the bundle a rebuild had just made again ``missing``, and the bundle was built
a third time for nothing (seen in CI under load)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from packhorse.config import load_config
from packhorse.db.models import DataTransferPackage, PhysicalCopy, utcnow
from packhorse.db.session import Database
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from packhorse.stages.base import mark_lost
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
