"""The audit log of admin actions: who, what, when, result.

Every state-changing action of the HTTP API and of the CLI (reset, reconcile, breaker reset,
force retry, runtime setting change, token create/revoke, live check) appends one
:class:`~packhorse.db.models.AuditEntry` after it ran, with its result: ``ok``, ``refused``
(the action was not allowed in the current state, e.g. resetting an operation that is not
FAILED) or ``error``. Entries are never updated or deleted by packhorse.

``packhorse verify`` (the operator's audit of the copies) also appends one
:data:`COPY_FOUND_BAD` entry per copy it found bad, in the transaction that marks the copy, so
``packhorse locate`` can tell a copy the operator's audit found from one the scheduled fixity
check found.
"""

from __future__ import annotations

import getpass
import socket
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from packhorse.db.models import AuditEntry, utcnow
from packhorse.db.session import Database
from packhorse.names import json_safe

RESULTS = ("ok", "refused", "error")
#: The action of a copy ``packhorse verify`` found bad (target ``physical_copy/<id>``; details:
#: ``location``, ``path``, ``status``).
COPY_FOUND_BAD = "copy.found_bad"


def cli_actor() -> str:
    """The actor name of a command-line user: ``cli:<user>@<host>``."""
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry (containers)
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"


def record(db: Database, *, actor: str, action: str, target: str | None = None,
           details: dict[str, Any] | None = None, result: str = "ok", message: str | None = None) -> None:
    """Append one audit entry in its own transaction.

    Args:
        actor: ``token:<name>`` (HTTP API) or ``cli:<user>@<host>``.
        action: what was done, e.g. ``operation.reset``, ``settings.set``.
        target: what it was done to, e.g. ``transfer/12``.
        details: JSON-serialisable parameters (reason, new value, ids changed).
        result: one of :data:`RESULTS`.
        message: the refusal or error text, if any.

    Raises:
        ValueError: ``result`` is not one of :data:`RESULTS`.
    """
    db.transact(lambda s: add(s, actor=actor, action=action, target=target, details=details, result=result,
                              message=message))


def add(session: Session, *, actor: str, action: str, target: str | None = None,
        details: dict[str, Any] | None = None, result: str = "ok", message: str | None = None) -> None:
    """:func:`record` inside the caller's transaction (the entry commits with the change it
    records, or not at all). Same arguments.

    Raises:
        ValueError: ``result`` is not one of :data:`RESULTS`.
    """
    if result not in RESULTS:
        raise ValueError(f"audit result must be one of {RESULTS}, not {result!r}")
    # text from a request may hold a lone surrogate: stored as its escape, so every reader
    # (``packhorse audit``, the API) can encode what it reads back
    session.add(AuditEntry(at=utcnow(), actor=json_safe(actor[:200]), action=json_safe(action),
                           target=json_safe(target), details=json_safe(details), result=result,
                           message=json_safe(message)))


def copy_target(copy_id: int) -> str:
    """The audit target naming physical copy ``copy_id``: ``physical_copy/<id>``."""
    return f"physical_copy/{copy_id}"


def entries(session: Session, *, limit: int = 100, action: str | None = None) -> list[dict[str, Any]]:
    """The newest ``limit`` entries (newest first), optionally of one ``action``.

    Shape: ``[{"id", "at" (ISO UTC), "actor", "action", "target", "details", "result", "message"}]``.
    """
    q = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)
    if action:
        q = q.where(AuditEntry.action == action)
    # json_safe: an entry written before record() made its text safe reads back readable too
    return [json_safe({"id": e.id, "at": e.at.isoformat(), "actor": e.actor, "action": e.action, "target": e.target,
                       "details": e.details, "result": e.result, "message": e.message}) for e in session.scalars(q)]
