"""A scan's read of a whole location's registrations (the driver's own cursor, no SQLAlchemy
rows) is retried like every other read when the database connection is lost under it: a scan
under way when its site's link to the database was cut failed at its first attempt with the
driver's ``OperationalError`` instead of waiting out the cut. Against the shared PostgreSQL
server, in a database of its own (skipped when unreachable; failed with ``CI=true``); the
connection is lost by terminating its server process from another connection."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from distributed_support import postgres_database
from packhorse.db.models import DataLocation, RawDataFile, Site
from packhorse.db.session import Database
from packhorse.managers.listing import registered_files


@pytest.fixture
def db() -> Iterator[tuple[Database, str]]:
    url, drop = postgres_database()
    d = Database(url)
    d.upgrade()
    yield d, url
    d.dispose()
    drop()


def _seed(db: Database, n: int) -> int:
    def seed(s: Session) -> int:
        site = Site(name="fyst")
        s.add(site)
        s.flush()
        loc = DataLocation(name="fyst-source", site_id=site.id, role="source", storage_type="disk", uri="/y")
        s.add(loc)
        s.flush()
        s.add_all(RawDataFile(location_id=loc.id, relative_path=f"inst/f{i:05d}", group_path="inst", size=i,
                              sha256="a" * 64, mtime_ns=1000 + i) for i in range(n))
        return loc.id

    return db.transact(seed)


@pytest.mark.parametrize("paths, expected", [
    (None, None),  # the whole location: the driver's own cursor
    (["inst/f00003", "inst/f00009", "inst/missing"], {"inst/f00003": (3, 1003), "inst/f00009": (9, 1009)}),
], ids=["whole-location", "short-list"])
def test_a_read_of_registrations_whose_connection_dies_is_read_again(
        db: tuple[Database, str], paths: list[str] | None, expected: dict[str, tuple[int, int]] | None) -> None:
    database, url = db
    loc_id = _seed(database, 3000)
    other = create_engine(url)
    attempts: list[int] = []

    def read(s: Session) -> dict[str, tuple[int, int]]:
        conn = s.connection()
        attempts.append(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
        if len(attempts) == 1:  # the link dies under the first attempt's read
            with other.connect() as killer:
                killer.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": attempts[0]})
        return registered_files(conn, loc_id, paths)

    try:
        found = database.read(read)
    finally:
        other.dispose()
    assert len(attempts) == 2 and attempts[0] != attempts[1]  # read again, on a new connection
    if expected is None:
        assert len(found) == 3000
        assert found["inst/f00007"] == (7, 1007)
    else:
        assert found == expected
