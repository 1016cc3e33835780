"""A bag's manifests cost bounded memory whatever their size (docs/bags.md, "One pass, bounded
memory"): manifests are parsed line by line as they are read, a bag's manifests together list
at most ``[extraction] max_members`` entries (``manifest-too-large`` beyond), and a report
lists the first :data:`MAX_LISTED_PROBLEMS` problems and counts the others. Measured on the
product's entry points: ``packhorse validate`` (text and ``--json``) and the unpack reader, each
in a child process whose peak RSS is read from ``wait4``."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from packhorse.bags import validation
from packhorse.bags.extraction import ExtractionLimits
from packhorse.bags.packaging import read_bag_tar
from packhorse.bags.validation import MAX_LISTED_PROBLEMS, validate_folder, validate_tar
from packhorse.errors import VerificationError

#: The documented budget (docs/bags.md): peak RSS of ``packhorse validate`` or of the unpack
#: reader on a bag, whatever its manifests' sizes (about 90 MiB of it Python and packhorse).
BUDGET_BYTES = 352 << 20
#: Lines of the large manifest (about 50 MiB): before manifests were parsed as read and problems
#: counted beyond the first thousand, validate --json of it peaked at about 900 MiB and the unpack
#: reader at about 430 MiB; now at about 190 MiB. (A manifest beyond the budget of entries is
#: refused: test_manifests_beyond_the_entry_budget..., and benchmarks/manifest_memory.py.)
LINES = 500_000
PAYLOAD = b"the one payload file\n"
DECLARATION = b"BagIt-Version: 1.0\nTag-File-Character-Encoding: UTF-8\n"


def _bag(root: Path, lines: int) -> Path:
    """A bag folder with one payload file and a manifest-sha256.txt of ``lines`` lines, all but
    the first naming a payload file that is not there (one ``file-missing`` each)."""
    (root / "data").mkdir(parents=True)
    (root / "data" / "present.txt").write_bytes(PAYLOAD)
    (root / "bagit.txt").write_bytes(DECLARATION)
    fake = "0" * 64
    with open(root / "manifest-sha256.txt", "w", encoding="utf-8", newline="\n") as out:
        out.write(f"{hashlib.sha256(PAYLOAD).hexdigest()}  data/present.txt\n")
        for start in range(1, lines, 100_000):
            out.write("".join(f"{fake}  data/missing/obs-{i // 1000:05d}/scan-{i:08d}.fits\n"
                              for i in range(start, min(start + 100_000, lines))))
    return root


def _tar(bag: Path, out: Path) -> Path:
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as t:
        for name in ("bagit.txt", "manifest-sha256.txt", "data", "data/present.txt"):
            t.add(bag / name, arcname=f"bag/{name}", recursive=False)
    return out


#: Starts ``argv`` from a small process and reports its peak RSS (KiB) and exit code on stderr.
#: A child forked straight from the test process would count the test process's own resident
#: memory in its peak (it is the same memory until the child's exec), and an xdist worker that
#: ran many tests holds hundreds of MiB: found when CI measured 420 MiB for a 220 MiB validate.
_LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.execv(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
sys.stderr.write(f"{usage.ru_maxrss} {os.waitstatus_to_exitcode(status)}")
"""


def _run(argv: list[str]) -> tuple[int, int, bytes]:
    """(exit code, peak RSS in bytes, stdout) of ``argv`` run in a child process."""
    done = subprocess.run([sys.executable, "-c", _LAUNCHER, *argv], capture_output=True, check=False)
    peak_kib, code = done.stderr.decode().split()
    return int(code), int(peak_kib) * 1024, done.stdout


@pytest.fixture(scope="module")
def large_bag(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _bag(tmp_path_factory.mktemp("large") / "bag", LINES)


@pytest.mark.long  # seconds of real processes: out of the default selection
def test_validate_of_a_huge_manifest_stays_within_the_budget(large_bag: Path) -> None:
    code, rss, out = _run([sys.executable, "-m", "packhorse", "validate", "--json", str(large_bag)])
    report = json.loads(out)
    assert code == 1
    assert rss < BUDGET_BYTES, f"packhorse validate --json peaked at {rss / 2**20:.0f} MiB"
    assert len(report["problems"]) == MAX_LISTED_PROBLEMS
    assert report["problems_omitted"] == LINES - 1 - MAX_LISTED_PROBLEMS
    assert report["omitted_codes"] == ["file-missing"]


@pytest.mark.long  # seconds of real processes: out of the default selection
def test_the_unpack_reader_of_a_huge_manifest_stays_within_the_budget(large_bag: Path, tmp_path: Path) -> None:
    tar = _tar(large_bag, tmp_path / "bag.tar")
    script = ("import sys\nfrom packhorse.bags.packaging import read_bag_tar\n"
              "try:\n    read_bag_tar(open(sys.argv[1], 'rb'), source='bag.tar')\n"
              "except Exception as e:\n    print(type(e).__name__, str(e)[:2000]); sys.exit(1)\n")
    code, rss, out = _run([sys.executable, "-c", script, str(tar)])
    assert code == 1
    assert out.startswith(b"VerificationError"), out[:300]
    assert f"(and {LINES - 2} more problem(s): file-missing)".encode() in out
    assert rss < BUDGET_BYTES, f"the unpack reader peaked at {rss / 2**20:.0f} MiB"


def test_problems_beyond_the_first_thousand_are_counted_not_listed(tmp_path: Path) -> None:
    bag = _bag(tmp_path / "bag", MAX_LISTED_PROBLEMS + 501)
    report = validate_folder(bag)
    assert not report.valid
    assert len(report.problems) == MAX_LISTED_PROBLEMS
    assert report.problems_omitted == 500 and report.omitted_codes == ["file-missing"]
    text = report.summary()
    assert text.startswith(f"INVALID {bag}: {MAX_LISTED_PROBLEMS + 500} problem(s)")
    assert text.endswith("… and 500 more problem(s), not listed: file-missing")
    data = report.as_dict()
    assert len(data["problems"]) == MAX_LISTED_PROBLEMS and data["problems_omitted"] == 500  # type: ignore[arg-type]
    with pytest.raises(VerificationError, match=r"and 1499 more problem\(s\): file-missing"):
        read_bag_tar(io.BytesIO(_tar(bag, tmp_path / "bag.tar").read_bytes()), source="bag.tar")


def test_manifests_beyond_the_entry_budget_are_refused_naming_bag_file_and_limit(tmp_path: Path) -> None:
    bag = _bag(tmp_path / "bag", 20)
    tar = _tar(bag, tmp_path / "bag.tar")
    report, _ = validate_tar(io.BytesIO(tar.read_bytes()), bag="bag.tar", limits=ExtractionLimits(max_members=10))
    assert [p.code for p in report.problems] == ["manifest-too-large"]  # nothing more: the manifest is dropped
    message = report.problems[0].message
    assert message.startswith("bag.tar: manifest-sha256.txt line 11:")
    assert "max_members = 10" in message
    assert report.payload_algorithms == ["sha256"]
    with pytest.raises(VerificationError, match="manifest-sha256.txt line 11.*max_members = 10"):
        read_bag_tar(io.BytesIO(tar.read_bytes()), source="bag.tar", limits=ExtractionLimits(max_members=10))
    assert validate_tar(io.BytesIO(tar.read_bytes()), bag="bag.tar",
                        limits=ExtractionLimits(max_members=20))[0].problems[0].code == "file-missing"


def test_line_ends_split_across_reads_parse_as_whole_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LF, CR and CRLF ends (RFC 8493 §2.3), a CRLF split between two reads, a multi-byte
    character split between two reads, a last line without its end: the same entries as one read."""
    names = ["a.txt", "K\u00f6ln \u00b5.fits", "b c.txt", "d.txt"]
    bag = tmp_path / "bag"
    (bag / "data").mkdir(parents=True)
    (bag / "bagit.txt").write_bytes(DECLARATION)
    lines = []
    for name, end in zip(names, ["\r\n", "\r", "\n", ""]):
        (bag / "data" / name).write_bytes(name.encode())
        lines.append(f"{hashlib.sha256(name.encode()).hexdigest()}  data/{name}{end}")
    (bag / "manifest-sha256.txt").write_bytes("".join(lines).encode())
    for chunk in (1, 2, 3, 7, 64, 1 << 20):
        monkeypatch.setattr(validation, "CHUNK_BYTES", chunk)
        report = validate_folder(bag)
        assert report.valid, (chunk, report.summary())
        assert sorted(report.payload) == sorted(f"data/{n}" for n in names)


def test_a_manifest_before_bagit_txt_is_read_in_the_encoding_declared_later(tmp_path: Path) -> None:
    """A tar with the manifest first (read as UTF-8 then) and a bagit.txt declaring ISO-8859-1."""
    name = "K\u00f6ln.txt"
    digest = hashlib.sha256(b"x").hexdigest()
    members = [("bag/manifest-sha256.txt", f"{digest}  data/{name}\n".encode("iso-8859-1")),
               ("bag/bagit.txt", b"BagIt-Version: 1.0\nTag-File-Character-Encoding: ISO-8859-1\n"),
               (f"bag/data/{name}", b"x")]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for member, data in members:
            info = tarfile.TarInfo(member)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    report, _ = validate_tar(io.BytesIO(buf.getvalue()), bag="bag.tar")
    assert report.valid, report.summary()
    assert list(report.payload) == [f"data/{name}"]


def test_manifests_beyond_the_memory_budget_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(validation, "MAX_MANIFEST_MEMORY_BYTES", 2000)  # about ten entries
    report = validate_folder(_bag(tmp_path / "bag", 20))
    assert [p.code for p in report.problems] == ["manifest-too-large"]
    assert "holding more than 0 MiB of memory together" in report.problems[0].message


def test_the_entry_budget_is_across_all_manifests_of_a_bag(tmp_path: Path) -> None:
    """Two payload manifests of 8 entries with a budget of 10: the one read second goes beyond
    and is refused (its entries dropped); the first is checked as usual."""
    bag = _bag(tmp_path / "bag", 8)
    lines = (bag / "manifest-sha256.txt").read_text().splitlines()
    (bag / "manifest-md5.txt").write_text("".join(f"{'0' * 32}  {line.split('  ', 1)[1]}\n" for line in lines))
    tar = _tar(bag, tmp_path / "bag.tar")  # bagit.txt, manifest-sha256.txt, ...: add manifest-md5.txt after
    with tarfile.open(tar, "a") as t:
        t.add(bag / "manifest-md5.txt", arcname="bag/manifest-md5.txt")
    report, _ = validate_tar(io.BytesIO(tar.read_bytes()), bag="bag.tar", limits=ExtractionLimits(max_members=10))
    refused = [p for p in report.problems if p.code == "manifest-too-large"]
    assert [p.path for p in refused] == ["manifest-md5.txt"]
    assert refused[0].message.startswith("bag.tar: manifest-md5.txt line 3:")
    assert report.payload_algorithms == ["md5", "sha256"]
    assert {p.code for p in report.problems} == {"manifest-too-large", "file-missing"}


def test_a_line_too_long_to_hold_is_a_problem_and_the_next_line_is_read(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(validation, "MAX_MANIFEST_LINE_CHARS", 100)
    monkeypatch.setattr(validation, "CHUNK_BYTES", 64)
    bag = _bag(tmp_path / "bag", 1)
    manifest = bag / "manifest-sha256.txt"
    manifest.write_bytes(b"0" * 64 + b"  data/" + b"x" * 500 + b"\r\n" + manifest.read_bytes())
    report = validate_folder(bag)
    assert [p.code for p in report.problems] == ["manifest-line-invalid"]
    assert "manifest-sha256.txt line 1 is longer than 100 characters" in report.problems[0].message
    assert list(report.payload) == ["data/present.txt"]


def test_bag_info_and_fetch_txt_are_read_line_by_line_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bag-info.txt with continuation lines and CRLF ends, fetch.txt: the same whatever the read size."""
    bag = _bag(tmp_path / "bag", 1)
    (bag / "bag-info.txt").write_bytes(b"Source-Organization: Observatory \xc3\xb6\r\nExternal-Description: one\r\n"
                                       b"  two\r\n\tthree\r\nBagging-Date: 2024-05-06")
    missing = "data/later/scan.fits"
    manifest = bag / "manifest-sha256.txt"
    manifest.write_text(manifest.read_text() + f"{hashlib.sha256(b'later').hexdigest()}  {missing}\n")
    (bag / "fetch.txt").write_text(f"https://example.org/scan.fits 5 {missing}\r\n")
    for chunk in (1, 3, 16, 1 << 20):
        monkeypatch.setattr(validation, "CHUNK_BYTES", chunk)
        report = validate_folder(bag)
        assert report.valid and not report.complete, (chunk, report.summary())
        assert report.fetch_pending == [missing]
        assert report.bag_info == {"Source-Organization": ["Observatory \u00f6"],
                                   "External-Description": ["one two three"], "Bagging-Date": ["2024-05-06"]}


def test_fetch_txt_beyond_the_entry_budget_is_refused(tmp_path: Path) -> None:
    bag = _bag(tmp_path / "bag", 3)
    (bag / "fetch.txt").write_text("".join(f"https://example.org/{i} - data/missing/obs-00000/scan-{i:08d}.fits\n"
                                           for i in range(1, 20)))
    tar = _tar(bag, tmp_path / "bag.tar")
    with tarfile.open(tar, "a") as t:
        t.add(bag / "fetch.txt", arcname="bag/fetch.txt")
    report, _ = validate_tar(io.BytesIO(tar.read_bytes()), bag="bag.tar", limits=ExtractionLimits(max_members=10))
    refused = [p for p in report.problems if p.code == "tag-file-too-large"]
    assert [p.path for p in refused] == ["fetch.txt"]
    assert refused[0].message.startswith("bag.tar: fetch.txt line 8:")  # 3 manifest entries + 7 and "max_members = 10" in refused[0].message


def test_a_long_bagit_txt_is_invalid_not_held(tmp_path: Path) -> None:
    bag = _bag(tmp_path / "bag", 1)
    (bag / "bagit.txt").write_bytes(DECLARATION + b"X-Padding: " + b"x" * (200 << 10) + b"\n")
    report = validate_folder(bag)
    assert [p.code for p in report.problems] == ["bag-declaration-invalid"]
    assert len(report.problems[0].message) < 1000
