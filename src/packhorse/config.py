"""Settings: the TOML file, ``PACKHORSE_*`` environment overrides, defaults and validation.

The minimum schema is a contract; see ``docs/configuration.md`` for every key.
Every duration is in seconds and accepts floats. Relative paths (``locations[].path``, a
relative SQLite database file) resolve against the folder of the configuration file.

A wrong configuration (unknown key, unknown site, missing buffer, duplicate names,
overlapping paths, a wrong value) raises :class:`~packhorse.errors.ConfigError` whose
message names the file and the key, e.g. ``packhorse.toml: locations[2].site: unknown
site 'koeln'``.

Environment overrides use ``PACKHORSE_<SECTION>__<KEY>``, e.g.
``PACKHORSE_DATABASE__URL=postgresql+psycopg://...`` or
``PACKHORSE_RECOVERY__LEASE_TIMEOUT_SECONDS=30``; they win over the file.
"""

from __future__ import annotations

import os
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from packhorse.domain import LocationRole, StorageType, TransferMethod
from packhorse.errors import ConfigError
from packhorse.scanfilter import check_pattern

DEFAULT_CONFIG_FILE = "packhorse.toml"
ENV_PREFIX = "PACKHORSE_"


class _EnvValue(str):
    """The text of a ``PACKHORSE_*`` environment variable: converted to the key's type (a TOML
    value must have that type already)."""


def _scalar_kind(annotation: Any) -> str | None:
    """``"number"`` for an int or float key (optional or not), ``"boolean"`` for a bool key."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) \
        else (annotation,)
    kinds = {a for a in args if a is not type(None)}
    if kinds == {bool}:
        return "boolean"
    if kinds and kinds <= {int, float}:
        return "number"
    return None


class _Section(BaseModel):
    """Base of every settings table: unknown keys are refused; numbers must be finite numbers
    (not ``inf``, ``nan``, ``true`` or ``"2"``) and booleans ``true`` or ``false``."""
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _toml_type(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, _EnvValue) or info.field_name is None:
            return value
        kind = _scalar_kind(cls.model_fields[info.field_name].annotation)
        if kind == "number" and isinstance(value, (bool, str)):
            raise ValueError(f"{value!r} is not a number")
        if kind == "boolean" and not isinstance(value, bool):
            raise ValueError(f"{value!r} is not true or false")
        return value


class DatabaseConfig(_Section):
    """``[database]``: the ops database (SQLite file by default, PostgreSQL in production).

    ``pool_size`` / ``max_overflow``: PostgreSQL connections kept open / opened on demand per
    process (every Celery pool child, manager and monitor has its own pool; see
    ``docs/deployment.md`` for sizing the server's ``max_connections``).

    ``clock_offset_warn_seconds``: every process times leases, heartbeats and ages by the
    database server's clock (:mod:`packhorse.db.clock`); one whose host clock is farther than
    this (s) from it logs one ``clock_offset`` WARNING and is marked in ``packhorse health``.
    """

    url: str = "sqlite:///packhorse.db"
    pool_size: int = Field(5, ge=1, le=100)
    max_overflow: int = Field(5, ge=0, le=100)
    clock_offset_warn_seconds: float = Field(2.0, gt=0)


class ExecutorConfig(_Section):
    """``[executor]``: where operations run.

    ``workers``: operations run at once by ``packhorse run``. ``pool``: ``"process"`` (default;
    one worker process each, every core used) or ``"thread"`` (threads of the ``run``
    process; for debugging). ``prefetch_multiplier`` (local pool only, as Celery's setting of
    that name): ``packhorse run`` hands up to ``workers × prefetch_multiplier`` tasks (an
    operation, or a batch of buffer-copy deletions) to its pool at once, so a worker that
    finishes one starts the next without waiting for the main loop (many small operations). Celery workers always use 1 (a message is only held
    while it runs, :mod:`packhorse.executors.celery_app`).
    """

    kind: Literal["local", "celery"] = "local"
    workers: int = Field(4, ge=1, le=256)
    prefetch_multiplier: int = Field(2, ge=1, le=64)
    pool: Literal["process", "thread"] = "process"
    broker_url: str | None = None
    visibility_timeout_seconds: float = Field(3600.0, gt=0)


class SiteConfig(_Section):
    """``[[sites]]``: a place with storage and workers."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class SshConfig(_Section):
    """``[locations.ssh]``: how the workers of other sites reach this data location over SSH
    (a route's ``method = "sftp"`` pulls bundles from the source site's buffer through it;
    :mod:`packhorse.storage.sftp`). Key authentication only, and the server's host key must be
    listed in ``known_hosts_file`` (never trusted on first use).

    ``host`` / ``port``: the SSH server of the site that owns the location. ``user``: the account
    (default: the user the reading worker runs as, as ``ssh`` does). ``key_file``: the reading
    site's private key (OpenSSH or PEM, no passphrase). ``known_hosts_file``: an OpenSSH
    known-hosts file listing the server's host key (default ``~/.ssh/known_hosts``). ``path``:
    the location's root as that account sees it (default: the location's ``path``; differs
    under a chrooted SFTP account). Paths expand ``~`` and resolve against the configuration
    file's folder, on the reading site's hosts. ``connect_timeout_seconds``: one connection
    attempt, seconds.
    """

    host: str = Field(min_length=1)
    port: int = Field(22, ge=1, le=65535)
    user: str | None = Field(None, min_length=1)
    key_file: str = Field(min_length=1)
    known_hosts_file: str = Field("~/.ssh/known_hosts", min_length=1)
    path: str | None = Field(None, min_length=1)
    connect_timeout_seconds: float = Field(30.0, gt=0)


class LocationConfig(_Section):
    """``[[locations]]``: a storage area at a site, with a role and a storage type.

    ``retention_seconds`` is how long a buffer copy is kept after it may be deleted (default
    7 days; disk pressure may shorten it, never the safety rules: ``docs/deletion.md``).

    ``include`` / ``exclude`` (source locations only): glob patterns of paths relative to the
    location's root (``/`` separates folders, ``*`` and ``?`` stay within one name, ``**``
    spans folders, a pattern without ``/`` matches a name at any depth), applied at scan time:
    with ``include`` only matching files are registered; a file matching ``exclude`` never is
    (:mod:`packhorse.scanfilter`).

    ``read_only`` (source locations only): packhorse never writes there — not the identity
    marker (``packhorse init`` keeps the location's identity in the ops database instead: a
    uuid and fingerprints of the root, :func:`packhorse.storage.identity.root_fingerprint`), not
    a deletion. For instrument data exported read-only (NFS, a read-only bind mount). A source
    whose root is found read-only at start-up is treated so too, with a warning. Refused
    together with ``[deletion] delete_source_files``.
    """

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    site: str
    role: LocationRole
    read_only: bool = False
    storage: StorageType = StorageType.DISK
    path: str | None = None
    active: bool = True
    retention_seconds: float = Field(604800.0, ge=0)
    include: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)
    # -- storage = "s3" (docs/object-storage.md). Credentials never go here: the
    # standard AWS chain (environment, profile, instance role) supplies them.
    bucket: str | None = Field(None, min_length=3, max_length=63)
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    path_style: bool = False
    write_once_probe: bool = True
    object_lock_mode: Literal["GOVERNANCE", "COMPLIANCE"] | None = None
    object_lock_retain_days: float | None = Field(None, gt=0)
    multipart_threshold_bytes: int = Field(64 * 1024**2, ge=1)
    multipart_part_bytes: int = Field(64 * 1024**2, ge=5 * 1024**2)
    # -- storage = "azure" (docs/object-storage.md); also prefix, cold, object_lock_*, multipart_*.
    # The connection string is a secret: never printed (SecretStr), or taken from the
    # AZURE_STORAGE_CONNECTION_STRING variable when not set here.
    account_url: str | None = None
    container: str | None = Field(None, min_length=3, max_length=63)
    connection_string: SecretStr | None = None
    rehydrate_priority: Literal["Standard", "High"] = "Standard"
    # -- cold storage and the fixity audit
    cold: bool = False
    restore_poll_seconds: float = Field(300.0, gt=0)
    fixity_interval_seconds: float = Field(30 * 86400.0, gt=0)
    fixity_bytes_per_second: float | None = Field(None, gt=0)
    #: source locations: re-hash the registered files still there every this many seconds
    #: (the source audit, :mod:`packhorse.managers.source_audit`; ``None``: only on demand,
    #: ``packhorse verify --location``); its reads keep to ``fixity_bytes_per_second``
    source_audit_interval_seconds: float | None = Field(None, gt=0)
    # -- how other sites reach it (disk locations; docs/configuration.md)
    ssh: SshConfig | None = None

    @property
    def object_store_uri(self) -> str | None:
        """Where an object-store location keeps its objects, for people: ``s3://<bucket>/<prefix>``
        or ``azure://<container>/<prefix>`` (``<account_url>`` said separately); ``None`` for
        a disk location (its root is :meth:`Settings.location_path`)."""
        prefix = (self.prefix or "").strip("/")
        if self.storage is StorageType.S3:
            return f"s3://{self.bucket}/{prefix}"
        if self.storage is StorageType.AZURE:
            return f"azure://{self.container}/{prefix}"
        return None

    @model_validator(mode="after")
    def _disk_needs_path(self) -> "LocationConfig":
        if self.ssh is not None and self.storage is not StorageType.DISK:
            raise ValueError(f"location {self.name!r}: ssh only applies to storage 'disk'")
        if self.storage is StorageType.DISK and not self.path:
            raise ValueError(f"location {self.name!r} has storage 'disk' but no 'path'")
        if self.storage is StorageType.S3 and not self.bucket:
            raise ValueError(f"location {self.name!r} has storage 's3' but no 'bucket'")
        if self.storage is StorageType.S3 and self.path:
            raise ValueError(f"location {self.name!r} has storage 's3': use 'bucket' and 'prefix', not 'path'")
        azure_keys = [k for k in ("account_url", "container", "connection_string") if getattr(self, k)]
        if self.storage is StorageType.AZURE:
            if not (self.account_url and self.container):
                raise ValueError(f"location {self.name!r} has storage 'azure' but no 'account_url' and 'container'")
            other = [k for k in ("path", "bucket", "endpoint_url", "region") if getattr(self, k)]
            if other:
                raise ValueError(f"location {self.name!r}: {', '.join(other)} do not apply to storage 'azure'")
        elif azure_keys:
            raise ValueError(f"location {self.name!r}: {', '.join(azure_keys)} only apply to storage 'azure'")
        if self.storage not in (StorageType.S3, StorageType.AZURE):
            s3_only = [k for k in ("bucket", "endpoint_url", "region", "object_lock_mode") if getattr(self, k)]
            if self.cold:
                s3_only.append("cold")
            if s3_only or self.prefix:
                raise ValueError(f"location {self.name!r}: {', '.join(s3_only or ['prefix'])} only apply to "
                                 "storage 's3' (and 'azure')")
        if (self.object_lock_mode is None) != (self.object_lock_retain_days is None):
            raise ValueError(f"location {self.name!r}: object_lock_mode and object_lock_retain_days go together")
        if (self.include or self.exclude) and self.role is not LocationRole.SOURCE:
            raise ValueError(f"location {self.name!r}: include and exclude only apply to role 'source'")
        if self.read_only and self.role is not LocationRole.SOURCE:
            raise ValueError(f"location {self.name!r}: read_only only applies to role 'source' (packhorse writes "
                             "to every other location)")

        for key in ("include", "exclude"):
            for pattern in getattr(self, key):
                problem = check_pattern(pattern)
                if problem:
                    raise ValueError(f"location {self.name!r}: {key} pattern {pattern!r}: {problem}")
        return self


class RouteConfig(_Section):
    """``[[routes]]``: raw data from ``source_site`` goes to every site in ``destination_sites``.

    ``method = "command"`` runs ``command`` (a template with ``{source}`` and
    ``{destination}`` placeholders, and ``{bandwidth_limit}``, split like a shell line, never
    run through a shell) to move a bundle; the result is verified at the destination either way.
    A template with ``{partial}`` instead of (or as well as) ``{destination}`` declares that the
    command resumes: it is handed the partial file an interrupted earlier attempt left, cut to
    the prefix verified against the source (e.g. ``rsync --partial --append-verify {source}
    {partial}``); with ``{destination}`` alone it always gets an empty partial file.

    ``bandwidth_limit_bytes_per_second``: the most bytes per second the route's transfers
    together may read from the source (``copy``; shared fairly among the route's transfers in
    progress, :mod:`packhorse.ratelimit`). A ``command`` gets it as ``{bandwidth_limit}`` (whole
    bytes per second, e.g. ``rclone copyto --bwlimit {bandwidth_limit} ...``; ``rsync --bwlimit``
    takes KiB, so use ``{bandwidth_limit_kib}``); a template that uses neither with a limit set is
    refused, as the limit would silently not apply.

    ``method = "sftp"`` pulls the bundle from the source site's buffer over SSH, as its
    ``[locations.ssh]`` table says (:mod:`packhorse.storage.sftp`), reading it as ``streams``
    parallel ranged reads over as many SSH connections (default 4; ``sftp`` only). With
    ``compression = true`` its connections ask the SSH server for zlib compression
    (``zlib@openssh.com``, after login; ``none`` when the server offers no compression): fewer
    bytes on a thin link for compressible data, CPU at both ends (``sftp`` only; the bytes are
    verified against the recorded sha256 all the same, I4).
    """

    source_site: str
    destination_sites: list[str] = Field(min_length=1)
    method: TransferMethod = TransferMethod.COPY
    command: str | None = None
    bandwidth_limit_bytes_per_second: int | None = Field(None, ge=1024)
    streams: int = Field(4, ge=1, le=64)
    compression: bool = False

    @model_validator(mode="after")
    def _command_template(self) -> "RouteConfig":
        if self.streams != 4 and self.method is not TransferMethod.SFTP:
            raise ValueError("streams only applies to method 'sftp'")
        if self.compression and self.method is not TransferMethod.SFTP:
            raise ValueError("compression only applies to method 'sftp'")
        if self.method is TransferMethod.COMMAND:
            if not self.command or "{source}" not in self.command or not any(
                    p in self.command for p in ("{destination}", "{partial}")):
                raise ValueError("method 'command' needs a 'command' with {source} and {destination} "
                                 "(or {partial}, for a command that resumes a partial file)")
            if self.bandwidth_limit_bytes_per_second is not None and not any(
                    p in self.command for p in ("{bandwidth_limit}", "{bandwidth_limit_kib}")):
                raise ValueError("bandwidth_limit_bytes_per_second is set but 'command' uses neither "
                                 "{bandwidth_limit} nor {bandwidth_limit_kib}: the limit would not apply")
        return self


class PackagingConfig(_Section):
    """``[packaging]``: how raw files are grouped into raw data packages and bundles (bytes, s)."""

    group_depth: int = Field(2, ge=0, le=32)
    max_package_bytes: int = Field(10 * 1024**3, gt=0)
    settle_seconds: float = Field(60.0, ge=0)
    bundle_target_bytes: int = Field(1024**3, gt=0)
    bundle_max_wait_seconds: float = Field(300.0, ge=0)
    #: while fewer than this many bundles of a site are in flight (being built, or at its
    #: buffer and not yet transferred to every destination), its partial bundle ships without
    #: waiting ``bundle_max_wait_seconds``, so the link is not left idle while packages wait
    #: (:mod:`packhorse.managers.bundles`). 0: the target and the wait alone decide.
    bundles_in_flight: int = Field(0, ge=0, le=64)


class ExtractionConfig(_Section):
    """``[extraction]``: limits for every tar packhorse reads back (bundles at ``unpack``, raw
    data packages at ``unpack`` and ``staging``; :mod:`packhorse.bags.extraction`, DESIGN.md I6).

    A tar with more members than ``max_members``, a member of more than ``max_member_bytes``
    or more than ``max_total_bytes`` in all is refused (a permanent failure naming the key).
    """

    max_members: int = Field(1_000_000, ge=1)
    max_member_bytes: int = Field(1 << 40, ge=1)
    max_total_bytes: int = Field(4 << 40, ge=1)


class ManagersConfig(_Section):
    """``[managers]``: the fallback polling interval (finished work wakes managers at once) and
    how often runtime settings are re-read."""

    poll_interval_seconds: float = Field(10.0, gt=0)
    #: how often running services re-read runtime settings (``packhorse config set``), seconds
    runtime_settings_refresh_seconds: float = Field(60.0, gt=0)
    #: consecutive failed cycles of a manager loop before a CRITICAL log and notification
    max_consecutive_errors: int = Field(5, ge=1)


class RecoveryConfig(_Section):
    """``[recovery]``: leases, heartbeats, retries and circuit breakers (seconds; DESIGN.md numbers)."""

    lease_timeout_seconds: float = Field(300.0, gt=0)
    heartbeat_interval_seconds: float = Field(60.0, gt=0)
    monitor_interval_seconds: float = Field(60.0, gt=0)
    max_retries: int = Field(3, ge=0)
    retry_backoff_base_seconds: float = Field(2.0, ge=0)
    retry_backoff_max_seconds: float = Field(300.0, ge=0)
    max_stall_count: int = Field(3, ge=1)
    #: an open circuit breaker lets one attempt through after this cool-down (half-open)
    circuit_breaker_cooldown_seconds: float = Field(600.0, ge=0)
    #: the longest cool-down: each failed attempt after a cool-down doubles it, up to this
    circuit_breaker_timeout_seconds: float = Field(3600.0, ge=0)
    reconcile_floor_seconds: float | None = Field(None, ge=0)
    reconcile_max_resets: int = Field(3, ge=0)
    #: after the reconciler gave up on an operation (``reconcile_max_resets`` reached), it
    #: re-dispatches it once more after this cool-down (half-open), seconds
    reconcile_cooldown_seconds: float = Field(3600.0, ge=0)
    #: a source location whose scan has not completed for this long (seconds) is listed by
    #: ``status`` (blocked, ``scan_overdue``) and ``health`` (distributed mode: scan leases)
    scan_overdue_seconds: float = Field(3600.0, gt=0)
    notification_cooldown_seconds: float = Field(3600.0, ge=0)
    #: how often every service / worker process records its health heartbeat (seed 002: 30 s)
    service_heartbeat_interval_seconds: float = Field(30.0, gt=0)
    #: a service whose last heartbeat is older than this is dead (seed 002: 90 s)
    service_dead_after_seconds: float = Field(90.0, gt=0)
    #: a dead service's row is forgotten (no longer listed or counted) this long after its
    #: last heartbeat; a restarted service takes its row over at once
    service_forget_after_seconds: float = Field(86400.0, gt=0)

    @model_validator(mode="after")
    def _heartbeat_fits_lease(self) -> "RecoveryConfig":
        if self.heartbeat_interval_seconds * 1.5 >= self.lease_timeout_seconds:
            raise ValueError(
                "heartbeat_interval_seconds must be less than lease_timeout_seconds / 1.5 "
                f"(got {self.heartbeat_interval_seconds} and {self.lease_timeout_seconds})"
            )
        return self

    def breaker_cooldown_seconds(self, trips: int) -> float:
        """The cool-down of a circuit breaker opening for the ``trips``-th time since it last
        closed (1 = the first opening): ``circuit_breaker_cooldown_seconds`` doubled with each
        failed attempt after a cool-down, at most ``circuit_breaker_timeout_seconds`` (but never
        shorter than the first cool-down). Seconds."""
        base = self.circuit_breaker_cooldown_seconds
        return max(base, min(self.circuit_breaker_timeout_seconds, base * 2 ** max(0, min(trips - 1, 30))))

    @property
    def renewal_deadline_seconds(self) -> float:
        """How long a worker may go without renewing its lease before it stops (restic rule).

        ``lease_timeout − 1.5 × heartbeat_interval`` (DESIGN.md "Numbers").
        """
        return self.lease_timeout_seconds - 1.5 * self.heartbeat_interval_seconds


class DeletionConfig(_Section):
    """``[deletion]``: when buffer and source copies may go.

    ``delete_source_files``: delete source files once their package is archived and
    ``source_retention_seconds`` have passed since (default one day). A file is deleted only if
    its size, mtime and sha256 still match its registration and it has not been modified for
    that long; source folders are never removed. packhorse cannot see open file handles: an
    instrument that pauses longer than this in the middle of a file would lose what it writes
    after the deletion (I1), so keep the retention well above any pause.

    ``archive_copies_required``: verified archive copies needed before a raw data package's
    buffer copies go; default (``None``) is every long-term archive of every destination site
    of its route.
    """
    delete_source_files: bool = False
    source_retention_seconds: float = Field(86400.0, ge=0)
    archive_copies_required: int | None = Field(None, ge=1)


class QuarantineConfig(_Section):
    """``[quarantine]``: how long what packhorse moved aside (``_packhorse/quarantine/`` of a
    location: bad archive copies, damaged buffer copies or staged folders) is kept at least.

    ``min_retention_seconds``: ``packhorse quarantine purge`` refuses to remove entries younger
    than this (default 30 days, 2592000 s): time to look at a bad copy before it goes.
    Nothing is ever purged by itself.
    """
    min_retention_seconds: float = Field(30 * 86400.0, ge=0)


Level = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


class SmtpConfig(_Section):
    """``[notifications.smtp]``: e-mail through an SMTP server (stdlib ``smtplib``).

    ``recipients`` receive every level that ``recipients_by_level`` does not name;
    ``recipients_by_level = {ERROR = ["oncall@..."]}`` replaces the list for that level.
    ``password_env`` is the *name* of the environment variable holding the password (the
    password itself is never in the file). ``ssl`` opens an implicit-TLS connection (port
    465); ``starttls`` upgrades a plain one. ``ca_file``: a PEM file of the certificate
    authorities to trust instead of the system ones (a site's private CA); the server's
    certificate and host name are always checked. ``timeout_seconds`` bounds every network
    step (connect, each reply).
    """

    host: str = Field(min_length=1)
    port: int = Field(25, ge=1, le=65535)
    starttls: bool = False
    ssl: bool = False
    username: str | None = None
    password_env: str | None = None
    from_address: str = Field(min_length=3, pattern=r".+@.+")
    recipients: list[str] = Field(default_factory=list)
    recipients_by_level: dict[Level, list[str]] = Field(default_factory=dict)
    timeout_seconds: float = Field(30.0, gt=0)
    ca_file: Path | None = None

    @model_validator(mode="after")
    def _tls_choice(self) -> "SmtpConfig":
        if self.ca_file is not None:
            if not (self.ssl or self.starttls):
                raise ValueError("ca_file is set but neither ssl nor starttls is: the certificate would never be checked")
            if not self.ca_file.is_file():
                raise ValueError(f"ca_file {str(self.ca_file)!r} is not a readable file")
        if self.ssl and self.starttls:
            raise ValueError("choose either ssl (implicit TLS) or starttls, not both")
        if self.username and not self.password_env:
            raise ValueError("username is set but password_env (the variable holding the password) is not")
        return self

    def recipients_for(self, level: str) -> list[str]:
        """Addresses for a notification of ``level``: the per-level list, else the default one."""
        return list(self.recipients_by_level.get(level, self.recipients))  # type: ignore[call-overload]


class NotificationsConfig(_Section):
    """``[notifications]``: delivery of the notification outbox (DESIGN.md numbers).

    Channels: ``[notifications.smtp]`` and ``apprise_urls`` (any apprise URL: Slack, Matrix,
    ntfy, …), with ``apprise_urls_by_level`` replacing the list per level. A failed delivery
    is retried ``max_retries`` times with exponential backoff and jitter
    (``retry_backoff_base_seconds`` doubling, capped at ``retry_backoff_max_seconds``), then
    the notification is a dead letter (``packhorse notifications --dead``).
    ``development_mode`` also notifies every retry (DEBUG) and marks subjects ``[DEV]``.

    ``digest_gather_seconds``: a permanent failure's message waits this long for the other
    failures of its root cause, which it then lists (one digest, not one message each).
    ``until_idle_delivery_seconds``: how long ``run --until-idle`` spends delivering at its end
    (what is not delivered by then stays in the outbox for ``packhorse notifier``).
    ``stop_grace_seconds``: how long a stopping notifier lets a delivery in progress finish.
    """
    enabled: bool = True
    development_mode: bool = False
    apprise_urls: list[str] = Field(default_factory=list)
    apprise_urls_by_level: dict[Level, list[str]] = Field(default_factory=dict)
    smtp: SmtpConfig | None = None
    subject_prefix: str = "[packhorse]"
    max_retries: int = Field(5, ge=0)
    retry_backoff_base_seconds: float = Field(60.0, ge=0)
    retry_backoff_max_seconds: float = Field(3600.0, ge=0)
    poll_interval_seconds: float = Field(5.0, gt=0)
    lease_seconds: float = Field(120.0, gt=0)
    still_alive_interval_seconds: float = Field(86400.0, gt=0)
    digest_gather_seconds: float = Field(30.0, ge=0)
    until_idle_delivery_seconds: float = Field(10.0, gt=0)
    stop_grace_seconds: float = Field(2.0, gt=0, le=4)

    @property
    def channels_configured(self) -> bool:
        """True when at least one channel (SMTP or an apprise URL) is configured."""
        return self.smtp is not None or bool(self.apprise_urls) or any(self.apprise_urls_by_level.values())


class DiskUsageConfig(_Section):
    """``[disk_usage]``: the disk monitor (seed 002 numbers: every 60 s; 70 / 85 / 95 / 60 %).

    Every active disk location is measured every ``interval_seconds``; crossing
    ``warning_percent``, ``critical_percent`` or ``emergency_percent`` notifies once, falling
    below ``recovery_percent`` notifies the recovery. Samples older than ``keep_days`` are
    pruned. A measurement older than ``stale_after_seconds`` no longer steers deletions.
    """
    interval_seconds: float = Field(60.0, gt=0)
    warning_percent: float = Field(70.0, gt=0, le=100)
    critical_percent: float = Field(85.0, gt=0, le=100)
    emergency_percent: float = Field(95.0, gt=0, le=100)
    recovery_percent: float = Field(60.0, gt=0, le=100)
    keep_days: float = Field(30.0, gt=0)
    stale_after_seconds: float = Field(300.0, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> "DiskUsageConfig":
        if not (self.recovery_percent < self.warning_percent < self.critical_percent < self.emergency_percent):
            raise ValueError("thresholds must satisfy recovery_percent < warning_percent < critical_percent "
                             f"< emergency_percent (got {self.recovery_percent}, {self.warning_percent}, "
                             f"{self.critical_percent}, {self.emergency_percent})")
        return self
class ApiConfig(_Section):
    """``[api]``: the HTTP API and dashboard (``packhorse api``, ``packhorse run --api``).

    ``live_check_ttl_seconds``: how long a live-check result can be fetched by its correlation
    id (seed 002: 900 s). ``dashboard_refresh_seconds``: how often the dashboard reloads.
    ``history_interval_seconds``: how often the backlog per stage is sampled for the
    dashboard's charts (by ``packhorse run`` and ``packhorse api``); ``history_keep_days``: how
    long those samples are kept (:mod:`packhorse.status.history`).
    """

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    live_check_ttl_seconds: float = Field(900.0, gt=0)
    dashboard_refresh_seconds: float = Field(5.0, gt=0)
    history_interval_seconds: float = Field(60.0, ge=1)
    history_keep_days: float = Field(7.0, gt=0)


class HooksConfig(_Section):
    """``[hooks]``: a module of fault hooks, for tests and the chaos harness only.

    ``module`` is a Python file path or a dotted module name that defines
    ``make_hooks(settings) -> packhorse.runtime.hooks.Hooks``; every process that builds a stage
    context loads it (so worker processes started by the local executor or by Celery get the
    same hooks as the process that set it). Leave it unset in production: packhorse then runs
    with :data:`packhorse.runtime.hooks.NO_HOOKS`, which does nothing (:mod:`packhorse.runtime.hooks`).
    """

    module: str | None = None


class InfluxDBConfig(_Section):
    """``[metrics.influxdb]``: the InfluxDB metrics sink (:mod:`packhorse.runtime.influx`); off unless
    ``url`` is set. InfluxDB 1.x: ``database``; 2.x: ``org``, ``bucket`` and ``token`` (a
    secret, never printed). Points wait in a queue of ``queue_points`` and go out in batches
    of up to ``batch_points`` at least every ``flush_interval_seconds``; a failed batch is
    tried again every ``retry_seconds``; one request may take ``timeout_seconds``; a process
    that ends waits ``close_timeout_seconds`` at most for what is queued."""

    url: str | None = None
    database: str | None = None
    org: str | None = None
    bucket: str | None = None
    token: SecretStr | None = None
    batch_points: int = Field(500, ge=1)
    flush_interval_seconds: float = Field(1.0, gt=0)
    queue_points: int = Field(10_000, ge=1)
    retry_seconds: float = Field(5.0, gt=0)
    timeout_seconds: float = Field(5.0, gt=0)
    close_timeout_seconds: float = Field(5.0, ge=0)

    @model_validator(mode="after")
    def _one_version(self) -> "InfluxDBConfig":
        if self.url is None:
            return self
        if self.database and (self.org or self.bucket):
            raise ValueError("metrics.influxdb: set database (InfluxDB 1.x) or org and bucket (2.x), not both")
        if not self.database and not (self.org and self.bucket and self.token):
            raise ValueError("metrics.influxdb: url needs database (InfluxDB 1.x) or org, bucket and token (2.x)")
        return self


class MetricsConfig(_Section):
    """``[metrics]``: metrics sinks beside Prometheus (``/metrics`` of the API needs none)."""

    influxdb: InfluxDBConfig = InfluxDBConfig()


class Settings(_Section):
    """The whole configuration. Build it with :func:`load_config` or :func:`settings_from_dict`."""

    database: DatabaseConfig = DatabaseConfig()
    executor: ExecutorConfig = ExecutorConfig()
    sites: list[SiteConfig] = Field(default_factory=list)
    locations: list[LocationConfig] = Field(default_factory=list)
    routes: list[RouteConfig] = Field(default_factory=list)
    packaging: PackagingConfig = PackagingConfig()
    extraction: ExtractionConfig = ExtractionConfig()
    managers: ManagersConfig = ManagersConfig()
    recovery: RecoveryConfig = RecoveryConfig()
    deletion: DeletionConfig = DeletionConfig()
    quarantine: QuarantineConfig = QuarantineConfig()
    notifications: NotificationsConfig = NotificationsConfig()
    disk_usage: DiskUsageConfig = DiskUsageConfig()
    api: ApiConfig = ApiConfig()
    hooks: HooksConfig = HooksConfig()
    metrics: MetricsConfig = MetricsConfig()
    #: The folder relative paths were resolved against (not a TOML key).
    base_dir: Path = Field(default=Path("."), exclude=True)
    #: The file the settings were read from, as error messages name it (not a TOML key).
    config_file: str = Field(default="<config>", exclude=True)

    # -- lookups -----------------------------------------------------------------------
    def location(self, name: str) -> LocationConfig:
        """Return the location called ``name``; raises ``KeyError`` if there is none."""
        for loc in self.locations:
            if loc.name == name:
                return loc
        raise KeyError(name)

    def locations_at(self, site: str, role: LocationRole) -> list[LocationConfig]:
        """Active locations of ``site`` with ``role``, in configuration order."""
        return [l for l in self.locations if l.site == site and l.role is role and l.active]

    def buffer_of(self, site: str) -> LocationConfig:
        """The (first active) buffer location of ``site``."""
        return self.locations_at(site, LocationRole.BUFFER)[0]

    def route_from(self, site: str) -> RouteConfig | None:
        """The route whose source is ``site``, or ``None``."""
        for r in self.routes:
            if r.source_site == site:
                return r
        return None

    @property
    def reconcile_floor_seconds(self) -> float:
        """Reconciler floor: configured, else 0 embedded / broker visibility timeout distributed."""
        if self.recovery.reconcile_floor_seconds is not None:
            floor = self.recovery.reconcile_floor_seconds
        else:
            floor = 0.0 if self.executor.kind == "local" else self.executor.visibility_timeout_seconds
        if self.executor.kind == "celery":
            floor = max(floor, self.executor.visibility_timeout_seconds)
        return floor

    # -- cross-table validation --------------------------------------------------------
    @model_validator(mode="after")
    def _check_topology(self) -> "Settings":
        errors: list[str] = []
        site_names = [s.name for s in self.sites]
        for dup in sorted({n for n in site_names if site_names.count(n) > 1}):
            errors.append(f"sites: duplicate site name {dup!r}")
        loc_names = [l.name for l in self.locations]
        for dup in sorted({n for n in loc_names if loc_names.count(n) > 1}):
            errors.append(f"locations: duplicate location name {dup!r}")
        known = set(site_names)
        for i, loc in enumerate(self.locations):
            if loc.site not in known:
                errors.append(f"locations[{i}].site: unknown site {loc.site!r} (location {loc.name!r})")
        sources = [r.source_site for r in self.routes]
        for dup in sorted({n for n in sources if sources.count(n) > 1}):
            errors.append(f"routes: more than one route from source_site {dup!r}")
        for i, route in enumerate(self.routes):
            if route.source_site not in known:
                errors.append(f"routes[{i}].source_site: unknown site {route.source_site!r}")
            for dest in route.destination_sites:
                if dest not in known:
                    errors.append(f"routes[{i}].destination_sites: unknown site {dest!r}")
                elif dest == route.source_site:
                    errors.append(f"routes[{i}].destination_sites: {dest!r} is the route's source site")
            if len(set(route.destination_sites)) != len(route.destination_sites):
                errors.append(f"routes[{i}].destination_sites: a site is listed twice")
            for site in [route.source_site, *route.destination_sites]:
                if site in known and not self.locations_at(site, LocationRole.BUFFER):
                    errors.append(f"routes[{i}]: site {site!r} has no active location with role 'buffer'")
            if route.method is TransferMethod.SFTP and route.source_site in known:
                without = [l.name for l in self.locations_at(route.source_site, LocationRole.BUFFER) if l.ssh is None]
                if without:
                    errors.append(f"routes[{i}]: method 'sftp' reads the buffer of site {route.source_site!r} over "
                                  f"SSH, but location {without[0]!r} has no [locations.ssh] table (host, key_file, "
                                  "known_hosts_file)")
            if route.source_site in known and not self.locations_at(route.source_site, LocationRole.SOURCE):
                errors.append(f"routes[{i}].source_site: site {route.source_site!r} has no 'source' location")
            for dest in route.destination_sites:
                if dest in known and not self.locations_at(dest, LocationRole.LONG_TERM_ARCHIVE):
                    errors.append(
                        f"routes[{i}].destination_sites: site {dest!r} has no active 'long_term_archive' location"
                    )
        if self.deletion.delete_source_files:
            for loc in self.locations:
                if loc.read_only:
                    errors.append(f"deletion.delete_source_files: source location {loc.name!r} is read_only: "
                                  "packhorse never deletes there; set delete_source_files = false or drop read_only")
        if self.extraction.max_member_bytes < self.packaging.max_package_bytes:
            # a bundle's members are its raw package tars: every bundle of full packages would be
            # refused at unpack, permanently
            errors.append(f"extraction.max_member_bytes: {self.extraction.max_member_bytes} is less than "
                          f"packaging.max_package_bytes = {self.packaging.max_package_bytes}; a bundle's members "
                          "are its raw packages, so every unpack of a full package would be refused")
        if self.extraction.max_members < 5:
            # packhorse.bags.packaging.TAG_MEMBERS (4 tag files) and one payload file: packages are
            # split to fit max_members, which cannot be done below that
            errors.append(f"extraction.max_members: {self.extraction.max_members} is less than 5; a raw data "
                          "package is a bag tar of 4 tag files and at least one payload file")
        required = self.deletion.archive_copies_required
        for i, route in enumerate(self.routes):
            archives = sum(len(self.locations_at(d, LocationRole.LONG_TERM_ARCHIVE)) for d in route.destination_sites)
            if required is not None and required > archives:
                errors.append(f"deletion.archive_copies_required: {required} verified archive copies can never "
                              f"exist for routes[{i}] (source_site {route.source_site!r}), which has "
                              f"{archives} long-term archive location(s); buffers would never be freed")
        disk = [(i, l) for i, l in enumerate(self.locations) if l.storage is StorageType.DISK and l.path]
        # realpath: two names for one folder (a symlink) would count one file as two copies.
        # Distributed, each site's folders are on that site's own hosts (its workers write only
        # there): one path at two sites is two folders; embedded, every site is on this host
        one_host = self.executor.kind == "local"
        resolved = [(i, l, Path(os.path.realpath(self._resolve(l.path)))) for i, l in disk]
        for a in range(len(resolved)):
            for b in range(a + 1, len(resolved)):
                ia, la, pa = resolved[a]
                ib, lb, pb = resolved[b]
                if not one_host and la.site != lb.site:
                    continue
                if pa == pb or pa in pb.parents or pb in pa.parents:
                    errors.append(
                        f"locations[{ib}].path: {lb.path!r} (location {lb.name!r}) overlaps "
                        f"{la.path!r} (location {la.name!r})"
                    )
        s3 = [(i, l) for i, l in enumerate(self.locations) if l.storage in (StorageType.S3, StorageType.AZURE)]
        for a in range(len(s3)):
            for b in range(a + 1, len(s3)):
                (_, la), (ib, lb) = s3[a], s3[b]
                pa, pb = la.prefix.strip("/") + "/", lb.prefix.strip("/") + "/"
                same_store = ((la.storage, la.bucket, la.endpoint_url, la.container, la.account_url)
                              == (lb.storage, lb.bucket, lb.endpoint_url, lb.container, lb.account_url))
                if same_store and (pa.startswith(pb) or pb.startswith(pa)):
                    where = f"bucket {lb.bucket!r}" if lb.storage is StorageType.S3 else f"container {lb.container!r}"
                    errors.append(f"locations[{ib}].prefix: {lb.prefix!r} in {where} (location "
                                  f"{lb.name!r}) overlaps location {la.name!r}")
        if errors:
            raise ValueError("; ".join(errors))
        return self

    def _resolve(self, path: str) -> Path:
        """``path`` with a leading ``~`` (or ``~user``) expanded, relative to :attr:`base_dir`."""
        return self.base_dir / os.path.expanduser(path)

    def config_path(self, path: str) -> Path:
        """``path`` from the configuration (a key file, a known-hosts file) as an absolute path:
        ``~`` expanded, relative to the configuration file's folder."""
        return Path(os.path.abspath(self._resolve(path)))

    def location_path(self, name: str) -> Path:
        """Absolute root folder of disk location ``name``."""
        loc = self.location(name)
        assert loc.path is not None
        return Path(os.path.abspath(self._resolve(loc.path)))

    @property
    def database_url(self) -> str:
        """The database URL with a relative SQLite file resolved against :attr:`base_dir`."""
        url = self.database.url
        prefix = "sqlite:///"
        if url.startswith(prefix) and not url.startswith("sqlite:////") and url != "sqlite:///:memory:":
            rel = url[len(prefix):]
            if rel and not rel.startswith(":"):
                return prefix + os.path.abspath(self._resolve(rel))
        return url


def _section_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The settings table (model class) that ``loc`` (a validation error's path, without its
    last item) reaches from :class:`Settings`: ``("locations", 0)`` is a location; ``None`` when
    the path leaves the models (a free-form table)."""
    model: Any = Settings
    for item in loc:
        if isinstance(item, int):
            continue  # an entry of an array of tables: the same table type
        field = getattr(model, "model_fields", {}).get(item)
        if field is None:
            return None
        annotation = field.annotation
        for _ in range(3):  # X | None, list[X], dict[str, X]
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if isinstance(annotation, type) and issubclass(annotation, BaseModel) or not args:
                break
            annotation = args[-1]
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def _did_you_mean(loc: tuple[Any, ...]) -> str:
    """`` (did you mean 'settle_seconds'?)`` for an unknown key ``loc[-1]`` close to a key of
    its table (a misspelt key is the common case), else ``""``."""
    import difflib

    model = _section_at(loc[:-1]) if loc else None
    if model is None or not isinstance(loc[-1], str):
        return ""
    close = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _format_validation_error(source: str, exc: ValidationError, data: dict[str, Any]) -> str:
    parts = []
    for err in exc.errors():
        loc = err.get("loc", ())
        key = ""
        for item in loc:
            if isinstance(item, int):
                key += f"[{item}]"
            else:
                key += ("." if key else "") + str(item)
        msg = err.get("msg", "invalid")
        if err.get("type") == "extra_forbidden":
            msg = "unknown key" + _did_you_mean(tuple(loc))
            if isinstance(err.get("input"), _EnvValue) and all(isinstance(x, str) for x in loc):
                msg += f" (from the environment variable {ENV_PREFIX}{'__'.join(str(x).upper() for x in loc)})"
        msg = msg.removeprefix("Value error, ")
        parts.append(f"{key}: {msg}" if key else msg)
    return f"{source}: " + "; ".join(parts)


ENV_SECTIONS = ("database", "executor", "packaging", "extraction", "managers", "recovery", "deletion", "quarantine",
                "notifications", "disk_usage", "api", "hooks", "metrics")


def _env_overrides(environ: dict[str, str]) -> dict[str, Any]:
    """``PACKHORSE_<SECTION>__<KEY>`` variables as ``{section: {key: value}}``; a further
    ``__`` reaches into a sub-table (``PACKHORSE_NOTIFICATIONS__SMTP__HOST``).

    Raises:
        ConfigError: naming a variable whose section is not one of :data:`ENV_SECTIONS`.
    """
    out: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        section, _, key = name[len(ENV_PREFIX):].lower().partition("__")
        if section not in ENV_SECTIONS or not key:
            raise ConfigError(f"environment variable {name}: unknown section {section!r} "
                              f"(one of {', '.join(ENV_SECTIONS)})")
        table = out.setdefault(section, {})
        *parents, leaf = key.split("__")
        for parent in parents:
            table = table.setdefault(parent, {})
        table[leaf] = _EnvValue(value)
    return out


def _deep_update(target: dict[str, Any], values: dict[str, Any]) -> None:
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            target[key] = dict(target[key])
            _deep_update(target[key], value)
        else:
            target[key] = value


def settings_from_dict(
    data: dict[str, Any], *, base_dir: Path | str = ".", source: str = "<config>",
    environ: dict[str, str] | None = None,
) -> Settings:
    """Validate a configuration mapping (as parsed from TOML) into :class:`Settings`.

    Args:
        data: the parsed TOML document.
        base_dir: folder that relative paths resolve against.
        source: name of the file, used in error messages.
        environ: environment to read ``PACKHORSE_<SECTION>__<KEY>`` overrides from
            (default: ``os.environ``).

    Raises:
        ConfigError: naming ``source`` and every wrong key.
    """
    merged: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    overrides = _env_overrides(dict(os.environ if environ is None else environ))
    if overrides:
        source += " (with PACKHORSE_* environment overrides)"
    for section, values in overrides.items():
        if section in merged and not isinstance(merged[section], dict):
            continue
        _deep_update(merged.setdefault(section, {}), values)
    for internal in ("base_dir", "config_file"):
        if internal in merged:
            raise ConfigError(f"{source}: {internal}: unknown key")
    try:
        return Settings(**merged, base_dir=Path(os.path.abspath(base_dir)), config_file=source)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(source, exc, merged)) from None
    except TypeError as exc:  # e.g. a table where a list was expected
        raise ConfigError(f"{source}: {exc}") from None


def load_config(path: str | os.PathLike[str] | None = None) -> Settings:
    """Read and validate the TOML configuration file.

    Args:
        path: the file; default ``./packhorse.toml``.

    Raises:
        ConfigError: the file is missing, is not valid TOML, or has a wrong key or value.
    """
    p = Path(path or DEFAULT_CONFIG_FILE)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{p}: configuration file not found (use --config or create {DEFAULT_CONFIG_FILE})") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read configuration: {exc.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    return settings_from_dict(data, base_dir=p.resolve().parent, source=str(p))
