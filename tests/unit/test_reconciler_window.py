"""The reconciler's give-up is per cool-down window, never for ever, and never silent (I5).

Against a real (SQLite) ops database: an operation whose dispatch is lost more often than
``reconcile_max_resets`` in one window is given up on (one ERROR notification), listed as
blocked (cause ``dispatch_lost``) in the one provider list ``status`` and the dashboard read,
counted by the gauge ``packhorse_dispatch_lost``, re-dispatched once more after
``reconcile_cooldown_seconds`` (half-open), and starts a fresh window once a worker claims it;
``packhorse retry`` releases it at once.
"""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import select, update

from ops_support import new_op, op_row, with_site
from packhorse.config import settings_from_dict
from packhorse.db.models import Notification, Operation, utcnow
from packhorse.db.session import Database
from packhorse.domain import OperationKind
from packhorse.operations.lifecycle import claim
from packhorse.recovery import breakers
from packhorse.recovery.reconciler import reconcile
from packhorse.status import blocked_work
from packhorse.status.blocked_work import EXIT_WAITING, PROVIDERS, blocked_items
from packhorse.status.metrics import registry_for, render

KIND = OperationKind.LONG_TERM_ARCHIVE
COOLDOWN = 600.0


def settings(**recovery: Any) -> Any:
    base = {"reconcile_max_resets": 2, "reconcile_cooldown_seconds": COOLDOWN, "notification_cooldown_seconds": 3600}
    return settings_from_dict({"recovery": {**base, **recovery}}, environ={})


@pytest.fixture
def db(empty_db: Database) -> Database:
    return with_site(empty_db)


def lose(db: Database, op_id: int) -> None:
    """The operation was dispatched and its message lost (scheduled long ago, never claimed)."""
    t = utcnow() - dt.timedelta(seconds=5)
    db.transact(lambda s: s.execute(update(Operation).where(Operation.id == op_id).values(
        status="SCHEDULED", scheduled_at=t, updated_at=t)))


def ctx_of(s: Any) -> Any:
    return SimpleNamespace(settings=s, topology=SimpleNamespace(site_ids={"fyst": 1}))


def blocked(db: Database, s: Any) -> list[blocked_work.BlockedItem]:
    return [b for b in db.read(lambda x: blocked_items(x, ctx_of(s))) if b.cause == "dispatch_lost"]


def cap_notes(db: Database) -> list[Notification]:
    return db.read(lambda x: list(x.scalars(select(Notification).where(Notification.event == "reconcile_cap"))))


def cool_down_passes(db: Database, op_id: int) -> None:
    """Move the give-up a cool-down (and a second) into the past."""
    at = op_row(db, op_id).reconcile_given_up_at
    db.transact(lambda x: x.execute(update(Operation).where(Operation.id == op_id).values(
        reconcile_given_up_at=at - dt.timedelta(seconds=COOLDOWN + 1))))


def gauge(db: Database) -> str:
    text = render(registry_for(db)).decode()
    return next(ln for ln in text.splitlines() if ln.startswith(f'packhorse_dispatch_lost{{kind="{KIND.value}"}}'))


def given_up(db: Database, s: Any) -> int:
    """An operation lost ``cap`` times, then once more: the reconciler gives up on it."""
    op_id = new_op(db)
    for _ in range(s.recovery.reconcile_max_resets):
        lose(db, op_id)
        assert reconcile(db, s) == [op_id]
    lose(db, op_id)
    assert reconcile(db, s) == []
    return op_id


def test_a_give_up_is_listed_as_blocked_and_counted_until_the_operation_moves(db: Database) -> None:
    assert blocked_work.dispatch_lost in PROVIDERS  # status and the dashboard read this list
    s = settings()
    op_id = given_up(db, s)
    [item] = blocked(db, s)
    op = op_row(db, op_id)
    assert (item.subject, item.exit_code, item.since) == (f"long_term_archive {op_id}", EXIT_WAITING,
                                                          op.reconcile_given_up_at.isoformat())
    assert item.release.startswith(f"packhorse retry long_term_archive {op_id}")
    assert item.detail is not None and item.detail["reconcile_count"] == 2 and item.detail["site"] == "fyst"
    assert gauge(db).endswith(" 1.0")
    [n] = cap_notes(db)
    assert n.level == "ERROR"
    # while it waits for its cool-down, later passes change nothing and page no more
    assert reconcile(db, s) == [] and op_row(db, op_id).status == "SCHEDULED"
    assert len(cap_notes(db)) == 1 and cap_notes(db)[0].repeat_count == 0
    # the releasing command works: retried, it is no longer blocked, and its window starts over
    breakers.force_retry(db, KIND, op_id, reason="queue served again", actor="t")
    assert blocked(db, s) == [] and gauge(db).endswith(" 0.0")
    op = op_row(db, op_id)
    assert (op.status, op.reconcile_count, op.reconcile_given_up_at) == ("PENDING", 0, None)


def test_after_the_cool_down_one_more_attempt_is_made_half_open(db: Database) -> None:
    s = settings()
    op_id = given_up(db, s)
    cool_down_passes(db, op_id)
    assert reconcile(db, s) == [op_id]  # half-open: re-dispatched once more
    assert op_row(db, op_id).status == "PENDING" and blocked(db, s) == []
    lose(db, op_id)  # lost again without a claim: given up again at once (one attempt per cool-down)
    assert reconcile(db, s) == []
    assert [b.subject for b in blocked(db, s)] == [f"long_term_archive {op_id}"]
    assert op_row(db, op_id).status == "SCHEDULED"


def test_a_claim_closes_the_window_and_the_cap_applies_afresh(db: Database) -> None:
    s = settings()
    op_id = given_up(db, s)
    cool_down_passes(db, op_id)
    assert reconcile(db, s) == [op_id]
    assert claim(db, op_id, "worker", 30) is not None  # a worker took it: the queue is served
    assert blocked(db, s) == []
    # lost later in its life (its worker died before the lease was written, a message lost
    # again): a full cap of re-dispatches again, not an immediate give-up
    for _ in range(2):
        lose(db, op_id)
        assert reconcile(db, s) == [op_id]
    assert op_row(db, op_id).reconcile_count == 2 and blocked(db, s) == []


def test_a_gave_up_operation_that_a_worker_claimed_is_not_listed(db: Database) -> None:
    s = settings()
    op_id = given_up(db, s)
    assert claim(db, op_id, "worker", 30) is not None  # the message turned up after all
    assert blocked(db, s) == [] and gauge(db).endswith(" 0.0")
