"""The notification catalogue: one function per kind of message, each queuing it in the
caller's transaction through :func:`~packhorse.notify.outbox.enqueue` (issue #7, seed 002).

Subjects name the event in plain ASCII (``"Permanent failure: long_term_archive 17"``);
bodies are ``Label: value`` lines, then free text. Services use :func:`service_started`,
:func:`service_still_alive` and :func:`service_stopped`; the disk monitor uses
:func:`disk_level`; the single failure path uses :func:`operation_retry` (only in development
mode) besides its permanent-failure notification. The stalled-task monitor, the circuit
breakers and the reconciler queue their own messages (:mod:`packhorse.recovery`).

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


# ------------------------------------------------------------------ operations


def operation_retry(session: Session, error_context: dict[str, Any], *,
                    cooldown_seconds: float = DEFAULT_COOLDOWN_SECONDS) -> Notification | None:
    """DEBUG "Retry: <kind> <id>" rendered from the one error context (development mode only:
    the caller decides)."""
    kind, op_id = error_context["operation_kind"], error_context["operation_id"]
    return enqueue(session, level=NotificationLevel.DEBUG, event="operation_retry", subject=f"Retry: {kind} {op_id}",
                   body=render_error_context(error_context), context=error_context, operation_kind=kind,
                   operation_id=op_id, cooldown_seconds=cooldown_seconds)


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
               total_bytes: int, free_bytes: int, threshold_percent: float,
               measured_at: dt.datetime | None = None) -> Notification | None:
    """"Disk usage <event>: <location> at <p>%" for ``event`` one of ``warning`` (WARNING),
    ``critical`` (ERROR), ``emergency`` (CRITICAL), ``recovered`` (INFO). Queued once per
    crossing by the disk monitor (never cooled down: the monitor already sends one per crossing).
    ``percent`` is ``df``'s figure, used / (used + available); ``measured_at`` (UTC) is when."""
    fields = {"Location": location, "Used (%)": f"{percent:.1f}", "Threshold (%)": f"{threshold_percent:g}",
              "Measured (UTC)": measured_at, "Used (bytes)": f"{used_bytes:,}",
              "Available (bytes)": f"{free_bytes:,}", "Total (bytes)": f"{total_bytes:,}"}
    text = ("Usage is back below the recovery threshold." if event == "recovered" else
            "Deletions now follow the disk-pressure policy for this level (docs/deletion.md); "
            "see `packhorse usage`.")
    return enqueue(session, level=_DISK_LEVELS[event], event=f"disk_{event}",
                   subject=f"Disk usage {event}: {location} at {percent:.1f}%", body=render_lines(fields, text),
                   context={"location": location, "percent": percent, "used_bytes": used_bytes,
                            "measured_at": measured_at.isoformat() if measured_at else None,
                            "total_bytes": total_bytes, "free_bytes": free_bytes, "threshold_percent": threshold_percent},
                   cooldown_seconds=0)
