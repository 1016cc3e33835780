"""Disk backend: a folder on a local or mounted filesystem.

Publication (DESIGN.md I2): bytes go to ``.<name>.<random>.packhorse-partial`` in the
destination folder, are fsynced, then published with a primitive that fails when the name
exists: ``link(2)`` (or ``renameat2(RENAME_NOREPLACE)`` where hard links are not supported),
then the folder is fsynced. Never exists-then-rename. The writer holds the partial's ``flock``
from its creation to publication or abort, and :meth:`DiskBackend.cleanup_partials` never
removes a partial a live writer holds.

Resumable writes (:meth:`DiskBackend.open_resumable_write`, the ``transfer`` stage) name their
partial ``.<name>.t<token>.<random>.packhorse-partial`` after the operation's fencing token; a
later attempt takes over the largest free one of a lower token (renamed to its own name while
locked), so a stale attempt never appends to the partial a newer attempt writes.

Folders (staging's bag folders, :meth:`DiskBackend.open_folder_write`) are filled in a hidden
``.<name>.<random>.packhorse-partial`` folder beside the key and published with
``renameat2(RENAME_NOREPLACE)``; partial folders are invisible to ``list`` and removed by
``cleanup_partials`` like partial files.

The root folder is never created here (DESIGN.md "Architecture": storage that is absent is
not empty): only :meth:`DiskBackend.create_root` does, for ``packhorse init``. With the root
missing (an unmounted disk, a renamed folder) every call raises
:class:`~packhorse.errors.LocationUnavailableError` rather than answering "no such object" or
writing into the mount point's parent; folders below the root are created one by one, never
the root itself.

Confinement (I6): keys are checked by :func:`~packhorse.storage.base.check_key`; every folder
on the way to an object must resolve inside the root (no symlink escapes) and the object
itself is opened with ``O_NOFOLLOW``: a destination symlink is never followed.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from stat import S_ISDIR, S_ISLNK, S_ISREG
from typing import Any, BinaryIO

import structlog

from packhorse.digest import hash_fd, hash_stream
from packhorse.errors import (
    DestinationConflictError,
    DestinationWriteError,
    LocationUnavailableError,
    NotRegularFileError,
    SourceMissingError,
    StorageBusyError,
    UnsafePathError,
    VerificationError,
)
from packhorse.names import quoted
from packhorse.storage.base import (
    PARTIAL_SUFFIX,
    RESERVED_PREFIX,
    Entry,
    EntryKind,
    ObjectInfo,
    PendingWrite,
    PublishResult,
    ReuseListing,
    StorageBackend,
    check_key,
)
from packhorse.storage.faults import fault_of

log = structlog.get_logger(__name__)

_RENAME_NOREPLACE = 1
#: How often a resumable write that waits for an earlier attempt's partial to be released
#: (``open_resumable_write(..., wait_for_held_seconds=)``) looks at its lock again, seconds.
HELD_PARTIAL_POLL_SECONDS = 0.2
WRITE_BUFFER_BYTES = 1 << 20
#: A resumable write whose hash is deferred (a transfer's) reads its partial back while it is
#: written, in segments of this many bytes, each after an ``fdatasync``: publishing then reads back
#: only the last segment after its ``fsync`` (I4; the read-back no longer follows the transfer).
READ_BACK_SEGMENT_BYTES = 64 << 20
_AT_FDCWD = -100


def _renameat2_noreplace(src: str, dst: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), dst)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_existing(folder: Path | str) -> None:
    """``fsync`` ``folder``; one a deletion pruned meanwhile (it was left empty) has nothing to sync."""
    try:
        _fsync_dir(Path(folder))
    except FileNotFoundError:
        pass


def partial_name(final_name: str, token: int | None) -> str:
    """A fresh partial file name for the object ``final_name``: ``.<name>.<random>`` + suffix,
    or ``.<name>.t<token>.<random>`` + suffix for a resumable write under fencing token ``token``."""
    tag = f"t{token}." if token is not None else ""
    return f".{final_name}.{tag}{secrets.token_hex(6)}{PARTIAL_SUFFIX}"


def partial_token(final_name: str, name: str) -> int | None:
    """The fencing token in the name of a resumable partial of ``final_name``, else ``None``
    (not a partial of that object, or a plain one)."""
    head = f".{final_name}.t"
    if not (name.startswith(head) and name.endswith(PARTIAL_SUFFIX)):
        return None
    token, dot, rand = name[len(head):-len(PARTIAL_SUFFIX)].partition(".")
    if not (dot and token.isdigit() and len(rand) == 12 and all(c in "0123456789abcdef" for c in rand)):
        return None
    return int(token)


def _is_resumable_partial(name: str) -> bool:
    """Whether a partial file's name carries a fencing token (``….t<token>.<random>`` + suffix)."""
    stem = name[:-len(PARTIAL_SUFFIX)]
    head, _, rand = stem.rpartition(".")
    tag = head.rpartition(".")[2]
    return len(rand) == 12 and tag[:1] == "t" and tag[1:].isdigit()


def _try_lock(fd: int) -> bool:
    """Take the exclusive lock of an open partial file without waiting; ``False`` if a live
    writer holds it (a writer holds it from creation to publication or abort)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _move_noreplace(src: str, dst: str) -> None:
    """Rename ``src`` to the fresh name ``dst`` without ever replacing a file there."""
    try:
        _renameat2_noreplace(src, dst)
    except OSError as e:
        if e.errno not in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise
        os.link(src, dst, follow_symlinks=False)
        os.unlink(src)


class _DiskPendingWrite(PendingWrite):
    """A write into a partial file beside the final name; the writer holds the partial's
    ``flock`` from creation until publication or abort (a resumer never takes over a partial a
    live writer holds). With ``taken_over`` (an fd of an earlier attempt's partial, locked and
    already renamed to ``tmp``) the write starts from those bytes (:meth:`keep_prefix`); an empty
    one taken over is written as a fresh partial is."""

    def __init__(self, backend: "DiskBackend", key: str, final: Path, *, token: int | None = None,
                 taken_over: tuple[int, Path] | None = None) -> None:
        super().__init__(key)
        self._backend = backend
        self._final = final
        if taken_over is not None:
            fd, self._tmp = taken_over
            self.resumed_bytes = os.fstat(fd).st_size
        else:
            self._tmp = final.with_name(partial_name(final.name, token))
            fd = os.open(self._tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)  # a fresh file: nobody else holds it
        # keep_prefix() decides about taken-over bytes; an empty partial taken over (its writer
        # was killed before its first bytes reached the file) holds none: nothing to decide
        self._decided = self.resumed_bytes == 0
        # a resumable write (a transfer's) hands each write to the file at once: what it wrote
        # is in the partial when its process is killed, for the next attempt to resume from
        self._write_through = token is not None or taken_over is not None
        self._file = os.fdopen(fd, "r+b", buffering=WRITE_BUFFER_BYTES)  # tar headers are 512-byte writes
        self._follower: _ReadBackFollower | None = None  # the overlapped read-back (defer_hash)

    @property
    def local_path(self) -> Path:
        return self._tmp

    def open_resumed(self) -> BinaryIO:
        if not self.resumed_bytes:
            return super().open_resumed()
        return open(self._tmp, "rb", buffering=0)

    def keep_prefix(self, nbytes: int, hasher: Any) -> None:
        if nbytes < 0 or nbytes > self.resumed_bytes:
            raise ValueError(f"{self.key!r}: cannot keep {nbytes} of {self.resumed_bytes} taken-over bytes")
        try:
            self._file.flush()
            os.ftruncate(self._file.fileno(), nbytes)
            self._file.seek(nbytes)
        except OSError as e:
            raise self._write_failed(e) from e
        self._hash = hasher.copy()
        self.size = nbytes
        self._decided = True

    def adopt_local_file(self) -> None:
        try:
            self._file.flush()
            st = os.stat(self._tmp, follow_symlinks=False)
        except FileNotFoundError:
            raise VerificationError(
                f"{self._backend.location}: the transfer command left no file for {self.key!r}",
                side="destination", path=self.key, host=self._backend.location,
            ) from None
        mine = os.fstat(self._file.fileno())
        if (st.st_dev, st.st_ino) != (mine.st_dev, mine.st_ino):
            # the command replaced the partial by a rename (rsync without --inplace): hold the new file
            fd = os.open(self._tmp, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._file.close()
            self._file = os.fdopen(fd, "r+b", buffering=WRITE_BUFFER_BYTES)
        with open(self._tmp, "rb", buffering=0) as f:
            self._hash = hash_stream(f)
        self.size = os.fstat(self._file.fileno()).st_size
        self._file.seek(self.size)
        self._decided = True

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._decided:
            raise RuntimeError(f"{self.key!r}: keep_prefix() must decide what to keep of the taken-over "
                               "partial before new bytes are written")
        try:
            self._file.write(data)
            if self._write_through:
                self._file.flush()
        except OSError as e:
            raise self._write_failed(e) from e
        if self._write_through and not self._hashing:  # in the file now: read back the segments done
            if self._follower is None:
                self._follower = _ReadBackFollower(self._file.fileno())
            self._follower.written(self.size + len(data))

    def _write_failed(self, e: OSError) -> DestinationWriteError:
        """Remove the partial file at once (a full disk must not stay full of it) and name the
        location and key in the error."""
        self.abort()
        full = e.errno in (errno.ENOSPC, errno.EDQUOT)
        what = "the file system is full" if full else "the write failed"
        return DestinationWriteError(
            f"{self._backend.location}: writing {self.key!r} failed after {self.size:,} bytes, {what}: "
            f"{e.strerror or e} (partial file removed)",
            step="write", side="destination", path=self.key, host=self._backend.location, out_of_space=full,
            diagnosis=(f"data location {self._backend.location} is out of space; free space there (deletions "
                       "under disk pressure: docs/deletion.md): the operation waits for it and goes on by itself"
                       if full else None))

    def defer_hash(self) -> bool:
        super().defer_hash()
        if self.resumed_bytes and self._decided:
            raise RuntimeError(f"{self.key!r}: defer_hash() after keep_prefix()")
        self._hashing = False
        return True

    def _read_back(self, expected_sha256: str | None) -> str:
        """The sha256 of the partial file as it is on the disk now (read back with ``pread``
        after the fsync; every byte, a taken-over prefix included), checked against
        ``expected_sha256`` and the size written (:meth:`defer_hash`; I4).

        Raises:
            VerificationError: other bytes, or another size; nothing is published.
            ValueError: no expected sha256 to compare with.
        """
        if expected_sha256 is None:
            raise ValueError(f"{self.key!r}: a write with a deferred hash is published with its expected sha256")
        try:
            if self._follower is not None:  # the segments it read back after their fdatasync, then the rest
                size, h = self._follower.finish()
            else:
                size, h = hash_fd(self._file.fileno())
        except OSError as e:
            raise self._write_failed(e) from e
        sha = h.hexdigest()
        if sha != expected_sha256 or size != self.size:
            raise VerificationError(
                f"{self._backend.location}:{self.key}: read back {size} bytes with sha256 {sha} before publishing, "
                f"expected {self.size} bytes with {expected_sha256}; nothing published",
                step="publish", side="destination", path=self.key, host=self._backend.location,
            )
        return sha

    def publish(self, expected_sha256: str | None = None) -> PublishResult:
        try:
            deferred = not self._hashing
            sha = "" if deferred else self.check_expected(expected_sha256, self._backend.location)
            try:
                self._file.flush()
                os.fsync(self._file.fileno())
            except OSError as e:
                raise self._write_failed(e) from e
            if deferred:
                sha = self._read_back(expected_sha256)
            os.fchmod(self._file.fileno(), 0o444)
            try:  # still holding the partial's lock: no resumer takes it over while it is linked
                try:
                    os.link(self._tmp, self._final, follow_symlinks=False)
                except OSError as e:
                    if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS):
                        raise
                    _renameat2_noreplace(str(self._tmp), str(self._final))
                already = False
            except FileExistsError:
                already = True
            if already:
                self._backend.check_same(self.key, self.size, sha)
            self._backend._sync_folder(self._final.parent)
            return PublishResult(self.key, self.size, sha, already_there=already, read_back=deferred)
        finally:
            self.abort()

    def _stop_follower(self) -> None:
        if self._follower is not None:
            self._follower.stop()
            self._follower = None

    def suspend(self) -> None:
        if not self._write_through:  # not a resumable write: nothing may resume it
            self.abort()
            return
        self._stop_follower()
        try:  # closing releases the flock: a later attempt's open_resumable_write takes it over
            if not self._file.closed:
                self._file.close()
        except OSError:
            self.abort()
        self.closed = True

    def abort(self) -> None:
        # close() flushes the write buffer, which fails again on a full disk: the partial
        # file is removed whatever close() says
        self._stop_follower()
        try:
            if not self._file.closed:
                self._file.close()
        except OSError:
            pass
        finally:
            try:
                os.unlink(self._tmp)
            except FileNotFoundError:
                pass
            self.closed = True


class _ReadBackFollower:
    """The read-back of a partial file that is still being written (I4, overlapped): a thread
    that, each time :data:`READ_BACK_SEGMENT_BYTES` more were written, ``fdatasync``s the file
    and reads the bytes from where it stopped up to what was written before that sync back with
    ``pread`` into a running sha256. :meth:`finish` (after the writer's final ``fsync``) reads
    the rest to the file's end: every byte is hashed as read back from the file after it was
    synced, none from the writer's buffers."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._hash = hashlib.sha256()
        self._at = 0  # bytes read back
        self._handed = 0  # bytes handed to the thread
        self._cond = threading.Condition()
        self._target = 0
        self._stopping = False
        self._error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="read-back", daemon=True)
        self._thread.start()

    def written(self, end: int) -> None:
        """The file holds ``end`` bytes written (flushed to the file descriptor)."""
        if end - self._handed >= READ_BACK_SEGMENT_BYTES:
            self._handed = end
            with self._cond:
                self._target = end
                self._cond.notify()

    def _run(self) -> None:
        buf = bytearray(8 << 20)
        view = memoryview(buf)
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or self._target > self._at)
                if self._stopping:
                    return
                target = self._target
            try:
                os.fdatasync(self._fd)
                while self._at < target:
                    n = os.preadv(self._fd, [view[:min(len(buf), target - self._at)]], self._at)
                    if not n:
                        raise OSError(errno.EIO, f"the partial file ended at {self._at:,} bytes, "
                                                 f"{target:,} were written")
                    self._hash.update(view[:n])
                    self._at += n
            except OSError as e:
                self._error = e
                return

    def stop(self) -> None:
        """Stop the thread (after the segment it reads now)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()

    def finish(self) -> tuple[int, Any]:
        """After the writer's ``fsync``: read the rest back to the file's end; ``(bytes read back,
        sha256 hash object)``.

        Raises:
            OSError: a sync or read failed (now or in the thread).
        """
        self.stop()
        if self._error is not None:
            raise self._error
        buf = bytearray(8 << 20)
        view = memoryview(buf)
        while n := os.preadv(self._fd, [buf], self._at):
            self._hash.update(view[:n])
            self._at += n
        return self._at, self._hash


class PendingFolder:
    """A folder being filled (by an extraction) and not yet visible under its key. Use as a
    context manager: leaving the block without :meth:`publish` removes it.

    Attributes:
        key: the folder's key once published.
        path: the hidden partial folder to fill (inside the location root, beside the key).
    """

    def __init__(self, backend: "DiskBackend", key: str, final: Path) -> None:
        self.key = key
        self._backend = backend
        self._final = final
        self.path = final.with_name(f".{final.name}.{secrets.token_hex(6)}{PARTIAL_SUFFIX}")
        os.mkdir(self.path, 0o755)

    def publish(self, folder: Path | None = None) -> bool:
        """Move ``folder`` (the partial folder itself, or a folder inside it) to the key with
        ``renameat2(RENAME_NOREPLACE)``, then fsync the parent; the partial folder is removed.

        Returns:
            ``True`` if published; ``False`` if the key already existed (a concurrent attempt
            published it): the caller must check that folder, never replace it (I2).

        Raises:
            UnsafePathError: ``folder`` is not inside the partial folder.
        """
        src = self.path if folder is None else Path(folder)
        try:
            if src != self.path and self.path not in src.parents:
                raise UnsafePathError(f"{self._backend.location}: {quoted(str(src))} is not inside the partial folder of "
                                      f"{self.key!r}", path=self.key, host=self._backend.location)
            try:
                _renameat2_noreplace(str(src), str(self._final))
            except FileExistsError:
                return False
            except OSError as e:
                if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    return False
                raise
            _fsync_dir(self._final.parent)
            return True
        finally:
            self.abort()

    def abort(self) -> None:
        """Remove the partial folder and everything in it; idempotent."""
        _remove_path(self.path)

    def __enter__(self) -> "PendingFolder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()


class DiskBackend(StorageBackend):
    """A data location stored in folder ``root``, which must exist (never created here; see
    the module docstring).

    Args:
        location: the data location's name, for messages.
        root: absolute path of the location's root folder.
    """

    def __init__(self, location: str, root: Path | str) -> None:
        self.location = location
        self.root = Path(root)
        self._root_str = str(self.root)
        self._resolve_root()
        self._deferred = threading.local()  # .folders: the folders to sync when the block ends

    @contextlib.contextmanager
    def deferred_sync(self) -> Iterator[None]:
        if getattr(self._deferred, "folders", None) is not None:  # nested: the outermost syncs
            yield
            return
        folders: set[str] = set()
        self._deferred.folders = folders
        try:
            yield
        finally:  # a block that raised still syncs: what it published may be recorded (salvage)
            self._deferred.folders = None
            for folder in sorted(folders):
                _sync_existing(folder)

    def _sync_folder(self, folder: Path | str) -> None:
        """Make the entries of ``folder`` durable now, or when the :meth:`deferred_sync` block
        of this thread ends."""
        folders = getattr(self._deferred, "folders", None)
        if folders is None:
            _sync_existing(folder)
        else:
            folders.add(str(folder))

    def _resolve_root(self) -> None:
        self._real_root = Path(os.path.realpath(self.root))
        self._real_root_str = str(self._real_root)
        self._real_root_prefix = self._real_root_str.rstrip("/") + "/"

    # -- the root -------------------------------------------------------------------
    def root_missing(self) -> str | None:
        """Why the root folder is not usable (missing, or not a folder), or ``None``."""
        try:
            st_ = os.stat(self._root_str)
        except FileNotFoundError:
            return (f"the root folder {self._root_str} does not exist (an unmounted disk, a renamed or removed "
                    "folder)")
        except OSError as e:
            return f"the root folder {self._root_str} cannot be reached: {e.strerror or e}"
        if not os.path.stat.S_ISDIR(st_.st_mode):
            return f"the root {self._root_str} is not a folder"
        if os.path.realpath(self._root_str) != self._real_root_str:
            self._resolve_root()  # the root appeared (or was re-linked) since this backend was built
        return None

    def create_root(self) -> bool:
        """Create the root folder (and its parents) if missing; ``packhorse init`` only."""
        if os.path.isdir(self._root_str):
            return False
        self.root.mkdir(parents=True, exist_ok=True)
        self._resolve_root()
        return True

    def write_fault(self) -> LocationUnavailableError | None:
        """Create, write, fsync and remove a small probe file in the reserved folder
        ``_packhorse/`` of the root (see :meth:`StorageBackend.write_fault`); a missing root is
        reported as missing, never created. ``EROFS``, ``EIO``, ``EACCES`` give the error with
        its ``fault``; any other ``OSError`` is reported the same way (a write that fails there
        is not a location to write to), with ``fault`` its errno name."""
        missing = self._unavailable()
        if missing is not None:
            return missing
        folder = os.path.join(self._root_str, RESERVED_PREFIX.rstrip("/"))
        probe = os.path.join(folder, f".write-probe-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            if not os.path.isdir(folder):
                os.mkdir(folder, 0o755)
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, b"packhorse write probe\n")
                os.fsync(fd)
            finally:
                os.close(fd)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(probe)
        except OSError as e:
            name, text = fault_of(e) or (errno.errorcode.get(e.errno or 0, "OSError"), str(e))
            why = f"writing at the root {self._root_str} fails: {text}"
            return LocationUnavailableError(f"data location {self.location}: {why}", location=self.location,
                                            reason=why, fault=name)
        return None

    def _unavailable(self, key: str | None = None) -> LocationUnavailableError | None:
        """The error to raise if the root is missing now, else ``None`` (a missing object is
        then really missing)."""
        why = self.root_missing()
        if why is None:
            return None
        return LocationUnavailableError(f"data location {self.location}: {why}", location=self.location,
                                        reason=why, path=key)

    def _check_root(self, key: str | None = None) -> None:
        err = self._unavailable(key)
        if err is not None:
            raise err

    # -- paths --------------------------------------------------------------------
    def _path(self, key: str, *, create_parents: bool = False) -> Path:
        check_key(key)
        path = self.root / key
        self._confine(key, path.parent)  # before mkdir: never create folders through an escape
        if create_parents:
            self._check_root(key)
            try:
                self._make_folders(key)
            except FileNotFoundError:  # the root went away meanwhile: never re-created
                raise (self._unavailable(key) or StorageBusyError(
                    f"{self.location}: the folder of {key!r} was removed while it was created", side="destination",
                    path=key, host=self.location)) from None
            except (FileExistsError, NotADirectoryError):
                raise DestinationConflictError(
                    f"{self.location}: cannot create the folder of {key!r}: a file of that name is in the way",
                    step="publish", side="destination", path=key, host=self.location,
                ) from None
            self._confine(key, path.parent)
        return path

    def _make_folders(self, key: str) -> None:
        """Create the folders of ``key`` below the root, one at a time: the root itself is
        never created (a missing root makes the first ``mkdir`` fail with ENOENT)."""
        parts = key.split("/")[:-1]
        current = self._root_str
        for part in parts:
            current = os.path.join(current, part)
            try:
                os.mkdir(current, 0o755)
            except FileExistsError:
                if not os.path.isdir(current):
                    raise
        return None

    def _confine(self, key: str, folder: Path | str, real: str | None = None) -> None:
        """Raise :class:`UnsafePathError` unless ``folder`` (resolved: ``real``) is inside the root."""
        real = os.path.realpath(folder) if real is None else real
        if real != self._real_root_str and not real.startswith(self._real_root_prefix):
            raise UnsafePathError(
                f"{self.location}: {key!r} resolves outside the location root (symlink escape)",
                path=key, host=self.location,
            )

    def local_path(self, key: str) -> Path:
        """Absolute path of ``key`` under the root (checked for confinement)."""
        return self._path(key)

    # -- interface ----------------------------------------------------------------
    def _parent_fd(self, key: str) -> tuple[int, str] | None:
        """Open the folder of ``key`` and check (through ``/proc/self/fd``) that it really is
        inside the root; returns ``(folder fd, file name)`` or ``None`` if the folder is missing.

        Opening the object relative to this fd with ``O_NOFOLLOW`` leaves no window between the
        check and the open (and is cheaper than ``realpath`` on every read). Plain strings, not
        ``pathlib``: this runs once per source file read.
        """
        check_key(key)
        folder, _, name = key.rpartition("/")
        folder_path = os.path.join(self._root_str, folder) if folder else self._root_str
        try:
            dfd = os.open(folder_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            try:
                real: str | None = os.readlink(f"/proc/self/fd/{dfd}")
            except OSError:  # no /proc: _confine resolves the path
                real = None
            self._confine(key, folder_path, real)
        except BaseException:
            os.close(dfd)
            raise
        return dfd, name

    def stat(self, key: str) -> ObjectInfo | None:
        opened = self._parent_fd(key)
        if opened is None:
            self._check_root(key)
            return None
        dfd, name = opened
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            self._check_root(key)
            return None
        finally:
            os.close(dfd)
        if not os.path.stat.S_ISREG(st.st_mode):
            raise UnsafePathError(f"{self.location}: {quoted(key)} is not a regular file", path=key, host=self.location)
        return ObjectInfo(key, st.st_size, st.st_mtime, st.st_mtime_ns)

    def open_read(self, key: str) -> BinaryIO:
        """See :meth:`StorageBackend.open_read`. The file is opened with ``O_NOFOLLOW |
        O_NONBLOCK`` relative to its confined folder, and the descriptor is then checked with
        ``fstat``: a FIFO or a device put at ``key`` after it was listed (``lstat`` then
        ``open`` is a race an instrument's host or an attacker can win) is refused at once
        instead of blocking the reader forever in ``open(2)``. ``O_NONBLOCK`` is cleared
        again on the regular file (it has no effect on reading one).

        Raises:
            SourceMissingError: nothing at ``key``.
            UnsafePathError: ``key`` is a symbolic link, or its folder resolves outside the root (I6).
            NotRegularFileError: ``key`` is a FIFO, a device, a socket or a folder.
            LocationUnavailableError: the root is missing.
        """
        opened = self._parent_fd(key)
        if opened is None:
            self._check_root(key)
            raise SourceMissingError(f"{self.location}: {key!r} does not exist", side="source", path=key,
                                     host=self.location)
        dfd, name = opened
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
        except (FileNotFoundError, NotADirectoryError):
            os.close(dfd)
            dfd = -1
            self._check_root(key)
            raise SourceMissingError(
                f"{self.location}: {key!r} does not exist", side="source", path=key, host=self.location
            ) from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise UnsafePathError(f"{self.location}: {quoted(key)} is a symlink", path=key, host=self.location) from None
            raise
        finally:
            if dfd >= 0:
                os.close(dfd)
        try:
            if not S_ISREG(os.fstat(fd).st_mode):
                raise NotRegularFileError(f"{self.location}: {quoted(key)} is not a regular file", path=key,
                                          host=self.location)
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return os.fdopen(fd, "rb", buffering=0)  # callers read in large blocks

    def open_write(self, key: str) -> PendingWrite:
        """Start the write of ``key`` in a partial file next to it (folders created as needed).

        Raises:
            StorageBusyError: a concurrent :meth:`delete` pruned the (then empty) folder
                between its creation and the partial file's; the retry layer tries again.
            DestinationConflictError: a file is in the way of a folder of ``key``.
        """
        path = self._path(key, create_parents=True)
        try:
            return _DiskPendingWrite(self, key, path)
        except FileNotFoundError:
            unavailable = self._unavailable(key)
            if unavailable is not None:
                raise unavailable from None
            raise StorageBusyError(f"{self.location}: the folder of {key!r} was removed by a concurrent deletion "
                                   "while the write started", side="destination", path=key,
                                   host=self.location) from None

    def open_resumable_write(self, key: str, token: int, *, wait_for_held_seconds: float = 0.0,
                             while_waiting: Callable[[], None] | None = None) -> PendingWrite:
        """Start the write of ``key`` under fencing token ``token``, taking over the partial an
        earlier attempt left if there is one (see "Resumption" in :mod:`packhorse.storage.base`).

        Of the partials of ``key`` that no live writer holds (their ``flock`` is free: the
        writer was killed or finished), the largest one written under a lower token is renamed
        to this write's own name (``.<name>.t<token>.<random>``, no-replace) and its bytes become
        :attr:`~packhorse.storage.base.PendingWrite.resumed_bytes`; the other such partials are
        removed. Partials under this or a higher token (a newer attempt's: this one is stale) and
        partials a live writer holds are left alone. ``flock`` works on local file systems and
        on NFS (Linux emulates it with POSIX locks there).

        With ``wait_for_held_seconds`` (> 0, seconds) the write waits when the largest partial of
        a lower token is held by a live writer (a stale attempt about to stop: it suspends its
        partial once its lease is found lost, docs/reliability.md "Resumable transfers"): it
        looks at the lock again every :data:`HELD_PARTIAL_POLL_SECONDS`, calling
        ``while_waiting`` each time (the transfer's lease check: whatever it raises ends the
        wait and is raised), and takes the partial over as soon as it is free. Still held after
        that long, the write starts without it (logged, INFO ``partial_held_by_live_writer``).
        ``0`` (the default) never waits.

        Raises:
            StorageBusyError / DestinationConflictError: as :meth:`open_write`.
            whatever ``while_waiting`` raises (e.g. :class:`~packhorse.errors.LeaseLostError`).
        """
        path = self._path(key, create_parents=True)
        self._wait_for_held(key, path, token, wait_for_held_seconds, while_waiting)
        taken = self._take_over(path, token)
        try:
            return _DiskPendingWrite(self, key, path, token=token, taken_over=taken)
        except FileNotFoundError:
            raise StorageBusyError(f"{self.location}: the folder of {key!r} was removed by a concurrent deletion "
                                   "while the write started", side="destination", path=key,
                                   host=self.location) from None

    def _wait_for_held(self, key: str, final: Path, token: int, seconds: float,
                       while_waiting: Callable[[], None] | None) -> None:
        """Wait up to ``seconds`` while the best partial :meth:`_take_over` would take (the
        largest of a lower token) is held by a live writer (see :meth:`open_resumable_write`)."""
        if seconds <= 0:
            return
        started = time.monotonic()
        while True:
            candidates = self._partials_below(final, token)
            if not candidates or not candidates[0][0]:
                return  # no resumable partial of a lower token
            best = final.parent / candidates[0][2]
            if not _held_by_live_writer(str(best)):
                return
            waited = time.monotonic() - started
            if waited >= seconds:
                log.info("partial_held_by_live_writer", location=self.location, key=key, attempt=token,
                         held_attempt=partial_token(final.name, best.name), held_bytes=candidates[0][1],
                         waited_seconds=round(waited, 3), outcome="starting without it")
                return
            if while_waiting is not None:
                while_waiting()
            time.sleep(min(HELD_PARTIAL_POLL_SECONDS, seconds - waited))

    def _partials_below(self, final: Path, token: int) -> list[tuple[int, int, str]]:
        """The partial files of ``final`` a write under ``token`` may take over or remove, as
        (resumable?, size in bytes, name), best first (resumable, then largest)."""
        try:
            entries = list(os.scandir(final.parent))
        except FileNotFoundError:
            return []
        prefix = f".{final.name}."
        candidates: list[tuple[int, int, str]] = []  # (resumable?, size, name)
        for entry in entries:
            name = entry.name
            if not (name.startswith(prefix) and name.endswith(PARTIAL_SUFFIX)):
                continue
            own = partial_token(final.name, name)
            if own is None:
                rest = name[len(prefix):-len(PARTIAL_SUFFIX)]
                if not (len(rest) == 12 and all(c in "0123456789abcdef" for c in rest)):
                    continue  # another object's partial (a key that extends this one's name)
            elif own >= token:
                continue  # a newer attempt's (or this attempt's own): never touched
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if os.path.stat.S_ISREG(st.st_mode):
                candidates.append((int(own is not None), st.st_size, name))
        candidates.sort(reverse=True)
        return candidates

    def _take_over(self, final: Path, token: int) -> tuple[int, Path] | None:
        """Lock and rename to a fresh name of ``token`` the largest free partial of ``final``
        from a lower token; remove the other free partials of ``final``. Returns (locked fd,
        new path) or ``None``."""
        candidates = self._partials_below(final, token)
        taken: tuple[int, Path] | None = None
        for resumable, _size, name in candidates:
            p = final.parent / name
            try:
                fd = os.open(p, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            keep = False
            try:
                if not _try_lock(fd):
                    continue  # a live (stale) writer still holds it
                try:
                    st = os.stat(p, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                mine = os.fstat(fd)
                if (st.st_dev, st.st_ino) != (mine.st_dev, mine.st_ino):
                    continue  # renamed away and replaced meanwhile
                if taken is None and resumable:
                    new = final.with_name(partial_name(final.name, token))
                    _move_noreplace(str(p), str(new))
                    taken, keep = (fd, new), True
                else:
                    os.unlink(p)
            finally:
                if not keep:
                    os.close(fd)
        return taken

    def open_folder_write(self, key: str) -> PendingFolder:
        """Start filling a folder that will appear under ``key`` at once when published
        (:class:`PendingFolder`; folders on the way are created, confined to the root).

        Raises:
            UnsafePathError: ``key`` is unsafe or resolves outside the root.
            DestinationConflictError: a file is in the way of a folder of ``key``.
        """
        return PendingFolder(self, key, self._path(key, create_parents=True))

    def folder(self, key: str) -> Path | None:
        """The local path of the published folder ``key``, or ``None`` if there is none.

        Raises:
            UnsafePathError: ``key`` is unsafe, resolves outside the root, or is a symlink or
                a file rather than a folder.
        """
        path = self._path(key)
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            self._check_root(key)
            return None
        if not os.path.stat.S_ISDIR(st.st_mode):
            raise UnsafePathError(f"{self.location}: {quoted(key)} is not a folder", path=key, host=self.location)
        return path

    def quarantine_folder(self, key: str) -> str | None:
        """Move the published folder ``key`` (a staged bag folder) aside, whole, to
        :meth:`quarantine_key` with ``renameat2(RENAME_NOREPLACE)`` (never overwriting, never
        deleting anything in it), then fsync both parents; returns the new key, ``None`` if
        there was no folder. Afterwards ``key`` is free for a new folder.

        Raises:
            UnsafePathError: ``key`` is unsafe, resolves outside the root, or is a symlink or a
                file rather than a folder (left where it is).
            DestinationConflictError: the quarantine name is taken (nothing moved).
        """
        path = self.folder(key)
        if path is None:
            return None
        return self._move_aside(key, path)

    def _move_aside(self, key: str, path: Path) -> str:
        """Rename whatever is at ``path`` (the entry of ``key``; not followed) to a fresh
        :meth:`quarantine_key` with ``renameat2(RENAME_NOREPLACE)``, then fsync both parents.

        Raises:
            DestinationConflictError: the quarantine name is taken (nothing moved).
        """
        target_key = self.quarantine_key(key)
        target = self._path(target_key, create_parents=True)
        try:
            _renameat2_noreplace(str(path), str(target))
        except OSError as e:
            if isinstance(e, FileExistsError) or e.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise DestinationConflictError(f"{self.location}: quarantine name {target_key!r} is taken",
                                               path=target_key, host=self.location) from None
            raise
        _fsync_dir(target.parent)
        _sync_existing(path.parent)
        return target_key

    def delete(self, key: str, *, prune: bool = True) -> bool:
        path = self._path(key)
        try:
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError):
            self._check_root(key)  # a missing root is not "already gone"
            return False
        self._sync_folder(path.parent)
        # prune empty folders up to the root
        parent = path.parent
        while prune and parent != self.root and self.root in parent.parents:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent
        return True

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._check_root()  # a missing root is not an empty one
        out: list[ObjectInfo] = []
        for dirpath, dirnames, filenames in _folders(self.root):
            dirnames[:] = sorted(d for d in dirnames if not d.endswith(PARTIAL_SUFFIX))
            rel_dir = os.path.relpath(dirpath, self.root)
            for name in filenames:
                if name.endswith(PARTIAL_SUFFIX):
                    continue
                key = name if rel_dir == "." else f"{rel_dir}/{name}"
                if not key.startswith(prefix) or key.startswith(RESERVED_PREFIX):
                    continue
                try:
                    st = os.lstat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue
                if os.path.stat.S_ISREG(st.st_mode):
                    out.append(ObjectInfo(key, st.st_size, st.st_mtime))
        out.sort(key=lambda o: o.key)
        return iter(out)

    def walk(self, prefix: str = "", *, reuse: ReuseListing | None = None,
             everything: bool = False) -> Iterator[Entry]:
        """See :meth:`StorageBackend.walk`. One ``scandir`` per folder listed and one ``lstat``
        per entry (about what ``find -printf '%s %T@'`` costs); the root itself may be a
        symbolic link (a mount point elsewhere), nothing under it is followed. This backend's
        own partial writes (files, and folders of :meth:`open_folder_write`, named
        ``.<name>.<12 hex digits>`` + :data:`PARTIAL_SUFFIX`) and the reserved top folder are
        left out unless ``everything``; any other name ending in the suffix is reported (a
        source may hold one: the scan refuses it).

        Raises:
            LocationUnavailableError: the root folder is missing or not a folder.
        """
        self._check_root()
        root_st = os.stat(self._root_str)
        if prefix:
            folder = self._path(prefix)
            try:
                st = os.stat(folder, follow_symlinks=False)
            except (FileNotFoundError, NotADirectoryError):
                self._check_root()  # the root went away since it was looked at: absent, not empty
                return
            if not S_ISDIR(st.st_mode):
                raise UnsafePathError(f"{self.location}: {quoted(prefix)} is not a folder", path=prefix, host=self.location)
        else:
            st = root_st
        yield from _walk_folder(self._root_str, prefix, st.st_mtime_ns, reuse, everything)

    def quarantine(self, key: str) -> str | None:
        """Move the object aside with a no-replace hard link, then unlink it (never overwrites).

        Whatever else stands at ``key`` — a folder, a symbolic link, a special file (put there
        by hand or by another program: never a copy packhorse wrote) — is moved aside whole
        with ``renameat2(RENAME_NOREPLACE)``, nothing under it followed or read, so the key is
        free for the copy it must hold (DESIGN.md "No dead ends").
        """
        path = self._path(key)
        try:
            if self.stat(key) is None:
                return None
        except UnsafePathError:  # a folder, a link or a special file at the key
            return self._move_aside(key, path)
        target_key = self.quarantine_key(key)
        target = self._path(target_key, create_parents=True)
        try:
            os.link(path, target, follow_symlinks=False)
        except FileExistsError:
            raise DestinationConflictError(f"{self.location}: quarantine name {target_key!r} is taken",
                                           path=target_key, host=self.location) from None
        _fsync_dir(target.parent)
        self.delete(key)
        return target_key

    def cleanup_partials(self, older_than_seconds: float, *, resumable_older_than_seconds: float | None = None) -> int:
        """Remove partial folders and files older than ``older_than_seconds``; partial files of
        resumable writes (named with a fencing token) only when older than
        ``resumable_older_than_seconds``; a partial file a live writer holds (its ``flock``) is
        never removed, however old."""
        removed = 0
        if self.root_missing() is not None:
            return 0  # nothing of ours can be there; the root is never created to look
        cutoff = time.time() - older_than_seconds
        resumable_cutoff = (cutoff if resumable_older_than_seconds is None
                            else time.time() - resumable_older_than_seconds)
        for dirpath, dirs, filenames in _folders(self.root):
            for name in [d for d in dirs if d.endswith(PARTIAL_SUFFIX)]:  # partial folders
                dirs.remove(name)
                p = os.path.join(dirpath, name)
                if _newest_mtime(p) <= cutoff:  # an extraction still writing deep inside is not old
                    _remove_path(p)
                    removed += 1
            for name in filenames:
                if name.endswith(PARTIAL_SUFFIX):
                    p = os.path.join(dirpath, name)
                    limit = resumable_cutoff if _is_resumable_partial(name) else cutoff
                    try:
                        if os.lstat(p).st_mtime <= limit and not _held_by_live_writer(p):
                            os.unlink(p)
                            removed += 1
                    except FileNotFoundError:
                        pass
        return removed

    def remove_partials_of(self, key: str) -> int:
        """Remove leftover partial writes of ``key`` (an earlier, crashed attempt's). A partial
        a live writer holds (its ``flock``, taken right after it created the file: two audits
        repairing the same copy at once) is not leftover and is left alone. A folder that is
        not there (never made, or pruned by a concurrent :meth:`delete` of its last object
        while this looked) holds none."""
        path = self._path(key)
        prefix = f".{path.name}."
        try:
            with os.scandir(path.parent) as it:
                names = [e.name for e in it if e.name.startswith(prefix) and e.name.endswith(PARTIAL_SUFFIX)]
        except (FileNotFoundError, NotADirectoryError):
            return 0
        removed = 0
        for name in names:
            partial = path.parent / name
            try:
                if _held_by_live_writer(str(partial)):
                    continue  # another writer's, still being written
                os.unlink(partial)
                removed += 1
            except FileNotFoundError:
                pass
        return removed


def _held_by_live_writer(path: str) -> bool:
    """Whether a live writer holds the ``flock`` of the partial file ``path``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return not _try_lock(fd)
    finally:
        os.close(fd)  # releases the lock just taken


_FOLDER, _FILE, _LINK, _SPECIAL, _UNKNOWN = (EntryKind.FOLDER, EntryKind.FILE, EntryKind.SYMLINK,
                                             EntryKind.SPECIAL, EntryKind.UNKNOWN)
_RESERVED_TOP = RESERVED_PREFIX.rstrip("/")
#: the name of this backend's own partial writes (``.<name>.<12 hex digits><PARTIAL_SUFFIX>``);
#: any other name ending in the suffix is reported (a source may hold one: the scan refuses it)
_OWN_PARTIAL = re.compile(r"\..+\.[0-9a-f]{12}" + re.escape(PARTIAL_SUFFIX) + r"\Z", re.S)


def _name(entry: os.DirEntry[str]) -> str:
    return entry.name


def _walk_folder(root: str, rel: str, mtime_ns: int, reuse: ReuseListing | None,
                 everything: bool = False) -> Iterator[Entry]:
    """:meth:`DiskBackend.walk` of folder ``rel`` (its ``mtime_ns`` already known), depth first,
    each folder's entries sorted by name, a subfolder's entries right after the subfolder.

    Iterative (a stack of the folders being listed, one :func:`_folder_entries` each), not
    recursive: a source tree thousands of folders deep (an instrument's runaway, or a hostile
    one) is walked like any other instead of raising ``RecursionError`` and stopping the
    registration of the whole location. Memory: one sorted listing per folder on the path
    being walked."""
    stack = [_folder_entries(root, rel, mtime_ns, reuse, everything)]
    while stack:
        item = next(stack[-1], None)
        if item is None:
            stack.pop()
        elif type(item) is Entry:
            yield item
        else:
            sub, sub_mtime_ns = item  # type: ignore[misc]
            stack.append(_folder_entries(root, sub, sub_mtime_ns, reuse, everything))


def _folder_entries(root: str, rel: str, mtime_ns: int, reuse: ReuseListing | None,
                    everything: bool) -> Iterator[Entry | tuple[str, int]]:
    """The entries of folder ``rel`` for :func:`_walk_folder`: an :class:`Entry` each, and
    ``(subfolder path, its mtime_ns)`` where the subfolder's own walk goes. Plain strings and
    one ``lstat`` per entry: this runs once per file of a source tree."""
    path = f"{root}/{rel}" if rel else root
    again = reuse(rel, mtime_ns) if reuse is not None else None
    if again is not None:
        yield Entry(rel, _FOLDER, 0, mtime_ns)
        for sub in again:
            try:
                st = os.stat(f"{root}/{sub}", follow_symlinks=False)
            except OSError as e:
                yield Entry(sub, _UNKNOWN, 0, 0, e.strerror)
                continue
            if S_ISDIR(st.st_mode):
                yield sub, st.st_mtime_ns
            # else: gone or replaced, which changes the parent's mtime: the next look lists it
        return
    try:
        with os.scandir(path) as it:
            entries = sorted(it, key=_name)
    except OSError as e:
        yield Entry(rel, _FOLDER, 0, mtime_ns, e.strerror)
        return
    yield Entry(rel, _FOLDER, 0, mtime_ns)
    base = f"{rel}/" if rel else ""
    for entry in entries:
        name = entry.name
        if not rel and name == _RESERVED_TOP and not everything:
            continue  # packhorse's own objects
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError as e:
            yield Entry(base + name, _UNKNOWN, 0, 0, e.strerror)
            continue
        mode = st.st_mode
        if name[0] == "." and name.endswith(PARTIAL_SUFFIX) and _OWN_PARTIAL.match(name) and not everything:
            continue  # an unpublished write of this backend (a file or a folder being filled)
        if S_ISREG(mode):
            yield Entry(base + name, _FILE, st.st_size, st.st_mtime_ns)
        elif S_ISDIR(mode):
            yield base + name, st.st_mtime_ns
        elif S_ISLNK(mode):
            yield Entry(base + name, _LINK, st.st_size, st.st_mtime_ns)
        else:
            yield Entry(base + name, _SPECIAL, 0, st.st_mtime_ns)


def _folders(top: str | Path) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(top)`` top-down without following links, iterative: ``(folder path, subfolder
    names, other names)``; the caller may prune the subfolder names in place. Python 3.11's
    ``os.walk`` recurses once per level and raises ``RecursionError`` about 1,000 levels down;
    this walks any depth (unreadable folders are left out, as ``os.walk`` does)."""
    stack = [os.fspath(top)]
    while stack:
        folder = stack.pop()
        dirs: list[str] = []
        others: list[str] = []
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    try:
                        is_dir = entry.is_dir(follow_symlinks=False)
                    except OSError:
                        is_dir = False
                    (dirs if is_dir else others).append(entry.name)
        except OSError:
            continue
        yield folder, dirs, others
        stack.extend(os.path.join(folder, d) for d in reversed(dirs))


_TREE_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(parent_fd: int, name: str) -> None:
    """Remove folder ``name`` of the folder open as ``parent_fd`` and everything under it,
    following no link (a link is removed, never what it points to), at any depth.

    Iterative, through descriptors (``openat`` / ``unlinkat``, never a path longer than one
    name): Python 3.11's :func:`shutil.rmtree` recurses once per level and raises
    ``RecursionError`` (which ``ignore_errors`` does not catch) about 1,000 levels down, so a
    partial folder of a deep bag was left behind. Holds one descriptor per level of the
    folder being emptied. Entries removed meanwhile by someone else are no error.

    Raises:
        OSError: a folder or file could not be removed (other than already gone).
    """
    try:
        top = os.open(name, _TREE_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        return
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=parent_fd)  # a link or a file stands there: removed itself
        return
    fds = [top]
    names = [name]
    pending = [_empty_of_files(top)]
    try:
        while fds:
            if pending[-1]:
                sub = pending[-1].pop()
                try:
                    nfd = os.open(sub, _TREE_FLAGS, dir_fd=fds[-1])
                except FileNotFoundError:
                    continue
                except OSError as e:
                    if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(sub, dir_fd=fds[-1])
                    continue
                fds.append(nfd)
                names.append(sub)
                pending.append(_empty_of_files(nfd))
                continue
            os.close(fds.pop())
            pending.pop()
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(names.pop(), dir_fd=fds[-1] if fds else parent_fd)
    finally:
        for fd in fds:
            os.close(fd)


def _empty_of_files(dir_fd: int) -> list[str]:
    """Unlink every entry of the folder open as ``dir_fd`` that is not a folder (links
    included, never followed); returns the names of its subfolders."""
    subs: list[str] = []
    with os.scandir(dir_fd) as it:
        entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
    for entry_name, is_dir in entries:
        if is_dir:
            subs.append(entry_name)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry_name, dir_fd=dir_fd)
    return subs


def _remove_path(path: str | Path) -> None:
    """:func:`remove_tree` of the folder at ``path``, errors ignored (a sweep or an abort:
    what is left is met again at the next sweep)."""
    parent, _, name = os.fspath(path).rstrip("/").rpartition("/")
    try:
        pfd = os.open(parent or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        remove_tree(pfd, name)
    except OSError:
        pass
    finally:
        os.close(pfd)


def _newest_mtime(folder: str) -> float:
    """The newest mtime (UTC s) of ``folder`` and everything under it (0 if it is gone)."""
    newest = 0.0
    for dirpath, _dirs, filenames in _folders(folder):
        for p in (dirpath, *(os.path.join(dirpath, f) for f in filenames)):
            try:
                newest = max(newest, os.lstat(p).st_mtime)
            except FileNotFoundError:
                pass
    return newest
