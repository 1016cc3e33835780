"""Long-term-archive operations of small packages run together in one task
(:func:`packhorse.engine.worker.execute_task`): one claim and one completion transaction for the task,
yet every operation keeps its own bytes, fencing token and outcome (I2, I3, I4); the embedded
runner puts archive operations (and builds of small packages, the same rule) together only
when more of them are runnable than it has free task slots, and never a package larger than
``SMALL_BATCH_BYTES``."""

from __future__ import annotations

import hashlib
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from packhorse.config import load_config, settings_from_dict
from packhorse.db.models import DataLocation, Operation, PhysicalCopy, RawDataPackage, Site, utcnow
from packhorse.db.session import Database
from packhorse.domain import OperationKind, Status
from packhorse.engine.worker import Outcome, execute_operation, execute_task
from packhorse.executors.local import LocalRunner
from packhorse.operations.batching import SMALL_BATCH, SMALL_BATCH_BYTES, group_tasks
from packhorse.operations.lifecycle import create_operation, dedup_key
from packhorse.rules.availability import mark_locations
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.hooks import NO_HOOKS
from packhorse.runtime.topology import raw_package_key, sync_topology
from support import write_site_config

LTA = OperationKind.LONG_TERM_ARCHIVE


class Buffer:
    """A three-site configuration whose cologne buffer holds raw packages waiting for the archive."""

    def __init__(self, tmp_path: Path) -> None:
        self.settings = load_config(write_site_config(tmp_path / "site"))
        self.db = Database(self.settings.database_url)
        self.db.upgrade()
        self.ctx = ProcessContext(settings=self.settings, db=self.db, topology=sync_topology(self.db, self.settings))
        mark_locations(self.ctx)  # as `packhorse init` does: every location root exists and is marked
        self.ids = self.ctx.topology.location_ids

    def waiting(self, name: str, data: bytes) -> int:
        """A raw package at cologne-buffer (its bytes and a verified copy row) and its archive
        operation to cologne-lta; returns the operation id."""
        key = raw_package_key(name)
        path = self.settings.location_path("cologne-buffer") / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        sha = hashlib.sha256(data).hexdigest()

        def tx(s: Session) -> int:
            now = utcnow()
            pkg = RawDataPackage(name=name, group_path=name, source_location_id=self.ids["fyst-source"],
                                 created_at=now, bagging_date="2026-01-01", file_count=1,
                                 payload_bytes=len(data), size=len(data), sha256=sha)
            s.add(pkg)
            s.flush()
            s.add(PhysicalCopy(raw_data_package_id=pkg.id, location_id=self.ids["cologne-buffer"], path=key,
                               size=len(data), sha256=sha, status="present", created_at=now, verified_at=now))
            op = create_operation(s, kind=LTA, dedup_key=dedup_key(LTA, f"{name}:cologne-lta"),
                                  site_id=self.ctx.topology.site_ids["cologne"], max_retries=3,
                                  raw_data_package_id=pkg.id, source_location_id=self.ids["cologne-buffer"],
                                  destination_location_id=self.ids["cologne-lta"])
            assert op is not None
            return op.id

        return self.db.transact(tx)

    def archived(self, name: str) -> bytes | None:
        path = self.settings.location_path("cologne-lta") / raw_package_key(name)
        return path.read_bytes() if path.exists() else None

    def copy_rows(self) -> set[str]:
        return set(self.db.read(lambda s: list(s.scalars(select(PhysicalCopy.path).where(
            PhysicalCopy.location_id == self.ids["cologne-lta"])))))

    def statuses(self, ops: list[int]) -> list[str]:
        rows = self.db.read(lambda s: dict(s.execute(select(Operation.id, Operation.status)
                                                      .where(Operation.id.in_(ops))).all()))
        return [rows[i] for i in ops]


@pytest.fixture
def buf(tmp_path: Path) -> Iterator[Buffer]:
    b = Buffer(tmp_path)
    yield b
    b.db.dispose()


def _task(ops: list[int]) -> list[tuple[int, int | None]]:
    return [(i, None) for i in ops]


def test_archives_run_together_each_with_its_own_outcome(buf: Buffer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Good packages are archived, verified and recorded; a key holding other bytes fails alone
    (DestinationConflictError, never overwritten); an attempt taken over meanwhile records
    nothing (its bytes are there, its completion is refused); one already done is skipped."""
    ops = {name: buf.waiting(name, name.encode() * 1000) for name in ("a", "clash", "b", "stale", "done")}
    clash = buf.settings.location_path("cologne-lta") / raw_package_key("clash")
    clash.parent.mkdir(parents=True, exist_ok=True)
    clash.write_bytes(b"someone else's bytes")
    assert execute_operation(buf.ctx, ops["done"], "w0") is Outcome.COMPLETED

    import packhorse.stages as stages

    real = stages.STAGES[LTA]

    def takeover(work: Any) -> Any:
        recorder = real(work)
        if work.op.id == ops["stale"]:  # another attempt claims it after the bytes went
            buf.db.transact(lambda s: s.execute(update(Operation).where(Operation.id == ops["stale"])
                                                .values(attempt=Operation.attempt + 1)))
        return recorder

    monkeypatch.setitem(stages.STAGES, LTA, takeover)
    order = [ops[n] for n in ("a", "clash", "b", "stale", "done")]
    assert execute_task(buf.ctx, _task(order), "w1") == [Outcome.COMPLETED, Outcome.FAILED, Outcome.COMPLETED,
                                                         Outcome.STALE, Outcome.SKIPPED]
    assert buf.archived("a") == b"a" * 1000 and buf.archived("b") == b"b" * 1000
    assert clash.read_bytes() == b"someone else's bytes"  # I2: never overwritten
    assert buf.copy_rows() == {raw_package_key(n) for n in ("a", "b", "done")}  # nothing for clash or stale
    assert buf.statuses(order) == ["COMPLETED", "FAILED", "COMPLETED", "IN_PROGRESS", "COMPLETED"]
    ctx = buf.db.read(lambda s: s.get(Operation, ops["clash"]).error_context)
    assert ctx["error_type"] == "DestinationConflictError"
    archived = buf.db.read(lambda s: dict(s.execute(select(RawDataPackage.name, RawDataPackage.archived_at)).all()))
    assert archived["a"] is None  # cornell-lta holds no copy yet: not archived everywhere


def test_a_refused_completion_in_a_task_fails_that_operation_alone(buf: Buffer,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # the recorder of one operation raises inside the shared completion transaction: its
    # savepoint rolls back, the other operations' completions and copy rows stay
    ops = [buf.waiting(n, n.encode() * 10) for n in ("p", "q")]
    import packhorse.stages as stages

    real = stages.STAGES[LTA]

    def refuse_q(work: Any) -> Any:
        recorder = real(work)
        if work.op.id != ops[1]:
            return recorder

        def record(s: Session) -> None:
            recorder(s)
            raise RuntimeError("copy record refused")

        return record

    monkeypatch.setitem(stages.STAGES, LTA, refuse_q)
    assert execute_task(buf.ctx, _task(ops), "w") == [Outcome.COMPLETED, Outcome.RETRY]
    assert buf.copy_rows() == {raw_package_key("p")}
    assert buf.statuses(ops) == ["COMPLETED", "PENDING"]


def test_a_worker_dying_mid_task_records_nothing_and_the_rerun_completes(buf: Buffer,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing of a task is recorded before its completion transaction: a worker that dies after
    the first package's bytes went leaves both operations leased and no copy row; once the
    leases are taken over, a rerun finds the first object already there (same bytes: no
    rewrite, I2/I3), writes the second, and records both."""
    ops = [buf.waiting(n, n.encode() * 100) for n in ("x", "y")]
    import packhorse.stages as stages

    real = stages.STAGES[LTA]

    class Died(BaseException):
        pass

    def die_on_y(work: Any) -> Any:
        if work.op.id == ops[1]:
            raise Died()
        return real(work)

    monkeypatch.setitem(stages.STAGES, LTA, die_on_y)
    with pytest.raises(Died):
        execute_task(buf.ctx, _task(ops), "w-dies")
    assert buf.archived("x") == b"x" * 100 and buf.copy_rows() == set()
    assert buf.statuses(ops) == ["IN_PROGRESS", "IN_PROGRESS"]
    monkeypatch.setitem(stages.STAGES, LTA, real)
    # lease recovery's effect: back to PENDING at a new fencing token
    buf.db.transact(lambda s: s.execute(update(Operation).where(Operation.id.in_(ops)).values(
        status=Status.PENDING.value, attempt=Operation.attempt + 1, lease_owner=None, lease_expires_at=None)))
    assert execute_task(buf.ctx, _task(ops), "w2") == [Outcome.COMPLETED, Outcome.COMPLETED]
    assert buf.copy_rows() == {raw_package_key("x"), raw_package_key("y")}
    assert buf.archived("y") == b"y" * 100


def test_a_task_syncs_each_archive_folder_once_and_records_nothing_if_that_fails(
        buf: Buffer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The packages of a task published into one archive folder: that folder is synced once,
    after the last of them and before anything is recorded; when that sync fails, no copy of
    the task is recorded (a crash of the machine could still undo the links), every operation
    is handed back (EIO makes the archive wait as unavailable, no retry counted), and the next
    attempt completes them from the bytes already there."""
    import packhorse.storage.disk as disk

    ops = [buf.waiting(f"inst/obs-{i}", bytes([i]) * 500) for i in range(3)]
    lta_folder = str(buf.settings.location_path("cologne-lta").resolve() / "raw" / "inst")
    synced: list[str] = []
    real_sync = disk._fsync_dir

    def failing_sync(folder: Path) -> None:
        synced.append(str(folder))
        if str(folder) == lta_folder:
            raise OSError(5, "Input/output error")
        real_sync(folder)

    monkeypatch.setattr(disk, "_fsync_dir", failing_sync)
    assert execute_task(buf.ctx, _task(ops), "w") == [Outcome.DEFERRED] * 3  # EIO: the archive waits as unavailable, nothing counted
    assert synced.count(lta_folder) == 1  # once for the task, not once per package
    assert buf.copy_rows() == set() and buf.statuses(ops) == ["PENDING"] * 3
    assert all(buf.archived(f"inst/obs-{i}") == bytes([i]) * 500 for i in range(3))
    monkeypatch.setattr(disk, "_fsync_dir", real_sync)
    buf.db.transact(lambda s: s.execute(update(Operation).where(Operation.id.in_(ops)).values(not_before=None)))
    assert execute_task(buf.ctx, _task(ops), "w2") == [Outcome.COMPLETED] * 3
    assert buf.copy_rows() == {raw_package_key(f"inst/obs-{i}") for i in range(3)}


def _runner(db: Database, workers: int, prefetch: int) -> LocalRunner:
    executor = {"workers": workers, "pool": "thread", "prefetch_multiplier": prefetch}
    return LocalRunner(types.SimpleNamespace(settings=settings_from_dict({"executor": executor}, environ={}),
                                             db=db, hooks=NO_HOOKS))  # type: ignore[arg-type]


def _archive_operations(db: Database, sizes: list[int], stalled: dict[int, int] | None = None, *,
                        kind: OperationKind = LTA) -> list[int]:
    """A source location and one PENDING long-term-archive operation per package of ``sizes``
    (bytes), the ``k``-th with ``stall_count`` ``stalled[k]``; returns their operation ids.
    ``kind`` ``RAW_DATA_PACKAGE``: builds of packages of ``sizes`` payload bytes, not built yet
    (no size, no sha256)."""
    built = kind is LTA
    def seed(s: Session) -> list[int]:
        s.add(Site(id=1, name="fyst"))
        s.flush()
        s.add(DataLocation(id=1, name="fyst-source", site_id=1, role="source", storage_type="disk", uri="/x"))
        s.flush()
        ids = []
        for i, size in enumerate(sizes):
            pkg = RawDataPackage(name=f"p{i}", group_path=f"p{i}", source_location_id=1, bagging_date="2026-01-01",
                                 file_count=1, payload_bytes=size, size=size if built else None,
                                 sha256="0" * 64 if built else None)
            s.add(pkg)
            s.flush()
            op = create_operation(s, kind=kind, dedup_key=f"{kind.value}:{i}", site_id=1, max_retries=3,
                                  raw_data_package_id=pkg.id)
            assert op is not None
            op.stall_count = (stalled or {}).get(i, 0)
            ids.append(op.id)
        return ids

    return db.transact(seed)


def _handed(db: Database, *, workers: int, prefetch: int) -> list[tuple[int, ...]]:
    """The tasks (operation ids) one dispatch of a runner with ``workers × prefetch`` free task
    slots hands to its pool."""
    runner = _runner(db, workers=workers, prefetch=prefetch)
    handed: list[tuple[int, ...]] = []
    runner._submit = lambda task: handed.append(tuple(i for i, _ in task)) or _Done()  # type: ignore[method-assign]
    try:
        runner.dispatch()
    finally:
        runner.hash_pool.shutdown(wait=True)
    return handed


BIG = SMALL_BATCH_BYTES + 1
THIRD = SMALL_BATCH_BYTES // 3


@pytest.mark.parametrize(("sizes", "expected"), [
    ([10] * 3, [1, 1, 1]),
    ([10] * 4, [1, 1, 1, 1]),
    ([10] * 15, [4, 4, 4, 3]),
    ([10] * 18, [5, 5, 5, 3]),
    ([10] * 40, [10] * 4),
    ([10] * 80, [SMALL_BATCH] * 4),
    ([BIG] * 10, [1, 1, 1, 1]),                         # large packages: one to a task, always
    ([10, BIG, 10, 10, BIG, 10, 10, 10, 10], [2, 1, 2, 1]),
    ([THIRD + 1] * 12, [2, 2, 2, 2]),                   # at most SMALL_BATCH_BYTES to a task
], ids=["3", "4", "15", "18", "40", "80", "large", "mixed", "bytes"])
@pytest.mark.parametrize("kind", [LTA, OperationKind.RAW_DATA_PACKAGE], ids=["archives", "builds"])
def test_the_runner_puts_small_archives_together_beyond_its_free_slots(tmp_path: Path, sizes: list[int],
                                                                        expected: list[int],
                                                                        kind: OperationKind) -> None:
    """Few archive operations (or package builds) go one to a task, so every worker copies
    (builds) one; more than the free task slots are spread over them, at most SMALL_BATCH and
    SMALL_BATCH_BYTES to a task; a package larger than SMALL_BATCH_BYTES (a build: its payload,
    its package not written yet) is always archived or built alone."""
    db = Database(f"sqlite:///{tmp_path}/t.db")
    db.upgrade()
    try:
        _archive_operations(db, sizes, kind=kind)
        handed = _handed(db, workers=2, prefetch=2)  # 4 free task slots
        assert [len(ids) for ids in handed] == expected
        ids = [i for task in handed for i in task]
        size_of = db.read(lambda s: dict(s.execute(select(Operation.id, RawDataPackage.payload_bytes).join(
            RawDataPackage, RawDataPackage.id == Operation.raw_data_package_id)).all()))
        assert all(len(t) == 1 or sum(size_of[i] for i in t) <= SMALL_BATCH_BYTES for t in handed)
        scheduled = db.read(lambda s: set(s.scalars(select(Operation.id).where(
            Operation.status == Status.SCHEDULED.value))))
        assert scheduled == set(ids)
        assert db.read(lambda s: s.scalar(select(func.count()).select_from(Operation))) == len(sizes)
    finally:
        db.dispose()


class _Done:
    """A future that never finishes (the test only looks at what was handed over)."""

    def add_done_callback(self, fn: Any) -> None:
        pass


def _row(op_id: int, kind: OperationKind, queue: str, copy: int | None = None) -> Any:
    return types.SimpleNamespace(id=op_id, kind=kind.value, physical_copy_id=copy, queue=queue)


def test_the_distributed_executor_groups_each_queue_alone_and_spreads_its_archives_over_a_sites_workers() -> None:
    """A broker message goes to one queue: a task never mixes queues. Each queue's archive
    operations of small packages are spread over ``spread`` messages (a site's worker processes)
    before any message gets two, at most SMALL_BATCH to one; deletions go 16 to a message;
    every other operation is a message of its own. Every row is taken, in dispatch order."""
    rows = ([_row(i, LTA, "cologne_lta") for i in range(12)] + [_row(100 + i, LTA, "cornell_lta") for i in range(3)]
            + [_row(200 + i, OperationKind.DELETION, "fyst_buffer", copy=i) for i in range(20)]
            + [_row(300, OperationKind.TRANSFER, "cologne_buffer"), _row(301, OperationKind.DELETION, "fyst_source")])
    small = {r.id: 10 for r in rows if r.kind == LTA.value}
    queue = {r.id: r.queue for r in rows}
    tasks = group_tasks(rows, small, key=lambda r: r.queue, spread=2)
    assert all(len({queue[i] for i in t}) == 1 for t in tasks)
    by_queue = {}
    for t in tasks:
        by_queue.setdefault(queue[t[0]], []).append(len(t))
    assert by_queue == {"cologne_lta": [6, 6], "cornell_lta": [2, 1], "fyst_buffer": [16, 4],
                        "cologne_buffer": [1], "fyst_source": [1]}  # a source file's deletion is not batched
    assert sorted(i for t in tasks for i in t) == sorted(r.id for r in rows)
    many = [_row(400 + i, LTA, "cologne_lta") for i in range(SMALL_BATCH + 4)]
    assert [len(t) for t in group_tasks(many, {r.id: 10 for r in many}, key=lambda r: r.queue)] == [SMALL_BATCH, 4]


def test_an_operation_that_stalled_before_runs_alone_in_both_executors(tmp_path: Path) -> None:
    """A worker that dies stalls every operation of its task: an operation that stalled before
    (it may be the one that kills its worker; its breaker may be letting one trial through) is
    handed alone, so it cannot take its batch-mates' breakers down with it. The others are
    still batched."""
    rows = ([_row(i, LTA, "q") for i in range(6)] + [_row(10 + i, OperationKind.DELETION, "d", copy=i) for i in range(5)])
    rows[2].stall_count = 1
    rows[8].stall_count = 3
    small = {r.id: 10 for r in rows if r.kind == LTA.value}
    assert group_tasks(rows, small, key=lambda r: r.queue, spread=1) == [[0, 1, 3, 4, 5], [2], [10, 11, 13, 14], [12]]
    assert group_tasks(rows, small, slots=2) == [[0, 1, 3], [2]]  # 5 archives over 2 slots: 3 to a task
    # the embedded runner reads the count with the runnable rows (pipeline.take_runnable)
    db = Database(f"sqlite:///{tmp_path}/t.db")
    db.upgrade()
    try:
        stalled = _archive_operations(db, [10] * 12, stalled={5: 2})[5]
        handed = _handed(db, workers=1, prefetch=2)  # 2 free task slots
        assert len(handed) == 2 and (stalled,) in handed, handed
        assert max(len(t) for t in handed) == 6  # the 11 others over 2 slots, 6 to a task; the rest wait
    finally:
        db.dispose()


def test_a_task_of_archive_copies_costs_a_handful_of_statements_however_many_copies(buf: Buffer) -> None:
    """Every statement is a round trip to a database across a long link: a task of archive
    copies is claimed in two statements, reads all its packages in one, completes every
    operation's row in one, records the copies in two, and checks whether its packages are now
    archived everywhere in three (before: a completion, a copy and two or three statements of
    that check a copy). Each copy is still archived with its own bytes, and exactly the
    packages that cornell's archive already held are marked archived (the route needs both)."""
    import threading

    from sqlalchemy import event

    n = 6
    ops = [buf.waiting(f"r{i}", bytes([i]) * 700) for i in range(n)]

    def at_cornell(s: Session) -> None:  # the even packages are already archived at cornell
        for p in s.scalars(select(RawDataPackage).where(RawDataPackage.name.in_([f"r{i}" for i in range(0, n, 2)]))):
            s.add(PhysicalCopy(raw_data_package_id=p.id, location_id=buf.ids["cornell-lta"], path=f"raw/{p.name}.tar",
                               size=p.size, sha256=p.sha256, status="present", created_at=utcnow(),
                               verified_at=utcnow()))

    buf.db.transact(at_cornell)
    statements: list[str] = []
    me = threading.get_ident()

    def seen(conn: Any, cursor: Any, statement: str, *a: Any) -> None:
        if threading.get_ident() == me:
            statements.append(" ".join(statement.split()))

    event.listen(buf.db.engine, "before_cursor_execute", seen)
    assert execute_task(buf.ctx, _task(ops), "w") == [Outcome.COMPLETED] * n
    event.remove(buf.db.engine, "before_cursor_execute", seen)
    counted = [q for q in statements if not q.startswith("BEGIN")]  # SQLite's; PostgreSQL reads in autocommit
    assert not any("SAVEPOINT" in q for q in counted), counted
    assert len([q for q in counted if q.startswith("SELECT raw_data_packages.id, raw_data_packages.name")]) == 1
    assert len(counted) <= 10, counted  # claim 2, read 1, completions 1, copies 2, archived-everywhere 3
    assert all(buf.archived(f"r{i}") == bytes([i]) * 700 for i in range(n))
    assert buf.db.read(lambda s: set(s.scalars(select(RawDataPackage.name).where(
        RawDataPackage.archived_at.is_not(None))))) == {f"r{i}" for i in range(0, n, 2)}
