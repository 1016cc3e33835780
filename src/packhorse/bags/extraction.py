"""The one reader of tar archives, and the one way a tar becomes files (DESIGN.md I6).

Every path that reads a tar from storage takes its members from :func:`members_of` (or
:func:`iter_members`, the same over a file object): the bag validator's tar front end
(:func:`packhorse.bags.validation.validate_tar`, under :func:`~packhorse.bags.packaging.read_bag_tar`
and :func:`~packhorse.bags.packaging.read_bag_bytes`), so ``unpack`` (a bundle, and every raw data
package tar it carries) and ``staging``'s check pass; and :func:`extract_tar`, staging's
extraction, the only place a tar becomes files. The
standard library's :mod:`tarfile` only parses headers here; its ``extract*`` functions and
extraction filters are never used: the ``data`` filter is bypassable on every Python
packhorse supports (CVE-2025-4517 and its family, cpython#135034: chains of symbolic links
whose resolved path exceeds ``PATH_MAX`` make the filter's ``realpath`` check pass while the
kernel follows the links out of the target).

Input is treated as hostile. The reader refuses, with
:class:`~packhorse.errors.UnsafePathError` (permanent, never retried) whose message starts
with the artifact (``location:key``) and names the member (quoted by
:func:`packhorse.names.quoted`: a name longer than 200 characters is cut there and its length
said; the error's ``path`` keeps it whole):

- every member that is not a regular file or a directory: symbolic and hard links, character
  and block devices, FIFOs, sparse and contiguous files, unknown types;
- absolute names, ``..``, empty and ``.`` components, names that are not UTF-8 or hold NUL,
  a component longer than ``NAME_MAX`` (255 bytes), a name of ``PATH_MAX`` (4096) bytes or more;
- a second member with the same name (the standard library would let it overwrite the first),
  a file where an earlier member made a directory and the other way round;
- where the target file system would merge them (so the second would land on the first), two
  names that differ only by Unicode normalization (NFC: a normalizing file system, such as
  APFS or ZFS with ``normalization=formD``) or only by letter case (a case-insensitive one);
  :func:`extract_tar` probes its new target for both. Readers that create no file from a
  member name (unpack, validation) do not refuse such pairs: on Linux file systems ``é`` in
  NFC and in NFD are two files, a source folder may hold both, and packhorse archives both.
  The two names print alike: the refusal shows each one's form and the code points where they
  differ (:func:`packhorse.names.twins`);
- a directory member carrying data, an extended (PAX or GNU) header over
  :data:`MAX_HEADER_BYTES` (tarfile would read it whole into memory);
- more members than ``bags.extraction.max_members``, a member larger than
  ``bags.extraction.max_member_bytes`` or more payload than ``bags.extraction.max_total_bytes`` (the key
  is named in the error; :class:`ExtractionLimits`).

:func:`extract_tar` creates a new target folder and then every member beneath it one path
component at a time from directory file descriptors: directories with ``mkdir(dir_fd=)`` and
``open(O_DIRECTORY | O_NOFOLLOW, dir_fd=)``, files with ``open(O_WRONLY | O_CREAT | O_EXCL |
O_NOFOLLOW, dir_fd=)``. No link is ever created or followed, no existing entry is ever
written into, and a name the file system merged with an earlier one fails on ``O_EXCL``.
Permissions are not taken from the tar (files 0644, folders 0755, less the umask); file
mtimes are. On any refusal or error the target folder is removed before the error is raised.

Where the bytes are checked before anything is written: ``staging`` (see
:mod:`packhorse.stages.staging`) first streams the archive copy through the reader and the
bag checks while hashing it, writing nothing; only when the sha256 and the bag agree does it
read the copy again and extract it, hashing once more; a copy whose bytes differ in the
second pass (it changed in between) has its target removed and fails permanently. ``unpack``
never turns members into files: each raw package tar is written as one object through the
storage backend and published only once its sha256 and its own bag have been verified.
"""

from __future__ import annotations

import errno
import os
import stat
import tarfile
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from packhorse.errors import ExtendedHeaderTooLargeError, UnsafePathError, VerificationError
from packhorse.names import quoted, twins
from packhorse.storage.disk import remove_tree

if TYPE_CHECKING:
    from packhorse.config import Settings

#: Longest path component most file systems accept (bytes, Linux ``NAME_MAX``).
NAME_MAX = 255
#: Member names of this many bytes or more are refused (Linux ``PATH_MAX``, including the NUL).
PATH_MAX = 4096
#: Stream buffer for reading non-seekable tars. tarfile's stream mode copies its whole
#: remaining buffer on every small read, so a large buffer costs more than it saves.
STREAM_BUFSIZE = 64 * 1024
#: Block size of the copy of a member into its file (bytes).
COPY_BLOCK = 1 << 20

_FILE_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE)
_KIND_NAMES = {
    tarfile.SYMTYPE: "a symbolic link",
    tarfile.LNKTYPE: "a hard link",
    tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device",
    tarfile.FIFOTYPE: "a FIFO",
    tarfile.CONTTYPE: "a contiguous file",
    tarfile.GNUTYPE_SPARSE: "a sparse file",
}


@dataclass(frozen=True)
class ExtractionLimits:
    """Size and count limits for one tar archive (the ``[extraction]`` settings).

    Attributes:
        max_members: members (files and folders) per archive.
        max_member_bytes: bytes of one member.
        max_total_bytes: bytes of all members of one archive together.
    """

    max_members: int = 1_000_000
    max_member_bytes: int = 1 << 40
    max_total_bytes: int = 4 << 40

    @classmethod
    def from_settings(cls, settings: Settings) -> ExtractionLimits:
        """The limits of ``settings.extraction``."""
        e = settings.extraction
        return cls(max_members=e.max_members, max_member_bytes=e.max_member_bytes,
                   max_total_bytes=e.max_total_bytes)


DEFAULT_LIMITS = ExtractionLimits()


class TarMember:
    """One member that passed every refusal rule.

    Attributes:
        name: the member's relative name, ``/``-separated, no trailing ``/``.
        parts: ``name`` split at ``/``.
        is_dir: a directory (else a regular file).
        size: bytes of data (0 for a directory).
        mtime: modification time, integer seconds since the epoch (UTC).
        offset_data: where the member's data starts in the archive (bytes).
        data: the member's bytes, readable until the next member is asked for (``None`` for
            a directory); opened on first use.
    """

    __slots__ = ("name", "parts", "is_dir", "size", "mtime", "offset_data", "_tar", "_info", "_data")

    def __init__(self, tar: tarfile.TarFile, info: tarfile.TarInfo, name: str, parts: tuple[str, ...]) -> None:
        self.name, self.parts = name, parts
        self.is_dir = info.type == tarfile.DIRTYPE
        self.size, self.mtime, self.offset_data = info.size, int(info.mtime), info.offset_data
        self._tar, self._info = tar, info
        self._data: BinaryIO | None = None

    @property
    def data(self) -> BinaryIO | None:
        if self.is_dir:
            return None
        if self._data is None:
            self._data = self._tar.extractfile(self._info)  # type: ignore[assignment]
        return self._data

    @property
    def info(self) -> tarfile.TarInfo:
        """The member's header as :mod:`tarfile` parsed it."""
        return self._info

    def __repr__(self) -> str:
        return f"TarMember({self.name!r}, {'dir' if self.is_dir else f'{self.size} bytes'})"


def refused(source: str, name: str, reason: str, *, step: str = "extract") -> UnsafePathError:
    """The error for a refused member: ``"<source>: refused tar member '<name>': <reason>"``
    (``path`` = the member's whole name, ``host`` = the location, the part of ``source`` before
    ``:``). The message quotes the name with :func:`packhorse.names.quoted`: a name of more
    than 200 characters is cut there, its length said."""
    return UnsafePathError(f"{source}: refused tar member {quoted(name)}: {reason}", path=name,
                           host=source.partition(":")[0] or None, step=step)


#: Largest extended header (PAX, GNU long name or link) read, bytes: tarfile reads one whole
#: into memory before a member exists to refuse, so a larger one is refused at the header.
MAX_HEADER_BYTES = 1 << 20


class _BoundedTarInfo(tarfile.TarInfo):
    """A :class:`tarfile.TarInfo` that refuses extended headers above :data:`MAX_HEADER_BYTES`
    before reading them (tarfile would hold a header of any declared size in memory)."""

    _EXTENDED = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
                 tarfile.GNUTYPE_LONGLINK)

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:  # type: ignore[override]
        if self.type in self._EXTENDED and self.size > MAX_HEADER_BYTES:
            raise ExtendedHeaderTooLargeError(f"has an extended header of {self.size} bytes (more than {MAX_HEADER_BYTES})")
        return super()._proc_member(tarfile_)  # type: ignore[misc]

    @classmethod
    def frombuf(cls, buf: bytes, encoding: str, errors: str) -> tarfile.TarInfo:  # type: ignore[override]
        """:meth:`tarfile.TarInfo.frombuf`, with a cheaper parse of the common header (a POSIX
        ustar block of a regular file or folder, plain octal numbers, its unsigned checksum
        right): the same fields, by the same rules, as ``tarfile`` sets them. Every other
        block, and any field this parse cannot read, goes to ``tarfile``'s own parser, which
        then raises or reads it as it always did. ``tarfile`` sums the header twice through
        1,008 Python integers; this is most of a small member's cost (benchmark (b)'s unpack).
        ``tests/unit/test_extraction.py`` compares both on random and damaged headers."""
        fast = _ustar_header(cls, buf, encoding, errors)
        return fast if fast is not None else super().frombuf(buf, encoding, errors)  # type: ignore[misc]


_USTAR_MAGIC = tarfile.POSIX_MAGIC  # b"ustar\x0000"
_NUMBER_FIELDS = ((100, 108), (108, 116), (116, 124), (124, 136), (136, 148), (148, 156), (329, 337), (337, 345))


def _octal(field: bytes) -> int:
    """``tarfile.nti`` of a field that is not base-256 (raises ValueError where nti raises)."""
    end = field.find(b"\0")
    if end != -1:
        field = field[:end]
    return int(field.decode("ascii").strip() or "0", 8)


#: number field bytes → value (:func:`_octal`): most fields repeat member after member (mode,
#: owner, mtime, the device fields); bounded, emptied when full
_OCTALS: dict[bytes, int] = {}
_OCTALS_MAX = 4096


def _text(field: bytes, encoding: str, errors: str) -> str:
    """``tarfile.nts``."""
    if not field[0]:
        return ""
    end = field.find(b"\0")
    if end != -1:
        field = field[:end]
    return field.decode(encoding, errors)


def _ustar_header(cls: type[tarfile.TarInfo], buf: bytes, encoding: str, errors: str) -> tarfile.TarInfo | None:
    """The :class:`tarfile.TarInfo` that ``tarfile.TarInfo.frombuf`` makes of ``buf``, for a
    POSIX ustar header of type ``0`` or ``5`` with octal numbers and a right unsigned checksum;
    ``None`` for anything else (left to ``tarfile``)."""
    if len(buf) != tarfile.BLOCKSIZE or buf[257:265] != _USTAR_MAGIC:
        return None
    kind = buf[156:157]
    if kind != tarfile.REGTYPE and kind != tarfile.DIRTYPE:
        return None
    octals = _OCTALS
    numbers = []
    try:
        for a, b in _NUMBER_FIELDS:
            field = buf[a:b]
            value = octals.get(field)
            if value is None:
                if field[0] in (0o200, 0o377):  # base-256: tarfile's own
                    return None
                value = _octal(field)
                if len(octals) >= _OCTALS_MAX:
                    octals.clear()
                octals[field] = value
            numbers.append(value)
        mode, uid, gid, size, mtime, chksum, devmajor, devminor = numbers
        # the unsigned checksum (NUL bytes add nothing, so they are dropped before summing);
        # a signed checksum, or a wrong one, is tarfile's to decide
        if chksum != 256 + sum(buf.translate(None, b"\0")) - sum(buf[148:156]):
            return None
        obj = cls()
        name = _text(buf[0:100], encoding, errors)
        obj.linkname = _text(buf[157:257], encoding, errors)
        obj.uname = _text(buf[265:297], encoding, errors)
        obj.gname = _text(buf[297:329], encoding, errors)
        prefix = _text(buf[345:500], encoding, errors)
    except (ValueError, UnicodeError):
        return None
    obj.mode, obj.uid, obj.gid, obj.size, obj.mtime, obj.chksum = mode, uid, gid, size, mtime, chksum
    obj.devmajor, obj.devminor, obj.type = devmajor, devminor, kind
    if kind == tarfile.DIRTYPE:
        name = name.rstrip("/")
    obj.name = f"{prefix}/{name}" if prefix else name
    return obj


def open_tar(fileobj: BinaryIO, *, source: str) -> tarfile.TarFile:
    """Open a tar for one sequential pass: random access when ``fileobj`` can seek, else stream.

    Raises:
        VerificationError: ``fileobj`` is not a tar archive.
    """
    try:
        seekable = fileobj.seekable()  # type: ignore[union-attr]
    except (AttributeError, OSError, ValueError):
        seekable = False
    try:
        if seekable:
            return tarfile.open(fileobj=fileobj, mode="r:", tarinfo=_BoundedTarInfo)
        return tarfile.open(fileobj=fileobj, mode="r|", bufsize=STREAM_BUFSIZE,  # type: ignore[call-overload]
                            tarinfo=_BoundedTarInfo)
    except ExtendedHeaderTooLargeError as e:
        raise refused(source, "(the first member)", str(e)) from None
    except tarfile.TarError as e:
        packed = _compression_of(fileobj) if seekable else None
        if packed is not None:
            raise VerificationError(f"{source}: not a tar archive: a {packed}-compressed file; bags are read as "
                                    f"uncompressed tars: decompress it first", step="unpack") from None
        raise VerificationError(f"{source}: not a tar archive: {e}", step="unpack") from None


#: Leading bytes of the compressed formats a tar is commonly shipped in (never opened: the
#: reader takes plain tars only, one pass, nothing decompressed behind the caller's back).
_COMPRESSION_MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"),
                      (b"\x28\xb5\x2f\xfd", "zstd"), (b"PK\x03\x04", "zip"))


def _compression_of(fileobj: BinaryIO) -> str | None:
    """The compression format ``fileobj`` (seekable) starts with, or ``None``."""
    try:
        fileobj.seek(0)
        head = fileobj.read(6)
    except (OSError, ValueError):
        return None
    return next((name for magic, name in _COMPRESSION_MAGIC if head.startswith(magic)), None)


def _is_archive_root(member: tarfile.TarInfo) -> bool:
    """Whether ``member`` is the folder entry ``.`` (``./``) a ``tar cf x.tar .`` starts with:
    the target folder itself. Its members' leading ``./`` is dropped by :func:`_name_of`
    (``./bag/bagit.txt`` is ``bag/bagit.txt``); nothing else about a name is rewritten."""
    return member.type == tarfile.DIRTYPE and member.name in (".", "./")


def _name_of(member: tarfile.TarInfo, source: str, step: str) -> tuple[str, tuple[str, ...]]:
    """The checked name and components of ``member``, or raise :func:`refused`."""
    raw = member.name
    name = raw.rstrip("/") if member.type == tarfile.DIRTYPE else raw
    while name.startswith("./"):  # `tar cf x.tar ./bag`: the same path (see _is_archive_root)
        name = name[2:]
    if not name:
        raise refused(source, raw, "has an empty name", step=step)
    if "\x00" in name:
        raise refused(source, raw, "has a NUL character in its name", step=step)
    if name.startswith("/"):
        raise refused(source, raw, "has an absolute name", step=step)
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        raise refused(source, raw, "has a name that is not UTF-8", step=step) from None
    parts = tuple(name.split("/"))
    if ".." in parts:
        raise refused(source, raw, "leaves the target folder ('..')", step=step)
    if any(p in ("", ".") for p in parts):
        raise refused(source, raw, "has an empty or '.' path component", step=step)
    if len(encoded) >= PATH_MAX:
        raise refused(source, raw, f"has a name of {len(encoded)} bytes (PATH_MAX is {PATH_MAX})", step=step)
    if len(encoded) > NAME_MAX:  # else no component can be longer than NAME_MAX
        for p in parts:
            if len(p.encode("utf-8")) > NAME_MAX:
                raise refused(source, raw, f"has a path component longer than {NAME_MAX} bytes (NAME_MAX)",
                              step=step)
    return name, parts


def _kind_refusal(member: tarfile.TarInfo) -> str | None:
    """Why ``member``'s type is refused, or ``None`` for a plain file or directory."""
    if member.type in (tarfile.SYMTYPE, tarfile.LNKTYPE):
        return f"is {_KIND_NAMES[member.type]} (to {quoted(member.linkname)}); links are refused"
    if member.sparse is not None:
        return "is a sparse file; only regular files and folders are extracted"
    if member.type in _FILE_TYPES or member.type == tarfile.DIRTYPE:
        return None
    what = _KIND_NAMES.get(member.type, f"of type {member.type!r}")
    return f"is {what}; only regular files and folders are extracted"


def _key(part: str, casefold: bool, normalization: bool) -> str:
    k = unicodedata.normalize("NFC", part) if normalization or casefold else part
    return k.casefold() if casefold else k


def _merged_reason(name: str, other: str) -> str:
    if unicodedata.normalize("NFC", name) == unicodedata.normalize("NFC", other):
        # the two print alike: each one's form and the code points where they differ
        return (f"differs from member {quoted(other)} only by Unicode normalization ({twins(name, other)}; "
                "the target file system merges them)")
    return f"differs from member {quoted(other)} only by letter case (the target file system is case-insensitive)"


def iter_members(
    fileobj: BinaryIO,
    *,
    source: str,
    limits: ExtractionLimits = DEFAULT_LIMITS,
    casefold: bool = False,
    normalization: bool = False,
    step: str = "extract",
) -> Iterator[TarMember]:
    """Iterate the members of a tar, applying every refusal rule of this module; stops at the
    first refused member (:func:`members_of` of :func:`open_tar`).

    Raises:
        UnsafePathError: a member is refused (see the module); names ``source`` and the member.
        VerificationError: not a tar, or a damaged one.
    """
    with open_tar(fileobj, source=source) as tar:
        try:
            yield from members_of(tar, source=source, limits=limits, casefold=casefold,
                                  normalization=normalization, step=step)
        except tarfile.TarError as e:
            raise VerificationError(f"{source}: damaged tar: {e}", step=step) from None


def members_of(
    tar: tarfile.TarFile,
    *,
    source: str,
    limits: ExtractionLimits = DEFAULT_LIMITS,
    casefold: bool = False,
    normalization: bool = False,
    step: str = "extract",
    on_refused: Callable[[UnsafePathError], None] | None = None,
) -> Iterator[TarMember]:
    """Iterate the members of the open tar ``tar`` with every refusal rule applied: the one
    tar reader of packhorse.

    The archive is read once, front to back. A member's ``data`` must be read (or left) before
    the next member is taken; the rules are applied to a member before it is yielded, so a
    caller never sees a refused member.

    Args:
        tar: from :func:`open_tar`.
        source: the artifact for messages, ``"location:key"``.
        limits: member count and byte limits.
        casefold: also refuse names differing only by letter case (a case-insensitive target).
        normalization: also refuse names differing only by Unicode normalization (a target
            file system that normalizes names).
        step: the error context's ``step``.
        on_refused: without it, a refused member raises and nothing after it is read (what
            every path that writes uses). With it, a refused member is handed to it and
            skipped, and reading goes on (a validator listing every problem); a limit
            exceeded still raises.

    Raises:
        UnsafePathError: a member is refused (see the module); names ``source`` and the member.
        tarfile.TarError: a damaged tar.
    """
    entries = _Entry("dir", "")  # the target folder: every member's name is checked in this trie
    count = total = 0
    while True:
        at = tar.offset
        try:
            member = tar.next()
        except ExtendedHeaderTooLargeError as e:
            raise refused(source, f"(the member at byte {at})", str(e), step=step) from None
        if member is None:
            return
        tar.members.clear()  # tarfile keeps every header otherwise; nothing here looks back
        count += 1
        if count > limits.max_members:
            raise refused(source, member.name, f"is member number {count}, more than extraction.max_members = "
                                               f"{limits.max_members}", step=step)
        if member.size > limits.max_member_bytes:
            raise refused(source, member.name, f"is {member.size} bytes, more than extraction.max_member_bytes = "
                                               f"{limits.max_member_bytes}", step=step)
        total += member.size
        if total > limits.max_total_bytes:
            raise refused(source, member.name, f"brings the archive to {total} bytes, more than "
                                               f"extraction.max_total_bytes = {limits.max_total_bytes}", step=step)
        if _is_archive_root(member):
            continue  # "./" of `tar cf x.tar .`: the target folder itself, nothing to make
        try:
            name, parts = _check(member, entries, source=source, casefold=casefold,
                                 normalization=normalization, step=step)
        except UnsafePathError as e:
            if on_refused is None:
                raise
            on_refused(e)
            continue
        yield TarMember(tar, member, name, parts)


class _Entry:
    """One name met so far in the tar (a node of a trie of path components, so checking a
    member costs time linear in its name's length whatever its depth): ``kind`` ``"file"``,
    ``"dir"`` (a member) or ``"implied"`` (a parent folder of a member), the component as
    ``spelled`` by the first member that named it, and the ``children`` by their key
    (:func:`_key`: the component, case-folded or normalized as the target merges names)."""

    __slots__ = ("kind", "spelled", "children")

    def __init__(self, kind: str, spelled: str) -> None:
        self.kind = kind
        self.spelled = spelled
        self.children: dict[str, _Entry] = {}


def _spelled(path: list[_Entry]) -> str:
    return "/".join(e.spelled for e in path)


def _check(member: tarfile.TarInfo, entries: _Entry, *, source: str,
           casefold: bool, normalization: bool, step: str) -> tuple[str, tuple[str, ...]]:
    """Apply the name, type and uniqueness rules to ``member``; record it in the trie
    ``entries`` (the target folder's :class:`_Entry`). Time linear in the name's length: one
    dict look-up per component, the names of earlier members never joined again."""
    name, parts = _name_of(member, source, step)
    why = _kind_refusal(member)
    if why:
        raise refused(source, name, why, step=step)
    is_dir = member.type == tarfile.DIRTYPE
    if is_dir and member.size:
        raise refused(source, name, f"is a folder carrying {member.size} bytes of data", step=step)
    keys = tuple(_key(p, casefold, normalization) for p in parts) if casefold or normalization else parts
    node = entries
    path: list[_Entry] = []  # the entries met, for messages
    missing = len(parts) - 1  # the first folder level not recorded yet (none missing: the last)
    for i in range(len(parts) - 1):
        seen = node.children.get(keys[i])
        if seen is None:
            missing = i
            break
        path.append(seen)
        if seen.spelled != parts[i]:
            spelled = "/".join(parts[:i + 1])
            raise refused(source, name, f"its folder {quoted(spelled)} {_merged_reason(spelled, _spelled(path))}", step=step)
        if seen.kind == "file":
            raise refused(source, name, f"its folder {quoted('/'.join(parts[:i + 1]))} is a file member earlier in the "
                                        "archive", step=step)
        node = seen
    last = node.children.get(keys[-1]) if missing == len(parts) - 1 else None
    if last is not None:
        if last.spelled != parts[-1]:
            raise refused(source, name, _merged_reason(name, _spelled([*path, last])), step=step)
        if last.kind == "implied" and not is_dir:
            raise refused(source, name, "is a file where earlier members made a folder", step=step)
        if last.kind != "implied":
            raise refused(source, name, "appears twice (a second member of the same name)", step=step)
        last.kind = "dir"
        return name, parts
    for i in range(missing, len(parts) - 1):  # record the folders met for the first time
        child = _Entry("implied", parts[i])
        node.children[keys[i]] = child
        node = child
    node.children[keys[-1]] = _Entry("dir" if is_dir else "file", parts[-1])
    return name, parts


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _case_insensitive(parent_fd: int, name: str) -> bool:
    """True when the folder holding ``name`` (which must exist) ignores letter case."""
    other = name.swapcase()
    if other == name:
        return False
    try:
        a = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        b = os.stat(other, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


#: The probe names of :func:`_normalizes`: "é" precomposed (NFC) and decomposed (NFD).
_PROBE_NFC = ".packhorse-probe-\u00e9"
_PROBE_NFD = ".packhorse-probe-e\u0301"


def _normalizes(folder_fd: int) -> bool:
    """True when the (new, empty) folder ``folder_fd`` merges names that differ only by Unicode
    normalization: a probe file created under its NFC name is found under its NFD name. The
    probe is removed again."""
    fd = os.open(_PROBE_NFC, _FILE_FLAGS, 0o600, dir_fd=folder_fd)
    os.close(fd)
    try:
        os.stat(_PROBE_NFD, dir_fd=folder_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False
    finally:
        os.unlink(_PROBE_NFC, dir_fd=folder_fd)


class _Folders:
    """Directory file descriptors beneath the target, one component at a time.

    Keeps one open descriptor (the folder of the last member) besides the root; any other
    folder is reached again from the root, so deep trees never hold more than two descriptors.
    """

    def __init__(self, root_fd: int, source: str) -> None:
        self.root_fd = root_fd
        self.source = source
        # the folders made, as a trie of components: finding a member's folder costs time
        # linear in its depth (no prefix tuple built and hashed per level)
        self.created: dict[str, dict] = {}  # type: ignore[type-arg]
        self.cur: tuple[tuple[str, ...], int] | None = None

    def fd(self, parts: tuple[str, ...], member: str) -> int:
        """The descriptor of folder ``parts`` (created if need be; never through a link)."""
        if not parts:
            return self.root_fd
        if self.cur is not None and self.cur[0] == parts:
            return self.cur[1]
        self.close()
        fd = self.root_fd
        made = self.created
        try:
            for i, comp in enumerate(parts):
                below = made.get(comp)
                if below is None:
                    try:
                        os.mkdir(comp, 0o755, dir_fd=fd)
                    except FileExistsError:
                        # we did not create it: another member's name the file system merged
                        # with this one, or something outside packhorse wrote into the target
                        raise refused(self.source, member, f"its folder {quoted('/'.join(parts[:i + 1]))} already exists "
                                                           "in the target (the file system merged two names)") from None
                    below = made[comp] = {}
                made = below
                try:
                    nfd = os.open(comp, _DIR_FLAGS, dir_fd=fd)
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise refused(self.source, member, f"its folder {quoted('/'.join(parts[:i + 1]))} is not a folder in "
                                                           "the target") from None
                    raise
                if fd != self.root_fd:
                    os.close(fd)
                fd = nfd
        except BaseException:
            if fd != self.root_fd:
                os.close(fd)
            raise
        self.cur = (parts, fd)
        return fd

    def close(self) -> None:
        if self.cur is not None:
            os.close(self.cur[1])
            self.cur = None


def _write_member(dir_fd: int, m: TarMember, source: str, on_block: Callable[[int], None] | None) -> None:
    try:
        fd = os.open(m.parts[-1], _FILE_FLAGS, 0o644, dir_fd=dir_fd)
    except FileExistsError:
        raise refused(source, m.name, "already exists in the target (the file system merged two names)") from None
    try:
        assert m.data is not None
        written = 0
        while True:
            block = m.data.read(COPY_BLOCK)
            if not block:
                break
            view = memoryview(block)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            written += len(block)
            if on_block:
                on_block(len(block))
        if written != m.size:
            raise VerificationError(f"{source}: damaged tar: member {quoted(m.name)} ends after {written} of {m.size} bytes",
                                    path=m.name, step="extract")
        try:
            os.utime(fd, ns=(m.mtime * 1_000_000_000, m.mtime * 1_000_000_000))
        except (OverflowError, ValueError, OSError):
            raise refused(source, m.name, f"has a modification time out of range ({m.mtime})") from None
    finally:
        os.close(fd)


def extract_tar(
    fileobj: BinaryIO,
    target: Path,
    *,
    source: str,
    limits: ExtractionLimits = DEFAULT_LIMITS,
    on_block: Callable[[int], None] | None = None,
) -> list[str]:
    """Extract a tar into the new folder ``target``, refusing hostile members (I6; the module).

    Args:
        fileobj: the tar (seekable or a stream), read once.
        target: a folder that must not exist yet; its parent must. Created here (mode 0700).
        source: the artifact for messages, ``"location:key"``.
        limits: member count and byte limits.
        on_block: called with the byte count of every block written (progress, lease checks).

    Returns:
        the extracted member names, in archive order.

    Raises:
        UnsafePathError: a member is refused (naming ``source`` and the member); permanent.
        VerificationError: not a tar, or a damaged one.
        FileExistsError: ``target`` exists already (it is left alone).
        OSError: the file system failed.
        Any error of ``on_block`` (e.g. :class:`~packhorse.errors.LeaseLostError`).
        On every error ``target`` has been removed.
    """
    parent_fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.mkdir(target.name, 0o700, dir_fd=parent_fd)
        try:
            root_fd = os.open(target.name, _DIR_FLAGS, dir_fd=parent_fd)
            try:
                st = os.fstat(root_fd)
                if not stat.S_ISDIR(st.st_mode):  # pragma: no cover - O_DIRECTORY guarantees it
                    raise UnsafePathError(f"{target}: not a folder", path=str(target), step="extract")
                folders = _Folders(root_fd, source)
                names: list[str] = []
                try:
                    for m in iter_members(fileobj, source=source, limits=limits,
                                          casefold=_case_insensitive(parent_fd, target.name),
                                          normalization=_normalizes(root_fd)):
                        if m.is_dir:
                            folders.fd(m.parts, m.name)
                        else:
                            _write_member(folders.fd(m.parts[:-1], m.name), m, source, on_block)
                        names.append(m.name)
                except tarfile.TarError as e:
                    raise VerificationError(f"{source}: damaged tar: {e}", step="extract") from None
                finally:
                    folders.close()
            finally:
                os.close(root_fd)
        except BaseException:
            remove_target(parent_fd, target.name)
            raise
        return names
    finally:
        os.close(parent_fd)


def remove_target(parent_fd: int, name: str) -> None:
    """Remove folder ``name`` of the folder open as ``parent_fd`` and all it holds, following
    no link, at any depth (:func:`packhorse.storage.disk.remove_tree`: descriptor-based and
    iterative; a member thousands of folders deep leaves nothing behind).

    Raises:
        OSError: something could not be removed (other than already gone).
    """
    remove_tree(parent_fd, name)
