"""Bag validation to RFC 8493 (BagIt 1.0), and BagIt 0.97 for reading: one validator, fed in any order.

:class:`BagValidator` is a streaming core. A front end hands it every entry of a bag in whatever
order the container has them — :meth:`~BagValidator.add` with a path relative to the bag root, a
size in bytes and a readable stream — and :meth:`~BagValidator.finish` returns a
:class:`BagReport` of **every** problem found (never only the first: the first
:data:`MAX_LISTED_PROBLEMS` listed, the others counted). Two front ends:
:func:`validate_folder` (a bag folder; symlinks are never followed, a symlink is a problem) and
:func:`validate_tar` (a bag tar holding one top folder, read in one pass).

What is checked, and the RFC 8493 clause that asks for it (:data:`PROBLEM_CODES` lists the codes):

- ``bagit.txt`` (§2.1.1) is exactly two lines, ``BagIt-Version: M.N`` then
  ``Tag-File-Character-Encoding: ENCODING``, each ending in LF, CR or CRLF, one colon and one
  space, no byte-order mark; versions 1.0 and 0.97 are read (0.93-0.96 as 0.97, a warning).
- a ``data/`` payload directory (§2.1.2) and at least one payload manifest (§2.1.3).
- every manifest and tag manifest algorithm the RFC names (§2.4: md5, sha1, sha256, sha512) and
  those the reference library reads too (sha224, sha384), any
  number of manifests at once; every checksum of every manifest is verified (§3 "valid").
- manifest lines ``<hex checksum><one or more spaces or tabs><path>`` (§2.1.3), the checksum's
  length fitting the algorithm; ``%0A``, ``%0D`` and ``%25`` (any case) are decoded (§2.1.3);
  a ``%`` followed by anything else is read literally (it cannot be misread, and the reference
  library writes it so). A path is taken to the end of the line, trailing spaces included.
- a path listed twice in one manifest, a payload-manifest path outside ``data/``, a tag-manifest
  path inside it, a path with ``..``, an empty or ``.`` component or a leading ``/`` (§2.1.3,
  §2.2.1).
- completeness (§3): every listed file exists; in a 1.0 bag every payload file is in every payload
  manifest; in a 0.97 bag (§3 of RFC 8493 notes the older rule) in at least one.
- ``bag-info.txt`` is optional (§2.2.2); when present every line is ``Label: value`` (or a
  continuation line starting with a space or tab) and each ``Payload-Oxum`` is
  ``octets.streamcount`` and matches the payload.
- ``fetch.txt`` (§2.2.3): ``URL LENGTH FILEPATH`` lines; a payload file it lists that is not in
  the bag makes the bag *valid but incomplete* (:attr:`BagReport.fetch_pending`), not invalid:
  packhorse does not fetch, and its own readers refuse such a bag
  (:func:`packhorse.bags.packaging.raise_for_problems`).

Departures from RFC 8493 that the reference library accepts are *warnings*
(:data:`WARNING_CODES`: the last line of ``bagit.txt`` without its end, whitespace before a
``bag-info.txt`` colon, a ``./`` before a manifest path, BagIt 0.93-0.96): listed in the report,
the bag stays valid, so a bag another tool made is not refused for them.

Hashing strategy (one pass): a payload file is hashed with the algorithms of the payload
manifests already seen (their names are in the file names), plus ``required_algorithms`` (what
the caller itself needs, e.g. packhorse's own sha256). A payload file met before *any* payload
manifest is hashed with sha256 and sha512 (:data:`EARLY_ALGORITHMS`, RFC 8493 §2.4's two and
what the reference library writes by default). Nothing is spooled. If a manifest that comes later
needs an algorithm a file was not hashed with, :meth:`BagValidator.rehash_needed` names it; a
front end that can read the entry again (a folder, a seekable tar) does so in a second pass, a
stream cannot, and the file is reported ``not-verified``. Bags whose tag files come first — as
packhorse writes them — are always validated in one pass, hashing only what their manifests
name. ``bagit.txt`` is held in memory (up to :data:`MAX_TAG_FILE_BYTES`); other tag files that
are not special are only hashed.

Memory (docs/bags.md, "One pass, bounded memory"): manifests, tag manifests, ``fetch.txt`` and
``bag-info.txt`` (each up to :data:`MAX_TAG_FILE_BYTES`) are parsed line by line as they are
read, never held whole, and hashed as they go (a tag manifest may list them); per manifest entry
the path and the checksum as bytes are kept. What they hold for one bag is at most
``max_manifest_entries`` entries (manifest and fetch.txt lines; ``[extraction] max_members``)
and :data:`MAX_MANIFEST_MEMORY_BYTES` together; the file that goes beyond is a
``manifest-too-large`` (``tag-file-too-large``) problem and what it held is dropped. A tag file
read before ``bagit.txt`` is read as UTF-8 and put right at :meth:`BagValidator.finish` if
``bagit.txt`` declares another encoding.
"""

from __future__ import annotations

import codecs
import hashlib
import io
import os
import re
import stat
import sys
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from packhorse.bags.extraction import DEFAULT_LIMITS, ExtractionLimits, members_of, open_tar
from packhorse.errors import UnsafePathError, VerificationError
from packhorse.names import quoted

#: The checksum algorithms RFC 8493 §2.4 names (the IANA "BagIt Checksum Algorithms" registry).
#: Verified too, as the reference ``bagit`` library does: sha224 and sha384 (older tools write them).
ALGORITHMS: tuple[str, ...] = ("md5", "sha1", "sha224", "sha256", "sha384", "sha512")
#: Hex length of each algorithm's checksum.
DIGEST_HEX_LENGTH = {"md5": 32, "sha1": 40, "sha224": 56, "sha256": 64, "sha384": 96, "sha512": 128}
#: Algorithms a payload file is hashed with when it comes before every payload manifest.
EARLY_ALGORITHMS: tuple[str, ...] = ("sha256", "sha512")
#: BagIt versions read.
VERSIONS: tuple[str, ...] = ("1.0", "0.97")
#: Earlier drafts read like 0.97, with a warning (``old-version``): bags other tools made years ago.
OLD_VERSIONS: tuple[str, ...] = ("0.93", "0.94", "0.95", "0.96")
#: A special tag file (bagit.txt, bag-info.txt, fetch.txt, a manifest) larger than this (bytes)
#: is refused rather than held in memory (about 1.5 million lines of a sha512 manifest).
MAX_TAG_FILE_BYTES = 256 << 20
#: Bytes of ``bagit.txt`` held (it is two short lines; a longer one is invalid, and refused on what
#: these bytes show).
MAX_DECLARATION_BYTES = 64 << 10
#: Read size (bytes) when hashing.
CHUNK_BYTES = 1 << 20
#: Problems (and, separately, warnings) a report lists; the others are counted
#: (:attr:`BagReport.problems_omitted`), so a bag with millions of wrong lines costs no more.
MAX_LISTED_PROBLEMS = 1000
#: Memory (bytes) the manifest entries of one bag may hold together, counted as Python holds them
#: (``sys.getsizeof`` of the path and of the checksum, plus :data:`_ENTRY_SLOT_BYTES`): about
#: 200 bytes an entry of a 41-character path and a sha256, so 1,000,000 such entries (the default
#: ``[extraction] max_members``, the other limit) fit. Beyond either, ``manifest-too-large``.
MAX_MANIFEST_MEMORY_BYTES = 200 << 20
#: What one entry costs in its manifest's dict besides the path and checksum objects (bytes).
_ENTRY_SLOT_BYTES = 40
#: A manifest line longer than this (characters) is a ``manifest-line-invalid`` problem and is
#: not held (a path in a bag thousands of folders deep is some tens of thousands).
MAX_MANIFEST_LINE_CHARS = 1 << 20

#: Every problem code, with the rule that decides it.
PROBLEM_CODES: dict[str, str] = {
    "bag-declaration-missing": "RFC 8493 §2.1.1: a bag has a bagit.txt",
    "bag-declaration-invalid": "RFC 8493 §2.1.1: exactly 'BagIt-Version: M.N' and 'Tag-File-Character-Encoding: "
                               "ENCODING', no byte-order mark",
    "unsupported-version": "packhorse reads BagIt 1.0 (RFC 8493) and 0.97",
    "unknown-encoding": "RFC 8493 §2.1.1: ENCODING names a character encoding",
    "payload-directory-missing": "RFC 8493 §2.1.2: the base directory has a 'data' directory",
    "payload-manifest-missing": "RFC 8493 §2.1.3: a bag has at least one payload manifest",
    "unsupported-algorithm": "RFC 8493 §2.4 names md5, sha1, sha256, sha512; §3: every checksum must be verified",
    "tag-file-unreadable": "RFC 8493 §2.1.1, §2.3: tag files are text in the declared encoding",
    "manifest-line-invalid": "RFC 8493 §2.1.3: '<checksum> <filepath>', one or more spaces or tabs between",
    "manifest-duplicate-entry": "RFC 8493 §2.1.3: a manifest lists each file once",
    "manifest-path-outside-payload": "RFC 8493 §2.1.3: a payload manifest lists payload files (under data/)",
    "tag-manifest-lists-payload": "RFC 8493 §2.2.1: a tag manifest lists tag files, not payload files",
    "manifest-path-unsafe": "RFC 8493 §2.1.3, §5: a relative path without '..', empty or '.' components",
    "file-missing": "RFC 8493 §3 (complete): every file listed in every manifest is present",
    "payload-not-in-manifest": "RFC 8493 §3 (complete): every payload file is listed in every payload manifest "
                               "(0.97: in at least one)",
    "checksum-mismatch": "RFC 8493 §3 (valid): every checksum verifies",
    "not-verified": "RFC 8493 §3 (valid): every checksum verifies; this one could not be computed in one pass",
    "bag-info-invalid": "RFC 8493 §2.2.2: 'Label: value' lines, continuation lines indented",
    "payload-oxum-invalid": "RFC 8493 §2.2.2: Payload-Oxum is 'OctetCount.StreamCount'",
    "payload-oxum-mismatch": "RFC 8493 §2.2.2: Payload-Oxum gives the payload's octets and file count",
    "fetch-line-invalid": "RFC 8493 §2.2.3: fetch.txt lines are 'URL LENGTH FILEPATH', LENGTH a number or '-', "
                          "FILEPATH a payload file",
    "fetch-not-in-manifest": "RFC 8493 §2.2.3: every file listed in the fetch file MUST be listed in every payload "
                             "manifest",
    "symlink": "packhorse (DESIGN I6): links are never followed; RFC 8493 §2.1.2 payload is files",
    "special-file": "packhorse (DESIGN I6): only regular files and directories",
    "unsafe-member": "packhorse (DESIGN I6): tar members stay inside the bag folder, no links or devices",
    "duplicate-entry": "a tar holding one path twice is two different bags",
    "not-a-bag-container": "a bag tar holds one bag folder; a damaged or non-tar file is not a bag",
    "tag-file-too-large": f"packhorse reads special tag files up to {MAX_TAG_FILE_BYTES} bytes, and holds what "
                          "fetch.txt and bag-info.txt say within the bag's memory budget (manifest-too-large)",
    "manifest-too-large": "packhorse holds at most [extraction] max_members manifest entries per bag (all its "
                          "manifests and tag manifests together; no tar it reads holds more files), in at most "
                          f"{MAX_MANIFEST_MEMORY_BYTES >> 20} MiB of memory",
    "truncated": "the container ended inside a file",
    "unreadable": "a file of the bag could not be read",
}

#: Every warning code: a departure from RFC 8493 that the reference ``bagit`` library accepts, so
#: a bag made by another tool is not refused for it (listed, exit 0).
WARNING_CODES: dict[str, str] = {
    "old-version": "BagIt 0.93-0.96 (drafts before 0.97): read as 0.97",
    "bag-declaration-unterminated": "RFC 8493 §2.1.1 ends each line of bagit.txt; the last one has no line end",
    "bag-info-label-whitespace": "RFC 8493 §2.2.2: no whitespace between a label and its colon; read without it",
    "manifest-path-dot-prefix": "RFC 8493 §2.1.3: paths relative to the base directory; a leading './' is dropped",
}

#: Codes that mean the container itself is unsafe (mapped to UnsafePathError by packhorse's readers).
UNSAFE_CODES = frozenset({"symlink", "special-file", "unsafe-member"})


@dataclass(frozen=True)
class Problem:
    """One reason a bag is not valid.

    Attributes:
        code: one of :data:`PROBLEM_CODES`.
        path: the file concerned, relative to the bag root (``data/x.fits``, ``bagit.txt``), or
            ``""`` for the bag as a whole.
        message: a sentence naming the bag and the file.
    """

    code: str
    path: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "path": self.path, "message": self.message}


@dataclass(frozen=True)
class PayloadEntry:
    """A payload file as read: ``size`` in bytes, ``digests`` {algorithm: lowercase hex}."""

    size: int
    digests: dict[str, str]


@dataclass
class BagReport:
    """What :meth:`BagValidator.finish` found.

    Attributes:
        bag: the bag's name in messages (a path, ``location:key``).
        version: the declared BagIt version (``"1.0"``), or None when bagit.txt is unusable.
        problems: the problems, in the order found, the first :data:`MAX_LISTED_PROBLEMS` of
            them (and the first refusing an unsafe entry, :data:`UNSAFE_CODES`, wherever it
            came); empty means valid.
        problems_omitted: how many more problems were found and not listed (0 when all are).
        omitted_codes: the codes of those not listed, sorted.
        warnings: departures the reference library accepts (:data:`WARNING_CODES`), in the
            order found, the first :data:`MAX_LISTED_PROBLEMS`; they do not make the bag invalid.
        warnings_omitted: how many more warnings were found and not listed.
        payload: {path under ``data/``: :class:`PayloadEntry`} for every payload file read.
        payload_algorithms: the algorithms of the payload manifests, sorted.
        tag_algorithms: the algorithms of the tag manifests, sorted.
        bag_info: bag-info.txt as {label: [values]} in file order (empty when absent).
        fetch_pending: payload paths listed in fetch.txt and in the manifests that are not in
            the bag (RFC 8493 §2.2.3: still to be fetched), sorted. A bag without problems but
            with such files is *valid but incomplete* (:attr:`complete` false): its present files
            all verify; packhorse does not fetch.
        passes: 1, or 2 when some payload had to be read again (see the module).
    """

    bag: str
    version: str | None = None
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    payload: dict[str, PayloadEntry] = field(default_factory=dict)
    payload_algorithms: list[str] = field(default_factory=list)
    tag_algorithms: list[str] = field(default_factory=list)
    bag_info: dict[str, list[str]] = field(default_factory=dict)
    passes: int = 1
    fetch_pending: list[str] = field(default_factory=list)
    problems_omitted: int = 0
    omitted_codes: list[str] = field(default_factory=list)
    warnings_omitted: int = 0

    @property
    def valid(self) -> bool:
        return not self.problems and not self.problems_omitted

    @property
    def complete(self) -> bool:
        """Whether every file the manifests list is in the bag (none waits in fetch.txt)."""
        return not self.fetch_pending

    def summary(self) -> str:
        """The report as text: a first line ``VALID ...`` or ``INVALID ...``, then one line per problem."""
        files, octets = len(self.payload), sum(e.size for e in self.payload.values())
        what = (f"BagIt {self.version or '?'}; payload manifests: {', '.join(self.payload_algorithms) or 'none'}; "
                f"tag manifests: {', '.join(self.tag_algorithms) or 'none'}; {files} payload file(s), {octets} bytes")
        warned = [f"  warning [{w.code}] {w.message}" for w in self.warnings]
        if self.warnings_omitted:
            warned.append(f"  … and {self.warnings_omitted:,} more warning(s), not listed")
        if self.valid and self.fetch_pending:
            return "\n".join([f"INCOMPLETE {self.bag}: valid, but {len(self.fetch_pending)} payload file(s) listed in "
                              f"fetch.txt are not in the bag ({what})",
                              *(f"  to fetch: {p}" for p in self.fetch_pending), *warned])
        if self.valid:
            return "\n".join([f"VALID {self.bag} ({what})", *warned])
        lines = [f"INVALID {self.bag}: {len(self.problems) + self.problems_omitted} problem(s) ({what})"]
        lines += [f"  [{p.code}] {p.message}" for p in self.problems]
        if self.problems_omitted:
            lines.append(f"  … and {self.problems_omitted:,} more problem(s), not listed: "
                         f"{', '.join(self.omitted_codes)}")
        return "\n".join([*lines, *warned])

    def as_dict(self) -> dict[str, object]:
        """The report as JSON-ready data (what ``packhorse validate --json`` prints)."""
        return {
            "bag": self.bag,
            "valid": self.valid,
            "complete": self.valid and self.complete,
            "fetch_pending": self.fetch_pending,
            "version": self.version,
            "payload_algorithms": self.payload_algorithms,
            "tag_algorithms": self.tag_algorithms,
            "payload_files": len(self.payload),
            "payload_bytes": sum(e.size for e in self.payload.values()),
            "problems": [p.as_dict() for p in self.problems],
            "problems_omitted": self.problems_omitted,
            "omitted_codes": self.omitted_codes,
            "warnings": [w.as_dict() for w in self.warnings],
            "warnings_omitted": self.warnings_omitted,
        }


_LINE_END = re.compile(r"\r\n|\r|\n")
_DECLARATION = re.compile(
    r"BagIt-Version: (?P<version>[0-9]+\.[0-9]+)(?:\r\n|\r|\n)"
    r"Tag-File-Character-Encoding: (?P<encoding>[^\s:]+)(?P<end>\r\n|\r|\n)?"
)
_MANIFEST_NAME = re.compile(r"(tag)?manifest-([A-Za-z0-9][A-Za-z0-9_-]*)\.txt")  # sha3-256 too
_MANIFEST_LINE = re.compile(r"([0-9A-Fa-f]+)[ \t]+(.*)", re.DOTALL)
_PERCENT = re.compile(r"%(0A|0D|25)", re.IGNORECASE)
_PERCENT_VALUE = {"0a": "\n", "0d": "\r", "25": "%"}
_OXUM = re.compile(r"([0-9]+)\.([0-9]+)")
_SPECIAL = ("bagit.txt", "bag-info.txt", "fetch.txt")


def decode_manifest_path(path: str) -> str:
    """Decode a manifest path: ``%0A``, ``%0D``, ``%25`` (any case) in one pass (RFC 8493 §2.1.3)."""
    if "%" not in path:
        return path
    return _PERCENT.sub(lambda m: _PERCENT_VALUE[m.group(1).lower()], path)


def _unsafe_reason(path: str) -> str | None:
    if path and "//" not in path and "/." not in path and path[0] not in "/." and path[-1] != "/":
        return None  # (most paths: no empty, '.' or '..' component can be there)
    if not path:
        return "is empty"
    if path.startswith("/"):
        return "is absolute"
    parts = path.split("/")
    if ".." in parts:
        return "has a '..' component"
    if "" in parts or "." in parts:
        return "has an empty or '.' component"
    return None


#: hashlib constructor of each algorithm a manifest may use (``hashlib.sha256`` is cheaper per
#: call than ``hashlib.new("sha256")``)
_HASHERS: dict[str, Callable[..., Any]] = {
    a: getattr(hashlib, a, None) or (lambda data=b"", _a=a: hashlib.new(_a, data)) for a in DIGEST_HEX_LENGTH}


def _new_hashes(algorithms: Iterable[str]) -> dict[str, hashlib._Hash]:
    return {a: hashlib.new(a) for a in sorted(set(algorithms)) if a in DIGEST_HEX_LENGTH}


def hash_stream(stream: BinaryIO, algorithms: Iterable[str]) -> tuple[int, dict[str, str]]:
    """Read ``stream`` to its end; return (bytes read, {algorithm: hex digest}).

    Reads into one reused buffer of :data:`CHUNK_BYTES` (no copy per block)."""
    hashes = list(_new_hashes(algorithms).items())
    buf = bytearray(CHUNK_BYTES)
    view = memoryview(buf)
    size = 0
    readinto = getattr(stream, "readinto", None)
    while True:
        if readinto is not None:
            n = readinto(buf)
            if not n:
                break
            block = view[:n]
        else:
            data = stream.read(CHUNK_BYTES)
            if not data:
                break
            n, block = len(data), memoryview(data)
        for _, h in hashes:
            h.update(block)
        size += n
    return size, {a: h.hexdigest() for a, h in hashes}


def _declared_encoding(raw: bytes) -> str:
    """The encoding ``bagit.txt`` (``raw``) declares, as :meth:`BagValidator.finish` reads it:
    UTF-8 when it declares none usable (the problems are recorded there)."""
    if raw.startswith(codecs.BOM_UTF8):
        return "utf-8"
    try:
        m = _DECLARATION.fullmatch(raw.decode("utf-8"))
        if m:
            codecs.lookup(m.group("encoding"))
            return m.group("encoding")
    except (UnicodeDecodeError, LookupError):
        pass
    return "utf-8"


def _ascii_compatible(encoding: str) -> bool:
    """Whether ``encoding`` writes ASCII as ASCII (UTF-8, Latin-1...; not UTF-16)."""
    try:
        return "\r\n%09azAZ".encode(encoding) == b"\r\n%09azAZ"
    except (LookupError, UnicodeError):
        return False


class _Capped:
    """A list of problems (or warnings) that keeps the first :data:`MAX_LISTED_PROBLEMS` in the
    order found and only counts the rest, by code: the one rule for every list a report shows.

    ``items``: the kept entries; ``omitted``: {code: how many were not kept}."""

    __slots__ = ("items", "omitted")

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.omitted: dict[str, int] = {}

    def add(self, code: str, item: Any, *, always: bool = False) -> bool:
        """Keep ``item`` if there is room (or ``always``) and return True; else count it under ``code``."""
        if always or len(self.items) < MAX_LISTED_PROBLEMS:
            self.items.append(item)
            return True
        self.omitted[code] = self.omitted.get(code, 0) + 1
        return False

    def count(self, omitted: dict[str, int]) -> None:
        """Add another list's counts of entries not kept."""
        for code, n in omitted.items():
            self.omitted[code] = self.omitted.get(code, 0) + n

    @property
    def omitted_count(self) -> int:
        return sum(self.omitted.values())


def _fold(st: "_TagText") -> None:
    """Join the continuation lines read for ``st.last`` onto its value, once (a value extended
    line by line would be copied whole for every line: quadratic in the file's size)."""
    if st.more and st.last is not None:
        label, i = st.last
        st.info[label][i] += "".join(st.more)
    st.more.clear()


@dataclass
class _TagText:
    """A manifest, tag manifest, ``fetch.txt`` or ``bag-info.txt`` as parsed while it was read
    (its text is never held).

    ``entries`` is {path relative to the bag root: checksum as bytes} for a manifest (``b""`` for
    an algorithm packhorse does not verify), {payload path: ``b""``} for ``fetch.txt``; ``info``
    is ``bag-info.txt`` as {label: [values]}. ``problems`` and ``warnings`` are ``(code, path,
    message)`` found in it (:class:`_Capped`); they join the report at :meth:`BagValidator.finish`, in the
    order they did when these files were parsed there."""

    name: str
    encoding: str
    provisional: bool  # read as UTF-8 before bagit.txt declared the encoding
    algorithm: str = ""  # a manifest's
    tag: bool = False  # a tag manifest
    line_code: str = "manifest-line-invalid"  # the problem of a line that is not one
    entries: dict[str, bytes] = field(default_factory=dict)
    info: dict[str, list[str]] = field(default_factory=dict)
    last: tuple[str, int] | None = None  # bag-info.txt: the value a continuation line extends
    more: list[str] = field(default_factory=list)  # bag-info.txt: continuation pieces of ``last``, not yet joined
    problems: _Capped = field(default_factory=_Capped)  # of (code, path, message)
    warnings: _Capped = field(default_factory=_Capped)
    unreadable: str | None = None  # why it is not text in its encoding
    not_utf8: str | None = None  # (provisional) why it is not UTF-8
    refused: bool = False  # beyond the bag's manifest-entry budget: entries dropped
    held: int = 0  # bytes its entries hold (see MAX_MANIFEST_MEMORY_BYTES)
    lines: int = 0
    skipping: bool = False  # inside a line too long to hold

    @property
    def manifest(self) -> bool:
        return bool(self.algorithm)

    def undecodable(self, encoding: str, error: Exception) -> str:
        """The message of a file that is not text in ``encoding``."""
        return (f"{self.name} is not valid {encoding}: {error}" if self.manifest
                else f"tag file {quoted(self.name)} is not valid {encoding}: {error}")

    def note(self, code: str, path: str, message: str, *, warning: bool = False) -> None:
        (self.warnings if warning else self.problems).add(code, (code, path, message))


class BagValidator:
    """The streaming core: fed a bag's entries in any order, it reports every problem.

    Args:
        bag: the bag's name for messages (a folder path, ``location:key``).
        required_algorithms: algorithms every payload file is hashed with whatever the manifests
            say (packhorse's readers ask for ``("sha256",)``: they record it).
        max_manifest_entries: how many entries the bag's manifests, tag manifests and fetch.txt
            may list together (``[extraction] max_members``, default 1,000,000): a line beyond it
            is a ``manifest-too-large`` problem (``tag-file-too-large`` in fetch.txt), and that
            file is dropped and read no further (about 200 bytes are held per manifest entry,
            docs/bags.md); so is one whose line goes beyond :data:`MAX_MANIFEST_MEMORY_BYTES`.

    Memory: manifests, fetch.txt and bag-info.txt are parsed line by line as they are read
    (never held whole); per manifest entry the path (a ``str``) and the checksum as bytes.
    Problems and warnings beyond :data:`MAX_LISTED_PROBLEMS` are counted, not kept.

    Use: :meth:`add` each file (and :meth:`add_directory` for directory entries), report what a
    front end found itself with :meth:`problem`, optionally satisfy :meth:`rehash_needed`, then
    :meth:`finish`. Not thread-safe; one validator per bag.
    """

    def __init__(self, bag: str, *, required_algorithms: Iterable[str] = (),
                 max_manifest_entries: int = DEFAULT_LIMITS.max_members) -> None:
        self.bag = bag
        self._required = tuple(required_algorithms)
        self._problems = _Capped()  # of Problem
        self._unsafe_listed = False
        self._warnings = _Capped()  # of Problem
        self._warning_set: set[Problem] = set()
        self._tags: dict[str, bytes] = {}  # bagit.txt, held
        self._manifests: dict[str, _TagText] = {}  # manifests and tag manifests, parsed as read
        self._texts: dict[str, _TagText] = {}  # bag-info.txt and fetch.txt, parsed as read
        self._max_entries = max_manifest_entries
        self._entries = 0  # entries held in self._manifests
        self._held = 0  # bytes they hold (MAX_MANIFEST_MEMORY_BYTES)
        self._tag_digests: dict[str, dict[str, str]] = {}  # other tag files: {algorithm: hex}
        self._payload: dict[str, PayloadEntry] = {}
        self._seen: set[str] = set()
        self._has_data_dir = False
        self._payload_algs: set[str] = set()
        self._tag_algs: set[str] = set()
        self._unusable = False
        self.passes = 1

    # ------------------------------------------------------------------ feeding

    def problem(self, code: str, path: str, message: str) -> None:
        """Record a problem a front end found (``message`` without the bag's name: it is prefixed)."""
        assert code in PROBLEM_CODES, code
        unsafe = code in UNSAFE_CODES
        if self._problems.add(code, Problem(code, path, f"{self.bag}: {message}"),
                              always=unsafe and not self._unsafe_listed):
            self._unsafe_listed |= unsafe

    def warn(self, code: str, path: str, message: str) -> None:
        """Record a warning (:data:`WARNING_CODES`): listed in the report, the bag stays valid."""
        assert code in WARNING_CODES, code
        warning = Problem(code, path, f"{self.bag}: {message}")
        if warning in self._warning_set:
            return
        if self._warnings.add(code, warning):
            self._warning_set.add(warning)

    def unusable(self, code: str, message: str) -> None:
        """Record that the container cannot be read at all (not a tar, no such folder): the report
        then holds only this problem, not the consequences (no bagit.txt, no manifest...)."""
        self.problem(code, "", message)
        self._unusable = True

    def add_directory(self, path: str) -> None:
        """A directory entry (``path`` relative to the bag root, no trailing ``/``)."""
        if path == "data" or path.startswith("data/"):
            self._has_data_dir = True

    def payload_algorithms_for(self, path: str) -> tuple[str, ...]:
        """The algorithms payload file ``path`` is hashed with if it arrives now (see the module)."""
        algs = set(self._required) | (self._payload_algs & set(DIGEST_HEX_LENGTH))
        if not self._payload_algs:
            algs |= set(EARLY_ALGORITHMS)
        return tuple(sorted(algs))

    def add(self, path: str, size: int, stream: BinaryIO | bytes | memoryview) -> None:
        """Read one file of the bag from ``stream`` (to its end) and record what it holds.

        Args:
            path: relative to the bag root, ``/`` separators (``data/a.fits``, ``bagit.txt``).
            size: its size in bytes as the container declares it.
            stream: a readable binary stream, or the bytes themselves.
        """
        if not self._admit(path):
            return
        if path.startswith("data/"):
            self._has_data_dir = True
            if isinstance(stream, (bytes, bytearray, memoryview)):
                n, digests = len(stream), self._hash_bytes(stream, self.payload_algorithms_for(path))
            else:
                n, digests = hash_stream(stream, self.payload_algorithms_for(path))
            self.add_payload_digests(path, n, digests, declared_size=size)
            return
        name = path
        m = _MANIFEST_NAME.fullmatch(name)
        if m or name in _SPECIAL:
            if size > MAX_TAG_FILE_BYTES:
                self.problem("tag-file-too-large", path, f"tag file {quoted(path)} is {size} bytes, more than the "
                                                         f"{MAX_TAG_FILE_BYTES} packhorse reads")
                if not isinstance(stream, (bytes, bytearray, memoryview)):
                    hash_stream(stream, ())
                return
            if m:
                self._read_manifest(name, m.group(2), bool(m.group(1)), size, stream)
                return
            if name == "fetch.txt":
                st = self._texts[name] = self._text_state(name, line_code="fetch-line-invalid")
                self._read_text(st, size, stream, lambda n, line: self._fetch_line(st, n, line))
                return
            if name == "bag-info.txt":
                st = self._texts[name] = self._text_state(name, line_code="bag-info-invalid")
                self._read_text(st, size, stream, lambda n, line: self._bag_info_line(st, n, line))
                return
            self._read_declaration(name, size, stream)
            return
        algs = set(ALGORITHMS) | (self._tag_algs & set(DIGEST_HEX_LENGTH))
        if isinstance(stream, (bytes, bytearray, memoryview)):
            self._tag_digests[name] = self._hash_bytes(stream, algs)
        else:
            _, self._tag_digests[name] = hash_stream(stream, algs)

    def _read_declaration(self, name: str, size: int, stream: BinaryIO | bytes | memoryview) -> None:
        """Read ``bagit.txt`` to its end, hashing it with every algorithm; hold its first
        :data:`MAX_DECLARATION_BYTES` + 1 bytes (two short lines are valid: more is a problem
        found in those)."""
        src: BinaryIO = (io.BytesIO(stream) if isinstance(stream, (bytes, bytearray, memoryview))  # type: ignore[assignment]
                         else stream)
        hashes = list(_new_hashes(ALGORITHMS).items())
        kept, read = bytearray(), 0
        while block := src.read(CHUNK_BYTES):
            for _, h in hashes:
                h.update(block)
            read += len(block)
            if len(kept) <= MAX_DECLARATION_BYTES:
                kept += block[:MAX_DECLARATION_BYTES + 1 - len(kept)]
        if read != size:
            self.problem("truncated", name, f"tag file {quoted(name)} ends after {read} of {size} bytes")
        self._tags[name] = bytes(kept)
        self._tag_digests[name] = {a: h.hexdigest() for a, h in hashes}

    def _text_state(self, name: str, **kw: Any) -> _TagText:
        """The parsing state of tag file ``name``: in the encoding ``bagit.txt`` declares, or,
        before ``bagit.txt``, as UTF-8, put right at :meth:`finish` if it declares another."""
        declaration = self._tags.get("bagit.txt")
        return _TagText(name, encoding=_declared_encoding(declaration) if declaration is not None else "utf-8",
                        provisional=declaration is None, **kw)

    def _read_manifest(self, name: str, alg: str, tag: bool, size: int,
                       stream: BinaryIO | bytes | memoryview) -> None:
        """Parse manifest ``name`` line by line as it is read (:class:`_TagText`)."""
        (self._tag_algs if tag else self._payload_algs).add(alg)
        st = self._manifests[name] = self._text_state(name, algorithm=alg, tag=tag)
        width = DIGEST_HEX_LENGTH.get(alg)
        self._read_text(st, size, stream, lambda n, line: self._manifest_line(st, n, line, width))

    def _read_text(self, st: _TagText, size: int, stream: BinaryIO | bytes | memoryview,
                   on_line: Callable[[int, str], None]) -> None:
        """Read tag file ``st.name`` (``size`` bytes declared) to its end, handing each line
        (its number from 1, the text without its end) to ``on_line``, and hashing it with every
        algorithm (a tag manifest may list it). Memory: one read of :data:`CHUNK_BYTES` and one
        unfinished line (up to :data:`MAX_MANIFEST_LINE_CHARS`)."""
        name = st.name
        src: BinaryIO = (io.BytesIO(stream) if isinstance(stream, (bytes, bytearray, memoryview))  # type: ignore[assignment]
                         else stream)
        hashes = list(_new_hashes(ALGORITHMS).items())
        decoder = codecs.getincrementaldecoder(st.encoding)()
        read, carry, reading = 0, "", True
        while True:
            block = src.read(CHUNK_BYTES)
            final = not block
            for _, h in hashes:
                h.update(block)
            read += len(block)
            if reading:
                try:
                    text = decoder.decode(block, final)
                except UnicodeDecodeError as e:
                    if st.provisional:  # the declared encoding decides, at finish
                        st.not_utf8 = st.not_utf8 or st.undecodable("utf-8", e)
                        decoder.errors = "surrogateescape"
                        text = decoder.decode(block, final)
                    else:
                        st.unreadable = st.undecodable(st.encoding, e)
                        text = ""
                if st.unreadable is None:
                    carry = self._text_lines(st, carry + text, final, on_line)
                if st.unreadable is not None or st.refused:
                    reading, carry = False, ""
                    self._drop(st)
            if final:
                break
        if read != size:
            self.problem("truncated", name, f"tag file {quoted(name)} ends after {read} of {size} bytes")
        self._tag_digests[name] = {a: h.hexdigest() for a, h in hashes}

    def _drop(self, st: _TagText) -> None:
        """Forget the entries of a tag file that cannot be used (unreadable, over the budget)."""
        if st.manifest or st.name == "fetch.txt":
            self._entries -= len(st.entries)
        self._held -= st.held
        st.entries, st.info, st.held = {}, {}, 0

    def _hold(self, st: _TagText, number: int, cost: int, *, entry: bool) -> bool:
        """Whether line ``number`` of ``st`` may add ``cost`` bytes (and, with ``entry``, one
        entry) to what the bag's tag files hold; if not, ``st`` is refused (a problem)."""
        over_entries = entry and self._entries >= self._max_entries
        if not over_entries and self._held + cost <= MAX_MANIFEST_MEMORY_BYTES:
            st.held += cost
            self._held += cost
            self._entries += entry
            return True
        st.refused = True
        limit = (f"more than {self._max_entries:,} entries together, more files than a bag may hold "
                 f"([extraction] max_members = {self._max_entries})" if over_entries
                 else f"entries holding more than {MAX_MANIFEST_MEMORY_BYTES >> 20} MiB of memory together "
                      f"(the budget of one bag's manifests, fetch.txt and bag-info.txt)")
        st.note("manifest-too-large" if st.manifest else "tag-file-too-large", st.name,
                f"{st.name} line {number}: the bag's manifests and tag files list {limit}; {st.name} is refused")
        return False

    def _text_lines(self, st: _TagText, text: str, final: bool, on_line: Callable[[int, str], None]) -> str:
        """Parse the whole lines of ``text`` (line ends LF, CR or CRLF, RFC 8493 §2.3: not
        :meth:`str.splitlines`, which also splits at U+0085, U+2028... that may occur in file
        names); return the unfinished last line (all of it when ``final``)."""
        held = ""
        if not final and text.endswith("\r"):  # perhaps the first half of a CRLF
            text, held = text[:-1], "\r"
        lines = _LINE_END.split(text)
        rest = "" if final else lines.pop()
        if final and lines and lines[-1] == "":
            lines.pop()
        for line in lines:
            st.lines += 1
            if st.skipping:  # the end of a line too long to hold
                st.skipping = False
                continue
            on_line(st.lines, line)
            if st.refused:
                return ""
        rest += held
        if len(rest) > MAX_MANIFEST_LINE_CHARS:
            if not st.skipping:
                st.note(st.line_code, st.name, f"{st.name} line {st.lines + 1} is longer than "
                                               f"{MAX_MANIFEST_LINE_CHARS} characters: {rest[:200]!r}")
                st.skipping = True
            rest = ""
        return rest

    def _manifest_line(self, st: _TagText, number: int, line: str, width: int | None) -> None:
        """One manifest line: an entry of ``st``, or a problem."""
        if not line:
            return
        name, alg = st.name, st.algorithm
        m = _MANIFEST_LINE.fullmatch(line)
        if m is not None:
            checksum, path = m.groups()
        if m is None or (width is not None and len(checksum) != width):
            st.note("manifest-line-invalid", name, f"{name} line {number} is not '<{alg} checksum> <path>': "
                                                   f"{line[:200]!r}")
            return
        path = decode_manifest_path(path)
        if path.startswith("./"):
            while path.startswith("./"):
                path = path[2:]
            st.note("manifest-path-dot-prefix", name, f"{name} line {number}: a leading './' dropped", warning=True)
        reason = _unsafe_reason(path)
        if reason:
            st.note("manifest-path-unsafe", name, f"{name} line {number}: path {quoted(path)} {reason}")
            return
        if not st.tag and not path.startswith("data/"):
            st.note("manifest-path-outside-payload", name,
                    f"{name} line {number}: {quoted(path)} is not under data/ (a payload manifest lists payload files)")
            return
        if st.tag and path.startswith("data/"):
            st.note("tag-manifest-lists-payload", name, f"{name} line {number}: {quoted(path)} is a payload file")
            return
        if path in st.entries:
            st.note("manifest-duplicate-entry", name, f"{name} lists {quoted(path)} more than once")
            return
        digest = bytes.fromhex(checksum) if width is not None else b""
        if self._hold(st, number, sys.getsizeof(path) + sys.getsizeof(digest) + _ENTRY_SLOT_BYTES, entry=True):
            st.entries[path] = digest

    def _fetch_line(self, st: _TagText, number: int, line: str) -> None:
        """One line of fetch.txt (RFC 8493 §2.2.3: ``URL LENGTH FILEPATH``, ``LENGTH`` octets or
        ``-``, ``FILEPATH`` percent-encoded as in a manifest, under ``data/``): an entry, or a problem."""
        if not line.strip():
            return
        fields = line.split(None, 2)
        path = decode_manifest_path(fields[2]) if len(fields) == 3 else ""
        if (len(fields) != 3 or not (fields[1].isdigit() or fields[1] == "-") or _unsafe_reason(path)
                or not path.startswith("data/")):
            st.note("fetch-line-invalid", "fetch.txt",
                    f"fetch.txt line {number} is not 'URL LENGTH FILEPATH' naming a payload file: {line[:200]!r}")
            return
        if path not in st.entries and self._hold(st, number, sys.getsizeof(path) + _ENTRY_SLOT_BYTES, entry=True):
            st.entries[path] = b""

    def _bag_info_line(self, st: _TagText, number: int, line: str) -> None:
        """One line of bag-info.txt (RFC 8493 §2.2.2: ``Label: value``, or a continuation line
        starting with a space or tab): a value, or a problem."""
        info = st.info
        if line[:1] in (" ", "\t") and st.last is not None:
            more = " " + line.strip(" \t")
            if self._hold(st, number, len(more), entry=False):
                st.more.append(more)  # joined once, by _fold: appending to the value is quadratic
            return
        _fold(st)
        label, colon, value = line.partition(":")
        if colon and label.strip(" \t") and label != label.rstrip(" \t") and label == label.lstrip(" \t"):
            st.note("bag-info-label-whitespace", "bag-info.txt",
                    f"bag-info.txt line {number}: whitespace before the colon of {quoted(label.rstrip())}", warning=True)
            label = label.rstrip(" \t")
        if (not colon or not label or label != label.strip(" \t") or value[:1] not in (" ", "\t")):
            st.note("bag-info-invalid", "bag-info.txt", f"bag-info.txt line {number} is not 'Label: value': {line[:200]!r}")
            st.last = None
            return
        value = value[1:]
        if self._hold(st, number, sys.getsizeof(label) + sys.getsizeof(value) + _ENTRY_SLOT_BYTES, entry=False):
            values = info.setdefault(label, [])
            values.append(value)
            st.last = (label, len(values) - 1)

    def add_payload_digests(self, path: str, size: int, digests: dict[str, str], *,
                            declared_size: int | None = None) -> None:
        """Record a payload file hashed by the caller (who consumed the bytes itself):
        ``size`` bytes read, ``digests`` {algorithm: hex}. Called by :meth:`add` too."""
        self._has_data_dir = True
        if declared_size is not None and size != declared_size:
            self.problem("truncated", path, f"payload file {quoted(path)} ends after {size} of {declared_size} bytes")
        self._seen.add(path)
        self._payload[path] = PayloadEntry(size=size, digests={a: d.lower() for a, d in digests.items()})

    def admit_payload(self, path: str) -> bool:
        """For a front end that hashes a payload file itself (:meth:`add_payload_digests`):
        records the path as seen; False (with the problem recorded) when it is unsafe or a
        duplicate, in which case the caller skips it."""
        ok = self._admit(path)
        if ok:
            self._seen.discard(path)  # add_payload_digests marks it
        return ok

    def _admit(self, path: str) -> bool:
        reason = _unsafe_reason(path)
        if reason:
            self.problem("unsafe-member", path, f"entry {quoted(path)} {reason}")
            return False
        if path in self._seen:
            self.problem("duplicate-entry", path, f"{quoted(path)} appears twice")
            return False
        self._seen.add(path)
        return True

    @staticmethod
    def _hash_bytes(data: bytes | bytearray | memoryview, algorithms: Iterable[str]) -> dict[str, str]:
        """{algorithm: hex digest} of ``data`` for each known algorithm (one call per payload
        file of a bag held in memory: no stream, no generator)."""
        return {a: _HASHERS[a](data).hexdigest() for a in sorted(set(algorithms)) if a in _HASHERS}

    def payload_listed(self, path: str) -> bool | None:
        """Whether a payload path (``data/...``) is listed in the payload manifests seen so far
        (None when none has been seen). Lets a reader skip handing on a file that cannot be
        part of the bag."""
        if not self._payload_algs:
            return None
        for alg in self._payload_algs:
            st = self._manifests.get(f"manifest-{alg}.txt")
            if st is None or st.refused or path in st.entries:
                return True
        return False

    # ------------------------------------------------------------------ checking

    def rehash_needed(self) -> dict[str, tuple[str, ...]]:
        """{payload path: algorithms it still has to be hashed with}: files read before a manifest
        whose algorithm they were not hashed with (see the module). A front end that can read
        them again passes them to :meth:`rehash`."""
        need: dict[str, tuple[str, ...]] = {}
        algs = self._payload_algs & set(DIGEST_HEX_LENGTH)
        for path, entry in self._payload.items():
            missing = tuple(sorted(a for a in algs if a not in entry.digests))
            if missing:
                need[path] = missing
        return need

    def rehash(self, path: str, stream: BinaryIO) -> None:
        """Hash payload file ``path`` again (second pass) with what :meth:`rehash_needed` asks."""
        entry = self._payload[path]
        _, digests = hash_stream(stream, self.rehash_needed().get(path, ()))
        entry.digests.update(digests)
        self.passes = 2

    def _declaration(self) -> tuple[str | None, str]:
        """(version, encoding) from bagit.txt; problems recorded. Falls back to (None, utf-8)."""
        raw = self._tags.get("bagit.txt")
        if raw is None:
            self.problem("bag-declaration-missing", "bagit.txt", "the bag has no bagit.txt")
            return None, "utf-8"
        if raw.startswith(codecs.BOM_UTF8):
            self.problem("bag-declaration-invalid", "bagit.txt", "bagit.txt starts with a byte-order mark")
            return None, "utf-8"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            self.problem("bag-declaration-invalid", "bagit.txt", "bagit.txt is not UTF-8")
            return None, "utf-8"
        m = _DECLARATION.fullmatch(text)
        if not m:
            self.problem("bag-declaration-invalid", "bagit.txt",
                         f"bagit.txt must be exactly 'BagIt-Version: M.N' and 'Tag-File-Character-Encoding: "
                         f"ENCODING', each line ended; it is {text[:200]!r}")
            return None, "utf-8"
        version, encoding = m.group("version"), m.group("encoding")
        if m.group("end") is None:
            self.warn("bag-declaration-unterminated", "bagit.txt", "the last line of bagit.txt has no line end")
        try:
            codecs.lookup(encoding)
        except LookupError:
            self.problem("unknown-encoding", "bagit.txt", f"bagit.txt declares the unknown encoding {quoted(encoding)}")
            encoding = "utf-8"
        if version in OLD_VERSIONS:
            self.warn("old-version", "bagit.txt", f"BagIt-Version {version} is a draft before 0.97; read as 0.97")
        elif version not in VERSIONS:
            self.problem("unsupported-version", "bagit.txt",
                         f"BagIt-Version {version} is not one packhorse reads ({', '.join(VERSIONS)})")
        return version, encoding

    def _settle(self, st: _TagText, encoding: str) -> None:
        """Record what was found in tag file ``st`` (see :class:`_TagText`), now that the
        declared ``encoding`` is known: one read as UTF-8 before ``bagit.txt`` is read again from
        its entries in the declared encoding, or is unreadable."""
        _fold(st)
        if st.provisional and st.unreadable is None:
            if codecs.lookup(encoding).name == "utf-8":
                st.unreadable = st.not_utf8
            elif not _ascii_compatible(encoding):
                st.unreadable = (f"{st.name} came before bagit.txt, which declares {encoding}; packhorse reads a "
                                 f"tag file in an encoding that does not write ASCII as ASCII only after bagit.txt")
            else:
                def again(text: str) -> str:
                    return text.encode("utf-8", "surrogateescape").decode(encoding)
                try:
                    st.entries = {again(p): d for p, d in st.entries.items()}
                    st.info = {again(k): [again(v) for v in vs] for k, vs in st.info.items()}
                except UnicodeError as e:
                    st.unreadable = st.undecodable(encoding, e)
        if st.unreadable is not None:
            self._drop(st)
            self.problem("tag-file-unreadable", st.name, st.unreadable)
            return
        for code, path, message in st.problems.items:
            self.problem(code, path, message)
        self._problems.count(st.problems.omitted)
        for code, path, message in st.warnings.items:
            self.warn(code, path, message)
        self._warnings.count(st.warnings.omitted)

    def _bag_info(self, encoding: str) -> dict[str, list[str]]:
        """bag-info.txt as {label: [values]} (empty without it); its problems recorded."""
        st = self._texts.get("bag-info.txt")
        if st is None:
            return {}
        self._settle(st, encoding)
        return st.info

    def finish(self) -> BagReport:
        """Check everything fed so far against the rules; return the report with every problem."""
        report = BagReport(bag=self.bag, passes=self.passes)
        if self._unusable:
            self._fill(report)
            return report
        version, encoding = self._declaration()
        report.version = version
        if not self._has_data_dir:
            self.problem("payload-directory-missing", "data", "the bag has no data/ payload directory")
        fetch = self._fetch(encoding)
        manifests: dict[str, dict[str, bytes]] = {}  # {algorithm: entries}, those usable
        tag_manifests: dict[str, dict[str, bytes]] = {}
        refused: dict[bool, set[str]] = {False: set(), True: set()}  # beyond the budget: {is tag: algorithms}
        for name in sorted(self._manifests):
            st = self._manifests[name]
            alg, is_tag = st.algorithm, st.tag
            if alg not in DIGEST_HEX_LENGTH:
                self.problem("unsupported-algorithm", name,
                             f"{name} uses the algorithm {quoted(alg)}, which packhorse cannot verify "
                             f"(it verifies {', '.join(ALGORITHMS)})")
            self._settle(st, encoding)
            if st.refused:
                refused[is_tag].add(alg)
                continue
            (tag_manifests if is_tag else manifests)[alg] = st.entries
        report.payload_algorithms = sorted(manifests.keys() | refused[False])
        report.tag_algorithms = sorted(tag_manifests.keys() | refused[True])
        if not report.payload_algorithms:
            self.problem("payload-manifest-missing", "", "the bag has no payload manifest (manifest-<algorithm>.txt)")
        # completeness and validity of the payload
        pending: set[str] = set()
        for alg, entries in manifests.items():
            name = f"manifest-{alg}.txt"
            for path, expected in entries.items():
                entry = self._payload.get(path)
                if entry is None:
                    if path in fetch:
                        pending.add(path)  # to be fetched (§2.2.3): the bag is incomplete, not invalid
                    else:
                        self.problem("file-missing", path, f"{name} lists {quoted(path)}, which is not in the bag")
                    continue
                if alg not in DIGEST_HEX_LENGTH:
                    continue
                actual = entry.digests.get(alg)
                if actual is None:
                    self.problem("not-verified", path,
                                 f"payload file {quoted(path)} came before {name} in a stream that cannot be read twice; "
                                 f"packhorse hashes payload read before any manifest with "
                                 f"{' and '.join(EARLY_ALGORITHMS)} only")
                elif actual != expected.hex():
                    self.problem("checksum-mismatch", path,
                                 f"payload file {quoted(path)} has {alg} {actual}, {name} says {expected.hex()}")
        for path in sorted(fetch):  # a file to fetch must be one the manifests say how to verify
            absent = [a for a, entries in manifests.items() if path not in entries]
            if absent and manifests:
                self.problem("fetch-not-in-manifest", path,
                             f"fetch.txt lists {quoted(path)}, which is not in "
                             + ", ".join(f"manifest-{a}.txt" for a in absent))
        every = version not in ("0.97", *OLD_VERSIONS)  # 0.97 and its drafts: in at least one
        for path in self._payload:
            if every:
                absent = [a for a, entries in manifests.items() if path not in entries]
            else:
                absent = [] if any(path in entries for entries in manifests.values()) else list(manifests)
            if absent and manifests:
                self.problem("payload-not-in-manifest", path,
                             f"payload file {quoted(path)} is not in " + ", ".join(f"manifest-{a}.txt" for a in absent))
        # tag manifests
        for alg, entries in tag_manifests.items():
            name = f"tagmanifest-{alg}.txt"
            for path, expected in entries.items():
                if path in self._tag_digests:
                    actual = self._tag_digests[path].get(alg)
                else:
                    self.problem("file-missing", path, f"{name} lists {quoted(path)}, which is not in the bag")
                    continue
                if actual is not None and actual != expected.hex():
                    self.problem("checksum-mismatch", path,
                                 f"tag file {quoted(path)} has {alg} {actual}, {name} says {expected.hex()}")
        # bag-info and Payload-Oxum
        report.bag_info = self._bag_info(encoding)
        octets = sum(e.size for e in self._payload.values())
        for oxum in next((v for k, v in report.bag_info.items() if k.lower() == "payload-oxum"), []):
            m = _OXUM.fullmatch(oxum)
            if not m:
                self.problem("payload-oxum-invalid", "bag-info.txt",
                             f"Payload-Oxum {quoted(oxum)} is not 'OctetCount.StreamCount'")
            elif not pending and (int(m.group(1)), int(m.group(2))) != (octets, len(self._payload)):
                # (the Oxum counts the complete payload: with files still to fetch it cannot be checked)
                self.problem("payload-oxum-mismatch", "bag-info.txt",
                             f"Payload-Oxum {quoted(oxum)} but payload is {octets}.{len(self._payload)}")
        self._fill(report)
        report.payload = dict(self._payload)
        report.fetch_pending = sorted(pending)
        return report

    def _fill(self, report: BagReport) -> None:
        """Put the problems and warnings found into ``report``."""
        report.problems = list(self._problems.items)
        report.problems_omitted = self._problems.omitted_count
        report.omitted_codes = sorted(self._problems.omitted)
        report.warnings = list(self._warnings.items)
        report.warnings_omitted = self._warnings.omitted_count

    def _fetch(self, encoding: str) -> dict[str, bytes]:
        """The payload paths fetch.txt lists (as the keys; :meth:`_fetch_line`); its problems
        recorded. Empty without fetch.txt."""
        st = self._texts.get("fetch.txt")
        if st is None:
            return {}
        self._settle(st, encoding)
        return st.entries


# ------------------------------------------------------------------------------ front ends


def validate_folder(root: Path, *, bag: str | None = None, required_algorithms: Iterable[str] = (),
                    max_manifest_entries: int = DEFAULT_LIMITS.max_members) -> BagReport:
    """Validate the bag folder ``root``: tag files first, then the payload in sorted order (one
    pass), never following a symlink (a symlink, a device, a FIFO is a problem, not followed).

    Args:
        root: the bag's base directory.
        bag: its name in messages (default: the path).
        required_algorithms: see :class:`BagValidator`.
        max_manifest_entries: see :class:`BagValidator` (``[extraction] max_members``).

    Returns:
        the :class:`BagReport`; a missing or unreadable folder is a report with problems, not an error.
    """
    v = BagValidator(bag or str(root), required_algorithms=required_algorithms,
                     max_manifest_entries=max_manifest_entries)
    try:
        st = os.lstat(root)
    except OSError as e:
        v.unusable("unreadable", f"cannot read the bag folder: {e.strerror}")
        return v.finish()
    if not stat.S_ISDIR(st.st_mode):
        v.unusable("not-a-bag-container", "is not a folder")
        return v.finish()
    entries = sorted(_walk(root, "", v), key=lambda e: (e[0] == "data" or e[0].startswith("data/"),
                                                        e[0].encode("utf-8", "surrogateescape")))
    for rel, is_dir in entries:
        if is_dir:
            v.add_directory(rel)
            continue
        try:
            # O_NONBLOCK: a FIFO put there after the listing is refused below, never waited on
            fd = _open_below(root, rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            v.problem("unreadable", rel, f"cannot read {quoted(rel)}: {e.strerror}")
            continue
        with os.fdopen(fd, "rb", buffering=0) as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                v.problem("special-file", rel, f"{quoted(rel)} is not a regular file or folder")
                continue
            os.set_blocking(fd, True)
            try:
                v.add(rel, st.st_size, f)  # type: ignore[arg-type]
            except OSError as e:
                v.problem("unreadable", rel, f"cannot read {quoted(rel)}: {e.strerror}")
    return v.finish()


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Paths (bytes) at least this long are opened one folder at a time below the bag folder: the
#: whole path would pass ``PATH_MAX`` (4,096 bytes) in a deep bag (2,000 levels, say).
_LONG_PATH_BYTES = 3800


def _open_below(root: Path, rel: str, flags: int) -> int:
    """Open ``rel`` (``/``-separated, below the bag folder ``root``) with ``flags``; a path too
    long for one ``open`` is opened one folder at a time (``openat``, no folder link followed),
    so a bag folder of any depth is read. Returns the descriptor.

    Raises:
        OSError: as ``open`` does (``ELOOP`` for a link on the way).
    """
    full = os.path.join(root, rel)
    if len(os.fsencode(full)) < _LONG_PATH_BYTES:
        return os.open(full, flags)
    *folders, last = rel.split("/")
    fd = os.open(root, _DIR_FLAGS)
    try:
        for name in folders:
            nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nfd
        return os.open(last, flags, dir_fd=fd)
    finally:
        os.close(fd)


def _walk(root: Path, rel: str, v: BagValidator) -> Iterator[tuple[str, bool]]:
    """Every folder and regular file under ``root / rel``: ``(path relative to root, is a
    folder)``, in no set order (the caller sorts); symbolic links, special files and folders
    that cannot be listed are problems of ``v``. Iterative (a stack of folders to list), so a
    bag folder thousands of levels deep is validated, not ended by ``RecursionError``."""
    stack = [rel]
    while stack:
        rel = stack.pop()
        try:
            dfd = _open_below(root, rel, _DIR_FLAGS) if rel else os.open(root, _DIR_FLAGS)
        except OSError as e:
            v.problem("unreadable", rel, f"cannot list {quoted(rel or '.')}: {e.strerror}")
            continue
        try:
            with os.scandir(dfd) as it:
                children = sorted(it, key=lambda e: e.name.encode("utf-8", "surrogateescape"))
            links = {e.name: os.readlink(e.name, dir_fd=dfd) for e in children if e.is_symlink()}
        except OSError as e:
            v.problem("unreadable", rel, f"cannot list {quoted(rel or '.')}: {e.strerror}")
            continue
        finally:
            os.close(dfd)
        for entry in children:
            path = f"{rel}/{entry.name}" if rel else entry.name
            if entry.name in links:
                v.problem("symlink", path, f"{quoted(path)} is a symlink (to {quoted(links[entry.name])}); links are not followed")
            elif entry.is_dir(follow_symlinks=False):
                yield path, True
                stack.append(path)
            elif entry.is_file(follow_symlinks=False):
                yield path, False
            else:
                v.problem("special-file", path, f"{quoted(path)} is not a regular file or folder")


def validate_tar(
    fileobj: BinaryIO,
    *,
    bag: str,
    required_algorithms: Iterable[str] = (),
    on_payload: Callable[[str, int, BinaryIO], str] | None = None,
    payload_bytes: memoryview | None = None,
    limits: ExtractionLimits | None = None,
    stop_at_refused: bool = False,
) -> tuple[BagReport, str]:
    """Validate a bag tar (one top folder ``<bag_dir>/`` holding the bag) in one pass.

    Args:
        fileobj: the tar, read sequentially (random access when it can seek, else as a stream).
        bag: its name in messages.
        required_algorithms: see :class:`BagValidator`.
        on_payload: called as ``on_payload(path under data/, size, stream)`` for each payload file
            listed in the manifests (or met before them); it must read the stream to its end and
            return the sha256 (hex) of what it read, which is the file's sha256 in the report
            (the caller's own hash is not done twice).
        payload_bytes: the whole tar in memory, when it is; payload is hashed from it directly.
        limits: member count and byte limits of the tar reader (default: its defaults);
            ``max_members`` is also the bag's budget of manifest entries (:class:`BagValidator`).
        stop_at_refused: raise the reader's :class:`~packhorse.errors.UnsafePathError` at the
            first refused member instead of reporting it and reading on: what packhorse's own
            readers ask for, so that nothing after a hostile member reaches ``on_payload`` (a
            refused input is refused whole, DESIGN.md I6).

    Members come from packhorse's one tar reader (:func:`packhorse.bags.extraction.members_of`):
    a member it refuses (a link, a device, a duplicate, ``..``...) is an ``unsafe-member``
    problem and is skipped; a limit exceeded is one too, and ends the reading.

    Returns:
        (report, bag_dir): the report, and the tar's top folder name ("" when it has none).
        A damaged tar or a non-tar is a report with a problem, not an error.
    """
    v = BagValidator(bag, required_algorithms=tuple(required_algorithms) + (("sha256",) if on_payload else ()),
                     max_manifest_entries=(limits or DEFAULT_LIMITS).max_members)
    bag_dir: str | None = None
    seekable = _seekable(fileobj)
    members: dict[str, tarfile.TarInfo] = {}
    try:
        base: BinaryIO = fileobj if seekable else ForwardOnly(fileobj)  # type: ignore[assignment]
        tar = open_tar(base, source=bag)
    except VerificationError as e:
        v.unusable("not-a-bag-container", str(e).removeprefix(f"{bag}: "))
        return v.finish(), ""

    def refused(e: UnsafePathError) -> None:
        if stop_at_refused:
            raise e
        v.problem("unsafe-member", e.path or "", str(e).removeprefix(f"{bag}: "))

    with tar:
        try:
            reader = members_of(tar, source=bag, limits=limits or DEFAULT_LIMITS, step="unpack", on_refused=refused)
            while True:
                try:
                    m = next(reader)
                except StopIteration:
                    break
                except UnsafePathError as e:  # a limit: reading stops here
                    refused(e)
                    break
                member, name = m.info, m.name
                top, sep, rest = name.partition("/")
                if not sep and not m.is_dir:  # a file at the top: it names no bag folder
                    v.problem("not-a-bag-container", name, f"member {quoted(name)} is at the top of the tar, not inside "
                              "a bag folder (a bag tar holds one folder, the bag, with bagit.txt in it)")
                    continue
                if bag_dir is None:
                    bag_dir = top
                if top != bag_dir:
                    refused(UnsafePathError(f"{bag}: member {quoted(name)} is outside the bag folder {quoted(bag_dir)}",
                                            path=name))
                    continue
                if m.is_dir:
                    if rest:
                        v.add_directory(rest)
                    continue
                if not rest:
                    v.problem("not-a-bag-container", name, f"member {quoted(name)} is not inside a bag folder")
                    continue
                if rest.startswith("data/") and (on_payload is not None or payload_bytes is not None):
                    _payload_member(v, lambda: _data(tar, base, member), member, rest, on_payload, payload_bytes,
                                    seekable)
                elif rest.startswith("data/"):
                    v.add(rest, member.size, _data(tar, base, member))
                else:
                    f = m.data
                    assert f is not None
                    v.add(rest, member.size, f)
                if seekable:
                    members[rest] = member
        except tarfile.TarError as e:
            v.problem("not-a-bag-container", "", f"damaged tar: {e}")
        except (EOFError, io.UnsupportedOperation) as e:
            v.problem("truncated", "", f"damaged tar: {e}")
        need = v.rehash_needed()
        if need and seekable:
            for path in need:
                if path in members:
                    f = tar.extractfile(members[path])
                    assert f is not None
                    v.rehash(path, f)  # type: ignore[arg-type]
    return v.finish(), bag_dir or ""


class _Window(io.RawIOBase):
    """The data of one (non-sparse) tar member, read straight from the archive at the offset the
    tar reader gives (``offset_data``, ``size``): :mod:`tarfile`'s own member stream copies every
    block once more, which costs a fifth of hashlib's sha256 speed. Seekable within the member
    when the archive is (a file), not when it is a :class:`ForwardOnly` stream."""

    def __init__(self, base: BinaryIO, offset: int, size: int) -> None:
        self._base, self._offset, self._size = base, offset, size
        self._pos = 0
        self._random = not isinstance(base, ForwardOnly)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._random

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            offset += self._pos
        elif whence == io.SEEK_END:
            offset += self._size
        if not self._random and offset < self._pos:
            raise io.UnsupportedOperation("a member of a stream cannot seek back")
        self._pos = max(0, min(offset, self._size))
        return self._pos

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(b), self._size - self._pos)
        if n <= 0:
            return 0
        self._base.seek(self._offset + self._pos)
        got = self._base.readinto(memoryview(b)[:n]) or 0  # type: ignore[attr-defined]
        self._pos += got
        return got


def _data(tar: tarfile.TarFile, base: BinaryIO, member: tarfile.TarInfo) -> BinaryIO:
    """The data stream of a regular payload member (see :class:`_Window`)."""
    if member.sparse is None and hasattr(base, "readinto"):
        # a small buffer for small reads; reads of CHUNK_BYTES go straight into the caller's buffer
        return io.BufferedReader(_Window(base, member.offset_data, member.size), 64 << 10)  # type: ignore[return-value]
    f = tar.extractfile(member)
    assert f is not None
    return f  # type: ignore[return-value]


def _payload_member(v: BagValidator, open_data: Callable[[], BinaryIO], member: tarfile.TarInfo, rest: str,
                    on_payload: Callable[[str, int, BinaryIO], str] | None,
                    payload_bytes: memoryview | None, seekable: bool) -> None:
    """Hash (or hand to ``on_payload``) one payload member; ``open_data()`` gives its data
    stream, opened only when the bytes are not already in ``payload_bytes`` (a stream costs a
    64 KiB buffer, per member of a bag of thousands of small files)."""
    if not v.admit_payload(rest):
        return
    algs = v.payload_algorithms_for(rest)
    if payload_bytes is not None and member.sparse is None:
        end = member.offset_data + member.size
        if end > len(payload_bytes):
            v.problem("truncated", rest, f"damaged tar: {quoted(rest)} ends after the archive")
            return
        v.add_payload_digests(rest, member.size, v._hash_bytes(payload_bytes[member.offset_data:end], algs))
        return
    raw = open_data()
    if on_payload is None or v.payload_listed(rest) is False:
        size, digests = hash_stream(raw, algs)  # type: ignore[arg-type]
        v.add_payload_digests(rest, size, digests, declared_size=member.size)
        return
    others = [a for a in algs if a != "sha256"]
    # with nothing else to hash the consumer gets the member's own stream (seekable in a
    # seekable tar, which unpack uses to re-read a large raw package in place)
    # (a stream read through ForwardOnly must not look seekable to the consumer: it is not)
    reader = _Counted(raw) if seekable and not others else _HashingReader(raw, others)  # type: ignore[arg-type]
    sha256 = on_payload(rest[len("data/"):], member.size, reader.stream)  # type: ignore[arg-type]
    if raw.read(1):
        v.problem("unreadable", rest, f"payload file {quoted(rest)} was not read to its end")
        hash_stream(raw, ())  # type: ignore[arg-type]
    v.add_payload_digests(rest, reader.size, {**reader.digests(), "sha256": sha256}, declared_size=member.size)


class _Counted:
    """A member stream handed on as it is; its size is the member's (checked read to the end)."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream

    @property
    def size(self) -> int:
        return self.stream.tell()

    def digests(self) -> dict[str, str]:
        return {}


class _HashingReader:
    """Hands ``stream`` on to a consumer, hashing what it reads with ``algorithms``."""

    def __init__(self, stream: BinaryIO, algorithms: Iterable[str]) -> None:
        self.stream = self
        self._stream = stream
        self._hashes = list(_new_hashes(algorithms).values())
        self._names = sorted(set(algorithms) & set(DIGEST_HEX_LENGTH))
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n)
        self._seen(data)
        return data

    def readinto(self, b: bytearray | memoryview) -> int:
        n = self._stream.readinto(b)  # type: ignore[attr-defined]
        if n:
            self._seen(memoryview(b)[:n])
        return n or 0

    def _seen(self, data: bytes | memoryview) -> None:
        for h in self._hashes:
            h.update(data)
        self.size += len(data)

    def digests(self) -> dict[str, str]:
        return {a: h.hexdigest() for a, h in zip(self._names, self._hashes)}


class ForwardOnly(io.RawIOBase):
    """A non-seekable stream (a pipe, an HTTP body) seen as seekable forwards only.

    :mod:`tarfile` reads a seekable archive with one copy per block, a stream (``r|``) with
    about four (docs/benchmarks.md: a stream validated at a third of hashlib's speed); its
    random-access mode only ever seeks forwards when a tar is read front to back, so this
    adapter serves such a seek by reading on. A backward seek raises
    :class:`io.UnsupportedOperation` (an ``OSError``); a damaged tar may ask for one.
    """

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            offset += self._pos
        elif whence != io.SEEK_SET:
            raise io.UnsupportedOperation("a stream cannot seek from its end")
        if offset < self._pos:
            raise io.UnsupportedOperation(f"a stream cannot seek back from byte {self._pos} to {offset}")
        while self._pos < offset:
            data = self._stream.read(min(offset - self._pos, CHUNK_BYTES))
            if not data:
                break
            self._pos += len(data)
        return self._pos

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        readinto = getattr(self._stream, "readinto", None)
        if readinto is not None:
            n = readinto(b) or 0
        else:
            data = self._stream.read(len(b))
            n = len(data)
            memoryview(b)[:n] = data
        self._pos += n
        return n

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n)
        self._pos += len(data)
        return data


def _seekable(stream: BinaryIO) -> bool:
    try:
        return bool(stream.seekable())
    except (AttributeError, OSError, ValueError):
        return False


def validate_path(path: Path, *, required_algorithms: Iterable[str] = (),
                  limits: ExtractionLimits | None = None) -> BagReport:
    """Validate a bag folder or a bag tar at ``path`` (what ``packhorse validate`` runs).
    ``limits``: ``[extraction]`` of the configuration in use (default :data:`DEFAULT_LIMITS`):
    a tar's member caps, and the manifests' entry budget (``max_members``) of either form."""
    limits = limits or DEFAULT_LIMITS
    if path.is_symlink():
        v = BagValidator(str(path))
        v.unusable("symlink", f"is a symlink (to {quoted(os.readlink(path))}); links are not followed")
        return v.finish()
    if path.is_dir():
        if not os.path.lexists(path / "bagit.txt"):
            # a folder holding bags (an extracted tar's parent, say): name them, do not report
            # every file of theirs as outside a bag
            inner = sorted(e.name for e in os.scandir(path) if e.is_dir(follow_symlinks=False)
                           and os.path.isfile(os.path.join(e.path, "bagit.txt")))
            if inner:
                v = BagValidator(str(path))
                v.unusable("not-a-bag-container",
                           f"has no bagit.txt: it is not a bag but holds {len(inner)} ("
                           + ", ".join(inner[:5]) + (", …" if len(inner) > 5 else "")
                           + f"); validate each: packhorse validate {path / inner[0]}")
                return v.finish()
        return validate_folder(path, required_algorithms=required_algorithms,
                               max_manifest_entries=limits.max_members)
    try:
        f = open(path, "rb")
    except OSError as e:
        v = BagValidator(str(path))
        v.unusable("unreadable", f"cannot open: {e.strerror}")
        return v.finish()
    with f:
        return validate_tar(f, bag=str(path), required_algorithms=required_algorithms, limits=limits)[0]
