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

Reading (:func:`read_bag_tar`) streams a bag tar once through the one tar reader,
:func:`packhorse.extraction.iter_members` (which refuses links, devices, duplicates, ``..``
and more: I6), verifying every payload file against the manifest; :func:`check_bag` then
checks the tag files and the Payload-Oxum. Extraction into a folder is
:func:`packhorse.extraction.extract_tar`.
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

from .digest import sha256_stream
from .errors import SourceChangedError, SourceMissingError, UnsafePathError, VerificationError
from .extraction import DEFAULT_LIMITS, ExtractionLimits, iter_members

BAGIT_VERSION = "1.0"
SOFTWARE_AGENT = "packhorse"  # no version: rebuilt tars must stay byte-identical across upgrades (I3)
TAG_FILES = ("bagit.txt", "bag-info.txt", "manifest-sha256.txt")
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
_UNESCAPE = {"0a": "\n", "0d": "\r", "25": "%"}


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


def decode_manifest_path(path: str) -> str:
    """Inverse of :func:`encode_manifest_path` (one pass: ``%0A``, ``%0D``, ``%25``)."""
    return _ESCAPE.sub(lambda m: _UNESCAPE[m.group(1).lower()], path)


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
    for k, v in info_lines:
        if "\n" in k or "\n" in v or ":" in k:
            raise ValueError(f"bag-info value for {k!r} may not contain a newline")
    info_txt = "".join(f"{k}: {v}\n" for k, v in info_lines).encode("utf-8")
    manifest = "".join(f"{f.sha256}  data/{encode_manifest_path(f.path)}\n" for f in ordered).encode("utf-8")
    tags = [("bagit.txt", bagit_txt), ("bag-info.txt", info_txt), ("manifest-sha256.txt", manifest)]
    tagmanifest = "".join(f"{hashlib.sha256(b).hexdigest()}  {n}\n" for n, b in tags).encode()
    return [*tags, ("tagmanifest-sha256.txt", tagmanifest)]


class _HashingReader:
    """Wraps a source file: hashes what is read and counts bytes."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self.hash = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self.hash.update(data)
        self.size += len(data)
        return data


class _TellingWriter:
    """Gives a write-only sink the ``tell()`` that :mod:`tarfile` asks for."""

    def __init__(self, out: _Writable) -> None:
        self._out = out
        self.pos = 0

    def write(self, data: bytes) -> int:
        self._out.write(data)
        self.pos += len(data)
        return len(data)

    def tell(self) -> int:
        return self.pos


def _tarinfo(name: str, size: int, mtime: int) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size = size
    ti.mtime = int(mtime)
    ti.mode = 0o644
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.type = tarfile.REGTYPE
    return ti


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
        raise UnsafePathError(f"bad bag folder name {bag_dir!r}")
    sink = _TellingWriter(out)
    tar = tarfile.open(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT, copybufsize=COPY_BUFSIZE)  # type: ignore[call-overload]
    try:
        for name, data in bag_tag_files(
            files, bag_info=bag_info, bagging_date=bagging_date, external_identifier=external_identifier
        ):
            tar.addfile(_tarinfo(f"{bag_dir}/{name}", len(data), tag_mtime), io.BytesIO(data))
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
                reader = _HashingReader(src)
                try:
                    tar.addfile(_tarinfo(f"{bag_dir}/data/{pf.path}", pf.size, pf.mtime), reader)  # type: ignore[arg-type]
                except OSError as e:
                    if "unexpected end of data" in str(e):
                        raise SourceChangedError(f"source file {pf.path!r} shrank while it was packaged",
                                                 side="source", path=pf.path, step="package") from None
                    raise
                if reader.hash.hexdigest() != pf.sha256:
                    raise SourceChangedError(
                        f"source file {pf.path!r} has sha256 {reader.hash.hexdigest()}, registered {pf.sha256}",
                        side="source", path=pf.path, step="package",
                        diagnosis="the file's content changed after it was registered (or the disk corrupted it)",
                    )
            if on_bytes:
                on_bytes(pf.size)
    finally:
        tar.close()


# ----------------------------------------------------------------------------------- reading


@dataclass
class BagContents:
    """What :func:`read_bag_tar` found: ``bag_dir``, ``bag_info`` and payload ``files``
    (path under ``data/`` → sha256)."""

    bag_dir: str
    bag_info: dict[str, str]
    files: dict[str, str]


def _tag_lines(data: bytes) -> list[str]:
    """Lines of a tag file: ends are LF, CR or CRLF only (BagIt 1.0 §2.1.3); not
    :meth:`str.splitlines`, which also splits at U+0085, U+2028, form feed... that may occur
    in payload file names."""
    return re.split(r"\r\n|\r|\n", data.decode("utf-8"))


def _parse_manifest(data: bytes, source: str, *, strip: str = "") -> dict[str, str]:
    """Parse ``<sha256>  <path>`` lines into ``{path: sha256}``, removing prefix ``strip``."""
    out: dict[str, str] = {}
    for line in _tag_lines(data):
        if not line.strip():
            continue
        digest, _, path = line.partition(" ")
        path = path.lstrip(" ")
        if not path or len(digest) != 64:
            raise VerificationError(f"{source}: malformed manifest line {line!r}", step="unpack")
        path = decode_manifest_path(path)
        if strip:
            if not path.startswith(strip):
                raise VerificationError(f"{source}: manifest path {path!r} is not under {strip!r}", step="unpack")
            path = path[len(strip):]
        out[path] = digest.lower()
    return out


def _parse_bag_info(data: bytes) -> dict[str, str]:
    info: dict[str, str] = {}
    for line in _tag_lines(data):
        if ":" in line and not line[:1].isspace():
            k, _, v = line.partition(":")
            info[k.strip()] = v.strip()
    return info


def read_bag_bytes(data: bytes | bytearray | memoryview, *, source: str,
                   limits: ExtractionLimits = DEFAULT_LIMITS) -> BagContents:
    """:func:`read_bag_tar` of a bag tar held in memory (a raw data package taken out of a
    bundle): each payload file is hashed straight from ``data``, without a file object and a
    copy per member, which is most of the cost for bags of many small files (docs/benchmarks.md
    benchmark (b)). Same reader, same checks, same errors."""
    view = memoryview(data)
    return read_bag_tar(io.BytesIO(view), source=source, limits=limits, _payload_bytes=view)


def read_bag_tar(
    fileobj: BinaryIO,
    *,
    source: str,
    on_payload: Callable[[str, int, BinaryIO], str] | None = None,
    limits: ExtractionLimits = DEFAULT_LIMITS,
    _payload_bytes: memoryview | None = None,
) -> BagContents:
    """Stream through a bag tar once, verifying it; optionally hand each payload file on.

    Members come from :func:`packhorse.extraction.iter_members`, the one tar reader, with all
    its refusal rules (links, devices, duplicates, ``..``, limits: I6); the bag itself is
    checked by :func:`check_bag`.

    Args:
        fileobj: the tar, read sequentially.
        source: a name for messages (e.g. ``"cologne-buffer:bundles/x.tar"``).
        on_payload: called as ``on_payload(path, size, stream)`` for every payload file; it
            must read the whole stream and return the sha256 (hex) of what it read, which is
            then checked against the manifest (so the caller's own hash is not done twice).
            Without it, the payload is read and hashed here.
        limits: member count and byte limits (``[extraction]`` settings).

    Returns:
        the bag's info and its manifest.

    Raises:
        UnsafePathError: a member is refused by the reader, or lies outside the bag folder.
        VerificationError: missing tag files, a payload file not in the manifest or with a
            different sha256, manifest entries without a file, a wrong Payload-Oxum or a
            wrong tag manifest; not a tar or a damaged one.
    """
    tags: dict[str, bytes] = {}
    manifest: dict[str, str] | None = None
    seen: dict[str, str] = {}
    total = 0
    bag_dir: str | None = None
    try:
        for member in iter_members(fileobj, source=source, limits=limits, step="unpack"):
            top, _, rest = member.name.partition("/")
            if bag_dir is None:
                bag_dir = top
            if top != bag_dir:
                raise UnsafePathError(f"{source}: member {member.name!r} is outside the bag folder {bag_dir!r}",
                                      path=member.name, step="unpack")
            if member.is_dir:
                continue
            assert member.data is not None
            if not rest.startswith("data/"):
                tags[rest] = member.data.read()
                continue
            path = rest[len("data/"):]
            if manifest is None:
                if "manifest-sha256.txt" not in tags:
                    raise VerificationError(f"{source}: payload before manifest-sha256.txt", step="unpack")
                manifest = _parse_manifest(tags["manifest-sha256.txt"], source, strip="data/")
            if path not in manifest:
                raise VerificationError(f"{source}: payload file {path!r} is not in the manifest",
                                        path=path, step="unpack")
            if _payload_bytes is not None:
                end = member.offset_data + member.size
                if end > len(_payload_bytes):
                    raise VerificationError(f"{source}: damaged tar: {path!r} ends after the archive",
                                            path=path, step="unpack")
                digest = hashlib.sha256(_payload_bytes[member.offset_data:end]).hexdigest()
            elif on_payload is not None:
                digest = on_payload(path, member.size, member.data)
                if member.data.read(1):
                    raise VerificationError(f"{source}: payload file {path!r} was not read to its end",
                                            path=path, step="unpack")
            else:
                digest = sha256_stream(member.data)
            if digest != manifest[path]:
                raise VerificationError(
                    f"{source}: payload file {path!r} has sha256 {digest}, manifest says {manifest[path]}",
                    path=path, step="unpack",
                )
            seen[path] = digest
            total += member.size
    except tarfile.TarError as e:
        raise VerificationError(f"{source}: damaged tar: {e}", step="unpack") from None
    info = check_bag(tags, seen, total, source=source)
    return BagContents(bag_dir=bag_dir or "", bag_info=info, files=seen)


def verify_bag_archive(fileobj: BinaryIO, *, source: str, limits: ExtractionLimits = DEFAULT_LIMITS) -> BagContents:
    """Check a raw data package tar read as a stream, writing nothing: every member through
    the tar reader, every payload file against the manifest, then :func:`check_bag`.

    Used by ``staging``'s check pass (before anything is extracted); the entry point a full
    RFC 8493 bag validator replaces. Same errors as :func:`read_bag_tar`.
    """
    return read_bag_tar(fileobj, source=source, limits=limits)


def check_bag(tags: dict[str, bytes], payload: dict[str, str], payload_bytes: int, *, source: str) -> dict[str, str]:
    """Check a bag read from a tar stream: its tag files and its payload as read.

    This is the one place bag rules are applied to a stream (``unpack`` and ``staging``'s
    check pass); a full RFC 8493 validator can take its place with the same contract.

    Args:
        tags: tag file name (relative to the bag folder) → its bytes.
        payload: payload path under ``data/`` → the sha256 of what was read (each already
            checked against its manifest line).
        payload_bytes: total bytes of the payload read.
        source: the artifact, for messages.

    Returns:
        the ``bag-info.txt`` fields.

    Raises:
        VerificationError: a missing tag file, manifest entries without a payload file, a
            tag file not matching ``tagmanifest-sha256.txt``, a wrong Payload-Oxum.
    """
    for name in ("bagit.txt", "bag-info.txt", "manifest-sha256.txt", "tagmanifest-sha256.txt"):
        if name not in tags:
            raise VerificationError(f"{source}: the bag has no {name}", step="unpack")
    manifest = _parse_manifest(tags["manifest-sha256.txt"], source, strip="data/")
    missing = sorted(set(manifest) - set(payload))
    if missing:
        raise VerificationError(f"{source}: {len(missing)} manifest entries have no payload file, e.g. {missing[0]!r}",
                                step="unpack")
    tagmanifest = _parse_manifest(tags["tagmanifest-sha256.txt"], source)
    for name, digest in tagmanifest.items():
        if name not in tags or hashlib.sha256(tags[name]).hexdigest() != digest:
            raise VerificationError(f"{source}: tag file {name!r} does not match tagmanifest-sha256.txt", step="unpack")
    info = _parse_bag_info(tags["bag-info.txt"])
    oxum = info.get("Payload-Oxum")
    if oxum != f"{payload_bytes}.{len(payload)}":
        raise VerificationError(f"{source}: Payload-Oxum {oxum!r} but payload is {payload_bytes}.{len(payload)}",
                                step="unpack")
    return info


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
    """Yield every regular file under ``root`` (symlinks not followed), sorted."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if p.is_file() and not p.is_symlink():
                yield p
