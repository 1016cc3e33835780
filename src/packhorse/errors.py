"""The one exception tree of packhorse.

::

    PackhorseError
    ├── ConfigError                    wrong configuration, refused at start (exit 2)
    ├── DatabaseNotInitializedError    the database is not at the migration head: run `init`
    ├── TransientDatabaseError         a database blip; retried by the unit of work, never an
    │                                  operation's failure (DESIGN.md "Architecture")
    ├── LeaseLostError                 this worker's lease / fencing token is no longer current;
    │                                  the work stops and nothing is committed (I3)
    ├── OperationDeferred              the operation must wait (a cold-storage restore): handed
    │                                  back as PENDING with ``not_before``, no retry counted
    ├── UnknownOperationError          no operation with this id and kind (admin commands, API)
    └── OperationError                 a failure of one operation's work; carries where/why
        ├── PermanentError             never retried
        │   ├── DestinationConflictError   the destination holds different bytes (I2)
        │   ├── UnsafePathError            a path leaves its root, or a tar member is refused (I6)
        │   ├── SourceMissingError         the bytes to read are gone
        │   └── SourceChangedError         the source no longer matches its registered sha256
        └── RetryableError             retried up to the operation's ``max_retries``
            ├── VerificationError          read-back sha256 differs from the expected one (I4)
            ├── TransferCommandError       an external transfer command failed
            ├── StorageServiceError        an object store answered with an error or was unreachable
            ├── DestinationWriteError      writing to a disk location failed (full, I/O error);
            │                              the partial file is already removed
            └── RestoreRequiredError       a cold-storage object must be restored before reading

Each :class:`OperationError` carries the where/why fields of the error context
(``step``, ``side``, ``path``, ``host``, ``diagnosis``) at the boundary where it is raised,
and ``is_retryable`` so the single failure path can classify it.
"""

from __future__ import annotations


class PackhorseError(Exception):
    """Base class of every error packhorse raises on purpose."""


class ConfigError(PackhorseError):
    """The configuration is wrong; the message names the file and key.

    Raised at start by :func:`packhorse.config.load_config`; the CLI exits with status 2.
    """


class DatabaseNotInitializedError(PackhorseError):
    """The ops database has no schema or is not at the latest migration: run ``packhorse init``."""


class TransientDatabaseError(PackhorseError):
    """A database error that goes away on retry (busy, dropped connection, serialization)."""


class LeaseLostError(PackhorseError):
    """The worker no longer holds the operation's lease (its fencing token is stale).

    The work must stop before publishing and must not commit (DESIGN.md I3, "Lease").
    """


class UnknownOperationError(PackhorseError, LookupError):
    """No operation with the given id, or it is of another kind than the one named.

    Raised by the admin actions of :mod:`packhorse.recovery.breakers` (``breaker reset``,
    ``retry``); the CLI exits 1, the API answers 404.
    """


class OperationError(PackhorseError):
    """A failure of one operation's work.

    Args:
        message: human-readable description naming the file, key or value.
        step: the stage step that failed (e.g. ``"publish"``, ``"verify"``).
        side: ``"source"`` or ``"destination"``.
        path: the path or object key involved, relative to its location.
        host: the host or location name involved.
        diagnosis: a cause-oriented line for the operator.
    """

    is_retryable: bool = True
    #: Optional per-error cap on retries; ``None`` uses the operation's ``max_retries``.
    max_retries: int | None = None

    def __init__(
        self,
        message: str,
        *,
        step: str | None = None,
        side: str | None = None,
        path: str | None = None,
        host: str | None = None,
        diagnosis: str | None = None,
    ) -> None:
        super().__init__(message)
        self.step = step
        self.side = side
        self.path = path
        self.host = host
        self.diagnosis = diagnosis


class PermanentError(OperationError):
    """An operation failure that a retry cannot fix."""

    is_retryable = False


class RetryableError(OperationError):
    """An operation failure that may go away on retry."""

    is_retryable = True


class DestinationConflictError(PermanentError):
    """The destination already holds an object under the key with different size or sha256.

    Loud, never retried, the object is never overwritten (DESIGN.md I2).
    """


class UnsafePathError(PermanentError):
    """A path would leave its location root, or a tar member is refused by the tar reader
    (a link, a device, a duplicate, ``..``, a limit exceeded: :mod:`packhorse.extraction`;
    DESIGN.md I6)."""


class SourceMissingError(PermanentError):
    """The bytes an operation must read are not there."""


class SourceChangedError(PermanentError):
    """A source file's size or sha256 differs from what was registered at scan time."""


class VerificationError(RetryableError):
    """Bytes read back at the destination do not match the expected sha256 (DESIGN.md I4)."""


class TransferCommandError(RetryableError):
    """An external transfer command (rsync, bbcp, ...) exited non-zero."""


class StorageServiceError(RetryableError):
    """An object store (S3) answered with an error or could not be reached (issue #5).

    The message names the location, bucket and key and the service's error code; credentials
    never appear in it.
    """


class DestinationWriteError(RetryableError):
    """Writing an object's bytes to a disk location failed (``ENOSPC``, ``EDQUOT``, ``EIO``).

    Raised by :mod:`packhorse.storage.disk` after it removed the partial file (a full disk is
    not left full of a half-written object); the message names the location and the key.
    Retried: space may be freed by the deletions under disk pressure.
    """


class RestoreRequiredError(RetryableError):
    """A cold-storage object must be restored before it can be read (issue #5, staging).

    Stages that read from cold locations request the restore and wait for it without holding
    a worker; reaching this error elsewhere means a read was attempted too early.
    """


class OperationDeferred(PackhorseError):
    """The operation cannot go on yet (e.g. a cold-storage restore is in progress, issue #5).

    Not a failure: the worker hands the operation back as ``PENDING`` with ``not_before`` =
    now + ``seconds`` (no retry counted, no failure event) and is free for other work.

    Args:
        message: why it waits (kept in the operation's log line).
        seconds: when to look again.
    """

    def __init__(self, message: str, *, seconds: float) -> None:
        super().__init__(message)
        self.seconds = seconds
