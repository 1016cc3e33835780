"""Engines and units of work.

One :class:`Database` per process (engines are never shared across a fork). Work is done in
short *units of work* through :meth:`Database.transact`, which commits, and retries the whole
unit on a transient database error (SQLite busy, a dropped PostgreSQL connection, a
serialization failure): such an error is never recorded as an operation's failure (DESIGN.md
"Architecture"). No unit of work may read or write payload bytes: callers do I/O between
units, never inside one.

SQLite runs in WAL mode and opens every write transaction with ``BEGIN IMMEDIATE`` so that
two writers queue on the database lock instead of failing half-way through; read-only units
(:meth:`Database.read`) use a plain ``BEGIN`` and never wait for writers. Write units of every
process using the same file queue on a :class:`WriterQueue` first: SQLite's own busy handler
sleeps in coarse steps (1, 2, 5 … 100 ms), which wasted seconds when worker processes and the
managers wrote at the same time; the queue hands the lock over at once.
"""

from __future__ import annotations

import fcntl
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from sqlalchemy import create_engine, event, exc, inspect
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from ..errors import DatabaseNotInitializedError, TransientDatabaseError

T = TypeVar("T")

MIGRATIONS_DIR = Path(__file__).with_name("migrations")


def _is_transient(err: BaseException) -> bool:
    if isinstance(err, exc.DBAPIError) and err.connection_invalidated:
        return True
    if isinstance(err, exc.OperationalError):
        text = str(err.orig).lower() if err.orig is not None else str(err).lower()
        transient_words = ("locked", "busy", "connection", "server closed", "terminating",
                           "could not serialize", "deadlock", "timeout", "shutting down")
        return any(w in text for w in transient_words)
    if isinstance(err, exc.DBAPIError) and err.orig is not None:
        sqlstate = getattr(err.orig, "sqlstate", None)
        return sqlstate in {"40001", "40P01", "57P01", "08006", "08003", "08001"}
    return isinstance(err, exc.PendingRollbackError)


class WriterQueue:
    """Orders the write units of every thread and process that use one SQLite file.

    A thread lock queues the threads of this process; an exclusive ``flock(2)`` on
    ``<database file>.writer-lock`` queues the processes (it is released the moment the holder
    commits, where SQLite's busy handler would sleep). It is an optimization only: SQLite's own
    locking keeps every write correct, so if the flock cannot be had within ``wait_seconds``
    (its holder stopped, say by SIGSTOP) the unit goes on without it and meets SQLite's busy
    timeout instead. Re-entrant within a thread.

    Args:
        db_path: path of the SQLite database file.
        wait_seconds: how long to poll for the flock before going on without it.
    """

    def __init__(self, db_path: str, wait_seconds: float = 30.0) -> None:
        self._lock_path = db_path + ".writer-lock"
        self._wait = wait_seconds
        self._thread_lock = threading.RLock()
        self._local = threading.local()
        self._fd: int | None = None
        self._fd_pid = 0

    def _lock_fd(self) -> int | None:
        if self._fd is None or self._fd_pid != os.getpid():  # never share an flock across a fork
            try:
                self._fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError:
                return None  # read-only folder: SQLite's busy handler alone
            self._fd_pid = os.getpid()
        return self._fd

    def __enter__(self) -> "WriterQueue":
        self._thread_lock.acquire()
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth == 0:
            self._local.flocked = self._acquire_flock()
        return self

    def _acquire_flock(self) -> bool:
        fd = self._lock_fd()
        if fd is None:
            return False
        deadline = time.monotonic() + self._wait
        pause = 0.0001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(pause)
                pause = min(pause * 2, 0.002)
            except OSError:
                return False

    def __exit__(self, *exc_info: object) -> None:
        self._local.depth -= 1
        try:
            if self._local.depth == 0 and self._local.flocked and self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()


def make_engine(url: str) -> Engine:
    """Create an engine for ``url``; SQLite gets WAL, ``BEGIN IMMEDIATE`` and a busy timeout."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 60, "check_same_thread": False},
                               pool_size=16, max_overflow=16)

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=60000")
            # read pages through a memory map instead of one pread(2) per page: a connection's
            # page cache is dropped whenever another connection wrote, which is all the time here
            cur.execute("PRAGMA mmap_size=268435456")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn):  # type: ignore[no-untyped-def]
            # read-only units of work (Database.read) take no write lock
            read_only = conn.get_execution_options().get("packhorse_read_only", False)
            conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=10)


class Database:
    """The ops database of one process.

    Args:
        url: SQLAlchemy URL, e.g. ``sqlite:////abs/path/packhorse.db`` or
            ``postgresql+psycopg://user@host/db``.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        # SQLite has one writer at a time and its busy handler waits by sleeping (up to 100 ms
        # a step): writers queue instead, so a write starts the moment the previous one commits.
        self._write_lock: WriterQueue | None = None
        if url.startswith("sqlite:///") and ":memory:" not in url:
            self._write_lock = WriterQueue(self.engine.url.database or url[len("sqlite:///"):])
        self._read_sessions = sessionmaker(self.engine.execution_options(packhorse_read_only=True),
                                           expire_on_commit=False)

    def session(self) -> Session:
        """A new session (caller commits/closes). Prefer :meth:`transact`."""
        return self._sessions()

    def transact(self, fn: Callable[[Session], T], *, attempts: int = 8) -> T:
        """Run ``fn(session)`` in one transaction and commit; retry it on a transient error.

        ``fn`` must be safe to run again from the start (it only touches the database).

        Returns:
            whatever ``fn`` returns.

        Raises:
            TransientDatabaseError: the database stayed unavailable for every attempt.
            Any other exception ``fn`` raises (after rolling back).
        """
        if self._write_lock is None:
            return self._run(fn, self._sessions, attempts=attempts)
        with self._write_lock:
            return self._run(fn, self._sessions, attempts=attempts)

    def read(self, fn: Callable[[Session], T], *, attempts: int = 8) -> T:
        """Run a read-only ``fn(session)`` in one consistent snapshot; retried like :meth:`transact`.

        On SQLite the transaction is a plain (deferred) ``BEGIN``: readers never wait for the
        write lock. ``fn`` must not write.
        """
        return self._run(fn, self._read_sessions, attempts=attempts)

    def _run(self, fn: Callable[[Session], T], factory: sessionmaker[Session], *, attempts: int) -> T:
        delay = 0.05
        for i in range(attempts):
            session = factory()
            try:
                result = fn(session)
                # a read-only unit commits too: nothing to write, and a rollback would expire
                # the objects it returns
                session.commit()
                return result
            except exc.SQLAlchemyError as err:
                session.rollback()
                if not _is_transient(err):
                    raise
                if i == attempts - 1:
                    raise TransientDatabaseError(f"database unavailable after {attempts} attempts: {err}") from err
                time.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 5.0)
            except BaseException:
                session.rollback()
                raise
            finally:
                session.close()
        raise AssertionError("unreachable")

    def dispose(self) -> None:
        """Close every pooled connection (call in a child after fork, and at exit)."""
        self.engine.dispose()

    # -- migrations -----------------------------------------------------------------
    def _alembic_config(self):  # type: ignore[no-untyped-def]
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
        cfg.set_main_option("sqlalchemy.url", self.url.replace("%", "%%"))
        return cfg

    def upgrade(self, revision: str = "head") -> None:
        """Create or upgrade the schema to ``revision`` with Alembic (``packhorse init``)."""
        from alembic import command

        cfg = self._alembic_config()
        with self.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)

    def downgrade(self, revision: str) -> None:
        """Downgrade the schema to ``revision`` (``"base"`` drops every table)."""
        from alembic import command

        cfg = self._alembic_config()
        with self.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, revision)

    def current_revision(self) -> str | None:
        """The Alembic revision the database is at, or ``None`` if it has no schema."""
        from alembic.runtime.migration import MigrationContext

        with self.engine.connect() as conn:
            if not inspect(conn).has_table("alembic_version"):
                return None
            return MigrationContext.configure(conn).get_current_revision()

    def head_revision(self) -> str:
        """The latest migration shipped with this version of packhorse."""
        from alembic.script import ScriptDirectory

        head = ScriptDirectory.from_config(self._alembic_config()).get_current_head()
        assert head is not None
        return head

    def ensure_migrated(self) -> None:
        """Raise :class:`DatabaseNotInitializedError` unless the schema is at the head revision."""
        current = self.current_revision()
        if current != self.head_revision():
            where = "has no packhorse schema" if current is None else f"is at migration {current}"
            raise DatabaseNotInitializedError(
                f"the database {self.engine.url.render_as_string(hide_password=True)} {where}; "
                "run `packhorse init` to create or upgrade it"
            )
