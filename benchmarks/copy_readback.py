#!/usr/bin/env python3
"""One verified copy of a large object on disk, the way the transfer and archive stages make it,
against the script's way: ``cp`` + ``sync FILE`` + ``openssl dgst -sha256`` of the copy.

Three kinds, interleaved ``--repeats`` times on one object of ``--mib`` MiB (random bytes,
written once to a source folder under ``--workdir``):

* ``script``: ``cp SRC DST && sync DST && openssl dgst -sha256 DST`` (the baseline's archive
  hop for one file, compared with the recorded sha256);
* ``read back before publishing``: :func:`packhorse.stages.base.copy_object` between two disk
  backends as packhorse runs it (the copy is not hashed while written; the fsynced partial is
  read back and compared with the recorded sha256 before it is published,
  :meth:`~packhorse.storage.base.PendingWrite.defer_hash`);
* ``hash while writing, re-read after``: the same copy through a disk backend whose writes
  decline to defer their hash (what every copy did before, and what S3 copies still do): hashed
  while written, compared before publishing, re-read after.

Reported per kind: the median wall time and CPU time (user + system of this process, or of the
script's child processes), and the ratios of packhorse's two ways to the script. Every copy's
bytes are checked against the source's sha256 and deleted after it is measured.

Usage::

    python benchmarks/copy_readback.py --mib 512 --repeats 3 --workdir /work/tmp
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from packhorse.runtime.hooks import NO_HOOKS
from packhorse.stages.base import copy_object
from packhorse.storage.disk import DiskBackend, _DiskPendingWrite


class _HashingPending(_DiskPendingWrite):
    """A disk write that declines to defer its hash (the S3 path's verification on disk)."""

    def defer_hash(self) -> bool:
        return False


class HashingDiskBackend(DiskBackend):
    """A disk backend whose writes hash while written and are re-read after publishing."""

    def open_write(self, key: str):  # type: ignore[no-untyped-def]
        pending = super().open_write(key)
        pending.__class__ = _HashingPending
        return pending


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _work() -> SimpleNamespace:
    return SimpleNamespace(ctx=SimpleNamespace(hooks=NO_HOOKS), claim=SimpleNamespace(attempt=1), info={},
                           check=lambda: None, progress=lambda n: None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="copy-readback-", dir=a.workdir))
    try:
        for d in ("src", "dst"):
            (root / d).mkdir()
        size = a.mib << 20
        block = os.urandom(8 << 20)
        h = hashlib.sha256()
        with open(root / "src" / "b.tar", "wb") as f:
            for _ in range(size // len(block)):
                f.write(block)
                h.update(block)
        sha = h.hexdigest()
        src = DiskBackend("src", root / "src")
        kinds = {"script": None, "read back before publishing": DiskBackend("dst", root / "dst"),
                 "hash while writing, re-read after": HashingDiskBackend("dst", root / "dst")}
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
        for r in range(a.repeats):
            order = list(kinds) if r % 2 == 0 else list(reversed(kinds))
            for kind in order:
                dst = root / "dst" / "c.tar"
                subprocess.run(["sync"], check=True)
                if kind == "script":
                    c0, t = _cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
                    subprocess.run(["cp", str(root / "src" / "b.tar"), str(dst)], check=True)
                    subprocess.run(["sync", str(dst)], check=True)
                    out = subprocess.run(["openssl", "dgst", "-sha256", "-r", str(dst)], check=True,
                                         capture_output=True, text=True).stdout.split()[0]
                    wall, cpu = time.perf_counter() - t, _cpu(resource.RUSAGE_CHILDREN) - c0
                    if out != sha:
                        raise SystemExit(f"script: copy has sha256 {out}, expected {sha}")
                else:
                    c0, t = _cpu(resource.RUSAGE_SELF), time.perf_counter()
                    result = copy_object(_work(), src, "b.tar", kinds[kind], "c.tar", size=size,  # type: ignore[arg-type]
                                         sha256=sha, point="archive")
                    wall, cpu = time.perf_counter() - t, _cpu(resource.RUSAGE_SELF) - c0
                    if result.sha256 != sha or result.size != size:
                        raise SystemExit(f"{kind}: copy is {result.size} bytes with {result.sha256}")
                times[kind].append((wall, cpu))
                os.chmod(dst, 0o644)
                dst.unlink()
        med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in times.items()}
        for k, (w, c) in med.items():
            runs = ", ".join(f"{x:.2f}" for x, _ in times[k])
            line = f"{k:36s} wall {w:6.2f} s (runs {runs}), cpu {c:6.2f} s"
            if k != "script":
                line += f"; vs script: wall {w / med['script'][0]:.2f}x, cpu {c / med['script'][1]:.2f}x"
            print(line)
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
