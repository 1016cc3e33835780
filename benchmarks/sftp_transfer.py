#!/usr/bin/env python3
"""One large bundle pulled over SSH on loopback: packhorse's ``sftp`` method against ``rsync -e ssh``.

A private OpenSSH server (``tests/sshd_support.py``: 127.0.0.1, a free port, its own host key,
strict host-key checking on both sides) serves a file of ``--mib`` MiB of random bytes. Kinds,
run interleaved ``--repeats`` times (the order rotates each round):

* ``rsync -e ssh``: ``rsync -e "ssh -p PORT -i KEY -o UserKnownHostsFile=KH -o StrictHostKeyChecking=yes"
  127.0.0.1:SRC DST`` (rsync checks its own whole-file checksum);
* ``rsync -e ssh + sha256sum``: the same, then ``sha256sum DST`` compared with the recorded
  sha256 (what packhorse's I4 read-back adds);
* ``sftp, N streams``: what the ``sftp`` transfer (``stages/pull.py``) does with the bytes
  (:class:`packhorse.storage.sftp.SftpSource` with ``N`` streams into a resumable disk write that
  defers its hash, published with the recorded sha256: the fsynced partial is read back and
  compared before it is published), for each ``--streams`` value.

Reported per kind: the median wall time, MB/s (10^6 bytes of the file per second) and the ratio
of the kind's time to ``rsync -e ssh``'s. Every copy's sha256 is checked and the copy deleted.

Usage::

    python benchmarks/sftp_transfer.py --mib 2048 --repeats 1 --streams 1 4
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_files import BLOCK, make_source, sha256_file

from packhorse.storage.disk import DiskBackend
from packhorse.storage.sftp import SftpSource, SshEndpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from sshd_support import PrivateSshd  # noqa: E402 - the tests' private sshd


def run_rsync(sshd: PrivateSshd, src: Path, dst: Path, sha: str, *, check: bool) -> float:
    ssh = (f"ssh -p {sshd.port} -i {sshd.client_key} -o UserKnownHostsFile={sshd.known_hosts} "
           "-o StrictHostKeyChecking=yes -o BatchMode=yes")
    t0 = time.monotonic()
    subprocess.run(["rsync", "-e", ssh, f"{sshd.user}@127.0.0.1:{src}", str(dst)], check=True)
    if check:
        out = subprocess.run(["sha256sum", str(dst)], check=True, capture_output=True, text=True).stdout
        assert out.split()[0] == sha
    took = time.monotonic() - t0
    assert sha256_file(dst) == sha
    dst.unlink()
    return took


def run_sftp(sshd: PrivateSshd, src: Path, dst_root: Path, sha: str, streams: int) -> float:
    endpoint = SshEndpoint(location="bench-source", host="127.0.0.1", port=sshd.port, user=sshd.user,
                           key_file=sshd.client_key, known_hosts_file=sshd.known_hosts, root=str(src.parent))
    dst = DiskBackend("bench-destination", dst_root)
    size = src.stat().st_size
    key = src.name
    t0 = time.monotonic()
    with SftpSource(endpoint, streams=streams) as source:
        with dst.open_resumable_write(key, 1) as w, source.open_read(key, size=size) as f:
            w.defer_hash()
            buf = bytearray(BLOCK)
            view = memoryview(buf)
            while n := f.readinto(buf):
                w.write(view[:n])
            result = w.publish(sha)
    took = time.monotonic() - t0
    assert result.sha256 == sha and result.read_back
    assert sha256_file(dst_root / key) == sha
    (dst_root / key).unlink()
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/packhorse-bench-sftp"))
    args = ap.parse_args()
    work = args.workdir
    (work / "src").mkdir(parents=True, exist_ok=True)
    (work / "dst").mkdir(parents=True, exist_ok=True)
    src = work / "src" / "bundle.tar"
    sha = make_source(src, args.mib)
    size = src.stat().st_size
    sshd = PrivateSshd(work / "sshd").start()
    kinds = {"rsync -e ssh": lambda: run_rsync(sshd, src, work / "dst" / "rsync.tar", sha, check=False),
             "rsync -e ssh + sha256sum": lambda: run_rsync(sshd, src, work / "dst" / "rsync.tar", sha, check=True)}
    for n in args.streams:
        kinds[f"sftp, {n} stream{'s' if n > 1 else ''}"] = (lambda n=n: run_sftp(sshd, src, work / "dst", sha, n))
    times: dict[str, list[float]] = {k: [] for k in kinds}
    names = list(kinds)
    try:
        for r in range(args.repeats):
            for k in names[r % len(names):] + names[:r % len(names)]:
                times[k].append(kinds[k]())
                print(f"round {r + 1}: {k}: {times[k][-1]:.2f} s", flush=True)
    finally:
        sshd.stop()
        src.unlink()
    base = statistics.median(times["rsync -e ssh"])
    print(f"\n{size:,} bytes, {args.repeats} interleaved round(s), median wall time\n")
    print("| kind | seconds | MB/s | time / rsync -e ssh |\n| --- | --- | --- | --- |")
    for k in names:
        t = statistics.median(times[k])
        print(f"| {k} | {t:.2f} | {size / t / 1e6:.0f} | {t / base:.2f} |")


if __name__ == "__main__":
    main()
