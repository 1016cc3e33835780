"""BagIt tars: deterministic writing, validation by GNU tar + the reference ``bagit`` library,
verified reading, refusal of unsafe or inconsistent tars, safe extraction (I3, I4, I6)."""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

import bagit
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packhorse.bags.extraction import extract_tar
from packhorse.bags.packaging import (
    PayloadFile,
    decode_manifest_path,
    encode_manifest_path,
    read_bag_bytes,
    read_bag_tar,
    write_bag_tar,
)
from packhorse.errors import SourceChangedError, SourceMissingError, UnsafePathError, VerificationError

MTIME = 1_700_000_000
TRICKY: dict[str, bytes] = {
    "plain.txt": b"hello world\n",
    "obs 0001/scan with spaces.dat": b"\x00\x01\x02" * 1000,
    "Köln/µ-wave ☃ naïve.fits": "Ünïcødé payload".encode(),
    "line\nbreak.txt": b"a name with a newline",
    "100%/done 50%.txt": b"percent",
    "empty.bin": b"",
    "sub/empty-too": b"",
    ("deep/" * 25) + "long-name-" + "x" * 60 + ".dat": b"long path" * 10,  # > 100 chars
}


def make_payload(folder: Path, payload: dict[str, bytes], mtime: int = MTIME) -> list[PayloadFile]:
    """Write ``payload`` under ``folder`` and describe it as registered PayloadFiles."""
    files = []
    for rel, data in payload.items():
        p = folder / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        files.append(PayloadFile(path=rel, size=len(data), sha256=hashlib.sha256(data).hexdigest(), mtime=mtime,
                                 open=(lambda p=p: open(p, "rb"))))
    return files


def build(files: list[PayloadFile], *, bag_dir: str = "pkg", info: dict[str, str] | None = None) -> bytes:
    out = io.BytesIO()
    write_bag_tar(out, bag_dir=bag_dir, files=files, bag_info=info or {"Packhorse-Group": "instr/ou1"},
                  bagging_date="2024-05-06", external_identifier="instr/ou1", tag_mtime=MTIME)
    return out.getvalue()


@pytest.fixture
def tricky(tmp_path: Path) -> list[PayloadFile]:
    return make_payload(tmp_path / "src", TRICKY)


# ------------------------------------------------------------------------------ writing


def test_two_builds_are_byte_identical(tmp_path: Path, tricky: list[PayloadFile]) -> None:
    first = build(tricky)
    # a second copy of the sources, written later (other file-system mtimes), given in reverse order
    other = make_payload(tmp_path / "copy", TRICKY)
    for f in other:
        os.utime(tmp_path / "copy" / f.path, (MTIME + 999, MTIME + 999))
    second = build(list(reversed(other)))
    assert first == second
    assert hashlib.sha256(first).hexdigest() == hashlib.sha256(build(tricky)).hexdigest()


def test_tar_members_are_sorted_owned_by_root_with_recorded_mtime(tricky: list[PayloadFile]) -> None:
    with tarfile.open(fileobj=io.BytesIO(build(tricky))) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names[:4] == ["pkg/bagit.txt", "pkg/bag-info.txt", "pkg/manifest-sha256.txt", "pkg/tagmanifest-sha256.txt"]
    payload = [n.removeprefix("pkg/data/") for n in names[4:]]
    assert payload == sorted(TRICKY, key=lambda p: p.encode())
    for m in members:
        assert (m.uid, m.gid, m.uname, m.gname, m.mode, m.mtime) == (0, 0, "", "", 0o644, MTIME)
        assert m.isreg()


def test_different_metadata_gives_different_bytes(tricky: list[PayloadFile]) -> None:
    # determinism is not constancy: the bag-info is part of the bytes
    assert build(tricky) != build(tricky, info={"Packhorse-Group": "instr/ou2"})


def _tarfile_build(files: list[PayloadFile], *, bag_dir: str = "pkg", info: dict[str, str] | None = None) -> bytes:
    """The same bag written by :mod:`tarfile` in PAX format, the way packhorse wrote every bag
    before its own tar writer: the bytes every existing package holds."""
    from packhorse.bags.packaging import bag_tag_files

    def ti(name: str, size: int, mtime: int) -> tarfile.TarInfo:
        t = tarfile.TarInfo(name)
        t.size, t.mtime, t.mode, t.uid, t.gid, t.uname, t.gname = size, mtime, 0o644, 0, 0, "", ""
        return t

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in bag_tag_files(files, bag_info=info or {"Packhorse-Group": "instr/ou1"},
                                        bagging_date="2024-05-06", external_identifier="instr/ou1"):
            tar.addfile(ti(f"{bag_dir}/{name}", len(data), MTIME), io.BytesIO(data))
        for pf in sorted(files, key=lambda f: f.path.encode()):
            with pf.open() as src:
                tar.addfile(ti(f"{bag_dir}/data/{pf.path}", pf.size, pf.mtime), src)
    return out.getvalue()


def test_bags_are_byte_identical_to_the_tarfile_pax_writer(tricky: list[PayloadFile]) -> None:
    # packages built by earlier versions (tarfile's writer) must be rebuilt to the same bytes (I3)
    assert build(tricky) == _tarfile_build(tricky)


_NAMES = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126, blacklist_characters="/"), min_size=1,
            max_size=120),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"), min_size=1,
            max_size=40),
).filter(lambda n: n not in (".", ".."))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.lists(st.tuples(_NAMES, st.sampled_from([0, 1, 511, 512, 513, 65536, 65537, (1 << 20) + 3]),
                                  st.sampled_from([0, 1, MTIME, 8 ** 11 - 1, 8 ** 11, 2 ** 40])),
                        min_size=1, max_size=4, unique_by=lambda e: e[0]))
def test_any_member_is_written_as_tarfile_writes_it(tmp_path: Path, entries: list[tuple[str, int, int]]) -> None:
    # names past 100 bytes or not ASCII, sizes around the block and one-write limits, mtimes
    # beyond 11 octal digits (a PAX extended header): each as tarfile writes it
    files = []
    for i, (name, size, mtime) in enumerate(entries):
        data = bytes([i + 1]) * size
        files.append(PayloadFile(path=name, size=size, sha256=hashlib.sha256(data).hexdigest(), mtime=mtime,
                                 open=(lambda data=data: io.BytesIO(data))))
    assert build(files) == _tarfile_build(files)


def test_a_source_that_returns_short_reads_is_read_to_its_end(tmp_path: Path) -> None:
    data = b"0123456789" * 500

    class Trickle(io.BytesIO):
        def read(self, n: int | None = -1) -> bytes:  # type: ignore[override]
            return super().read(min(7, len(data) if n is None or n < 0 else n))

    pf = PayloadFile(path="f", size=len(data), sha256=hashlib.sha256(data).hexdigest(), mtime=MTIME,
                     open=lambda: Trickle(data))
    with tarfile.open(fileobj=io.BytesIO(build([pf]))) as tar:
        assert tar.extractfile("pkg/data/f").read() == data  # type: ignore[union-attr]


def _extract_independently(tmp_path: Path, data: bytes) -> Path:
    """Extract a bag tar packhorse built with a reader that is not packhorse's (the standard
    library's, on this trusted input; GNU tar reads every archived bag in the e2e tests)."""
    out = tmp_path / "out"
    out.mkdir()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(out, filter="data")
    return out / "pkg"


#: Names the reference ``bagit`` library reads back: every name except those holding a
#: literal ``%0A``/``%0D``/``%25`` sequence, which packhorse encodes as RFC 8493 §2.1.3 says and
#: bagit-python does not decode (LibraryOfCongress/bagit-python#157); see
#: ``encode_manifest_path``.
AMBIGUOUS = re.compile(r"%(0A|0D|25)", re.IGNORECASE)
BAGIT_SAFE = {p: d for p, d in TRICKY.items() if not AMBIGUOUS.search(p)}


def test_gnu_tar_extraction_validates_with_reference_bagit(tmp_path: Path) -> None:
    root = _extract_independently(tmp_path, build(make_payload(tmp_path / "src", BAGIT_SAFE)))
    bag = bagit.Bag(str(root))
    bag.validate()  # raises bagit.BagValidationError on any problem
    assert bag.info["External-Identifier"] == "instr/ou1"
    assert bag.info["Payload-Oxum"] == f"{sum(map(len, BAGIT_SAFE.values()))}.{len(BAGIT_SAFE)}"
    assert bag.info["Bagging-Date"] == "2024-05-06"
    assert bag.info["Packhorse-Group"] == "instr/ou1"
    for rel, data in BAGIT_SAFE.items():
        assert (root / "data" / rel).read_bytes() == data
        assert int((root / "data" / rel).stat().st_mtime) == MTIME
    assert sorted(bag.payload_files()) == sorted(f"data/{p}" for p in BAGIT_SAFE)


def test_gnu_tar_extracts_percent_names_byte_exact(tmp_path: Path) -> None:
    files = make_payload(tmp_path / "src", {"100%/done 50%.txt": b"percent", "a%0Ab": b"literal"})
    bag = _extract_independently(tmp_path, build(files))
    assert (bag / "data" / "100%" / "done 50%.txt").read_bytes() == b"percent"
    assert (bag / "data" / "a%0Ab").read_bytes() == b"literal"
    manifest = (bag / "manifest-sha256.txt").read_text()
    # a plain '%' stays readable by bagit-python; an ambiguous sequence is encoded (RFC 8493 §2.1.3)
    assert "data/100%/done 50%.txt" in manifest and "data/a%250Ab" in manifest


def test_plain_percent_names_validate_with_reference_bagit(tmp_path: Path) -> None:
    files = make_payload(tmp_path / "src", {"100%.txt": b"percent", "50% done/x%y.fits": b"half"})
    bagit.Bag(str(_extract_independently(tmp_path, build(files)))).validate()


@pytest.mark.xfail(strict=True, raises=bagit.BagValidationError,
                   reason="bagit-python does not decode %25 (LibraryOfCongress/bagit-python#157): a name holding a "
                          "literal '%0A'/'%0D'/'%25' must be encoded per RFC 8493 and the reference library rejects it")
def test_ambiguous_percent_names_do_not_validate_with_reference_bagit(tmp_path: Path) -> None:
    files = make_payload(tmp_path / "src", {"a%0Ab.txt": b"literal"})
    bagit.Bag(str(_extract_independently(tmp_path, build(files)))).validate()


def test_reference_bagit_detects_a_corrupted_extracted_payload(tmp_path: Path) -> None:
    # guard for the test above: the validation really reads the payload
    bag = _extract_independently(tmp_path, build(make_payload(tmp_path / "src", BAGIT_SAFE)))
    (bag / "data" / "plain.txt").write_bytes(b"hello World\n")
    with pytest.raises(bagit.BagValidationError, match="plain.txt"):
        bagit.Bag(str(bag)).validate()


def test_source_with_other_sha256_raises_source_changed(tmp_path: Path) -> None:
    files = make_payload(tmp_path, {"a.txt": b"aaaa", "b.txt": b"bbbb"})
    (tmp_path / "b.txt").write_bytes(b"BBBB")  # same size, other bytes
    with pytest.raises(SourceChangedError) as ei:
        build(files)
    assert "'b.txt'" in str(ei.value) and files[1].sha256 in str(ei.value)
    assert ei.value.path == "b.txt" and ei.value.side == "source"


def test_source_with_other_size_raises_source_changed(tmp_path: Path) -> None:
    files = make_payload(tmp_path, {"a.txt": b"aaaa", "grown.txt": b"bbbb"})
    (tmp_path / "grown.txt").write_bytes(b"bbbbb")
    with pytest.raises(SourceChangedError, match=r"'grown.txt' is 5 bytes, registered with 4") as ei:
        build(files)
    assert ei.value.path == "grown.txt"


def test_missing_source_raises_source_missing(tmp_path: Path) -> None:
    files = make_payload(tmp_path, {"gone.txt": b"x"})
    (tmp_path / "gone.txt").unlink()
    with pytest.raises(SourceMissingError, match="'gone.txt'"):
        build(files)


def test_source_stream_without_a_file_descriptor(tmp_path: Path) -> None:
    # a backend may hand out streams that are not OS files (BytesIO, an HTTP body)
    data = b"in memory"
    pf = PayloadFile(path="m.bin", size=len(data), sha256=hashlib.sha256(data).hexdigest(), mtime=MTIME,
                     open=lambda: io.BytesIO(data))
    disk = make_payload(tmp_path, {"m.bin": data})
    assert build([pf]) == build(disk)
    short = PayloadFile(path="m.bin", size=len(data) + 3, sha256=pf.sha256, mtime=MTIME, open=lambda: io.BytesIO(data))
    with pytest.raises(SourceChangedError, match="'m.bin'"):
        build([short])


def test_unsafe_bag_dir_is_refused(tricky: list[PayloadFile]) -> None:
    for bad in ("", "..", "a/b"):
        with pytest.raises(UnsafePathError):
            build(tricky, bag_dir=bad)


@pytest.mark.parametrize("name", ["plain", "line\nfeed", "carriage\rreturn", "100%", "%0A literal", "%250A", "%%0D"])
def test_manifest_path_encoding_round_trips(name: str) -> None:
    enc = encode_manifest_path(name)
    assert "\n" not in enc and "\r" not in enc
    assert decode_manifest_path(enc) == name


# ------------------------------------------------------------------------------ reading

Member = tuple[tarfile.TarInfo, bytes | None]


def members_of(data: bytes) -> list[Member]:
    out: list[Member] = []
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar.getmembers():
            f = tar.extractfile(m) if m.isreg() else None
            out.append((m, f.read() if f else None))
    return out


def retar(members: list[Member]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for m, data in members:
            if data is not None:
                m.size = len(data)
            tar.addfile(m, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def reg(name: str, data: bytes) -> Member:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    return ti, data


def read(data: bytes) -> object:
    """Both readers of a bag tar (a stream, and the bytes in memory that unpack uses for raw
    packages) must come to the same: the same contents, or an error of the same kind."""
    try:
        contents = read_bag_tar(io.BytesIO(data), source="buf:pkg.tar")
    except Exception as e:
        with pytest.raises(type(e)):
            read_bag_bytes(data, source="buf:pkg.tar")
        raise
    assert read_bag_bytes(data, source="buf:pkg.tar") == contents
    return contents


@pytest.fixture
def good(tmp_path: Path) -> bytes:
    return build(make_payload(tmp_path, {"a.txt": b"alpha", "dir/b.txt": b"beta", "z.txt": b"zeta"}))


def test_read_accepts_a_good_tar(good: bytes) -> None:
    seen: dict[str, bytes] = {}

    def keep(path: str, size: int, stream) -> str:  # type: ignore[no-untyped-def]
        seen[path] = stream.read()
        return hashlib.sha256(seen[path]).hexdigest()

    contents = read_bag_tar(io.BytesIO(good), source="x", on_payload=keep)
    assert contents.bag_dir == "pkg"
    assert contents.files == {p: hashlib.sha256(d).hexdigest()
                              for p, d in {"a.txt": b"alpha", "dir/b.txt": b"beta", "z.txt": b"zeta"}.items()}
    assert contents.bag_info["External-Identifier"] == "instr/ou1"
    assert contents.bag_info["Payload-Oxum"] == "13.3"
    assert seen == {"a.txt": b"alpha", "dir/b.txt": b"beta", "z.txt": b"zeta"}


def test_read_checks_the_digest_the_payload_consumer_returns(good: bytes) -> None:
    # the consumer hashes what it copied; a copy that went wrong must fail the manifest check
    def bad_copy(path: str, size: int, stream) -> str:  # type: ignore[no-untyped-def]
        data = stream.read()
        return hashlib.sha256(data + (b"!" if path == "dir/b.txt" else b"")).hexdigest()

    with pytest.raises(VerificationError, match="'data/dir/b.txt' has sha256"):
        read_bag_tar(io.BytesIO(good), source="x", on_payload=bad_copy)


def test_read_refuses_a_consumer_that_stops_early(good: bytes) -> None:
    with pytest.raises(VerificationError, match="not read to its end"):
        read_bag_tar(io.BytesIO(good), source="x", on_payload=lambda p, n, f: hashlib.sha256(f.read(2)).hexdigest())


@pytest.mark.parametrize("seekable", [True, False])
def test_read_works_on_streams_and_seekable_files(good: bytes, seekable: bool) -> None:
    class Stream(io.RawIOBase):
        def __init__(self, data: bytes) -> None:
            self._b = io.BytesIO(data)

        def readable(self) -> bool:
            return True

        def seekable(self) -> bool:
            return False

        def readinto(self, b) -> int:  # type: ignore[no-untyped-def]
            data = self._b.read(len(b))
            b[:len(data)] = data
            return len(data)

    src = io.BytesIO(good) if seekable else io.BufferedReader(Stream(good))
    assert set(read_bag_tar(src, source="x").files) == {"a.txt", "dir/b.txt", "z.txt"}


def test_read_accepts_the_tricky_names(tricky: list[PayloadFile]) -> None:
    contents = read_bag_tar(io.BytesIO(build(tricky)), source="x")
    assert contents.files == {p: hashlib.sha256(d).hexdigest() for p, d in TRICKY.items()}


def test_read_accepts_directory_members(good: bytes) -> None:
    ms = members_of(good)
    d = tarfile.TarInfo("pkg/data/dir")
    d.type = tarfile.DIRTYPE
    assert read(retar([*ms[:4], (d, None), *ms[4:]])).files.keys() == {"a.txt", "dir/b.txt", "z.txt"}  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["../x", "pkg/../../x", "pkg/data/../../x"])
def test_read_rejects_dotdot_member(good: bytes, name: str) -> None:
    ms = members_of(good)
    with pytest.raises(UnsafePathError) as ei:
        read(retar([*ms, reg(name, b"evil")]))
    assert repr(name) in str(ei.value)
    with pytest.raises(UnsafePathError, match=repr(name).replace(".", r"\.")):
        read(retar([reg(name, b"evil"), *ms]))  # first member too


def test_read_rejects_absolute_member(good: bytes) -> None:
    ms = members_of(good)
    with pytest.raises(UnsafePathError, match="refused tar member '/etc/x': has an absolute name"):
        read(retar([*ms[:4], reg("/etc/x", b"evil"), *ms[4:]]))


def test_read_rejects_symlink_member(good: bytes) -> None:
    ms = members_of(good)
    link = tarfile.TarInfo("pkg/data/link")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc/passwd"
    with pytest.raises(UnsafePathError, match=r"'pkg/data/link': is a symbolic link \(to '/etc/passwd'\)"):
        read(retar([*ms, (link, None)]))


def test_read_rejects_hardlink_member(good: bytes) -> None:
    ms = members_of(good)
    link = tarfile.TarInfo("pkg/data/hard")
    link.type = tarfile.LNKTYPE
    link.linkname = "pkg/data/a.txt"
    with pytest.raises(UnsafePathError, match="'pkg/data/hard': is a hard link"):
        read(retar([*ms, (link, None)]))


def test_read_rejects_device_member(good: bytes) -> None:
    ms = members_of(good)
    dev = tarfile.TarInfo("pkg/data/null")
    dev.type = tarfile.CHRTYPE
    with pytest.raises(UnsafePathError, match="'pkg/data/null': is a character device"):
        read(retar([*ms, (dev, None)]))


def test_read_rejects_member_outside_the_bag_folder(good: bytes) -> None:
    ms = members_of(good)
    with pytest.raises(UnsafePathError, match="'other/data/a.txt' is outside the bag folder 'pkg'"):
        read(retar([*ms, reg("other/data/a.txt", b"alpha")]))


def test_read_rejects_payload_not_in_manifest(good: bytes) -> None:
    ms = members_of(good)
    with pytest.raises(VerificationError, match="payload file 'data/extra.txt' is not in manifest-sha256.txt") as ei:
        read(retar([*ms, reg("pkg/data/extra.txt", b"")]))
    assert ei.value.path == "data/extra.txt"


def test_read_rejects_manifest_entry_without_payload(good: bytes) -> None:
    ms = [m for m in members_of(good) if m[0].name != "pkg/data/dir/b.txt"]
    with pytest.raises(VerificationError, match="manifest-sha256.txt lists 'data/dir/b.txt', which is not in the bag"):
        read(retar(ms))


def test_read_rejects_corrupted_payload_byte(good: bytes) -> None:
    ms = members_of(good)
    i = next(i for i, (m, _) in enumerate(ms) if m.name == "pkg/data/dir/b.txt")
    ms[i] = (ms[i][0], b"bEta")
    with pytest.raises(VerificationError, match="payload file 'data/dir/b.txt' has sha256 ") as ei:
        read(retar(ms))
    assert hashlib.sha256(b"beta").hexdigest() in str(ei.value)


def test_read_rejects_a_flipped_byte_in_the_tar_stream(good: bytes) -> None:
    raw = bytearray(good)
    at = raw.index(b"alpha")
    raw[at] ^= 0x01
    with pytest.raises(VerificationError, match="'data/a.txt' has sha256"):
        read(bytes(raw))


def _with_tag(ms: list[Member], name: str, data: bytes, *, fix_tagmanifest: bool) -> list[Member]:
    out = [(m, data if m.name == f"pkg/{name}" else d) for m, d in ms]
    if fix_tagmanifest:
        tags = {m.name.removeprefix("pkg/"): d for m, d in out
                if m.name.removeprefix("pkg/") in ("bagit.txt", "bag-info.txt", "manifest-sha256.txt")}
        tm = "".join(f"{hashlib.sha256(d).hexdigest()}  {n}\n" for n, d in tags.items()).encode()  # type: ignore[arg-type]
        out = [(m, tm if m.name == "pkg/tagmanifest-sha256.txt" else d) for m, d in out]
    return out


def test_read_rejects_wrong_payload_oxum(good: bytes) -> None:
    ms = members_of(good)
    info = next(d for m, d in ms if m.name == "pkg/bag-info.txt")
    assert info is not None and b"Payload-Oxum: 13.3\n" in info
    bad = info.replace(b"Payload-Oxum: 13.3", b"Payload-Oxum: 14.3")
    with pytest.raises(VerificationError, match=r"Payload-Oxum '14\.3' but payload is 13\.3"):
        read(retar(_with_tag(ms, "bag-info.txt", bad, fix_tagmanifest=True)))


def test_read_rejects_tag_file_not_matching_tagmanifest(good: bytes) -> None:
    ms = members_of(good)
    info = next(d for m, d in ms if m.name == "pkg/bag-info.txt")
    assert info is not None
    with pytest.raises(VerificationError, match="tag file 'bag-info.txt' has sha256 [0-9a-f]{64}, tagmanifest-sha256.txt says"):
        read(retar(_with_tag(ms, "bag-info.txt", info + b"Extra: 1\n", fix_tagmanifest=False)))


def test_read_rejects_missing_tag_file(good: bytes) -> None:
    ms = [m for m in members_of(good) if m[0].name != "pkg/bagit.txt"]
    with pytest.raises(VerificationError, match="the bag has no bagit.txt"):
        read(retar(ms))


def test_read_accepts_payload_before_the_manifest_and_still_checks_it(good: bytes) -> None:
    # RFC 8493 sets no member order; a payload file read before its manifest is hashed anyway
    ms = members_of(good)
    assert ms[4][0].name == "pkg/data/a.txt"
    assert read(retar([ms[4], *ms[:4], *ms[5:]])).files == read(good).files  # type: ignore[attr-defined]
    with pytest.raises(VerificationError, match="'data/a.txt' has sha256"):
        read(retar([(ms[4][0], b"alphA"), *ms[:4], *ms[5:]]))


def test_read_rejects_duplicate_payload(good: bytes) -> None:
    ms = members_of(good)
    with pytest.raises(UnsafePathError, match="'pkg/data/a.txt': appears twice"):
        read(retar([*ms, reg("pkg/data/a.txt", b"alpha")]))


def test_read_rejects_a_non_tar_and_a_truncated_tar(good: bytes) -> None:
    with pytest.raises(VerificationError, match="buf:pkg.tar"):
        read(b"this is not a tar archive at all" * 40)
    with pytest.raises(VerificationError):
        read(good[: len(good) // 2])


# ---------------------------------------------------------------------------- extraction
# (every refusal on every path: tests/unit/test_extraction.py)


def test_extract_tar_extracts_a_good_tar(tmp_path: Path, tricky: list[PayloadFile]) -> None:
    target = tmp_path / "t"
    names = extract_tar(io.BytesIO(build(tricky)), target, source="x")
    assert len(names) == 4 + len(TRICKY)
    for rel, data in TRICKY.items():
        assert (target / "pkg" / "data" / rel).read_bytes() == data
    safe = tmp_path / "safe"
    extract_tar(io.BytesIO(build(make_payload(tmp_path / "src2", BAGIT_SAFE))), safe, source="x")
    bagit.Bag(str(safe / "pkg")).validate()


# ------------------------------------------------------------------------------ property

_component = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"), min_size=1, max_size=12,
).filter(lambda c: c not in (".", ".."))
_path = st.lists(_component, min_size=1, max_size=4).map("/".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def _could_be_on_disk(payload: dict[str, bytes]) -> bool:
    """No path is also the folder of another (``0`` and ``0/0``): no file system holds both, so
    no scan can hand such a payload to the packager (the reader refuses such a tar:
    tests/unit/test_extraction.py)."""
    return not any(q.startswith(p + "/") for p in payload for q in payload)


@given(payload=st.dictionaries(_path, st.binary(max_size=300), min_size=1, max_size=6).filter(_could_be_on_disk))
def test_write_then_read_round_trips_the_manifest(tmp_path_factory: pytest.TempPathFactory,
                                                  payload: dict[str, bytes]) -> None:
    folder = tmp_path_factory.mktemp("prop")
    files = [PayloadFile(path=p, size=len(d), sha256=hashlib.sha256(d).hexdigest(), mtime=MTIME,
                         open=_opener(folder, i, d)) for i, (p, d) in enumerate(payload.items())]
    data = build(files)
    contents = read_bag_tar(io.BytesIO(data), source="prop")
    assert read_bag_bytes(data, source="prop") == contents
    assert contents.files == {p: hashlib.sha256(d).hexdigest() for p, d in payload.items()}
    assert contents.bag_info["Payload-Oxum"] == f"{sum(map(len, payload.values()))}.{len(payload)}"
    assert build(files) == data
    shutil.rmtree(folder)


def _opener(folder: Path, i: int, data: bytes) -> Callable[[], io.BufferedReader]:
    p = folder / f"{i}.bin"
    p.write_bytes(data)
    return lambda: open(p, "rb")


def test_a_package_name_and_group_with_a_line_break_make_a_valid_bag(tmp_path: Path) -> None:
    # an observation unit's folder named with a newline (instruments name folders as they like)
    # used to fail the build ("bag-info value may not contain a newline") and was retried forever
    name = "cam14/obs\nnl"
    out = io.BytesIO()
    write_bag_tar(out, bag_dir="pkg", files=make_payload(tmp_path / "src", BAGIT_SAFE),
                  bag_info={"Packhorse-Group": name}, bagging_date="2024-05-06", external_identifier=name,
                  tag_mtime=MTIME)
    contents = read_bag_tar(io.BytesIO(out.getvalue()), source="test")
    assert contents.bag_info["External-Identifier"] == "cam14/obs%0Anl"
    assert contents.bag_info["Packhorse-Group"] == "cam14/obs%0Anl"
    assert decode_manifest_path(contents.bag_info["External-Identifier"]) == name
    root = _extract_independently(tmp_path, out.getvalue())
    bag = bagit.Bag(str(root))
    bag.validate()
    assert bag.info["External-Identifier"] == "cam14/obs%0Anl"
    # a name without a line break is written as it always was (bags built before: I3)
    assert b"External-Identifier: instr/ou1\n" in build(make_payload(tmp_path / "src2", BAGIT_SAFE))
