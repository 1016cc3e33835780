"""A partial bundle ships at once while fewer than ``bundles_in_flight`` bundles of its site are
in flight (:mod:`packhorse.managers.bundles`), and waits ``bundle_max_wait_seconds`` otherwise.

The bundle manager runs against the rows a site's pipeline would leave (SQLite): which bundles
it makes, and with which packages, is read back from the database.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from packhorse.config import load_config
from packhorse.db.models import DataTransferPackage, Operation, PhysicalCopy, RawDataPackage, utcnow
from packhorse.db.session import Database
from packhorse.domain import CopyStatus, OperationKind, Status
from packhorse.managers import bundles
from packhorse.operations.lifecycle import create_operation, dedup_key
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from support import package_at_source_buffer, write_site_config


def _ctx(tmp_path: Path, in_flight: int) -> ProcessContext:
    settings = load_config(write_site_config(tmp_path / "site", bundle_max_wait_seconds=300))
    settings = settings.model_copy(update={"packaging": settings.packaging.model_copy(
        update={"bundles_in_flight": in_flight})})
    db = Database(settings.database_url)
    db.upgrade()
    return ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))


@pytest.fixture
def make_ctx(tmp_path: Path):
    made: list[ProcessContext] = []

    def make(in_flight: int) -> ProcessContext:
        made.append(_ctx(tmp_path, in_flight))
        return made[-1]

    yield make
    for c in made:
        c.db.dispose()


def _bundles(ctx: ProcessContext) -> list[list[int]]:
    """Every bundle's packages (ids), bundles in id order."""
    def read(s: Session) -> list[list[int]]:
        out: dict[int, list[int]] = {}
        for pkg_id, dtp_id in s.execute(select(RawDataPackage.id, RawDataPackage.data_transfer_package_id)
                                        .where(RawDataPackage.data_transfer_package_id.is_not(None))
                                        .order_by(RawDataPackage.id)):
            out.setdefault(dtp_id, []).append(pkg_id)
        return [out[k] for k in sorted(out)]

    return ctx.db.read(read)


def _built(ctx: ProcessContext, dtp_id: int) -> None:
    """The bundle's build completed: its operation done, the bundle present at the source buffer."""
    def tx(s: Session) -> None:
        s.execute(Operation.__table__.update().where(
            Operation.data_transfer_package_id == dtp_id,
            Operation.kind == OperationKind.DATA_TRANSFER_PACKAGE.value).values(status=Status.COMPLETED.value))
        s.add(PhysicalCopy(data_transfer_package_id=dtp_id, location_id=ctx.topology.location_ids["fyst-buffer"],
                           path=f"bundles/{dtp_id}.tar", size=5000, sha256=f"{dtp_id:064x}",
                           status=CopyStatus.PRESENT.value, created_at=utcnow(), verified_at=utcnow()))

    ctx.db.transact(tx)


def _transferred(ctx: ProcessContext, dtp_id: int, destination_site: str, status: Status) -> None:
    def tx(s: Session) -> None:
        buf = ctx.settings.buffer_of(destination_site).name
        op = create_operation(s, kind=OperationKind.TRANSFER,
                              dedup_key=dedup_key(OperationKind.TRANSFER, f"dtp{dtp_id}", buf),
                              site_id=ctx.topology.site_ids[destination_site], max_retries=3,
                              data_transfer_package_id=dtp_id,
                              source_location_id=ctx.topology.location_ids["fyst-buffer"],
                              destination_location_id=ctx.topology.location_ids[buf])
        op.status = status.value

    ctx.db.transact(tx)


def _bundle_ids(ctx: ProcessContext) -> list[int]:
    return ctx.db.read(lambda s: list(s.execute(select(DataTransferPackage.id).order_by(DataTransferPackage.id))
                                      .scalars()))


def test_without_bundles_in_flight_a_partial_bundle_waits(make_ctx) -> None:
    ctx = make_ctx(0)
    package_at_source_buffer(ctx, 1)
    created, due_in = bundles.manage(ctx)
    assert created == 0 and _bundles(ctx) == []
    assert due_in is not None and 290 < due_in <= 300


def test_a_partial_bundle_ships_while_the_link_is_idle_and_waits_while_one_is_in_flight(make_ctx) -> None:
    ctx = make_ctx(1)
    first = [package_at_source_buffer(ctx, 1), package_at_source_buffer(ctx, 2)]
    assert bundles.manage(ctx)[0] == 1  # nothing in flight: ships at once, not after 300 s
    assert _bundles(ctx) == [first]
    (dtp,) = _bundle_ids(ctx)

    later = package_at_source_buffer(ctx, 3)
    created, due_in = bundles.manage(ctx)  # the first bundle is being built: in flight
    assert created == 0 and due_in is not None and due_in > 290
    _built(ctx, dtp)
    assert bundles.manage(ctx)[0] == 0  # built, its transfers not made yet: still in flight
    _transferred(ctx, dtp, "cologne", Status.IN_PROGRESS)
    _transferred(ctx, dtp, "cornell", Status.COMPLETED)
    assert bundles.manage(ctx)[0] == 0  # at cornell, still on its way to cologne
    assert _bundles(ctx) == [first]

    def cologne_done(s: Session) -> None:
        s.execute(Operation.__table__.update().where(Operation.data_transfer_package_id == dtp,
                                                     Operation.kind == OperationKind.TRANSFER.value)
                  .values(status=Status.COMPLETED.value))

    ctx.db.transact(cologne_done)
    assert bundles.manage(ctx)[0] == 1  # at every destination: the link is idle again
    assert _bundles(ctx) == [first, [later]]


def test_a_transfer_failed_for_good_holds_partial_bundles_to_the_wait_not_longer(make_ctx) -> None:
    ctx = make_ctx(1)
    package_at_source_buffer(ctx, 1)
    assert bundles.manage(ctx)[0] == 1
    (dtp,) = _bundle_ids(ctx)
    _built(ctx, dtp)
    _transferred(ctx, dtp, "cologne", Status.FAILED)  # waits for an operator
    _transferred(ctx, dtp, "cornell", Status.COMPLETED)
    package_at_source_buffer(ctx, 2)
    assert bundles.manage(ctx)[0] == 0  # counted as in flight: waits as with bundles_in_flight = 0
    old = package_at_source_buffer(ctx, 3, age_seconds=301)
    assert bundles.manage(ctx)[0] == 1  # the oldest waited bundle_max_wait_seconds: ships
    assert old in _bundles(ctx)[-1]


def test_full_bundles_made_in_the_same_cycle_count_as_in_flight(make_ctx) -> None:
    ctx = make_ctx(2)
    target = ctx.settings.packaging.bundle_target_bytes
    big = package_at_source_buffer(ctx, 1)

    def grow(s: Session) -> None:
        s.get(RawDataPackage, big).size = target  # a full bundle on its own

    ctx.db.transact(grow)
    a, b = package_at_source_buffer(ctx, 2), package_at_source_buffer(ctx, 3)
    assert bundles.manage(ctx)[0] == 2  # the full one, and the partial (1 in flight < 2)
    assert _bundles(ctx) == [[big], [a, b]]
    c = package_at_source_buffer(ctx, 4)
    assert bundles.manage(ctx)[0] == 0  # two in flight
    assert c not in sum(_bundles(ctx), [])
