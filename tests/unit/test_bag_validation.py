"""Bag validation to RFC 8493 on a corpus built here: bags the reference ``bagit`` library writes
with each algorithm, several at once, BagIt 1.0 and 0.97, and one invalid bag per refusal rule;
each as a folder, as a tar in sorted order (payload before the manifests), as a tar with the tag
files first, and as a non-seekable tar stream. Where bagit-python's verdict differs, the test
asserts that too; docs/bags.md keeps the table with the RFC clause that decides."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import bagit
import pytest

from packhorse.bags.extraction import extract_tar
from packhorse.bags.packaging import PayloadFile, read_bag_bytes, read_bag_tar, verify_bag_folder, write_bag_tar
from packhorse.bags.validation import (
    ALGORITHMS,
    PROBLEM_CODES,
    BagReport,
    validate_folder,
    validate_path,
    validate_tar,
)
from packhorse.errors import UnsafePathError, VerificationError
from packhorse.stages.staging import verify_bag_folder
from support import best_seconds

PAYLOAD = {
    "a.txt": b"alpha\n",
    "obs 0001/scan with spaces.dat": b"\x00\x01\x02" * 300,
    "K\u00f6ln/\u00b5-wave.fits": b"unicode name",
    "100%/done 50%.txt": b"percent",
    "line\nbreak.txt": b"a name with a newline",
    "empty.bin": b"",
}


# ------------------------------------------------------------------------------ building


def make_bag(root: Path, *, algorithms: list[str], version: str = "1.0", payload: dict[str, bytes] | None = None,
             bag_info: bool = True) -> Path:
    """A bag written by the reference library (bagit.make_bag), then declared ``version``
    (bagit-python writes 0.97) and, with ``bag_info=False``, without bag-info.txt."""
    root.mkdir(parents=True)
    for rel, data in (PAYLOAD if payload is None else payload).items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    bagit.make_bag(str(root), checksums=algorithms)
    if version != "0.97":
        (root / "bagit.txt").write_bytes(f"BagIt-Version: {version}\nTag-File-Character-Encoding: UTF-8\n".encode())
    if not bag_info:
        (root / "bag-info.txt").unlink()
    retag(root)
    return root


def retag(root: Path) -> None:
    """Rewrite every tag manifest over the bag's other tag files (after a test edited them)."""
    for tm in root.glob("tagmanifest-*.txt"):
        alg = tm.name[len("tagmanifest-"):-len(".txt")]
        lines = []
        for p in sorted(root.rglob("*")):
            rel = p.relative_to(root).as_posix()
            if p.is_file() and not rel.startswith("data/") and not rel.startswith("tagmanifest-"):
                lines.append(f"{hashlib.new(alg, p.read_bytes()).hexdigest()}  {rel}\n")
        tm.write_text("".join(lines))


def tar_of(root: Path, *, tags_first: bool) -> bytes:
    """The bag folder as a tar with one top folder: sorted member order (payload ``data/``
    before the manifests, as ``tar`` of a bagit-python bag often is) or tag files first."""
    entries = sorted(root.rglob("*"), key=lambda p: p.relative_to(root).as_posix().encode())
    if tags_first:
        entries.sort(key=lambda p: p.relative_to(root).as_posix().startswith("data"))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for p in entries:
            tar.add(str(p), arcname=f"bag/{p.relative_to(root).as_posix()}", recursive=False)
    return buf.getvalue()


class Stream(io.RawIOBase):
    """A non-seekable stream (an HTTP body, a pipe)."""

    def __init__(self, data: bytes) -> None:
        self._b = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[no-untyped-def]
        data = self._b.read(len(b))
        b[: len(data)] = data
        return len(data)


def codes(report: BagReport) -> set[str]:
    return {p.code for p in report.problems}


def packhorse_codes(root: Path) -> set[str]:
    """packhorse's verdict on the bag in every form; the forms must agree (one validator)."""
    folder = validate_folder(root)
    assert all(str(root) in p.message for p in folder.problems), folder.problems
    forms = {"folder": codes(folder)}
    for tags_first in (False, True):
        data = tar_of(root, tags_first=tags_first)
        forms[f"tar tags_first={tags_first}"] = codes(validate_tar(io.BytesIO(data), bag="x.tar")[0])
    data = tar_of(root, tags_first=True)
    forms["stream"] = codes(validate_tar(io.BufferedReader(Stream(data)), bag="x.tar")[0])  # type: ignore[arg-type]
    assert len({frozenset(c) for c in forms.values()}) == 1, forms
    return forms["folder"]


def bagit_valid(root: Path) -> bool:
    try:
        return bool(bagit.Bag(str(root)).is_valid())
    except bagit.BagError:
        return False


# ------------------------------------------------------------------------------ valid bags


@pytest.mark.parametrize("version", ["1.0", "0.97"])
@pytest.mark.parametrize("algorithms", [[a] for a in ALGORITHMS] + [list(ALGORITHMS), ["sha256", "sha512"]],
                         ids=lambda a: "+".join(a))
def test_reference_bags_of_every_algorithm_are_valid(tmp_path: Path, algorithms: list[str], version: str) -> None:
    root = make_bag(tmp_path / "bag", algorithms=algorithms, version=version)
    assert packhorse_codes(root) == set()
    assert bagit_valid(root)
    report = validate_folder(root)
    assert report.version == version and report.payload_algorithms == sorted(algorithms)
    assert report.tag_algorithms == sorted(algorithms)
    assert {p: e.size for p, e in report.payload.items()} == {f"data/{p}": len(d) for p, d in PAYLOAD.items()}


def test_sha512_only_without_bag_info_is_valid(tmp_path: Path) -> None:
    # the bag the old reader refused: RFC 8493 needs neither sha256 nor bag-info (§2.1.3, §2.2.2)
    root = make_bag(tmp_path / "bag", algorithms=["sha512"], bag_info=False)
    assert packhorse_codes(root) == set()
    assert bagit_valid(root)
    # packhorse's own reader (unpack) accepts it too and still gives every file's sha256
    contents = read_bag_tar(io.BytesIO(tar_of(root, tags_first=False)), source="buf:x.tar")
    assert contents.files == {p: hashlib.sha256(d).hexdigest() for p, d in PAYLOAD.items()}
    assert contents.bag_info == {}


def test_an_empty_payload_needs_an_empty_manifest(tmp_path: Path) -> None:
    # bagit-python writes no payload manifest for an empty payload (and then refuses its own bag);
    # RFC 8493 §2.1.3 asks for at least one payload manifest, which may be empty
    root = make_bag(tmp_path / "bag", algorithms=["sha256"], payload={})
    assert packhorse_codes(root) == {"payload-manifest-missing"}
    assert not bagit_valid(root)
    (root / "manifest-sha256.txt").write_bytes(b"")
    retag(root)
    assert packhorse_codes(root) == set()
    assert bagit_valid(root)


def test_a_payload_first_stream_hashes_sha256_and_sha512_and_cannot_verify_md5(tmp_path: Path) -> None:
    root = make_bag(tmp_path / "bag", algorithms=["md5"])
    data = tar_of(root, tags_first=False)  # data/ sorts before manifest-md5.txt
    seekable = validate_tar(io.BytesIO(data), bag="x.tar")[0]
    assert seekable.valid and seekable.passes == 2  # read the early payload again
    stream = validate_tar(io.BufferedReader(Stream(data)), bag="x.tar")[0]  # type: ignore[arg-type]
    assert codes(stream) == {"not-verified"}
    assert len(stream.problems) == len(PAYLOAD)
    # sha256 + sha512, as bagit-python writes by default, need no second pass even out of order
    default = make_bag(tmp_path / "default", algorithms=["sha256", "sha512"])
    one = validate_tar(io.BufferedReader(Stream(tar_of(default, tags_first=False))), bag="y.tar")[0]  # type: ignore[arg-type]
    assert one.valid and one.passes == 1


def test_tags_first_hashes_only_the_manifest_algorithms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_bag(tmp_path / "bag", algorithms=["md5"])
    used: list[str] = []
    real = hashlib.new
    monkeypatch.setattr(hashlib, "new", lambda name, *a, **k: (used.append(name), real(name, *a, **k))[1])
    report = validate_tar(io.BufferedReader(Stream(tar_of(root, tags_first=True))), bag="x.tar")[0]  # type: ignore[arg-type]
    assert report.valid and report.passes == 1
    payload_hashes = len(PAYLOAD)
    assert used.count("md5") >= payload_hashes and used.count("sha512") < payload_hashes


# ------------------------------------------------------------------------------ invalid bags


@dataclass(frozen=True)
class Case:
    """One invalid (or disputed) bag: how to spoil a valid 1.0 bag, packhorse's problem codes,
    and bagit-python's verdict (True = it calls the bag valid)."""

    spoil: Callable[[Path], None]
    expected: set[str]
    bagit_valid: bool
    version: str = "1.0"
    algorithms: tuple[str, ...] = ("sha256",)


def _write(rel: str, data: bytes, *, retag_after: bool = True) -> Callable[[Path], None]:
    def spoil(root: Path) -> None:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        if retag_after:
            retag(root)
    return spoil


def _edit(rel: str, edit: Callable[[bytes], bytes], *, retag_after: bool = True) -> Callable[[Path], None]:
    def spoil(root: Path) -> None:
        (root / rel).write_bytes(edit((root / rel).read_bytes()))
        if retag_after:
            retag(root)
    return spoil


def _remove(rel: str) -> Callable[[Path], None]:
    def spoil(root: Path) -> None:
        (root / rel).unlink()
        retag(root)
    return spoil


def _first_line_twice(data: bytes) -> bytes:
    return data.splitlines(keepends=True)[0] + data


def _symlink(root: Path) -> None:
    os.symlink("a.txt", root / "data" / "link.txt")


def _manifest_line(alg: str, rel: str, data: bytes) -> Callable[[bytes], bytes]:
    return lambda m: m + f"{hashlib.new(alg, data).hexdigest()}  {rel}\n".encode()


def _nfd_on_disk(root: Path) -> None:
    nfc = "caf\u00e9.txt"
    (root / "data" / unicodedata.normalize("NFD", nfc)).write_bytes(b"x")
    _edit("manifest-sha256.txt", _manifest_line("sha256", f"data/{nfc}", b"x"), retag_after=False)(root)
    _edit("bag-info.txt", _oxum_plus(1, 1))(root)


def _oxum_plus(octets: int, files: int) -> Callable[[bytes], bytes]:
    def edit(info: bytes) -> bytes:
        lines = []
        for line in info.decode().splitlines(keepends=True):
            if line.startswith("Payload-Oxum: "):
                o, n = line.split(": ")[1].strip().split(".")
                line = f"Payload-Oxum: {int(o) + octets}.{int(n) + files}\n"
            lines.append(line)
        return "".join(lines).encode()
    return edit


def _drop_line(rel: str, needle: str) -> Callable[[bytes], bytes]:
    return lambda m: b"".join(x for x in m.splitlines(keepends=True) if needle.encode() not in x)


CASES: dict[str, Case] = {
    # bagit.txt (§2.1.1)
    "bagit.txt with a space before the colon": Case(
        _write("bagit.txt", b"BagIt-Version : 1.0\nTag-File-Character-Encoding : UTF-8\n"),
        {"bag-declaration-invalid"}, bagit_valid=True),
    "bagit.txt with a third line": Case(
        _edit("bagit.txt", lambda d: d + b"Extra: 1\n"), {"bag-declaration-invalid"}, bagit_valid=True),
    "bagit.txt without its line end": Case(  # a warning (bag-declaration-unterminated), as bagit-python
        _edit("bagit.txt", lambda d: d.rstrip(b"\n")), set(), bagit_valid=True),
    "bagit.txt with a byte-order mark": Case(
        _edit("bagit.txt", lambda d: b"\xef\xbb\xbf" + d), {"bag-declaration-invalid"}, bagit_valid=False),
    "no bagit.txt": Case(_remove("bagit.txt"), {"bag-declaration-missing"}, bagit_valid=False),
    "BagIt-Version 2.0": Case(
        _write("bagit.txt", b"BagIt-Version: 2.0\nTag-File-Character-Encoding: UTF-8\n"),
        {"unsupported-version"}, bagit_valid=False),
    # payload directory and manifests (§2.1.2, §2.1.3, §2.4)
    "no payload manifest": Case(_remove("manifest-sha256.txt"), {"payload-manifest-missing"}, bagit_valid=False),
    "a manifest listing one file twice": Case(
        _edit("manifest-sha256.txt", _first_line_twice), {"manifest-duplicate-entry"}, bagit_valid=False),
    "a 0.97 manifest listing one file twice": Case(
        _edit("manifest-sha256.txt", _first_line_twice), {"manifest-duplicate-entry"}, bagit_valid=True,
        version="0.97"),
    "a payload manifest listing a tag file": Case(
        _edit("manifest-sha256.txt", lambda m: m + b""), set(), bagit_valid=True),  # replaced below
    "a payload manifest path with '..'": Case(
        _edit("manifest-sha256.txt", _manifest_line("sha256", "data/../bagit.txt", b"")),
        {"manifest-path-unsafe"}, bagit_valid=False),
    "a malformed manifest line": Case(
        _edit("manifest-sha256.txt", lambda m: m + b"one-field-only\n"), {"manifest-line-invalid"},
        bagit_valid=True),
    "a checksum of the wrong length": Case(
        _edit("manifest-sha256.txt", lambda m: m + b"abcd  data/a.txt\n"), {"manifest-line-invalid"},
        bagit_valid=False),
    "an algorithm packhorse does not verify (blake2b)": Case(
        _write("manifest-blake2b.txt", b""), {"unsupported-algorithm"}, bagit_valid=True),  # filled below
    # completeness (§3)
    "a payload file in no manifest": Case(_write("data/extra.txt", b"extra"), {"payload-not-in-manifest", "payload-oxum-mismatch"},
                                          bagit_valid=False),
    "a payload file missing from one of two manifests": Case(
        _edit("manifest-md5.txt", _drop_line("manifest-md5.txt", "data/a.txt")), {"payload-not-in-manifest"},
        bagit_valid=True, algorithms=("md5", "sha256")),
    "a 0.97 payload file in only one of two manifests": Case(
        _edit("manifest-md5.txt", _drop_line("manifest-md5.txt", "data/a.txt")), set(),
        bagit_valid=True, version="0.97", algorithms=("md5", "sha256")),
    "a manifest entry without its file": Case(_remove("data/a.txt"), {"file-missing", "payload-oxum-mismatch"},
                                              bagit_valid=False),
    "a tag manifest entry without its file": Case(
        _edit("tagmanifest-sha256.txt", _manifest_line("sha256", "gone.txt", b""), retag_after=False),
        {"file-missing"}, bagit_valid=False),
    "a payload file not in NFC like its manifest entry": Case(
        _nfd_on_disk, {"payload-not-in-manifest", "file-missing"}, bagit_valid=True),
    # validity (§3)
    "a payload file with other bytes": Case(_write("data/a.txt", b"alphA\n"), {"checksum-mismatch"},
                                            bagit_valid=False),
    "a tag file with other bytes": Case(_edit("bag-info.txt", lambda d: d + b"Extra: 1\n", retag_after=False),
                                        {"checksum-mismatch"}, bagit_valid=False),
    # bag-info (§2.2.2)
    "a wrong Payload-Oxum": Case(_edit("bag-info.txt", lambda d: d.replace(b"Payload-Oxum: ", b"Payload-Oxum: 9")),
                                 {"payload-oxum-mismatch"}, bagit_valid=False),
    "a malformed Payload-Oxum": Case(_edit("bag-info.txt", lambda d: d.replace(b"Payload-Oxum: ", b"Payload-Oxum: x")),
                                     {"payload-oxum-invalid"}, bagit_valid=False),
    "a bag-info line without the space after the colon": Case(
        _edit("bag-info.txt", lambda d: d + b"Contact-Name:Ada\n"), {"bag-info-invalid"}, bagit_valid=True),
    # fetch.txt (§2.2.3)
    "a fetch.txt listing a file no manifest lists": Case(
        _write("fetch.txt", b"https://example.org/x 5 data/x.txt\n"), {"fetch-not-in-manifest"},
        bagit_valid=True),  # bagit-python does not check §2.2.3's MUST
    "a fetch.txt line that is not URL LENGTH FILEPATH": Case(
        _write("fetch.txt", b"https://example.org/x five data/x.txt\n"), {"fetch-line-invalid"}, bagit_valid=True),
    # packhorse's own rule (I6)
    "a symlink in the payload": Case(_symlink, {"symlink"}, bagit_valid=False),
}
CASES["a payload manifest listing a tag file"] = Case(
    _edit("manifest-sha256.txt", _manifest_line("sha256", "bagit.txt",
                                                b"BagIt-Version: 1.0\nTag-File-Character-Encoding: UTF-8\n")),
    {"manifest-path-outside-payload"}, bagit_valid=False)  # bagit-python: "lists bagit.txt multiple times"


def _blake2b(root: Path) -> None:
    lines = "".join(f"{hashlib.blake2b((root / 'data' / p).read_bytes()).hexdigest()}  data/{p}\n"
                    for p in ["a.txt"])
    (root / "manifest-blake2b.txt").write_text(lines)
    retag(root)


CASES["an algorithm packhorse does not verify (blake2b)"] = Case(
    _blake2b, {"unsupported-algorithm", "payload-not-in-manifest"}, bagit_valid=True)


def _sha3_256(root: Path) -> None:
    # a name with a hyphen is a manifest too (found by a new-user trial: it was ignored, so a
    # wrong checksum in it went unnoticed)
    (root / "manifest-sha3-256.txt").write_text(f"{'0' * 64}  data/a.txt\n")


CASES["an algorithm whose name has a hyphen (sha3-256)"] = Case(
    _sha3_256, {"unsupported-algorithm", "payload-not-in-manifest"}, bagit_valid=True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_corpus_verdicts(tmp_path: Path, name: str) -> None:
    case = CASES[name]
    payload = {"a.txt": b"alpha\n", "sub/b.txt": b"beta\n"}
    root = make_bag(tmp_path / "bag", algorithms=list(case.algorithms), version=case.version, payload=payload)
    assert packhorse_codes(root) == set() and bagit_valid(root)  # the guard: valid before the spoiling
    case.spoil(root)
    if "symlink" in case.expected:
        assert codes(validate_folder(root)) == case.expected  # a tar of a symlink is refused as a link member
    else:
        assert packhorse_codes(root) == case.expected
    assert bagit_valid(root) is case.bagit_valid
    assert all(code in PROBLEM_CODES for code in case.expected)


def test_every_problem_is_listed_not_only_the_first(tmp_path: Path) -> None:
    root = make_bag(tmp_path / "bag", algorithms=["sha256"], payload={"a.txt": b"a", "b.txt": b"b"})
    (root / "data" / "a.txt").write_bytes(b"A")
    (root / "data" / "b.txt").write_bytes(b"B")
    (root / "data" / "c.txt").write_bytes(b"c")
    (root / "fetch.txt").write_bytes(b"https://example.org/x - data/x.txt\nnot a fetch line\n")
    report = validate_folder(root)
    assert sorted((p.code, p.path) for p in report.problems) == sorted([
        ("checksum-mismatch", "data/a.txt"), ("checksum-mismatch", "data/b.txt"),
        ("payload-not-in-manifest", "data/c.txt"), ("payload-oxum-mismatch", "bag-info.txt"),
        ("fetch-line-invalid", "fetch.txt"), ("fetch-not-in-manifest", "data/x.txt")])


def test_a_tar_with_a_link_or_a_member_outside_the_bag_is_refused(tmp_path: Path) -> None:
    root = make_bag(tmp_path / "bag", algorithms=["sha256"], payload={"a.txt": b"a"})
    buf = io.BytesIO(tar_of(root, tags_first=True))
    with tarfile.open(fileobj=buf, mode="a") as tar:
        link = tarfile.TarInfo("bag/data/link")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
        out = tarfile.TarInfo("other/x")
        tar.addfile(out, io.BytesIO(b""))
    report = validate_tar(io.BytesIO(buf.getvalue()), bag="x.tar")[0]
    assert [(p.code, p.path) for p in report.problems] == [("unsafe-member", "bag/data/link"),
                                                          ("unsafe-member", "other/x")]


def test_a_problem_quotes_a_4_kb_name_cut_with_its_length_and_keeps_it_whole_as_its_path(tmp_path: Path) -> None:
    long = "data/" + "/".join(["d" * 200] * 20) + "/x"  # 4,026 characters
    root = make_bag(tmp_path / "bag", algorithms=["sha256"], payload={"a.txt": b"a"})
    with (root / "manifest-sha256.txt").open("a", encoding="utf-8") as f:
        f.write(f"{hashlib.sha256(b'x').hexdigest()}  {long}\n")
    buf = io.BytesIO(tar_of(root, tags_first=True))
    with tarfile.open(fileobj=buf, mode="a") as tar:
        tar.addfile(tarfile.TarInfo("bag/" + long))  # an empty file where the manifest says 'x'
        link = tarfile.TarInfo("bag/" + long + "-link")
        link.type, link.linkname = tarfile.SYMTYPE, "/" + "e" * 4000
        tar.addfile(link)
    for report in (validate_folder(root), validate_tar(io.BytesIO(buf.getvalue()), bag="x.tar")[0]):
        long_ones = [p for p in report.problems if len(p.path) > 4000]
        assert long_ones, report.problems
        for p in long_ones:
            assert len(p.message) < 800, (p.code, p.message)
            assert f"({len(p.path):,} characters)" in p.message, p.message


def test_a_damaged_tar_and_a_non_tar_are_problems_not_crashes(tmp_path: Path) -> None:
    root = make_bag(tmp_path / "bag", algorithms=["sha256"])
    data = tar_of(root, tags_first=True)
    assert codes(validate_tar(io.BytesIO(b"not a tar" * 100), bag="x")[0]) == {"not-a-bag-container"}
    assert not validate_tar(io.BytesIO(data[: len(data) // 2]), bag="x")[0].valid


# ------------------------------------------------------------------------------ packhorse's own bags


def _packhorse_tar(tmp_path: Path, payload: dict[str, bytes]) -> bytes:
    files = []
    for i, (rel, data) in enumerate(payload.items()):
        src = tmp_path / "src" / str(i)
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_bytes(data)
        files.append(PayloadFile(path=rel, size=len(data), sha256=hashlib.sha256(data).hexdigest(), mtime=1_700_000_000,
                                 open=lambda src=src: open(src, "rb")))
    out = io.BytesIO()
    write_bag_tar(out, bag_dir="pkg", files=files, bag_info={"Packhorse-Group": "instr/ou1"},
                  bagging_date="2024-05-06", external_identifier="instr/ou1", tag_mtime=1_700_000_000)
    return out.getvalue()


def test_packhorse_archives_validate_with_packhorse_and_with_bagit(tmp_path: Path) -> None:
    data = _packhorse_tar(tmp_path, PAYLOAD)
    report, bag_dir = validate_tar(io.BufferedReader(Stream(data)), bag="buf:pkg.tar")  # type: ignore[arg-type]
    assert report.valid and report.passes == 1 and bag_dir == "pkg"
    extract_tar(io.BytesIO(data), tmp_path / "out", source="x")
    assert validate_folder(tmp_path / "out" / "pkg").valid
    assert bagit_valid(tmp_path / "out" / "pkg")


@pytest.mark.parametrize("name", ["x ", "trailing tab\t", "a%0Ab", "100%25"])
def test_names_bagit_python_cannot_read_back(tmp_path: Path, name: str) -> None:
    # bagit-python strips trailing whitespace from manifest lines and does not decode %25; RFC 8493
    # §2.1.3 makes the path run to the line end and asks for '%' to be encoded: packhorse is right
    data = _packhorse_tar(tmp_path, {name: b"named", "ok.txt": b"ok"})
    assert validate_tar(io.BytesIO(data), bag="x")[0].valid
    extract_tar(io.BytesIO(data), tmp_path / "out", source="x")
    bag = tmp_path / "out" / "pkg"
    assert (bag / "data" / name).read_bytes() == b"named"
    assert validate_folder(bag).valid
    assert verify_bag_folder(bag, source="x")[name] == hashlib.sha256(b"named").hexdigest()
    assert not bagit_valid(bag)


def test_sparse_file_round_trips_byte_identical(tmp_path: Path) -> None:
    src = tmp_path / "sparse.bin"
    with open(src, "wb") as f:
        f.truncate(64 << 20)
        f.seek(32 << 20)
        f.write(b"x" * 4096)
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    pf = PayloadFile(path="sparse.bin", size=64 << 20, sha256=digest, mtime=1_700_000_000, open=lambda: open(src, "rb"))
    tar_path = tmp_path / "pkg.tar"
    with open(tar_path, "wb") as out:
        write_bag_tar(out, bag_dir="pkg", files=[pf], bag_info={}, bagging_date="2024-05-06",
                      external_identifier="p", tag_mtime=0)
    with open(tar_path, "rb") as f:
        assert read_bag_tar(f, source="x").files == {"sparse.bin": digest}
    with open(tar_path, "rb") as f:
        extract_tar(f, tmp_path / "out", source="x")
    assert (tmp_path / "out" / "pkg" / "data" / "sparse.bin").read_bytes() == src.read_bytes()


def test_packhorse_readers_raise_with_every_problem_counted(tmp_path: Path) -> None:
    root = make_bag(tmp_path / "bag", algorithms=["sha256"], payload={"a.txt": b"a", "b.txt": b"b"})
    (root / "data" / "a.txt").write_bytes(b"A")
    (root / "data" / "b.txt").write_bytes(b"B")
    with pytest.raises(VerificationError, match=r"'data/a.txt' has sha256 .* \(and 1 more problem\(s\): "
                                                r"checksum-mismatch\)") as ei:
        verify_bag_folder(root, source="proc:bag")
    assert ei.value.path == "data/a.txt" and str(ei.value).startswith("proc:bag: ")
    os.symlink("a.txt", root / "data" / "l")
    with pytest.raises(UnsafePathError, match="'data/l' is a symlink"):
        verify_bag_folder(root, source="proc:bag")


def test_validate_path_reads_folders_and_tars(tmp_path: Path) -> None:
    root = make_bag(tmp_path / "bag", algorithms=["sha1"])
    (tmp_path / "bag.tar").write_bytes(tar_of(root, tags_first=False))
    assert validate_path(root).valid and validate_path(tmp_path / "bag.tar").valid
    assert codes(validate_path(tmp_path / "nothing")) == {"unreadable"}


def test_forward_only_streams_refuse_to_seek_back() -> None:
    from packhorse.bags.validation import ForwardOnly

    f = ForwardOnly(io.BufferedReader(Stream(b"0123456789")))  # type: ignore[arg-type]
    assert f.seek(3) == 3 and f.read(2) == b"34" and f.tell() == 5
    assert f.seek(2, io.SEEK_CUR) == 7 and f.read() == b"789"
    with pytest.raises(io.UnsupportedOperation, match="seek back"):
        f.seek(1)


def _hand_written(root: Path, version: str) -> None:
    """A bag written by hand the way other tools do: CRLF line ends, a tab separator, upper-case
    hex, lower-case percent-encoding, a folded bag-info value, a tag file in a tag folder, no
    tag manifest for it... all allowed by RFC 8493 (and the 0.97 draft)."""
    payload = {"data/a\rb.txt": b"carriage return", "data/plain.dat": b"plain", "data/50% done.txt": b"half"}
    for rel, data in payload.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "bagit.txt").write_bytes(f"BagIt-Version: {version}\r\nTag-File-Character-Encoding: UTF-8\r\n".encode())
    enc = {"data/a\rb.txt": "data/a%0db.txt"}
    (root / "manifest-md5.txt").write_bytes("".join(
        f"{hashlib.md5(d).hexdigest().upper()}\t{enc.get(p, p)}\r\n" for p, d in payload.items()).encode())
    (root / "bag-info.txt").write_bytes(b"Source-Organization: Observatory\r\nExternal-Description: a long\r\n"
                                        b"  value folded\r\nPayload-Oxum: 24.3\r\n")
    (root / "meta").mkdir()
    (root / "meta" / "notes.txt").write_bytes(b"tag file in a tag folder")
    lines = [f"{hashlib.sha1((root / n).read_bytes()).hexdigest()} {n}\n"
             for n in ("bagit.txt", "bag-info.txt", "manifest-md5.txt", "meta/notes.txt")]
    (root / "tagmanifest-sha1.txt").write_text("".join(lines))


@pytest.mark.parametrize("version", ["0.97", "1.0"])
def test_hand_written_bags(tmp_path: Path, version: str) -> None:
    root = tmp_path / "bag"
    root.mkdir()
    _hand_written(root, version)
    assert packhorse_codes(root) == set()
    report = validate_folder(root)
    assert set(report.payload) == {"data/a\rb.txt", "data/plain.dat", "data/50% done.txt"}
    assert report.bag_info["External-Description"] == ["a long value folded"]
    (root / "meta" / "notes.txt").write_bytes(b"changed")
    assert codes(validate_folder(root)) == {"checksum-mismatch"}


def test_packhorse_s_own_reader_refuses_a_valid_bag_still_waiting_for_fetched_files(tmp_path: Path) -> None:
    root = make_bag(tmp_path / "bag", algorithms=["sha256"], payload={"a.txt": b"a", "b.txt": b"b"})
    (root / "fetch.txt").write_bytes(b"https://example.org/b 1 data/b.txt\n")
    (root / "data" / "b.txt").unlink()
    report = validate_folder(root)
    assert report.valid and report.fetch_pending == ["data/b.txt"]
    with pytest.raises(VerificationError, match=r"incomplete: 1 payload file\(s\) listed in fetch.txt"):
        read_bag_bytes(tar_of(root, tags_first=True), source="bag.tar")


def test_bag_info_continuation_lines_cost_time_linear_in_their_number(tmp_path: Path) -> None:
    # a value extended by 8,000 continuation lines of 1,000 characters took 20 s to read (each
    # line copied the whole value again: quadratic); found by an attacker's trial
    # 16 times the lines: linear costs about 16 times the time, quadratic 256 times; the bound
    # between them leaves room for a machine busy with other work (the smaller bag's best of
    # three is rarely slowed, the larger one's may be, by a few times)
    seconds = {}
    for lines in (1_000, 16_000):
        root = make_bag(tmp_path / f"bag{lines}", algorithms=["sha256"])
        info = root / "bag-info.txt"
        info.write_bytes(info.read_bytes() + b"External-Description: start\n" + (b" " + b"x" * 999 + b"\n") * lines)
        retag(root)
        best, report = best_seconds(partial(validate_path, root), 3)
        assert report.valid, report.problems[:3]
        [value] = report.bag_info["External-Description"]
        assert len(value) == len("start") + lines * 1_000
        seconds[lines] = best
    assert seconds[16_000] / seconds[1_000] < 64, seconds  # linear: about 16


def test_problems_found_in_a_manifest_and_in_the_payload_share_one_listing_cap(tmp_path: Path) -> None:
    # a manifest with more bad lines than are listed, plus payload files missing from the bag:
    # the report lists MAX_LISTED_PROBLEMS in the order found (manifest lines first, as parsed)
    # and counts the rest by code, whichever list (the manifest's or the bag's) found them
    from packhorse.bags.validation import MAX_LISTED_PROBLEMS
    root = make_bag(tmp_path / "bag", algorithms=["sha256"])
    manifest = root / "manifest-sha256.txt"
    bad = MAX_LISTED_PROBLEMS + 200
    manifest.write_bytes(manifest.read_bytes() + b"not a manifest line\n" * bad
                         + b"".join(b"%s  data/missing-%d.dat\n" % (b"0" * 64, n) for n in range(50))
                         + b"%s  data/../escape.dat\n" % (b"0" * 64))
    retag(root)
    report = validate_path(root)
    assert not report.valid
    listed = [p.code for p in report.problems]
    assert listed[:MAX_LISTED_PROBLEMS] == ["manifest-line-invalid"] * MAX_LISTED_PROBLEMS
    assert len(listed) == MAX_LISTED_PROBLEMS
    assert report.problems_omitted == bad + 50 + 1 - MAX_LISTED_PROBLEMS
    assert {"manifest-line-invalid", "manifest-path-unsafe"} <= set(report.omitted_codes)
    assert len(report.omitted_codes) >= 3, report.omitted_codes  # and the 50 files not in the bag
    assert report.as_dict()["problems_omitted"] == report.problems_omitted
