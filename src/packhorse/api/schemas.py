"""Response and request models of the HTTP API (the OpenAPI schema is generated from them).

Every model forbids fields it does not declare: the overview models in particular declare no
error, traceback, message or diagnosis field, so none can ever be served to an observer.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from packhorse.runtime.settings import KEYS, value_schemas


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Problem(_Model):
    """An error answer: what went wrong, in words."""

    detail: Any


class BodyProblem(_Model):
    """The answer to a request body that cannot be read at all (not UTF-8, not parsable): 400."""

    detail: Literal["There was an error parsing the body"]


class WhoAmI(_Model):
    name: str
    role: Literal["kiosk", "observer", "admin"]


class OverviewCount(_Model):
    kind: str
    location: str | None
    status: str
    count: int


class OverviewOperation(_Model):
    kind: str
    operation_id: int
    package: str | None
    location: str | None
    status: str
    stalled: bool
    retry_count: int
    max_retries: int
    updated_at: str | None


class BlockedOut(_Model):
    """One piece of blocked work (:class:`packhorse.status.blocked_work.BlockedItem`): what waits, on what,
    and the command that releases it. No error text."""

    cause: str = Field(description="no_good_source, service_missing, circuit_breaker, dispatch_lost, lease_not_reclaimed, site_unreachable, link_unreachable, scan_overdue, "
                                   "location_unavailable, location_full")
    subject: str = Field(description='what is blocked, e.g. "transfer 17"')
    reason: str
    release: str = Field(description="the command that releases it")
    exit_code: int = Field(description="run --until-idle exit code it causes: 3 needs a human, 4 waits")
    since: str | None
    detail: dict[str, Any] | None


class ProblemOut(_Model):
    """One line of the problem summary (:func:`packhorse.status.problems.problem_lines`): a kind of
    problem, how many, since when. No error text."""

    label: str = Field(description="FAILED, DEAD END, UNAVAILABLE or BLOCKED")
    cause: str = Field(description="failed, or the blocked work's cause")
    count: int
    since: str | None = Field(description="the oldest, ISO 8601 UTC")
    needs_human: bool = Field(description="true: a human must act (shown red); false: it resumes by itself")
    text: str
    subjects: list[str] = Field(description="the first five, e.g. \"transfer 17\"")


class Overview(_Model):
    """The pipeline overview: what is stuck, never why."""

    generated_at: str
    counts: list[OverviewCount]
    totals: dict[str, int]
    stalled: int
    operations: list[OverviewOperation]
    truncated: bool
    blocked: list[BlockedOut] = Field(default_factory=list,
                                      description="blocked work, as `packhorse status --json` lists it")
    problems: list[ProblemOut] = Field(default_factory=list,
                                       description="one line per kind of problem, most urgent first (the banner)")


class Kiosk(_Model):
    """A wallboard's view (``GET /api/kiosk``): problems first, totals, unavailable locations.
    No error text, no paths."""

    generated_at: str
    problems: list[ProblemOut]
    totals: dict[str, int] = Field(description="operations by status")
    unavailable_locations: list[str] = Field(description="names of the data locations that are unavailable now")


class DiskUsageOut(_Model):
    total_bytes: int
    used_bytes: int
    free_bytes: int
    percent: float = Field(description="used / (used + available) x 100, as df")
    level: str = Field(description="normal, warning, critical or emergency")
    measured_at: dt.datetime


class LocationOut(_Model):
    name: str
    site: str
    role: str
    storage: str
    active: bool
    copies: int = Field(description="present physical copies")
    bytes: int = Field(description="bytes of present physical copies")
    disk: DiskUsageOut | None = Field(description="latest disk usage sample (None: not measured yet, or not a disk)")


class OperationSnapshot(_Model):
    id: int
    kind: str
    status: str
    stalled: bool
    attempt: int = Field(description="the fencing token: one more per claim, claims that only waited included")
    attempt_words: str = Field(description='"attempt N", or "claim N" when claims that waited (no failure) came '
                                           "between")
    retry_count: int
    max_retries: int
    stall_count: int
    site: str | None
    source_location: str | None
    destination_location: str | None
    raw_data_package: str | None
    data_transfer_package: str | None
    physical_copy_id: int | None
    lease_owner: str | None
    lease_expires_at: str | None
    heartbeat_at: str | None
    not_before: str | None
    created_at: str | None
    updated_at: str | None
    scheduled_at: str | None
    started_at: str | None
    finished_at: str | None
    bytes_done: int
    error_context: dict[str, Any] | None


class FailureEventOut(_Model):
    id: int
    created_at: str | None
    attempt: int = Field(description="the claim (fencing token) the failure happened at")
    failure: str = Field(description='"failure K" (the K-th failure of the operation), with "(claim N)" when claims '
                                     "that waited came between")
    retry_count: int
    error_type: str
    message: str
    will_retry: bool
    error_context: dict[str, Any]


class CopyPresence(_Model):
    artifact: Literal["raw_data_package", "data_transfer_package"]
    name: str
    location: str
    site: str
    role: str
    storage: str
    status: str = Field(description="a physical copy status, or 'absent'")
    copy_id: int | None
    path: str | None
    size: int | None
    sha256: str | None
    verified_at: str | None
    deleted_at: str | None


class BreakerOut(_Model):
    kind: str
    operation_id: int
    stall_count: int
    last_stall_at: str | None
    state: Literal["open", "half_open", "closed"] = Field(
        description="open: held for a cool-down; half_open: one attempt let through; closed")
    trips: int = Field(description="times opened since it last closed")
    opened_at: str | None
    next_attempt_at: str | None = Field(description="while open: when one attempt is let through by itself (UTC)")
    half_open_at: str | None = Field(description="while half-open: when the attempt was let through (UTC)")


class ForceRetryResult(_Model):
    kind: str
    operation_id: int
    previous_status: str
    status: str


class ServiceOut(_Model):
    service: str = Field(description="the identity: kind[:site][:instance]@host (never a PID)")
    kind: str
    site: str | None
    instance: str | None
    host: str
    pid: int = Field(description="the current (or last) process")
    started_at: str | None
    last_seen: str | None
    age_seconds: float
    restarts: int = Field(description="times a restarted process took this service over")
    alive: bool
    clock_offset_seconds: float | None = Field(None, description="how far its host's clock is from the database's "
                                                                 "(s, database minus host; null: not recorded)")


class Health(_Model):
    """``packhorse health --json``'s report (:class:`packhorse.status.health.HealthReport`)."""

    services: list[ServiceOut]
    dead: int = Field(description="how many services are dead (no heartbeat for service_dead_after_seconds)")
    scans_overdue: list[dict[str, Any]] = Field(
        description="source locations whose scan has not completed for longer than scan_overdue_seconds")
    no_monitor: bool = Field(description="workers or managers run but no monitor does")
    leases_not_reclaimed: list[BlockedOut]
    sites_unreachable: list[BlockedOut] = Field(
        description="sites none of whose workers sent a heartbeat for service_dead_after_seconds, since when")


class DiagnosticReport(_Model):
    operation: OperationSnapshot
    failure_events: list[FailureEventOut] = Field(description="newest first; kept across resets")
    copies: list[CopyPresence]
    breaker: BreakerOut | None
    diagnosis: str
    diagnosis_source: str
    generated_at: str


class PackageDiagnosis(_Model):
    package: str
    type: Literal["raw_data_package", "data_transfer_package"]
    reports: list[DiagnosticReport]


class LiveCheckTicket(_Model):
    correlation_id: str
    state: Literal["pending"]
    expires_at: str


class LiveCheckState(_Model):
    correlation_id: str
    kind: str
    operation_id: int
    state: Literal["pending", "done", "failed"]
    requested_at: str | None
    expires_at: str | None
    result: dict[str, Any] | None


class ActionRequest(_Model):
    """Optional body of an admin action: why (kept in the audit log)."""

    reason: str | None = Field(None, max_length=2000)


class ResetResult(_Model):
    kind: str
    reset: list[int]
    count: int


class ReconcileResult(_Model):
    package_id: int
    name: str
    changed: bool
    change: str | None
    archived: bool


class ReconcileAllResult(_Model):
    checked: int
    changed: list[dict[str, Any]]


class SettingOut(_Model):
    key: Annotated[str, Field(json_schema_extra={"enum": list(KEYS)})]
    value: Any
    default: Any
    source: Literal["runtime", "file"]
    description: str
    updated_at: str | None
    updated_by: str | None


class SettingIn(_Model):
    """A runtime setting's new value; which values a key accepts is in the schema (one
    alternative per key, titled with it: :func:`packhorse.runtime.settings.value_schemas`)."""

    value: Annotated[str | float | int, Field(json_schema_extra={"anyOf": value_schemas()})]


class AuditOut(_Model):
    id: int
    at: str
    actor: str
    action: str
    target: str | None
    details: Any
    result: str
    message: str | None


class LocateFile(_Model):
    location: str
    path: str
    version: int = Field(description="the k-th content of the path that was registered for packaging (README 'Versions')")
    size: int
    sha256: str
    mtime: str
    registered_at: str | None
    source_deleted_at: str | None
    package: str | None
    withdrawn: str | None = Field(default=None, description="why this registration was taken out of its package "
                                                            "before it was built (changed or vanished), else None")
    found_by: str | None = Field(default=None, description="source_audit: the source audit registered this version "
                                                           "(content changed behind an unchanged size and mtime); "
                                                           "None: the scan")
    why: str | None = Field(default=None, description="why a version the source audit registered exists")


class LocateCopy(_Model):
    artifact: Literal["raw_data_package", "data_transfer_package"]
    location: str
    site: str
    role: str
    status: str
    path: str
    size: int
    sha256: str
    created_at: str | None
    verified_at: str | None = Field(description="when its bytes were last read back and matched")
    deleted_at: str | None
    found_bad_at: str | None = Field(default=None, description="when it was last found corrupt or missing (UTC)")
    quarantined_as: str | None = Field(default=None, description="the key under its location its bad bytes were "
                                       "moved aside to (_packhorse/quarantine/...); None if never")
    quarantined_at: str | None = Field(default=None, description="when they were moved aside (UTC)")


class TimelineEvent(_Model):
    at: str | None
    event: str = Field(description="registered, packaged, bundled, shipped, unpacked, archived, staged, "
                                   "fixity checked, found corrupt, found missing, quarantined, repaired, deleted, attempt failed, … failed, archived everywhere")
    kind: str | None
    operation_id: int | None
    status: str | None
    location: str | None
    detail: str | None
    error_type: str | None = Field(description="admins only (None for an observer)")
    message: str | None = Field(description="admins only (None for an observer)")


class LocatePackage(_Model):
    name: str
    type: Literal["raw_data_package", "data_transfer_package"]
    version: int | None = Field(default=None, description="a raw data package's version (1, 2, …); None for a bundle")
    group: str | None
    size: int | None
    sha256: str | None
    file_count: int
    payload_bytes: int | None
    created_at: str | None
    archived_at: str | None
    bundle: str | None
    members: list[str] | None = None
    copies: list[LocateCopy]
    bundle_copies: list[LocateCopy]
    timeline: list[TimelineEvent] = Field(description="oldest first")
    files: list[LocateFile]


class LocateSkipped(_Model):
    """A source path the scan could not register (``packhorse status --skipped``)."""

    location: str
    path: str
    reason: str
    first_seen_at: str | None
    last_seen_at: str | None


class LocateResult(_Model):
    """Where is my file: every version, its package, every copy and its history."""

    query: str
    matched: Literal["package", "bundle", "file", "folder", "skipped"] | None
    versions: list[LocateFile]
    packages: list[LocatePackage]
    truncated: bool
    skipped: list[LocateSkipped] = Field(default_factory=list, description="the path as the scan skipped it: "
                                         "never archived, with the reason")
    also_folder: bool | None = Field(None, description="for a package: its name is also a source folder holding "
                                                       "other packages' files, which the query with a trailing / "
                                                       "lists")


class FailureGroupOperation(_Model):
    operation_id: int
    package: str | None
    updated_at: str | None
    retry_count: int
    max_retries: int


class FailureGroup(_Model):
    kind: str
    location: str | None
    error_type: str
    count: int
    first_at: str | None
    last_at: str | None
    sample_message: str | None
    operations: list[FailureGroupOperation] = Field(description="newest first, at most 200")


class FailureGroups(_Model):
    """FAILED operations grouped by cause: (kind, location, error type), largest first."""

    groups: list[FailureGroup]
    failed: int
    truncated: bool


class GroupResetRequest(_Model):
    """Reset every FAILED operation of one failure group."""

    kind: Literal["raw_data_package", "data_transfer_package", "transfer", "unpack", "long_term_archive",
                  "staging", "deletion", "fixity_check"]
    location: str | None = Field(max_length=100)
    error_type: str = Field(min_length=1, max_length=200)
    reason: str = Field(min_length=1, max_length=2000, description="why (kept in the audit log)")


class ThroughputSeries(_Model):
    bytes_per_minute: list[float]
    files_per_minute: list[float]


class BacklogSeries(_Model):
    waiting: list[int | None]
    running: list[int | None]
    failed: list[int | None]


class DiskSeries(_Model):
    percent: list[float | None]
    used_bytes: list[int | None]
    total_bytes: int | None


class History(_Model):
    """The pipeline over time on one grid (``times``: Unix seconds of each interval's start)."""

    since: str
    until: str
    step_seconds: int
    times: list[int]
    throughput: dict[str, ThroughputSeries]
    backlog: dict[str, BacklogSeries]
    failures: dict[str, list[int]]
    disk: dict[str, DiskSeries]
    thresholds: dict[str, float]


class QuarantineEntryOut(_Model):
    """One entry of a disk location's quarantine (:func:`packhorse.actions.quarantine.entry_dict`)."""

    location: str
    key: str
    original_key: str | None
    quarantined_at: str | None = Field(description="when it was moved aside, ISO 8601 UTC (None: unknown)")
    age_seconds: float | None
    kind: str = Field(description="file, folder or other")
    size_bytes: int


class QuarantineNotListed(_Model):
    location: str
    cause: str = Field(description="object_storage, unavailable or unreadable")
    reason: str


class QuarantineLocationOut(_Model):
    count: int
    bytes: int


class QuarantineListing(_Model):
    """What the quarantines of the disk locations hold now, read from the API host's disks."""

    entries: list[QuarantineEntryOut]
    locations: dict[str, QuarantineLocationOut]
    not_listed: list[QuarantineNotListed]
    min_retention_seconds: float


class QuarantinePurgeIn(_Model):
    older_than_days: float = Field(ge=0, description="remove entries moved aside more than this many days ago")
    reason: str = Field(min_length=1, max_length=2000, description="why they may go (audited)")
    location: str | None = Field(None, max_length=200)
    dry_run: bool = False


class QuarantineFailed(_Model):
    location: str
    key: str
    error: str


class QuarantinePurgeOut(_Model):
    removed: list[QuarantineEntryOut]
    removed_bytes: int
    kept: int
    failed: list[QuarantineFailed]
    not_listed: list[QuarantineNotListed]
    dry_run: bool
