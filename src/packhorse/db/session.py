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

PostgreSQL (``postgresql+psycopg://user@host:5432/db``, psycopg 3) gets a connection pool of
``pool_size`` connections plus ``max_overflow`` extra ones per process (``[database]``
``pool_size`` / ``max_overflow``, default 5 + 5), recycled after 30 minutes. A pooled
connection is checked before use without a round trip (:func:`_closed_by_server`: a server
that restarted or terminated the session has sent its goodbye and closed the socket, which is
then readable) and replaced if the server dropped it; a connection that dies later, in the
middle of a unit, is a transient error and the unit is retried on a fresh one (SQLAlchemy
then invalidates every older connection of the pool). A ``SELECT 1`` before every unit
(``pool_pre_ping``) cost one of the four round trips of a one-statement unit. Read-only units
run in a ``READ ONLY`` transaction; :meth:`Database.statements` runs units whose every
statement is correct on its own (a compare-and-set) in autocommit: one round trip per
statement, no ``BEGIN`` and ``COMMIT`` around it. Transient errors are recognized by their SQLSTATE: connection
exceptions (class ``08``), serialization failure ``40001``, deadlock ``40P01``, admin / crash
shutdown and "cannot connect now" ``57P01``–``57P03``, too many connections ``53300``.

**Fork safety.** A pooled connection must never be shared by two processes (a Celery prefork
pool forks its children after the parent may have connected). :attr:`Database.engine` notices
that it is used in a new process and builds a fresh engine there, leaving the parent's
connections untouched (``dispose(close=False)``), so every process has its own pool.

**One clock.** On PostgreSQL, before the first unit of work of a process and again at most every
``clock_refresh_seconds`` (30 s), :meth:`Database.measure_clock` measures this host's offset to
the server's clock (:mod:`packhorse.db.clock`), which :func:`packhorse.db.models.utcnow` adds to
the host's clock: every lease, heartbeat and age is the database's time, whatever this host's
clock says. A measurement that fails (the server is away) keeps the last offset and is tried
again within 5 s.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import os
import random
import select
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import create_engine, event, exc, inspect, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session, sessionmaker

from packhorse.db import clock
from packhorse.errors import DatabaseNotInitializedError, TransientDatabaseError

if TYPE_CHECKING:
    from sqlalchemy.sql.base import Executable

    from packhorse.config import Settings

T = TypeVar("T")

MIGRATIONS_DIR = Path(__file__).with_name("migrations")


#: SQLSTATEs that go away on retry (besides class 08, connection exceptions).
TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "57P01", "57P02", "57P03", "53300"})
_TRANSIENT_WORDS = ("locked", "busy", "connection", "server closed", "terminating", "could not serialize",
                    "deadlock", "timeout", "shutting down", "the database system is starting up")


def _is_transient(err: BaseException) -> bool:
    """True for a database error that a fresh attempt of the unit of work can get past."""
    if isinstance(err, exc.PendingRollbackError):
        return True
    if not isinstance(err, exc.DBAPIError):
        return False
    if err.connection_invalidated:
        return True
    sqlstate = getattr(err.orig, "sqlstate", None)
    if sqlstate:
        return sqlstate in TRANSIENT_SQLSTATES or sqlstate.startswith("08")
    if isinstance(err, (exc.OperationalError, exc.InterfaceError)):
        text = str(err.orig if err.orig is not None else err).lower()
        return any(w in text for w in _TRANSIENT_WORDS)
    return False


def driver_rows(conn: Connection, statement: Executable) -> list[tuple[Any, ...]]:
    """Every row of ``statement`` as the database driver's plain tuples, read on ``conn`` with the
    driver's own cursor: for reads of millions of rows, where a SQLAlchemy row each costs as much
    as the work done with it (:func:`packhorse.managers.listing.registered_files`).

    An error of the driver is raised as SQLAlchemy raises it for its own statements (a
    :class:`sqlalchemy.exc.DBAPIError` subclass; on a lost connection the connection is
    invalidated and the error says so), so the unit of work around it retries it like any other
    transient error (:func:`_retrying`). A driver error raised as it is would end the unit at its
    first attempt: a scan under way when its site's link to the database was cut failed at once,
    instead of waiting out the cut.

    Raises:
        sqlalchemy.exc.DBAPIError: the driver failed (its ``orig`` is the driver's exception).
    """
    compiled = statement.compile(dialect=conn.dialect)
    params: Any = compiled.params
    if compiled.positional:  # qmark (SQLite); named (psycopg's pyformat) takes the dict
        params = tuple(params[name] for name in compiled.positiontup or ())
    sql = str(compiled)
    dbapi_error = conn.dialect.loaded_dbapi.Error
    raw = conn.connection
    cursor = raw.cursor()
    try:
        cursor.execute(sql, params)
        return cursor.fetchall()  # type: ignore[no-any-return]
    except dbapi_error as err:
        lost = conn.dialect.is_disconnect(err, raw.dbapi_connection, cursor)
        if lost:
            conn.invalidate(err)
        raise exc.DBAPIError.instance(sql, params, err, dbapi_error, connection_invalidated=lost,
                                      dialect=conn.dialect) from err
    finally:
        with contextlib.suppress(dbapi_error):
            cursor.close()


#: Default connection pool of one process on PostgreSQL (``[database] pool_size``, ``max_overflow``).
DEFAULT_POOL_SIZE = 5
DEFAULT_MAX_OVERFLOW = 5


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
                pause = min(pause * 2, 0.0005)
            except OSError:
                return False

    def __exit__(self, *exc_info: object) -> None:
        self._local.depth -= 1
        try:
            if self._local.depth == 0 and self._local.flocked and self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()


def make_engine(url: str, *, pool_size: int = DEFAULT_POOL_SIZE, max_overflow: int = DEFAULT_MAX_OVERFLOW) -> Engine:
    """Create an engine for ``url`` in this process.

    SQLite gets WAL, ``BEGIN IMMEDIATE`` and a busy timeout; PostgreSQL a pool of ``pool_size``
    (+ ``max_overflow``) connections, each checked at checkout without a round trip
    (:func:`_closed_by_server`), a 10 s connect timeout and TCP keepalives (a server that
    vanished is noticed in about a minute, not after the kernel's two hours).
    """
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
    if not url.startswith("postgresql"):
        return create_engine(url, pool_pre_ping=True, pool_size=pool_size, max_overflow=max_overflow,
                             pool_recycle=1800, pool_timeout=30)
    connect_args = {"connect_timeout": 10, "keepalives": 1, "keepalives_idle": 30,
                    "keepalives_interval": 10, "keepalives_count": 3,
                    "application_name": f"packhorse:{os.getpid()}"}
    engine = create_engine(url, pool_size=pool_size, max_overflow=max_overflow,
                           pool_recycle=1800, pool_timeout=30, connect_args=connect_args)

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn, _record, _proxy):  # type: ignore[no-untyped-def]
        if _closed_by_server(dbapi_conn):
            # the pool drops this connection and checks out (or opens) another
            raise exc.DisconnectionError("the server closed this pooled connection")

    return engine


def _closed_by_server(dbapi_conn: Any) -> bool:
    """Whether an idle pooled PostgreSQL connection is dead, seen without a round trip.

    An idle connection receives nothing unasked (packhorse uses no ``LISTEN``), so a socket
    that is readable, closed or in error means the server said goodbye (a restart, an
    administrator's ``pg_terminate_backend``, a crash: it sends its ``FATAL`` and closes the
    socket) or the connection broke. A false alarm costs one reconnection. A peer that vanished
    without a word is not seen here: the statement then fails with a connection error, which
    :meth:`Database.transact` retries on a fresh connection, as it did after a ping.
    """
    if getattr(dbapi_conn, "closed", False) or getattr(dbapi_conn, "broken", False):
        return True
    try:
        poller = select.poll()
        poller.register(dbapi_conn.fileno(), select.POLLIN | select.POLLPRI)
        return bool(poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return True


#: Every Database of this process: a forked child drops their inherited connections at once
#: (without closing them: they are the parent's), before anything could use or garbage-collect
#: them (SQLAlchemy's recipe for multiprocessing).
_DATABASES: "weakref.WeakSet[Database]" = weakref.WeakSet()


def _forget_parent_connections() -> None:
    for db in list(_DATABASES):
        try:
            db._after_fork()
        except Exception:
            pass


os.register_at_fork(after_in_child=_forget_parent_connections)


def _discard(session: Session) -> None:
    """Roll back a failed unit of work; if the connection is dead, drop it from the pool.

    The session is never reused after a failure (every attempt opens a new one), so a dead
    connection cannot leave a ``PendingRollbackError`` loop behind.
    """
    try:
        session.rollback()
    except Exception:
        try:
            session.invalidate()
        except Exception:
            pass


def insert_ignoring_conflicts(session: Session | Connection, table: Any, *keys: Any) -> Any:
    """``INSERT INTO table … ON CONFLICT (keys) DO NOTHING`` for the database of ``session`` (a
    session or a connection; SQLite or PostgreSQL): a row whose unique ``keys`` exist already is
    skipped by the database itself, so two writers racing insert it once and neither fails."""
    dialect = session.dialect if isinstance(session, Connection) else session.get_bind().dialect
    if dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert(table).on_conflict_do_nothing(index_elements=list(keys))


def insert_if_absent(session: Session, table: Any, keys: Sequence[Any], values: dict[str, Any]) -> bool:
    """Insert one row of ``values`` into ``table`` unless a row with the same unique ``keys``
    (columns) exists: whether this call inserted it (a compare-and-set: of two writers racing,
    exactly one gets ``True``).

    Told by ``RETURNING`` (SQLite ≥ 3.35 and PostgreSQL), never by the result's ``rowcount``:
    with SQLAlchemy 2.1 and psycopg 3 an ``INSERT``'s ``rowcount`` is ``-1`` on PostgreSQL, so a
    check of it took every first insert for a conflict (a site cut off, a location found
    unavailable: recorded, but never notified)."""
    stmt = insert_ignoring_conflicts(session, table, *keys).values(**values).returning(*keys)
    return session.execute(stmt).first() is not None


def bound_idle_in_transaction(session: Session, seconds: float) -> None:
    """PostgreSQL: end this session if it sits idle inside the current transaction for more than
    ``seconds`` (``SET LOCAL idle_in_transaction_session_timeout``), so a process stopped or hung
    in the middle of a transaction that holds row or advisory locks others need (a manager
    bundling, a monitor resetting an operation) releases them within a lease instead of
    blocking every other manager for good; its late writes then fail with the connection and
    change nothing. SQLite: nothing (one process writes an embedded database).

    Call it first in the transaction; ``seconds`` is rounded up to whole milliseconds.
    """
    if session.get_bind().dialect.name == "postgresql":
        ms = max(1, int(seconds * 1000 + 0.999))
        session.execute(text(f"SET LOCAL idle_in_transaction_session_timeout = {ms}"))


def try_transaction_lock(session: Session, name: str) -> bool:
    """PostgreSQL: take the transaction-level advisory lock ``name`` if nobody holds it
    (``pg_try_advisory_xact_lock``; released at commit or rollback, or when the connection
    dies); ``False`` if another transaction holds it. SQLite: always ``True`` (a write
    transaction already holds the database's one write lock)."""
    if session.get_bind().dialect.name != "postgresql":
        return True
    return bool(session.execute(text("SELECT pg_try_advisory_xact_lock(hashtext(:k))"), {"k": name}).scalar())


#: The head of ``db/migrations`` (a unit test compares it with Alembic's view of the scripts);
#: a constant, so that checking a database at start needs no Alembic import.
HEAD_REVISION = "0031"


#: What a unit of work that used up its attempts asks before it tries again (:func:`retry_while`):
#: ``None`` (the default) gives up after its attempts.
_keep_trying: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar(
    "packhorse_db_keep_trying", default=None)

#: Longest pause between two tries of a unit retrying past its attempts (s): a database that
#: came back is seen within about this long.
PATIENT_RETRY_MAX_DELAY = 1.0


@contextlib.contextmanager
def retry_while(keep_trying: Callable[[], bool]) -> Iterator[None]:
    """Within the block (this thread or task only: a :mod:`contextvars` variable), a unit of work
    whose attempts are used up by transient errors keeps trying for as long as ``keep_trying()``
    is true, and every try of it (from the first) is at most :data:`PATIENT_RETRY_MAX_DELAY`
    after the one before (outside, the backoff grows to 5 s, up to 10 s with jitter).

    A worker holding a lease uses it so that a database outage costs it nothing while its lease
    is still valid (``keep_trying``: the lease could not have expired yet,
    :meth:`packhorse.operations.lease.LeaseKeeper.may_hold`; docs/recovery.md "Layer 2"): 8
    attempts alone gave up after about 6–12 s, whatever the lease. Nested blocks: the innermost
    applies. ``keep_trying`` must be cheap and must not touch the database.
    """
    token = _keep_trying.set(keep_trying)
    try:
        yield
    finally:
        _keep_trying.reset(token)


def _retrying(once: Callable[[], T], attempts: int) -> T:
    """Run ``once()`` until it returns, retrying a transient database error (:func:`_is_transient`)
    with exponential backoff and jitter (0.05 s doubling, capped at 5 s) up to ``attempts``
    times in all, then (inside :func:`retry_while`) for as long as its ``keep_trying()`` holds,
    every try then at most :data:`PATIENT_RETRY_MAX_DELAY` apart; any other error is raised at once (DESIGN.md
    "Architecture": a transient database error is retried by the unit of work that met it,
    never an operation's failure).

    Raises:
        TransientDatabaseError: the database stayed unavailable for every attempt (and, inside
            :func:`retry_while`, until ``keep_trying()`` turned false).
    """
    delay = 0.05
    i = 0
    while True:
        try:
            return once()
        except exc.SQLAlchemyError as err:
            if not _is_transient(err):
                raise
            i += 1
            keep = _keep_trying.get()
            if i >= attempts and (keep is None or not keep()):
                raise TransientDatabaseError(f"database unavailable after {i} attempts: {err}") from err
            if keep is None:
                time.sleep(delay * (1 + random.random()))
            else:  # a lease holder sees the database back within about a second
                time.sleep(min(delay, PATIENT_RETRY_MAX_DELAY) * (1 + random.random()) / 2)
            delay = min(delay * 2, 5.0)


#: A failed clock measurement is tried again after this long (s), not at every unit of work.
CLOCK_RETRY_SECONDS = 5.0


class Database:
    """The ops database of one process.

    Args:
        url: SQLAlchemy URL, e.g. ``sqlite:////abs/path/packhorse.db`` or
            ``postgresql+psycopg://user@host/db``.
        pool_size, max_overflow: PostgreSQL connection pool of this process.
        clock_offset_warn_seconds: log one WARNING when this host's clock is farther than this
            from the database server's (s; :func:`packhorse.db.clock.record`).
        clock_refresh_seconds: measure the offset again at most this often (s).
    """

    def __init__(self, url: str, *, pool_size: int = DEFAULT_POOL_SIZE,
                 max_overflow: int = DEFAULT_MAX_OVERFLOW,
                 clock_offset_warn_seconds: float = clock.DEFAULT_WARN_SECONDS,
                 clock_refresh_seconds: float = clock.DEFAULT_REFRESH_SECONDS) -> None:
        self.url = url
        self.pool_size = pool_size
        self.max_overflow = max_overflow
        self.clock_offset_warn_seconds = clock_offset_warn_seconds
        self.clock_refresh_seconds = clock_refresh_seconds
        self._setup()
        _DATABASES.add(self)

    @classmethod
    def from_settings(cls, settings: "Settings") -> "Database":
        """The database of ``[database]`` (URL with a relative SQLite path resolved, pool sizes,
        the clock offset that is warned about)."""
        return cls(settings.database_url, pool_size=settings.database.pool_size,
                   max_overflow=settings.database.max_overflow,
                   clock_offset_warn_seconds=settings.database.clock_offset_warn_seconds)

    def _setup(self) -> None:
        self._pid = os.getpid()
        self._engine = make_engine(self.url, pool_size=self.pool_size, max_overflow=self.max_overflow)
        self._sessions = sessionmaker(self._engine, expire_on_commit=False)
        # SQLite has one writer at a time and its busy handler waits by sleeping (up to 100 ms
        # a step): writers of every thread and process queue instead (WriterQueue), so a write
        # starts the moment the previous one commits.
        self._write_lock: WriterQueue | None = None
        if self.url.startswith("sqlite:///") and ":memory:" not in self.url:
            self._write_lock = WriterQueue(self._engine.url.database or self.url[len("sqlite:///"):])
        self._autocommit: Engine | None = None
        if self.url.startswith("postgresql"):
            self._autocommit = self._engine.execution_options(isolation_level="AUTOCOMMIT")
        # reads on PostgreSQL in autocommit: each statement one round trip, without the BEGIN
        # and COMMIT around it (see read())
        self._read_sessions = sessionmaker((self._autocommit or self._engine).execution_options(
            packhorse_read_only=True), expire_on_commit=False)
        #: time.monotonic() when the clock is due to be measured (PostgreSQL only; 0: at once);
        #: a new lock in a forked child (a parent's thread may have held the old one at the fork)
        self._clock_due = 0.0 if self.url.startswith("postgresql") else float("inf")
        self._clock_lock = threading.Lock()

    def measure_clock(self) -> float:
        """Measure this host's offset to the database server's clock now and make it this
        process's (:func:`packhorse.db.clock.measure` with ``SELECT clock_timestamp()``, then
        :func:`packhorse.db.clock.record`, which warns once beyond ``clock_offset_warn_seconds``).
        SQLite: nothing is measured (the database is on this host), 0.0.

        Returns:
            the offset (s, database minus host).

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the server could not be asked (the offset is kept).
        """
        if not self.url.startswith("postgresql"):
            return 0.0
        engine = self._autocommit or self._engine
        with engine.connect() as conn:
            offset = clock.measure(lambda: conn.exec_driver_sql("SELECT clock_timestamp()").scalar_one())
        clock.record(offset, warn_above_seconds=self.clock_offset_warn_seconds,
                     database=self._engine.url.render_as_string(hide_password=True))
        return offset

    def follow_clock(self) -> None:
        """Measure the clock when it is due (first use, then every ``clock_refresh_seconds``, s).
        Never raises: a failed measurement keeps the last offset and is tried again after
        :data:`CLOCK_RETRY_SECONDS` (the unit of work that follows meets the same error and
        retries it). Called before every unit of work; costs nothing when not due."""
        if time.monotonic() < self._clock_due:
            return
        # the first measurement of a process is awaited by every thread; a refresh by one only
        if not self._clock_lock.acquire(blocking=not clock.measured()):
            return
        try:
            if time.monotonic() < self._clock_due:
                return
            try:
                self.measure_clock()
                self._clock_due = time.monotonic() + self.clock_refresh_seconds
            except Exception:  # the server is away (SQLAlchemyError) or answered oddly: keep the offset
                self._clock_due = time.monotonic() + min(CLOCK_RETRY_SECONDS, self.clock_refresh_seconds)
        finally:
            self._clock_lock.release()

    def _after_fork(self) -> None:
        if os.getpid() != self._pid:
            # a forked child: never touch the parent's pooled connections, open our own
            self._engine.dispose(close=False)
            self._setup()

    @property
    def engine(self) -> Engine:
        """The engine of this process (rebuilt after a fork; see the module docstring)."""
        self._after_fork()
        return self._engine

    def session(self) -> Session:
        """A new session (caller commits/closes). Prefer :meth:`transact`."""
        self._after_fork()
        self.follow_clock()
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
        self._after_fork()
        self.follow_clock()
        if self._write_lock is None:
            return self._run(fn, self._sessions, attempts=attempts)
        with self._write_lock:
            return self._run(fn, self._sessions, attempts=attempts)

    def statements(self, fn: Callable[[Connection], T], *, attempts: int = 8) -> T:
        """Run ``fn(connection)``, a unit whose every statement is atomic and correct on its own,
        with the fewest round trips; retried on a transient error like :meth:`transact`.

        For units that need no transaction around their statements: each write is a single
        statement that decides by itself whether it applies (a compare-and-set on
        :func:`packhorse.operations.lifecycle.fenced`, an ``INSERT … ON CONFLICT DO NOTHING``), and a
        read before it only supplies the value it compares with. On PostgreSQL the statements
        run in autocommit: each is one round trip and is committed, as durably as any commit
        (``synchronous_commit`` is the server's), before its result comes back — where a
        transaction adds ``BEGIN`` and ``COMMIT``, two more round trips. On SQLite the unit is
        a write unit of :meth:`transact` (the write lock is taken either way).

        ``fn`` must be safe to run again from the start. As with a ``COMMIT`` whose answer is
        lost, a statement that took effect just before the connection died is run again and
        then finds the row moved on (a claim is refused; the lease it took expires unused).

        Returns:
            whatever ``fn`` returns.

        Raises:
            TransientDatabaseError: the database stayed unavailable for every attempt.
            Any other exception ``fn`` raises.
        """
        self._after_fork()
        self.follow_clock()
        engine = self._autocommit
        if engine is None:
            return self.transact(lambda s: fn(s.connection()), attempts=attempts)

        def once() -> T:
            with engine.connect() as conn:
                return fn(conn)

        return _retrying(once, attempts)

    def read(self, fn: Callable[[Session], T], *, attempts: int = 8) -> T:
        """Run a read-only ``fn(session)``; retried like :meth:`transact`. ``fn`` must not write.

        On SQLite ``fn`` runs in one deferred transaction (``BEGIN``: readers never wait for
        the write lock), one snapshot. On PostgreSQL its statements run in autocommit, each
        seeing what was committed when it started: what they saw inside a ``READ COMMITTED``
        transaction too (PostgreSQL's default, and this database's), without the two round
        trips of ``BEGIN`` and ``COMMIT``. Across a 100 ms link a read of one statement then
        costs 0.1 s instead of 0.3 s. A unit that must see one state across statements, or
        lock what it read, is a :meth:`transact`.
        """
        self._after_fork()
        self.follow_clock()
        return self._run(fn, self._read_sessions, attempts=attempts)

    def _run(self, fn: Callable[[Session], T], factory: sessionmaker[Session], *, attempts: int) -> T:
        def once() -> T:
            session = factory()
            try:
                result = fn(session)
                # a read-only unit commits too: nothing to write, and a rollback would expire
                # the objects it returns
                session.commit()
                return result
            except BaseException:
                _discard(session)
                raise
            finally:
                session.close()

        return _retrying(once, attempts)

    def dispose(self) -> None:
        """Close every pooled connection of this process (at exit)."""
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
        """The Alembic revision the database is at, or ``None`` if it has no schema.

        Read from Alembic's ``alembic_version`` table with one query (no Alembic import: every
        command checks this at start)."""
        with self.engine.connect() as conn:
            if not inspect(conn).has_table("alembic_version"):
                return None
            return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()

    def head_revision(self) -> str:
        """The latest migration shipped with this version of packhorse (:data:`HEAD_REVISION`,
        which a unit test keeps equal to the head of the migration scripts)."""
        return HEAD_REVISION

    def ensure_migrated(self) -> None:
        """Raise :class:`DatabaseNotInitializedError` unless the schema is at the head revision."""
        current = self.current_revision()
        if current != self.head_revision():
            where = "has no packhorse schema" if current is None else f"is at migration {current}"
            raise DatabaseNotInitializedError(
                f"the database {self.engine.url.render_as_string(hide_password=True)} {where}; "
                "run `packhorse init` to create or upgrade it"
            )
