"""PostgreSQL as the ops database: the migrations build exactly the models' schema
and downgrade cleanly; the schema's constraints hold; transient errors (dropped connection,
serialization failure, admin shutdown) are retried by the unit of work; engines are never
shared across a fork; dispatch claims batches with ``FOR UPDATE SKIP LOCKED``; a unit makes no
round trip besides its statements; batch claims racing over shared operations grant each once.

Runs against the shared server at 127.0.0.1:5432 in a database of its own (skipped when
unreachable; failed with ``CI=true``).
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, func, inspect, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from distributed_support import postgres_database
from packhorse.config import settings_from_dict
from packhorse.db.models import Base, DataLocation, Operation, PhysicalCopy, RawDataPackage, Site, utcnow
from packhorse.db.session import Database
from packhorse.domain import Status
from packhorse.errors import TransientDatabaseError
from support import describe_schema


@pytest.fixture
def pg_url() -> Iterator[str]:
    url, drop = postgres_database()
    yield url
    drop()


@pytest.fixture
def pg_db(pg_url: str) -> Iterator[Database]:
    db = Database(pg_url, pool_size=2, max_overflow=2)
    db.upgrade()
    yield db
    db.dispose()


def test_upgrade_builds_exactly_the_models_schema_and_downgrade_removes_it() -> None:
    migrated_url, drop_migrated = postgres_database()
    reference_url, drop_reference = postgres_database()
    try:
        d = Database(migrated_url)
        d.upgrade()
        with d.engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
        assert diff == []
        assert d.current_revision() == d.head_revision()
        d.ensure_migrated()
        ref = create_engine(reference_url)
        Base.metadata.create_all(ref)
        ref.dispose()
        migrated, expected = describe_schema(migrated_url), describe_schema(reference_url)
        assert migrated == expected
        assert set(expected) - {"partial_index_sql"} == set(Base.metadata.tables)
        partial = expected["partial_index_sql"]
        live = [i for i in partial if "uq_physical_copies_live" in i]
        assert len(live) == 2 and all("'present'" in i and "'deletion_pending'" in i for i in live), partial
        assert any("ix_raw_data_packages_not_archived" in i and "archived_at IS NULL" in i for i in partial), partial
        assert [n for n, _ in expected["operations"]["checks"]] == [
            "ck_operations_counters", "ck_operations_kind", "ck_operations_status"]
        # downgrade removes every table; upgrading again rebuilds the same schema
        d.downgrade("base")
        with d.engine.connect() as conn:
            assert set(inspect(conn).get_table_names()) <= {"alembic_version"}
        assert d.current_revision() is None
        d.upgrade()
        assert describe_schema(migrated_url) == expected
        d.dispose()
    finally:
        drop_migrated()
        drop_reference()


def _seed(db: Database) -> None:
    def tx(s: Session) -> None:
        s.add(Site(id=1, name="cologne"))
        s.flush()
        s.add(DataLocation(id=1, name="cologne-lta", site_id=1, role="long_term_archive", storage_type="disk", uri="/a"))
        s.flush()
        s.add(RawDataPackage(id=1, name="inst/obs1", group_path="inst/obs1", source_location_id=1,
                             bagging_date="2026-11-30", file_count=1, payload_bytes=1))

    db.transact(tx)


def _op(i: int, **kw: Any) -> Operation:
    values: dict[str, Any] = dict(kind="long_term_archive", status="PENDING", dedup_key=f"long_term_archive:{i}",
                                  site_id=1, attempt=0, retry_count=0, max_retries=3, stall_count=0, bytes_done=0,
                                  destination_location_id=1)
    values.update(kw)
    return Operation(**values)


def test_constraints_hold_on_postgres(pg_db: Database) -> None:
    _seed(pg_db)
    with pytest.raises(IntegrityError, match="ck_operations_kind"):
        pg_db.transact(lambda s: s.add(_op(1, kind="archive")) or s.flush())
    copy = dict(raw_data_package_id=1, location_id=1, path="raw/a.tar", size=1, sha256="a" * 64)
    pg_db.transact(lambda s: s.add(PhysicalCopy(status="present", **copy)))
    with pytest.raises(IntegrityError, match="uq_physical_copies_live_raw"):
        pg_db.transact(lambda s: s.add(PhysicalCopy(status="deletion_pending", **copy)) or s.flush())
    pg_db.transact(lambda s: s.add(PhysicalCopy(status="deleted", **copy)))  # a dead copy is allowed
    assert pg_db.read(lambda s: s.scalar(select(func.count()).select_from(PhysicalCopy))) == 2


# ------------------------------------------------------------------------ transient errors


@pytest.mark.parametrize("sqlstate", ["40001", "40P01", "57P01"])
def test_transient_sqlstates_are_retried_by_the_unit_of_work(pg_db: Database, sqlstate: str) -> None:
    calls = []

    def tx(s: Session) -> int:
        calls.append(1)
        if len(calls) < 3:  # a real server error with this SQLSTATE, twice
            s.execute(text(f"DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '{sqlstate}'; END $$"))
        return int(s.scalar(text("SELECT 41 + 1")))

    assert pg_db.transact(tx) == 42
    assert len(calls) == 3


def test_a_permanent_error_is_not_retried(pg_db: Database) -> None:
    calls = []

    def tx(s: Session) -> None:
        calls.append(1)
        s.execute(text("DO $$ BEGIN RAISE EXCEPTION 'bad' USING ERRCODE = '23505'; END $$"))

    with pytest.raises(IntegrityError):
        pg_db.transact(tx)
    assert len(calls) == 1


def test_a_connection_killed_by_the_server_is_replaced_without_a_pending_rollback_loop(pg_db: Database,
                                                                                       pg_url: str) -> None:
    _seed(pg_db)
    killer = create_engine(pg_url)
    attempts = []

    def tx(s: Session) -> int:
        attempts.append(s.scalar(text("SELECT pg_backend_pid()")))
        if len(attempts) == 1:  # the server drops this very connection in the middle of the unit
            with killer.connect() as k:
                k.execute(text("SELECT pg_terminate_backend(:p)"), {"p": attempts[0]})
                k.commit()
        s.add(_op(7))
        s.flush()
        return 7

    assert pg_db.transact(tx) == 7
    assert len(attempts) == 2 and attempts[0] != attempts[1]
    # every pooled connection dies (server-side restart of sessions): later units still work
    with killer.connect() as k:
        k.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()"))
        k.commit()
    killer.dispose()
    for _ in range(5):
        assert pg_db.read(lambda s: s.scalar(select(func.count()).select_from(Operation))) == 1


def test_an_unreachable_server_raises_transient_database_error(pg_url: str) -> None:
    dead = Database(pg_url.replace(":5432/", ":1/"), pool_size=1, max_overflow=0)
    with pytest.raises(TransientDatabaseError, match="unavailable after 2 attempts"):
        dead.transact(lambda s: s.execute(text("SELECT 1")), attempts=2)


# ------------------------------------------------------------------------------ fork safety


def _child_backend_pid(db: Database, q: Any) -> None:
    q.put(db.read(lambda s: s.scalar(text("SELECT pg_backend_pid()"))))


def test_a_forked_child_opens_its_own_connections(pg_db: Database) -> None:
    parent_pid = pg_db.read(lambda s: s.scalar(text("SELECT pg_backend_pid()")))
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    children = [ctx.Process(target=_child_backend_pid, args=(pg_db, q)) for _ in range(3)]
    for c in children:
        c.start()
    for c in children:
        c.join(60)
        assert c.exitcode == 0
    child_pids = {q.get(timeout=10) for _ in children}
    assert len(child_pids) == 3 and parent_pid not in child_pids
    # the parent's pooled connection survived its children (none closed or used it)
    assert pg_db.read(lambda s: s.scalar(text("SELECT pg_backend_pid()"))) == parent_pid


# ------------------------------------------------------------------------------ dispatch


def test_concurrent_dispatchers_never_pick_the_same_operation(pg_db: Database, tmp_path: Path) -> None:
    from packhorse.executors.celery_app import dispatch_pending, make_app
    from packhorse.runtime.context import ProcessContext
    from packhorse.runtime.topology import sync_topology

    settings = settings_from_dict({
        "database": {"url": pg_db.url}, "executor": {"kind": "celery", "broker_url": "memory://"},
        "sites": [{"name": "cologne"}],
        "locations": [{"name": "cologne-lta", "site": "cologne", "role": "long_term_archive", "path": "a"}],
    }, base_dir=tmp_path, environ={})
    _seed(pg_db)
    pg_db.transact(lambda s: s.add_all([_op(i) for i in range(300)]))
    sent: list[list[int]] = []

    def dispatcher() -> None:
        db = Database(pg_db.url, pool_size=1, max_overflow=0)
        ctx = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
        app = make_app(settings)
        mine: list[int] = []
        while True:
            batch = dispatch_pending(ctx, app, batch=25)
            if not batch:
                break
            mine += [d.operation_id for d in batch]
            assert all(d.queue == "cologne_cologne-lta_long_term_archive" and d.min_attempt == 1 for d in batch)
        sent.append(mine)
        db.dispose()

    threads = [threading.Thread(target=dispatcher) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    every = [i for mine in sent for i in mine]
    assert len(every) == 300 and len(set(every)) == 300, "an operation was dispatched twice or not at all"
    assert sum(1 for mine in sent if mine) >= 2, "the dispatchers did not run concurrently"
    statuses = pg_db.read(lambda s: set(s.scalars(select(Operation.status))))
    assert statuses == {Status.SCHEDULED.value}
    assert pg_db.read(lambda s: s.scalar(select(func.min(Operation.scheduled_at)))) <= utcnow()


# ------------------------------------------------------------------- concurrent completions


def test_two_sites_completing_the_last_archives_at_once_mark_the_package_archived(pg_db: Database,
                                                                                  tmp_path: Path) -> None:
    """Each archive completion checks "is every archive copy there?" in its own transaction; two
    of them committing at once must not both miss the other's copy (the package would never be
    marked archived, and its buffer copies never freed)."""
    from packhorse.config import load_config
    from packhorse.rules.policy import mark_archived_if_complete
    from packhorse.runtime.context import ProcessContext
    from packhorse.runtime.topology import sync_topology
    from packhorse.stages.base import record_copy
    from support import write_site_config

    settings = load_config(write_site_config(tmp_path))
    topo = sync_topology(pg_db, settings)
    src = topo.location_ids["fyst-source"]

    def add_package(s: Session) -> int:
        pkg = RawDataPackage(name="inst/obs1", group_path="inst/obs1", source_location_id=src,
                             bagging_date="2026-11-30", file_count=1, payload_bytes=1, size=10, sha256="b" * 64)
        s.add(pkg)
        s.flush()
        return pkg.id

    pkg_id = pg_db.transact(add_package)
    both_inserted = threading.Barrier(2, timeout=30)
    results: dict[str, bool] = {}

    def complete(lta: str) -> None:
        db = Database(pg_db.url, pool_size=1, max_overflow=0)
        ctx = ProcessContext(settings=settings, db=db, topology=topo)

        def tx(s: Session) -> bool:
            record_copy(s, location_id=topo.location_ids[lta], key="raw/inst/obs1.tar", size=10, sha256="b" * 64,
                        raw_data_package_id=pkg_id)
            both_inserted.wait()  # neither has committed its copy yet
            return mark_archived_if_complete(s, ctx, pkg_id)

        results[lta] = db.transact(tx)
        db.dispose()

    threads = [threading.Thread(target=complete, args=(n,)) for n in ("cologne-lta", "cornell-lta")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results.values()) == [False, True], results  # the second to commit saw both copies
    assert pg_db.read(lambda s: s.get(RawDataPackage, pkg_id).archived_at) is not None


def _round_trips(db: Database, unit: Any) -> list[str]:
    """The messages the client sent to the server while running ``unit()`` on ``db``'s single
    pooled connection (psycopg's protocol trace): one entry per message type sent."""
    import tempfile

    with tempfile.TemporaryFile("w+") as trace:
        raw = db.engine.raw_connection()
        pgconn = raw.driver_connection.pgconn  # type: ignore[union-attr]
        raw.close()  # back to the pool: the unit checks out this very connection
        pgconn.trace(trace.fileno())
        try:
            unit()
        finally:
            pgconn.untrace()
        trace.seek(0)
        return [line.split("\t")[3] for line in trace.read().splitlines() if line.split("\t")[1] == "F"]


def test_units_of_work_make_no_round_trip_besides_their_own(pg_url: str) -> None:
    # a ping before each unit (pool_pre_ping) was a fourth round trip of a one-statement
    # transaction; a unit of Database.statements has no BEGIN and COMMIT either
    db = Database(pg_url, pool_size=1, max_overflow=0)
    db.upgrade()
    _seed(db)
    try:
        one = text("SELECT :x").bindparams(x=1)  # a bound parameter: the extended protocol, one Sync
        db.transact(lambda s: s.execute(one))  # the pool holds its one connection
        sent = _round_trips(db, lambda: db.transact(lambda s: s.execute(one)))
        assert sent.count("Query") == 2 and sent.count("Sync") == 1, sent  # BEGIN, statement, COMMIT
        sent = _round_trips(db, lambda: db.statements(lambda c: c.execute(one).scalar()))
        assert sent.count("Query") == 0 and sent.count("Sync") == 1, sent  # the statement alone
    finally:
        db.dispose()


def test_a_pooled_connection_the_server_closed_is_replaced_before_use(pg_url: str) -> None:
    db = Database(pg_url, pool_size=1, max_overflow=0)
    try:
        with db.engine.connect() as c:
            pid = c.execute(text("SELECT pg_backend_pid()")).scalar()
        killer = create_engine(pg_url)
        with killer.connect() as k:
            k.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
            k.commit()
        killer.dispose()
        import time

        time.sleep(0.2)  # the server's goodbye reaches the idle socket
        # no retry here (a bare connection, not a unit of work): the checkout itself must
        # notice that the pooled connection is dead and open another
        with db.engine.connect() as c:
            assert c.execute(text("SELECT pg_backend_pid()")).scalar() != pid
    finally:
        db.dispose()


def test_statements_unit_is_retried_after_the_server_killed_its_connection(pg_db: Database, pg_url: str) -> None:
    killer = create_engine(pg_url)
    pids: list[int] = []

    def unit(c: Any) -> int:
        pids.append(c.execute(text("SELECT pg_backend_pid()")).scalar())
        if len(pids) == 1:
            with killer.connect() as k:
                k.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pids[0]})
                k.commit()
        return c.execute(text("SELECT 7")).scalar()

    try:
        assert pg_db.statements(unit) == 7
        assert len(pids) == 2 and pids[0] != pids[1]
    finally:
        killer.dispose()


def test_batch_claims_racing_over_shared_operations_grant_each_once(pg_db: Database) -> None:
    from packhorse.engine.outcome import complete_many
    from packhorse.operations.lifecycle import claim_many

    _seed(pg_db)

    def add(s: Session) -> list[int]:
        ops = [_op(i) for i in range(60)]
        s.add_all(ops)
        s.flush()
        return [o.id for o in ops]

    ids = pg_db.transact(add)
    start = threading.Barrier(4, timeout=30)
    granted: dict[str, dict[int, Any]] = {}
    completed: dict[str, set[int]] = {}

    def worker(name: str, mine: list[int]) -> None:
        db = Database(pg_db.url, pool_size=1, max_overflow=0)
        start.wait()
        claims = claim_many(db, {i: 0 for i in mine}, name, 60)
        granted[name] = claims
        completed[name] = db.transact(lambda s: complete_many(s, claims.values(), {i: 5 for i in claims}))
        db.dispose()

    # every operation offered to two workers at once, in opposite orders
    offers = {"w0": ids[:40], "w1": ids[20:] + ids[:20][::-1], "w2": ids[::-1][:40], "w3": ids[10:50]}
    threads = [threading.Thread(target=worker, args=(n, m)) for n, m in offers.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    everyone = [i for claims in granted.values() for i in claims]
    assert sorted(everyone) == sorted(ids)  # each granted exactly once
    assert all(completed[n] == set(granted[n]) for n in granted)
    rows = pg_db.read(lambda s: s.execute(select(Operation.status, Operation.attempt, Operation.bytes_done)
                                          .where(Operation.id.in_(ids))).all())
    assert set(rows) == {("COMPLETED", 1, 5)}
