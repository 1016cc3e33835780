"""Bag validation throughput and memory on a large bag tar, and what a sparse file costs on disk.

    PYTHONPATH=src python benchmarks/bag_validation.py [--gib 2] [--dir /tmp] [--algorithms sha256 sha512]
    PYTHONPATH=src python benchmarks/bag_validation.py --sparse [--dir /tmp]

Throughput: for each algorithm, builds a bag tar of ``--gib`` GiB (16 payload files of
pseudo-random bytes, tag files first as packhorse writes them, a manifest of that algorithm),
then in the same run times

* the baseline: reading the tar file in 1 MiB blocks and hashing every byte with hashlib's
  sha256 (the yardstick the target is stated in), and with the manifest's algorithm;
* ``packhorse.bags.validation.validate_tar`` on the file (random access) and on the same bytes
  as a non-seekable stream (a pipe fed by this process), each in a fresh child process whose peak
  RSS (``VmHWM``) is reported
  next to that of a child that only imports packhorse.

The ratios are baseline time / validation time over the same bytes (1.0 = as fast as hashing
alone), in wall time and in CPU time (the process's own user + system seconds, which the other
users of a shared machine disturb far less), each side's best of ``ROUNDS`` interleaved runs.
Every figure comes from the same run; the tar is deleted afterwards.

Sparse (``--sparse``): a 1 GiB file with 4 KiB written is packaged with ``write_bag_tar`` (the
package tar, as a buffer and an archive hold it), carried in a bundle tar, and extracted from the
package tar with ``extract_tar`` (a staged copy); prints the bytes allocated on disk
(``st_blocks`` × 512) at each place, and deletes everything.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packhorse.bags.extraction import extract_tar
from packhorse.bags.packaging import PayloadFile, write_bag_tar

FILES = 16
BLOCK = 1 << 20
ROUNDS = 3


class _Generated(io.RawIOBase):
    """``size`` deterministic pseudo-random bytes (a 1 MiB random block, varied per block)."""

    def __init__(self, seed: int, size: int) -> None:
        self._base = hashlib.shake_256(f"seed-{seed}".encode()).digest(BLOCK)
        self._left = size
        self._n = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[no-untyped-def]
        if self._left <= 0:
            return 0
        n = min(len(b), self._left, BLOCK)
        block = self._n.to_bytes(8, "little") + self._base[8:n]  # every block differs
        b[:n] = block[:n]
        self._n += 1
        self._left -= n
        return n


def _payload(total: int) -> list[PayloadFile]:
    size = total // FILES
    files = []
    for i in range(FILES):
        h = hashlib.sha256()
        src = io.BufferedReader(_Generated(i, size), BLOCK)
        while block := src.read(BLOCK):
            h.update(block)
        files.append(PayloadFile(path=f"obs-{i:04d}/scan-{i:04d}.fits", size=size, sha256=h.hexdigest(),
                                 mtime=1_700_000_000,
                                 open=lambda i=i: io.BufferedReader(_Generated(i, size), BLOCK)))  # type: ignore[misc]
    return files


def build(path: Path, total: int, algorithm: str) -> int:
    """Write a bag tar of ``total`` payload bytes with one manifest of ``algorithm``; returns its size."""
    files = _payload(total)
    with open(path, "wb") as out:
        write_bag_tar(out, bag_dir="bench", files=files, bag_info={}, bagging_date="2024-05-06",
                      external_identifier="bench", tag_mtime=1_700_000_000)
    if algorithm != "sha256":
        _swap_manifest(path, files, algorithm)
    return path.stat().st_size


def _swap_manifest(path: Path, files: list[PayloadFile], algorithm: str) -> None:
    """Rewrite the tar with manifest-<algorithm>.txt instead of manifest-sha256.txt (tags first)."""
    import tarfile

    digests = {}
    for f in files:
        h = hashlib.new(algorithm)
        with f.open() as src:
            while block := src.read(BLOCK):
                h.update(block)
        digests[f.path] = h.hexdigest()
    manifest = "".join(f"{d}  data/{p}\n" for p, d in sorted(digests.items())).encode()
    tmp = path.with_suffix(".tmp")
    with tarfile.open(path) as src, tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as dst:
        tags: dict[str, bytes] = {}
        for m in src:
            if not m.name.startswith("bench/data/"):
                tags[m.name] = src.extractfile(m).read()  # type: ignore[union-attr]
                continue
            if tags:
                tags.pop("bench/manifest-sha256.txt")
                tags[f"bench/manifest-{algorithm}.txt"] = manifest
                tm = "".join(f"{hashlib.new(algorithm, d).hexdigest()}  {n[len('bench/'):]}\n"
                             for n, d in tags.items() if "tagmanifest" not in n).encode()
                tags = {n: d for n, d in tags.items() if "tagmanifest" not in n}
                tags[f"bench/tagmanifest-{algorithm}.txt"] = tm
                for n, d in tags.items():
                    ti = tarfile.TarInfo(n)
                    ti.size = len(d)
                    dst.addfile(ti, io.BytesIO(d))
                tags = {}
            dst.addfile(m, src.extractfile(m))
    tmp.replace(path)


def hash_file(path: Path, algorithm: str) -> dict[str, float]:
    """Wall and CPU seconds to read ``path`` in 1 MiB blocks and hash it with ``algorithm``."""
    h = hashlib.new(algorithm)
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    t, c = time.perf_counter(), time.process_time()
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return {"seconds": time.perf_counter() - t, "cpu_seconds": time.process_time() - c}


_CHILD = """
import json, sys, time
from pathlib import Path
mode, path = sys.argv[1], Path(sys.argv[2])
from packhorse.bags.validation import validate_tar
result = {}
if mode != "import":
    t, c = time.perf_counter(), time.process_time()
    if mode == "file":
        with open(path, "rb") as f:
            report = validate_tar(f, bag=str(path))[0]
    else:
        report = validate_tar(sys.stdin.buffer, bag=str(path))[0]
    result = {"seconds": time.perf_counter() - t, "cpu_seconds": time.process_time() - c,
              "valid": report.valid, "passes": report.passes,
              "problems": [p.message for p in report.problems][:3]}
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        result["peak_rss_bytes"] = int(line.split()[1]) * 1024
print(json.dumps(result))
"""


def child(mode: str, path: Path) -> dict[str, object]:
    """Run one validation in a fresh process; its result and peak RSS (bytes)."""
    stdin = subprocess.PIPE if mode == "stream" else subprocess.DEVNULL
    p = subprocess.Popen([sys.executable, "-c", _CHILD, mode, str(path)], stdin=stdin, stdout=subprocess.PIPE,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")})
    if mode == "stream":
        assert p.stdin is not None
        with open(path, "rb", buffering=0) as f:
            buf = bytearray(BLOCK)
            while n := f.readinto(buf):
                p.stdin.write(memoryview(buf)[:n])
        p.stdin.close()
    assert p.stdout is not None
    out = p.stdout.read()
    if p.wait():
        raise SystemExit(f"child {mode} failed ({p.returncode})")
    return json.loads(out)  # type: ignore[no-any-return]


def throughput(work: Path, gib: float, algorithms: list[str]) -> list[dict[str, object]]:
    rows = []
    for alg in algorithms:
        path = work / f"bag-{alg}.tar"
        try:
            size = build(path, int(gib * (1 << 30)), alg)
            idle = child("import", path)
            runs: dict[str, list[dict[str, object]]] = {"hashlib": [], "file": [], "stream": []}
            for _ in range(ROUNDS):  # interleaved, so a change of the machine's load hits every side
                runs["hashlib"].append(hash_file(path, alg))  # type: ignore[arg-type]
                runs["file"].append(child("file", path))
                runs["stream"].append(child("stream", path))
            for r in runs["file"] + runs["stream"]:
                if not r["valid"] or r["passes"] != 1:
                    raise SystemExit(f"validation did not pass in one pass: {r}")
            best = {side: {k: min(float(r[k]) for r in rs) for k in ("seconds", "cpu_seconds")}  # type: ignore[arg-type]
                    for side, rs in runs.items()}
            row = {
                "algorithm": alg, "tar_bytes": size, "rounds": ROUNDS,
                **{f"{side}_MiB_s": size / b["seconds"] / 2**20 for side, b in best.items()},
                **{f"{side}_cpu_MiB_s": size / b["cpu_seconds"] / 2**20 for side, b in best.items()},
                "file_vs_hashlib": best["hashlib"]["seconds"] / best["file"]["seconds"],
                "stream_vs_hashlib": best["hashlib"]["seconds"] / best["stream"]["seconds"],
                "file_vs_hashlib_cpu": best["hashlib"]["cpu_seconds"] / best["file"]["cpu_seconds"],
                "stream_vs_hashlib_cpu": best["hashlib"]["cpu_seconds"] / best["stream"]["cpu_seconds"],
                "peak_rss_import_only_bytes": idle["peak_rss_bytes"],
                "peak_rss_file_bytes": max(int(r["peak_rss_bytes"]) for r in runs["file"]),  # type: ignore[call-overload]
                "peak_rss_stream_bytes": max(int(r["peak_rss_bytes"]) for r in runs["stream"]),  # type: ignore[call-overload]
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
        finally:
            path.unlink(missing_ok=True)
            path.with_suffix(".tmp").unlink(missing_ok=True)
    return rows


def _allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def sparse(work: Path) -> dict[str, int]:
    """Bytes allocated for a 1 GiB sparse file with 4 KiB written, at each place packhorse keeps it."""
    root = work / "sparse"
    root.mkdir()
    try:
        src = root / "sparse.bin"
        with open(src, "wb") as f:
            f.truncate(1 << 30)
            f.seek(512 << 20)
            f.write(os.urandom(4096))
        h = hashlib.sha256()
        with open(src, "rb") as f:
            while block := f.read(BLOCK):
                h.update(block)
        pf = PayloadFile(path="sparse.bin", size=1 << 30, sha256=h.hexdigest(), mtime=1_700_000_000,
                         open=lambda: open(src, "rb"))
        package = root / "package.tar"
        with open(package, "wb") as out:
            write_bag_tar(out, bag_dir="pkg", files=[pf], bag_info={}, bagging_date="2024-05-06",
                          external_identifier="pkg", tag_mtime=0)
        result = {"logical_bytes": 1 << 30, "source_allocated": _allocated(src),
                  "package_tar_allocated": _allocated(package)}
        h = hashlib.sha256()
        with open(package, "rb") as f:
            while block := f.read(BLOCK):
                h.update(block)
        ptar = PayloadFile(path="pkg.tar", size=package.stat().st_size, sha256=h.hexdigest(), mtime=0,
                           open=lambda: open(package, "rb"))
        bundle = root / "bundle.tar"
        with open(bundle, "wb") as out:
            write_bag_tar(out, bag_dir="bundle", files=[ptar], bag_info={}, bagging_date="2024-05-06",
                          external_identifier="bundle", tag_mtime=0)
        result["bundle_tar_allocated"] = _allocated(bundle)
        bundle.unlink()
        with open(package, "rb") as f:
            extract_tar(f, root / "staged", source="bench")
        staged = root / "staged" / "pkg" / "data" / "sparse.bin"
        result["staged_file_allocated"] = _allocated(staged)
        print(json.dumps(result), flush=True)
        return result
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--algorithms", nargs="+", default=["sha256", "sha512"])
    ap.add_argument("--sparse", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="packhorse-bagval-bench-", dir=args.dir))
    try:
        if args.sparse:
            sparse(work)
        else:
            throughput(work, args.gib, args.algorithms)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
