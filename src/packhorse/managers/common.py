"""Helpers shared by the managers: bulk existence checks of operations by dedup key."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..db.models import Operation


def existing_keys(session: Session, keys: Iterable[str]) -> set[str]:
    """The subset of ``keys`` that already name an operation."""
    keys = list(keys)
    out: set[str] = set()
    for i in range(0, len(keys), 500):
        out.update(session.scalars(select(Operation.dedup_key).where(Operation.dedup_key.in_(keys[i:i + 500]))))
    return out
