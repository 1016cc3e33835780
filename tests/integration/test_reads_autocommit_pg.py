"""On PostgreSQL a read (:meth:`packhorse.db.session.Database.read`) sends its statements in
autocommit: no ``BEGIN`` and ``COMMIT`` around them, the two round trips a site across a long
link pays for every read. Writes (:meth:`~packhorse.db.session.Database.transact`) keep their
transaction. Needs PostgreSQL on 127.0.0.1:5432 (skipped when unreachable, failed under
``CI=true``)."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from distributed_support import postgres_database
from packhorse.db.session import Database

#: true when the statement is the first of its transaction (autocommit: every statement is)
FIRST_OF_ITS_TRANSACTION = text(
    "SELECT xact_start = query_start FROM pg_stat_activity WHERE pid = pg_backend_pid()")


@pytest.fixture
def pg_db():
    url, drop = postgres_database()
    db = Database(url)
    try:
        yield db
    finally:
        db.dispose()
        drop()


def test_a_read_runs_its_statements_outside_a_transaction(pg_db: Database) -> None:
    def read(s) -> list[bool]:
        s.execute(text("SELECT pg_sleep(0.05)"))
        return [s.execute(FIRST_OF_ITS_TRANSACTION).scalar_one() for _ in range(2)]

    assert pg_db.read(read) == [True, True]


def test_a_write_unit_keeps_one_transaction(pg_db: Database) -> None:
    def tx(s) -> list[bool]:
        s.execute(text("SELECT pg_sleep(0.05)"))
        return [s.execute(FIRST_OF_ITS_TRANSACTION).scalar_one() for _ in range(2)]

    assert pg_db.transact(tx) == [False, False]


def test_a_write_after_a_read_on_the_same_pooled_connection_is_in_a_transaction(pg_db: Database) -> None:
    pg_db.read(lambda s: s.execute(text("SELECT 1")).scalar_one())  # its connection back in the pool
    assert pg_db.transact(lambda s: (s.execute(text("SELECT pg_sleep(0.05)")),
                                     s.execute(FIRST_OF_ITS_TRANSACTION).scalar_one())[1]) is False
