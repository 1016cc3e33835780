"""SQLAlchemy models of the ops database, the single source of truth.

Foreign keys, check constraints on every enum column and the unique keys live in the schema
itself (on SQLite and PostgreSQL alike), so a bug in code cannot write a free-text kind, a
second live physical copy, or a duplicate operation (DESIGN.md I3, I5).

Times are timezone-aware UTC ``datetime`` values (:class:`UTCDateTime`); sizes are bytes;
``sha256`` is 64 lowercase hex characters.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    and_,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from packhorse.db import clock
from packhorse.domain import (
    LIVE_COPY_STATUSES,
    BreakerState,
    CopyStatus,
    DiskLevel,
    LocationRole,
    NotificationLevel,
    NotificationStatus,
    OperationKind,
    Status,
    StorageType,
    enum_values,
)

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> dt.datetime:
    """The current time by the database's clock, timezone-aware UTC (:func:`packhorse.db.clock.now`:
    this host's clock plus this process's measured offset to the database's), so that every
    process, on every host, writes and judges leases, heartbeats and ages by one clock."""
    return clock.now()


class UTCDateTime(TypeDecorator[dt.datetime]):
    """A timestamp stored as UTC and always returned timezone-aware (SQLite keeps no zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(dt.timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.timezone.utc)
        return value.astimezone(dt.timezone.utc)


def _in(column: str, values: list[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


_LIVE = _in("status", [s.value for s in LIVE_COPY_STATUSES])


class Base(DeclarativeBase):
    """Declarative base with a constraint naming convention (stable migration names)."""

    metadata = MetaData(naming_convention=NAMING)


class Site(Base):
    """A place with storage and workers (mirrors ``[[sites]]``)."""

    __tablename__ = "sites"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)


class DataLocation(Base):
    """A storage area at a site (mirrors ``[[locations]]``); ``uri`` is its root path or URL;
    ``marker_uuid`` the ``uuid`` of the identity marker ``packhorse init`` found or wrote at its
    root (``None`` until then): storage whose marker has another uuid is not this location's,
    even if it names it (DESIGN.md "Storage that is absent is not empty"). ``fingerprint`` is the
    identity of a read-only source, which carries no marker (nothing is written there): the
    JSON of :func:`packhorse.storage.identity.root_fingerprint` recorded by ``packhorse init``
    (``None`` for every other location)."""

    __tablename__ = "data_locations"
    __table_args__ = (
        CheckConstraint(_in("role", enum_values(LocationRole)), name="role"),
        CheckConstraint(_in("storage_type", enum_values(StorageType)), name="storage_type"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    site_id: Mapped[int] = mapped_column(ForeignKey("sites.id"))
    role: Mapped[str] = mapped_column(String(32))
    storage_type: Mapped[str] = mapped_column(String(16))
    uri: Mapped[str] = mapped_column(Text)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    marker_uuid: Mapped[str | None] = mapped_column(String(64), nullable=True)
    fingerprint: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class RawDataFile(Base):
    """One version of a file produced at a source location, registered with size, sha256 and
    mtime (bytes, hex, ns since the epoch UTC).

    ``version`` counts the contents of one path that were packaged: 1 for the first; a path
    whose bytes change after its package was built is registered again as ``version + 1``
    (README "Versions"; the earlier version stays archived, written once, I2). A registration
    whose bytes changed or vanished *before* its package was built is moved to
    :class:`WithdrawnFile` instead, and the path is registered again under the same version.
    """

    __tablename__ = "raw_data_files"
    __table_args__ = (
        UniqueConstraint("location_id", "relative_path", "version"),
        CheckConstraint("size >= 0", name="size"),
        CheckConstraint("length(sha256) = 64", name="sha256"),
        # a group's unpackaged files are found without reading the rest of the backlog; a
        # package's files by their package (migration 0007: every lookup of a manager or stage
        # is an index search, never a scan of a table that grows with the archive)
        Index("ix_raw_data_files_unpackaged", "location_id", "raw_data_package_id", "group_path"),
        Index("ix_raw_data_files_raw_data_package_id", "raw_data_package_id"),
        # "where is my file?" by source folder (migration 0008)
        Index("ix_raw_data_files_location_group", "location_id", "group_path"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    location_id: Mapped[int] = mapped_column(ForeignKey("data_locations.id"))
    relative_path: Mapped[str] = mapped_column(Text)
    group_path: Mapped[str] = mapped_column(Text)
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    mtime_ns: Mapped[int] = mapped_column(BigInteger)
    registered_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    raw_data_package_id: Mapped[int | None] = mapped_column(ForeignKey("raw_data_packages.id"), nullable=True)
    source_deleted_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: the k-th content of this path that is packaged (migration 0009)
    version: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))
    #: the source file's mtime (ns, UTC) at which a scan last hashed it and found these very
    #: bytes (a touch): scans take ``(size, confirmed_mtime_ns)`` as unchanged, so the file is
    #: not hashed again at every full scan; ``mtime_ns`` stays what the package's tar holds (I3)
    #: (migration 0015)
    confirmed_mtime_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    #: what registered this version when it was not the scan: ``"source_audit"`` (the source
    #: audit re-hashed the file and found other bytes behind an unchanged size and mtime,
    #: :mod:`packhorse.managers.source_audit`); ``None``: the scan (migration 0025)
    found_by: Mapped[str | None] = mapped_column(String(32), nullable=True)


class WithdrawnFile(Base):
    """A registration taken out of its package before the package was built, because the
    source bytes no longer matched it (``cause = "changed"``) or were gone (``"vanished"``).

    Written by the ``raw_data_package`` stage in a transaction fenced on its attempt (I3);
    the package is then built from its other files, so siblings never wait (DESIGN.md
    "Converging"). ``resolved_at`` is set when the scan registers the path again; until then
    the row is listed by ``packhorse status`` (``skipped``) with its ``reason``, and the scan
    looks at the path at every cycle. Migration 0009. ``forgotten_at``/``_by``/``_reason``: an
    operator said the file is gone for good (``packhorse skipped forget``, audited; migration
    0017): no longer listed, though the scan still registers the path if it comes back.
    """

    __tablename__ = "withdrawn_files"
    __table_args__ = (
        CheckConstraint("cause IN ('changed', 'vanished')", name="cause"),
        Index("ix_withdrawn_files_location_resolved", "location_id", "resolved_at"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    location_id: Mapped[int] = mapped_column(ForeignKey("data_locations.id"))
    relative_path: Mapped[str] = mapped_column(Text)
    version: Mapped[int] = mapped_column(Integer)
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    mtime_ns: Mapped[int] = mapped_column(BigInteger)
    registered_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    #: the package it was taken out of (a name: a package left empty is dropped)
    package_name: Mapped[str] = mapped_column(Text)
    cause: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text)
    withdrawn_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    resolved_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    forgotten_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    forgotten_by: Mapped[str | None] = mapped_column(String(200), nullable=True)
    forgotten_reason: Mapped[str | None] = mapped_column(Text, nullable=True)

    @classmethod
    def listed(cls) -> Any:
        """The rows ``packhorse status`` lists as skipped: not registered again, not forgotten."""
        return and_(cls.resolved_at.is_(None), cls.forgotten_at.is_(None))


class SkippedFile(Base):
    """A source file the scan could not register, with the reason (shown by ``status``)."""

    __tablename__ = "skipped_files"
    __table_args__ = (UniqueConstraint("location_id", "relative_path"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    location_id: Mapped[int] = mapped_column(ForeignKey("data_locations.id"))
    relative_path: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text)
    first_seen_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_seen_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class RawDataPackage(Base):
    """The unit of archiving: a BagIt bag in a PAX tar of a group of raw files.

    ``size``/``sha256`` describe the tar and are set when it is first built (deterministic,
    so every rebuild gives the same bytes). ``bagging_date`` is fixed at creation (I3).
    """

    __tablename__ = "raw_data_packages"
    __table_args__ = (
        # "where is my file?" lists every package of a folder (migration 0008)
        Index("ix_raw_data_packages_group_path", "group_path"),
        # the packages not archived yet, found by the archive manager every cycle without
        # reading the whole archive's (migration 0016: PostgreSQL chose a Seq Scan of 100,000
        # packages in an idle cycle, docs/benchmarks.md "Control plane")
        Index("ix_raw_data_packages_not_archived", "id",
              sqlite_where=text("archived_at IS NULL"), postgresql_where=text("archived_at IS NULL")),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(Text, unique=True)
    group_path: Mapped[str] = mapped_column(Text)
    source_location_id: Mapped[int] = mapped_column(ForeignKey("data_locations.id"))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    bagging_date: Mapped[str] = mapped_column(String(10))
    file_count: Mapped[int] = mapped_column(Integer)
    payload_bytes: Mapped[int] = mapped_column(BigInteger)
    size: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    data_transfer_package_id: Mapped[int | None] = mapped_column(
        ForeignKey("data_transfer_packages.id"), nullable=True, index=True
    )
    archived_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: which content of its files it carries: 1 for first contents, k for the k-th versions of
    #: files that changed after their earlier package was built (name ``<group>+v<k>``;
    #: migration 0009)
    version: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))


class DataTransferPackage(Base):
    """A bundle of raw data packages shipped together between sites; also a bag in a tar."""

    __tablename__ = "data_transfer_packages"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(Text, unique=True)
    source_site_id: Mapped[int] = mapped_column(ForeignKey("sites.id"))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    bagging_date: Mapped[str] = mapped_column(String(10))
    package_count: Mapped[int] = mapped_column(Integer)
    size: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)


class PhysicalCopy(Base):
    """One artifact present at one data location.

    Exactly one of ``raw_data_package_id`` / ``data_transfer_package_id`` is set. At most one
    *live* copy (``present`` or ``deletion_pending``) exists per (artifact, location): partial
    unique indexes enforce it (DESIGN.md I3).
    """

    __tablename__ = "physical_copies"
    __table_args__ = (
        CheckConstraint(_in("status", enum_values(CopyStatus)), name="status"),
        CheckConstraint(
            "(raw_data_package_id IS NULL) <> (data_transfer_package_id IS NULL)", name="one_artifact"
        ),
        Index(
            "uq_physical_copies_live_raw",
            "raw_data_package_id",
            "location_id",
            unique=True,
            sqlite_where=text(f"raw_data_package_id IS NOT NULL AND {_LIVE}"),
            postgresql_where=text(f"raw_data_package_id IS NOT NULL AND {_LIVE}"),
        ),
        Index(
            "uq_physical_copies_live_dtp",
            "data_transfer_package_id",
            "location_id",
            unique=True,
            sqlite_where=text(f"data_transfer_package_id IS NOT NULL AND {_LIVE}"),
            postgresql_where=text(f"data_transfer_package_id IS NOT NULL AND {_LIVE}"),
        ),
        # an artifact's copies in every status; a location's copies of one status (a buffer's
        # present copies, not every copy it ever held)
        Index("ix_physical_copies_raw_data_package_id", "raw_data_package_id"),
        Index("ix_physical_copies_data_transfer_package_id", "data_transfer_package_id"),
        Index("ix_physical_copies_location_status", "location_id", "status"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    raw_data_package_id: Mapped[int | None] = mapped_column(ForeignKey("raw_data_packages.id"), nullable=True)
    data_transfer_package_id: Mapped[int | None] = mapped_column(
        ForeignKey("data_transfer_packages.id"), nullable=True
    )
    location_id: Mapped[int] = mapped_column(ForeignKey("data_locations.id"))
    path: Mapped[str] = mapped_column(Text)
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(32), default=CopyStatus.PRESENT.value)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    verified_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    deleted_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: when the copy's status last became ``corrupt`` or ``missing`` (UTC; ``None`` before that)
    found_bad_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: the key under the copy's location its bytes were moved aside to
    #: (``_packhorse/quarantine/<key>.<UTC stamp>-<random>``) by the repair that replaced it, or by
    #: the read-back that found them rotted; ``None`` when never moved aside
    quarantined_as: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: when its bytes were moved aside (UTC, the database clock); ``None`` with ``quarantined_as``
    quarantined_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)


class Operation(Base):
    """One unit of work on one artifact, of one :class:`~packhorse.domain.OperationKind`.

    ``dedup_key`` (kind, subject, destination) is unique: managers can never create a
    duplicate. ``attempt`` is the fencing token: every claim increments it and every status
    write of an attempt is a compare-and-set on it (DESIGN.md I3, "Lease").
    """

    __tablename__ = "operations"
    __table_args__ = (
        CheckConstraint(_in("kind", enum_values(OperationKind)), name="kind"),
        CheckConstraint(_in("status", enum_values(Status)), name="status"),
        CheckConstraint("attempt >= 0 AND retry_count >= 0", name="counters"),
        Index("ix_operations_kind_status", "kind", "status"),
        Index("ix_operations_status_lease", "status", "lease_expires_at"),
        Index("ix_operations_physical_copy_id", "physical_copy_id"),  # "has this copy a deletion?"
        # the dashboard's throughput over a time window (migration 0008)
        Index("ix_operations_status_finished", "status", "finished_at"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16), default=Status.PENDING.value)
    dedup_key: Mapped[str] = mapped_column(Text, unique=True)
    site_id: Mapped[int] = mapped_column(ForeignKey("sites.id"))
    raw_data_package_id: Mapped[int | None] = mapped_column(
        ForeignKey("raw_data_packages.id"), nullable=True, index=True
    )
    data_transfer_package_id: Mapped[int | None] = mapped_column(
        ForeignKey("data_transfer_packages.id"), nullable=True, index=True
    )
    physical_copy_id: Mapped[int | None] = mapped_column(ForeignKey("physical_copies.id"), nullable=True)
    source_location_id: Mapped[int | None] = mapped_column(ForeignKey("data_locations.id"), nullable=True)
    destination_location_id: Mapped[int | None] = mapped_column(ForeignKey("data_locations.id"), nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    retry_count: Mapped[int] = mapped_column(Integer, default=0)
    max_retries: Mapped[int] = mapped_column(Integer, default=3)
    stall_count: Mapped[int] = mapped_column(Integer, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(200), nullable=True)
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    not_before: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    scheduled_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    bytes_done: Mapped[int] = mapped_column(BigInteger, default=0)
    error_context: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    #: times the reconciler re-dispatched a lost dispatch in the current window (since
    #: ``reconcile_window_at``; never counts as a retry)
    reconcile_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: when ``reconcile_count`` was last reset (UTC): a claim after it, or ``packhorse retry``,
    #: starts a new window (:mod:`packhorse.recovery.reconciler`)
    reconcile_window_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: when the reconciler gave up on it (UTC; its cap reached in the window): it tries once
    #: more after ``[recovery] reconcile_cooldown_seconds`` (half-open); listed as blocked
    #: (``dispatch_lost``) meanwhile
    reconcile_given_up_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)


class FailureEvent(Base):
    """Append-only record of one failure of one attempt, written in its own transaction."""

    __tablename__ = "failure_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    operation_id: Mapped[int] = mapped_column(ForeignKey("operations.id"), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    attempt: Mapped[int] = mapped_column(Integer)
    retry_count: Mapped[int] = mapped_column(Integer)
    error_type: Mapped[str] = mapped_column(String(200))
    message: Mapped[str] = mapped_column(Text)
    will_retry: Mapped[bool] = mapped_column(Boolean)
    error_context: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)

    __table_args__ = (CheckConstraint(_in("kind", enum_values(OperationKind)), name="kind"),
                      # the dashboard's failures over a time window (migration 0008)
                      Index("ix_failure_events_created_at", "created_at"))


class Notification(Base):
    """One notification in the outbox, written in the same transaction as the state change
    that causes it, so a crash cannot lose it (DESIGN.md "Architecture"; issues #3, #7).

    ``cooldown_key`` is (kind, operation, subject): a repeat within the cooldown only increments
    ``repeat_count`` of the row already queued (:func:`packhorse.notify.outbox.enqueue`).
    ``event`` names what happened (``permanent_failure``, ``breaker_open``, …); ``context`` is
    the one prebuilt error context (or event details) the body is rendered from. Delivery
    columns (``status``, ``attempts``, ``next_attempt_at``, ``last_error``, ``sent_at``) belong
    to the notifier, which claims a row with a lease like an operation: ``claim_token`` is
    incremented by every claim and is the fencing token of every delivery write
    (:mod:`packhorse.notify.notifier`).
    """

    __tablename__ = "notification_outbox"
    __table_args__ = (
        CheckConstraint(_in("level", enum_values(NotificationLevel)), name="level"),
        CheckConstraint(_in("status", enum_values(NotificationStatus)), name="status"),
        Index("ix_notification_outbox_status_next", "status", "next_attempt_at"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    level: Mapped[str] = mapped_column(String(16))
    event: Mapped[str] = mapped_column(String(64))
    subject: Mapped[str] = mapped_column(String(300))
    body: Mapped[str] = mapped_column(Text)
    context: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    operation_kind: Mapped[str | None] = mapped_column(String(32), nullable=True)
    operation_id: Mapped[int | None] = mapped_column(ForeignKey("operations.id"), nullable=True, index=True)
    cooldown_key: Mapped[str] = mapped_column(String(400), index=True)
    repeat_count: Mapped[int] = mapped_column(Integer, default=0)
    last_repeat_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    status: Mapped[str] = mapped_column(String(16), default=NotificationStatus.PENDING.value)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    sent_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    claim_token: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    lease_owner: Mapped[str | None] = mapped_column(String(200), nullable=True)
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)


class NotificationDelivery(Base):
    """One notification delivered on one channel (``smtp``, ``apprise``): the dedup record.

    Written, fenced on the claim token, right after the channel accepted the message; a
    re-delivery after a crash skips channels that have a row here, so a channel that already
    took the message is not sent it again. ``message_id`` is the stable
    Message-ID the message carried (the same on every attempt).
    """

    __tablename__ = "notification_deliveries"
    __table_args__ = (UniqueConstraint("notification_id", "channel"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    notification_id: Mapped[int] = mapped_column(ForeignKey("notification_outbox.id"))
    channel: Mapped[str] = mapped_column(String(32))
    message_id: Mapped[str] = mapped_column(String(300))
    attempt: Mapped[int] = mapped_column(Integer)
    delivered_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class DiskUsageSample(Base):
    """One measurement of one data location's disk usage (bytes; ``percent`` = used / total).

    Recorded every ``[disk_usage] interval_seconds`` (60 s) by the disk monitor
    (:mod:`packhorse.rules.disk_usage`); read by the deletion manager, ``packhorse usage``, the
    dashboard and the metrics (:func:`packhorse.rules.disk_usage.latest_usage`). ``level`` is the
    band of this measurement; ``alert_level`` the notification state after it (raised on a
    crossing, back to ``normal`` only below the recovery threshold).
    """

    __tablename__ = "disk_usage_samples"
    __table_args__ = (
        CheckConstraint(_in("level", enum_values(DiskLevel)), name="level"),
        CheckConstraint(_in("alert_level", enum_values(DiskLevel)), name="alert_level"),
        CheckConstraint("total_bytes >= 0 AND used_bytes >= 0 AND free_bytes >= 0", name="bytes"),
        Index("ix_disk_usage_samples_location_time", "location_id", "measured_at"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    location_id: Mapped[int] = mapped_column(ForeignKey("data_locations.id"))
    measured_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    total_bytes: Mapped[int] = mapped_column(BigInteger)
    used_bytes: Mapped[int] = mapped_column(BigInteger)
    free_bytes: Mapped[int] = mapped_column(BigInteger)
    percent: Mapped[float] = mapped_column(Float)
    level: Mapped[str] = mapped_column(String(16))
    alert_level: Mapped[str] = mapped_column(String(16))
    #: bytes under the location's quarantine (``_packhorse/quarantine/``) when measured;
    #: ``None`` in samples from before it was measured, or when it could not be read
    quarantined_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class LocationOutage(Base):
    """A data location that is unavailable now: its root or identity marker is missing, or the
    marker names another location (DESIGN.md "Architecture": storage that is absent is not
    empty; :mod:`packhorse.rules.availability`). One row per location while the outage lasts; the row
    is deleted when the location is seen again, which releases the operations waiting on it.

    ``since`` is when the outage was first seen (UTC), ``checked_at`` when it was last seen;
    ``marker_only`` is true when the root is there without its marker (``packhorse init``
    releases it). The notification is queued with the insert, so once per outage. ``fault`` is
    the storage's refusal when root and marker are there but writing fails (an errno name such
    as ``EROFS``, ``EIO``, ``EACCES``, or an object store's ``AccessDenied``;
    :mod:`packhorse.storage.faults`): the outage then ends only when a write there succeeds.
    """

    __tablename__ = "location_outages"
    location_id: Mapped[int] = mapped_column(ForeignKey("data_locations.id"), primary_key=True)
    reason: Mapped[str] = mapped_column(Text)
    marker_only: Mapped[bool] = mapped_column(Boolean, default=False)
    since: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    checked_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    fault: Mapped[str | None] = mapped_column(String(64), nullable=True)


class SiteOutage(Base):
    """A site the centre cannot reach now: every worker of the site that ever recorded a health
    heartbeat is dead (:mod:`packhorse.recovery.site_reachability`). One row per site while the
    outage lasts, inserted with its WARNING notification and deleted with its INFO one, so an
    operator hears once per cut and once when it heals, however long it lasts and however many
    monitors run. ``since`` is the last heartbeat of the site's workers (UTC).
    """

    __tablename__ = "site_outages"
    site: Mapped[str] = mapped_column(String(100), primary_key=True)
    since: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    noticed_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)


class LinkOutage(Base):
    """A link between sites cut now: the transfers from ``source`` to ``destination`` (data
    location names) have waited on a lost SSH connection for longer than the grace of
    :mod:`packhorse.recovery.link_reachability`. One row per link while the cut lasts, inserted
    with its WARNING notification and deleted with its INFO one, so an operator hears once per
    cut and once when it heals, however many transfers wait and however many monitors run.
    ``since`` is the first lost connection of the cut, ``host`` the SSH server the transfers
    could not reach (UTC times).
    """

    __tablename__ = "link_outages"
    source: Mapped[str] = mapped_column(String(100), primary_key=True)
    destination: Mapped[str] = mapped_column(String(100), primary_key=True)
    host: Mapped[str | None] = mapped_column(String(300), nullable=True)
    since: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    noticed_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)


class CircuitBreaker(Base):
    """The circuit breaker of one operation: stalls counted by the stalled-task monitor.

    ``state`` is ``closed``, ``open`` or ``half_open`` (:data:`packhorse.domain.BreakerState`).
    ``stall_count`` counts stalls since the breaker last closed; at ``max_stall_count`` the
    breaker opens (``opened_at`` set, ``trips`` 1): the monitor stops resetting the operation
    until ``next_attempt_at`` (the cool-down, ``circuit_breaker_cooldown_seconds``), then lets one
    attempt through (``half_open``, ``half_open_at`` set). That attempt's success closes the
    breaker; its failure or stall opens it again (``trips`` + 1, the cool-down doubled up to
    ``circuit_breaker_timeout_seconds``). An admin may close it at any time (DESIGN.md "Circuit
    breaker", seed 002; :mod:`packhorse.recovery.breakers`). ``last_stall_attempt`` is the
    attempt (fencing token) whose stall was counted last, so one expired lease is counted once.
    """

    __tablename__ = "circuit_breakers"
    __table_args__ = (
        UniqueConstraint("kind", "operation_id"),
        CheckConstraint(_in("kind", enum_values(OperationKind)), name="kind"),
        CheckConstraint(_in("state", enum_values(BreakerState)), name="state"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    operation_id: Mapped[int] = mapped_column(ForeignKey("operations.id"))
    stall_count: Mapped[int] = mapped_column(Integer, default=0)
    last_stall_attempt: Mapped[int] = mapped_column(Integer, default=0)
    last_stall_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: when the breaker last opened (``None`` while closed)
    opened_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: while open: when the cool-down ends and one attempt is let through (UTC)
    next_attempt_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    state: Mapped[str] = mapped_column(String(16), default=BreakerState.CLOSED.value,
                                       server_default=BreakerState.CLOSED.value)
    #: while half-open: when the one attempt was let through (UTC)
    half_open_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: how many times the breaker opened since it last closed (1 at the first opening)
    trips: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))


class ServiceHeartbeat(Base):
    """The health heartbeat of one service, identified by what it is, not by its process.

    ``service`` is the identity (unique): ``kind[:site][:instance]@host``, e.g. ``runner@obs1``,
    ``worker:cologne@dc1``, ``worker:cologne:2@dc1`` (:func:`packhorse.recovery.health.service_identity`).
    A restarted service takes over its predecessor's row (``pid`` and ``started_at`` are the
    current process's, ``restarts`` counts the take-overs). Heartbeat every 30 s; dead after
    90 s; a dead row is forgotten after ``service_forget_after_seconds`` (a day).
    """

    __tablename__ = "service_heartbeats"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    service: Mapped[str] = mapped_column(String(200), unique=True)
    kind: Mapped[str] = mapped_column(String(64))
    host: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_seen: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    site: Mapped[str | None] = mapped_column(String(64), nullable=True)
    instance: Mapped[str] = mapped_column(String(64), default="", server_default="")
    restarts: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    #: the process namespace ``pid`` belongs to (operations.process_namespace; migration 0018):
    #: a row of another one (a container with the same hostname) is judged by its heartbeat alone
    pid_namespace: Mapped[str | None] = mapped_column(String(64), nullable=True)
    #: the offset of the service's host clock to the database's it measured last (s, database
    #: minus host; packhorse.db.clock; migration 0026); ``None``: not recorded yet
    clock_offset_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)


# --- operator surface (API tokens, audit log, runtime settings, live checks) ---------


class ApiToken(Base):
    """A bearer token of the HTTP API with a role (``kiosk``, ``observer`` or ``admin``).

    Only ``token_hash`` (sha256 hex of the token) is stored: the token itself is shown once,
    when it is created. A revoked token (``revoked_at`` set) is refused.
    """

    __tablename__ = "api_tokens"
    __table_args__ = (CheckConstraint("role IN ('kiosk', 'observer', 'admin')", name="role"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    created_by: Mapped[str] = mapped_column(String(200))
    last_used_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)


class AuditEntry(Base):
    """One admin action, appended after it ran: who (``actor``), what (``action``, ``target``,
    ``details``), when (``at``) and the result (``ok`` / ``refused`` / ``error`` + message)."""

    __tablename__ = "audit_log"
    __table_args__ = (CheckConstraint("result IN ('ok', 'refused', 'error')", name="result"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(200))
    action: Mapped[str] = mapped_column(String(100))
    target: Mapped[str | None] = mapped_column(Text, nullable=True)
    details: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    result: Mapped[str] = mapped_column(String(16))
    message: Mapped[str | None] = mapped_column(Text, nullable=True)


class Installation(Base):
    """The identity of this installation (its ops database): one row, written by the first
    ``packhorse init``. Every identity marker it writes names ``uuid`` (``installation``), so a
    root marked by another installation is never taken over by a fresh database
    (:func:`packhorse.rules.availability.mark_locations`; DESIGN.md "Storage that is absent is not empty")."""

    __tablename__ = "installation"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class RuntimeSetting(Base):
    """A setting changed while services run (``packhorse config set``); overrides the file.

    ``value`` is the JSON-encoded value; services re-read the table at most every 60 s.
    """

    __tablename__ = "runtime_settings"
    key: Mapped[str] = mapped_column(String(100), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_by: Mapped[str] = mapped_column(String(200))


class LiveCheck(Base):
    """An asynchronous live filesystem check of one operation's bytes, by correlation id.

    Ephemeral: rows past ``expires_at`` (900 s after the request) are purged and reported as
    unknown. ``state`` is ``pending``, ``done`` or ``failed``; ``result`` the per-location
    findings.
    """

    __tablename__ = "live_checks"
    __table_args__ = (
        CheckConstraint("state IN ('pending', 'done', 'failed')", name="state"),
        CheckConstraint(_in("kind", enum_values(OperationKind)), name="kind"),
    )
    correlation_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    operation_id: Mapped[int] = mapped_column(Integer)
    requested_by: Mapped[str] = mapped_column(String(200))
    requested_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, index=True)
    state: Mapped[str] = mapped_column(String(16))
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class ObjectLease(Base):
    """A per-object lease on one key of one data location (seed 003).

    Used by S3 locations whose store does not honour ``If-None-Match: *``
    (``write_once_probe = false``): the publisher holds the lease while it checks that the key
    is free and writes it, so two workers never write one object at once. ``expires_at`` bounds
    a crashed holder; ``holder`` is a random token of one acquisition.
    """

    __tablename__ = "object_leases"
    location: Mapped[str] = mapped_column(String(200), primary_key=True)
    key: Mapped[str] = mapped_column(String(1024), primary_key=True)
    holder: Mapped[str] = mapped_column(String(64))
    expires_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)


class ScanLease(Base):
    """The exclusion of the scan of one source data location: a lease renewed by heartbeats, as
    an operation's (DESIGN.md "Lease"; :mod:`packhorse.operations.scan_lease`).

    ``token`` is the fencing token: every acquisition increments it and every renewal and
    release is a compare-and-set on it, so a holder that stopped renewing (paused, hung on a
    mount) and came back after another worker took the lease over changes nothing.
    ``started_at`` is when the current (or last) scan began — before the first completion, when
    the first one began —, ``completed_at`` when a scan last completed (UTC; ``None`` before
    the first): ``status`` and ``health`` list a location whose
    scan has not completed for longer than ``[recovery] scan_overdue_seconds``.
    ``worked_seconds``: how long the last completed scan worked (s), the time its holder could
    not reach the database left out; what its rest is measured by
    (:func:`packhorse.operations.scan_lease.rest_until`). ``None``: not recorded (a scan
    completed before migration 0030), the rest goes by ``completed_at − started_at``.
    """

    __tablename__ = "scan_leases"
    location: Mapped[str] = mapped_column(String(200), primary_key=True)
    holder: Mapped[str | None] = mapped_column(String(200), nullable=True)
    token: Mapped[int] = mapped_column(Integer, default=0)
    expires_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    completed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    worked_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)


class SourceAudit(Base):
    """The source audit of one source data location (:mod:`packhorse.managers.source_audit`):
    its registered files still present re-hashed and compared with their registration, a pass
    at a time, on the location's ``source_audit_interval_seconds`` cadence.

    ``started_at`` / ``completed_at``: the current (or last) pass (UTC; ``completed_at`` ``None``
    while it runs). ``cursor``: the last path the running pass checked (it goes on after it;
    ``None`` when no pass runs). ``files_checked``, ``bytes_checked``, ``changed``, ``gone``: of
    the current (or last) pass — files hashed, bytes read, files whose bytes differ behind an
    unchanged size and mtime (registered as a new version), registered files no longer there.
    ``changed_total``: every such file any pass found.
    """

    __tablename__ = "source_audits"
    location: Mapped[str] = mapped_column(String(200), primary_key=True)
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    completed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    cursor: Mapped[str | None] = mapped_column(Text, nullable=True)
    files_checked: Mapped[int] = mapped_column(Integer, default=0)
    bytes_checked: Mapped[int] = mapped_column(BigInteger, default=0)
    changed: Mapped[int] = mapped_column(Integer, default=0)
    gone: Mapped[int] = mapped_column(Integer, default=0)
    changed_total: Mapped[int] = mapped_column(Integer, default=0)


class BacklogSample(Base):
    """The backlog of one operation kind at one minute: how many operations were waiting
    (``PENDING`` or ``SCHEDULED``), running (``IN_PROGRESS``) and ``FAILED`` then.

    Recorded every ``[api] history_interval_seconds`` (60 s) by :mod:`packhorse.status.history`
    (``packhorse run`` and ``packhorse api``); ``measured_at`` is the start of the sampling
    interval, so two processes sampling the same interval write one row (unique key; the
    latest sample of an interval stands). Rows
    older than ``[api] history_keep_days`` (7 days) are deleted at each sample: at most
    ``keep_days × 86400 / interval`` rows per kind (10 080 a kind with the defaults).
    """

    __tablename__ = "backlog_samples"
    __table_args__ = (
        UniqueConstraint("measured_at", "kind"),
        CheckConstraint(_in("kind", enum_values(OperationKind)), name="kind"),
        CheckConstraint("waiting >= 0 AND running >= 0 AND failed >= 0", name="counts"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    measured_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    kind: Mapped[str] = mapped_column(String(32))
    waiting: Mapped[int] = mapped_column(Integer)
    running: Mapped[int] = mapped_column(Integer)
    failed: Mapped[int] = mapped_column(Integer)
