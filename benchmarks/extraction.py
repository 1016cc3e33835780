"""What the hostile-input extraction costs at staging, as ratios measured in one run.

Two package tars are built with ``write_bag_tar`` in a temporary folder (deleted afterwards):
**small**, ``--files`` files of 0–16 KiB, and **large**, 4 files of ``--large-mib`` MiB of
pseudo-random bytes. For each, three ways of getting the package out are timed (the faster of
``--repeat`` runs each, alternating, the machine being shared):

* ``stdlib``: what staging did before: one pass hashing the tar while the standard library
  extracts it with the ``data`` filter, then the extracted bag validated
  (``verify_bag_folder``);
* ``extract_tar``: one pass hashing the tar while :func:`packhorse.bags.extraction.extract_tar`
  extracts it, then the same validation (the extraction routine alone against the stdlib's);
* ``staging``: :func:`packhorse.stages.staging.extract_archive_copy` — the check pass (the
  tar reader and the bag validator, nothing written), the extraction pass, the validation.

The tar is read from a file that is in the page cache (it was just written), as an archive
copy on a local disk mostly is not: the second read of the staging pass costs more on cold
storage than here. Prints one JSON line per package with the seconds and the ratios to
``stdlib``.

    PYTHONPATH=src python benchmarks/extraction.py --files 2000 --large-mib 64
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import random
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from packhorse.bags.extraction import DEFAULT_LIMITS, extract_tar
from packhorse.bags.packaging import PayloadFile, verify_bag_folder, write_bag_tar
from packhorse.stages.staging import ArchiveCopy, extract_archive_copy


class _Hashing(io.RawIOBase):
    def __init__(self, f: io.BufferedReader) -> None:
        self.f, self.h = f, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        n = self.f.readinto(b)
        self.h.update(memoryview(b)[:n])
        return n


def _package(root: Path, name: str, payload: dict[str, bytes]) -> Path:
    src = root / f"{name}-src"
    files = []
    for rel, data in payload.items():
        p = src / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        files.append(PayloadFile(path=rel, size=len(data), sha256=hashlib.sha256(data).hexdigest(), mtime=0,
                                 open=lambda p=p: open(p, "rb")))
    tar = root / f"{name}.tar"
    with open(tar, "wb") as out:
        write_bag_tar(out, bag_dir="pkg", files=files, bag_info={}, bagging_date="2024-05-06",
                      external_identifier=name, tag_mtime=0)
    shutil.rmtree(src)
    return tar


def _stdlib(tar: Path, target: Path) -> None:
    with open(tar, "rb") as f:
        reader = _Hashing(f)
        target.mkdir()
        with tarfile.open(fileobj=io.BufferedReader(reader, 1 << 20), mode="r|") as t:
            t.extractall(target, filter="data")
        while reader.read(1 << 20):
            pass
    verify_bag_folder(target / "pkg", source="bench")


def _extract_tar(tar: Path, target: Path) -> None:
    with open(tar, "rb") as f:
        reader = _Hashing(f)
        extract_tar(io.BufferedReader(reader, 1 << 20), target, source="bench")  # type: ignore[arg-type]
        while reader.read(1 << 20):
            pass
    verify_bag_folder(target / "pkg", source="bench")


def _staging(tar: Path, target: Path) -> None:
    digest = hashlib.sha256(tar.read_bytes()).hexdigest()
    copy = ArchiveCopy(open=lambda: open(tar, "rb", buffering=0), size=tar.stat().st_size, sha256=digest,
                       host="bench", key=tar.name)
    extract_archive_copy(copy, target, limits=DEFAULT_LIMITS)


def _time(fn: Callable[[Path, Path], None], tar: Path, work: Path) -> float:
    target = work / "target"
    t0 = time.perf_counter()
    fn(tar, target)
    elapsed = time.perf_counter() - t0
    shutil.rmtree(target)
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--large-mib", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="where the temporary folder goes")
    args = ap.parse_args()
    rnd = random.Random(7)
    root = Path(tempfile.mkdtemp(prefix="packhorse-extraction-", dir=args.dir))
    try:
        packages = {
            "small": {f"d{i // 100:03d}/f{i:05d}.dat": rnd.randbytes(rnd.randint(0, 16384)) for i in range(args.files)},
            "large": {f"big{i}.dat": os.urandom(args.large_mib << 20) for i in range(4)},
        }
        for name, payload in packages.items():
            tar = _package(root, name, payload)
            del payload
            ways = {"stdlib": _stdlib, "extract_tar": _extract_tar, "staging": _staging}
            best = {w: float("inf") for w in ways}
            for _ in range(args.repeat):
                for w, fn in ways.items():
                    best[w] = min(best[w], _time(fn, tar, root))
            print(json.dumps({
                "package": name, "tar_bytes": tar.stat().st_size,
                "seconds": {w: round(s, 3) for w, s in best.items()},
                "ratio_to_stdlib": {w: round(s / best["stdlib"], 2) for w, s in best.items()},
            }), flush=True)
            tar.unlink()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
