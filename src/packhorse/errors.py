"""The one exception tree of packhorse.

::

    PackhorseError
    ├── ConfigError                    wrong configuration, refused at start (exit 2)
    ├── DatabaseNotInitializedError    the database is not at the migration head: run `init`
    ├── TransientDatabaseError         a database blip; retried by the unit of work, never an
    │                                  operation's failure (DESIGN.md "Architecture")
    ├── LeaseLostError                 this worker's lease / fencing token is no longer current;
    │   │                              the work stops and nothing is committed (I3)
    │   └── LeaseNotRenewedError       no renewal for lease − 1.5 × heartbeat (the database away):
    │                                  stop, hand the operation back on reconnect, no stall
    ├── OperationDeferred              the operation must wait (a cold-storage restore): handed
    │   │                              back as PENDING with ``not_before``, no retry counted
    │   └── DeletionNotSafeError       the deletion rule (I1) does not hold for the copy now:
    │       │                          nothing deleted; it waits and is checked again
    │       └── DeletionDeferredError  only operations still in flight on the copy block it
    ├── UnknownOperationError          no operation with this id and kind (admin commands, API)
    ├── UnknownPackageError            no package with this id or name (API 404, CLI exit 1)
    ├── ServiceHealthError             ``health --forget``: no such service, or it is alive
    ├── NotSkippedError                ``skipped forget``: no file gone before packaging is listed there
    ├── NothingToStageError            no archived package matches a staging request
    ├── ResetRefusedError              a reset or retry refused: not FAILED, or COMPLETED
    ├── RuntimeSettingError            an unknown runtime-setting key or a value it refuses
    ├── TokenError                     an API token cannot be created or revoked
    ├── ChannelError                   a notification channel did not accept a message
    ├── EmptyReasonError               a bulk reset asked without a reason (also a ValueError)
    ├── QuarantineRetentionError       a quarantine purge inside [quarantine] min_retention_seconds
    ├── HistoryWindowError             a history window outside 1 minute … the maximum (ValueError)
    ├── LocateQueryError               a locate query empty or too long (also a ValueError)
    ├── BundledElsewhereError          a bundle's package was bundled by another manager first:
    │                                  the bundling transaction rolls back (internal)
    ├── ExtendedHeaderTooLargeError    a tar's extended header over the limit (also a tarfile
    │                                  HeaderError; the tar reader turns it into UnsafePathError)
    └── OperationError                 a failure of one operation's work; carries where/why
        ├── PermanentError             never retried
        │   ├── DestinationConflictError   the destination holds different bytes (I2)
        │   ├── UnsafePathError            a path leaves its root, or a tar member is refused (I6)
        │   │   └── NotRegularFileError    a FIFO, device, socket or folder where a file was listed
        │   ├── SourceMissingError         the bytes to read are gone
        │   ├── SourceChangedError         the source no longer matches its registered sha256
        │   ├── HostKeyError               another site's SSH server offered a host key that is not the
        │   │                              one listed for it in the known-hosts file (unknown or
        │   │                              changed): a configuration to fix, never trusted on first use
        │   ├── SshAuthenticationError     another site's SSH server did not accept this site's user
        │   │                              and key (or the key file cannot be read)
        │   ├── PackageLimitError          a package or bundle would break the ``[extraction]`` limits
        │   │                              every destination reads it with: not built
        │   ├── NeverFitsError             what the operation must hold at once at a data location
        │   │                              is larger than its whole file system: waiting for space
        │   │                              cannot help
        │   └── InvalidBagError            the bytes are the recorded ones but their bag does not
        │                                  validate: a retry would read the same bytes
        └── RetryableError             retried up to the operation's ``max_retries``
            ├── VerificationError          read-back sha256 differs from the expected one (I4)
            ├── TransferCommandError       an external transfer command failed
            ├── SshConnectionError         the SSH link to another site could not be made, was cut
            │                              or stalled: the transfer resumes from its partial
            ├── StorageServiceError        an object store answered with an error or was unreachable
            │   └── StorageBusyError       "try again now": a concurrent write in the way; retried
            │                              at once by the storage retry layer
            ├── DestinationWriteError      writing to a disk location failed (full, I/O error);
            │                              the partial file is already removed; a full one: the
            │                              operation waits for space (deferred, never FAILED)
            ├── RestoreRequiredError       a cold-storage object must be restored before reading
            └── LocationUnavailableError   a location's root or identity marker is missing: the
                                           operation waits for it (deferred, never FAILED)

Every exception class of packhorse is defined here (a test holds the package to it); the
modules that raise them import them from here.

Each :class:`OperationError` carries the where/why fields of the error context
(``step``, ``side``, ``path``, ``host``, ``diagnosis``) at the boundary where it is raised,
and ``is_retryable`` so the single failure path can classify it.
"""

from __future__ import annotations

import tarfile
from typing import Any


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


class LeaseNotRenewedError(LeaseLostError):
    """The worker could not renew its lease for ``lease_timeout − 1.5 × heartbeat_interval``
    seconds (database unreachable, process paused): it stops before the lease could look
    expired to anyone else (docs/recovery.md "Layer 2"). Unlike a stale token, nobody is known
    to have taken the operation over: the attempt hands it back as soon as the database answers
    (fenced, no stall counted; :func:`packhorse.engine.worker.hand_back`).
    """


class UnknownOperationError(PackhorseError, LookupError):
    """No operation with the given id, or it is of another kind than the one named.

    Raised by the admin actions of :mod:`packhorse.recovery.breakers` (``breaker reset``,
    ``retry``); the CLI exits 1, the API answers 404.
    """


class ServiceHealthError(PackhorseError):
    """``packhorse health --forget NAME`` refused: no service of that name is recorded, or it
    is alive (it would only reappear at its next heartbeat). Raised by
    :func:`packhorse.recovery.health.forget_service`; the CLI exits 1."""


class UnknownPackageError(PackhorseError, LookupError):
    """No raw data package or data transfer package has this id or name (HTTP 404, CLI exit 1)."""


class NotSkippedError(PackhorseError, LookupError):
    """``packhorse skipped forget``: no skipped source file that can be forgotten matches the
    path given (CLI exit 1); the message says what the path is instead."""


class NothingToStageError(PackhorseError, LookupError):
    """No archived raw data package matches the requested name (``packhorse stage``)."""


class ResetRefusedError(PackhorseError):
    """The operation cannot be reset: unknown id, another kind, or not FAILED (reset); it is
    COMPLETED (retry)."""


class RuntimeSettingError(PackhorseError):
    """An unknown runtime-setting key or a value it does not accept (the message names both)."""


class TokenError(PackhorseError):
    """A token cannot be created or revoked (duplicate name, unknown role, unknown token)."""


class ChannelError(PackhorseError):
    """A channel could not deliver a message (server down, refused, bad credentials, …).

    Args:
        message: what failed, naming the server (never a password or token).
        permanent: a retry cannot help (an SMTP 5xx reply: relaying denied, login refused,
            recipient unknown): the notifier dead-letters the notification at once. Otherwise
            (an SMTP 4xx reply, a network error or timeout) it retries with backoff, then
            dead-letters it.
    """

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class EmptyReasonError(PackhorseError, ValueError):
    """A bulk reset was asked without a reason (HTTP 422, CLI exit 2)."""


class QuarantineRetentionError(PackhorseError, ValueError):
    """``packhorse quarantine purge --older-than DAYS`` asked to remove entries younger than
    ``[quarantine] min_retention_seconds`` (CLI exit 2); nothing is removed."""


class HistoryWindowError(PackhorseError, ValueError):
    """The requested window is not between 1 minute and
    :data:`packhorse.status.history.MAX_WINDOW_MINUTES`."""


class LocateQueryError(PackhorseError, ValueError):
    """The query is empty or too long (HTTP 422, CLI exit 2)."""


class BundledElsewhereError(PackhorseError):
    """A package of a bundle being made was bundled by another manager first: raised inside the
    bundling transaction so that it rolls back (:mod:`packhorse.managers.bundles`)."""


class ExtendedHeaderTooLargeError(PackhorseError, tarfile.HeaderError):
    """A tar member's extended (PAX or GNU) header is larger than
    :data:`packhorse.bags.extraction.MAX_HEADER_BYTES`; raised before it is read
    (:mod:`packhorse.bags.extraction` reports it as a refused member)."""


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


class HostKeyError(PermanentError):
    """The SSH server of another site offered a host key that is not listed for that host (and
    port) in the configured known-hosts file: unknown (no key listed) or changed (another key
    listed). Never trusted on first use; the message names the host, port, the key's SHA256
    fingerprint and the known-hosts file (:mod:`packhorse.storage.sftp`). A configuration to
    fix, so never retried."""


class SshAuthenticationError(PermanentError):
    """The SSH server of another site refused this site's user and key, or the configured key
    file cannot be read; the message names the user, host, port and key file
    (:mod:`packhorse.storage.sftp`). A configuration to fix, so never retried."""


class PackageLimitError(PermanentError):
    """A raw data package would hold a member larger than ``[extraction] max_member_bytes``
    (a source file that large): every destination's tar reader would refuse it, and the bundle
    carrying it, so it is never built or shipped (the file is named; the other packages go on)."""


class NeverFitsError(PermanentError):
    """What an operation must hold at once at a disk data location is larger than the whole file
    system there (a package bigger than its buffer): waiting for space, which a full disk
    otherwise does (:class:`DestinationWriteError` ``out_of_space``), could never release it,
    so it fails and a human is told (DESIGN.md I5: every state has an owner). The message
    names the location, the bytes needed and the file system's size; ``packhorse reset``
    releases the operation once the location is larger
    (:func:`packhorse.rules.space.never_fits`).
    """


class DestinationConflictError(PermanentError):
    """The destination already holds an object under the key with different size or sha256.

    Loud, never retried, the object is never overwritten (DESIGN.md I2).
    """


class UnsafePathError(PermanentError):
    """A path would leave its location root, or a tar member is refused by the tar reader
    (a link, a device, a duplicate, ``..``, a limit exceeded: :mod:`packhorse.bags.extraction`;
    DESIGN.md I6)."""


class NotRegularFileError(UnsafePathError):
    """A FIFO, a device, a socket or a folder stands where a regular file was listed (put
    there after the listing). Refused when it is opened, never read: opening a FIFO for
    reading would block until a writer comes (DESIGN.md I6)."""


class SourceMissingError(PermanentError):
    """The bytes an operation must read are not there."""


class SourceChangedError(PermanentError):
    """A source file's size or sha256 differs from what was registered at scan time."""


class InvalidBagError(PermanentError):
    """An artifact's bytes are exactly the recorded ones (size and sha256) but the bag they
    hold does not validate (RFC 8493, :mod:`packhorse.bags.validation`): the fault is in what was
    archived, not in the reading, so it is never retried (another good source is needed)."""


class VerificationError(RetryableError):
    """Bytes read back at the destination do not match the expected sha256 (DESIGN.md I4)."""


class TransferCommandError(RetryableError):
    """An external transfer command (rsync, bbcp, ...) exited non-zero."""


class SshConnectionError(RetryableError):
    """The SSH connection to another site could not be made, was cut, or stalled (no answer
    for :data:`packhorse.storage.sftp.STALL_SECONDS`). Retried with backoff; the transfer keeps
    its partial file, so the next attempt resumes from its verified prefix
    (docs/reliability.md "Resumable transfers").

    Links between sites drop for minutes, hours or days: it is retried for as long as the link
    stays cut, whatever the operation's ``max_retries`` (:attr:`retry_without_limit`; the backoff
    capped at ``[recovery] retry_backoff_max_seconds``, 300 s by default), never FAILED for it:
    the transfer resumes by itself when the link returns. Meanwhile ``packhorse status`` lists
    the link as blocked (cause ``link_unreachable``, since its first failure). A host key or a
    login the server refuses is no cut link (:class:`HostKeyError`,
    :class:`SshAuthenticationError`: permanent).

    Its ``step`` says whether the link carried data before it failed: :attr:`AFTER_DATA` once a
    payload byte had arrived since the connections were made (a new cut begins), else
    :attr:`BEFORE_DATA` (the same cut goes on); ``status`` dates a cut link by it."""

    retry_without_limit = True
    #: ``step`` of a failure after payload bytes had arrived over the connection
    AFTER_DATA = "transfer"
    #: ``step`` of a failure before any payload byte arrived since the connections were made
    BEFORE_DATA = "connect"


class StorageServiceError(RetryableError):
    """An object store (S3) answered with an error or could not be reached.

    The message names the location, bucket and key and the service's error code; credentials
    never appear in it.

    Args:
        code: the service's error code (``"AccessDenied"``, ``"SlowDown"``, ...), when it gave one.
    """

    def __init__(self, message: str, *, code: str | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.code = code


class StorageBusyError(StorageServiceError):
    """The store could not do it *now* but will in a moment: a concurrent conditional write to
    the same key is in progress (S3 ``409 ConditionalRequestConflict``), or a concurrent
    deletion pruned the folder a write was starting in (disk).

    Retried a few times at once by :class:`packhorse.storage.layers.RetryLayer` (the only
    retry loop of the storage stack); a :meth:`~packhorse.storage.base.PendingWrite.publish`
    that raises it leaves the pending write intact, so publishing can be tried again.
    """


class DestinationWriteError(RetryableError):
    """Writing an object's bytes to a disk location failed (``ENOSPC``, ``EDQUOT``, ``EIO``).

    Raised by :mod:`packhorse.storage.disk` after it removed the partial file (a full disk is
    not left full of a half-written object); the message names the location and the key.
    Retried. With ``out_of_space`` (``ENOSPC``, ``EDQUOT``) it is never an operation's failure:
    the worker hands the operation back to wait for space (no retry counted; listed blocked,
    cause ``location_full``) until deletions under disk pressure or an operator free some
    (:func:`packhorse.engine.worker._wait_for_space`).
    """

    def __init__(self, message: str, *, out_of_space: bool = False, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.out_of_space = out_of_space


class RestoreRequiredError(RetryableError):
    """A cold-storage object must be restored before it can be read (staging).

    Stages that read from cold locations request the restore and wait for it without holding
    a worker; reaching this error elsewhere means a read was attempted too early.
    """


class LocationUnavailableError(RetryableError):
    """A data location cannot be used now: its root is missing (an unmounted disk, a renamed
    folder, a missing bucket) or its identity marker is missing or names another location
    (DESIGN.md "Architecture": storage that is absent is not empty; :mod:`packhorse.rules.availability`).

    Never an operation's failure: the worker defers the operation until the location is back
    (no retry counted) and records the outage once. Backends raise it instead of creating a
    missing root or answering "no such object" from a root that is not there.

    Args:
        message: names the location and its path or bucket.
        location: the data location's name.
        reason: why it is unavailable (one sentence).
        marker_only: ``True`` when the root is there but its identity marker is missing
            (released by ``packhorse init``), ``False`` when the root itself is missing.
        wrong_uuid: ``True`` when the marker names the location but carries another uuid than
            the one ``packhorse init`` recorded (storage of another installation).
        fault: the storage's own refusal that made the location unavailable while its root and
            marker are there: an errno name (``"EROFS"``, ``"EIO"``, ``"EACCES"``) or an object
            store's error code (``"AccessDenied"``); ``None`` for a missing root or marker. A
            location with a fault is available again only when a write there succeeds
            (:func:`packhorse.rules.availability.probe`).
    """

    def __init__(self, message: str, *, location: str, reason: str | None = None, marker_only: bool = False,
                 path: str | None = None, wrong_uuid: bool = False, fault: str | None = None) -> None:
        super().__init__(message, side="destination", path=path, host=location,
                         diagnosis=("run `packhorse init` to mark the location (an existing root with data and no "
                                    "marker is adopted), or mount the storage that belongs there" if marker_only else
                                    "remount / restore the location's root; packhorse resumes by itself"))
        self.location = location
        self.reason = reason or message
        self.marker_only = marker_only
        self.wrong_uuid = wrong_uuid
        self.fault = fault


class OperationDeferred(PackhorseError):
    """The operation cannot go on yet (e.g. a cold-storage restore is in progress).

    Not a failure: the worker hands the operation back as ``PENDING`` with ``not_before`` =
    now + ``seconds`` (no retry counted, no failure event) and is free for other work.

    Args:
        message: why it waits (kept in the operation's log line).
        seconds: when to look again.
    """

    def __init__(self, message: str, *, seconds: float) -> None:
        super().__init__(message)
        self.seconds = seconds


class DeletionNotSafeError(OperationDeferred):
    """The deletion rule (I1) does not hold for this copy (or these source files) now; nothing
    was deleted.

    The deletion manager creates a deletion only when the rule holds, so this means one of its
    preconditions changed between planning and running (a buffer copy of a package the bundle
    carries was lost and is being made again, an archive copy failed its fixity check, the
    package is no longer archived). That is not a failure: the worker hands the operation back
    ``PENDING`` with ``not_before`` (a backoff growing with its attempts, up to
    ``[recovery] retry_backoff_max_seconds``; no retry counted, no failure event) and a note of
    why it waits, the deletion manager makes it due again as soon as the rule holds
    (:func:`packhorse.managers.deletions.wake_safe_deletions`), and the stage checks the rule
    again before any byte goes. ``run --until-idle`` does not wait for a deletion that waits
    only on this when nothing else is left to run.

    Args:
        message: which rule blocks it, naming the copy.
        seconds: how long to wait; ``None`` lets the worker choose the backoff.
        step, side, path, host: where, as for :class:`OperationError`.
    """

    def __init__(self, message: str, *, seconds: float | None = None, step: str | None = None,
                 side: str | None = None, path: str | None = None, host: str | None = None) -> None:
        super().__init__(message, seconds=0.0 if seconds is None else seconds)
        self.backoff = seconds is None
        self.step, self.side, self.path, self.host = step, side, path, host


class DeletionDeferredError(DeletionNotSafeError):
    """Only operations still in flight on this copy (e.g. a transfer waiting between retries)
    block its deletion; nothing was deleted and it waits like any :class:`DeletionNotSafeError`."""
