"""Enums and small value types shared by every layer (DESIGN.md, "Vocabulary").

Every enum is a ``str`` enum whose values are the names stored in the database and shown in
the API and CLI; check constraints in the schema are generated from them, so a free-text kind
string can never be written (DESIGN.md I5, the seeds' bug #69).
"""

from __future__ import annotations

import enum


class OperationKind(str, enum.Enum):
    """What an operation does to its subject (one module per kind in ``packhorse.stages``)."""

    RAW_DATA_PACKAGE = "raw_data_package"
    DATA_TRANSFER_PACKAGE = "data_transfer_package"
    TRANSFER = "transfer"
    UNPACK = "unpack"
    LONG_TERM_ARCHIVE = "long_term_archive"
    STAGING = "staging"
    DELETION = "deletion"
    FIXITY_CHECK = "fixity_check"


#: The word for a completed operation of each kind, in pipeline order ("archived"): what the
#: progress lines, ``status`` and the "Where is my file?" timeline say.
DONE_WORD: dict[OperationKind, str] = {
    OperationKind.RAW_DATA_PACKAGE: "packaged",
    OperationKind.DATA_TRANSFER_PACKAGE: "bundled",
    OperationKind.TRANSFER: "shipped",
    OperationKind.UNPACK: "unpacked",
    OperationKind.LONG_TERM_ARCHIVE: "archived",
    OperationKind.STAGING: "staged",
    OperationKind.FIXITY_CHECK: "fixity checked",
    OperationKind.DELETION: "deleted",
}


class Status(str, enum.Enum):
    """Lifecycle of an operation: ``PENDING → SCHEDULED → IN_PROGRESS → COMPLETED | FAILED``."""

    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


#: Statuses in which an operation still has work to do.
ACTIVE_STATUSES = (Status.PENDING, Status.SCHEDULED, Status.IN_PROGRESS)


class LocationRole(str, enum.Enum):
    """The role of a data location at a site."""

    SOURCE = "source"
    BUFFER = "buffer"
    LONG_TERM_ARCHIVE = "long_term_archive"
    PROCESSING = "processing"


class StorageType(str, enum.Enum):
    """How a data location stores bytes (one backend per type in ``packhorse.storage``)."""

    DISK = "disk"
    S3 = "s3"
    AZURE = "azure"


class ArtifactType(str, enum.Enum):
    """What a physical copy or an operation is about."""

    RAW_DATA_PACKAGE = "raw_data_package"
    DATA_TRANSFER_PACKAGE = "data_transfer_package"


class CopyStatus(str, enum.Enum):
    """State of one physical copy of an artifact at one data location."""

    PRESENT = "present"
    DELETION_PENDING = "deletion_pending"
    DELETED = "deleted"
    MISSING = "missing"
    CORRUPT = "corrupt"


#: Copy statuses that count as "live": at most one live copy per (artifact, location) (I3).
LIVE_COPY_STATUSES = (CopyStatus.PRESENT, CopyStatus.DELETION_PENDING)


class TransferMethod(str, enum.Enum):
    """How a transfer moves bytes between sites."""

    COPY = "copy"
    COMMAND = "command"
    SFTP = "sftp"  #: pulled over SSH from the source site's buffer (:mod:`packhorse.storage.sftp`)


class NotificationLevel(str, enum.Enum):
    """Severity of a notification; channels route recipients per level."""

    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"
    CRITICAL = "CRITICAL"


class NotificationStatus(str, enum.Enum):
    """Delivery state of one outbox row: waiting (or between retries), delivered, or given up."""

    PENDING = "pending"
    SENT = "sent"
    DEAD = "dead"


class DiskLevel(str, enum.Enum):
    """How full a data location is (seed 002 thresholds, ``[disk_usage]``).

    ``normal`` below warning (70 %), ``warning`` from 70 %, ``critical`` from 85 %,
    ``emergency`` from 95 %. Disk pressure changes the order and retention of deletions,
    never their safety rules.
    """

    NORMAL = "normal"
    WARNING = "warning"
    CRITICAL = "critical"
    EMERGENCY = "emergency"

    @property
    def rank(self) -> int:
        """0 (normal) … 3 (emergency), for comparisons."""
        return list(DiskLevel).index(self)


class BreakerState(str, enum.Enum):
    """State of one operation's circuit breaker (DESIGN.md "Circuit breaker").

    ``closed``: stalls are recovered automatically. ``open``: after ``max_stall_count`` stalls
    (or a failed trial) the operation is held for a cool-down. ``half_open``: the cool-down
    passed and one attempt is let through; its success closes the breaker, its failure or stall
    opens it again (:mod:`packhorse.recovery.breakers`).
    """

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


def enum_values(e: type[enum.Enum]) -> list[str]:
    """Return the stored values of enum ``e``, in declaration order."""
    return [m.value for m in e]


#: ``error_context["waiting"]`` of an operation handed back by :func:`packhorse.operations.lifecycle.defer` because the
#: deletion rule does not hold yet (:class:`~packhorse.errors.DeletionNotSafeError`).
WAITING_DELETION_RULE = "deletion_rule"
#: ``error_context["waiting"]`` of an operation handed back by :func:`packhorse.operations.lifecycle.defer` because a data
#: location it needs is unavailable; ``error_context["location_id"]`` names it (it may be
#: neither the operation's source nor its destination: a repair's source copy, for one).
WAITING_LOCATION = "location"
#: ``error_context["waiting"]`` of an operation handed back because the data location it
#: writes to is full (:class:`~packhorse.errors.DestinationWriteError` ``out_of_space``);
#: ``error_context["location_id"]`` names it.
WAITING_SPACE = "space"
