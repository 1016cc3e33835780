"""Peak memory and time of bag validation against the size of a bag's manifest.

    PYTHONPATH=src python benchmarks/manifest_memory.py [--lines 100000 1000000] [--path-chars 41] [--dir /tmp]
                                                       [--entry-points validate validate-json unpack staging]
                                                       [--tag-lines N]

For each ``--lines`` N, builds a bag folder whose ``manifest-sha256.txt`` has N lines: one for
the bag's single payload file, N-1 for payload files that are not there (``file-missing``, one
problem each: the worst case for the problem list too), paths of ``--path-chars`` characters
(41: about 110 bytes a line); and a bag tar of
the same folder (tag files first, as packhorse writes them). Then runs each entry point in a
fresh child process and reports its peak RSS (``ru_maxrss`` of the child, from ``wait4``), its
wall time and its exit code:

* ``validate``: ``python -m packhorse validate FOLDER`` (stdout to /dev/null);
* ``validate-json``: the same with ``--json``;
* ``unpack``: :func:`packhorse.bags.packaging.read_bag_tar` on the tar (the unpack stage's
  reader; staging's check pass, ``verify_bag_archive``, is the same function);
* ``staging``: :func:`packhorse.bags.packaging.verify_bag_folder` on the folder (staging's
  check of the extracted bag).

``import`` is a child that only imports packhorse and the validator: the floor. Every bag is
deleted afterwards. With ``--tag-lines N`` the bag also has a ``bag-info.txt`` of N lines (one
``External-Description`` label, N values) and a ``fetch.txt`` of N lines (files not in the bag,
not in the manifest). Prints a Markdown table (the one in docs/benchmarks.md, "Manifest memory").
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

_UNPACK = """
import sys
from packhorse.bags.packaging import read_bag_tar
from packhorse.errors import PackhorseError
try:
    with open(sys.argv[1], "rb") as f:
        read_bag_tar(f, source=sys.argv[1])
except PackhorseError as e:
    print(str(e)[:300]); sys.exit(1)
"""
_STAGING = """
import sys
from pathlib import Path
from packhorse.bags.packaging import verify_bag_folder
from packhorse.errors import PackhorseError
try:
    verify_bag_folder(Path(sys.argv[1]), source=sys.argv[1])
except PackhorseError as e:
    print(str(e)[:300]); sys.exit(1)
"""
_IMPORT = "import packhorse.bags.packaging, packhorse.cli.bags"


def build(root: Path, lines: int, path_chars: int = 41, tag_lines: int = 0) -> tuple[Path, Path]:
    """Write the bag folder ``root/bag`` (manifest of ``lines`` lines) and ``root/bag.tar``."""
    bag = root / "bag"
    (bag / "data").mkdir(parents=True)
    payload = b"the one payload file\n"
    (bag / "data" / "present.txt").write_bytes(payload)
    (bag / "bagit.txt").write_bytes(b"BagIt-Version: 1.0\nTag-File-Character-Encoding: UTF-8\n")
    digest = hashlib.sha256(payload).hexdigest()
    fake = "0" * 64
    pad = "p" * max(0, path_chars - 41)
    with open(bag / "manifest-sha256.txt", "w", encoding="utf-8", newline="\n") as out:
        out.write(f"{digest}  data/present.txt\n")
        step = 100_000
        for start in range(1, lines, step):
            out.write("".join(f"{fake}  data/missing/obs-{i // 1000:05d}/{pad}scan-{i:08d}.fits\n"
                              for i in range(start, min(start + step, lines))))
    tags = ["bagit.txt", "manifest-sha256.txt"]
    if tag_lines:
        tags += ["bag-info.txt", "fetch.txt"]
        with open(bag / "bag-info.txt", "w", encoding="utf-8", newline="\n") as info, \
                open(bag / "fetch.txt", "w", encoding="utf-8", newline="\n") as fetch:
            for start in range(0, tag_lines, 100_000):
                span = range(start, min(start + 100_000, tag_lines))
                info.write("".join(f"External-Description: line {i} of a long description of the bag\n"
                                   for i in span))
                fetch.write("".join(f"https://example.org/files/scan-{i:08d}.fits - data/fetched/scan-{i:08d}.fits\n"
                                    for i in span))
    tar = root / "bag.tar"
    with tarfile.open(tar, "w", format=tarfile.PAX_FORMAT) as t:
        for name in (*tags, "data", "data/present.txt"):
            t.add(bag / name, arcname=f"bag/{name}", recursive=False)
    return bag, tar


def run(argv: list[str]) -> tuple[int, float, int]:
    """Run ``argv`` in a child; (peak RSS in bytes, wall seconds, exit code)."""
    start = time.perf_counter()
    with open(os.devnull, "wb") as null:
        proc = subprocess.Popen(argv, stdout=null, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss * 1024, time.perf_counter() - start, proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--path-chars", type=int, default=41, help="characters of each missing file's path (>= 41)")
    ap.add_argument("--tag-lines", type=int, default=0, help="lines of bag-info.txt and of fetch.txt (0: none)")
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--entry-points", nargs="+", default=["validate", "validate-json", "unpack", "staging"])
    args = ap.parse_args()
    py = sys.executable
    print(f"paths of {args.path_chars} characters; bag-info.txt and fetch.txt of {args.tag_lines} lines\n")
    print("| manifest lines | manifest MiB | entry point | peak RSS MiB | wall s | exit |")
    print("|---:|---:|---|---:|---:|---:|")
    rss, wall, code = run([py, "-c", _IMPORT])
    print(f"| — | — | import only | {rss / 2**20:.0f} | {wall:.1f} | {code} |", flush=True)
    for lines in args.lines:
        root = Path(tempfile.mkdtemp(prefix="manifest-memory-", dir=args.dir))
        try:
            bag, tar = build(root, lines, args.path_chars, args.tag_lines)
            mib = (bag / "manifest-sha256.txt").stat().st_size / 2**20
            commands = {
                "validate": [py, "-m", "packhorse", "validate", str(bag)],
                "validate-json": [py, "-m", "packhorse", "validate", "--json", str(bag)],
                "unpack": [py, "-c", _UNPACK, str(tar)],
                "staging": [py, "-c", _STAGING, str(bag)],
            }
            for name in args.entry_points:
                rss, wall, code = run(commands[name])
                print(f"| {lines:,} | {mib:.0f} | {name} | {rss / 2**20:.0f} | {wall:.1f} | {code} |", flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
