"""The storage backend interface and its contract (DESIGN.md "Architecture", I2, I4, I6).

Every backend stores *objects* under *keys* relative to its data location's root. A key is
a POSIX-style relative path of non-empty components: no ``..``, no ``.``, no leading ``/``,
no NUL, no backslash; :func:`check_key` enforces this (I6) and raises
:class:`~packhorse.errors.UnsafePathError` naming the key.

Contract (tested for every backend by ``tests/conformance``):

* :meth:`StorageBackend.open_write` returns a :class:`PendingWrite`. Bytes written to it are
  invisible under the final key until :meth:`PendingWrite.publish`.
* :meth:`PendingWrite.publish` is atomic and conditional: it creates the key only if it does
  not exist (disk: hard link or ``renameat2(RENAME_NOREPLACE)``; never exists-then-rename).
  If the key exists with the same size and sha256 the result is ``already_there=True``; with
  different bytes it raises :class:`~packhorse.errors.DestinationConflictError` and leaves the
  object untouched. Published objects are never overwritten (I2).
* "Is the same object already there?" is decided by :meth:`StorageBackend.holds` alone,
  by reading the object back; publishers and stages all ask it.
* :meth:`PendingWrite.publish` may raise :class:`~packhorse.errors.StorageBusyError` ("try
  again now"); the pending write then stays intact and publishing may be tried again (the
  retry layer does, :mod:`packhorse.storage.layers`).
* If ``expected_sha256`` is given to ``publish`` and the bytes written do not match, nothing
  is published and :class:`~packhorse.errors.VerificationError` is raised.
* :meth:`StorageBackend.sha256` re-reads the stored object through the backend (I4); callers
  verify with it after publishing, never with the hash of the bytes as they were written.
* A crash at any point leaves either nothing or the complete object under the key; partial
  writes left on the medium (disk: files with the suffix :data:`PARTIAL_SUFFIX`; S3:
  incomplete multipart uploads) are invisible to ``stat``/``open_read``/``list`` and removed
  by :meth:`StorageBackend.cleanup_partials` (all old ones) and
  :meth:`StorageBackend.remove_partials_of` (one key's, by the next attempt at it). A backend may also keep unpublished bytes off
  the medium altogether (S3 spools locally until ``publish``): then a killed writer leaves
  nothing at all.
* Resumption (``transfer``: docs/reliability.md "Resumable transfers"):
  :meth:`StorageBackend.open_resumable_write` with the operation's fencing token (its attempt)
  starts a write that may take over the partial an earlier, interrupted attempt of the same key
  left (disk: a partial named with a lower token whose lock no live writer holds; the partial is
  locked by its writer for as long as it writes, so a stale attempt never appends to the partial
  a newer one resumes). :attr:`PendingWrite.resumed_bytes` says how many bytes were taken over;
  they are *unverified*: the caller reads them (:meth:`PendingWrite.open_resumed`), compares
  them with the source and keeps only the equal prefix (:meth:`PendingWrite.keep_prefix`)
  before writing; with ``resumed_bytes == 0`` (nothing taken over, or an empty partial a writer
  killed before its first bytes left) the write is used as a fresh one, no decision needed.
  A resumable write ended by :meth:`PendingWrite.suspend` (the ``sftp`` transfer's link was cut)
  leaves its partial on the medium, unlocked, for the next attempt to take over.
  Partials of resumable writes carry the token in their name (``.<name>.t<token>.<random>``)
  and are swept later than others (``cleanup_partials(..., resumable_older_than_seconds=)``).
  S3 resumes in ``publish``: an incomplete multipart upload of the key is continued with the
  parts whose size, MD5 (ETag) and sha256 checksum equal the new bytes'.
* Keys under :data:`RESERVED_PREFIX` (``_packhorse/``) belong to packhorse itself (write-once
  probes, quarantined objects, restore markers): ``list`` and ``walk`` never yield them.
* :meth:`StorageBackend.walk` is the listing of what is on the medium (the scan of a source
  location reads its folders through it): every entry under a folder, recursively, as
  :class:`Entry` (relative path, kind, size, ``mtime_ns``). Symbolic links and special files
  (FIFOs, sockets, devices) are reported as such and never followed or opened; names that are
  not valid keys (not UTF-8, a backslash, the partial-file suffix) are reported as they are,
  for the caller to refuse with a reason. A location whose root is not there raises
  :class:`~packhorse.errors.LocationUnavailableError`: an absent location never lists as an
  empty one.
* No backend creates a missing root (DESIGN.md "Architecture": storage that is absent is not
  empty). Only :meth:`StorageBackend.create_root` does, called by ``packhorse init``
  (:mod:`packhorse.storage.identity`). With the root missing, ``stat``, ``open_read``,
  ``open_write``, ``delete`` and ``list`` raise
  :class:`~packhorse.errors.LocationUnavailableError` instead of answering "no such object"
  or writing; :meth:`StorageBackend.root_missing` says why the root is not there.
* :meth:`StorageBackend.quarantine` moves a bad object aside to a fresh name under
  ``_packhorse/quarantine/`` without overwriting anything, freeing its key for a repair
  (fixity audit).
"""

from __future__ import annotations

import abc
import contextlib
import enum
import hashlib
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from packhorse.digest import sha256_stream
from packhorse.errors import (
    DestinationConflictError,
    DestinationWriteError,
    LocationUnavailableError,
    OperationDeferred,
    UnsafePathError,
    VerificationError,
)
from packhorse.names import quoted

#: Suffix of in-progress (unpublished) files on disk backends.
PARTIAL_SUFFIX = ".packhorse-partial"
#: Key prefix reserved for packhorse's own objects (probes, quarantine, restore markers).
RESERVED_PREFIX = "_packhorse/"
#: Where :meth:`StorageBackend.quarantine` moves bad objects.
QUARANTINE_PREFIX = RESERVED_PREFIX + "quarantine/"
#: Read/write block size used when streaming payload bytes (bytes).
CHUNK_BYTES = 1 << 20


def check_key(key: str) -> str:
    """Return ``key`` if it is a safe relative object key, else raise :class:`UnsafePathError`
    (its ``path`` the whole key; its message quotes it by :func:`packhorse.names.quoted`)."""
    if not isinstance(key, str) or not key:
        raise UnsafePathError(f"empty object key {key!r}", path=str(key))
    if key.startswith("/") or "\\" in key or "\x00" in key:
        raise UnsafePathError(f"unsafe object key {quoted(key)}: absolute or contains a backslash/NUL", path=key)
    # an empty, "." or ".." component, as substrings of "/key/" (this runs once per file of
    # every full scan: no split, no list)
    framed = f"/{key}/"
    if "//" in framed or "/./" in framed or "/../" in framed:
        raise UnsafePathError(f"unsafe object key {quoted(key)}: empty, '.' or '..' component", path=key)
    if PARTIAL_SUFFIX in key and f"{PARTIAL_SUFFIX}/" in f"{key}/":
        # in any component: a disk backend's partial writes are files and folders named so, and
        # its sweep removes them (a file stored below such a folder would be swept with it)
        raise UnsafePathError(f"object key {quoted(key)} uses the reserved suffix {PARTIAL_SUFFIX}", path=key)
    return key


@dataclass(frozen=True)
class ObjectInfo:
    """What a backend knows about a stored object: ``key``, ``size`` (bytes), ``mtime`` (UTC s),
    and ``mtime_ns`` (integer nanoseconds) where the backend has it."""

    key: str
    size: int
    mtime: float
    mtime_ns: int | None = None


class EntryKind(enum.StrEnum):
    """What a :class:`Entry` of :meth:`StorageBackend.walk` is on the medium."""

    FILE = "file"          #: a regular file (an object, or a name the caller must refuse)
    FOLDER = "folder"      #: a folder (disk); object stores have none of their own
    SYMLINK = "symlink"    #: a symbolic link: reported, never followed (I6)
    SPECIAL = "special"    #: a FIFO, socket or device: reported, never opened
    UNKNOWN = "unknown"    #: could not be looked at (``Entry.error`` says why)


class Entry(NamedTuple):
    """One entry of :meth:`StorageBackend.walk` (a named tuple: a walk yields millions).

    Attributes:
        path: relative to the location root, ``/``-separated; ``""`` is the root itself. On
            disk a name that is not UTF-8 keeps its bytes as surrogate escapes (``os.fsdecode``).
        kind: :class:`EntryKind`.
        size: bytes (a file's; a link's target length; 0 for folders and unknown entries).
        mtime_ns: modification time, integer nanoseconds since the epoch (UTC); 0 if unknown.
        error: why the entry could not be looked at (``UNKNOWN``), or why a ``FOLDER`` could
            not be listed (its contents are then missing from the walk); else ``None``.
    """

    path: str
    kind: EntryKind
    size: int
    mtime_ns: int
    error: str | None = None


#: ``reuse(folder path, folder mtime_ns)`` of :meth:`StorageBackend.walk`: the subfolder paths
#: an earlier listing of that folder found (walk them instead of listing the folder), or ``None``
#: (list it).
ReuseListing = Callable[[str, int], Sequence[str] | None]


@dataclass(frozen=True)
class PublishResult:
    """Outcome of :meth:`PendingWrite.publish`: the stored object's ``size`` and ``sha256``.

    ``already_there`` is true when the key already held exactly these bytes (I2 "already there").
    """

    key: str
    size: int
    sha256: str
    already_there: bool
    #: the bytes were read back from the medium and compared with the expected sha256 before
    #: they were published (:meth:`PendingWrite.defer_hash`): the caller need not re-read them
    read_back: bool = False


class PendingWrite(abc.ABC):
    """An object being written, not yet visible under its key. Use as a context manager:
    leaving the block without :meth:`publish` (or with an exception) aborts the write.
    """

    def __init__(self, key: str) -> None:
        self.key = key
        self._hash = hashlib.sha256()
        self._hashing = True
        self.size = 0
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Append ``data``; returns the number of bytes written. Hashes as it goes (unless
        :meth:`defer_hash` said otherwise)."""
        if self._hashing:
            self._hash.update(data)
        self._write(data)
        self.size += len(data)
        return len(data)

    def defer_hash(self) -> bool:
        """Ask this write not to hash the bytes as they are written, for a caller that knows
        the sha256 they must have and passes it to :meth:`publish`: the backend then reads the
        finished bytes back from its medium (after they are durable, before they are
        published) and refuses them there if they differ. One pass over the bytes instead of
        two (a hash while writing and a re-read after publishing), and still nothing but the
        expected bytes is ever published (I2) and every byte is read back from the destination
        (I4). :attr:`sha256` is unknown until :meth:`publish` returns.

        Only before the first byte is written or taken over (:meth:`keep_prefix`). Returns
        whether the backend does so; this default (backends that cannot read their unpublished
        bytes back: S3, memory) returns ``False`` and hashes as it writes, and the caller
        re-reads the object after publishing (:attr:`PublishResult.read_back` is false).

        Raises:
            RuntimeError: bytes were written already.
        """
        if self.size:
            raise RuntimeError(f"{self.key!r}: defer_hash() after {self.size} bytes were written")
        return False

    @property
    def sha256(self) -> str:
        """sha256 (hex) of the bytes written so far.

        Raises:
            RuntimeError: the hash was deferred to :meth:`publish` (:meth:`defer_hash`).
        """
        if not self._hashing:
            raise RuntimeError(f"{self.key!r}: the sha256 of a write with a deferred hash is known once published")
        return self._hash.hexdigest()

    def check_expected(self, expected_sha256: str | None, location: str) -> str:
        """Return the sha256 of the bytes written; raise :class:`VerificationError` (nothing
        is published) if ``expected_sha256`` is given and differs."""
        sha = self.sha256
        if expected_sha256 is not None and sha != expected_sha256:
            raise VerificationError(
                f"{location}:{self.key}: the {self.size:,} bytes written have sha256 {sha}, expected {expected_sha256}; "
                "nothing published",
                step="publish", side="destination", path=self.key, host=location,
            )
        return sha

    #: bytes of an earlier attempt's partial this write took over, not yet verified
    #: (:meth:`StorageBackend.open_resumable_write`); 0 when it starts empty, also when the
    #: partial it took over was empty. Above 0 the caller calls :meth:`keep_prefix` before any
    #: :meth:`write`; at 0 there is nothing to decide and writes start at byte 0
    resumed_bytes: int = 0

    def open_resumed(self) -> BinaryIO:
        """Open the taken-over bytes (the first :attr:`resumed_bytes` of the partial) for reading.

        Raises:
            NotImplementedError: nothing was taken over (``resumed_bytes == 0``).
        """
        raise NotImplementedError("this write took over no partial")

    def keep_prefix(self, nbytes: int, hasher: "hashlib._Hash") -> None:
        """Keep the first ``nbytes`` of the taken-over bytes (the caller compared them with the
        source; ``hasher`` is the sha256 state over exactly those bytes) and drop the rest; later
        :meth:`write` calls append after them. ``nbytes`` = 0 drops everything.

        Raises:
            ValueError: ``nbytes`` is negative or more than :attr:`resumed_bytes`.
        """
        if nbytes != 0 or self.resumed_bytes:
            raise NotImplementedError("this write took over no partial")

    @property
    def local_path(self) -> Path | None:
        """A local file an external command may write instead (disk backends), else ``None``.

        After the command, call :meth:`adopt_local_file` before :meth:`publish`.
        """
        return None

    def adopt_local_file(self) -> None:
        """Re-hash :attr:`local_path` after an external program wrote it."""
        raise NotImplementedError("this backend has no local file for external commands")

    @abc.abstractmethod
    def _write(self, data: bytes | bytearray | memoryview) -> None: ...

    @abc.abstractmethod
    def publish(self, expected_sha256: str | None = None) -> PublishResult:
        """Make the object visible under its key, atomically and only if the key is free.

        Raises:
            VerificationError: ``expected_sha256`` given and the written bytes differ.
            DestinationConflictError: the key holds different bytes (nothing overwritten).
        """

    @abc.abstractmethod
    def abort(self) -> None:
        """Discard the bytes written; idempotent."""

    def suspend(self) -> None:
        """End a resumable write (:meth:`StorageBackend.open_resumable_write`) without
        publishing, *keeping* what it wrote on the medium for a later attempt under a higher
        fencing token to take over (a transfer whose link was cut: it resumes instead of
        starting over). Nothing is published; the bytes stay unverified until that attempt
        compares them with the source. This default (backends that keep no partial on the
        medium) is :meth:`abort`."""
        self.abort()

    def __enter__(self) -> "PendingWrite":
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.closed:
            self.abort()


class SpooledPendingWrite(PendingWrite):
    """A :class:`PendingWrite` of an object store that keeps unpublished bytes off the medium
    (S3, Azure): the bytes go to a local spool, in memory up to ``max_memory_bytes`` and then in
    an unlinked temporary file in ``spool_dir``, hashed as they arrive; nothing reaches the store
    before the subclass's :meth:`publish`, so a writer killed before publishing leaves nothing
    there. Subclasses read the spool (:attr:`spool`) in ``publish`` and call :meth:`abort` when
    done with it.

    Args:
        key: the object's key.
        location: the data location's name, for messages.
        max_memory_bytes: spool size (bytes) kept in memory before it moves to a file.
        spool_dir: folder of the spool file (``None``: the system's temporary folder).
    """

    def __init__(self, key: str, *, location: str, max_memory_bytes: int, spool_dir: str | None) -> None:
        super().__init__(key)
        self.location = location
        self.spool_dir = spool_dir
        #: the spooled bytes (a :class:`tempfile.SpooledTemporaryFile`)
        self.spool: Any = tempfile.SpooledTemporaryFile(max_size=max_memory_bytes, dir=spool_dir)

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        """Append ``data`` to the spool.

        Raises:
            DestinationWriteError: the spool could not be written (its disk is full): the spool
                is removed at once, and the message names the folder and the bytes spooled.
        """
        try:
            self.spool.write(data)
        except OSError as e:  # the local spool's disk is full: free it now, name where
            self.abort()
            raise DestinationWriteError(
                f"{self.location}: spooling {self.key!r} for upload failed after {self.size:,} bytes in "
                f"{self.spool_dir or tempfile.gettempdir()}: {e.strerror or e} (spool file removed)",
                step="write", side="destination", path=self.key, host=self.location) from e

    def abort(self) -> None:
        """Close the spool (an unlinked temporary file: closing frees its space); idempotent."""
        try:
            if not self.spool.closed:
                self.spool.close()
        except OSError:
            pass  # the flush of a full disk fails again; the file is closed and gone anyway
        finally:
            self.closed = True


class StorageBackend(abc.ABC):
    """One data location's storage. See the module docstring for the contract.

    Attributes:
        location: the data location's name (used in error messages).
    """

    location: str
    #: objects need :meth:`request_restore` before they can be read (tape, Glacier)
    cold: bool = False
    #: how long (seconds) an operation that must read a cold object not restored yet waits
    #: before it looks again (:meth:`defer_until_readable`; the location's
    #: ``restore_poll_seconds``, set by :mod:`packhorse.storage.registry`)
    restore_poll_seconds: float = 300.0

    def request_restore(self, key: str) -> None:  # noqa: B027 (optional: warm storage has nothing to do)
        """Ask a cold store to make ``key`` readable (idempotent); a no-op for warm storage."""

    def restore_ready(self, key: str) -> bool:
        """True when ``key`` can be read now (always, for warm storage)."""
        return True

    def defer_until_readable(self, key: str, why: str) -> None:
        """Return at once if ``key`` can be read now (warm storage, or a cold object that is
        online or restored); else request its restore (:meth:`request_restore`, idempotent) and
        raise :class:`~packhorse.errors.OperationDeferred`: the operation goes back to waiting
        for :attr:`restore_poll_seconds` without holding a worker or counting a retry, and looks
        again (``AWAITING RESTORE``, docs/object-storage.md).

        Args:
            why: what the bytes are needed for, for the message (e.g. "to compare it").

        Raises:
            OperationDeferred: the restore is requested and not ready yet.
            SourceMissingError: there is no object under ``key`` (from :meth:`request_restore`).
            StorageServiceError: the store refused or could not be reached.
        """
        if not self.cold or self.restore_ready(key):
            return
        self.request_restore(key)
        raise OperationDeferred(f"{self.location}:{key} is in cold storage and not restored; restore requested, "
                                f"waiting for it {why}", seconds=self.restore_poll_seconds)

    def adopt_existing(self, key: str) -> None:  # noqa: B027 (optional: most backends have nothing to do)
        """Give an object found already there (:meth:`holds` said it holds exactly the bytes
        being published: a retry after a crash, an archive run again, bytes put there by hand)
        what a publication of it would have given it, so that it is kept as a new one would be.
        Idempotent; this default does nothing. Azure in a cold location moves a blob still in an
        online tier to the Archive tier.

        Raises:
            StorageServiceError: the store refused or could not be reached.
        """

    def root_missing(self) -> str | None:
        """Why the location's root is not there (a sentence naming the path or bucket), or
        ``None`` if it is. Read-only; never creates anything. Backends without a root of their
        own (memory) return ``None``."""
        return None

    def create_root(self) -> bool:
        """Create the location's root if it is missing (``packhorse init`` only; nothing else
        creates a root). Returns ``True`` if it was created, ``False`` if it was there."""
        return False

    def write_fault(self) -> LocationUnavailableError | None:
        """Try a small write at the location now: ``None`` if it succeeded (or this backend
        cannot tell), else the :class:`~packhorse.errors.LocationUnavailableError` naming the
        location and the fault (:mod:`packhorse.storage.faults`: ``EROFS``, ``EIO``,
        ``EACCES``, ``AccessDenied``) in its ``fault``. The probe object sits under the
        reserved prefix (never listed, never registered) and is removed at once. Only asked of a
        location recorded unavailable for such a fault, and never of a read-only location.

        Raises:
            StorageServiceError: the store could not be asked (not a fault of the location).
        """
        return None

    def deferred_sync(self) -> contextlib.AbstractContextManager[None]:
        """A block in which the folder syncs that make publications and deletions durable are
        gathered, and made once per folder when the block ends (on disk: one ``fsync`` of each
        folder written into, instead of one per object). The caller records nothing of what it
        did inside the block until the block has ended (I2: no copy is recorded that a crash
        of the machine could undo). Each object's own bytes are still synced before it is
        published. Nested blocks sync when the outermost ends; per thread. Backends without
        folders (S3, memory) have nothing to gather: a block changes nothing.

        Raises (when the block ends):
            OSError: a folder could not be synced (the disk's error).
        """
        return contextlib.nullcontext()

    @abc.abstractmethod
    def stat(self, key: str) -> ObjectInfo | None:
        """Return the object's info, or ``None`` if there is no object under ``key``."""

    @abc.abstractmethod
    def open_read(self, key: str) -> BinaryIO:
        """Open the object for reading. Raises :class:`~packhorse.errors.SourceMissingError`."""

    @abc.abstractmethod
    def open_write(self, key: str) -> PendingWrite:
        """Start a write-once write of ``key`` (see :class:`PendingWrite`)."""

    def open_resumable_write(self, key: str, token: int, *, wait_for_held_seconds: float = 0.0,
                             while_waiting: Callable[[], None] | None = None) -> PendingWrite:
        """Start a write-once write of ``key`` that may take over the partial of an earlier,
        interrupted attempt (see "Resumption" in the module docstring). ``token`` is the
        operation's fencing token (its attempt, >= 1): only partials written under a lower token,
        which no live writer holds, are taken over. Backends that keep no partials on the medium
        return a plain :meth:`open_write` (``resumed_bytes == 0``).

        ``wait_for_held_seconds`` (seconds, default 0: never wait): a backend whose partials are
        held by their live writers (disk: ``flock``) waits up to that long for the best partial
        of a lower token to be released by its stale writer, calling ``while_waiting`` (e.g. the
        lease check; what it raises is raised) between looks; then it takes it over, or starts
        without it (docs/reliability.md "Resumable transfers"). Backends without such locks
        (S3, Azure, memory) ignore both: an interrupted multipart upload is never held."""
        return self.open_write(key)

    @abc.abstractmethod
    def delete(self, key: str, *, prune: bool = True) -> bool:
        """Remove the object; returns ``False`` if it was already gone. ``prune`` also removes
        folders left empty (backends without folders ignore it)."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Yield every published object whose key starts with ``prefix``, sorted by key."""

    @abc.abstractmethod
    def walk(self, prefix: str = "", *, reuse: ReuseListing | None = None,
             everything: bool = False) -> Iterator[Entry]:
        """Walk folder ``prefix`` (``""``: the root) recursively: yield an :class:`Entry` for
        it, then for everything under it, depth first, each folder's entries sorted by name and
        a folder's own entry before its contents. Nothing is followed: a symbolic link is a
        ``SYMLINK`` entry, a FIFO, socket or device a ``SPECIAL`` one; an entry that cannot be
        looked at is ``UNKNOWN`` and a folder that cannot be listed carries ``error``, and the
        walk goes on with the rest. Names are reported as they are on the medium (invalid
        keys included, for the caller to refuse); keys under :data:`RESERVED_PREFIX` and
        unpublished partial writes of this backend's own writers (partial folders; S3 uploads)
        are not. Backends without folders (S3) yield one ``FOLDER`` entry, the start, then
        every object under ``prefix`` as a ``FILE``.

        Args:
            prefix: a folder key (:func:`check_key`), or ``""``.
            reuse: for backends that keep folder modification times (disk): asked before a
                folder is listed, with the folder's path and ``mtime_ns``; a sequence of
                subfolder paths means "unchanged since an earlier listing": the folder's own
                entry is yielded, its files are not, and the walk goes on into those subfolders
                (each looked at afresh). ``None`` lists it. Backends without folder times never
                call it. A tree of settled files then costs one ``stat`` per folder.
            everything: also yield what the walk leaves out by default (the keys under
                :data:`RESERVED_PREFIX`, names of this backend's own partial writes), each as the
                kind it is: a source location, which packhorse never writes but for its identity
                marker, where a file of such a name is the instrument's and must be reported
                (I1: nothing left out silently), not hidden.

        Raises:
            LocationUnavailableError: the location's root is not there (an unmounted disk, a
                missing bucket): never an empty walk (DESIGN.md "storage that is absent is
                not empty").
            UnsafePathError: ``prefix`` is not a safe key or resolves outside the root (I6).
        """

    @abc.abstractmethod
    def cleanup_partials(self, older_than_seconds: float, *, resumable_older_than_seconds: float | None = None) -> int:
        """Remove unpublished partial writes older than ``older_than_seconds`` (seconds since their
        last write); those of resumable writes (:meth:`open_resumable_write`) only once older than
        ``resumable_older_than_seconds`` (default: the same age), so a retry can still resume
        them. Returns how many were removed."""

    @abc.abstractmethod
    def quarantine(self, key: str) -> str | None:
        """Move the object at ``key`` aside to :meth:`quarantine_key` (never overwriting) and
        return that new key; ``None`` if there was no object. Afterwards ``key`` is free. On a
        backend with folders, a folder, link or special file standing at ``key`` is moved aside
        whole, nothing under it followed or read.

        Raises:
            DestinationConflictError: the quarantine name is taken (nothing moved).
        """

    @staticmethod
    def quarantine_key(key: str) -> str:
        """A fresh quarantine name for ``key``: ``_packhorse/quarantine/<key>.<UTC stamp>-<random>``."""
        import datetime as dt
        import secrets

        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        return f"{QUARANTINE_PREFIX}{check_key(key)}.{stamp}-{secrets.token_hex(4)}"

    def holds(self, key: str, size: int, sha256: str) -> bool:
        """Is exactly this object already there? The one place that decides it (I2, I4).

        Returns ``False`` if there is no object under ``key``, ``True`` if it has ``size``
        bytes with ``sha256``, decided by reading the object back through the backend (never
        by ETag, metadata or size alone; another size is a conflict without reading). An object
        of that size in cold storage that is not restored (an archive copy published earlier:
        a retry after a crash, an archive run again) is restored first
        (:meth:`defer_until_readable`): "already there" is never taken on trust.

        Raises:
            DestinationConflictError: ``key`` holds other bytes; it is left untouched.
            OperationDeferred: ``key`` is in cold storage and its restore is not ready yet
                (requested).
        """
        info = self.stat(key)
        if info is None:
            return False
        found = ""
        if info.size == size:
            self.defer_until_readable(key, "to compare it with the bytes being published")
            held = self.sha256(key)
            if held == sha256:
                return True
            found = f" and sha256 {held}"
        raise DestinationConflictError(
            f"{self.location}: {key!r} already holds different bytes (size {info.size}{found}; "
            f"expected size {size} with sha256 {sha256}); it is left untouched",
            step="publish", side="destination", path=key, host=self.location,
            diagnosis="an object with this name but other content is already stored here",
        )

    def check_same(self, key: str, size: int, sha256: str) -> None:
        """After a refused conditional create: raise :class:`DestinationConflictError` unless
        ``key`` holds exactly these bytes (:meth:`holds`); an object gone meanwhile is a
        conflict too (someone deleted it under a publisher)."""
        if not self.holds(key, size, sha256):
            raise DestinationConflictError(f"{self.location}: {key!r} vanished while publishing", path=key,
                                           host=self.location)

    def remove_partials_of(self, key: str) -> int:
        """Remove partial writes an earlier, crashed attempt left for ``key``; returns how
        many. Backends that keep unpublished bytes off the medium (S3, memory) have none."""
        return 0

    def local_path(self, key: str) -> Path | None:
        """The object's local file path if the backend is a local filesystem, else ``None``."""
        return None

    def sha256(self, key: str) -> str:
        """Re-read the stored object through the backend and return its sha256 (hex) (I4)."""
        with self.open_read(key) as f:
            return sha256_stream(f)
