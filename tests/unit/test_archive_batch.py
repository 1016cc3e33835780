"""Long-term-archive operations run together (:func:`packhorse.worker.execute_batch`): one claim
and one completion transaction for the batch, yet every operation keeps its own bytes, fencing
token and outcome (I2, I3, I4), and the embedded runner batches them only when there are more of
them than free task slots."""

from __future__ import annotations

import hashlib
import types
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session
from support import write_site_config

from packhorse.config import load_config, settings_from_dict
from packhorse.context import ProcessContext
from packhorse.db.models import Operation, PhysicalCopy, RawDataPackage, Site, utcnow
from packhorse.db.session import Database
from packhorse.domain import OperationKind, Status
from packhorse.executors.local import LocalRunner
from packhorse.hooks import NO_HOOKS
from packhorse.operations import create_operation, dedup_key
from packhorse.topology import sync_topology
from packhorse.worker import ARCHIVE_BATCH, Outcome, execute_batch, execute_operation


class Buffer:
    """A three-site configuration whose cologne buffer holds raw packages waiting for the archive."""

    def __init__(self, tmp_path: Path) -> None:
        self.settings = load_config(write_site_config(tmp_path / "site"))
        self.db = Database(self.settings.database_url)
        self.db.upgrade()
        self.ctx = ProcessContext(settings=self.settings, db=self.db, topology=sync_topology(self.db, self.settings))
        self.ids = self.ctx.topology.location_ids

    def waiting(self, name: str, data: bytes) -> int:
        """A raw package at cologne-buffer (bytes and a verified copy row) and its archive
        operation to cologne-lta; returns the operation id."""
        key = f"raw/{name}.tar"
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
            op = create_operation(s, kind=OperationKind.LONG_TERM_ARCHIVE,
                                  dedup_key=dedup_key(OperationKind.LONG_TERM_ARCHIVE, f"{name}:cologne-lta"),
                                  site_id=self.ctx.topology.site_ids["cologne"], max_retries=3,
                                  raw_data_package_id=pkg.id, source_location_id=self.ids["cologne-buffer"],
                                  destination_location_id=self.ids["cologne-lta"])
            assert op is not None
            return op.id

        return self.db.transact(tx)

    def archived(self, name: str) -> bytes | None:
        path = self.settings.location_path("cologne-lta") / f"raw/{name}.tar"
        return path.read_bytes() if path.exists() else None

    def copy_rows(self) -> set[str]:
        return set(self.db.read(lambda s: list(s.scalars(select(PhysicalCopy.path).where(
            PhysicalCopy.location_id == self.ids["cologne-lta"])))))

    def statuses(self, ops: list[int]) -> list[str]:
        rows = self.db.read(lambda s: dict(s.execute(select(Operation.id, Operation.status)
                                                      .where(Operation.id.in_(ops))).all()))
        return [rows[i] for i in ops]


@pytest.fixture
def buf(tmp_path: Path) -> Buffer:
    b = Buffer(tmp_path)
    yield b
    b.db.dispose()


def test_archives_run_together_each_with_its_own_outcome(buf: Buffer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Good packages are archived, verified and recorded; a key holding other bytes fails alone
    (DestinationConflictError, never overwritten); an attempt taken over meanwhile records
    nothing (its bytes are there, its completion is refused); one already done is skipped."""
    ops = {name: buf.waiting(name, name.encode() * 1000) for name in ("a", "clash", "b", "stale", "done")}
    clash = buf.settings.location_path("cologne-lta") / "raw/clash.tar"
    clash.parent.mkdir(parents=True, exist_ok=True)
    clash.write_bytes(b"someone else's bytes")
    assert execute_operation(buf.ctx, ops["done"], "w0") is Outcome.COMPLETED

    import packhorse.stages as stages

    real = stages.STAGES[OperationKind.LONG_TERM_ARCHIVE]

    def takeover(work: Any) -> Any:
        recorder = real(work)
        if work.op.id == ops["stale"]:  # another attempt claims it after the bytes went
            buf.db.transact(lambda s: s.execute(update(Operation).where(Operation.id == ops["stale"])
                                                .values(attempt=Operation.attempt + 1)))
        return recorder

    monkeypatch.setitem(stages.STAGES, OperationKind.LONG_TERM_ARCHIVE, takeover)
    order = [ops[n] for n in ("a", "clash", "b", "stale", "done")]
    assert execute_batch(buf.ctx, order, "w1") == [Outcome.COMPLETED, Outcome.FAILED, Outcome.COMPLETED,
                                                   Outcome.STALE, Outcome.SKIPPED]
    assert buf.archived("a") == b"a" * 1000 and buf.archived("b") == b"b" * 1000
    assert clash.read_bytes() == b"someone else's bytes"  # I2: never overwritten
    assert buf.copy_rows() == {"raw/a.tar", "raw/b.tar", "raw/done.tar"}  # nothing for clash or stale
    assert buf.statuses(order) == ["COMPLETED", "FAILED", "COMPLETED", "IN_PROGRESS", "COMPLETED"]
    ctx = buf.db.read(lambda s: s.get(Operation, ops["clash"]).error_context)
    assert ctx["error_type"] == "DestinationConflictError"


def test_a_refused_completion_in_a_batch_fails_that_operation_alone(buf: Buffer, monkeypatch: pytest.MonkeyPatch) -> None:
    # the recorder of one operation raises inside the shared completion transaction: its
    # savepoint rolls back, the other operations' completions and copy rows stay
    ops = [buf.waiting(n, n.encode() * 10) for n in ("p", "q")]
    import packhorse.stages as stages

    real = stages.STAGES[OperationKind.LONG_TERM_ARCHIVE]

    def refuse_q(work: Any) -> Any:
        recorder = real(work)
        if work.op.id != ops[1]:
            return recorder

        def record(s: Session) -> None:
            recorder(s)
            raise RuntimeError("copy record refused")

        return record

    monkeypatch.setitem(stages.STAGES, OperationKind.LONG_TERM_ARCHIVE, refuse_q)
    assert execute_batch(buf.ctx, ops, "w") == [Outcome.COMPLETED, Outcome.RETRY]
    assert buf.copy_rows() == {"raw/p.tar"}
    assert buf.statuses(ops) == ["COMPLETED", "PENDING"]


def _runner(db: Database, workers: int, prefetch: int) -> LocalRunner:
    executor = {"workers": workers, "pool": "thread", "prefetch_multiplier": prefetch}
    return LocalRunner(types.SimpleNamespace(settings=settings_from_dict({"executor": executor}, environ={}),
                                             db=db, hooks=NO_HOOKS))  # type: ignore[arg-type]


@pytest.mark.parametrize(("n", "expected"), [(3, [1, 1, 1]), (4, [1, 1, 1, 1]), (15, [1, 1, 1, 1]),
                                              (18, [5, 5, 5, 3]), (40, [ARCHIVE_BATCH] * 4)])
def test_the_runner_batches_archives_only_beyond_its_free_slots(tmp_path: Path, n: int, expected: list[int]) -> None:
    """Few archives (large packages, set (a)) go one to a task, so every worker copies one; a
    backlog of BATCH_BACKLOG (4) rounds of free slots or more (small packages, set (b)) is spread
    over the free slots, at most ARCHIVE_BATCH to a task."""
    db = Database(f"sqlite:///{tmp_path}/t.db")
    db.upgrade()
    try:
        db.transact(lambda s: s.add(Site(id=1, name="fyst")))
        db.transact(lambda s: [create_operation(s, kind=OperationKind.LONG_TERM_ARCHIVE, dedup_key=f"lta:{i}",
                                                site_id=1, max_retries=3) for i in range(n)])
        runner = _runner(db, workers=2, prefetch=2)  # 4 free task slots
        handed: list[tuple[tuple[int, ...], str | None]] = []
        runner._submit = lambda task, kind=None: handed.append((tuple(i for i, _ in task), kind)) or _Done()  # type: ignore[method-assign]
        try:
            runner.dispatch()
        finally:
            runner.hash_pool.shutdown(wait=True)
        assert [len(ids) for ids, _ in handed] == expected
        assert all(kind == (OperationKind.LONG_TERM_ARCHIVE.value if len(ids) > 1 else None) for ids, kind in handed)
        scheduled = db.read(lambda s: s.scalar(select(func.count()).select_from(Operation).where(
            Operation.status == Status.SCHEDULED.value)))
        assert scheduled == sum(expected)
    finally:
        db.dispose()


class _Done:
    """A future that never finishes (the test only looks at what was handed over)."""

    def add_done_callback(self, fn: Any) -> None:
        pass
