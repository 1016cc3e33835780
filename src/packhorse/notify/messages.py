"""The notification catalogue: one function per kind of message, each queuing it in the
caller's transaction through :func:`~packhorse.notify.outbox.enqueue` (issue #7, seed 002).

Subjects name the event in plain ASCII (``"Permanent failure: long_term_archive 17"``);
bodies are ``Label: value`` lines, then free text. The stalled-task monitor (issue #3) uses
:func:`stalled_recovered`, :func:`recovery_failed`, :func:`breaker_open`,
:func:`breaker_reset`, :func:`missing_handler` and :func:`forced_retry`; services use
:func:`service_started`, :func:`service_still_alive` and :func:`service_stopped`; the disk
monitor uses :func:`disk_level`; the single failure path uses :func:`operation_retry` (only in
development mode) besides its permanent-failure notification.

Every function returns what :func:`enqueue` returns (the row, or ``None`` when the cooldown
folded it into an earlier one).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from sqlalchemy.orm import Session

from ..db.models import Notification
from ..domain import NotificationLevel
from .outbox import enqueue, render_error_context

DEFAULT_COOLDOWN_SECONDS = 3600.0


def render_lines(fields: dict[str, Any], text: str | None = None) -> str:
    """``Label: value`` lines for the fields that are set (``None`` and ``""`` skipped), then
    ``text`` after a blank line. Dicts and lists are rendered as indented JSON."""
    lines = []
    for label, value in fields.items():
        if value is None or value == "":
            continue
        if isinstance(value, (dict, list)):
            value = json.dumps(value, indent=2, default=str, ensure_ascii=False)
        elif isinstance(value, dt.datetime):
            value = value.astimezone(dt.timezone.utc).isoformat(timespec="seconds")
        lines.append(f"{label}: {value}")
    if text:
        lines += ["", text]
    return "\n".join(lines)


def _op(session: Session, level: NotificationLevel, event: str, subject: str, kind: str, operation_id: int,
        fields: dict[str, Any], text: str | None, cooldown_seconds: float) -> Notification | None:
    context = {"operation_kind": kind, "operation_id": operation_id,
               **{k.lower().replace(" ", "_"): v for k, v in fields.items()}}
    return enqueue(session, level=level, event=event, subject=subject, body=render_lines(fields, text),
                   context=json.loads(json.dumps(context, default=str)), operation_kind=kind,
                   operation_id=operation_id, cooldown_seconds=cooldown_seconds)


# ------------------------------------------------------------------ operations, monitor


def operation_retry(session: Session, error_context: dict[str, Any], *,
                    cooldown_seconds: float = DEFAULT_COOLDOWN_SECONDS) -> Notification | None:
    """DEBUG "Retry: <kind> <id>" rendered from the one error context (development mode only:
    the caller decides)."""
    kind, op_id = error_context["operation_kind"], error_context["operation_id"]
    return enqueue(session, level=NotificationLevel.DEBUG, event="operation_retry", subject=f"Retry: {kind} {op_id}",
                   body=render_error_context(error_context), context=error_context, operation_kind=kind,
                   operation_id=op_id, cooldown_seconds=cooldown_seconds)


def stalled_recovered(session: Session, *, kind: str, operation_id: int, lease_owner: str | None,
                      stall_count: int, max_stall_count: int, details: dict[str, Any] | None = None,
                      cooldown_seconds: float = DEFAULT_COOLDOWN_SECONDS) -> Notification | None:
    """WARNING "Stalled operation recovered: <kind> <id>": its lease expired, it was reset for
    another attempt; the stall count against the circuit breaker's limit."""
    return _op(session, NotificationLevel.WARNING, "stalled_recovered",
               f"Stalled operation recovered: {kind} {operation_id}", kind, operation_id,
               {"Operation kind": kind, "Operation": operation_id, "Lease owner": lease_owner,
                "Stall count": stall_count, "Max stalls": max_stall_count, "Details": details or None},
               "The lease expired without completion; the operation was reset and will run again.",
               cooldown_seconds)


def recovery_failed(session: Session, *, kind: str, operation_id: int, error: str, stall_count: int,
                    cooldown_seconds: float = DEFAULT_COOLDOWN_SECONDS) -> Notification | None:
    """ERROR "Recovery failed: <kind> <id>": resetting a stalled operation raised ``error``."""
    return _op(session, NotificationLevel.ERROR, "recovery_failed", f"Recovery failed: {kind} {operation_id}",
               kind, operation_id, {"Operation kind": kind, "Operation": operation_id, "Stall count": stall_count,
                                    "Error": error},
               "The stalled-task monitor could not reset this operation; it stays as it is until a human looks.",
               cooldown_seconds)


def breaker_open(session: Session, *, kind: str, operation_id: int, stall_count: int, max_stall_count: int,
                 last_stall_at: dt.datetime | None, reset_after_seconds: float,
                 cooldown_seconds: float = DEFAULT_COOLDOWN_SECONDS) -> Notification | None:
    """ERROR "Circuit breaker open: <kind> <id>": automatic recovery is blocked until the breaker
    closes by itself after ``reset_after_seconds`` or an admin resets it."""
    return _op(session, NotificationLevel.ERROR, "breaker_open", f"Circuit breaker open: {kind} {operation_id}",
               kind, operation_id,
               {"Operation kind": kind, "Operation": operation_id, "Stall count": stall_count,
                "Max stalls": max_stall_count, "Last stall (UTC)": last_stall_at,
                "Closes by itself after (s)": int(reset_after_seconds)},
               "Automatic recovery is blocked. Find the cause (packhorse diagnose / the failure events), fix it,\n"
               f"then: packhorse breaker reset {kind} {operation_id} --reason '...'", cooldown_seconds)


def breaker_reset(session: Session, *, kind: str, operation_id: int, previous_stall_count: int,
                  reason: str | None, automatic: bool,
                  cooldown_seconds: float = DEFAULT_COOLDOWN_SECONDS) -> Notification | None:
    """INFO "Circuit breaker reset: <kind> <id>", by timeout (``automatic``) or by an admin."""
    return _op(session, NotificationLevel.INFO, "breaker_reset", f"Circuit breaker reset: {kind} {operation_id}",
               kind, operation_id,
               {"Operation kind": kind, "Operation": operation_id, "Previous stall count": previous_stall_count,
                "Reset by": "timeout" if automatic else "admin", "Reason": reason},
               "Automatic recovery may run again; a new stall counts towards a new breaker cycle.",
               cooldown_seconds)


def forced_retry(session: Session, *, kind: str, operation_id: int, reason: str | None,
                 cooldown_seconds: float = DEFAULT_COOLDOWN_SECONDS) -> Notification | None:
    """INFO "Forced retry: <kind> <id>": breaker reset, state reset, dispatched now."""
    return _op(session, NotificationLevel.INFO, "forced_retry", f"Forced retry: {kind} {operation_id}", kind,
               operation_id, {"Operation kind": kind, "Operation": operation_id, "Reason": reason},
               "The circuit breaker and the operation were reset; it is dispatched again.", cooldown_seconds)


def missing_handler(session: Session, *, kind: str, operation_id: int, status: str,
                    cooldown_seconds: float = DEFAULT_COOLDOWN_SECONDS) -> Notification | None:
    """ERROR "No recovery handler: <kind> <id>": nothing knows how to move this (kind, status)
    on (DESIGN.md I5; the seeds' bug #69)."""
    return _op(session, NotificationLevel.ERROR, "missing_handler", f"No recovery handler: {kind} {operation_id}",
               kind, operation_id, {"Operation kind": kind, "Operation": operation_id, "Status": status},
               "No component owns this operation kind in this status: it will not move without a human.",
               cooldown_seconds)


# ------------------------------------------------------------------ services


def _service_fields(service: str, host: str, pid: int, started_at: dt.datetime, now: dt.datetime) -> dict[str, Any]:
    return {"Service": service, "Host": host, "PID": pid, "Started (UTC)": started_at,
            "Uptime (s)": int((now - started_at).total_seconds())}


def service_started(session: Session, *, service: str, host: str, pid: int, started_at: dt.datetime,
                    settings: dict[str, Any] | None = None) -> Notification | None:
    """INFO "Service started: <service> on <host>" with its main settings (never cooled down)."""
    fields = {"Service": service, "Host": host, "PID": pid, "Started (UTC)": started_at, "Settings": settings or None}
    return enqueue(session, level=NotificationLevel.INFO, event="service_started",
                   subject=f"Service started: {service} on {host}", body=render_lines(fields),
                   context=json.loads(json.dumps(fields, default=str)), cooldown_seconds=0)


def service_still_alive(session: Session, *, service: str, host: str, pid: int, started_at: dt.datetime,
                        now: dt.datetime, status: dict[str, Any] | None = None) -> Notification | None:
    """INFO "Service still alive: <service> on <host>" (daily) with its uptime and status."""
    fields = {**_service_fields(service, host, pid, started_at, now), "Status": status or None}
    return enqueue(session, level=NotificationLevel.INFO, event="service_still_alive",
                   subject=f"Service still alive: {service} on {host}", body=render_lines(fields),
                   context=json.loads(json.dumps(fields, default=str)), cooldown_seconds=0)


def service_stopped(session: Session, *, service: str, host: str, pid: int, started_at: dt.datetime,
                    now: dt.datetime, reason: str) -> Notification | None:
    """WARNING "Service stopped: <service> on <host>" with the reason and the uptime."""
    fields = {**_service_fields(service, host, pid, started_at, now), "Stopped (UTC)": now, "Reason": reason}
    return enqueue(session, level=NotificationLevel.WARNING, event="service_stopped",
                   subject=f"Service stopped: {service} on {host}", body=render_lines(fields),
                   context=json.loads(json.dumps(fields, default=str)), cooldown_seconds=0)


# ------------------------------------------------------------------ disk usage

_DISK_LEVELS = {"warning": NotificationLevel.WARNING, "critical": NotificationLevel.ERROR,
                "emergency": NotificationLevel.CRITICAL, "recovered": NotificationLevel.INFO}


def disk_level(session: Session, *, location: str, event: str, percent: float, used_bytes: int,
               total_bytes: int, free_bytes: int, threshold_percent: float) -> Notification | None:
    """"Disk usage <event>: <location> at <p>%" for ``event`` one of ``warning`` (WARNING),
    ``critical`` (ERROR), ``emergency`` (CRITICAL), ``recovered`` (INFO). Queued once per
    crossing by the disk monitor (never cooled down: the monitor already sends one per crossing)."""
    fields = {"Location": location, "Used (%)": f"{percent:.1f}", "Threshold (%)": f"{threshold_percent:g}",
              "Used (bytes)": f"{used_bytes:,}", "Free (bytes)": f"{free_bytes:,}", "Total (bytes)": f"{total_bytes:,}"}
    text = ("Usage is back below the recovery threshold." if event == "recovered" else
            "Deletions now follow the disk-pressure policy for this level (docs/deletion.md); "
            "see `packhorse usage`.")
    return enqueue(session, level=_DISK_LEVELS[event], event=f"disk_{event}",
                   subject=f"Disk usage {event}: {location} at {percent:.1f}%", body=render_lines(fields, text),
                   context={"location": location, "percent": percent, "used_bytes": used_bytes,
                            "total_bytes": total_bytes, "free_bytes": free_bytes, "threshold_percent": threshold_percent},
                   cooldown_seconds=0)
