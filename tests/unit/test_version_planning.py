"""Planning for files that change (README "Versions"): which registrations go into which
package and under which name, what the scan does with a registered file whose bytes differ,
and what the ``raw_data_package`` stage does with a file that changed or vanished before its
package was built. In-process, against a real SQLite ops database; the stage runs in this
thread with an unentered lease keeper (no heartbeat thread, no child process)."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from packhorse.bags.packaging import read_bag_tar
from packhorse.config import load_config
from packhorse.db.models import Notification, Operation, RawDataFile, RawDataPackage, WithdrawnFile
from packhorse.db.session import Database
from packhorse.domain import OperationKind, Status
from packhorse.engine.outcome import complete_in
from packhorse.errors import LeaseLostError
from packhorse.managers import packages
from packhorse.managers.packages import package_base, plan_group
from packhorse.managers.scan import scan_all
from packhorse.operations.lease import LeaseKeeper
from packhorse.operations.lifecycle import claim
from packhorse.rules.availability import mark_locations
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import raw_package_key, sync_topology
from packhorse.stages import package as package_stage
from packhorse.stages.base import Work
from packhorse.status.reporting import status_report
from support import write_site_config


@pytest.fixture
def ctx(tmp_path: Path):
    settings = load_config(write_site_config(tmp_path / "site", settle_seconds=0))
    db = Database(settings.database_url)
    db.upgrade()
    c = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    mark_locations(c)  # as `packhorse init` does: every location root exists and is marked
    yield c
    db.dispose()


@pytest.fixture
def pool():
    with ThreadPoolExecutor(2) as p:
        yield p


def write(ctx: ProcessContext, rel: str, data: bytes, *, age: float = 60.0) -> Path:
    p = ctx.settings.location_path("fyst-source") / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    t = time.time() - age
    os.utime(p, (t, t))
    return p


def versions(ctx: ProcessContext, rel: str) -> list[tuple[int, str | None]]:
    def tx(s: Session) -> list[tuple[int, str | None]]:
        rows = s.execute(select(RawDataFile.version, RawDataPackage.name)
                         .outerjoin(RawDataPackage, RawDataPackage.id == RawDataFile.raw_data_package_id)
                         .where(RawDataFile.relative_path == rel).order_by(RawDataFile.version)).all()
        return [(v, n) for v, n in rows]
    return ctx.db.read(tx)


def package_rows(ctx: ProcessContext) -> dict[str, tuple[int, int]]:
    """``{name: (version, file_count)}``."""
    return {p.name: (p.version, p.file_count)
            for p in ctx.db.read(lambda s: list(s.scalars(select(RawDataPackage))))}


def mark_built(ctx: ProcessContext, name: str) -> None:
    ctx.db.transact(lambda s: s.execute(update(RawDataPackage).where(RawDataPackage.name == name)
                                        .values(size=1, sha256="0" * 64)))


def run_stage(ctx: ProcessContext, name: str) -> None:
    """Claim the package's operation and run the stage to its fenced completion, in this thread."""
    op_id = ctx.db.read(lambda s: s.scalar(select(Operation.id).join(
        RawDataPackage, RawDataPackage.id == Operation.raw_data_package_id).where(RawDataPackage.name == name)))
    c = claim(ctx.db, op_id, "test", 60)
    assert c is not None
    work = Work(ctx, c, c.operation, LeaseKeeper(ctx.db, c, lease_seconds=60, interval_seconds=30,
                                                 deadline_seconds=60))
    recorder = package_stage.run(work)

    def finish(s: Session) -> None:
        assert complete_in(s, c)
        recorder(s)

    ctx.db.transact(finish)


# ------------------------------------------------------------------ naming and grouping


def test_package_names_of_versions() -> None:
    assert package_base("cam/obs1") == "cam/obs1"
    assert package_base("cam/obs1", 2) == "cam/obs1+v2"
    assert package_base("", 1) == "_root" and package_base("", 3) == "_root+v3"
    assert packages.name_for("cam/obs1", {"cam/obs1+v2"}, 2) == "cam/obs1+v2+2"
    assert packages.name_for("cam/obs1", {"cam/obs1"}, 1) == "cam/obs1+2"


def test_a_package_holds_one_version_split_at_the_size_limit() -> None:
    f = lambda path, size, version: SimpleNamespace(relative_path=path, size=size, version=version)  # noqa: E731
    files = [f("a", 60, 1), f("b", 60, 2), f("c", 60, 1), f("d", 10, 2), f("e", 50, 3)]
    plan = [(v, [x.relative_path for x in part]) for v, part in plan_group(files, 100)]
    assert plan == [(1, ["a"]), (1, ["c"]), (2, ["b", "d"]), (3, ["e"])]


# ------------------------------------------------------------------ the scan


def test_a_file_changed_after_its_package_was_built_becomes_version_2(ctx, pool) -> None:
    write(ctx, "cam/obs1/a.dat", b"a" * 10)
    b = write(ctx, "cam/obs1/b.dat", b"b" * 10)
    scan_all(ctx, pool)
    packages.manage(ctx, {})
    assert package_rows(ctx) == {"cam/obs1": (1, 2)}

    # planned, not built: the scan leaves it to the package stage (no second registration)
    b.write_bytes(b"B" * 12)
    assert scan_all(ctx, pool).registered == 0
    assert versions(ctx, "cam/obs1/b.dat") == [(1, "cam/obs1")]

    # built: the new bytes are version 2; a file that is new at the same time is version 1
    mark_built(ctx, "cam/obs1")
    write(ctx, "cam/obs1/c.dat", b"c")
    assert scan_all(ctx, pool).registered == 2
    packages.manage(ctx, {})
    assert versions(ctx, "cam/obs1/b.dat") == [(1, "cam/obs1"), (2, "cam/obs1+v2")]
    assert versions(ctx, "cam/obs1/c.dat") == [(1, "cam/obs1+2")]
    assert package_rows(ctx) == {"cam/obs1": (1, 2), "cam/obs1+2": (1, 1), "cam/obs1+v2": (2, 1)}

    # the same bytes with another mtime are no new version
    mark_built(ctx, "cam/obs1+v2")
    os.utime(b, (time.time() - 30, time.time() - 30))
    assert scan_all(ctx, pool).registered == 0
    assert len(versions(ctx, "cam/obs1/b.dat")) == 2


def test_an_unpackaged_registration_whose_file_changed_is_registered_again_in_place(ctx, pool) -> None:
    d = write(ctx, "cam/obs1/d.dat", b"d" * 10)
    scan_all(ctx, pool)
    d.write_bytes(b"D" * 20)
    assert scan_all(ctx, pool).registered == 1
    rows = ctx.db.read(lambda s: list(s.scalars(select(RawDataFile))))
    assert [(r.version, r.size) for r in rows] == [(1, 20)]


# ------------------------------------------------------------------ the package stage


def test_the_stage_takes_out_changed_and_vanished_files_and_builds_the_rest(ctx, pool) -> None:
    a = write(ctx, "cam/obs1/a.dat", b"a" * 10)
    b = write(ctx, "cam/obs1/b.dat", b"b" * 10)
    write(ctx, "cam/obs1/c.dat", b"c" * 10)
    d = write(ctx, "cam/obs1/d.dat", b"d" * 10)
    scan_all(ctx, pool)
    packages.manage(ctx, {})
    a.unlink()                     # vanished: found by the stat
    b.write_bytes(b"b" * 11)       # grew: found by the stat
    d.write_bytes(b"D" + b"d" * 9)  # other bytes, same size: found by the hash while building
    run_stage(ctx, "cam/obs1")

    assert package_rows(ctx) == {"cam/obs1": (1, 1)}
    with ctx.backend("fyst-buffer").open_read(raw_package_key("cam/obs1")) as f:
        bag = read_bag_tar(f, source="buffer")
    assert set(bag.files) == {"cam/obs1/c.dat"}
    withdrawn = {w.relative_path: w for w in ctx.db.read(lambda s: list(s.scalars(select(WithdrawnFile))))}
    assert {p: w.cause for p, w in withdrawn.items()} == {
        "cam/obs1/a.dat": "vanished", "cam/obs1/b.dat": "changed", "cam/obs1/d.dat": "changed"}
    assert all("taken out of package cam/obs1" in w.reason for w in withdrawn.values())
    sent = ctx.db.read(lambda s: list(s.scalars(select(Notification).where(
        Notification.event == "source_files_vanished"))))
    assert len(sent) == 1 and "cam/obs1/a.dat" in sent[0].body and sent[0].level == "WARNING"

    # the scan registers the changed files again, whatever its folder cache says; the vanished
    # one stays listed by status with its reason
    assert scan_all(ctx, pool).registered == 2
    packages.manage(ctx, {})
    assert versions(ctx, "cam/obs1/b.dat") == [(1, "cam/obs1+2")]
    assert versions(ctx, "cam/obs1/d.dat") == [(1, "cam/obs1+2")]
    skipped = status_report(ctx)["skipped"]
    assert [(x["path"], "gone from the source" in x["reason"]) for x in skipped] == [("cam/obs1/a.dat", True)]


def test_a_package_left_without_files_is_dropped_and_its_operation_completes(ctx, pool) -> None:
    only = write(ctx, "cam/obs9/only.dat", b"x")
    scan_all(ctx, pool)
    packages.manage(ctx, {})
    only.unlink()
    run_stage(ctx, "cam/obs9")
    assert package_rows(ctx) == {}
    ops = ctx.db.read(lambda s: list(s.scalars(select(Operation).where(
        Operation.kind == OperationKind.RAW_DATA_PACKAGE.value))))
    assert [(o.status, o.raw_data_package_id) for o in ops] == [(Status.COMPLETED.value, None)]
    # the name is free again and the next package of the unit gets the operation it needs
    write(ctx, "cam/obs9/only.dat", b"back")
    scan_all(ctx, pool)
    assert packages.manage(ctx, {}) == 1
    assert package_rows(ctx) == {"cam/obs9": (1, 1)}


def test_a_stale_attempt_takes_no_file_out(ctx, pool) -> None:
    write(ctx, "cam/obs1/a.dat", b"a")
    scan_all(ctx, pool)
    packages.manage(ctx, {})
    op_id = ctx.db.read(lambda s: s.scalar(select(Operation.id)))
    stale = claim(ctx.db, op_id, "old", 60)
    assert stale is not None
    ctx.db.transact(lambda s: s.execute(update(Operation).where(Operation.id == op_id)
                                        .values(status=Status.PENDING.value)))
    assert claim(ctx.db, op_id, "new", 60) is not None  # a newer attempt holds the token now
    work = Work(ctx, stale, stale.operation, LeaseKeeper(ctx.db, stale, lease_seconds=60, interval_seconds=30,
                                                         deadline_seconds=60))
    pkg_id = stale.operation.raw_data_package_id
    with pytest.raises(LeaseLostError):
        package_stage.withdraw(work, pkg_id, [("cam/obs1/a.dat", "vanished", "gone")])
    assert ctx.db.read(lambda s: list(s.scalars(select(WithdrawnFile)))) == []
    assert package_rows(ctx) == {"cam/obs1": (1, 1)}


def test_a_withdrawn_path_is_looked_at_whatever_the_folder_cache_says(ctx, pool) -> None:
    from packhorse.managers.scan import ScanCache

    write(ctx, "cam/obs1/a.dat", b"a" * 10)
    b = write(ctx, "cam/obs1/b.dat", b"b" * 10)
    root = ctx.settings.location_path("fyst-source")
    old = time.time() - 60
    for folder in (root, root / "cam", root / "cam/obs1"):
        os.utime(folder, (old, old))
    cache = ScanCache()
    cache.scans = 1  # not a full listing: a clean, unchanged folder is not listed again
    scan_all(ctx, pool, cache)
    scan_all(ctx, pool, cache)
    packages.manage(ctx, {})
    with open(b, "r+b") as f:  # in place: the folder's mtime does not change
        f.write(b"B")
    run_stage(ctx, "cam/obs1")
    assert versions(ctx, "cam/obs1/b.dat") == []
    assert scan_all(ctx, pool, cache).registered == 1
    assert versions(ctx, "cam/obs1/b.dat") == [(1, None)]
    assert ctx.db.read(lambda s: s.scalar(select(WithdrawnFile.resolved_at))) is not None


def test_a_tar_published_by_a_crashed_attempt_is_the_package_even_if_a_file_changed_since(ctx, pool) -> None:
    write(ctx, "cam/obs1/a.dat", b"a" * 10)
    b = write(ctx, "cam/obs1/b.dat", b"b" * 10)
    scan_all(ctx, pool)
    packages.manage(ctx, {})
    op_id = ctx.db.read(lambda s: s.scalar(select(Operation.id)))
    first = claim(ctx.db, op_id, "crashes", 60)
    assert first is not None
    package_stage.run(Work(ctx, first, first.operation, LeaseKeeper(ctx.db, first, lease_seconds=60,
                                                                    interval_seconds=30, deadline_seconds=60)))
    # published, then the worker died before its completion was recorded; the lease is recovered
    ctx.db.transact(lambda s: s.execute(update(Operation).where(Operation.id == op_id)
                                        .values(status=Status.PENDING.value)))
    published = ctx.backend("fyst-buffer").stat(raw_package_key("cam/obs1"))
    b.write_bytes(b"b" * 15)  # the instrument writes on
    run_stage(ctx, "cam/obs1")  # no conflict with the published tar, nothing taken out
    pkg = ctx.db.read(lambda s: s.scalar(select(RawDataPackage)))
    assert (pkg.file_count, pkg.size) == (2, published.size)
    assert ctx.db.read(lambda s: list(s.scalars(select(WithdrawnFile)))) == []
    # the grown file is the next version
    assert scan_all(ctx, pool).registered == 1
    packages.manage(ctx, {})
    assert versions(ctx, "cam/obs1/b.dat") == [(1, "cam/obs1"), (2, "cam/obs1+v2")]


def test_the_rebuild_of_a_lost_package_never_takes_a_file_out(ctx, pool) -> None:
    from packhorse.errors import SourceChangedError

    write(ctx, "cam/obs1/a.dat", b"a" * 10)
    b = write(ctx, "cam/obs1/b.dat", b"b" * 10)
    scan_all(ctx, pool)
    packages.manage(ctx, {})
    mark_built(ctx, "cam/obs1")  # recorded as built: its bytes are fixed (its copies are lost)
    b.write_bytes(b"b" * 11)
    op_id = ctx.db.read(lambda s: s.scalar(select(Operation.id)))
    c = claim(ctx.db, op_id, "rebuild", 60)
    assert c is not None
    work = Work(ctx, c, c.operation, LeaseKeeper(ctx.db, c, lease_seconds=60, interval_seconds=30,
                                                 deadline_seconds=60))
    with pytest.raises(SourceChangedError):
        package_stage.run(work)
    assert package_rows(ctx) == {"cam/obs1": (1, 2)}
    assert ctx.db.read(lambda s: list(s.scalars(select(WithdrawnFile)))) == []


def test_a_package_that_failed_on_a_changed_file_before_builds_from_the_rest_after_a_reset(ctx, pool) -> None:
    # an operation left FAILED with SourceChangedError by a version without withdrawal
    from packhorse.operations.lifecycle import reset_failed

    write(ctx, "cam/obs1/a.dat", b"a" * 10)
    b = write(ctx, "cam/obs1/b.dat", b"b" * 10)
    scan_all(ctx, pool)
    packages.manage(ctx, {})
    b.write_bytes(b"b" * 12)
    op_id = ctx.db.read(lambda s: s.scalar(select(Operation.id)))
    ctx.db.transact(lambda s: s.execute(update(Operation).where(Operation.id == op_id).values(
        status=Status.FAILED.value, error_context={"error_type": "SourceChangedError"})))
    assert reset_failed(ctx.db, OperationKind.RAW_DATA_PACKAGE, op_id) == [op_id]
    run_stage(ctx, "cam/obs1")
    assert package_rows(ctx) == {"cam/obs1": (1, 1)}
    assert ctx.db.read(lambda s: s.get(Operation, op_id).status) == Status.COMPLETED.value


def test_a_touched_file_is_hashed_once_not_at_every_full_scan(ctx, pool, monkeypatch) -> None:
    """A file of a built package touched (same bytes, new mtime) is hashed by the next full scan,
    which finds the registered bytes and records the new mtime as confirmed: the scans after it
    do not read the file again. New bytes at a later mtime are still a new version."""
    from packhorse.managers import scan as scan_module

    a = write(ctx, "cam/obs1/a.dat", b"a" * 10)
    write(ctx, "cam/obs1/b.dat", b"b" * 10)
    scan_all(ctx, pool)
    packages.manage(ctx, {})
    mark_built(ctx, "cam/obs1")

    hashed: list[str] = []
    real = scan_module.hash_source

    def counting(backend, rel, before):  # type: ignore[no-untyped-def]
        hashed.append(rel)
        return real(backend, rel, before)

    monkeypatch.setattr(scan_module, "hash_source", counting)
    t = time.time() - 30
    os.utime(a, (t, t))
    assert scan_all(ctx, pool).registered == 0
    assert hashed == ["cam/obs1/a.dat"]
    row = ctx.db.read(lambda s: s.scalars(select(RawDataFile).where(RawDataFile.relative_path == "cam/obs1/a.dat")).one())
    assert row.confirmed_mtime_ns == a.stat().st_mtime_ns
    assert row.mtime_ns != row.confirmed_mtime_ns  # what the package's tar holds is left as it was (I3)
    assert scan_all(ctx, pool).registered == 0
    assert hashed == ["cam/obs1/a.dat"]  # not read again

    a.write_bytes(b"A" * 10)  # new bytes of the same size
    t = time.time() - 20
    os.utime(a, (t, t))
    assert scan_all(ctx, pool).registered == 1
    assert [v for v, _ in versions(ctx, "cam/obs1/a.dat")] == [1, 2]
