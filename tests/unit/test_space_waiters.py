"""An operation waiting for room kept for work let in before it is made due once that work has
gone (:func:`packhorse.rules.space.space_freed`), though the disk's free bytes are then what
they were when it gave up: the bundle before it came, was unpacked, archived and freed. Before,
only "more bytes free than then" or a deletion since woke it, so a ``run --until-idle`` ended
with exit 4 and an empty buffer (CI, under load). Real SQLite ops database; the buffer's file
system is a fault hook's."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from packhorse.config import load_config
from packhorse.db.models import DataTransferPackage, Operation, RawDataPackage, utcnow
from packhorse.db.session import Database
from packhorse.domain import WAITING_SPACE, OperationKind
from packhorse.operations.lifecycle import create_operation, dedup_key
from packhorse.rules.space import space_freed
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.hooks import Hooks
from packhorse.runtime.topology import sync_topology
from packhorse.storage.usage import Usage
from support import write_site_config

FREE = 12_000_000


class _Disk(Hooks):
    """cologne-buffer's file system: ``FREE`` bytes free, whatever happens (the bytes of the
    bundle before came and went)."""

    def disk_usage(self) -> Any:
        return lambda location, root: Usage(total=12_582_912, used=12_582_912 - FREE, free=FREE)


@pytest.mark.parametrize("before", ["IN_PROGRESS", "COMPLETED"])
def test_a_transfer_waiting_for_the_one_before_it_is_due_once_that_one_has_gone(tmp_path: Path, before: str) -> None:
    settings = load_config(write_site_config(tmp_path / "site"))
    db = Database(settings.database_url)
    db.upgrade()
    ctx = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings), hooks=_Disk())
    ids, site = ctx.topology.location_ids, ctx.topology.site_ids
    try:
        def seed(s: Session) -> tuple[int, int]:
            ops = []
            for n in (1, 2):  # two bundles of 5 MB, each with a package of 2.5 MB: 7.5 MB at once each
                b = DataTransferPackage(name=f"b{n}", source_site_id=site["fyst"], bagging_date="2026-12-06",
                                        package_count=1, size=5_000_000, sha256="a" * 64)
                s.add(b)
                s.flush()
                s.add(RawDataPackage(name=f"inst/p{n}", group_path=f"inst/p{n}", source_location_id=ids["fyst-source"],
                                     bagging_date="2026-12-06", file_count=1, payload_bytes=2_400_000,
                                     size=2_500_000, sha256="b" * 64, data_transfer_package_id=b.id))
                op = create_operation(s, kind=OperationKind.TRANSFER, dedup_key=dedup_key(OperationKind.TRANSFER, f"b{n}"),
                                      site_id=site["cologne"], max_retries=3, data_transfer_package_id=b.id,
                                      source_location_id=ids["fyst-buffer"], destination_location_id=ids["cologne-buffer"])
                assert op is not None
                ops.append(op.id)
            s.flush()
            now = utcnow()
            s.execute(update(Operation).where(Operation.id == ops[0]).values(status=before))
            # the second gave up while the first was let in: 12 MB free, 7.5 MB its own + 7.5 kept
            s.execute(update(Operation).where(Operation.id == ops[1]).values(
                status="PENDING", not_before=now + dt.timedelta(minutes=5), updated_at=now,
                error_context={"waiting": WAITING_SPACE, "location": "cologne-buffer",
                               "location_id": ids["cologne-buffer"], "free_bytes": FREE}))
            return ops[0], ops[1]

        _, waiting = db.transact(seed)
        made_due = space_freed(ctx)
        not_before = db.read(lambda s: s.get(Operation, waiting).not_before)
        if before == "IN_PROGRESS":  # the one before still holds its room: it waits on
            assert made_due == 0 and not_before > utcnow() + dt.timedelta(minutes=4)
        else:
            assert made_due == 1 and not_before <= utcnow()
    finally:
        db.dispose()
