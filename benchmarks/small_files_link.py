#!/usr/bin/env python3
"""20,000 small files over a long thin link: packhorse end to end against ``tar | ssh | tar``.

Runs on the multi-site test bed (``tests/multisite/testbed.py``, root only): every site link is
shaped to ``--rate-mbit`` (``tc tbf``, both ways) and the sites' SSH paths go through the bed's
delaying relay (``--delay-ms`` one way, a round trip of twice that). The data set is
``run_benchmarks.py``'s (b): 20,000 files of 0–16 KiB in 100 ``instrument-NN/obs-NNNN`` groups,
generated once outside the bed (mtimes an hour in the past). Every round builds a fresh bed and
runs, in an order rotating per round:

* ``tar | ssh | tar``: in fyst's namespace, ``sha256sum`` of every file into a manifest, then
  ``tar c`` of the tree and the manifest ``| ssh -p 2202`` (to cologne through the relay, strict
  host keys, batch mode) ``tar x`` into a folder beside cologne's storage, then ``sha256sum -c``
  there. No fsync (the plain pipeline); packhorse fsyncs everything it publishes.
* ``packhorse``: ``init`` at each site, the bed's workers, managers and monitor started and
  idle; the clock starts when the 100 group folders are renamed into fyst's source (one rename
  each, so the files appear at once) and stops when the ops database holds a present copy at
  every destination archive of a package holding each of the 20,000 files. The destinations
  are ``--destinations`` (default: cologne only, the fair comparison with one ``tar | ssh |
  tar``); the bed's route is rewritten to them. Then packhorse's processes are stopped, and
  every file is checked from outside packhorse in the package tars at each destination
  (``tarfile``: every file once, with its sha256).

The packhorse side is measured further (printed, and as JSON with ``--json``):

* its operations from the ops database: per kind the count, first start and last finish
  (seconds after the files appeared) and the busy seconds; when the scan registered the files;
* the bytes written: every process in the bed's namespaces is sampled every 0.25 s
  (``/proc/<pid>/io`` ``write_bytes``: bytes the process caused to be written to storage,
  counted when the page is dirtied; ``cancelled_write_bytes`` reported beside) from the moment
  the files appear until every operation is done (buffers emptied); grouped by site and
  process (packhorse workers, sshd, PostgreSQL, ...). A process that lives less than a sample
  interval may be missed; kernel threads (ext4's journal, writeback) are not counted.
  Payload bytes are the source files' sizes (one archive copy); the ratio is bytes written by
  packhorse's processes (the database's separately) per payload byte per destination archive;
* the bytes each stage published, from the physical copies (the write floor per stage).

Usage (root)::

    python benchmarks/small_files_link.py --rate-mbit 100 --delay-ms 50 --repeats 2
    python benchmarks/small_files_link.py --repeats 1 --only packhorse --destinations cologne cornell
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "multisite"))

from run_benchmarks import compile_bytecode, gen_b  # noqa: E402

#: the namespace names of a bed, by the part after ``phb<tag>-``
PARTS = ("central", "fyst", "cologne", "cornell")


def make_dataset(folder: Path) -> tuple[dict[str, str], int]:
    """Data set (b) in ``folder`` (made once, kept): ``({relative path: sha256}, payload bytes)``."""
    manifest = folder.parent / "b.manifest.json"
    if not manifest.exists() or not folder.is_dir():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        gen_b(folder)
        past = time.time() - 3600
        sums = {}
        for dirpath, _dirs, files in os.walk(folder):
            for f in files:
                p = Path(dirpath) / f
                os.utime(p, (past, past))
                sums[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
        subprocess.run(["sync"], check=True)
        manifest.write_text(json.dumps(sums))
    sums = json.loads(manifest.read_text())
    return sums, sum((folder / p).stat().st_size for p in sums)


class IoSampler:
    """``/proc/<pid>/io`` of every process in the given network namespaces, sampled in a thread.

    Per process (pid and start time) the last values seen and the values at :meth:`start`;
    :meth:`totals` sums the growth since then per group (namespace part and process kind)."""

    def __init__(self, namespaces: dict[str, str], interval: float = 0.25) -> None:
        self.inodes = {os.stat(f"/run/netns/{ns}").st_ino: part for part, ns in namespaces.items()}
        self.interval = interval
        self.first: dict[tuple[int, str], dict[str, int]] = {}
        self.last: dict[tuple[int, str], dict[str, int]] = {}
        self.kind: dict[tuple[int, str], str] = {}
        self.ppid: dict[tuple[int, str], int] = {}
        self.alive: set[tuple[int, str]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started_before = False

    @staticmethod
    def _kind(pid: int) -> str:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return "?"
        for word in ("worker", "manager", "monitor", "init"):
            if f"packhorse {word}" in cmd:
                return f"packhorse {word}"
        for word in ("postgres", "redis", "delay_relay", "sshd", "sha256sum", "tar", "psql"):
            if word in cmd:
                return word
        return cmd[:40]

    def sample(self) -> None:
        alive = set()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            try:
                part = self.inodes.get(os.stat(f"/proc/{pid}/ns/net").st_ino)
                if part is None:
                    continue
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                start, ppid = stat[19], int(stat[1])
                io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
            except (OSError, IndexError, ValueError):
                continue
            key = (pid, start)
            vals = {k: int(v) for k, v in io.items()}
            # CPU time, clock ticks: user + system, with the children the process reaped
            vals["cpu_ticks"] = sum(int(stat[i]) for i in (11, 12, 13, 14))
            if key not in self.kind:
                self.kind[key] = f"{part}: {self._kind(pid)}"
                # a process already running when the sampling started counts from then
                self.first[key] = vals if self._started_before else {k: 0 for k in vals}
            self.last[key] = vals
            self.ppid[key] = ppid
            alive.add(key)
        self.alive = alive

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def start(self) -> None:
        self._started_before = True
        self.sample()
        self._started_before = False
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def totals(self, field: str = "write_bytes") -> dict[str, int]:
        """Growth of ``field`` per group. ``/proc/<pid>/io`` of a process includes what its
        children did once it has reaped them: a process that ended is left out when its parent
        was one of the sampled processes (its bytes are in the parent's), counted otherwise."""
        sampled = {pid for pid, _ in self.last}
        out: dict[str, int] = {}
        for key, vals in self.last.items():
            if key not in self.alive and self.ppid[key] in sampled:
                continue
            grow = vals.get(field, 0) - self.first[key].get(field, 0)
            if grow:
                out[self.kind[key]] = out.get(self.kind[key], 0) + grow
        return dict(sorted(out.items()))


def psql(bed: Any, sql: str) -> list[list[str]]:
    """Rows of ``sql`` against the bed's ops database (run in the central namespace)."""
    from testbed import CENTRAL_ADDRESS, PG_BIN, PG_PORT

    r = bed.in_ns("central", str(PG_BIN / "psql"), "-h", CENTRAL_ADDRESS, "-p", str(PG_PORT), "-U", "postgres",
                  "-d", "packhorse", "-X", "-q", "-t", "-A", "-F", "\t", "-c", sql, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"psql: {r.stderr.strip()}")
    return [line.split("\t") for line in r.stdout.splitlines() if line]


def archived_counts(bed: Any, destinations: list[str]) -> dict[str, int]:
    """Files with a present copy of their package at each destination's archive."""
    names = ",".join(f"'{d}-archive'" for d in destinations)
    rows = psql(bed, "select l.name, count(*) from raw_data_files f join physical_copies c "
                     "on c.raw_data_package_id = f.raw_data_package_id join data_locations l on l.id = c.location_id "
                     f"where c.status = 'present' and l.name in ({names}) group by l.name")
    got = {name: int(n) for name, n in rows}
    return {f"{d}-archive": got.get(f"{d}-archive", 0) for d in destinations}


def check_archives(bed: Any, sums: dict[str, str], destinations: list[str]) -> None:
    """Every source file exactly once, with its bytes, in the package tars at each destination."""
    from testbed import archived_files

    for d in destinations:
        found = archived_files(bed, d)
        bad = [p for p, s in sums.items() if found.get(p) != [s]]
        if bad or len(found) != len(sums):
            raise SystemExit(f"{d}: {len(bad)} files missing, duplicated or corrupt (e.g. {bad[:3]}); "
                             f"{len(found)} found")


def baseline(bed: Any, data: Path, sums: dict[str, str], work: Path,
             compression: bool = False) -> tuple[float, dict[str, int]]:
    """``sha256sum`` at fyst, ``tar c | ssh | tar x`` into cologne, ``sha256sum -c`` there
    (``ssh -C`` with ``compression``)."""
    from testbed import CENTRAL_ADDRESS

    key, kh = bed.root / "keys" / "client_key", bed.root / "keys" / "known_hosts"
    manifest_dir = bed.root / "sites" / "fyst" / "baseline"
    dst = bed.root / "sites" / "cologne" / "baseline"
    manifest_dir.mkdir(parents=True, exist_ok=True)
    ssh = (f"ssh {'-C ' if compression else ''}-p 2202 -i {key} -o UserKnownHostsFile={kh} -o StrictHostKeyChecking=yes -o BatchMode=yes "
           f"root@{CENTRAL_ADDRESS}")
    remote = f"mkdir -p {dst} && tar xf - -C {dst} && cd {dst} && sha256sum -c --quiet SHA256SUMS"
    script = (f"set -eu; cd {data} && find . -type f -print0 | xargs -0 sha256sum > {manifest_dir}/SHA256SUMS && "
              f"tar cf - -C {data} . -C {manifest_dir} SHA256SUMS | {ssh} '{remote}'")
    io = IoSampler(bed.ns)
    io.start()
    t0 = time.monotonic()
    subprocess.run(["ip", "netns", "exec", bed.ns["fyst"], "sh", "-c", script], check=True)
    took = time.monotonic() - t0
    io.stop()
    n = sum(1 for p in dst.rglob("*") if p.is_file())
    if n != len(sums) + 1:
        raise SystemExit(f"tar | ssh | tar: {n} files at cologne, expected {len(sums) + 1}")
    shutil.rmtree(dst)
    shutil.rmtree(manifest_dir)
    return took, io.totals()


def wait_ready(bed: Any, sites: list[str], since: dict[str, int], timeout: float = 120) -> None:
    """Until the workers of ``sites`` say they are ready (Celery's ``ready.`` line) after
    ``since`` (characters of each worker's log before this round's start: the bed's logs are
    appended to from round to round, and an earlier round's line says nothing of this one's
    workers)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(re.search(r"\bready\.", bed.log(f"worker-{s}")[since.get(s, 0):]) for s in sites):
            return
        time.sleep(0.5)
    raise SystemExit(f"workers not ready within {timeout} s: " + " | ".join(bed.log(f"worker-{s}")[-800:] for s in sites))


def start_packhorse(bed: Any, db_delay_ms: float) -> None:
    """The bed's packhorse processes; with ``db_delay_ms`` the sites' processes reach the
    database and the broker through delaying relays in the central namespace (``db_delay_ms``
    each way), as a site across a long link does, while the managers and the monitor (central)
    reach them directly."""
    if not db_delay_ms:
        bed.start_packhorse()
        return
    from testbed import CENTRAL_ADDRESS, PG_PORT, REDIS_PORT, SITES
    from testbed import HERE as BED_HERE

    for port in (PG_PORT, REDIS_PORT):
        bed._spawn(f"relay-{port}", "central",
                   [sys.executable, str(BED_HERE / "delay_relay.py"), "--listen", f"{CENTRAL_ADDRESS}:{10000 + port}",
                    "--to", f"{CENTRAL_ADDRESS}:{port}", "--delay-ms", str(db_delay_ms)])
        bed._wait_port("central", CENTRAL_ADDRESS, 10000 + port, f"relay to port {port}")
    text = bed.config.read_text()
    for port in (PG_PORT, REDIS_PORT):
        assert f"{CENTRAL_ADDRESS}:{port}/" in text
        text = text.replace(f"{CENTRAL_ADDRESS}:{port}/", f"{CENTRAL_ADDRESS}:{10000 + port}/")
    site_config = bed.root / "packhorse-sites.toml"
    site_config.write_text(text)
    for site in SITES:
        r = bed.cli(site, "init", "-c", str(site_config), "--site", site, timeout=300)
        if r.returncode != 0:
            raise SystemExit(f"init --site {site} exited {r.returncode}: {r.stderr[-3000:]}")
    for site in SITES:
        bed._spawn(f"worker-{site}", site, [sys.executable, "-m", "packhorse", "worker", "--site", site, "-c",
                                            str(site_config), "--concurrency", str(bed.worker_processes)],
                   hide_sites=True)
    for n in (1, 2):
        bed._spawn(f"manager-{n}", "central", [sys.executable, "-m", "packhorse", "manager", "-c", str(bed.config),
                                               "--instance", str(n)], hide_sites=True)
    bed._spawn("monitor", "central", [sys.executable, "-m", "packhorse", "monitor", "-c", str(bed.config)],
               hide_sites=True)


def packhorse(bed: Any, data: Path, sums: dict[str, str], destinations: list[str],
              timeout: float, db_delay_ms: float = 0.0, transfer_processes: int = 0) -> dict[str, Any]:
    """Start packhorse on the bed, make the files appear in fyst's source, time until archived.
    ``transfer_processes``: each destination also runs ``packhorse worker --kinds transfer``
    with that many pool processes (docs/deployment.md "Scaling": a dedicated transfer worker)."""
    workers = ["fyst", *destinations, *([f"{d}-transfers" for d in destinations] if transfer_processes else [])]
    since = {s: len(bed.log(f"worker-{s}")) for s in workers}
    start_packhorse(bed, db_delay_ms)
    if transfer_processes:
        config = bed.root / "packhorse-sites.toml" if db_delay_ms else bed.config
        for site in destinations:
            bed._spawn(f"worker-{site}-transfers", site,
                       [sys.executable, "-m", "packhorse", "worker", "--site", site, "-c", str(config),
                        "--kinds", "transfer", "--concurrency", str(transfer_processes)], hide_sites=True)
    wait_ready(bed, workers, since)
    time.sleep(5)  # managers and monitor through their first cycles, idle
    source = bed.root / "sites" / "fyst" / "source"
    groups = sorted(p.name for p in data.iterdir())
    io = IoSampler(bed.ns)
    io.start()
    t_wall, t0 = time.time(), time.monotonic()
    for g in groups:
        os.rename(data / g, source / g)
    try:
        took = None
        while time.monotonic() - t0 < timeout:
            counts = archived_counts(bed, destinations)
            if all(n >= len(sums) for n in counts.values()):
                took = time.monotonic() - t0
                io.sample()
                cpu_archived = io.totals("cpu_ticks")
                break
            time.sleep(0.5)
        if took is None:
            logs = "\n".join(f"--- {n}\n{bed.log(n)[-2500:]}" for n in ("manager-1", "worker-fyst", "worker-cologne"))
            raise SystemExit(f"not archived within {timeout} s: {counts}\n{logs}")
        # the rest of the run (buffers emptied) for the bytes written
        done_by = time.monotonic() + 120
        while time.monotonic() < done_by:
            left = psql(bed, "select (select count(*) from operations where status <> 'COMPLETED') + (select count(*) "
                             "from physical_copies c join data_locations l on l.id = c.location_id where l.role = "
                             "'buffer' and c.status in ('present', 'deletion_pending'))")
            if int(left[0][0]) == 0:
                break
            time.sleep(1)
        settled = time.monotonic() - t0
        io.stop()
        timeline = {}
        for kind, n, first, last, busy in psql(
                bed, f"select kind, count(*), min(extract(epoch from started_at)) - {t_wall}, "
                     f"max(extract(epoch from finished_at)) - {t_wall}, "
                     "sum(extract(epoch from finished_at - started_at)) from operations group by kind "
                     "order by min(started_at)"):
            timeline[kind] = {"count": int(n), "first_start": round(float(first), 2),
                              "last_finish": round(float(last or "nan"), 2), "busy_seconds": round(float(busy or 0), 2)}
        each = [[kind, round(float(a), 2), round(float(b), 2), int(n)] for kind, a, b, n in psql(
            bed, f"select kind, extract(epoch from started_at) - {t_wall}, extract(epoch from finished_at) - {t_wall}, "
                 "bytes_done from operations where kind in ('data_transfer_package', 'transfer', 'unpack') "
                 "and finished_at is not null order by started_at")]
        # each packaging operation: created, dispatched, started, finished (s after the files
        # appeared) and the worker that ran it last
        package_starts = [[*(round(float(x), 2) for x in row[:4]), row[4]] for row in psql(
            bed, f"select extract(epoch from created_at) - {t_wall}, extract(epoch from scheduled_at) - {t_wall}, "
                 f"extract(epoch from started_at) - {t_wall}, extract(epoch from finished_at) - {t_wall}, "
                 "coalesce(lease_owner, '') from operations where kind = 'raw_data_package' and finished_at is not null "
                 "order by started_at")]
        first_reg, last_reg = psql(bed, f"select min(extract(epoch from registered_at)) - {t_wall}, "
                                        f"max(extract(epoch from registered_at)) - {t_wall} from raw_data_files")[0]
        published = {f"{loc} {what}": {"copies": int(n), "bytes": int(b)} for loc, what, n, b in psql(
            bed, "select l.name, case when c.raw_data_package_id is null then 'bundle' else 'package' end, "
                 "count(*), sum(c.size) from physical_copies c join data_locations l on l.id = c.location_id "
                 "group by 1, 2 order by 1, 2")}
        statuses = psql(bed, "select kind, status, count(*) from operations group by 1, 2 order by 1, 2")
    finally:
        for name in [n for n in bed.procs if n.startswith(("worker-", "manager-", "monitor", "relay-5", "relay-6"))]:
            bed.stop(name)
        for g in groups:
            if (source / g).exists():
                os.rename(source / g, data / g)
    check_archives(bed, sums, destinations)
    return {"seconds": took, "settled_seconds": round(settled, 1), "registered": [round(float(first_reg), 2),
            round(float(last_reg), 2)], "timeline": timeline, "each": each, "published": published,
            "operations": statuses, "cpu_seconds": {k: round(v / os.sysconf("SC_CLK_TCK"), 2)
                                                     for k, v in cpu_archived.items()},
            "package_starts": package_starts, "write_bytes": io.totals(), "cancelled_write_bytes":
            io.totals("cancelled_write_bytes"), "read_bytes": io.totals("read_bytes")}


def main() -> None:
    """Build a bed per round, time the kinds interleaved, print the tables, take the bed down."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate-mbit", type=float, default=100.0)
    ap.add_argument("--delay-ms", type=float, default=50.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--destinations", nargs="+", default=["cologne"], choices=["cologne", "cornell"])
    ap.add_argument("--db-delay-ms", type=float, default=0.0,
                    help="one-way delay between the sites and the database and broker (default: none, the bed's)")
    ap.add_argument("--only", choices=["baseline", "packhorse"], help="run one side only")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds packhorse may take per round")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/packhorse-bench-small-files-link"))
    ap.add_argument("--json", type=Path, help="write every round's measurements here")
    ap.add_argument("--worker-processes", type=int, nargs="+", default=[2],
                    help="pool processes of each site's worker; one packhorse kind per count, interleaved "
                         "(default: the bed's 2)")
    ap.add_argument("--bundles-in-flight", type=int, nargs="+", default=[0],
                    help="[packaging] bundles_in_flight; one packhorse kind per value (and per process "
                         "count), interleaved (default: 0, the bed's: partial bundles wait 2 s)")
    ap.add_argument("--packaging", nargs="+", default=[],
                    help="further [packaging] settings, one packhorse kind per value (and per process count and "
                         "bundles_in_flight), each a comma-separated list of KEY=VALUE, e.g. "
                         "'bundles_in_flight=4,bundle_target_bytes=16000000'; route.KEY=VALUE sets the route's "
                         "KEY (e.g. route.compression=true); transfer_processes=N starts a dedicated transfer "
                         "worker (--kinds transfer --concurrency N) at each destination")
    ap.add_argument("--baseline-compression", action="store_true",
                    help="also time `tar | ssh -C | tar` (OpenSSH's zlib), a kind of its own")
    a = ap.parse_args()

    from testbed import TestBed, namespaces_work

    why = namespaces_work()
    if why:
        raise SystemExit(why)
    compile_bytecode()
    data = a.workdir / "data" / "b"
    sums, payload = make_dataset(data)
    print(f"data set (b): {len(sums):,} files, {payload:,} bytes", flush=True)
    # kind → (pool processes a site, [packaging] settings beyond the bed's)
    ours: dict[str, tuple[int, dict[str, str]]] = {}
    for n in a.worker_processes:
        for f in a.bundles_in_flight:
            for extra in a.packaging or [""]:
                settings = dict(kv.split("=", 1) for kv in extra.split(",") if kv)
                if f:
                    settings["bundles_in_flight"] = str(f)
                words = ([f"{n} processes a site"] if len(a.worker_processes) > 1 else []) + (
                    [f"bundles_in_flight {f}"] if len(a.bundles_in_flight) > 1 or f else []) + (
                    [extra] if extra else [])
                ours[", ".join(["packhorse", *words])] = (n, settings)
    kinds = ["tar | ssh | tar", *(["tar | ssh -C | tar"] if a.baseline_compression else []), *ours]
    if a.only:
        kinds = [k for k in kinds if (k in ours) == (a.only == "packhorse")]
    times: dict[str, list[float]] = {k: [] for k in kinds}
    rounds: list[dict[str, Any]] = []
    try:
        for r in range(a.repeats):
            result: dict[str, Any] = {"round": r + 1, "uptime": Path("/proc/loadavg").read_text().split()[:3]}
            for k in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
                # a fresh bed for every kind: packhorse's database must not know the files yet
                bed = TestBed(a.workdir / "bed", rate_mbit=a.rate_mbit, delay_ms=a.delay_ms,
                              worker_processes=ours.get(k, (2, {}))[0]).up(packhorse=False)
                try:
                    text = bed.config.read_text()
                    route = 'destination_sites = ["cologne", "cornell"]'
                    assert route in text
                    text = text.replace(route, "destination_sites = " + json.dumps(a.destinations))
                    transfer_processes = 0
                    for key, value in ours.get(k, (2, {}))[1].items():
                        if key == "transfer_processes":  # the benchmark's, not the configuration's
                            transfer_processes = int(value)
                            continue
                        if key.startswith("route."):  # the route's table (the last in the bed's file)
                            assert '\nmethod = "sftp"\n' in text
                            text = text.replace('\nmethod = "sftp"\n', f'\nmethod = "sftp"\n{key[6:]} = {value}\n', 1)
                            continue
                        line = re.search(rf"^{re.escape(key)} = .*$", text, flags=re.M)
                        if line:  # the bed's own value of it
                            text = text[:line.start()] + f"{key} = {value}" + text[line.end():]
                        else:
                            text = text.replace("\n[packaging]\n", f"\n[packaging]\n{key} = {value}\n", 1)
                    bed.config.write_text(text)
                    if k in ours:
                        result[k] = packhorse(bed, data, sums, a.destinations, a.timeout, a.db_delay_ms,
                                              transfer_processes=transfer_processes)
                        took = result[k]["seconds"]
                    else:
                        took, io = baseline(bed, data, sums, a.workdir, compression="-C" in k)
                        result[k] = {"seconds": took, "write_bytes": io}
                finally:
                    bed.down()
                times[k].append(took)
                print(f"round {r + 1}: {k}: {took:.1f} s", flush=True)
            rounds.append(result)
    finally:
        if a.json:
            a.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "payload_bytes": payload,
                                          "files": len(sums), "rounds": rounds}, indent=1))
    print(f"\n{len(sums):,} files, {payload:,} bytes, {a.rate_mbit:g} Mbit/s with a {2 * a.delay_ms:g} ms round "
          f"trip on the SSH path, {2 * a.db_delay_ms:g} ms between the sites and the database and broker; packhorse to {', '.join(a.destinations)}; {a.repeats} interleaved round(s), "
          "median wall time\n")
    base = statistics.median(times["tar | ssh | tar"]) if "tar | ssh | tar" in times else None
    print("| kind | seconds (runs) | time / tar pipeline |\n| --- | --- | --- |")
    for k, ts in times.items():
        t = statistics.median(ts)
        ratio = f"{t / base:.2f}" if base else "-"
        print(f"| {k} | {t:.1f} ({', '.join(f'{x:.1f}' for x in ts)}) | {ratio} |")
    for res in rounds:
        for name in ours:
            ph = res.get(name)
            if not ph:
                continue
            print(f"\nround {res['round']} (load {' '.join(res['uptime'])}): {name} archived in {ph['seconds']:.1f} s, "
                  f"every operation done at {ph['settled_seconds']} s; files registered "
                  f"{ph['registered'][0]}–{ph['registered'][1]} s")
            print("| operation | count | first start s | last finish s | busy s |\n| --- | --- | --- | --- | --- |")
            for kind, t in ph["timeline"].items():
                print(f"| {kind} | {t['count']} | {t['first_start']} | {t['last_finish']} | {t['busy_seconds']} |")
            print("| bundle, transfer, unpack | started s | finished s | bytes done |\n| --- | --- | --- | --- |")
            for kind, st, fin, n in ph["each"]:
                print(f"| {kind} | {st} | {fin} | {n:,} |")
            print("\nCPU seconds until archived (user + system, children reaped included):")
            print("| process | CPU s |\n| --- | --- |")
            for k, v in sorted(ph["cpu_seconds"].items(), key=lambda kv: -kv[1]):
                print(f"| {k} | {v} |")
            per_copy = payload * len(a.destinations)
            db = sum(v for k, v in ph["write_bytes"].items() if "postgres" in k)
            mine = sum(v for k, v in ph["write_bytes"].items() if "packhorse" in k)
            rest = sum(ph["write_bytes"].values()) - db - mine
            print(f"\nbytes written (write_bytes), payload {payload:,} bytes x {len(a.destinations)} archive copies:")
            print("| process | bytes written | per payload byte archived |\n| --- | --- | --- |")
            for k, v in ph["write_bytes"].items():
                print(f"| {k} | {v:,} | {v / per_copy:.2f} |")
            print(f"| packhorse processes | {mine:,} | **{mine / per_copy:.2f}** |")
            print(f"| database (PostgreSQL) | {db:,} | {db / per_copy:.2f} |")
            print(f"| other processes of the bed | {rest:,} | {rest / per_copy:.2f} |")
            print("\npublished objects (physical copies, deleted ones included):")
            print("| location, artifact | copies | bytes | per payload byte archived |\n| --- | --- | --- | --- |")
            for k, v in ph["published"].items():
                print(f"| {k} | {v['copies']} | {v['bytes']:,} | {v['bytes'] / per_copy:.2f} |")
    for res in rounds:
        if "tar | ssh | tar" in res:
            w = res["tar | ssh | tar"]["write_bytes"]
            print(f"\nround {res['round']}: tar | ssh | tar wrote {sum(w.values()):,} bytes ({w})")


if __name__ == "__main__":
    main()
