"""Azure Blob backend: a data location stored in an Azure Blob Storage container (block blobs).

Write-once publication (DESIGN.md I2):

* Bytes written to a pending write are spooled locally (in memory up to the block
  threshold, then in a temporary file) and hashed while they arrive; nothing reaches the
  container before ``publish``, so a writer killed before publishing leaves nothing there.
* ``publish`` creates the blob with the condition ``If-None-Match: *``: one ``Put Blob`` up to
  ``block_threshold_bytes``, above it ``Put Block`` per block and a conditional
  ``Put Block List``. Azure answers ``409 BlobAlreadyExists`` when the name is taken: the blob
  there is read back and hashed; the same size and sha256 is "already there", anything else is
  a :class:`~packhorse.errors.DestinationConflictError`. Nothing is ever overwritten.
* Resumable block uploads: a block's id names its index and the sha256 of its bytes, so a
  publication interrupted after some ``Put Block`` calls (a crash, a lost connection) leaves
  uncommitted blocks that the next publication of the same bytes finds
  (``Get Block List``) and does not send again; only the missing blocks go up. Every block
  is sent with a transactional MD5 (``validate_content``): the service refuses bytes damaged
  on the wire. Uncommitted blocks of a blob that was never committed are invisible to
  ``stat``/``list``/``walk``; :meth:`AzureBackend.cleanup_partials` deletes them once old
  (Azure itself discards uncommitted blocks after seven days).
* The sha256 goes into the blob's metadata (``sha256``, hex): a hint for people, never proof
  (I4: the bytes are read back).

Cold storage (``cold = true``) is the **Archive tier**: every published blob is read back and
verified in the hot tier, then moved to Archive (``Set Blob Tier``); :attr:`PublishResult.read_back`
is then true (the caller need not read it again, it could not: an archived blob cannot be
read). Keys under ``_packhorse/`` (the identity marker, quarantine) stay online. Reading an
archived blob needs a rehydration: :meth:`AzureBackend.request_restore` copies it to
``_packhorse/rehydrated/<key>`` in the Hot tier (``Copy Blob`` with a rehydrate priority; the
archived original stays in Archive), :meth:`AzureBackend.restore_ready` tells when that copy
is complete and still of the same blob (its recorded source ETag), and ``open_read`` of an
archived blob reads that copy, or raises :class:`~packhorse.errors.RestoreRequiredError`
while there is none. Fixity and staging then wait (``AWAITING RESTORE``) as for any cold store,
and so does a publication that meets a blob already archived under its name
(:meth:`StorageBackend.holds` requests the rehydration and defers the operation: "already there"
is decided by reading the bytes, never by the metadata). A blob accepted as already there in an
online tier is moved to Archive like a new one (:meth:`AzureBackend.adopt_existing`).
Rehydrated copies older than :data:`REHYDRATED_KEEP_SECONDS` are removed by
:meth:`AzureBackend.cleanup_partials`.

Immutability: with ``immutability_mode`` and ``immutability_days`` every published blob gets
a version-level immutability policy (``Unlocked`` or ``Locked``);
:meth:`AzureBackend.check_immutability` probes at start whether the account supports it and
refuses the location with a :class:`~packhorse.errors.ConfigError` if not (Azurite, the
emulator, answers 501 Not Implemented: docs/object-storage.md).

A missing container is never created (DESIGN.md "Architecture": storage that is absent is not
empty): calls on a container that does not exist raise
:class:`~packhorse.errors.LocationUnavailableError`.

Credentials: a connection string (the location's ``connection_string`` or the
``AZURE_STORAGE_CONNECTION_STRING`` variable). It is never logged or put in an error
message: errors name the service's error code and HTTP status, never the request.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import os
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, BinaryIO

import structlog
from azure.core import MatchConditions
from azure.core.exceptions import AzureError, HttpResponseError, ResourceExistsError, ResourceNotFoundError

from packhorse.errors import (
    ConfigError,
    DestinationConflictError,
    LocationUnavailableError,
    OperationError,
    RestoreRequiredError,
    SourceMissingError,
    StorageServiceError,
    VerificationError,
)
from packhorse.storage.base import (
    CHUNK_BYTES,
    RESERVED_PREFIX,
    Entry,
    EntryKind,
    ObjectInfo,
    PendingWrite,
    PublishResult,
    ReuseListing,
    SpooledPendingWrite,
    StorageBackend,
    check_key,
)

if TYPE_CHECKING:
    from azure.storage.blob import ContainerClient

log = structlog.get_logger(__name__)

#: the environment variable read when a location sets no ``connection_string``
CONNECTION_STRING_VARIABLE = "AZURE_STORAGE_CONNECTION_STRING"
#: seconds to wait for a connection to the account before a try fails (the SDK's default: 20 s);
#: with three tries 1, 2 and 4 s apart a call that cannot reach the account fails in well under
#: a minute, and packhorse's own retry and availability rules take over
CONNECTION_TIMEOUT_SECONDS = 10
#: blob metadata key holding the hex sha256 of the blob
SHA256_METADATA = "sha256"
#: blob metadata key of a rehydrated copy naming the ETag of the archived blob it copies
SOURCE_ETAG_METADATA = "sourceetag"
#: where rehydrated (readable) copies of archived blobs go
REHYDRATED_PREFIX = RESERVED_PREFIX + "rehydrated/"
#: where write-once and immutability probes go
PROBE_PREFIX = RESERVED_PREFIX + "probe/"
#: Azure's largest block count per blob
MAX_BLOCKS = 50_000
#: rehydrated copies are removed by :meth:`AzureBackend.cleanup_partials` after this long (s)
REHYDRATED_KEEP_SECONDS = 7 * 86400.0
#: how long a server-side copy (quarantine) is waited for before it counts as failed (s)
COPY_WAIT_SECONDS = 60.0
#: immutability modes: packhorse's names (those of S3 Object Lock) → Azure's policy modes
IMMUTABILITY_MODES = {"GOVERNANCE": "Unlocked", "COMPLIANCE": "Locked"}


def _blob_sdk() -> Any:
    """The ``azure.storage.blob`` module, imported on first use: it is a third of every
    ``packhorse`` command's start-up, and only a process with an Azure location needs it."""
    import azure.storage.blob as sdk  # noqa: PLC0415 - start-up time (see the docstring)

    return sdk


def make_container_client(*, account_url: str, container: str, connection_string: str | None,
                          location: str) -> ContainerClient:
    """A :class:`ContainerClient` for ``container`` from a connection string (``connection_string``
    or :data:`CONNECTION_STRING_VARIABLE`), checked to point at ``account_url``.

    Raises:
        ConfigError: no connection string, or one for another account (names the location and
            the account URL, never the connection string).
    """
    secret = connection_string or os.environ.get(CONNECTION_STRING_VARIABLE)
    if not secret:
        raise ConfigError(f"locations: {location!r} (storage 'azure') has no credentials: set connection_string or "
                          f"the {CONNECTION_STRING_VARIABLE} environment variable")
    try:
        # fail within seconds when the account does not answer (the SDK's default waits 15 s,
        # then 18 s, 24 s … between tries: a minute of silence per call while the whole run
        # waits); packhorse retries the operation itself and marks the location unavailable
        client = _blob_sdk().ContainerClient.from_connection_string(
            secret, container, connection_timeout=CONNECTION_TIMEOUT_SECONDS,
            retry_policy=_blob_sdk().ExponentialRetry(initial_backoff=1, increment_base=2, retry_total=3, random_jitter_range=1))
    except (ValueError, AzureError):
        raise ConfigError(f"locations: {location!r}: the Azure connection string is not valid") from None
    endpoint = client.primary_endpoint.rstrip("/")
    account = endpoint[: -len(container)].rstrip("/") if endpoint.endswith("/" + container) else endpoint
    if account != account_url.rstrip("/"):
        raise ConfigError(f"locations: {location!r}: account_url {account_url!r} is not the account of the connection "
                          f"string ({account!r})")
    return client


def _code(e: Exception) -> str:
    code = getattr(e, "error_code", None) or ""
    return str(getattr(code, "value", code))


def _status(e: Exception) -> int:
    return int(getattr(e, "status_code", None) or 0)


def _block_id(index: int, digest: str) -> str:
    """The id of block ``index`` with sha256 ``digest`` (hex): equal ids mean equal bytes (47
    characters: the SDK sends it base64-encoded, at most the 64 Azure allows)."""
    return f"{index:06d}-{digest[:40]}"


class _AzureReader(io.RawIOBase):
    """A read-only binary stream over a blob download (supports ``readinto``)."""

    def __init__(self, downloader: Any) -> None:
        self._d = downloader

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self._d.read(len(b))
        n = len(data)
        b[:n] = data
        return n


class _AzurePendingWrite(SpooledPendingWrite):
    def __init__(self, backend: "AzureBackend", key: str) -> None:
        super().__init__(key, location=backend.location, max_memory_bytes=backend.block_threshold_bytes,
                         spool_dir=backend.spool_dir)
        self._b = backend

    def publish(self, expected_sha256: str | None = None) -> PublishResult:
        b = self._b
        try:
            sha = self.check_expected(expected_sha256, b.location)
            created = b._create(self.key, self.spool, self.size, sha)
            if not created:
                b.check_same(self.key, self.size, sha)
                b.adopt_existing(self.key)
                return PublishResult(self.key, self.size, sha, already_there=True)
            read_back = b._archive_after_publish(self.key, sha)
            return PublishResult(self.key, self.size, sha, already_there=False, read_back=read_back)
        finally:
            self.abort()


class AzureBackend(StorageBackend):
    """A data location in an Azure Blob container under ``prefix`` (see the module docstring).

    Args:
        location: the data location's name, for messages.
        client: a :class:`ContainerClient` (see :func:`make_container_client`).
        prefix: blob name prefix of the location inside the container (``""`` or a folder).
        block_threshold_bytes: blobs larger than this go up as blocks (``Put Block``).
        block_bytes: block size (raised so a blob has at most 50,000 blocks).
        cold: the Archive tier holds the published blobs (see the module docstring).
        immutability_mode / immutability_days: ``"GOVERNANCE"`` (an unlocked policy) or
            ``"COMPLIANCE"`` (a locked one) and its length in days, put on every published blob.
        rehydrate_priority: ``"Standard"`` or ``"High"`` (Azure's rehydration priorities).
        restore_poll_seconds: how long an operation that meets an archived blob it must read
            waits before it looks again (:meth:`~StorageBackend.defer_until_readable`).
        spool_dir: folder for local spool files of large writes (default: the system's).
    """

    def __init__(self, location: str, client: ContainerClient, prefix: str = "", *,
                 block_threshold_bytes: int = 64 * 1024**2, block_bytes: int = 64 * 1024**2,
                 cold: bool = False, immutability_mode: str | None = None, immutability_days: float | None = None,
                 rehydrate_priority: str = "Standard", restore_poll_seconds: float = 300.0,
                 spool_dir: str | None = None) -> None:
        if immutability_mode is not None and immutability_mode not in IMMUTABILITY_MODES:
            raise ConfigError(f"locations: {location!r}: immutability mode {immutability_mode!r} is not one of "
                              f"{sorted(IMMUTABILITY_MODES)}")
        self.location = location
        self.client = client
        self.container = client.container_name
        p = prefix.strip("/")
        self.prefix = p + "/" if p else ""
        self.block_threshold_bytes = max(1, block_threshold_bytes)
        self.block_bytes = max(1, block_bytes)
        self.cold = cold
        self.immutability_mode = immutability_mode
        self.immutability_days = immutability_days
        self.rehydrate_priority = rehydrate_priority
        self.restore_poll_seconds = restore_poll_seconds
        self.spool_dir = spool_dir
        #: payload bytes sent in ``Put Block`` requests (blocks an interrupted publication
        #: already staged with the same bytes are not sent again)
        self.bytes_uploaded = 0

    # -- helpers --------------------------------------------------------------------
    def _full(self, key: str) -> str:
        return self.prefix + check_key(key)

    def _blob(self, key: str) -> Any:
        return self.client.get_blob_client(self._full(key))

    def _unavailable(self, key: str | None) -> LocationUnavailableError:
        why = f"the container {self.container!r} does not exist"
        return LocationUnavailableError(f"data location {self.location}: {why}", location=self.location, reason=why,
                                        path=key)

    def _what(self, key: str | None) -> str:
        """What a message names: blob ``key`` of the location in its container and account, or,
        for ``None``, the container itself (never a URL: it may carry a SAS signature)."""
        where = f"container {self.container!r} of account {self.client.account_name!r}"
        if key is None:
            return where
        if not key:
            return f"the blobs under {self.prefix!r} in {where}" if self.prefix else f"the blobs in {where}"
        return f"{key!r} (blob {self.prefix + key!r}) in {where}"

    def _error(self, e: Exception, key: str | None, action: str) -> OperationError:
        """The packhorse error for an SDK error about blob ``key`` (``None``: the container
        itself, ``""``: the listing of the location): a missing container is
        :class:`LocationUnavailableError`, anything else :class:`StorageServiceError` naming the
        blob or container (:meth:`_what`), the service's error code and HTTP status (never the
        request, which may carry a signature)."""
        if _code(e) == "ContainerNotFound":
            return self._unavailable(key)
        what = _code(e) or type(e).__name__
        status = f" (HTTP {_status(e)})" if _status(e) else ""
        return StorageServiceError(f"{self.location}: {action} {self._what(key)} failed: {what}{status}",
                                   side="destination", path=key, host=self.location)

    def _props(self, key: str) -> Any | None:
        """The blob's properties, ``None`` if there is no (committed) blob under ``key``."""
        try:
            return self._blob(key).get_blob_properties()
        except ResourceNotFoundError as e:
            if _code(e) == "ContainerNotFound":
                raise self._unavailable(key) from None
            if not _code(e) and self.root_missing() is not None:
                raise self._unavailable(key) from None
            return None
        except AzureError as e:
            raise self._error(e, key, "looking up") from e

    def _upload_blocks(self, key: str, spool: Any, size: int, metadata: dict[str, str]) -> None:
        """Stage the spool's blocks (those the blob's uncommitted list lacks) and commit them
        under ``If-None-Match: *`` (raises :class:`ResourceExistsError` if the name is taken)."""
        blob = self._blob(key)
        part = max(self.block_bytes, -(-size // MAX_BLOCKS))
        staged: dict[str, int] = {}
        try:
            _committed, uncommitted = blob.get_block_list("uncommitted")
            staged = {blk.id: int(blk.size) for blk in uncommitted}
        except ResourceNotFoundError as e:
            if _code(e) == "ContainerNotFound":
                raise
        ids = []
        reused = 0
        index = 0
        while True:
            data = spool.read(part)
            if not data:
                break
            block = _block_id(index, hashlib.sha256(data).hexdigest())
            if staged.get(block) == len(data):
                reused += len(data)
            else:
                blob.stage_block(block, data, length=len(data), validate_content=True)
                self.bytes_uploaded += len(data)
            ids.append(_blob_sdk().BlobBlock(block_id=block))
            index += 1
        if reused:
            log.info("azure_blocks_resumed", location=self.location, key=key, reused_bytes=reused, size=size)
        blob.commit_block_list(ids, metadata=metadata, match_condition=MatchConditions.IfMissing)

    def _create(self, key: str, spool: Any, size: int, sha: str) -> bool:
        """Create blob ``key`` from the spool if the name is free; ``False`` if it was taken."""
        metadata = {SHA256_METADATA: sha}
        spool.seek(0)
        try:
            if size <= self.block_threshold_bytes:
                self._blob(key).upload_blob(spool.read(), length=size, overwrite=False, metadata=metadata,
                                            validate_content=True)
            else:
                self._upload_blocks(key, spool, size, metadata)
        except ResourceExistsError as e:
            if _code(e) in ("BlobAlreadyExists", ""):
                return False
            raise self._error(e, key, "publishing") from e
        except HttpResponseError as e:
            if _status(e) in (409, 412) and _code(e) in ("BlobAlreadyExists", "ConditionNotMet", ""):
                return False
            raise self._error(e, key, "publishing") from e
        except AzureError as e:
            raise self._error(e, key, "publishing") from e
        return True

    def _archive_after_publish(self, key: str, sha: str) -> bool:
        """After a blob was created: put the immutability policy on it and, in a cold location,
        read it back (I4) and move it to the Archive tier. Returns whether it was read back.

        Raises:
            VerificationError: the blob read back is not the bytes published (left online).
        """
        read_back = False
        if self.cold and not key.startswith(RESERVED_PREFIX):
            got = self.sha256(key)
            if got != sha:
                raise VerificationError(
                    f"{self.location}:{key}: read back after publishing, the blob has sha256 {got}, expected {sha}; "
                    "it is left in the online tier", step="verify", side="destination", path=key, host=self.location)
            read_back = True
            try:
                self._blob(key).set_standard_blob_tier(_blob_sdk().StandardBlobTier.ARCHIVE)
            except AzureError as e:
                raise self._error(e, key, "moving to the Archive tier") from e
        if self.immutability_mode and self.immutability_days:
            until = dt.datetime.now(dt.UTC) + dt.timedelta(days=self.immutability_days)
            try:
                self._blob(key).set_immutability_policy(
                    _blob_sdk().ImmutabilityPolicy(expiry_time=until, policy_mode=IMMUTABILITY_MODES[self.immutability_mode]))
            except AzureError as e:
                raise self._error(e, key, "setting the immutability policy of") from e
        return read_back

    # -- the root -------------------------------------------------------------------
    def root_missing(self) -> str | None:
        """``None`` if the container exists, else why not.

        Raises:
            StorageServiceError: the service could not be asked (unreachable, access denied).
        """
        try:
            self.client.get_container_properties()
        except ResourceNotFoundError:
            return f"the container {self.container!r} does not exist"
        except AzureError as e:
            raise self._error(e, None, "looking up") from e
        return None

    def create_root(self) -> bool:
        """Never creates a container: a missing one is refused with a
        :class:`~packhorse.errors.ConfigError` naming it (the account's owner creates containers)."""
        why = self.root_missing()
        if why is not None:
            raise ConfigError(f"data location {self.location}: {why}; packhorse does not create containers: create "
                              "it, then run `packhorse init` again")
        return False

    # -- interface ------------------------------------------------------------------
    def stat(self, key: str) -> ObjectInfo | None:
        p = self._props(key)
        if p is None:
            return None
        return ObjectInfo(key, int(p.size), p.last_modified.timestamp())

    def metadata_sha256(self, key: str) -> str | None:
        """The sha256 stored in the blob's metadata at publication (a hint, never proof)."""
        p = self._props(key)
        return None if p is None else (p.metadata or {}).get(SHA256_METADATA)

    def access_tier(self, key: str) -> str | None:
        """The blob's access tier (``Hot``, ``Cool``, ``Cold``, ``Archive``), ``None`` if there is no blob."""
        p = self._props(key)
        return None if p is None else str(p.blob_tier) if p.blob_tier else None

    def open_read(self, key: str) -> BinaryIO:
        name = key
        if self.cold:
            p = self._props(key)
            if p is None:
                raise SourceMissingError(f"{self.location}: {key!r} does not exist", side="source", path=key,
                                         host=self.location)
            if str(p.blob_tier) == "Archive":
                if not self._rehydrated(key, p):
                    raise self._restore_required(key)
                name = REHYDRATED_PREFIX + key
        try:
            downloader = self._blob(name).download_blob()
        except ResourceNotFoundError as e:
            if _code(e) == "ContainerNotFound" or (not _code(e) and self.root_missing() is not None):
                raise self._unavailable(key) from None
            raise SourceMissingError(f"{self.location}: {key!r} does not exist", side="source", path=key,
                                     host=self.location) from None
        except HttpResponseError as e:
            if _code(e) == "BlobArchived":
                raise self._restore_required(key) from None
            raise self._error(e, key, "reading") from e
        except AzureError as e:
            raise self._error(e, key, "reading") from e
        return io.BufferedReader(_AzureReader(downloader), buffer_size=CHUNK_BYTES)  # type: ignore[return-value]

    def _restore_required(self, key: str) -> RestoreRequiredError:
        return RestoreRequiredError(
            f"{self.location}: {key!r} is in the Archive tier and not rehydrated; request a restore first",
            side="source", path=key, host=self.location)

    def open_write(self, key: str) -> PendingWrite:
        check_key(key)
        return _AzurePendingWrite(self, key)

    def _delete_name(self, full: str, key: str) -> bool:
        try:
            self.client.get_blob_client(full).delete_blob(delete_snapshots="include")
        except ResourceNotFoundError as e:
            if _code(e) == "ContainerNotFound":
                raise self._unavailable(key) from None
            return False
        except AzureError as e:
            raise self._error(e, key, "deleting") from e
        return True

    def delete(self, key: str, *, prune: bool = True) -> bool:
        """Delete the blob (and a rehydrated copy of it); ``False`` if there was none."""
        if self.stat(key) is None:
            return False
        done = self._delete_name(self._full(key), key)
        if not key.startswith(RESERVED_PREFIX):
            self._delete_name(self.prefix + REHYDRATED_PREFIX + key, key)
        return done

    def _listing(self, start: str, *, include_uncommitted: bool = False) -> Iterator[Any]:
        kwargs: dict[str, Any] = {"include": ["uncommittedblobs"]} if include_uncommitted else {}
        try:
            yield from self.client.list_blobs(name_starts_with=self.prefix + start, **kwargs)
        except AzureError as e:
            raise self._error(e, start, "listing") from e

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        out = []
        for blob in self._listing(prefix):
            key = blob.name[len(self.prefix):]
            if key.startswith(RESERVED_PREFIX):
                continue
            out.append(ObjectInfo(key, int(blob.size), blob.last_modified.timestamp()))
        out.sort(key=lambda o: o.key)
        return iter(out)

    def walk(self, prefix: str = "", *, reuse: ReuseListing | None = None,
             everything: bool = False) -> Iterator[Entry]:
        """See :meth:`StorageBackend.walk`: a container has no folders, links or special files:
        one ``FOLDER`` entry (``prefix``), then every blob under it as a ``FILE`` (size, last
        modified in ns), sorted by key; ``reuse`` is never called. Uncommitted blocks are not blobs.

        Raises:
            LocationUnavailableError: the container does not exist.
            StorageServiceError: the listing failed otherwise.
        """
        if prefix:
            check_key(prefix)
        start = f"{prefix}/" if prefix else ""
        yield Entry(prefix, EntryKind.FOLDER, 0, 0)
        found = []
        for blob in self._listing(start):
            key = blob.name[len(self.prefix):]
            if key.startswith(RESERVED_PREFIX) and not everything:
                continue
            stamp = blob.last_modified
            found.append(Entry(key, EntryKind.FILE, int(blob.size),
                               int(stamp.timestamp()) * 1_000_000_000 + stamp.microsecond * 1000))
        found.sort(key=lambda e: e.path)
        yield from found

    def uncommitted_blobs(self) -> list[tuple[str, float]]:
        """``[(blob name, last modified UTC s)]`` of the names under the location's prefix that
        hold uncommitted blocks only (an interrupted block upload: a partial write)."""
        committed = {b.name for b in self._listing("")}
        return [(b.name, b.last_modified.timestamp()) for b in self._listing("", include_uncommitted=True)
                if b.name not in committed]

    def cleanup_partials(self, older_than_seconds: float, *, resumable_older_than_seconds: float | None = None) -> int:
        """Delete the uncommitted blocks of blobs never committed (an interrupted publication's)
        last touched longer ago than this; every block upload can be resumed, so
        ``resumable_older_than_seconds``, when given, is the age used. Rehydrated copies older
        than :data:`REHYDRATED_KEEP_SECONDS` go too (not counted). Returns how many were removed."""
        age = older_than_seconds if resumable_older_than_seconds is None else resumable_older_than_seconds
        now = time.time()
        try:
            partials = self.uncommitted_blobs()
        except LocationUnavailableError:
            return 0  # nothing of ours can be there; a container is never created to look
        removed = 0
        for name, modified in partials:
            if modified <= now - age:
                try:
                    self.client.get_blob_client(name).delete_blob()
                    removed += 1
                except AzureError as e:  # Azure discards them after seven days anyway
                    log.warning("azure_uncommitted_not_removed", location=self.location, blob=name, error=_code(e))
        for blob in self._listing(REHYDRATED_PREFIX):
            if blob.last_modified.timestamp() <= now - REHYDRATED_KEEP_SECONDS:
                self._delete_name(blob.name, blob.name[len(self.prefix):])
        return removed

    def _copy(self, source_key: str, target_key: str, *, archived: bool) -> None:
        """Server-side copy of ``source_key`` to the new name ``target_key`` (only if free), waited for.

        Raises:
            DestinationConflictError: ``target_key`` is taken.
            StorageServiceError: the copy failed or did not finish within :data:`COPY_WAIT_SECONDS`.
        """
        target = self._blob(target_key)
        extra: dict[str, Any] = {}
        if archived:  # an archived blob can only be copied to an online tier (a rehydration)
            extra = {"standard_blob_tier": _blob_sdk().StandardBlobTier.COOL, "rehydrate_priority": self.rehydrate_priority}
        try:
            result = target.start_copy_from_url(self._blob(source_key).url, match_condition=MatchConditions.IfMissing,
                                                **extra)
        except ResourceExistsError as e:
            if _code(e) == "BlobAlreadyExists":
                raise DestinationConflictError(f"{self.location}: {target_key!r} is taken", path=target_key,
                                               host=self.location) from None
            raise self._error(e, source_key, "copying") from e
        except AzureError as e:
            raise self._error(e, source_key, "copying") from e
        status = result.get("copy_status")
        deadline = time.monotonic() + COPY_WAIT_SECONDS
        while status == "pending" and time.monotonic() < deadline:
            time.sleep(0.5)
            status = target.get_blob_properties().copy.status
        if status != "success":
            raise StorageServiceError(f"{self.location}: copying {source_key!r} to {target_key!r} ended {status!r}",
                                      side="destination", path=source_key, host=self.location)

    def quarantine(self, key: str) -> str | None:
        """Move a bad blob aside (see :meth:`StorageBackend.quarantine`): a server-side copy to
        the quarantine name (an archived blob is copied to the Cool tier, a rehydration), then
        the blob is deleted."""
        p = self._props(key)
        if p is None:
            return None
        target = self.quarantine_key(key)
        self._copy(key, target, archived=str(p.blob_tier) == "Archive")
        self._delete_name(self._full(key), key)
        self._delete_name(self.prefix + REHYDRATED_PREFIX + key, key)
        return target

    # -- start-time checks ----------------------------------------------------------
    def _probe_name(self) -> str:
        return f"{PROBE_PREFIX}{os.getpid()}-{threading.get_ident()}-{time.time_ns()}"

    def probe_write_once(self) -> bool:
        """Create a probe blob twice with ``If-None-Match: *``; ``True`` if the second create was
        refused (the service honours conditional creates). The probe is removed afterwards.

        Raises:
            LocationUnavailableError: the container does not exist.
            StorageServiceError: the container cannot be written at all.
        """
        key = self._probe_name()
        blob = self._blob(key)
        try:
            blob.upload_blob(b"probe 1", overwrite=False)
            try:
                blob.upload_blob(b"probe 2", overwrite=False)
                honoured = False
            except ResourceExistsError:
                honoured = True
        except AzureError as e:
            raise self._error(e, key, "writing the write-once probe") from e
        finally:
            try:
                blob.delete_blob()
            except AzureError as e:
                log.warning("azure_probe_not_removed", location=self.location, key=key, error=_code(e))
        return honoured

    def check_immutability(self) -> None:
        """Refuse a location that asks for immutability on an account that cannot give it: a
        probe blob gets an unlocked policy (then the policy and the probe are removed).

        Raises:
            ConfigError: the service refused or does not implement immutability policies
                (Azurite answers 501), naming the location and container.
        """
        if not self.immutability_mode:
            return
        key = self._probe_name()
        blob = self._blob(key)
        try:
            blob.upload_blob(b"immutability probe", overwrite=False)
        except AzureError as e:
            raise self._error(e, key, "writing the immutability probe") from e
        try:
            until = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
            blob.set_immutability_policy(_blob_sdk().ImmutabilityPolicy(expiry_time=until, policy_mode="Unlocked"))
            blob.delete_immutability_policy()
        except HttpResponseError as e:
            raise ConfigError(
                f"locations: {self.location!r} sets object_lock_mode = {self.immutability_mode!r} but container "
                f"{self.container!r} refuses blob immutability policies ({_code(e) or 'HTTP'} {_status(e)}: version-"
                "level immutability must be enabled on the account or container); archived blobs would carry no "
                "retention") from None
        finally:
            try:
                blob.delete_blob()
            except AzureError as e:
                log.warning("azure_probe_not_removed", location=self.location, key=key, error=_code(e))

    # -- cold storage (the Archive tier) ----------------------------------------------
    def _rehydrated(self, key: str, props: Any) -> bool:
        """Is the rehydrated copy of archived ``key`` (``props``: its properties) complete, online
        and a copy of this very blob (its ETag)? A stale copy (of a blob since replaced) is deleted."""
        copy = self._props(REHYDRATED_PREFIX + key)
        if copy is None:
            return False
        if (copy.metadata or {}).get(SOURCE_ETAG_METADATA) != str(props.etag).strip('"'):
            self._delete_name(self.prefix + REHYDRATED_PREFIX + key, key)
            return False
        status = getattr(copy.copy, "status", None)
        return status in (None, "success") and not copy.archive_status and str(copy.blob_tier) != "Archive"

    def request_restore(self, key: str) -> None:
        """Ask for archived ``key`` to be rehydrated (idempotent): a copy to
        ``_packhorse/rehydrated/<key>`` in the Hot tier with the location's rehydrate priority;
        nothing for a blob that is online, or whose rehydration is under way.

        Raises:
            SourceMissingError: there is no blob under ``key``.
            StorageServiceError: the service refused or could not be reached.
        """
        p = self._props(key)
        if p is None:
            raise SourceMissingError(f"{self.location}: {key!r} does not exist", side="source", path=key,
                                     host=self.location)
        if str(p.blob_tier) != "Archive" or self._rehydrated(key, p):
            return
        target = self._blob(REHYDRATED_PREFIX + key)
        try:
            target.start_copy_from_url(self._blob(key).url, metadata={SOURCE_ETAG_METADATA: str(p.etag).strip('"')},
                                       standard_blob_tier=_blob_sdk().StandardBlobTier.HOT,
                                       rehydrate_priority=self.rehydrate_priority,
                                       match_condition=MatchConditions.IfMissing)
        except ResourceExistsError as e:
            if _code(e) not in ("BlobAlreadyExists", "PendingCopyOperation"):
                raise self._error(e, key, "requesting the rehydration of") from e
        except AzureError as e:
            raise self._error(e, key, "requesting the rehydration of") from e

    def adopt_existing(self, key: str) -> None:
        """In a cold location, move a blob found already there (:meth:`holds`) that is still in
        an online tier (Hot, Cool, Cold: put there by an earlier publication that crashed before
        its move, by hand, by another tool) to the Archive tier, as every published blob is;
        nothing for keys under ``_packhorse/``, for blobs already archived, or in a warm location.

        Raises:
            StorageServiceError: the service refused the tier change or could not be reached.
        """
        if not self.cold or key.startswith(RESERVED_PREFIX):
            return
        p = self._props(key)
        if p is None or str(p.blob_tier) == "Archive":
            return
        try:
            self._blob(key).set_standard_blob_tier(_blob_sdk().StandardBlobTier.ARCHIVE)
        except AzureError as e:
            raise self._error(e, key, "moving to the Archive tier") from e
        log.info("azure_existing_blob_archived", location=self.location, key=key, tier_was=str(p.blob_tier))

    def restore_ready(self, key: str) -> bool:
        """True when ``key`` can be read: online, or rehydrated (always, in a warm location)."""
        if not self.cold:
            return True
        p = self._props(key)
        if p is None:
            return False
        return str(p.blob_tier) != "Archive" or self._rehydrated(key, p)
