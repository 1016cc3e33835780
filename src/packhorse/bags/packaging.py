"""BagIt 1.0 bags in PAX tars: deterministic writing, verified streaming reading, safe extraction.

A package tar holds one bag under a top folder ``<bag_dir>/``::

    <bag_dir>/bagit.txt
    <bag_dir>/bag-info.txt            Bagging-Date, External-Identifier, Payload-Oxum, metadata
    <bag_dir>/manifest-sha256.txt     one line per payload file
    <bag_dir>/tagmanifest-sha256.txt  sha256 of the three tag files above
    <bag_dir>/data/...                payload files, sorted by UTF-8 path

Determinism (DESIGN.md I3): the same payload and metadata give byte-identical tars — fixed
member order, the payload files' recorded mtimes, a fixed mtime for tag files, owner and group
0 with empty names, mode 0644, PAX format. A rebuild after a crash therefore publishes the
same bytes and meets "already there".

The manifest is written *before* the payload from the sha256 recorded at the source; every
payload file is hashed while it is streamed into the tar and a mismatch aborts the build with
:class:`~packhorse.errors.SourceChangedError` (I4).

Reading (:func:`read_bag_tar`, :func:`read_bag_bytes`) streams a bag tar once through the RFC 8493
validator of :mod:`packhorse.bags.validation` (any manifest algorithm, any member order), refusing
unsafe members (I6), and returns every payload file's sha256. Its members come from the one
tar reader, :func:`packhorse.bags.extraction.members_of` (links, devices, duplicates, ``..``,
names merged by normalization and members beyond the ``[extraction]`` limits are refused).
Extraction into a folder is :func:`packhorse.bags.extraction.extract_tar`.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tarfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

from packhorse.bags.extraction import DEFAULT_LIMITS, ExtractionLimits
from packhorse.bags.validation import UNSAFE_CODES, BagReport, validate_folder, validate_tar
from packhorse.bags.validation import decode_manifest_path as _decode
from packhorse.errors import SourceChangedError, SourceMissingError, UnsafePathError, VerificationError
from packhorse.names import quoted

BAGIT_VERSION = "1.0"
SOFTWARE_AGENT = "packhorse"  # no version: rebuilt tars must stay byte-identical across upgrades (I3)
TAG_FILES = ("bagit.txt", "bag-info.txt", "manifest-sha256.txt")
#: Members of a bag tar besides its payload files: the tag files and ``tagmanifest-sha256.txt``
#: (the tar holds no folder members). A package of N files is a tar of N + TAG_MEMBERS members,
#: which every reader refuses beyond ``[extraction] max_members``.
TAG_MEMBERS = len(TAG_FILES) + 1
COPY_BUFSIZE = 1 << 20


class _Writable(Protocol):
    def write(self, data: bytes) -> int: ...


@dataclass(frozen=True)
class PayloadFile:
    """One payload file of a bag.

    Attributes:
        path: path under ``data/`` (POSIX separators, UTF-8).
        size: bytes, as registered.
        sha256: hex digest recorded at the source.
        mtime: modification time, integer seconds since the epoch (UTC).
        open: opens the source bytes for reading.
    """

    path: str
    size: int
    sha256: str
    mtime: int
    open: Callable[[], BinaryIO] = field(compare=False, repr=False)


_ESCAPE = re.compile(r"%(0A|0D|25)", re.IGNORECASE)


def encode_manifest_path(path: str) -> str:
    """Encode a payload path for a manifest line.

    CR and LF are always percent-encoded. A ``%`` is encoded as ``%25`` only when the path
    holds a sequence a reader would decode (``%0A``, ``%0D``, ``%25``, any case): RFC 8493
    §2.1.3 asks for every ``%`` to be encoded, but the reference ``bagit`` library decodes
    only CR/LF (LibraryOfCongress/bagit-python#157), so a plain ``50%.txt`` stays as it is and
    validates with both; only names that would otherwise be ambiguous follow the RFC strictly.
    """
    if _ESCAPE.search(path):
        path = path.replace("%", "%25")
    return path.replace("\n", "%0A").replace("\r", "%0D")


def bag_info_value(value: str) -> str:
    """A ``bag-info.txt`` value as written: ``value`` itself, or — when it holds CR or LF —
    encoded as a manifest path is (:func:`encode_manifest_path`).

    A tag value cannot hold a line break (RFC 8493 §2.2.2), but an observation unit's folder,
    hence a package's name and group, may (instruments name folders as they like; DESIGN.md I6
    safe input: handled, not refused). Every other value is written as it is, so bags built
    before stay byte-identical (I3)."""
    return encode_manifest_path(value) if ("\n" in value or "\r" in value) else value


def decode_manifest_path(path: str) -> str:
    """Inverse of :func:`encode_manifest_path` (one pass: ``%0A``, ``%0D``, ``%25``)."""
    return _decode(path)


def _sort_key(path: str) -> bytes:
    return path.encode("utf-8")


def bag_tag_files(
    files: Sequence[PayloadFile], *, bag_info: Mapping[str, str], bagging_date: str, external_identifier: str
) -> list[tuple[str, bytes]]:
    """Return the tag files ``[(name, bytes)]`` of a bag over ``files``, in tar order."""
    ordered = sorted(files, key=lambda f: _sort_key(f.path))
    oxum = f"{sum(f.size for f in ordered)}.{len(ordered)}"
    bagit_txt = f"BagIt-Version: {BAGIT_VERSION}\nTag-File-Character-Encoding: UTF-8\n".encode()
    info_lines = [
        ("Bag-Software-Agent", SOFTWARE_AGENT),
        ("Bagging-Date", bagging_date),
        ("External-Identifier", external_identifier),
        ("Payload-Oxum", oxum),
        *sorted((k, v) for k, v in bag_info.items()),
    ]
    info_lines = [(k, bag_info_value(v)) for k, v in info_lines]
    for k, _ in info_lines:
        if "\n" in k or "\r" in k or ":" in k:
            raise ValueError(f"bag-info label {k!r} may not contain a line break or a colon")
    info_txt = "".join(f"{k}: {v}\n" for k, v in info_lines).encode("utf-8")
    manifest = "".join(f"{f.sha256}  data/{encode_manifest_path(f.path)}\n" for f in ordered).encode("utf-8")
    tags = [("bagit.txt", bagit_txt), ("bag-info.txt", info_txt), ("manifest-sha256.txt", manifest)]
    tagmanifest = "".join(f"{hashlib.sha256(b).hexdigest()}  {n}\n" for n, b in tags).encode()
    return [*tags, ("tagmanifest-sha256.txt", tagmanifest)]


def _tarinfo(name: str, size: int, mtime: int) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size = size
    ti.mtime = int(mtime)
    ti.mode = 0o644
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.type = tarfile.REGTYPE
    return ti


#: ``tarfile``'s PAX writer's fixed fields for every member packhorse writes (mode 0644, owner
#: and group 0 with empty names, a regular file; see :func:`_tarinfo`).
_MODE_FIELD, _ID_FIELD = b"0000644\0", b"0000000\0"
_MAX_OCTAL_11 = 8 ** 11  # size and mtime fields: 11 octal digits


class _TarWriter:
    """Writes the members of a bag tar to ``out`` byte for byte as :mod:`tarfile` in
    ``PAX_FORMAT`` writes them (determinism across versions, I3: a package built before this
    writer existed is rebuilt to the same bytes and meets "already there").

    A member whose name is ASCII and at most 100 bytes, whose size and mtime fit 11 octal
    digits, gets its plain ustar header here (what ``tarfile`` writes for it: no extended
    header); any other member's header is :mod:`tarfile`'s own (``TarInfo.tobuf``: a PAX
    extended header first). A small member goes to ``out`` in one ``write`` (header, data and
    padding): a write through the storage layers and the hash costs more than a small file's
    bytes. ``tests/unit/test_packaging.py`` compares the output with ``tarfile``'s.
    """

    #: members up to this size (bytes) are written in one piece
    ONE_WRITE_BYTES = 64 << 10

    def __init__(self, out: _Writable) -> None:
        self._out = out
        self.offset = 0

    @staticmethod
    def header(name: str, size: int, mtime: int) -> bytes:
        """The header block(s) of member ``name`` (a regular file of ``size`` bytes)."""
        try:
            encoded = name.encode("ascii")
        except UnicodeEncodeError:
            encoded = b""
        if not encoded or len(encoded) > 100 or not (0 <= size < _MAX_OCTAL_11) or not (0 <= mtime < _MAX_OCTAL_11):
            return _tarinfo(name, size, mtime).tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")
        buf = bytearray(512)
        buf[0:len(encoded)] = encoded
        buf[100:124] = _MODE_FIELD + _ID_FIELD + _ID_FIELD
        buf[124:156] = b"%011o\0%011o\0        " % (size, mtime)
        buf[156] = 0x30  # REGTYPE "0"; linkname, uname, gname, devices, prefix stay NUL
        buf[257:265] = tarfile.POSIX_MAGIC
        buf[148:155] = b"%06o\0" % sum(buf)  # the checksum field counted as spaces, as tar does
        return bytes(buf)

    def _emit(self, data: bytes | bytearray | memoryview) -> None:
        self._out.write(data)
        self.offset += len(data)

    def add_bytes(self, name: str, data: bytes, mtime: int) -> None:
        """Add member ``name`` holding ``data``."""
        pad = -len(data) % 512
        self._emit(b"".join((self.header(name, len(data), mtime), data, bytes(pad))))

    def add_file(self, name: str, size: int, mtime: int, src: BinaryIO, hasher: hashlib._Hash) -> None:
        """Add member ``name``: exactly ``size`` bytes read from ``src``, each also fed to ``hasher``.

        Raises:
            EOFError: ``src`` ends before ``size`` bytes.
        """
        head = self.header(name, size, mtime)
        pad = -size % 512
        if size <= self.ONE_WRITE_BYTES:
            data = src.read(size) if size else b""
            while len(data) < size:  # a short read is not the end
                more = src.read(size - len(data))
                if not more:
                    raise EOFError(f"{len(data)} of {size} bytes")
                data += more
            hasher.update(data)
            self._emit(b"".join((head, data, bytes(pad))))
            return
        self._emit(head)
        left = size
        while left:
            chunk = src.read(min(COPY_BUFSIZE, left))
            if not chunk:
                raise EOFError(f"{size - left} of {size} bytes")
            hasher.update(chunk)
            self._emit(chunk)
            left -= len(chunk)
        if pad:
            self._emit(bytes(pad))

    def close(self) -> None:
        """End the archive: two zero blocks, then zeros to a whole 10,240-byte record (as
        ``tarfile`` and ``tar -b20`` do)."""
        end = self.offset + 1024
        self._emit(bytes(1024 + (-end % tarfile.RECORDSIZE)))


def write_bag_tar(
    out: _Writable,
    *,
    bag_dir: str,
    files: Sequence[PayloadFile],
    bag_info: Mapping[str, str],
    bagging_date: str,
    external_identifier: str,
    tag_mtime: int,
    on_bytes: Callable[[int], None] | None = None,
) -> None:
    """Write a deterministic BagIt bag as a PAX tar to ``out``.

    Args:
        out: sink with ``write(bytes)`` (e.g. a :class:`~packhorse.storage.PendingWrite`).
        bag_dir: the bag's top folder name inside the tar (no ``/``).
        files: the payload.
        bag_info: extra ``bag-info.txt`` fields (metadata), written sorted by key.
        bagging_date: ``YYYY-MM-DD``, fixed when the package was created.
        external_identifier: the package name.
        tag_mtime: mtime (s) given to the tag files.
        on_bytes: called with the number of payload bytes after each file (progress).

    Raises:
        SourceMissingError: a payload file is gone.
        SourceChangedError: a payload file's size or sha256 differs from what was registered.
    """
    if not bag_dir or "/" in bag_dir or bag_dir in (".", ".."):
        raise UnsafePathError(f"bad bag folder name {quoted(bag_dir)}")
    tar = _TarWriter(out)
    for name, data in bag_tag_files(
        files, bag_info=bag_info, bagging_date=bagging_date, external_identifier=external_identifier
    ):
        tar.add_bytes(f"{bag_dir}/{name}", data, int(tag_mtime))
    for pf in sorted(files, key=lambda f: _sort_key(f.path)):
        try:
            src = pf.open()
        except (FileNotFoundError, NotADirectoryError):
            raise SourceMissingError(f"source file {pf.path!r} is gone", side="source", path=pf.path, step="package") from None
        with src:
            try:
                actual = os.fstat(src.fileno()).st_size
            except (AttributeError, OSError, ValueError):  # not an OS file (BytesIO, an HTTP body)
                actual = pf.size
            if actual != pf.size:
                raise SourceChangedError(
                    f"source file {pf.path!r} is {actual} bytes, registered with {pf.size}",
                    side="source", path=pf.path, step="package",
                    diagnosis="the file was modified after it was registered",
                )
            hasher = hashlib.sha256()
            try:
                tar.add_file(f"{bag_dir}/data/{pf.path}", pf.size, int(pf.mtime), src, hasher)
            except EOFError:
                raise SourceChangedError(f"source file {pf.path!r} shrank while it was packaged",
                                         side="source", path=pf.path, step="package") from None
            if hasher.hexdigest() != pf.sha256:
                raise SourceChangedError(
                    f"source file {pf.path!r} has sha256 {hasher.hexdigest()}, registered {pf.sha256}",
                    side="source", path=pf.path, step="package",
                    diagnosis="the file's content changed after it was registered (or the disk corrupted it)",
                )
        if on_bytes:
            on_bytes(pf.size)
    tar.close()


# ----------------------------------------------------------------------------------- reading


@dataclass
class BagContents:
    """What :func:`read_bag_tar` found: ``bag_dir``, ``bag_info`` (label → first value) and
    payload ``files`` (path under ``data/`` → sha256)."""

    bag_dir: str
    bag_info: dict[str, str]
    files: dict[str, str]


def raise_for_problems(report: BagReport, *, step: str, side: str | None = None) -> None:
    """Raise for a bag report with problems, or valid but incomplete (payload files still listed
    in fetch.txt: packhorse's readers need every file): :class:`UnsafePathError` when one of
    the problems is an unsafe entry (I6), else :class:`VerificationError`; the message is the first such problem's,
    followed by how many more there are and their codes. ``path`` is that problem's path
    relative to the bag root. Returns when the report is valid."""
    if report.valid and report.complete:
        return
    if report.valid:  # valid but incomplete: packhorse needs every payload file, and does not fetch
        raise VerificationError(f"{report.bag}: the bag is incomplete: {len(report.fetch_pending)} payload file(s) "
                                f"listed in fetch.txt are not in it (first {report.fetch_pending[0]!r})",
                                path=report.fetch_pending[0], step=step, **({"side": side} if side else {}))
    unsafe = [p for p in report.problems if p.code in UNSAFE_CODES]
    lead = (unsafe or report.problems)[0]
    rest = [p for p in report.problems if p is not lead]
    message = lead.message
    if rest or report.problems_omitted:
        codes = sorted({p.code for p in rest} | set(report.omitted_codes))
        message += f" (and {len(rest) + report.problems_omitted} more problem(s): {', '.join(codes)})"
    extra = {"side": side} if side else {}
    if unsafe:
        raise UnsafePathError(message, path=lead.path, step=step, **extra)
    raise VerificationError(message, path=lead.path or None, step=step, **extra)


def _contents(report: BagReport, bag_dir: str) -> BagContents:
    return BagContents(
        bag_dir=bag_dir,
        bag_info={k: v[0] for k, v in report.bag_info.items()},
        files={p[len("data/"):]: e.digests["sha256"] for p, e in report.payload.items()},
    )


def read_bag_bytes(data: bytes | bytearray | memoryview, *, source: str,
                   limits: ExtractionLimits = DEFAULT_LIMITS) -> BagContents:
    """:func:`read_bag_tar` of a bag tar held in memory (a raw data package taken out of a
    bundle): each payload file is hashed straight from ``data``, without a file object and a
    copy per member, which is most of the cost for bags of many small files. Same checks,
    same errors."""
    view = memoryview(data)
    report, bag_dir = validate_tar(io.BytesIO(view), bag=source, required_algorithms=("sha256",),
                                   payload_bytes=view, limits=limits, stop_at_refused=True)
    raise_for_problems(report, step="unpack")
    return _contents(report, bag_dir)


def read_bag_tar(
    fileobj: BinaryIO,
    *,
    source: str,
    on_payload: Callable[[str, int, BinaryIO], str] | None = None,
    limits: ExtractionLimits = DEFAULT_LIMITS,
) -> BagContents:
    """Stream through a bag tar once, validating it (RFC 8493, :mod:`packhorse.bags.validation`);
    optionally hand each payload file on.

    Args:
        fileobj: the tar, read sequentially.
        source: a name for messages (e.g. ``"cologne-buffer:bundles/x.tar"``).
        on_payload: called as ``on_payload(path, size, stream)`` for every payload file listed
            in the manifests (or met before them); it must read the whole stream and return the
            sha256 (hex) of what it read, which is then checked against the manifest (so the
            caller's own hash is not done twice). Without it, the payload is hashed here.
        limits: member count and byte limits (``[extraction]`` settings).

    Returns:
        the bag's info and the sha256 of every payload file (hashed whatever the manifests'
        algorithms).

    Raises:
        UnsafePathError: a member is refused by the tar reader (:mod:`packhorse.bags.extraction`)
            or lies outside the bag folder; raised at that member, so no later member reaches
            ``on_payload``.
        VerificationError: any other problem of :data:`~packhorse.bags.validation.PROBLEM_CODES`
            (missing tag files, a payload file not in a manifest or with another checksum,
            manifest entries without a file, a wrong Payload-Oxum or tag manifest...); the
            message names the first and counts the others.
    """
    report, bag_dir = validate_tar(fileobj, bag=source, required_algorithms=("sha256",), on_payload=on_payload,
                                   limits=limits, stop_at_refused=True)
    raise_for_problems(report, step="unpack")
    return _contents(report, bag_dir)


def verify_bag_archive(fileobj: BinaryIO, *, source: str, limits: ExtractionLimits = DEFAULT_LIMITS) -> BagContents:
    """Check a raw data package tar read as a stream, writing nothing: every member through
    the tar reader, the bag through the validator (:func:`read_bag_tar`).

    ``staging``'s check pass, before anything is extracted (DESIGN.md I6). Same errors as
    :func:`read_bag_tar`.
    """
    return read_bag_tar(fileobj, source=source, limits=limits)


class TeeReader:
    """A reader that copies every byte it reads to ``sink`` (which may hash it) and counts them."""

    def __init__(self, src: BinaryIO, sink: _Writable) -> None:
        self._src = src
        self._sink = sink
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self._src.read(n)
        if data:
            self._sink.write(data)
            self.size += len(data)
        return data

    def drain(self) -> None:
        """Read (and so copy) whatever is left of the source."""
        while self.read(COPY_BUFSIZE):
            pass


def iter_files(root: Path) -> Iterator[Path]:
    """Yield every regular file under ``root`` (symlinks not followed), each folder's files
    sorted, folders depth first in sorted order. Iterative (a stack of folders), so a tree of
    any depth is listed (Python 3.11's ``os.walk`` recurses once per level)."""
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        subfolders = []
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                subfolders.append(folder / e.name)
            elif e.is_file(follow_symlinks=False):
                yield folder / e.name
        stack.extend(reversed(subfolders))


def verify_bag_folder(bag: Path, *, source: str, limits: ExtractionLimits = DEFAULT_LIMITS) -> dict[str, str]:
    """Validate the bag folder ``bag`` to RFC 8493 (:func:`~packhorse.bags.validation.validate_folder`:
    every manifest, the tag manifests, Payload-Oxum, no symlinks). Returns ``{payload path under
    data/: sha256}``. ``limits.max_members`` is the bag's budget of manifest entries, as for the
    tar it was extracted from (``manifest-too-large`` beyond).

    Raises:
        VerificationError: the bag is not valid (a file missing, extra, with other bytes...),
            naming the first problem and counting the others.
        UnsafePathError: the folder holds a symlink or a special file.
    """
    report = validate_folder(bag, bag=source, required_algorithms=("sha256",),
                             max_manifest_entries=limits.max_members)
    raise_for_problems(report, step="staging", side="destination")
    return {p[len("data/"):]: e.digests["sha256"] for p, e in report.payload.items()}
