"""The notification catalogue: one function per kind of message, each queuing it in the
caller's transaction through :func:`~packhorse.notify.outbox.enqueue` (seed 002).

Subjects name the event in plain ASCII (``"Permanent failure: long_term_archive 17"``);
bodies are ``Label: value`` lines, then free text. Services use :func:`service_started`,
:func:`service_still_alive` and :func:`service_stopped`; the disk monitor uses
:func:`disk_level`; the single failure path uses :func:`operation_failed` (a digest per root
cause and cooldown window) and :func:`operation_retry` (only in development mode). The stalled-task monitor, the circuit
breakers and the reconciler queue their own messages (:mod:`packhorse.recovery`).

Every function returns what :func:`enqueue` returns (the row, or ``None`` when the cooldown
folded it into an earlier one).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

from sqlalchemy.orm import Session

from packhorse.db.models import (
    DataLocation,
    DataTransferPackage,
    Notification,
    Operation,
    PhysicalCopy,
    RawDataPackage,
    Site,
)
from packhorse.domain import NotificationLevel
from packhorse.notify.outbox import FOLLOW_UP_OF, ascii_subject, enqueue, render_error_context

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


# ------------------------------------------------------------------ source files


def source_files_vanished(session: Session, *, location: str, package: str, paths: list[str],
                          operation_id: int | None = None) -> Notification | None:
    """WARNING "Source file(s) gone before packaging: <location> <package>": registered files
    that were gone when their package was built (the ``raw_data_package`` stage took them out
    and built the package from the others; README "Versions"). Listed by ``packhorse status``
    under ``skipped`` until the path is registered again."""
    fields = {"Location": location, "Package": package, "Files": paths[:50],
              "More files": len(paths) - 50 if len(paths) > 50 else None}
    text = ("These files were registered but had vanished from the source when their package was built. "
            "The package was built from its other files; nothing of these files is archived. "
            "If they come back, the next scan registers and archives them. See `packhorse status` "
            "and `packhorse locate PATH`.")
    return enqueue(session, level=NotificationLevel.WARNING, event="source_files_vanished",
                   subject=f"Source file(s) gone before packaging: {location} {package}",
                   body=render_lines(fields, text),
                   context={"location": location, "package": package, "paths": paths},
                   operation_kind="raw_data_package", operation_id=operation_id, cooldown_seconds=0)


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


# ------------------------------------------------------------------ data locations


def location_unavailable(session: Session, *, location: str, reason: str, since: dt.datetime,
                         release: str) -> Notification | None:
    """"Data location unavailable: <location>" (WARNING), queued once per outage by
    :func:`packhorse.rules.availability.record_outage` with the outage's row (no cooldown needed)."""
    fields = {"Location": location, "Since (UTC)": since, "Reason": reason, "Release": release}
    text = ("Operations on this location wait (nothing is failed, nothing is written elsewhere) and resume by "
            "themselves when it is back; see `packhorse status`.")
    return enqueue(session, level=NotificationLevel.WARNING, event="location_unavailable",
                   subject=f"Data location unavailable: {location}", body=render_lines(fields, text),
                   context={"location": location, "reason": reason, "since": since.isoformat(), "release": release},
                   cooldown_seconds=0)


def location_available(session: Session, *, location: str, since: dt.datetime,
                       until: dt.datetime) -> Notification | None:
    """"Data location available again: <location>" (INFO), when its outage ends."""
    fields = {"Location": location, "Unavailable since (UTC)": since, "Back at (UTC)": until,
              "Outage (s)": f"{(until - since).total_seconds():.0f}"}
    return enqueue(session, level=NotificationLevel.INFO, event="location_available",
                   subject=f"Data location available again: {location}",
                   body=render_lines(fields, "The operations that waited on it are running again."),
                   context={"location": location, "since": since.isoformat(), "until": until.isoformat()},
                   cooldown_seconds=0)


# ------------------------------------------------------------------ permanent failures

#: A digest lists at most this many operations in its body (all of them stay in its context).
DIGEST_BODY_MAX = 50


def failure_where(session: Session, operation_id: int) -> dict[str, Any]:
    """Where a failed operation was: ``package`` (or ``bundle``), ``site``, ``source`` and
    ``destination`` data locations, ``key`` (the physical copy's path, if the operation is
    about one) — names, not ids; missing ones are ``None``."""
    op = session.get(Operation, operation_id)
    if op is None:
        return {}

    def name(model: Any, i: int | None) -> str | None:
        row = session.get(model, i) if i is not None else None
        return None if row is None else row.name

    copy = session.get(PhysicalCopy, op.physical_copy_id) if op.physical_copy_id else None
    return {"package": name(RawDataPackage, op.raw_data_package_id),
            "bundle": name(DataTransferPackage, op.data_transfer_package_id),
            "site": name(Site, op.site_id),
            "source": name(DataLocation, op.source_location_id or (copy.location_id if copy else None)),
            "destination": name(DataLocation, op.destination_location_id),
            "key": copy.path if copy else None}


def _masked(text: str, *literals: str | None) -> str:
    """``text`` with the parts that differ between operations of one cause masked: the given
    literals (package, key, …), quoted names, hex digests and numbers."""
    for lit in sorted({x for x in literals if x}, key=len, reverse=True):
        text = text.replace(lit, "…")
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text)
    text = re.sub(r"\b[0-9a-f]{16,}\b", "#", text)
    return re.sub(r"\d+", "N", text)


def failure_item(ctx: dict[str, Any], where: dict[str, Any]) -> dict[str, Any]:
    """One failed operation as a digest lists it (plain data)."""
    info = ctx.get("operation_info") or {}
    return {"operation_kind": ctx["operation_kind"], "operation_id": ctx["operation_id"],
            "package": where.get("package") or info.get("package"),
            "bundle": where.get("bundle") or info.get("bundle"),
            "site": where.get("site"),
            "source": where.get("source") or info.get("source") or info.get("location"),
            "destination": where.get("destination") or info.get("destination"),
            "key": ctx.get("path") or info.get("key") or where.get("key"),
            "host": ctx.get("host"),
            "worker_host": ctx.get("worker_host") or str(ctx.get("task_id") or "").split(":", 1)[0] or None,
            "error_type": ctx["error_type"], "message": ctx["message"], "timestamp": ctx.get("timestamp")}


def cause_key(item: dict[str, Any], ctx: dict[str, Any]) -> str:
    """The root-cause identity of a permanent failure: error type, step, the location where it
    happened and the message with what differs per operation masked (package, key, names,
    numbers). Failures of one cause share a cooldown window and a digest."""
    where = ctx.get("host") or item.get("destination") or item.get("source") or "-"
    message = _masked(str(ctx.get("message", "")), item.get("key"), item.get("package"), item.get("bundle"))
    return f"cause:{ctx['error_type']}:{ctx.get('step') or '-'}:{where}:{message}"


def _commands(items: list[dict[str, Any]]) -> list[str]:
    first = items[0]
    kinds = sorted({i["operation_kind"] for i in items})
    out = [f"packhorse diagnose {first['operation_kind']} {first['operation_id']}"]
    if first.get("package"):
        out.append(f"packhorse diagnose --package {first['package']}")
    if len(items) == 1:
        out.append(f"packhorse reset {first['operation_kind']} {first['operation_id']} --reason \"<what you fixed>\"")
    else:
        out += [f"packhorse reset {k} --all-failed --reason \"<what you fixed>\"" for k in kinds]
    return out


def _where_lines(i: dict[str, Any]) -> dict[str, Any]:
    return {"Package": i.get("package"), "Bundle": i.get("bundle"), "Site": i.get("site"),
            "Source location": i.get("source"), "Destination location": i.get("destination"), "Key": i.get("key"),
            "Location": i.get("host") if i.get("host") not in (i.get("source"), i.get("destination")) else None,
            "Host": i.get("worker_host")}


def render_failure(context: dict[str, Any]) -> tuple[str, str]:
    """Subject and body of a permanent-failure notification from its context (the first
    failure's error context plus ``failures``: every operation of the cause in this window).

    The body says what failed, where (package, site, source and destination location, key,
    the location it happened at when neither of those, and the host — the machine the attempt
    ran on, never a data location), why (error type, message, step, diagnosis) and what to do next with the exact
    commands; a digest lists every operation, then the first failure in full."""
    items: list[dict[str, Any]] = context["failures"]
    first = items[0]
    n = len(items)
    kinds = sorted({i["operation_kind"] for i in items})
    where = context.get("host") or first.get("destination") or first.get("source") or first.get("site")
    if n == 1:
        subject = f"Permanent failure: {first['operation_kind']} {first['operation_id']}"
        what = (f"{first['operation_kind']} operation {first['operation_id']}"
                + (f" of package {first['package']}" if first.get("package") else
                   f" of bundle {first['bundle']}" if first.get("bundle") else "")
                + f" failed permanently (after {context.get('retry_count', 0)} retries); nothing more is tried"
                " until you reset it.")
    else:
        subject = f"Permanent failure x{n} ({', '.join(kinds)}): {context['error_type']} at {where}"
        what = (f"{n} operations ({', '.join(kinds)}) failed permanently with one cause"
                + (" since the last message about it (follow-up after the cooldown)"
                   if context.get(FOLLOW_UP_OF) else "") + "; nothing more is tried until you reset them.")
    parts = ["What failed: " + what, ""]
    if n == 1:
        parts += ["Where:", render_lines(_where_lines(first)), ""]
    parts += ["Why:", render_lines({"Error type": context.get("error_type"), "Error": context.get("message"),
                                    "Step": context.get("step"), "Side": context.get("side"),
                                    "Diagnosis": context.get("diagnosis"),
                                    "Diagnosis source": context.get("diagnosis_source")}), ""]
    if n > 1:
        parts.append(f"Operations ({n}):")
        for i in items[:DIGEST_BODY_MAX]:
            loc = " -> ".join(x for x in (i.get("source"), i.get("destination")) if x)
            parts.append(f"  {i['operation_kind']} {i['operation_id']}"
                         + (f"  package {i['package']}" if i.get("package") else "")
                         + (f"  bundle {i['bundle']}" if i.get("bundle") else "")
                         + (f"  key {i['key']}" if i.get("key") else "")
                         + (f"  {loc}" if loc else "") + (f"  site {i['site']}" if i.get("site") else "")
                         + (f"  at {i['timestamp'][:19]}" if i.get("timestamp") else ""))
        if n > DIGEST_BODY_MAX:
            parts.append(f"  … and {n - DIGEST_BODY_MAX} more (`packhorse overview`, the dashboard)")
        parts.append("")
    parts += ["What to do next:", "  1. See the diagnosis and the copies: " + _commands(items)[0]]
    cmds = _commands(items)
    if first.get("package"):
        parts.append("     (every operation of the package: " + cmds[1] + ")")
    parts.append("  2. Fix the cause above (the diagnosis says where to look).")
    parts += ["  3. Hand " + ("it" if n == 1 else "them") + " back to packhorse: " + c
              for c in cmds if c.startswith("packhorse reset")]
    parts += ["", "First failure in full:" if n > 1 else "Details:", render_error_context(context)]
    return subject, "\n".join(parts)


def operation_failed(session: Session, error_context: dict[str, Any], *, cooldown_seconds: float,
                     gather_seconds: float) -> Notification | None:
    """ERROR "Permanent failure: <kind> <id>" for an operation marked FAILED, queued in the
    caller's transaction (I1), rendered from the one error context and the operation's place
    (:func:`failure_where`).

    Failures of one root cause (:func:`cause_key`) are one message per cooldown window: the
    first waits ``gather_seconds`` (seconds) for the others, which are listed in it (a digest,
    "Permanent failure x10 (long_term_archive): DestinationWriteError at cologne-lta"); those
    after it was sent are listed in a follow-up sent when the window ends
    (:func:`~packhorse.notify.outbox.enqueue`)."""
    kind, op_id = error_context["operation_kind"], error_context["operation_id"]
    item = failure_item(error_context, failure_where(session, op_id))
    context = {**error_context, "failures": [item]}
    subject, body = render_failure(context)

    def merge(row: Notification) -> tuple[str, str, dict[str, Any]]:
        merged = {**(row.context or {})}
        # one line per operation: an operation reset and failed again within the window is
        # listed once, at its place, with its latest failure
        earlier = merged.get("failures", [])
        if any(f.get("operation_id") == op_id and f.get("operation_kind") == kind for f in earlier):
            merged["failures"] = [item if (f.get("operation_id"), f.get("operation_kind")) == (op_id, kind) else f
                                  for f in earlier]
        else:
            merged["failures"] = [*earlier, item]
        s, b = render_failure(merged)
        return s, b, merged

    row = enqueue(session, level=NotificationLevel.ERROR, event="permanent_failure", subject=subject, body=body,
                  context=context, operation_kind=kind, operation_id=op_id, cooldown_seconds=cooldown_seconds,
                  key=cause_key(item, error_context), gather_seconds=gather_seconds, merge=merge)
    if row is not None and (row.context or {}).get(FOLLOW_UP_OF):  # says it follows an earlier message
        follow_subject, row.body = render_failure(row.context or {})
        row.subject = ascii_subject(follow_subject)
    return row


# ------------------------------------------------------------------ repaired before the digest went out

#: Context key of a reviewed digest: the failures repaired without a human before it was sent.
REPAIRED = "repaired"


def _repaired_lines(items: list[dict[str, Any]]) -> list[str]:
    out = []
    for i in items[:DIGEST_BODY_MAX]:
        out.append(f"  {i['operation_kind']} {i['operation_id']}"
                   + (f"  package {i['package']}" if i.get("package") else "")
                   + (f"  bundle {i['bundle']}" if i.get("bundle") else "")
                   + (f"  failed at {i['timestamp'][:19]}" if i.get("timestamp") else "")
                   + (f"  now: {i['now']}" if i.get("now") else ""))
    if len(items) > DIGEST_BODY_MAX:
        out.append(f"  … and {len(items) - DIGEST_BODY_MAX} more")
    return out


def review_failures(row: Notification, still_failed: set[tuple[str, int]],
                    resolution: dict[tuple[str, int], str] | None = None) -> str:
    """Re-decide a permanent-failure digest ``row`` just before it is sent: only the failures
    in ``still_failed`` (``(kind, operation id)``) still need a human; the others were repaired
    without one meanwhile (the convergence made their work by other means; ``resolution`` says
    how, per operation). Changes the row in the caller's transaction and returns what it
    decided:

    * ``"unchanged"``: every listed failure still needs a human (an ERROR page, as queued);
    * ``"partly_repaired"``: ERROR, listing only what still needs a human, with the repaired
      ones named below at INFO weight ("Repaired meanwhile, no action needed");
    * ``"repaired"``: nothing needs a human: level INFO, event ``failure_repaired``, subject
      "Repaired without you: …" — channels that only take ERROR never see it (no page).

    Idempotent: failures repaired at an earlier review are kept in the context (``repaired``)
    and judged again, so a row reviewed twice (a delivery retried, a failure merged into it
    after a review) says the same as one reviewed once. I1 holds either way: every FAILED
    operation keeps a notification, only its level says whether a human is needed.
    """
    ctx = dict(row.context or {})
    seen: dict[tuple[str, int], dict[str, Any]] = {}
    for i in [*ctx.get(REPAIRED, []), *ctx.get("failures", [])]:
        seen[(i["operation_kind"], int(i["operation_id"]))] = i
    if not seen:
        return "unchanged"
    how = resolution or {}
    needs = [i for k, i in seen.items() if k in still_failed]
    repaired = [{**i, "now": how.get(k) or i.get("now")} for k, i in seen.items() if k not in still_failed]
    if not repaired and row.level == NotificationLevel.ERROR.value:
        return "unchanged"
    if needs:
        new_ctx = {**ctx, "failures": needs, REPAIRED: repaired}
        subject, body = render_failure(new_ctx)
        if repaired:
            body += "\n\n" + "\n".join([f"Repaired meanwhile without a human ({len(repaired)}; no action needed):",
                                         *_repaired_lines(repaired)])
        row.level, row.event = NotificationLevel.ERROR.value, "permanent_failure"
        decided = "partly_repaired" if repaired else "unchanged"
    else:
        new_ctx = {**ctx, "failures": [], REPAIRED: repaired}
        first = repaired[0]
        kinds = sorted({i["operation_kind"] for i in repaired})
        subject = (f"Repaired without you: {first['operation_kind']} {first['operation_id']}" if len(repaired) == 1
                   else f"Repaired without you x{len(repaired)} ({', '.join(kinds)}): {ctx.get('error_type')}")
        text = (f"{len(repaired)} operation(s) failed permanently and were repaired by packhorse before this message "
                "went out (a later operation made the same copy, or the package is archived): nothing needs "
                "doing. The failed rows stay as history (`packhorse history`); `packhorse status` does not "
                "count them.")
        body = "\n".join(["What happened: " + text, "", "Repaired:", *_repaired_lines(repaired), "",
                          "First failure in full:", render_error_context(ctx)])
        row.level, row.event = NotificationLevel.INFO.value, "failure_repaired"
        decided = "repaired"
    row.subject, row.body, row.context = ascii_subject(subject), body, new_ctx
    return decided
