"""Problems first: one line per kind of problem, before any table (``status``, the overview, the
dashboard's banner).

One job: fold the FAILED operations a human must act on and the blocked work of
:mod:`packhorse.status.blocked_work` into a few lines an operator reads in a second: what kind
of problem, how many, since when, and whether a human is needed (red) or it resumes by itself
(yellow). An unavailable data location is its own line (``UNAVAILABLE``), never hidden among the
other waits. The input is the JSON form both ``status --json`` and the overview already carry,
so every surface shows the same lines.
"""

from __future__ import annotations

from typing import Any

from packhorse.time_text import utc_text

#: ``needs_human`` causes first, then what resumes by itself; the order lines are shown in
_ORDER = ("failed", "no_good_source", "service_missing", "site_unreachable", "link_unreachable", "location_unavailable", "lease_not_reclaimed", "dispatch_lost",
          "circuit_breaker", "scan_overdue", "location_full")

#: What each line says after its count (``{n}`` is the count), by cause.
_WHAT = {
    "failed": "operation(s): a human must act (packhorse diagnose KIND ID, then packhorse reset)",
    "no_good_source": "package(s) with no good copy or source left: a dead end only a human can release",
    "service_missing": "central service kind(s) with none running: the work only they move on waits",
    "site_unreachable": "site(s) unreachable (no worker heartbeat): cut off, or their workers down; their work waits",
    "link_unreachable": ("link(s) between sites cut (SSH): their transfers wait and resume from their partials "
                         "by themselves once the link is back"),
    "location_unavailable": "data location(s) unavailable: their work waits and resumes by itself once they are back",
    "lease_not_reclaimed": "operation(s) whose expired lease nothing took back: is a monitor running?",
    "dispatch_lost": "operation(s) whose dispatch was lost: the reconciler gave up until its cool-down ends",
    "circuit_breaker": "operation(s) held by an open circuit breaker until its cool-down ends",
    "scan_overdue": "source location(s) whose scan has not completed: new files are not registered",
    "location_full": "data location(s) full: their work waits for space",
}

#: The word a line starts with, by cause (FAILED and UNAVAILABLE are their own words).
_LABEL = {"failed": "FAILED", "location_unavailable": "UNAVAILABLE", "no_good_source": "DEAD END",
          "site_unreachable": "UNREACHABLE", "link_unreachable": "UNREACHABLE", "service_missing": "NOT RUNNING"}


#: Causes whose line names its subjects (at most three): services, sites, links between sites and data locations.
_NAMED = ("service_missing", "site_unreachable", "link_unreachable", "location_unavailable", "location_full")


def problem_lines(failed: list[dict[str, Any]], blocked: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The problem summary, one entry per cause that has anything, most urgent first.

    Args:
        failed: FAILED operations still undone, as ``status --json`` ``failed_operations`` holds
            them (each may carry ``failed_at``, ISO 8601 UTC).
        blocked: blocked items as ``status --json`` ``blocked`` holds them
            (:meth:`packhorse.status.blocked_work.BlockedItem.as_json`).

    Returns:
        ``[{"label": "FAILED" | "UNAVAILABLE" | "UNREACHABLE" | "NOT RUNNING" | "DEAD END" | "BLOCKED", "cause": str, "count": n,
        "since": ISO 8601 UTC of the oldest or None, "needs_human": bool, "text": str,
        "subjects": [str, ...] (at most 5)}]``; ``[]`` when nothing is wrong.
    """
    groups: dict[str, list[tuple[str, str | None, bool]]] = {}
    for f in failed:
        groups.setdefault("failed", []).append((f"{f['kind']} {f['id']}", f.get("failed_at"), True))
    for b in blocked:
        groups.setdefault(b["cause"], []).append((b["subject"], b.get("since"), b.get("exit_code") == 3))
    rank = {c: i for i, c in enumerate(_ORDER)}
    out = []
    for cause, items in sorted(groups.items(), key=lambda kv: (not any(h for _, _, h in kv[1]),
                                                               rank.get(kv[0], len(rank)), kv[0])):
        times = [t for _, t, _ in items if t]
        since = min(times) if times else None
        label = _LABEL.get(cause, "BLOCKED")
        what = _WHAT.get(cause, f"blocked by {cause.replace('_', ' ')}")
        named = ""
        if cause in _NAMED:  # few, and the name is what the operator acts on
            names = [subject for subject, _, _ in items[:3]]
            named = f" ({', '.join(names)}{', …' if len(items) > 3 else ''})"
        text = f"{label}: {len(items)} {what}{named}" + (f"; since {utc_text(since)} UTC" if since else "")
        out.append({"label": label, "cause": cause, "count": len(items), "since": since,
                    "needs_human": any(h for _, _, h in items), "text": text,
                    "subjects": [s for s, _, _ in items[:5]]})
    return out
