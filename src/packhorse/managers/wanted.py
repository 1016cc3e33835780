"""Helpers shared by the managers: find what is missing in a read-only unit of work, then
create only that in a short write transaction (most cycles write nothing)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from packhorse.db.models import Operation
from packhorse.domain import LocationRole, OperationKind
from packhorse.operations.lifecycle import create_operations
from packhorse.rules.convergence import plan

if TYPE_CHECKING:
    from packhorse.rules.convergence import Plan
    from packhorse.runtime.context import ProcessContext


def buffer_location_ids(ctx: "ProcessContext") -> list[int]:
    """Ids of every buffer location. The managers look for work among the present copies of
    these (an index search on ``physical_copies (location_id, status)``), never among every
    copy ever made, which grows with the archive."""
    return [i for n, i in ctx.topology.location_ids.items() if ctx.topology.location_role.get(n) is LocationRole.BUFFER]


def existing_keys(session: Session, keys: Iterable[str]) -> set[str]:
    """The subset of ``keys`` that already name an operation."""
    keys = list(keys)
    out: set[str] = set()
    for i in range(0, len(keys), 500):
        out.update(session.scalars(select(Operation.dedup_key).where(Operation.dedup_key.in_(keys[i:i + 500]))))
    return out


def create_missing(ctx: "ProcessContext", kind: OperationKind, wanted: dict[str, dict[str, Any]]) -> int:
    """Create the operations of ``wanted`` (``{dedup_key: create_operation kwargs}``) in one
    write transaction (one bulk statement); keys that exist meanwhile are skipped. Returns how
    many were created."""
    if not wanted:
        return 0

    return ctx.db.transact(lambda s: create_operations(s, kind=kind, max_retries=ctx.settings.recovery.max_retries,
                                                       wanted=wanted))


def new_only(session: Session, wanted: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``wanted`` without the keys that already name an operation."""
    have = existing_keys(session, wanted)
    return {k: v for k, v in wanted.items() if k not in have}


def planned(ctx: "ProcessContext", kind: OperationKind, repairs: "Plan | None" = None) -> dict[str, dict[str, Any]]:
    """The repair operations of ``kind`` the desired state asks for and that do not exist yet.

    Args:
        repairs: the manager cycle's :func:`packhorse.rules.convergence.plan`, derived once per
            cycle by :func:`packhorse.engine.pipeline.manager_cycle` for every manager; ``None``
            derives it now (read-only).
    """
    if repairs is not None and not repairs.wanted.get(kind):
        return {}  # the cycle's plan asks for nothing of this kind: no read at all

    def read(s: Session) -> dict[str, dict[str, Any]]:
        p = plan(s, ctx) if repairs is None else repairs
        return new_only(s, p.wanted.get(kind, {}))

    return ctx.db.read(read)
