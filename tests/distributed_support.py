"""Support for tests of the distributed mode against real services (importable as ``distributed_support``).

Services: PostgreSQL 127.0.0.1:5432 (user ``postgres``, trust), Redis 127.0.0.1:6379 (this
suite owns databases 4–9), RabbitMQ 127.0.0.1:5672 (guest/guest; a private vhost per test).
A service that cannot be reached skips the test with the reason — or fails it when
``CI=true`` (:func:`unavailable`).

Private instances for tests that harm their service: :class:`PrivateRedis` (a ``redis-server``
on a free port, so ``FLUSHALL`` harms nobody) and :class:`PrivatePostgres` (``initdb`` /
``pg_ctl`` as the ``postgres`` user in a temp folder on a free port, so it can be restarted).

:class:`Cluster` runs a distributed packhorse installation of the three-site test
configuration (``support.write_site_config``) as real processes: one ``packhorse worker`` per
site, ``packhorse manager`` and (when it exists) ``packhorse monitor``.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from free_ports import free_port
from support import SRC

PG_HOST, PG_PORT = "127.0.0.1", 5432
REDIS_PORT = 6379
RABBIT_PORT = 5672


def unavailable(reason: str) -> None:
    """Skip (locally) or fail (``CI=true``) a test whose service is unreachable."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and a required service is unavailable: {reason}")
    pytest.skip(reason)


def wait_for(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll ``cond()`` until it returns a truthy value; fail naming ``what`` after ``timeout`` s."""
    end = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < end:
        try:
            last = cond()
        except Exception as e:  # the service may be down on purpose
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


# ------------------------------------------------------------------------------ PostgreSQL


def _pg_admin(port: int = PG_PORT):  # type: ignore[no-untyped-def]
    import psycopg

    return psycopg.connect(host=PG_HOST, port=port, user="postgres", dbname="postgres" if port != PG_PORT else "test",
                           connect_timeout=3, autocommit=True)


def postgres_database(port: int = PG_PORT) -> tuple[str, Callable[[], None]]:
    """Create a uniquely named database; returns ``(SQLAlchemy URL, drop)``."""
    try:
        conn = _pg_admin(port)
    except Exception as e:
        unavailable(f"PostgreSQL {PG_HOST}:{port} unreachable: {e}")
        raise
    name = f"ph4_{uuid.uuid4().hex[:12]}"
    with conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        try:
            with _pg_admin(port) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except Exception:
            pass

    return f"postgresql+psycopg://postgres@{PG_HOST}:{port}/{name}", drop


class PrivatePostgres:
    """A PostgreSQL cluster of our own (may be stopped and restarted by a test)."""

    def __init__(self) -> None:
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not bins:
            unavailable("no initdb in /usr/lib/postgresql/*/bin")
        self.bin = Path(bins[-1]).parent
        self.dir = Path(tempfile.mkdtemp(prefix="ph4-pg-"))
        os.chmod(self.dir, 0o777)
        self.data = self.dir / "data"
        self.port = free_port()
        self._as_postgres([str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                           "-E", "UTF8", "--no-sync"])
        self.start()

    def _as_postgres(self, cmd: list[str]) -> None:
        full = cmd if os.geteuid() != 0 else ["runuser", "-u", "postgres", "--", *cmd]
        r = subprocess.run(full, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed: {r.stdout}\n{r.stderr}")

    def start(self) -> None:
        self._as_postgres([str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "-t", "60",
                           "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off", "start"])

    def stop(self, mode: str = "fast") -> None:
        self._as_postgres([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop"])

    def new_database(self, name: str = "ops") -> str:
        """Create database ``name`` in this cluster; returns its SQLAlchemy URL."""
        import psycopg

        with psycopg.connect(host=PG_HOST, port=self.port, user="postgres", dbname="postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg://postgres@{PG_HOST}:{self.port}/{name}"

    def close(self) -> None:
        try:
            self.stop("immediate")
        except AssertionError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


# ------------------------------------------------------------------------------ brokers


#: The Redis databases of 127.0.0.1:6379 this suite owns.
OWN_REDIS_DBS = range(4, 10)
#: (database number, open lock file) this test process holds, taken at its first ``redis_url``
_held_redis_db: tuple[int, Any] | None = None


def _own_redis_db() -> int:
    """The Redis database this test process owns for its whole life: the first of
    :data:`OWN_REDIS_DBS` whose lock file (``$TMPDIR/packhorse-tests-redis-<db>.lock``) it can
    lock exclusively, so parallel pytest workers (``-n``) never share a broker database."""
    global _held_redis_db
    if _held_redis_db is None:
        import fcntl

        for db in OWN_REDIS_DBS:
            f = open(Path(tempfile.gettempdir()) / f"packhorse-tests-redis-{db}.lock", "a+")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            _held_redis_db = (db, f)
            break
        else:
            raise AssertionError(f"every Redis database this suite owns ({OWN_REDIS_DBS.start}-"
                                 f"{OWN_REDIS_DBS.stop - 1}) is held by another test process: run fewer in parallel")
    return _held_redis_db[0]


def redis_url() -> str:
    """``redis://127.0.0.1:6379/<db>`` of this test process's own database (one of 4–9,
    :func:`_own_redis_db`), emptied first."""
    import redis

    db = _own_redis_db()
    try:
        redis.Redis(port=REDIS_PORT, db=db, socket_connect_timeout=3).flushdb()
    except Exception as e:
        unavailable(f"Redis 127.0.0.1:{REDIS_PORT} unreachable: {e}")
    return f"redis://127.0.0.1:{REDIS_PORT}/{db}"


class PrivateRedis:
    """A ``redis-server`` of our own on a free port (FLUSHALL-safe)."""

    def __init__(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            unavailable("redis-server is not installed")
        self.exe = exe
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="ph4-redis-"))
        import redis

        self.client = redis.Redis(port=self.port)
        self.start()

    def start(self) -> None:
        """Start the server (nothing persisted: ``--save "" --appendonly no``; it starts empty)."""
        self.proc = subprocess.Popen([self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(self.dir)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self.client.ping, 20, "private redis-server")

    def stop(self) -> None:
        """Stop the server (SIGTERM; every client connection drops, every message is lost)."""
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivateRabbitMQ:
    """A RabbitMQ node of our own (its own node name, AMQP and distribution ports, database and
    log folders under a temp folder; the shared node on 5672 is never touched), so a test may
    stop and start it. Durable queues and persistent messages survive its restart, as in
    production. Booting takes some 10-30 s on this machine.

    Skips (locally) or fails (``CI=true``) when ``rabbitmq-server`` / ``rabbitmqctl`` are missing
    or the node does not boot.
    """

    def __init__(self) -> None:
        for exe in ("rabbitmq-server", "rabbitmqctl"):
            if shutil.which(exe) is None:
                unavailable(f"{exe} is not installed (needed for a private RabbitMQ node)")
        self.dir = Path(tempfile.mkdtemp(prefix="ph4-rabbit-"))
        self.port, dist = free_port(), free_port()
        self.node = f"ph4b-{uuid.uuid4().hex[:8]}@localhost"
        for sub in ("mnesia", "log"):
            (self.dir / sub).mkdir()
        (self.dir / "rabbitmq.conf").write_text(f"listeners.tcp.local = 127.0.0.1:{self.port}\n")
        (self.dir / "enabled_plugins").write_text("[].\n")  # no management listener on a shared port
        if os.geteuid() == 0:  # the server scripts run as the rabbitmq user
            import pwd

            pw = pwd.getpwnam("rabbitmq")
            for p in [self.dir, *self.dir.rglob("*")]:
                os.chown(p, pw.pw_uid, pw.pw_gid)
        self.env = {**os.environ, "RABBITMQ_NODENAME": self.node, "RABBITMQ_NODE_PORT": str(self.port),
                    "RABBITMQ_DIST_PORT": str(dist), "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
                    "RABBITMQ_LOG_BASE": str(self.dir / "log"),
                    "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.conf"),
                    "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
                    "RABBITMQ_PID_FILE": str(self.dir / "pid")}
        try:
            self.start()
        except AssertionError as e:
            self.close()
            unavailable(f"a private RabbitMQ node did not start: {e}")

    def _ctl(self, *args: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["rabbitmqctl", "-q", "-n", self.node, *args], capture_output=True, text=True,
                              env=self.env, timeout=timeout)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def start(self) -> None:
        """Boot the node and wait until it accepts AMQP connections."""
        r = subprocess.run(["rabbitmq-server", "-detached"], capture_output=True, text=True, env=self.env,
                           timeout=60)
        if r.returncode != 0:
            raise AssertionError(f"rabbitmq-server -detached: {r.stdout}{r.stderr}")
        # the detached node takes a while to register with epmd; await_startup fails at once
        # on a node that is not registered yet, so ask again until it answers
        end = time.monotonic() + 150
        while True:
            r = self._ctl("await_startup", "--timeout", "120")
            if r.returncode == 0:
                break
            if time.monotonic() > end:
                log = "\n".join(p.read_text(errors="replace")[-2000:] for p in (self.dir / "log").glob("*.log"))
                raise AssertionError(f"await_startup: {r.stdout}{r.stderr[-1500:]}\n{log}")
            time.sleep(1)

        def port_open() -> bool:
            socket.create_connection(("127.0.0.1", self.port), timeout=3).close()
            return True

        wait_for(port_open, 30, "the private RabbitMQ AMQP port")

    def stop(self) -> None:
        """Shut the node down (every client connection drops) and wait for its process to end."""
        self._ctl("shutdown")

    def close(self) -> None:
        try:
            self.stop()
        except subprocess.TimeoutExpired:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


def rabbitmq_vhost() -> tuple[str, Callable[[], None]]:
    """A private RabbitMQ vhost for guest; returns ``(amqp URL, delete)``."""
    def port_open() -> bool:
        socket.create_connection(("127.0.0.1", RABBIT_PORT), timeout=3).close()
        return True

    try:  # a broker started just before the tests (.ci/run) may still be booting
        wait_for(port_open, 60 if os.environ.get("CI", "").lower() == "true" else 3, "RabbitMQ's port")
    except AssertionError as e:
        unavailable(f"RabbitMQ 127.0.0.1:{RABBIT_PORT} unreachable: {e}")
    if shutil.which("rabbitmqctl") is None:
        unavailable("rabbitmqctl is not installed (needed to create a private vhost)")
    vhost = f"ph4-{uuid.uuid4().hex[:10]}"
    for cmd in (["add_vhost", vhost], ["set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"]):
        r = subprocess.run(["rabbitmqctl", "-q", *cmd], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            unavailable(f"rabbitmqctl {' '.join(cmd)} failed: {r.stderr.strip()}")

    def delete() -> None:
        subprocess.run(["rabbitmqctl", "-q", "delete_vhost", vhost], capture_output=True, timeout=120)

    return f"amqp://guest:guest@127.0.0.1:{RABBIT_PORT}/{vhost}", delete


# ------------------------------------------------------------------------------ a cluster


def write_source(root: Path, groups: int, files_per_group: int, size: int) -> None:
    """``groups`` observation units ``inst/obsNN`` of incompressible files of about ``size`` bytes."""
    for g in range(groups):
        for i in range(files_per_group):
            p = root / f"inst/obs{g:02d}/frame_{i:02d}.fits"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(os.urandom(size + 1000 * g + i))


def has_monitor() -> bool:
    """True if ``packhorse monitor`` (the stalled-task monitor and reconciler) exists."""
    try:
        import packhorse.recovery.monitor  # noqa: F401
        import packhorse.recovery.reconciler  # noqa: F401
    except ImportError:
        return False
    from packhorse.cli.distributed import commands

    return any(c.name == "monitor" or (c.callback and c.callback.__name__ == "monitor") for c in commands.registered_commands)


SITES = ("fyst", "cologne", "cornell")


class Cluster:
    """A distributed packhorse of the three-site test configuration, as real processes.

    Args:
        config: the ``packhorse.toml`` (``support.write_site_config``).
        database_url, broker_url: the services.
        visibility_timeout: broker visibility timeout (s).
        env: more environment for every process (e.g. fault hooks).
    """

    def __init__(self, config: Path, database_url: str, broker_url: str, *, visibility_timeout: float = 30,
                 env: dict[str, str] | None = None) -> None:
        self.config = config
        self.root = config.parent
        self.env = {
            **os.environ, "PYTHONPATH": str(SRC),
            "PACKHORSE_DATABASE__URL": database_url,
            "PACKHORSE_DATABASE__POOL_SIZE": "2",
            "PACKHORSE_DATABASE__MAX_OVERFLOW": "3",
            "PACKHORSE_EXECUTOR__KIND": "celery",
            "PACKHORSE_EXECUTOR__BROKER_URL": broker_url,
            "PACKHORSE_EXECUTOR__VISIBILITY_TIMEOUT_SECONDS": str(visibility_timeout),
            "PACKHORSE_LOG_LEVEL": "INFO",
            **(env or {}),
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.database_url = database_url

    def cli(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "packhorse", *args, "-c", str(self.config)], capture_output=True,
                              text=True, env={**self.env, **(env or {})}, cwd=self.root, timeout=timeout)

    def init(self) -> None:
        r = self.cli("init")
        assert r.returncode == 0, r.stderr

    def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start ``packhorse ARGS -c config`` as process ``name`` (own process group; log in ``<name>.log``)."""
        log = open(self.root / f"{name}.log", "ab")
        p = subprocess.Popen([sys.executable, "-m", "packhorse", *args, "-c", str(self.config)], stdout=log,
                             stderr=subprocess.STDOUT, env={**self.env, **(env or {})}, cwd=self.root,
                             start_new_session=True)
        log.close()
        self.procs[name] = p
        return p

    def start_worker(self, site: str, *, concurrency: int = 1, env: dict[str, str] | None = None,
                     name: str | None = None) -> subprocess.Popen[bytes]:
        return self.start(name or f"worker-{site}", "worker", "--site", site, "--concurrency", str(concurrency),
                          env=env)

    def start_all(self, *, monitor: bool = False, worker_env: dict[str, dict[str, str]] | None = None,
                  managers: int = 1, monitors: int | None = None) -> None:
        """A worker per site, ``managers`` managers (``manager``, ``manager-2``, …) and
        ``monitors`` monitors (default: one if ``monitor``, else none)."""
        for site in SITES:
            self.start_worker(site, env=(worker_env or {}).get(site))
        # several of one kind on this host: each its own instance name (its health identity)
        for i in range(managers):
            self.start("manager" if i == 0 else f"manager-{i + 1}", "manager",
                       *(("--instance", str(i + 1)) if i else ()))
        for i in range(monitors if monitors is not None else int(monitor)):
            self.start("monitor" if i == 0 else f"monitor-{i + 1}", "monitor",
                       *(("--instance", str(i + 1)) if i else ()))

    def log(self, name: str) -> str:
        p = self.root / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def stop(self, name: str, *, timeout: float = 30) -> None:
        p = self.procs.pop(name, None)
        if p is None:
            return
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(p.pid, signal.SIGKILL)  # pool children left behind, if any
        except ProcessLookupError:
            pass
        p.wait(10)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)

    def status(self) -> dict[str, Any]:
        """What ``packhorse status --json`` prints for the cluster: its report
        (:func:`~packhorse.status.reporting.status_report` of the configuration under the
        cluster's environment, as JSON), made in this process. The waits poll it every second or
        more often, and a ``packhorse`` process per poll (0.7 s of CPU each) took most of a core
        from the cluster under test; the command itself is tested in tests/e2e."""
        from packhorse.config import settings_from_dict
        from packhorse.db.session import Database
        from packhorse.runtime.context import ProcessContext
        from packhorse.runtime.hooks import NO_HOOKS
        from packhorse.runtime.topology import load_topology
        from packhorse.status.reporting import status_report

        settings = settings_from_dict(tomllib.loads(self.config.read_text(encoding="utf-8")),
                                      base_dir=self.config.resolve().parent, source=str(self.config), environ=self.env)
        db = Database.from_settings(settings)
        try:
            ctx = ProcessContext(settings=settings, db=db, topology=load_topology(db, settings), hooks=NO_HOOKS)
            return json.loads(json.dumps(status_report(ctx), default=str))
        finally:
            db.dispose()

    def wait_finished(self, timeout: float, *, packages: int | None = None,
                      watch: ArchiveWatch | None = None) -> dict[str, Any]:
        """Wait until every package is archived, every operation COMPLETED and buffers freed
        (``watch``: looked at on every poll, so an archive object overwritten meanwhile is seen)."""

        def done() -> dict[str, Any] | None:
            if watch is not None:
                watch.look()
            st = self.status()
            pk = st["packages"]
            if not pk["total"] or pk["archived"] != pk["total"] or (packages is not None and pk["total"] != packages):
                return None
            if any(set(c) - {"COMPLETED"} for c in st["operations"].values()):
                return None
            if any(st["copies"][b]["count"] for b in ("fyst-buffer", "cologne-buffer", "cornell-buffer")):
                return None
            return st

        try:
            return wait_for(done, timeout, "the distributed run to finish", interval=1.0)
        except AssertionError:
            logs = "\n".join(f"--- {n}.log (tail)\n{self.log(n)[-3000:]}" for n in
                             ["manager", "manager-2", "monitor", "monitor-2", *(f"worker-{s}" for s in SITES)])
            raise AssertionError(f"run did not finish; status: {json.dumps(self.status()['operations'])}\n{logs}") from None


def work_created(database_url: str) -> dict[str, int]:
    """What the managers created, counted in the database: raw packages, bundles, packages the
    bundles say they carry and packages really in one, and operations per kind (``op:<kind>``)
    and the buffer copies that ever existed (``buffer_copies``)."""
    from sqlalchemy import create_engine, func, select
    from sqlalchemy.orm import Session

    from packhorse.db.models import DataLocation, DataTransferPackage, Operation, PhysicalCopy, RawDataPackage

    engine = create_engine(database_url)
    try:
        with Session(engine) as s:
            out = {
                "packages": s.scalar(select(func.count()).select_from(RawDataPackage)) or 0,
                "bundles": s.scalar(select(func.count()).select_from(DataTransferPackage)) or 0,
                "bundled_as_counted": s.scalar(select(func.coalesce(func.sum(DataTransferPackage.package_count), 0))) or 0,
                "bundled": s.scalar(select(func.count()).select_from(RawDataPackage).where(
                    RawDataPackage.data_transfer_package_id.is_not(None))) or 0,
                "buffer_copies": s.scalar(select(func.count()).select_from(PhysicalCopy).join(
                    DataLocation, DataLocation.id == PhysicalCopy.location_id).where(DataLocation.role == "buffer")) or 0,
            }
            for kind, n in s.execute(select(Operation.kind, func.count()).group_by(Operation.kind)):
                out[f"op:{kind}"] = n
            return out
    finally:
        engine.dispose()


# ------------------------------------------------------------------------------ the fault table

#: the sites whose long-term archives the three-site configuration fills
DESTINATIONS = ("cologne", "cornell")
#: when set, :func:`report_heal` appends one JSON line per measured fault to this file
#: (``benchmarks/fault_table.py`` sets it and prints the table of docs/reliability.md)
FAULT_TABLE_ENV = "PACKHORSE_FAULT_TABLE"
CLEAN = {"lost": 0, "duplicated": 0, "corrupt": 0, "overwritten": 0}


def source_digests(root: Path) -> dict[str, str]:
    """``{path relative to the source folder: sha256}`` of every file under ``root``."""
    import hashlib

    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink() and "_packhorse" not in p.relative_to(root).parts:
            with open(p, "rb") as f:
                out[p.relative_to(root).as_posix()] = hashlib.file_digest(f, "sha256").hexdigest()
    return out


class ArchiveWatch:
    """The destinations' long-term archives looked at from outside packhorse, on their bytes.

    :meth:`look` (called while a test waits) remembers each archive object as first seen
    (inode, mtime, size); an object that later changes or vanishes counts as *overwritten*.
    :meth:`tally` reads every package tar with :mod:`tarfile`: a source file in no package of
    an archive is *lost*, in more than one *duplicated*, with other bytes *corrupt*.
    """

    def __init__(self, root: Path, sites: tuple[str, ...] = DESTINATIONS) -> None:
        self.root = root  # the installation folder (the one holding packhorse.toml)
        self.sites = sites
        self.first: dict[tuple[str, str], tuple[int, int, int]] = {}
        self.overwritten: set[tuple[str, str]] = set()

    def _objects(self, site: str) -> dict[str, tuple[int, int, int]]:
        base = self.root / "sites" / site / "archive"
        out = {}
        for p in base.rglob("*.tar") if base.exists() else ():
            rel = p.relative_to(base)
            if "_packhorse" in rel.parts:
                continue
            try:
                s = p.stat()
            except FileNotFoundError:
                continue
            out[rel.as_posix()] = (s.st_ino, s.st_mtime_ns, s.st_size)
        return out

    def look(self) -> None:
        for site in self.sites:
            now = self._objects(site)
            for (s, key), first in self.first.items():
                if s == site and now.get(key) != first:
                    self.overwritten.add((s, key))
            for key, v in now.items():
                self.first.setdefault((site, key), v)

    def tally(self, expected: dict[str, str]) -> dict[str, int]:
        """Lost, duplicated, corrupt and overwritten over every destination archive."""
        import hashlib
        import tarfile

        self.look()
        counts = dict(CLEAN, overwritten=len(self.overwritten))
        for site in self.sites:
            found: dict[str, list[str]] = {}
            base = self.root / "sites" / site / "archive"
            for key in self._objects(site):
                with tarfile.open(base / key) as tar:
                    for m in tar.getmembers():
                        parts = m.name.split("/", 2)  # <bag folder>/data/<source path>
                        if m.isfile() and len(parts) == 3 and parts[1] == "data":
                            f = tar.extractfile(m)
                            assert f is not None
                            found.setdefault(parts[2], []).append(hashlib.sha256(f.read()).hexdigest())
            for path, digest in expected.items():
                copies = found.get(path, [])
                counts["lost"] += not copies
                counts["duplicated"] += max(0, len(copies) - 1)
                counts["corrupt"] += sum(d != digest for d in copies)
        return counts


def report_heal(kind: str, broker: str, seconds: float, counts: dict[str, int], *, since: str) -> None:
    """One measured fault: print ``HEAL kind=… broker=… seconds=… lost=… …`` and, when
    ``PACKHORSE_FAULT_TABLE`` names a file, append it there as a JSON line. ``since`` says in
    a few words what the seconds are counted from: the fault's end where it ends (the
    database back), its injection where it does not (a process killed, messages lost), the
    run's start where it lasts the whole run."""
    rec = {"kind": kind, "broker": broker, "seconds": round(seconds, 2), **{k: counts.get(k, 0) for k in CLEAN},
           "since": since}
    print("HEAL " + " ".join(f"{k}={json.dumps(v) if isinstance(v, str) else v}" for k, v in rec.items()), flush=True)
    path = os.environ.get(FAULT_TABLE_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")
