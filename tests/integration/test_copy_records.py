"""``record_copy`` and ``record_copies`` on both ops databases: a new verified copy is recorded
in one statement, a bundle's worth of copies in three at most; the same copy recorded again (a
completion run a second time, I3) keeps its row and refreshes its ``verified_at``; a copy with
other bytes at the location is refused (I2), its row unchanged; a copy that is no longer live
(deleted) does not stop a new one. The PostgreSQL case runs against
the shared server in a database of its own (skipped when unreachable; failed with
``CI=true``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import event, func, select, update
from sqlalchemy.orm import Session

from distributed_support import postgres_database
from packhorse.db.models import DataLocation, PhysicalCopy, RawDataPackage, Site
from packhorse.db.session import Database
from packhorse.errors import DestinationConflictError
from packhorse.stages.base import record_copies, record_copy


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        d = Database(f"sqlite:///{tmp_path}/ops.db")
        drop = None
    else:
        url, drop = postgres_database()
        d = Database(url)
    d.upgrade()
    yield d
    d.dispose()
    if drop is not None:
        drop()


def _package(db: Database, more: int = 0) -> tuple[int, int]:
    """A site with an archive and a source, and ``1 + more`` packages; returns the archive's id
    and the first package's (the others follow it)."""
    def seed(s: Session) -> tuple[int, int]:
        site = Site(name="cologne")
        s.add(site)
        s.flush()
        loc = DataLocation(name="cologne-lta", site_id=site.id, role="long_term_archive", storage_type="disk", uri="/x")
        src = DataLocation(name="fyst-source", site_id=site.id, role="source", storage_type="disk", uri="/y")
        s.add_all([loc, src])
        s.flush()
        pkg = RawDataPackage(name="inst/obs1", group_path="inst/obs1", source_location_id=src.id,
                             bagging_date="2026-12-06", file_count=1, payload_bytes=1, size=10, sha256="b" * 64)
        s.add(pkg)
        s.flush()
        for k in range(more):
            s.add(RawDataPackage(name=f"inst/obs{k + 2}", group_path=f"inst/obs{k + 2}", source_location_id=src.id,
                                 bagging_date="2026-12-06", file_count=1, payload_bytes=1, size=10,
                                 sha256=f"{k:x}" * 64))
        s.flush()
        return loc.id, pkg.id

    return db.transact(seed)


def test_a_copy_is_recorded_once_and_a_conflicting_one_is_refused(db: Database) -> None:
    loc, pkg = _package(db)
    statements: list[str] = []

    def record(sha: str, when: dt.datetime) -> int:
        return db.transact(lambda s: record_copy(s, location_id=loc, key="raw/inst/obs1.tar", size=10, sha256=sha,
                                                 raw_data_package_id=pkg, verified_at=when))

    first = dt.datetime(2026, 12, 6, 10, tzinfo=dt.timezone.utc)
    listen = (lambda *a: statements.append(a[2]))  # noqa: E731
    event.listen(db.engine, "before_cursor_execute", listen)
    copy_id = record("b" * 64, first)
    event.remove(db.engine, "before_cursor_execute", listen)
    assert len([q for q in statements if not q.lstrip().startswith(("BEGIN", "COMMIT"))]) == 1  # one statement
    later = first + dt.timedelta(hours=1)
    assert record("b" * 64, later) == copy_id  # again: the same row, verified again
    with pytest.raises(DestinationConflictError):
        record("c" * 64, later + dt.timedelta(hours=1))
    rows = db.read(lambda s: [(c.id, c.sha256, c.verified_at, c.status) for c in s.scalars(select(PhysicalCopy))])
    assert len(rows) == 1 and rows[0][:2] == (copy_id, "b" * 64) and rows[0][3] == "present"
    assert rows[0][2].replace(tzinfo=dt.timezone.utc) == later
    db.transact(lambda s: s.execute(update(PhysicalCopy).values(status="deleted")))
    new_id = record("c" * 64, later)  # the deleted copy is no longer live: a new one is recorded
    assert new_id != copy_id
    live = db.read(lambda s: list(s.scalars(select(PhysicalCopy.sha256).where(PhysicalCopy.status == "present"))))
    assert live == ["c" * 64]


def test_a_bundles_copies_are_recorded_in_three_statements_and_a_conflict_records_none(db: Database) -> None:
    """Four copies at once, one of them recorded before (verified again, its row kept): one
    read, one update and one insert; the ids returned are the rows'. Then a batch holding a
    copy with other bytes than the live one is refused whole (I2), and a deleted copy does not
    stop a new one."""
    loc, first = _package(db, more=3)
    pkgs = [first, first + 1, first + 2, first + 3]
    shas = {p: db.read(lambda s, p=p: s.get(RawDataPackage, p).sha256) for p in pkgs}
    early = dt.datetime(2026, 12, 6, 9, tzinfo=dt.timezone.utc)
    before = db.transact(lambda s: record_copy(s, location_id=loc, key="raw/k0.tar", size=10, sha256=shas[first],
                                               raw_data_package_id=first, verified_at=early))
    copies = [(p, f"raw/k{i}.tar", 10, shas[p]) for i, p in enumerate(pkgs)]
    statements: list[str] = []
    listen = (lambda *a: statements.append(a[2]))  # noqa: E731
    later = early + dt.timedelta(hours=1)
    event.listen(db.engine, "before_cursor_execute", listen)
    ids = db.transact(lambda s: record_copies(s, location_id=loc, copies=copies, verified_at=later))
    event.remove(db.engine, "before_cursor_execute", listen)
    assert len([q for q in statements if not q.lstrip().startswith(("BEGIN", "COMMIT"))]) == 3, statements
    rows = db.read(lambda s: {c.raw_data_package_id: (c.id, c.path, c.sha256, c.verified_at, c.status)
                              for c in s.scalars(select(PhysicalCopy))})
    assert set(rows) == set(pkgs) and ids == {p: rows[p][0] for p in pkgs} and ids[first] == before
    assert all(rows[p][1:3] == (f"raw/k{i}.tar", shas[p]) and rows[p][4] == "present" for i, p in enumerate(pkgs))
    assert all(rows[p][3].replace(tzinfo=dt.timezone.utc) == later for p in pkgs)
    assert db.transact(lambda s: record_copies(s, location_id=loc, copies=copies)) == ids  # again: the same rows
    with pytest.raises(DestinationConflictError, match=f"raw data package {first + 2}"):
        db.transact(lambda s: record_copies(s, location_id=loc, copies=[
            (first + 1, "raw/k1.tar", 10, shas[first + 1]), (first + 2, "raw/k2.tar", 10, "e" * 64)]))
    assert db.read(lambda s: s.scalar(select(func.count()).select_from(PhysicalCopy))) == 4
    db.transact(lambda s: s.execute(update(PhysicalCopy).where(PhysicalCopy.raw_data_package_id == first + 2)
                                    .values(status="deleted")))
    new = db.transact(lambda s: record_copies(s, location_id=loc, copies=[(first + 2, "raw/k2.tar", 10, "e" * 64)]))
    assert new[first + 2] not in ids.values()


def test_a_task_of_builds_records_its_packages_bytes_at_once_and_a_rebuild_must_match(db: Database) -> None:
    """``record_builds``: first builds record their packages' size and sha256 in one statement
    and their buffer copies in two; a rebuild (convergence) of the same bytes changes nothing;
    one of other bytes refuses the whole batch (I2), naming its package, and records nothing."""
    from packhorse.stages.package import record_builds

    loc, first = _package(db, more=2)
    pkgs = [first + 1, first + 2]  # seeded with bytes already; clear them: never built
    db.transact(lambda s: s.execute(update(RawDataPackage).where(RawDataPackage.id.in_(pkgs))
                                    .values(size=None, sha256=None)))
    items = [(p, loc, f"raw/b{i}.tar", 100 + i, f"{i + 7}" * 64) for i, p in enumerate(pkgs)]
    statements: list[str] = []
    listen = (lambda *a: statements.append(a[2]))  # noqa: E731
    event.listen(db.engine, "before_cursor_execute", listen)
    db.transact(lambda s: record_builds(s, items))
    event.remove(db.engine, "before_cursor_execute", listen)
    assert len([q for q in statements if not q.lstrip().startswith(("BEGIN", "COMMIT"))]) <= 3, statements
    rows = db.read(lambda s: {p.id: (p.size, p.sha256) for p in s.scalars(select(RawDataPackage))})
    assert [rows[p] for p in pkgs] == [(100, "7" * 64), (101, "8" * 64)]
    copies = db.read(lambda s: {c.raw_data_package_id: (c.path, c.sha256) for c in s.scalars(select(PhysicalCopy))})
    assert copies == {pkgs[0]: ("raw/b0.tar", "7" * 64), pkgs[1]: ("raw/b1.tar", "8" * 64)}
    db.transact(lambda s: record_builds(s, items))  # the same bytes again: nothing changes
    assert db.read(lambda s: s.scalar(select(func.count()).select_from(PhysicalCopy))) == 2
    with pytest.raises(DestinationConflictError, match="inst/obs3"):
        db.transact(lambda s: record_builds(s, [items[0], (pkgs[1], loc, "raw/b1.tar", 101, "9" * 64)]))
    assert db.read(lambda s: s.get(RawDataPackage, pkgs[1]).sha256) == "8" * 64
