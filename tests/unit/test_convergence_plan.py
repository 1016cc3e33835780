"""The desired state's plan (:mod:`packhorse.rules.convergence`), step by step on database rows: from
a package whose every archive copy is bad to a rebuild of its bundle's packages, the bundle,
the transfer and the unpack, each with its own generation key; the dead end when the source
is gone; a superseded FAILED operation; the cached ``archived_at`` following the copies."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from packhorse.config import load_config
from packhorse.db.models import DataTransferPackage, Operation, PhysicalCopy, RawDataFile, RawDataPackage, utcnow
from packhorse.db.session import Database
from packhorse.domain import OperationKind, Status
from packhorse.operations.lifecycle import create_operation, dedup_key
from packhorse.rules.convergence import generation_key, plan, superseded_failures
from packhorse.rules.policy import is_archived, refresh_archived
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from packhorse.status.reporting import status_report
from support import write_site_config

SHA = "a" * 64


def _ctx(tmp_path: Path) -> ProcessContext:
    settings = load_config(write_site_config(tmp_path / "site"))
    db = Database(settings.database_url)
    db.upgrade()
    return ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))


def _archived_bundle(ctx: ProcessContext) -> tuple[int, int, int]:
    """Two packages in one bundle, archived everywhere, buffers freed; returns (pkg a, pkg b, bundle)."""
    ids = ctx.topology.location_ids
    now = utcnow()

    def tx(s: Session) -> tuple[int, int, int]:
        dtp = DataTransferPackage(name="b1", source_site_id=ctx.topology.site_ids["fyst"], bagging_date="2026-12-01",
                                  package_count=2, size=10, sha256=SHA)
        s.add(dtp)
        s.flush()
        out = []
        for name in ("inst/a", "inst/b"):
            p = RawDataPackage(name=name, group_path=name, source_location_id=ids["fyst-source"],
                               bagging_date="2026-12-01", file_count=1, payload_bytes=5, size=5, sha256=SHA,
                               data_transfer_package_id=dtp.id, archived_at=now)
            s.add(p)
            s.flush()
            s.add(RawDataFile(location_id=ids["fyst-source"], relative_path=f"{name}/f", group_path=name, size=5,
                              sha256=SHA, mtime_ns=0, raw_data_package_id=p.id))
            for loc in ("fyst-buffer", "cologne-buffer", "cornell-buffer"):
                s.add(PhysicalCopy(raw_data_package_id=p.id, location_id=ids[loc], path=f"raw/{name}.tar", size=5,
                                   sha256=SHA, status="deleted", verified_at=now))
            for loc in ("cologne-lta", "cornell-lta"):
                s.add(PhysicalCopy(raw_data_package_id=p.id, location_id=ids[loc], path=f"raw/{name}.tar", size=5,
                                   sha256=SHA, status="present", verified_at=now))
            out.append(p.id)
        for loc in ("fyst-buffer", "cologne-buffer", "cornell-buffer"):
            s.add(PhysicalCopy(data_transfer_package_id=dtp.id, location_id=ids[loc], path="bundles/b1.tar", size=10,
                               sha256=SHA, status="deleted", verified_at=now))
        return out[0], out[1], dtp.id

    return ctx.db.transact(tx)


def _set(ctx: ProcessContext, status: str, *, raw: int | None = None, dtp: int | None = None,
         loc: str) -> None:
    col = PhysicalCopy.raw_data_package_id if raw is not None else PhysicalCopy.data_transfer_package_id
    ctx.db.transact(lambda s: s.execute(update(PhysicalCopy).where(
        col == (raw if raw is not None else dtp), PhysicalCopy.location_id == ctx.topology.location_ids[loc],
        PhysicalCopy.status != "deleted").values(status=status)))


def _add(ctx: ProcessContext, *, raw: int | None = None, dtp: int | None = None, loc: str) -> None:
    ctx.db.transact(lambda s: s.add(PhysicalCopy(raw_data_package_id=raw, data_transfer_package_id=dtp,
                                                 location_id=ctx.topology.location_ids[loc], path="x", size=5,
                                                 sha256=SHA, status="present", verified_at=utcnow())))


def _keys(ctx: ProcessContext) -> dict[str, list[str]]:
    p = ctx.db.read(lambda s: plan(s, ctx))
    return {k.value: sorted(v) for k, v in p.wanted.items()}


def test_nothing_lost_plans_nothing(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    _archived_bundle(ctx)
    p = ctx.db.read(lambda s: plan(s, ctx))
    assert p.wanted == {} and p.dead_ends == [] and p.stale_archived == []


def test_every_archive_copy_bad_walks_back_to_the_source_files_then_forward(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    a, b, dtp = _archived_bundle(ctx)
    for lta in ("cologne-lta", "cornell-lta"):
        _set(ctx, "corrupt", raw=a, loc=lta)
    p = ctx.db.read(lambda s: plan(s, ctx))
    assert p.stale_archived == [a]  # the cache no longer matches the copies
    assert ctx.db.transact(lambda s: refresh_archived(s, ctx, p.stale_archived)) == 1
    assert ctx.db.read(lambda s: s.get(RawDataPackage, a).archived_at) is None
    assert ctx.db.read(lambda s: s.get(RawDataPackage, b).archived_at) is not None
    # no copy of a or of its bundle anywhere: rebuild a from its source files (a new generation:
    # its copy at the source buffer is gone); its sibling b, archived, is neither rebuilt nor
    # shipped again
    assert _keys(ctx) == {"raw_data_package": [f"raw_data_package:rdp{a}#g1"]}
    _add(ctx, raw=a, loc="fyst-buffer")
    # a is back at the source buffer: it leaves the bundle (b is not there, so the bundle is not
    # rebuilt) and travels in a bundle of its own, which the bundle manager makes
    p = ctx.db.read(lambda s: plan(s, ctx))
    assert p.wanted == {} and p.detach == {a: (dtp, "fyst")}, (p.wanted, p.detach)
    ctx.db.transact(lambda s: s.execute(update(RawDataPackage).where(RawDataPackage.id == a)
                                        .values(data_transfer_package_id=None)))
    # not bundled, at the source buffer: the forward flow's from here; the old bundle, one
    # package short now, is never rebuilt, even with every package it still has at the buffer
    _add(ctx, raw=b, loc="fyst-buffer")
    p = ctx.db.read(lambda s: plan(s, ctx))
    assert p.wanted == {} and p.detach == {} and p.dead_ends == [], (p.wanted, p.detach)


def test_a_split_bundle_is_not_rebuilt_and_its_lost_packages_leave_it_too(tmp_path: Path) -> None:
    # a bundle a package was taken out of (its recorded bytes carry that package) is never built
    # again: a package of it lost everywhere later leaves it too, even with all its remaining
    # packages at the source buffer
    ctx = _ctx(tmp_path)
    a, b, dtp = _archived_bundle(ctx)
    ctx.db.transact(lambda s: s.execute(update(RawDataPackage).where(RawDataPackage.id == a)
                                        .values(data_transfer_package_id=None)))
    for lta in ("cologne-lta", "cornell-lta"):
        _set(ctx, "corrupt", raw=b, loc=lta)
    ctx.db.read(lambda s: plan(s, ctx))
    ctx.db.transact(lambda s: refresh_archived(s, ctx, [b]))
    _add(ctx, raw=b, loc="fyst-buffer")
    p = ctx.db.read(lambda s: plan(s, ctx))
    assert p.wanted == {} and p.detach == {b: (dtp, "fyst")}, (p.wanted, p.detach)


def test_a_bundle_build_that_failed_on_a_lost_package_is_built_again_once_the_package_is_rebuilt(
        tmp_path: Path) -> None:
    # the first build met a package tar gone from the source buffer (or damaged there: moved to
    # quarantine) and FAILED, recording that copy missing; the bundle has never had a copy
    ctx = _ctx(tmp_path)
    ids = ctx.topology.location_ids

    def tx(s: Session) -> tuple[int, int, int]:
        dtp = DataTransferPackage(name="b2", source_site_id=ctx.topology.site_ids["fyst"], bagging_date="2026-12-01",
                                  package_count=2)
        s.add(dtp)
        s.flush()
        out = []
        for name in ("inst/a", "inst/b"):
            p = RawDataPackage(name=name, group_path=name, source_location_id=ids["fyst-source"],
                               bagging_date="2026-12-01", file_count=1, payload_bytes=5, size=5, sha256=SHA,
                               data_transfer_package_id=dtp.id)
            s.add(p)
            s.flush()
            s.add(PhysicalCopy(raw_data_package_id=p.id, location_id=ids["fyst-buffer"], path=f"raw/{name}.tar",
                               size=5, sha256=SHA, status="present", verified_at=utcnow()))
            out.append(p.id)
        op = create_operation(s, kind=OperationKind.DATA_TRANSFER_PACKAGE,
                              dedup_key=dedup_key(OperationKind.DATA_TRANSFER_PACKAGE, f"dtp{dtp.id}"),
                              site_id=ctx.topology.site_ids["fyst"], max_retries=3, data_transfer_package_id=dtp.id,
                              destination_location_id=ids["fyst-buffer"])
        s.flush()
        s.execute(update(Operation).where(Operation.id == op.id).values(status=Status.FAILED.value))
        return out[0], out[1], dtp.id

    a, _, dtp = ctx.db.transact(tx)
    _set(ctx, "missing", raw=a, loc="fyst-buffer")
    assert _keys(ctx) == {"raw_data_package": [f"raw_data_package:rdp{a}#g1"]}  # rebuilt from its source files
    _add(ctx, raw=a, loc="fyst-buffer")
    # then the bundle, under a key of its own: the FAILED first build does not block it
    assert _keys(ctx) == {"data_transfer_package": [f"data_transfer_package:dtp{dtp}#g1"]}


def test_the_source_gone_is_a_dead_end_and_no_sibling_is_rebuilt(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    a, b, _ = _archived_bundle(ctx)
    for lta in ("cologne-lta", "cornell-lta"):
        _set(ctx, "missing", raw=a, loc=lta)
    ctx.db.transact(lambda s: s.execute(update(RawDataFile).where(RawDataFile.raw_data_package_id == a)
                                        .values(source_deleted_at=utcnow())))
    p = ctx.db.read(lambda s: plan(s, ctx))
    assert p.wanted == {}, "a sibling rebuilt for a bundle that cannot be rebuilt would be freed and rebuilt for ever"
    assert [d.name for d in p.dead_ends] == ["inst/a"]
    d = p.dead_ends[0]
    assert sorted(c["location"] for c in d.bad_copies) == ["cologne-lta", "cornell-lta"]
    assert any("deleted" in t for t in d.tried)


def test_a_failed_operation_is_superseded_only_by_a_later_completed_one_of_the_same_work(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    _, _, dtp = _archived_bundle(ctx)
    ids = ctx.topology.location_ids

    def make(s: Session, key: str, dest: str, status: Status) -> Operation:
        op = create_operation(s, kind=OperationKind.TRANSFER, dedup_key=key, site_id=ctx.topology.site_ids["cologne"],
                              max_retries=3, data_transfer_package_id=dtp, source_location_id=ids["fyst-buffer"],
                              destination_location_id=ids[dest])
        s.flush()
        s.execute(update(Operation).where(Operation.id == op.id).values(status=status.value))
        return op

    def tx(s: Session) -> tuple[int, int]:
        first = make(s, dedup_key(OperationKind.TRANSFER, f"dtp{dtp}", "cologne-buffer"), "cologne-buffer", Status.FAILED)
        other = make(s, dedup_key(OperationKind.TRANSFER, f"dtp{dtp}", "cornell-buffer"), "cornell-buffer", Status.FAILED)
        make(s, generation_key(OperationKind.TRANSFER, f"dtp{dtp}", "cologne-buffer", 1), "cologne-buffer",
             Status.COMPLETED)
        return first.id, other.id

    first, other = ctx.db.transact(tx)
    archived = ctx.db.read(lambda s: dict(s.execute(select(RawDataPackage.id, RawDataPackage.archived_at).where(
        RawDataPackage.data_transfer_package_id == dtp)).all()))
    ctx.db.transact(lambda s: s.execute(update(RawDataPackage).where(RawDataPackage.id == min(archived))
                                        .values(archived_at=None)))  # one package not archived yet
    failed = ctx.db.read(lambda s: list(s.query(Operation).filter(Operation.status == "FAILED")))
    assert ctx.db.read(lambda s: superseded_failures(s, failed)) == {first}  # cornell's is still a human's
    # status lists the one for a human and counts the other as history (a trial saw "FAILED 7"
    # in the table and one failure listed, with nothing saying why)
    report = status_report(ctx)
    assert [f["id"] for f in report["failed_operations"]] == [other] and report["failed_superseded"] == 1
    # once every package the bundle carries is archived (by any means), its failures are history
    ctx.db.transact(lambda s: s.execute(update(RawDataPackage).where(RawDataPackage.id == min(archived))
                                        .values(archived_at=archived[min(archived)])))
    assert ctx.db.read(lambda s: superseded_failures(s, failed)) == {first, other}
    report = status_report(ctx)
    assert report["failed_operations"] == [] and report["failed_superseded"] == 2


def test_archived_is_what_the_copies_say(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    a, _, _ = _archived_bundle(ctx)
    _set(ctx, "corrupt", raw=a, loc="cologne-lta")
    ctx.db.transact(lambda s: refresh_archived(s, ctx, [a]))
    pkg = ctx.db.read(lambda s: s.get(RawDataPackage, a))
    assert pkg.archived_at is None and not ctx.db.read(lambda s: is_archived(s, ctx, pkg))
    _add(ctx, raw=a, loc="cologne-lta")
    ctx.db.transact(lambda s: refresh_archived(s, ctx, [a]))
    assert ctx.db.read(lambda s: s.get(RawDataPackage, a).archived_at) is not None
