"""Build the storage backend of a data location: the one place where backends are composed.

:func:`backend_for` builds the backend of the location's storage type and hands it to
:func:`compose`, which stacks the layers of :mod:`packhorse.storage.layers` around it, from
the caller inwards: logging → retry → read rate (fixity reads only) → the hooks' fault layer
(tests) → backend; :func:`read_limited` adds a transfer's bandwidth share on top. Nothing else
in packhorse builds a backend or a layer.

Azure locations are checked likewise (:func:`azure_backend`: conditional creates, immutability).
S3 locations are checked when their backend is first built in a process: the
write-once probe (refused with a :class:`~packhorse.errors.ConfigError` naming the location
if the store ignores ``If-None-Match: *``, unless ``write_once_probe = false``, which logs a
WARNING and switches to per-object leases with a check before every write) and the Object
Lock check. ``packhorse run`` builds every active location's backend at start, so a bad
store is refused (exit 2) before any work runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import structlog

from packhorse.config import LocationConfig, Settings
from packhorse.domain import StorageType
from packhorse.errors import ConfigError
from packhorse.storage.base import StorageBackend
from packhorse.storage.disk import DiskBackend
from packhorse.storage.layers import LoggingLayer, ReadRateLayer, RetryLayer, limiter_for
from packhorse.storage.object_lease import db_object_lease
from packhorse.storage.s3 import S3Backend, make_client

if TYPE_CHECKING:
    from packhorse.db.session import Database
    from packhorse.ratelimit import RateLimiter
    from packhorse.storage.azure import AzureBackend

log = structlog.get_logger(__name__)
_probe_lock = threading.Lock()
#: (endpoint, bucket, prefix) → the store honours conditional creates (probed once per process)
_probed: dict[tuple[str | None, str, str], bool] = {}


class StorageHooks(Protocol):
    """What :func:`compose` needs of the process's fault hooks
    (:class:`packhorse.runtime.hooks.Hooks` is one): a fault layer to put innermost."""

    def storage_layer(self, backend: StorageBackend) -> StorageBackend:
        """``backend`` wrapped in a fault layer, or ``backend`` itself."""

def backend_for(settings: Settings, location_name: str, *, db: "Database | None" = None,
                hooks: "StorageHooks | None" = None, fixity: bool = False) -> StorageBackend:
    """Return the backend of data location ``location_name``, composed (:func:`compose`).

    Args:
        db: the ops database; needed by S3 locations with ``write_once_probe = false``
            (per-object leases live there).
        hooks: the process's hooks (:mod:`packhorse.runtime.hooks`); ``None``: none.
        fixity: the stack for the fixity audit, whose reads keep to the location's
            ``fixity_bytes_per_second``.

    Raises:
        ConfigError: unknown location, unsupported storage type, an S3 store that ignores
            conditional writes, Object Lock asked for on a bucket without it.
        StorageServiceError: an S3 store could not be reached for its start-time checks.
    """
    try:
        loc = settings.location(location_name)
    except KeyError:
        raise ConfigError(f"unknown data location {location_name!r}") from None
    if loc.storage is StorageType.DISK:
        backend: StorageBackend = DiskBackend(loc.name, settings.location_path(loc.name))
    elif loc.storage is StorageType.S3:
        backend = _s3_backend(settings, loc, db)
    elif loc.storage is StorageType.AZURE:
        backend = azure_backend(loc)
    else:
        raise ConfigError(f"locations: storage type {loc.storage.value!r} of {loc.name!r} is not supported yet")
    backend.restore_poll_seconds = loc.restore_poll_seconds  # how long a wait for a cold restore lasts
    return compose(backend, hooks=hooks, read_bytes_per_second=loc.fixity_bytes_per_second if fixity else None)


def compose(backend: StorageBackend, *, hooks: "StorageHooks | None" = None, read_bytes_per_second: float | None = None,
            retry_attempts: int = 10, retry_delay_seconds: float = 0.05,
            sleep: Callable[[float], None] = time.sleep) -> StorageBackend:
    """Stack the layers around ``backend`` (the one function that does; see the module).

    Args:
        hooks: its :meth:`~packhorse.runtime.hooks.Hooks.storage_layer` goes innermost.
        read_bytes_per_second: hold reads to this rate (the process-wide bucket of the
            location, :func:`~packhorse.storage.layers.limiter_for`); ``None``: unlimited.
        retry_attempts / retry_delay_seconds / sleep: the retry layer's (busy answers only).
    """
    stacked = hooks.storage_layer(backend) if hooks is not None else backend
    if read_bytes_per_second:
        stacked = ReadRateLayer(stacked, limiter_for(backend.location, read_bytes_per_second))
    stacked = RetryLayer(stacked, attempts=retry_attempts, base_delay_seconds=retry_delay_seconds, sleep=sleep)
    return LoggingLayer(stacked)


def read_limited(backend: StorageBackend, limiter: "RateLimiter",
                 on_read: Callable[[], None] | None = None) -> StorageBackend:
    """``backend`` (a composed stack) with its reads held to ``limiter`` (bytes per second):
    a transfer's share of its route's bandwidth limit (:mod:`packhorse.stages.transfer`).
    ``on_read`` is called before each read (the transfer refreshes its share there)."""
    return ReadRateLayer(backend, limiter, on_read)


def azure_backend(loc: LocationConfig) -> AzureBackend:
    """The (bare) Azure Blob backend of location ``loc``, checked once per process: the
    service must refuse a second conditional create (If-None-Match: *, I2), and a location
    asking for immutability (``object_lock_mode``) must get it.

    Raises:
        ConfigError: no or wrong credentials, a service that ignores conditional creates, an
            account without blob immutability for a location asking for it.
        LocationUnavailableError: the container does not exist (work waits for it).
        StorageServiceError: the service could not be reached.
    """
    from packhorse.storage.azure import AzureBackend, make_container_client  # optional: the Azure SDK

    assert loc.account_url is not None and loc.container is not None
    secret = loc.connection_string.get_secret_value() if loc.connection_string is not None else None
    client = make_container_client(account_url=loc.account_url, container=loc.container, connection_string=secret,
                                   location=loc.name)
    backend = AzureBackend(loc.name, client, loc.prefix, block_threshold_bytes=loc.multipart_threshold_bytes,
                           block_bytes=loc.multipart_part_bytes, cold=loc.cold,
                           immutability_mode=loc.object_lock_mode, immutability_days=loc.object_lock_retain_days,
                           rehydrate_priority=loc.rehydrate_priority,
                           restore_poll_seconds=loc.restore_poll_seconds)
    ident = (loc.account_url, loc.container, backend.prefix)
    with _probe_lock:
        honoured = _probed.get(ident)
        if honoured is None and backend.root_missing() is None:
            honoured = _probed[ident] = backend.probe_write_once()
    if honoured is False:
        raise ConfigError(f"locations: {loc.name!r}: the blob service at {loc.account_url} (container "
                          f"{loc.container!r}) ignores If-None-Match: * and would overwrite archived blobs; refusing it")
    backend.check_immutability()
    return backend


def _s3_backend(settings: Settings, loc: LocationConfig, db: "Database | None") -> StorageBackend:
    assert loc.bucket is not None
    client = make_client(endpoint_url=loc.endpoint_url, region=loc.region, path_style=loc.path_style,
                         max_pool=max(10, 2 * settings.executor.workers))
    kwargs = dict(multipart_threshold_bytes=loc.multipart_threshold_bytes,
                  multipart_part_bytes=loc.multipart_part_bytes, object_lock_mode=loc.object_lock_mode,
                  object_lock_retain_days=loc.object_lock_retain_days, cold=loc.cold)
    if not loc.write_once_probe:
        if db is None:
            raise ConfigError(f"locations: {loc.name!r} sets write_once_probe = false, which needs the ops "
                              "database for per-object leases")

        log.warning("s3_write_once_probe_disabled", location=loc.name, bucket=loc.bucket,
                    detail="conditional creates are not used: every publication takes a per-object lease and "
                           "checks the key before writing; a store that overwrites can still lose a race "
                           "with a writer outside packhorse")
        lease = db_object_lease(db, loc.name, lease_seconds=settings.recovery.lease_timeout_seconds,
                                wait_seconds=settings.recovery.lease_timeout_seconds)
        backend = S3Backend(loc.name, client, loc.bucket, loc.prefix, conditional_writes=False,
                            object_lease=lease, **kwargs)  # type: ignore[arg-type]
    else:
        backend = S3Backend(loc.name, client, loc.bucket, loc.prefix, **kwargs)  # type: ignore[arg-type]
        ident = (loc.endpoint_url, loc.bucket, backend.prefix)
        with _probe_lock:
            honoured = _probed.get(ident)
            if honoured is None:
                honoured = _probed[ident] = backend.probe_write_once()
        if not honoured:
            raise ConfigError(
                f"locations: {loc.name!r}: the object store at {loc.endpoint_url or 'AWS S3'} (bucket "
                f"{loc.bucket!r}) ignores If-None-Match: * and would overwrite archived objects; refusing it. "
                "Use a store with conditional writes, or set write_once_probe = false to publish under "
                "per-object leases with a check before every write")
    backend.check_object_lock()
    return backend
