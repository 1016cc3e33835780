"""S3 backend: a data location stored in an S3 bucket (or an S3-compatible object store).

Write-once publication (DESIGN.md I2):

* Bytes written to an :class:`_S3PendingWrite` are spooled locally (in memory up to
  ``multipart_threshold_bytes``, then in a temporary file) and hashed while they arrive.
  Nothing reaches the bucket before :meth:`~_S3PendingWrite.publish`, so a writer killed
  before publishing leaves nothing in the bucket.
* ``publish`` sends the object with a conditional create, ``If-None-Match: *``: a single
  ``PutObject`` up to the threshold, a multipart upload above it (the condition is on
  ``CompleteMultipartUpload``). A multipart upload interrupted by a crash or a failure stays
  an *incomplete multipart upload*, invisible under the key; the next publication of the key
  continues it with the parts whose size, MD5 (ETag) and sha256 checksum equal its own parts'
  (uploading only the others), and :meth:`S3Backend.cleanup_partials` aborts those never
  resumed. One whose key turned out taken (412) or whose bytes were refused is aborted at once.
* The sha256 goes into the object metadata (``x-amz-meta-sha256``, hex) and is sent as the
  S3 checksum (``x-amz-checksum-sha256`` of the object, or of every part of a multipart
  upload), so the store itself refuses bytes damaged on the wire.
* A precondition failure (``412``) means the key exists: the object is read back and hashed;
  the same size and sha256 is "already there", anything else is a
  :class:`~packhorse.errors.DestinationConflictError`. The ETag is never used as a checksum
  (I4): multipart ETags are not digests of the content.

Stores that ignore ``If-None-Match`` would silently overwrite. :meth:`S3Backend.probe_write_once`
detects them at start (a probe key written twice under ``_packhorse/``, then removed) and
the registry refuses such a location unless it sets ``write_once_probe = false``; then
every publication takes a per-object lease and checks for the key just before writing
(seed 003: lock single objects, always look before writing), and a WARNING is logged at start.

Object Lock: with ``object_lock_mode`` and ``object_lock_retain_days`` every published object
carries that retention; :meth:`S3Backend.check_object_lock` refuses a bucket without Object
Lock enabled.

Cold storage (``cold = true``): objects must be restored before they can be read, as with
tape or Glacier. :meth:`S3Backend.request_restore` asks for a restore and
:meth:`S3Backend.restore_ready` tells when it is done; ``open_read`` of an object that is
not restored raises :class:`~packhorse.errors.RestoreRequiredError`. Against real S3 an object
needs a restore when its storage class is an archive class (GLACIER, DEEP_ARCHIVE) and no
finished restore is reported; an object still in a warm class needs none (``RestoreObject``
is not sent for it). Objects this process published itself stay readable (the store's hot
tier before the transition), so the read-back verification after publishing works. Tests
simulate the time a restore takes with a storage layer of their own (``tests/memory_backend.py``
``ColdLayer``, handed in through :mod:`packhorse.runtime.hooks`), not with a switch here.

A missing bucket is never created (DESIGN.md "Architecture": storage that is absent is not
empty): the bucket is made by whoever provisions the store (with Object Lock if wanted), and
``packhorse init`` writes the location's identity marker as an object
(:mod:`packhorse.storage.identity`). Calls on a bucket that does not exist raise
:class:`~packhorse.errors.LocationUnavailableError`, and a "no such key" is only believed
once the bucket is known to be there.

Credentials come only from the standard AWS chain (environment, shared profile, instance
role); they are never logged or stored by packhorse.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import io
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any, BinaryIO

import structlog

from packhorse.errors import (
    ConfigError,
    DestinationConflictError,
    LocationUnavailableError,
    OperationError,
    RestoreRequiredError,
    SourceMissingError,
    StorageBusyError,
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
from packhorse.storage.faults import FAULT_CODES

log = structlog.get_logger(__name__)

#: S3's smallest part (except the last) and largest part count of a multipart upload.
MIN_PART_BYTES = 5 * 1024**2
MAX_PARTS = 10_000
#: Object metadata key holding the hex sha256 of the object (``x-amz-meta-sha256``).
SHA256_METADATA = "sha256"
#: Where probe objects go (under the location's prefix; never among archived objects).
PROBE_PREFIX = RESERVED_PREFIX + "probe/"

ObjectLease = Callable[[str], AbstractContextManager[Any]]


def _code(e: Exception) -> str:
    resp = getattr(e, "response", None) or {}
    return str(resp.get("Error", {}).get("Code", ""))


def _status(e: Exception) -> int:
    resp = getattr(e, "response", None) or {}
    return int(resp.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _is_not_found(e: Exception) -> bool:
    return _code(e) in ("404", "NoSuchKey", "NotFound") or _status(e) == 404


def _is_precondition_failed(e: Exception) -> bool:
    return _code(e) == "PreconditionFailed" or _status(e) == 412


def _is_conditional_conflict(e: Exception) -> bool:
    # AWS: a concurrent conditional write to the same key is in progress; retry (then 412)
    return _code(e) == "ConditionalRequestConflict" or _status(e) == 409


def _b64_sha256(digest: bytes) -> str:
    return base64.b64encode(digest).decode("ascii")


def _part_matches(have: dict[str, Any], data: bytes, checksum: str) -> bool:
    """Does an uploaded part (``ListParts`` entry) hold exactly ``data``? Its size must match,
    and its sha256 checksum (the store computed it over the bytes it received) where the store
    reports one, and its ETag where the ETag is the part's MD5 (a plain upload; with SSE-KMS it
    is not, and the checksum decides). A part with neither is never trusted."""
    if int(have.get("Size", -1)) != len(data):
        return False
    etag = str(have.get("ETag", "")).strip('"')
    md5_etag = len(etag) == 32 and all(c in "0123456789abcdef" for c in etag.lower())
    known = have.get("ChecksumSHA256")
    if known is not None and known != checksum:
        return False
    if md5_etag and etag.lower() != hashlib.md5(data, usedforsecurity=False).hexdigest():
        return False
    return known is not None or md5_etag


def make_client(*, endpoint_url: str | None, region: str | None, path_style: bool, max_pool: int = 32) -> Any:
    """A boto3 S3 client; credentials come from the standard AWS chain only (never stored)."""
    import boto3
    from botocore.config import Config

    cfg = Config(
        max_pool_connections=max_pool,
        retries={"max_attempts": 5, "mode": "standard"},
        s3={"addressing_style": "path" if path_style else "auto"},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, region_name=region, config=cfg)


class _S3Reader(io.RawIOBase):
    """A read-only binary stream over a ``GetObject`` body (supports ``readinto``)."""

    def __init__(self, body: Any) -> None:
        self._body = body

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self._body.read(len(b))
        n = len(data)
        b[:n] = data
        return n

    def close(self) -> None:
        if not self.closed:
            self._body.close()
        super().close()


class _S3PendingWrite(SpooledPendingWrite):
    def __init__(self, backend: "S3Backend", key: str) -> None:
        super().__init__(key, location=backend.location, max_memory_bytes=backend.multipart_threshold_bytes,
                         spool_dir=backend.spool_dir)
        self._b = backend

    def publish(self, expected_sha256: str | None = None) -> PublishResult:
        b = self._b
        busy = False
        try:
            sha = self.check_expected(expected_sha256, b.location)
            digest = bytes.fromhex(sha)
            lease = b.object_lease(self.key) if b.object_lease is not None else nullcontext()
            with lease:
                if not b.conditional_writes and b.holds(self.key, self.size, sha):  # check-before-write
                    return PublishResult(self.key, self.size, sha, already_there=True)
                created = b._create(self.key, self.spool, self.size, digest)
            if not created:
                b.check_same(self.key, self.size, sha)
            return PublishResult(self.key, self.size, sha, already_there=not created)
        except StorageBusyError:
            busy = True  # the spool stays: publishing may be tried again (contract)
            raise
        finally:
            if not busy:
                self.abort()


class S3Backend(StorageBackend):
    """A data location in ``bucket`` under ``prefix`` (see the module docstring for the rules).

    Args:
        location: the data location's name, for messages.
        client: a boto3 S3 client (see :func:`make_client`).
        bucket: the bucket name.
        prefix: key prefix of the location inside the bucket (``""`` or ending without ``/``).
        multipart_threshold_bytes: objects larger than this go up as multipart uploads.
        multipart_part_bytes: part size (at least 5 MiB; raised so an object has ≤ 10,000 parts).
        conditional_writes: the store honours ``If-None-Match: *`` (probe passed); if false,
            publication checks the key before writing, under ``object_lease``.
        object_lease: ``object_lease(key)`` → context manager holding a per-object lease
            (required when ``conditional_writes`` is false).
        object_lock_mode / object_lock_retain_days: retention put on every published object.
        cold: objects need :meth:`request_restore` before reads.
        spool_dir: folder for local spool files of large writes (default: the system's).
    """

    def __init__(self, location: str, client: Any, bucket: str, prefix: str = "", *,
                 multipart_threshold_bytes: int = 64 * 1024**2, multipart_part_bytes: int = 64 * 1024**2,
                 conditional_writes: bool = True, object_lease: ObjectLease | None = None,
                 object_lock_mode: str | None = None, object_lock_retain_days: float | None = None,
                 cold: bool = False,
                 spool_dir: str | None = None) -> None:
        if not conditional_writes and object_lease is None:
            raise ConfigError(f"location {location!r}: without conditional writes a per-object lease is needed")
        self.location = location
        self.client = client
        self.bucket = bucket
        p = prefix.strip("/")
        self.prefix = p + "/" if p else ""
        self.multipart_threshold_bytes = max(1, multipart_threshold_bytes)
        self.multipart_part_bytes = max(MIN_PART_BYTES, multipart_part_bytes)
        self.conditional_writes = conditional_writes
        self.object_lease = object_lease
        self.object_lock_mode = object_lock_mode
        self.object_lock_retain_days = object_lock_retain_days
        self.cold = cold
        self.spool_dir = spool_dir
        #: keys published by this process (readable without a restore; see the module docstring)
        self._hot: set[str] = set()
        #: payload bytes this backend sent in multipart ``UploadPart`` requests (parts an
        #: interrupted upload already held and that verified are not sent again)
        self.bytes_uploaded = 0

    # -- helpers --------------------------------------------------------------------
    def _full(self, key: str) -> str:
        return self.prefix + check_key(key)

    def _error(self, e: Exception, key: str | None, action: str) -> OperationError:
        if _code(e) == "NoSuchBucket":
            why = f"the bucket {self.bucket!r} does not exist"
            return LocationUnavailableError(f"data location {self.location}: {why}", location=self.location,
                                            reason=why, path=key)
        what = f"bucket {self.bucket!r}" if key is None else f"{key!r} in bucket {self.bucket!r}"
        return StorageServiceError(
            f"{self.location}: {action} {what} failed: {_code(e) or type(e).__name__}: {e}",
            side="destination", path=key, host=self.location, code=_code(e) or None,
        )

    def _lock_args(self) -> dict[str, Any]:
        if not self.object_lock_mode or not self.object_lock_retain_days:
            return {}
        until = dt.datetime.now(dt.UTC) + dt.timedelta(days=self.object_lock_retain_days)
        return {"ObjectLockMode": self.object_lock_mode, "ObjectLockRetainUntilDate": until}

    def _create(self, key: str, spool: Any, size: int, digest: bytes) -> bool:
        """Create ``key`` from the spool if it does not exist; ``False`` if it existed (412).

        Raises:
            StorageBusyError: a concurrent conditional write of the key is in progress (409);
                the retry layer tries again.
        """
        cond = {"IfNoneMatch": "*"} if self.conditional_writes else {}
        common = dict(Bucket=self.bucket, Key=self._full(key), Metadata={SHA256_METADATA: digest.hex()},
                      **self._lock_args())
        spool.seek(0)
        try:
            if size <= self.multipart_threshold_bytes:
                self.client.put_object(Body=spool.read(), ChecksumAlgorithm="SHA256",
                                       ChecksumSHA256=_b64_sha256(digest), **common, **cond)
            else:
                self._multipart(key, spool, size, common, cond)
        except Exception as e:
            if _is_precondition_failed(e):
                return False
            if _code(e) == "NoSuchUpload":
                # a concurrent publisher of the key completed (or aborted) the upload this one
                # continued: the object there decides (check_same), else publish again
                if self.stat(key) is not None:
                    return False
                raise StorageBusyError(f"{self.location}: the multipart upload of {key!r} ended under this "
                                       "publisher (a concurrent one completed or aborted it)", side="destination",
                                       path=key, host=self.location) from e
            if _is_conditional_conflict(e):
                raise StorageBusyError(f"{self.location}: another conditional write of {key!r} is in progress "
                                       f"in bucket {self.bucket!r}", side="destination", path=key,
                                       host=self.location) from e
            if isinstance(e, (DestinationConflictError, VerificationError)):
                raise
            raise self._error(e, key, "publishing") from e
        self._hot.add(key)
        return True

    def _multipart(self, key: str, spool: Any, size: int, common: dict[str, Any], cond: dict[str, str]) -> None:
        """Upload the spool as a multipart upload and complete it under ``cond``.

        Resumption: the incomplete multipart upload of the same key holding the most bytes (one
        an interrupted earlier attempt left) is continued, and the key's other incomplete
        uploads are aborted once the object is published: every part it already holds whose size, ETag (the part's
        MD5 for a plain upload) and sha256 checksum equal those of the spool's part of that
        number is kept, every other part is uploaded (again). The part size is derived from the
        object's size alone, so a retry cuts the same parts. The completed object is verified
        by reading it back, as a fresh one is (I4). A failed attempt leaves its upload for the
        retry to resume, except when the key is taken (412) or the bytes were refused; the
        partial sweep aborts uploads older than the resumable age (a day at least).
        """
        part = max(self.multipart_part_bytes, -(-size // MAX_PARTS))
        full = common["Key"]
        upload_id, uploaded, others = self._resumable_upload(full)
        if upload_id is None:
            up = self.client.create_multipart_upload(ChecksumAlgorithm="SHA256", **common)
            upload_id = up["UploadId"]
        keep_upload = True
        try:
            parts = []
            number = 1
            reused = sent = 0
            while True:
                data = spool.read(part)
                if not data:
                    break
                digest = hashlib.sha256(data).digest()
                checksum = _b64_sha256(digest)
                have = uploaded.get(number)
                if have is not None and _part_matches(have, data, checksum):
                    etag = have["ETag"]
                    reused += len(data)
                else:
                    if have is not None:
                        log.warning("s3_part_not_reused", location=self.location, key=full, part=number,
                                    listed_size=have.get("Size"), listed_etag=have.get("ETag"),
                                    listed_checksum=have.get("ChecksumSHA256"), size=len(data),
                                    detail="the part the interrupted upload holds differs from this one; sent again")
                    r = self.client.upload_part(Bucket=self.bucket, Key=full, UploadId=upload_id,
                                                PartNumber=number, Body=data, ChecksumAlgorithm="SHA256",
                                                ChecksumSHA256=checksum)
                    etag = r["ETag"]
                    sent += len(data)
                    self.bytes_uploaded += len(data)
                parts.append({"PartNumber": number, "ETag": etag, "ChecksumSHA256": checksum})
                number += 1
            if reused:
                log.info("s3_multipart_resumed", location=self.location, key=full, upload_id=upload_id,
                         reused_bytes=reused, uploaded_bytes=sent, size=size)
            try:
                self.client.complete_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id,
                                                      MultipartUpload={"Parts": parts}, **cond)
            except Exception as e:
                if _is_precondition_failed(e):
                    keep_upload = False  # the key is taken: nothing left to resume
                raise
            for other in others:  # the key is published: the other uploads of it are of no use
                self._abort_upload(full, other)
        except (DestinationConflictError, VerificationError):
            keep_upload = False
            raise
        finally:
            if not keep_upload:
                self._abort_upload(full, upload_id)

    def _resumable_upload(self, full_key: str) -> tuple[str | None, dict[int, dict[str, Any]], list[str]]:
        """The incomplete multipart upload of exactly ``full_key`` holding the most bytes, its
        parts (``{part number: {"ETag", "Size", "ChecksumSHA256"?}}``) and the ids of the key's
        other incomplete uploads (two attempts of one operation may each have started one);
        ``(None, {}, [...])`` when there is none to continue."""
        try:
            uploads = [u for u in self.incomplete_uploads(prefix=full_key) if u[0] == full_key]
        except Exception as e:  # listing refused (permissions): upload afresh
            log.warning("s3_list_uploads_failed", location=self.location, key=full_key, error=str(e))
            return None, {}, []
        best: tuple[int, str | None, dict[int, dict[str, Any]]] = (-1, None, {})
        for _key, upload_id, _initiated in uploads:
            parts: dict[int, dict[str, Any]] = {}
            try:
                for page in self.client.get_paginator("list_parts").paginate(Bucket=self.bucket, Key=full_key,
                                                                            UploadId=upload_id):
                    for p in page.get("Parts", []):
                        parts[int(p["PartNumber"])] = p
            except Exception as e:
                if _code(e) == "NoSuchUpload":  # completed or aborted meanwhile
                    continue
                raise
            held = sum(int(p.get("Size", 0)) for p in parts.values())
            if held > best[0]:
                best = (held, upload_id, parts)
        others = [u[1] for u in uploads if u[1] != best[1]]
        return best[1], best[2], others

    def _abort_upload(self, full_key: str, upload_id: str) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=full_key, UploadId=upload_id)
        except Exception as e:  # cleanup_partials aborts it later
            log.warning("s3_abort_multipart_failed", location=self.location, key=full_key, error=str(e))

    # -- the root -------------------------------------------------------------------
    def root_missing(self) -> str | None:
        """``None`` if the bucket exists (``HeadBucket``), else why not.

        Raises:
            StorageServiceError: the store could not be asked (unreachable, access denied).
        """
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except Exception as e:
            if _is_not_found(e) or _code(e) == "NoSuchBucket":
                return f"the bucket {self.bucket!r} does not exist"
            raise self._error(e, None, "looking up") from e
        return None

    def write_fault(self) -> LocationUnavailableError | None:
        """``PutObject`` a small probe object under ``<prefix>_packhorse/`` and delete it (see
        :meth:`StorageBackend.write_fault`): ``AccessDenied`` (or ``AllAccessDisabled``) gives
        the error with that ``fault``; a missing bucket is reported as missing.

        Raises:
            StorageServiceError: any other answer (the store could not be asked).
        """
        missing = self.root_missing()
        if missing is not None:
            return LocationUnavailableError(f"data location {self.location}: {missing}", location=self.location,
                                            reason=missing)
        key = self.prefix + RESERVED_PREFIX + f"write-probe-{os.getpid()}-{os.urandom(4).hex()}"
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=b"packhorse write probe\n")
            self.client.delete_object(Bucket=self.bucket, Key=key)
        except Exception as e:
            err = self._error(e, key, "writing the probe object")
            if isinstance(err, StorageServiceError) and err.code in FAULT_CODES:
                why = f"writing in bucket {self.bucket!r} fails: the object store answered {err.code}"
                return LocationUnavailableError(f"data location {self.location}: {why}", location=self.location,
                                                reason=why, fault=err.code)
            if isinstance(err, LocationUnavailableError):
                return err
            raise err from e
        return None

    def create_root(self) -> bool:
        """Never creates a bucket: a missing one is refused with a
        :class:`~packhorse.errors.ConfigError` naming it (the store's owner creates buckets)."""
        why = self.root_missing()
        if why is not None:
            raise ConfigError(f"data location {self.location}: {why}; packhorse does not create buckets: create it "
                              f"(with Object Lock if the location asks for it), then run `packhorse init` again")
        return False

    def _missing(self, key: str) -> None:
        """After a "not found" for ``key``: raise :class:`LocationUnavailableError` if the
        bucket itself is gone (a HEAD of a key in a missing bucket answers a bare 404 too)."""
        why = self.root_missing()
        if why is not None:
            raise LocationUnavailableError(f"data location {self.location}: {why}", location=self.location,
                                           reason=why, path=key)

    # -- interface ------------------------------------------------------------------
    def stat(self, key: str) -> ObjectInfo | None:
        full = self._full(key)
        try:
            r = self.client.head_object(Bucket=self.bucket, Key=full)
        except Exception as e:
            if _is_not_found(e):
                self._missing(key)
                return None
            raise self._error(e, key, "looking up") from e
        mtime = r["LastModified"].timestamp()
        return ObjectInfo(key, int(r["ContentLength"]), mtime)

    def metadata_sha256(self, key: str) -> str | None:
        """The sha256 stored in the object's metadata at publication (a hint, never proof)."""
        try:
            r = self.client.head_object(Bucket=self.bucket, Key=self._full(key))
        except Exception as e:
            if _is_not_found(e):
                return None
            raise self._error(e, key, "looking up") from e
        return r.get("Metadata", {}).get(SHA256_METADATA)

    def open_read(self, key: str) -> BinaryIO:
        full = self._full(key)
        if self.cold and key not in self._hot and not self.restore_ready(key):
            raise RestoreRequiredError(
                f"{self.location}: {key!r} is in cold storage and not restored; request a restore first",
                side="source", path=key, host=self.location,
            )
        try:
            r = self.client.get_object(Bucket=self.bucket, Key=full)
        except Exception as e:
            if _is_not_found(e) and _code(e) != "NoSuchBucket":
                self._missing(key)
                raise SourceMissingError(f"{self.location}: {key!r} does not exist", side="source", path=key,
                                         host=self.location) from None
            raise self._error(e, key, "reading") from e
        return io.BufferedReader(_S3Reader(r["Body"]), buffer_size=CHUNK_BYTES)  # type: ignore[return-value]

    def open_write(self, key: str) -> PendingWrite:
        check_key(key)
        return _S3PendingWrite(self, key)

    def delete(self, key: str, *, prune: bool = True) -> bool:
        full = self._full(key)
        if self.stat(key) is None:
            return False
        try:
            self.client.delete_object(Bucket=self.bucket, Key=full)
        except Exception as e:
            raise self._error(e, key, "deleting") from e
        return True

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        out: list[ObjectInfo] = []
        paginator = self.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
                for o in page.get("Contents", []):
                    key = o["Key"][len(self.prefix):]
                    if key.startswith(RESERVED_PREFIX):
                        continue
                    out.append(ObjectInfo(key, int(o["Size"]), o["LastModified"].timestamp()))
        except Exception as e:
            raise self._error(e, prefix, "listing") from e
        out.sort(key=lambda o: o.key)
        return iter(out)

    def walk(self, prefix: str = "", *, reuse: ReuseListing | None = None,
             everything: bool = False) -> Iterator[Entry]:
        """See :meth:`StorageBackend.walk`: an object store has no folders, symbolic links or
        special files, so this yields one ``FOLDER`` entry (``prefix``, mtime 0), then every
        object under ``prefix`` as a ``FILE`` (size, ``LastModified`` in ns), sorted by key,
        one ``ListObjectsV2`` page at a time; ``reuse`` is never called (no folder mtimes).
        Incomplete multipart uploads are not objects and are not yielded.

        Raises:
            LocationUnavailableError: the bucket does not exist (``NoSuchBucket``).
            StorageServiceError: the listing failed otherwise.
        """
        if prefix:
            check_key(prefix)
        start = f"{prefix}/" if prefix else ""
        yield Entry(prefix, EntryKind.FOLDER, 0, 0)
        paginator = self.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + start):
                for o in page.get("Contents", []):
                    key = o["Key"][len(self.prefix):]
                    if key.startswith(RESERVED_PREFIX) and not everything:
                        continue
                    stamp = o["LastModified"]
                    yield Entry(key, EntryKind.FILE, int(o["Size"]), int(stamp.timestamp()) * 1_000_000_000
                                + stamp.microsecond * 1000)
        except Exception as e:
            raise self._error(e, prefix, "listing") from e  # a missing bucket: LocationUnavailableError

    def incomplete_uploads(self, prefix: str | None = None) -> list[tuple[str, str, float]]:
        """``[(full key, upload id, initiated UTC s)]`` of incomplete multipart uploads here
        (under the full key prefix ``prefix``; default: the location's)."""
        out = []
        paginator = self.client.get_paginator("list_multipart_uploads")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix if prefix is None else prefix):
            for u in page.get("Uploads", []):
                out.append((u["Key"], u["UploadId"], u["Initiated"].timestamp()))
        return out

    def cleanup_partials(self, older_than_seconds: float, *, resumable_older_than_seconds: float | None = None) -> int:
        """Abort incomplete multipart uploads (a crashed publisher's) initiated longer ago than
        this; every upload can be resumed (:meth:`_multipart`), so ``resumable_older_than_seconds``,
        when given, is the age used."""
        age = older_than_seconds if resumable_older_than_seconds is None else resumable_older_than_seconds
        cutoff = time.time() - age
        removed = 0
        try:
            uploads = self.incomplete_uploads()
        except Exception as e:
            if _code(e) == "NoSuchBucket":
                return 0  # nothing of ours can be there; a bucket is never created to look
            raise
        for full, upload_id, initiated in uploads:
            if initiated <= cutoff:
                self._abort_upload(full, upload_id)
                removed += 1
        return removed

    def quarantine(self, key: str) -> str | None:
        """Move a bad object aside (see :meth:`StorageBackend.quarantine`)."""
        if self.stat(key) is None:
            return None
        target = self.quarantine_key(key)
        src = {"Bucket": self.bucket, "Key": self._full(key)}
        try:
            if self.stat(target) is not None:
                raise DestinationConflictError(f"{self.location}: quarantine name {target!r} is taken", path=target)
            self.client.copy_object(Bucket=self.bucket, Key=self._full(target), CopySource=src,
                                    MetadataDirective="COPY")
            self.client.delete_object(**src)
        except DestinationConflictError:
            raise
        except Exception as e:
            raise self._error(e, key, "quarantining") from e
        return target

    # -- start-time checks ----------------------------------------------------------
    def probe_write_once(self) -> bool:
        """Write a probe key twice with ``If-None-Match: *``; ``True`` if the second write was
        refused (the store honours conditional creates). The probe key is removed afterwards.

        Raises:
            StorageServiceError: the bucket cannot be written at all.
        """
        key = f"{PROBE_PREFIX}{os.getpid()}-{threading.get_ident()}-{time.time_ns()}"
        full = self.prefix + key
        try:
            self.client.put_object(Bucket=self.bucket, Key=full, Body=b"probe 1", IfNoneMatch="*")
            try:
                self.client.put_object(Bucket=self.bucket, Key=full, Body=b"probe 2", IfNoneMatch="*")
                honoured = False
            except Exception as e:
                if not _is_precondition_failed(e):
                    raise
                honoured = True
        except Exception as e:
            raise self._error(e, key, "writing the write-once probe") from e
        finally:
            try:
                self.client.delete_object(Bucket=self.bucket, Key=full)
            except Exception as e:  # e.g. a retention on the probe: it stays under _packhorse/
                log.warning("s3_probe_not_removed", location=self.location, key=full, error=str(e))
        return honoured

    def check_object_lock(self) -> None:
        """Refuse a location that asks for Object Lock retention on a bucket without it.

        Raises:
            ConfigError: naming the location and bucket.
        """
        if not self.object_lock_mode:
            return
        try:
            r = self.client.get_object_lock_configuration(Bucket=self.bucket)
            enabled = r.get("ObjectLockConfiguration", {}).get("ObjectLockEnabled") == "Enabled"
        except Exception as e:
            if _code(e) not in ("ObjectLockConfigurationNotFoundError", "ObjectLockConfigurationNotFound"):
                raise self._error(e, None, "reading the Object Lock configuration of") from e
            enabled = False
        if not enabled:
            raise ConfigError(
                f"locations: {self.location!r} sets object_lock_mode = {self.object_lock_mode!r} but bucket "
                f"{self.bucket!r} does not have S3 Object Lock enabled; archived objects would carry no retention"
            )

    def retention(self, key: str) -> tuple[str, dt.datetime] | None:
        """``(mode, retain until UTC)`` of the object's Object Lock retention, or ``None``
        (read with ``HeadObject``)."""
        try:
            r = self.client.head_object(Bucket=self.bucket, Key=self._full(key))
        except Exception as e:
            if _is_not_found(e):
                return None
            raise self._error(e, key, "reading the retention of") from e
        mode, until = r.get("ObjectLockMode"), r.get("ObjectLockRetainUntilDate")
        return (mode, until) if mode and until else None

    # -- cold storage ---------------------------------------------------------------
    def request_restore(self, key: str) -> None:
        """Ask for ``key`` to be restored for reading (idempotent): S3 ``RestoreObject`` for an
        object in an archive storage class (a restore already in progress is fine); nothing
        for an object that can be read as it is.

        Raises:
            SourceMissingError: there is no object under ``key``.
            StorageServiceError: the store refused or could not be reached.
        """
        if self.stat(key) is None:
            raise SourceMissingError(f"{self.location}: {key!r} does not exist", side="source", path=key,
                                     host=self.location)
        if self.restore_ready(key):
            return
        try:
            self.client.restore_object(Bucket=self.bucket, Key=self._full(key), RestoreRequest={"Days": 7})
        except Exception as e:
            if _code(e) != "RestoreAlreadyInProgress":
                raise self._error(e, key, "requesting a restore of") from e

    def restore_ready(self, key: str) -> bool:
        """True when ``key`` can be read (restored, or not in a cold location)."""
        if not self.cold:
            return True
        try:
            r = self.client.head_object(Bucket=self.bucket, Key=self._full(key))
        except Exception as e:
            if _is_not_found(e):
                return False
            raise self._error(e, key, "checking the restore of") from e
        restore = r.get("Restore")
        if r.get("StorageClass") in (None, "STANDARD") and restore is None:
            return True
        return bool(restore) and 'ongoing-request="false"' in restore
