"""I5: every (OperationKind, Status) pair has an owner that moves it on.

The owner map (:func:`packhorse.engine.owners.owner_map`) is built from the live
registrations — the stages workers run (``STAGES``), the dispatch order (``engine.pipeline.DISPATCH_ORDER``), the
stalled-task monitor's handlers (``RECOVERY_HANDLERS``), the reconciler's statuses and the
notification that hands FAILED operations to a human. The tests below remove each
registration in turn and check that the pair it owned becomes an orphan, then exercise every
owner for every kind against a real database, so a kind keyed by a string nobody registered
(the seeds' bug #69) cannot slip through.
"""

from __future__ import annotations

import ast
import datetime as dt
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

import packhorse.managers as managers_pkg
from packhorse.cli import EXIT_FAILED, EXIT_OK
from packhorse.cli.pipeline import exit_code_after_run
from packhorse.config import settings_from_dict
from packhorse.db.models import Notification, Operation, Site, utcnow
from packhorse.db.session import Database
from packhorse.domain import OperationKind, Status
from packhorse.engine import outcome, pipeline
from packhorse.engine.owners import creators, orphans, owner_map
from packhorse.engine.pipeline import DISPATCH_ORDER
from packhorse.engine.worker import Outcome
from packhorse.executors.local import LocalRunner
from packhorse.operations.lifecycle import claim, create_operation
from packhorse.recovery import monitor, reconciler
from packhorse.recovery.monitor import check_stalled
from packhorse.runtime.hooks import NO_HOOKS
from packhorse.stages import STAGES
from packhorse.status.reporting import failed_operations

#: Kinds that exist in the vocabulary but have no stage (and no manager creating them) yet.
#: Remove a kind from this set in the change that adds its stage: the test below fails until
#: you do, and fails for any new kind added without a stage.
UNBUILT_KINDS = {k for k in (OperationKind.STAGING, OperationKind.FIXITY_CHECK) if k not in STAGES}
BUILT_KINDS = [k for k in OperationKind if k not in UNBUILT_KINDS]
SETTINGS = settings_from_dict({}, environ={})


def test_every_kind_and_status_has_an_owner() -> None:
    assert orphans(BUILT_KINDS) == []
    assert all(owner_map()[(k, Status.COMPLETED)] == ["terminal"] for k in OperationKind)


def _first_built() -> OperationKind:
    return BUILT_KINDS[0]


@pytest.mark.parametrize("registration", ["stage", "dispatch", "monitor handler", "reconciler", "notification"])
def test_removing_a_registration_leaves_an_orphan(monkeypatch: pytest.MonkeyPatch, registration: str) -> None:
    kind = OperationKind.LONG_TERM_ARCHIVE
    if registration == "stage":
        monkeypatch.delitem(STAGES, kind)
        expected = {(kind.value, s) for s in ("PENDING", "SCHEDULED", "IN_PROGRESS")}
    elif registration == "dispatch":
        monkeypatch.setattr(pipeline, "DISPATCH_ORDER", tuple(k for k in DISPATCH_ORDER if k is not kind))
        expected = {(kind.value, s) for s in ("PENDING", "SCHEDULED")}
    elif registration == "monitor handler":
        monkeypatch.delitem(monitor.RECOVERY_HANDLERS, kind)
        expected = {(kind.value, "IN_PROGRESS")}
    elif registration == "reconciler":
        monkeypatch.setattr(reconciler, "RECONCILED_STATUSES", (Status.IN_PROGRESS,))
        expected = {(k.value, "SCHEDULED") for k in BUILT_KINDS}
    else:
        monkeypatch.delitem(outcome.HUMAN_NOTIFICATIONS, Status.FAILED)
        expected = {(k.value, "FAILED") for k in BUILT_KINDS}
    assert set(orphans(BUILT_KINDS)) == expected


def test_unbuilt_kinds_really_have_no_stage() -> None:
    # when a stage lands, remove its kind from UNBUILT_KINDS (then the owner test covers it)
    assert [k.value for k in UNBUILT_KINDS if k in STAGES or k in DISPATCH_ORDER] == []


def test_stages_and_dispatch_priority_cover_the_same_kinds() -> None:
    assert set(STAGES) == set(BUILT_KINDS)
    assert set(monitor.RECOVERY_HANDLERS) == set(STAGES)
    assert sorted(DISPATCH_ORDER, key=lambda k: k.value) == sorted(STAGES, key=lambda k: k.value)
    assert len(DISPATCH_ORDER) == len(set(DISPATCH_ORDER))


def test_every_built_kind_is_created_by_exactly_one_pipeline_step() -> None:
    # a kind with a stage but no step creating it would never run; two steps would race
    made = creators()
    assert {k: v for k, v in made.items() if k in BUILT_KINDS and len(v) != 1} == {}
    assert [s.name for s in pipeline.STEPS] == ["scan", "package", "bundle", "transfer", "unpack", "archive",
                                                "staging", "deletion", "fixity"]


def test_no_manager_creates_an_unbuilt_kind() -> None:
    # an operation of an unbuilt kind would sit PENDING with no stage to run it
    used: set[str] = set()
    for path in Path(managers_pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "OperationKind":
                used.add(node.attr)
    assert used, "the managers no longer name OperationKind members: update this test"
    assert sorted(used & {k.name for k in UNBUILT_KINDS}) == []


# ------------------------------------------------------------- each owner, for each kind


@pytest.fixture
def db(empty_db: Database) -> Database:
    d = empty_db
    d.transact(lambda s: s.add(Site(id=1, name="fyst")))
    yield d
    d.dispose()


def make_ops(db: Database, kinds: list[OperationKind], status: Status) -> dict[OperationKind, int]:
    def tx(s: Session) -> dict[OperationKind, int]:
        ids = {}
        for k in kinds:
            op = create_operation(s, kind=k, dedup_key=f"{k.value}:{status.value}", site_id=1, max_retries=3)
            assert op is not None
            ids[k] = op.id
        s.execute(update(Operation).where(Operation.id.in_(ids.values())).values(status=status.value))
        return ids

    return db.transact(tx)


@pytest.mark.parametrize("status", [Status.PENDING, Status.SCHEDULED])
def test_local_runner_dispatches_every_built_kind(db: Database, status: Status) -> None:
    ids = make_ops(db, BUILT_KINDS, status)
    settings = settings_from_dict({"executor": {"workers": len(BUILT_KINDS) + 2}}, environ={})
    runner = LocalRunner(types.SimpleNamespace(settings=settings, db=db, hooks=NO_HOOKS))  # type: ignore[arg-type]
    ran: list[int] = []

    def run_one(op_id: int, token: int | None = None) -> Outcome:  # stands in for execute_operation: the stage is not under test
        ran.append(op_id)
        return Outcome.SKIPPED

    runner._run_one = run_one  # type: ignore[method-assign]
    runner.pool = ThreadPoolExecutor(1)  # one thread: runs in submission (dispatch) order
    try:
        assert runner.dispatch() == len(BUILT_KINDS)
    finally:
        runner.pool.shutdown(wait=True)
        runner.hash_pool.shutdown(wait=True)
    assert sorted(ran) == sorted(ids.values())
    rows = db.transact(lambda s: {r.id: r.status for r in s.execute(select(Operation.id, Operation.status))})
    assert set(rows.values()) == {"SCHEDULED"}
    # downstream first: the dispatch order is pipeline.DISPATCH_ORDER
    order = sorted(ids, key=lambda k: ran.index(ids[k]))
    assert order == [k for k in DISPATCH_ORDER if k in ids]


def test_stalled_in_progress_of_every_kind_is_recovered(db: Database) -> None:
    ids = make_ops(db, BUILT_KINDS, Status.PENDING)
    for op_id in ids.values():
        assert claim(db, op_id, "dead-worker", 30) is not None
    db.transact(lambda s: s.execute(update(Operation).values(lease_expires_at=utcnow() - dt.timedelta(seconds=1))))
    assert sorted(check_stalled(db, SETTINGS).reset) == sorted(ids.values())
    statuses = db.transact(lambda s: set(s.scalars(select(Operation.status))))
    assert statuses == {"PENDING"}


def test_a_kind_without_recovery_handler_is_not_skipped_silently(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    # bug #69 of the seeds: a handler keyed by a name no task registers
    kind = OperationKind.LONG_TERM_ARCHIVE
    monkeypatch.delitem(monitor.RECOVERY_HANDLERS, kind)
    op_id = make_ops(db, [kind], Status.PENDING)[kind]
    assert claim(db, op_id, "dead-worker", 30) is not None
    db.transact(lambda s: s.execute(update(Operation).values(lease_expires_at=utcnow() - dt.timedelta(seconds=1))))
    report = check_stalled(db, SETTINGS)
    assert report.unhandled == [op_id] and report.reset == []
    note = db.read(lambda s: s.scalars(select(Notification).where(Notification.operation_id == op_id)).one())
    assert (note.level, note.event) == ("ERROR", "missing_recovery_handler")


def test_failed_of_every_kind_reaches_a_human(db: Database) -> None:
    ctx = types.SimpleNamespace(db=db, settings=SETTINGS)
    assert exit_code_after_run(ctx) == EXIT_OK  # type: ignore[arg-type]
    ids = make_ops(db, list(OperationKind), Status.FAILED)
    listed = db.transact(failed_operations)
    assert sorted((f["kind"], f["id"]) for f in listed) == sorted((k.value, i) for k, i in ids.items())
    assert exit_code_after_run(ctx) == EXIT_FAILED  # type: ignore[arg-type]


def test_completed_of_every_kind_is_terminal(db: Database) -> None:
    ids = make_ops(db, list(OperationKind), Status.COMPLETED)
    db.transact(lambda s: s.execute(update(Operation).values(lease_expires_at=utcnow() - dt.timedelta(seconds=1))))
    for op_id in ids.values():
        assert claim(db, op_id, "w", 30) is None
    assert check_stalled(db, SETTINGS).reset == []
    assert db.transact(failed_operations) == []
    assert db.transact(lambda s: set(s.scalars(select(Operation.status)))) == {"COMPLETED"}
