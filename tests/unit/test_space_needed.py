"""What an operation must hold at once at the location it writes to
(:func:`packhorse.rules.space.space_needed`): the lower bound that decides whether a full
location can ever take it (a bundle twice its packages, an unpack the bundle and its largest
package), on database rows."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import Session

from packhorse.config import load_config
from packhorse.db.models import DataTransferPackage, Operation, RawDataFile, RawDataPackage
from packhorse.db.session import Database
from packhorse.domain import OperationKind
from packhorse.rules.space import space_needed, still_to_write
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from support import write_site_config

SHA = "a" * 64


def test_each_kind_needs_what_it_writes_and_what_must_stay_beside_it(tmp_path: Path) -> None:
    settings = load_config(write_site_config(tmp_path / "site"))
    db = Database(settings.database_url)
    db.upgrade()
    ctx = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    ids, site = ctx.topology.location_ids, ctx.topology.site_ids["fyst"]

    def tx(s: Session) -> dict[str, int | None]:
        dtp = DataTransferPackage(name="b1", source_site_id=site, bagging_date="2026-12-01", package_count=2,
                                  size=13_000, sha256=SHA)
        unsized = DataTransferPackage(name="b2", source_site_id=site, bagging_date="2026-12-01", package_count=0)
        s.add_all([dtp, unsized])
        s.flush()
        pkgs = []
        for name, size in (("inst/a", 5_000), ("inst/b", 7_000)):
            p = RawDataPackage(name=name, group_path=name, source_location_id=ids["fyst-source"],
                               bagging_date="2026-12-01", file_count=2, payload_bytes=size - 1_000, size=size,
                               sha256=SHA, data_transfer_package_id=dtp.id)
            s.add(p)
            s.flush()
            for f, n in (("f1", 1_000), ("f2", size - 2_000)):
                s.add(RawDataFile(location_id=ids["fyst-source"], relative_path=f"{name}/{f}", group_path=name,
                                  size=n, sha256=SHA, mtime_ns=0, raw_data_package_id=p.id))
            pkgs.append(p)
        s.flush()

        def need(kind: OperationKind, **subject: int) -> int | None:
            found = space_needed(s, Operation(kind=kind.value, **subject))
            return None if found is None else found[0]

        def still(kind: OperationKind, **subject: int) -> int | None:
            return still_to_write(s, Operation(kind=kind.value, **subject))

        writes.update({
            "package": still(OperationKind.RAW_DATA_PACKAGE, raw_data_package_id=pkgs[1].id),
            "bundle": still(OperationKind.DATA_TRANSFER_PACKAGE, data_transfer_package_id=dtp.id),
            "transfer": still(OperationKind.TRANSFER, data_transfer_package_id=dtp.id),
            "unpack": still(OperationKind.UNPACK, data_transfer_package_id=dtp.id),
            "archive": still(OperationKind.LONG_TERM_ARCHIVE, raw_data_package_id=pkgs[0].id),
            "deletion": still(OperationKind.DELETION, raw_data_package_id=pkgs[0].id),
        })
        return {
            "package": need(OperationKind.RAW_DATA_PACKAGE, raw_data_package_id=pkgs[1].id),
            "bundle": need(OperationKind.DATA_TRANSFER_PACKAGE, data_transfer_package_id=dtp.id),
            "transfer": need(OperationKind.TRANSFER, data_transfer_package_id=dtp.id),
            "unpack": need(OperationKind.UNPACK, data_transfer_package_id=dtp.id),
            "archive": need(OperationKind.LONG_TERM_ARCHIVE, raw_data_package_id=pkgs[0].id),
            "unsized transfer": need(OperationKind.TRANSFER, data_transfer_package_id=unsized.id),
            "deletion": need(OperationKind.DELETION, raw_data_package_id=pkgs[0].id),
        }

    writes: dict[str, int | None] = {}
    got = db.transact(tx)
    assert got == {
        "package": 6_000,           # its payload files (1,000 + 5,000)
        "bundle": 24_000,           # its package tars (5,000 + 7,000) beside the bundle of them
        "transfer": 13_000,         # the bundle
        "unpack": 20_000,           # the bundle and its largest package
        "archive": 5_000,           # the package tar
        "unsized transfer": None,   # a bundle not built yet: nothing known
        "deletion": None,           # writes nothing
    }
    # what each must still write beyond what lies there already (space_freed wakes it once free)
    assert writes == {"package": 6_000, "bundle": 12_000, "transfer": 13_000, "unpack": 7_000, "archive": 5_000,
                      "deletion": None}
