"""Builds of small raw data packages run together in one task
(:func:`packhorse.engine.worker.execute_task`, :mod:`packhorse.operations.batching`): one claim
and one completion transaction, yet each package is its own tar with its own recorded size,
sha256 and buffer copy (I2, I4), a file changed before its build is taken out of its package
alone, and a build never shares a task with another kind. Real files, a real SQLite ops
database."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import threading
import time
import types
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select

from packhorse.config import load_config
from packhorse.db.models import Operation, PhysicalCopy, RawDataFile, RawDataPackage
from packhorse.db.session import Database
from packhorse.domain import OperationKind
from packhorse.engine.worker import Outcome, execute_task
from packhorse.managers import packages
from packhorse.managers.scan import scan_all
from packhorse.operations.batching import group_tasks, small_operations
from packhorse.rules.availability import mark_locations
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.hooks import Hooks
from packhorse.runtime.topology import sync_topology
from packhorse.storage.usage import Usage
from support import write_site_config

BUILD = OperationKind.RAW_DATA_PACKAGE


class Source:
    """A three-site configuration whose source holds ``groups`` of settled files, scanned and
    packaged: one pending build a group."""

    def __init__(self, tmp_path: Path, groups: dict[str, dict[str, bytes]]) -> None:
        self.settings = load_config(write_site_config(tmp_path / "site"))
        self.db = Database(self.settings.database_url)
        self.db.upgrade()
        self.ctx = ProcessContext(settings=self.settings, db=self.db, topology=sync_topology(self.db, self.settings))
        mark_locations(self.ctx)
        self.root = self.settings.location_path("fyst-source")
        self.builds: dict[str, int] = {}
        self.add(groups)

    def add(self, groups: dict[str, dict[str, bytes]]) -> None:
        """Write ``groups`` (settled), scan and package them: their builds join :attr:`builds`."""
        old = time.time() - 600
        for group, files in groups.items():
            for name, data in files.items():
                p = self.root / group / name
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(data)
                os.utime(p, (old, old))
        with ThreadPoolExecutor(2) as pool:
            scan_all(self.ctx, pool)
        packages.manage(self.ctx, {})
        self.builds = self.db.read(lambda s: {g: i for g, i in s.execute(
            select(RawDataPackage.group_path, Operation.id).join(Operation, Operation.raw_data_package_id == RawDataPackage.id)
            .where(Operation.kind == BUILD.value))})
        assert set(groups) <= set(self.builds)

    def package_tar(self, group: str) -> dict[str, bytes]:
        """The payload files (path under ``data/`` → bytes) of ``group``'s package tar in the
        buffer, after checking the tar's bytes against the sha256 and size recorded for it and
        its buffer copy (read from the file, not from packhorse's records alone)."""
        def read(s):  # type: ignore[no-untyped-def]
            pkg = s.scalars(select(RawDataPackage).where(RawDataPackage.group_path == group)).one()
            copy = s.scalars(select(PhysicalCopy).where(PhysicalCopy.raw_data_package_id == pkg.id)).one()
            return pkg.sha256, pkg.size, copy.path, copy.sha256

        sha, size, key, copy_sha = self.db.read(read)
        data = (self.settings.location_path("fyst-buffer") / key).read_bytes()
        assert hashlib.sha256(data).hexdigest() == sha == copy_sha and len(data) == size
        out = {}
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for m in tar.getmembers():
                if m.isfile() and "/data/" in m.name:
                    f = tar.extractfile(m)
                    assert f is not None
                    out[m.name.split("/data/", 1)[1]] = f.read()
        return out


GROUPS = {f"cam/obs{i}": {f"f{j}.dat": bytes([i]) * (100 + 37 * j) for j in range(3)} for i in range(5)}


@pytest.fixture
def src(tmp_path: Path) -> Iterator[Source]:
    s = Source(tmp_path, GROUPS)
    yield s
    s.db.dispose()


def test_small_builds_run_together_each_its_own_package(src: Source) -> None:
    """Five builds in one task: each package's tar holds exactly its group's files, its bytes
    match the size and sha256 recorded for it and for its buffer copy; a file changed after its
    registration is taken out of its own package (registered again when it settles), and the
    other packages are built whole."""
    changed = src.root / "cam/obs2/f1.dat"
    changed.write_bytes(b"rewritten by the instrument")
    ops = [src.builds[g] for g in GROUPS]
    assert execute_task(src.ctx, [(i, None) for i in ops], "w1") == [Outcome.COMPLETED] * 5
    for group, files in GROUPS.items():
        expected = {name: data for name, data in files.items() if f"{group}/{name}" != "cam/obs2/f1.dat"}
        assert src.package_tar(group) == {f"{group}/{n}": d for n, d in expected.items()}
    in_obs2 = src.db.read(lambda s: set(s.scalars(select(RawDataFile.relative_path).join(
        RawDataPackage, RawDataPackage.id == RawDataFile.raw_data_package_id)
        .where(RawDataPackage.group_path == "cam/obs2"))))
    assert in_obs2 == {"cam/obs2/f0.dat", "cam/obs2/f2.dat"}


def test_builds_are_grouped_by_their_payload_and_never_with_another_kind(src: Source) -> None:
    """The ops database's own rows: builds of small packages are batchable by their payload
    bytes (their package size is not known yet); a package whose payload is over the batch's
    bytes is built alone; builds and archive copies of one queue never share a task."""
    big = src.builds["cam/obs4"]
    src.db.transact(lambda s: s.get(RawDataPackage, s.get(Operation, big).raw_data_package_id).__setattr__(
        "payload_bytes", 65 * 2**20))
    rows = src.db.read(lambda s: s.execute(select(Operation.id, Operation.kind, Operation.physical_copy_id)
                                           .where(Operation.kind == BUILD.value).order_by(Operation.id)).all())
    small = src.db.read(lambda s: small_operations(s, rows))
    assert set(small) == {i for g, i in src.builds.items() if g != "cam/obs4"}
    assert small[src.builds["cam/obs0"]] == sum(len(d) for d in GROUPS["cam/obs0"].values())
    archive = [types.SimpleNamespace(id=1000 + k, kind=OperationKind.LONG_TERM_ARCHIVE.value, physical_copy_id=None)
               for k in range(3)]
    tasks = group_tasks(list(rows) + archive, {**small, **{a.id: 10 for a in archive}}, key=lambda r: "q")
    kinds = {r.id: r.kind for r in list(rows) + archive}
    assert all(len({kinds[i] for i in t}) == 1 for t in tasks)
    assert sorted(len(t) for t in tasks) == [1, 3, 4] and [big] in tasks


def test_a_task_of_builds_costs_a_handful_of_statements_a_build(src: Source) -> None:
    """Across a long link every statement is a round trip (docs/benchmarks.md, "20,000 small
    files over a long thin link"): a task of builds is claimed in two statements, reads every
    package and its files in two and their room at the buffer in one, completes every
    operation's row in one, records every package's bytes in one and their copies in two, with
    no savepoint while every completion is accepted: about ten statements however many builds.
    The lease renewals run on their own threads and are not counted. (Before: eleven a build,
    then four.)"""
    statements: list[str] = []
    me = threading.get_ident()

    def seen(conn, cursor, statement, *a):  # type: ignore[no-untyped-def]
        if threading.get_ident() == me:
            statements.append(" ".join(statement.split())[:50])

    event.listen(src.db.engine, "before_cursor_execute", seen)
    ops = [src.builds[g] for g in GROUPS]
    assert execute_task(src.ctx, [(i, None) for i in ops], "w1") == [Outcome.COMPLETED] * 5
    event.remove(src.db.engine, "before_cursor_execute", seen)
    assert not any("SAVEPOINT" in q for q in statements), statements
    counted = [q for q in statements if not q.startswith("BEGIN")]  # SQLite's; PostgreSQL reads in autocommit
    assert len(counted) <= 10, counted


class _Buffer(Hooks):
    """fyst-buffer's file system, as the room checks see it: ``free`` bytes of 1 MB."""

    def __init__(self, free: int) -> None:
        self.free = free

    def disk_usage(self) -> Any:
        def usage(location: str, root: Path) -> Usage:
            if location != "fyst-buffer":
                return Usage(total=10**12, used=0, free=10**12)
            return Usage(total=10**6, used=10**6 - self.free, free=self.free)

        return usage


@pytest.mark.parametrize("free", [10**6, 2_000])
def test_the_builds_of_a_task_are_let_into_the_buffer_together_only_when_all_of_them_fit(
        tmp_path: Path, free: int) -> None:
    """The buffer's room for a task's builds is read once for all of them when they all fit
    with their bundles (one round trip, not one a build); when they do not, each build asks
    for its own as it would alone: 2,000 bytes free hold the first two packages of 411 bytes
    and their bundles (the second counting the first, being built), and the other three wait
    for space, nothing written for them."""
    src = Source(tmp_path, GROUPS)
    try:
        src.ctx = ProcessContext(settings=src.settings, db=src.db, topology=src.ctx.topology, hooks=_Buffer(free))
        reads: list[str] = []
        me = threading.get_ident()

        def seen(conn, cursor, statement, *a):  # type: ignore[no-untyped-def]
            if threading.get_ident() == me and "coalesce(sum(raw_data_packages.payload_bytes)" in statement:
                reads.append(statement)

        event.listen(src.db.engine, "before_cursor_execute", seen)
        ops = sorted(src.builds[g] for g in GROUPS)
        outcomes = execute_task(src.ctx, [(i, None) for i in ops], "w1")
        event.remove(src.db.engine, "before_cursor_execute", seen)
        built = src.db.read(lambda s: set(s.scalars(select(RawDataPackage.group_path).where(
            RawDataPackage.sha256.is_not(None)))))
        if free == 10**6:
            assert outcomes == [Outcome.COMPLETED] * 5 and len(reads) == 1, reads
            assert built == set(GROUPS)
        else:
            assert outcomes == [Outcome.COMPLETED] * 2 + [Outcome.DEFERRED] * 3
            assert len(reads) == 1 + 5  # the task's, then each build's own
            first = src.db.read(lambda s: set(s.scalars(select(RawDataPackage.group_path).join(
                Operation, Operation.raw_data_package_id == RawDataPackage.id).where(Operation.id.in_(ops[:2])))))
            assert built == first
            assert not any((src.settings.location_path("fyst-buffer") / "raw").glob("*obs[2-4]*"))
    finally:
        src.db.dispose()


def test_the_distributed_executor_spreads_builds_over_idle_worker_processes_and_batches_behind_busy_ones(
        src: Source) -> None:
    """The Celery dispatcher spreads a queue's small builds over ``executor.workers`` messages
    (2 here) while none is in flight; once the site's worker processes are held by builds queued
    or running, new builds go in one message instead of one each. Each message then runs as a
    worker runs it: every package is built whole, each at attempt 1."""
    from packhorse.executors import celery_app

    sent: list[tuple[str, list[Any], str]] = []
    app = types.SimpleNamespace(send_task=lambda name, args, queue, **kw: sent.append((name, args, queue)))
    first = celery_app.dispatch_pending(src.ctx, app)  # type: ignore[arg-type]
    assert len(first) == 5 and [len(args[0]) for _, args, _ in sent] == [3, 2]
    more = {f"cam/late{i}": {"x.dat": bytes([50 + i]) * 300} for i in range(5)}
    src.add(more)
    second = celery_app.dispatch_pending(src.ctx, app)  # type: ignore[arg-type]
    assert len(second) == 5 and [len(args[0]) for _, args, _ in sent[2:]] == [5]
    assert {q for _, _, q in sent} == {"fyst_fyst-buffer_raw_data_package"}
    celery_app._SETTINGS[id(app)] = src.settings
    task = types.SimpleNamespace(app=app, request=types.SimpleNamespace(id="message-1", retries=0))
    try:
        outcomes = [celery_app.run_operations_task(task, args[0]) for _, args, _ in sent]
    finally:
        del celery_app._SETTINGS[id(app)]
        for key in [k for k in celery_app._CONTEXTS if k[1] == id(src.settings)]:
            celery_app._CONTEXTS.pop(key).db.dispose()
    assert outcomes == [["completed"] * 3, ["completed"] * 2, ["completed"] * 5]
    for group, files in {**GROUPS, **more}.items():
        assert src.package_tar(group) == {f"{group}/{n}": d for n, d in files.items()}
    attempts = src.db.read(lambda s: set(s.scalars(select(Operation.attempt).where(Operation.kind == BUILD.value))))
    assert attempts == {1}
