#!/usr/bin/env python3
"""One bundle over a long thin link: packhorse's ``sftp`` pull against ``rsync`` over ``ssh``.

Runs on the multi-site test bed (``tests/multisite/testbed.py``, root only): the link between
fyst and the centre is shaped to ``--rate-mbit`` (``tc tbf``, both ways) and the SSH path goes
through the bed's delaying relay (``--delay-ms`` one way, so the round trip is twice that). A
file of ``--mib`` MiB of random bytes lies in fyst's buffer; in cologne's namespace, interleaved
``--repeats`` times (the order rotating each round):

* ``rsync -e ssh``: ``rsync -e "ssh -p 2201 -i KEY -o UserKnownHostsFile=KH"
  root@10.201.0.1:SRC DST`` (strict host keys, rsync's own whole-file check);
* ``sftp, N streams``: what the ``sftp`` transfer does with the bytes
  (:class:`packhorse.storage.sftp.SftpSource`, N streams, into a resumable disk write that defers
  its hash and is read back and compared with the recorded sha256 before it is published), in a
  Python process started for it (its start and imports, 0.5–1 s, are in its time);
* with ``--warm``, also ``sftp, N streams, running process``: the same in a process that has
  started and imported packhorse before the clock starts, as a worker that takes a transfer has
  (its SSH logins are still in its time, as ``rsync``'s are in ``rsync``'s).

Reported per kind: the median wall time, Mbit/s of payload, the share of the link rate, and the
ratio of its time to ``rsync -e ssh``'s. Every copy's sha256 is checked and the copy deleted.

Usage (root)::

    python benchmarks/long_link.py --mib 1024 --rate-mbit 100 --delay-ms 50 --repeats 2 --streams 1 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_files import BLOCK, make_source, sha256_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "multisite"))

def pull(host: str, port: int, key_file: str, known_hosts: str, root: str, name: str, size: int, sha: str,
         dst_root: str, streams: int) -> None:
    """In the destination's namespace: the ``sftp`` transfer's byte path, published only if the
    read-back matches ``sha`` (I4)."""
    from packhorse.storage.disk import DiskBackend
    from packhorse.storage.sftp import SftpSource, SshEndpoint

    if os.environ.get("BENCH_WAIT_FOR_GO"):  # a running process: started and imported, told when to begin
        print("ready", flush=True)
        sys.stdin.readline()
    endpoint = SshEndpoint(location="bench-source", host=host, port=port, user="root", key_file=Path(key_file),
                           known_hosts_file=Path(known_hosts), root=root)
    dst = DiskBackend("bench-destination", Path(dst_root))
    with SftpSource(endpoint, streams=streams) as source:
        with dst.open_resumable_write(name, 1) as w, source.open_read(name, size=size) as f:
            w.defer_hash()
            buf = bytearray(BLOCK)
            view = memoryview(buf)
            while n := f.readinto(buf):
                w.write(view[:n])
            result = w.publish(sha)
    assert result.sha256 == sha and result.read_back


def main() -> None:
    """Bring up a bed, time the kinds interleaved, print the table, take the bed down."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--rate-mbit", type=float, default=100.0)
    ap.add_argument("--delay-ms", type=float, default=50.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--warm", action="store_true",
                    help="also time each stream count in a process started before the clock (as a running worker)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/packhorse-bench-long-link"))
    ap.add_argument("--pull", nargs=10, help=argparse.SUPPRESS)  # the in-namespace half
    a = ap.parse_args()
    if a.pull:
        host, port, key, kh, root, name, size, sha, dst, streams = a.pull
        pull(host, int(port), key, kh, root, name, int(size), sha, dst, int(streams))
        return

    from testbed import CENTRAL_ADDRESS, SRC, TestBed, namespaces_work

    why = namespaces_work()
    if why:
        raise SystemExit(why)
    bed = TestBed(a.workdir, rate_mbit=a.rate_mbit, delay_ms=a.delay_ms).up(packhorse=False)
    try:
        src_dir = bed.root / "sites" / "fyst" / "buffer"
        src_dir.mkdir(parents=True, exist_ok=True)
        src = src_dir / "bundle.tar"
        sha = make_source(src, a.mib)
        size = src.stat().st_size
        dst_dir = bed.root / "sites" / "cologne" / "buffer"
        dst_dir.mkdir(parents=True, exist_ok=True)
        key, kh = bed.root / "keys" / "client_key", bed.root / "keys" / "known_hosts"
        env = {**os.environ, "PYTHONPATH": str(SRC)}

        def rsync() -> float:
            ssh = f"ssh -p 2201 -i {key} -o UserKnownHostsFile={kh} -o StrictHostKeyChecking=yes -o BatchMode=yes"
            t0 = time.monotonic()
            subprocess.run(["ip", "netns", "exec", bed.ns["cologne"], "rsync", "-e", ssh,
                            f"root@{CENTRAL_ADDRESS}:{src}", str(dst_dir / "rsync.tar")], check=True)
            took = time.monotonic() - t0
            assert sha256_file(dst_dir / "rsync.tar") == sha
            (dst_dir / "rsync.tar").unlink()
            return took

        def sftp(streams: int, warm: bool = False) -> float:
            cmd = ["ip", "netns", "exec", bed.ns["cologne"], sys.executable, __file__, "--pull",
                   CENTRAL_ADDRESS, "2201", str(key), str(kh), str(src_dir), src.name, str(size), sha,
                   str(dst_dir), str(streams)]
            if warm:
                p = subprocess.Popen(cmd, env={**env, "BENCH_WAIT_FOR_GO": "1"}, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
                assert p.stdout is not None and p.stdin is not None
                assert p.stdout.readline().strip() == "ready"
                t0 = time.monotonic()
                p.stdin.write("go\n")
                p.stdin.flush()
                assert p.wait() == 0
            else:
                t0 = time.monotonic()
                subprocess.run(cmd, check=True, env=env)
            took = time.monotonic() - t0
            assert sha256_file(dst_dir / src.name) == sha
            (dst_dir / src.name).unlink()
            return took

        kinds = {"rsync -e ssh": rsync}
        for n in a.streams:
            kinds[f"sftp, {n} stream{'s' if n > 1 else ''}"] = (lambda n=n: sftp(n))
            if a.warm:
                kinds[f"sftp, {n} stream{'s' if n > 1 else ''}, running process"] = (lambda n=n: sftp(n, True))
        times: dict[str, list[float]] = {k: [] for k in kinds}
        names = list(kinds)
        for r in range(a.repeats):
            for k in names[r % len(names):] + names[:r % len(names)]:
                times[k].append(kinds[k]())
                print(f"round {r + 1}: {k}: {times[k][-1]:.1f} s", flush=True)
    finally:
        bed.down()
        subprocess.run(["rm", "-rf", str(a.workdir)], check=False)
    base = statistics.median(times["rsync -e ssh"])
    print(f"\n{size:,} bytes over {a.rate_mbit:g} Mbit/s with a {2 * a.delay_ms:g} ms round trip on the SSH "
          f"path, {a.repeats} interleaved round(s), median wall time\n")
    print("| kind | seconds (rounds) | Mbit/s | of the link rate | time / rsync -e ssh (rounds) |\n"
          "| --- | --- | --- | --- | --- |")
    for k in names:
        t = statistics.median(times[k])
        rounds = ", ".join(f"{x:.1f}" for x in times[k])
        ratios = ", ".join(f"{x / b:.3f}" for x, b in zip(times[k], times["rsync -e ssh"]))
        print(f"| {k} | {t:.1f} ({rounds}) | {size * 8 / t / 1e6:.1f} | {size * 8 / t / 1e6 / a.rate_mbit:.0%} | "
              f"{t / base:.3f} ({ratios}) |")


if __name__ == "__main__":
    main()
