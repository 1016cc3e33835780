"""Operations in a bare ops database, for the recovery and circuit-breaker tests: the site they
belong to, a new operation of a kind, its row, and its lease made to look expired."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import update

from packhorse.db.models import Operation, Site, utcnow
from packhorse.db.session import Database
from packhorse.domain import OperationKind
from packhorse.operations.lifecycle import create_operation


def with_site(db: Database) -> Database:
    """``db`` with site 1, ``fyst``, which the operations of :func:`new_op` belong to."""
    db.transact(lambda s: s.add(Site(id=1, name="fyst")))
    return db


def new_op(db: Database, name: str = "a", kind: OperationKind = OperationKind.LONG_TERM_ARCHIVE) -> int:
    """A new PENDING operation of ``kind`` (dedup key ``<kind>:<name>``); returns its id."""
    op = db.transact(lambda s: create_operation(s, kind=kind, dedup_key=f"{kind.value}:{name}", site_id=1,
                                                max_retries=3))
    assert op is not None
    return op.id


def op_row(db: Database, op_id: int) -> Operation:
    return db.read(lambda s: s.get(Operation, op_id))


def expire(db: Database, op_id: int, seconds_ago: float = 1) -> None:
    """Move the operation's lease expiry ``seconds_ago`` into the past."""
    db.transact(lambda s: s.execute(update(Operation).where(Operation.id == op_id).values(
        lease_expires_at=utcnow() - dt.timedelta(seconds=seconds_ago))))
