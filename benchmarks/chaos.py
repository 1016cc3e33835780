#!/usr/bin/env python3
"""Chaos harness: real ``packhorse run`` processes, real signals, seeded random faults, and a
checker that trusts nothing of packhorse.

It generates observation data in rounds (a few raw data packages per round, hundreds over a
long run) into the source of a three-site installation (fyst → cologne, cornell; 2 s leases),
runs ``packhorse run --until-idle`` processes on it and injects faults at seeded random times
and at named fault points (a test-only pause hook marks the moment a worker is inside, e.g.,
``long_term_archive.write``, just before publishing):

* ``kill``    SIGKILL of a ``packhorse run`` process, then a restart;
* ``stop``    SIGSTOP of a ``packhorse run`` and its worker processes (its process group: a
              frozen machine) for longer than the lease, a second ``packhorse run`` started
              meanwhile, then SIGCONT: the stale workers wake and try to finish;
* ``double``  a run whose local dispatcher delivers every operation twice;
* ``dberror`` a run whose manager cycle meets a database error in its middle (twice).

Runs overlap freely (two processes on one configuration at once must be safe). After the last
fault it waits out a lease, runs once more without faults, retries by hand whatever an open
circuit breaker holds (the human of I5, counted as ``human_retries``), and then **checks from
outside**: it walks the archive folders (every tar opened with :mod:`tarfile`, every payload
hashed and compared with the sha256 the harness recorded when it wrote the source file and
with the bag's own manifest) and every location folder for leftover temporary files. A
watcher thread snapshots every archive object (inode, size, mtime) every 50 ms while the runs
go: an object that changes or vanishes after it was first seen counts as *overwritten*. FAILED
operations are read with plain SQL (:mod:`sqlite3`), never through packhorse: each must have an
error context, a failure event and a notification.

Output: the seed (replay with the same ``--seed``: the data set and the fault schedule — types,
delays, named points — repeat; the process interleaving does not) and one line of figures::

    chaos: seed=7 runs=31 faults=20 ... duplicates=0 lost=0 corrupt=0 overwritten=0 ...
           recovery_median_s=1.9 recovery_max_s=5.2 result=PASS

*Fault to recovery* is the time from the fault until the pipeline next published an object in
any buffer or archive folder, or until every run of the round finished, whichever came first.

Exit status 0 when every count that must be 0 is 0, else 1. Every run loads the test-side
hooks ``tests/fault_hooks.py`` (``PACKHORSE_HOOKS__MODULE``; packhorse itself has no test
switch): the fault plan goes to them in ``PACKHORSE_TEST_FAULTS``. ``--no-fencing`` sets
``PACKHORSE_TEST_NO_FENCING=1``, which makes them load the harness's own variant without
fencing, ``tests/unfenced.py`` (fencing tokens ignored, publication replaces): the harness must
then report overwritten objects and fail.

Usage::

    python benchmarks/chaos.py --faults 20 --seed 1          # the CI size
    python benchmarks/chaos.py --faults 500 --seed 42        # the long run
    python benchmarks/chaos.py --faults 4 --types stop --points long_term_archive.write --no-fencing
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FAULT_TYPES = ("kill", "stop", "double", "dberror")
NAMED_POINTS = ("raw_data_package.write", "data_transfer_package.write", "transfer.writing", "unpack.write",
                "long_term_archive.writing", "long_term_archive.write")
LTA_DIRS = ("sites/cologne/archive", "sites/cornell/archive")
WATCHED_DIRS = ("sites/fyst/buffer", "sites/cologne/buffer", "sites/cornell/buffer", *LTA_DIRS)
PARTIAL_MARK = ".packhorse-partial"
LEASE_SECONDS = 2.0

CONFIG = """\
[database]
url = "sqlite:///packhorse.db"
[executor]
kind = "local"
workers = 2
[[sites]]
name = "fyst"
[[sites]]
name = "cologne"
[[sites]]
name = "cornell"
[[locations]]
name = "fyst-source"
site = "fyst"
role = "source"
path = "source"
[[locations]]
name = "fyst-buffer"
site = "fyst"
role = "buffer"
path = "sites/fyst/buffer"
[[locations]]
name = "cologne-buffer"
site = "cologne"
role = "buffer"
path = "sites/cologne/buffer"
[[locations]]
name = "cologne-lta"
site = "cologne"
role = "long_term_archive"
path = "sites/cologne/archive"
[[locations]]
name = "cornell-buffer"
site = "cornell"
role = "buffer"
path = "sites/cornell/buffer"
[[locations]]
name = "cornell-lta"
site = "cornell"
role = "long_term_archive"
path = "sites/cornell/archive"
[[routes]]
source_site = "fyst"
destination_sites = ["cologne", "cornell"]
[packaging]
group_depth = 2
settle_seconds = 0
bundle_target_bytes = 300000
bundle_max_wait_seconds = 0.5
[managers]
poll_interval_seconds = 0.5
[recovery]
lease_timeout_seconds = {lease}
heartbeat_interval_seconds = 0.3
monitor_interval_seconds = 0.2
retry_backoff_base_seconds = 0.05
retry_backoff_max_seconds = 0.5
"""


@dataclass
class Fault:
    """One injected fault: its type, where, when (monotonic s) and when the pipeline recovered."""

    kind: str
    detail: str
    at: float
    recovered_at: float | None = None


@dataclass
class Figures:
    """The outcome of a chaos run (every count but ``runs``/``faults``/``human_retries`` must be 0)."""

    seed: int
    runs: int = 0
    faults: list[Fault] = field(default_factory=list)
    packages: int = 0
    files: int = 0
    duplicates: int = 0
    lost: int = 0
    corrupt: int = 0
    overwritten: int = 0
    temporaries: int = 0
    failed: int = 0
    unexplained_failed: int = 0
    hung: int = 0
    human_retries: int = 0
    elapsed: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not (self.duplicates or self.lost or self.corrupt or self.overwritten or self.temporaries
                    or self.unexplained_failed or self.hung)

    def recovery_times(self) -> list[float]:
        return [f.recovered_at - f.at for f in self.faults if f.recovered_at is not None]

    def line(self) -> str:
        rt = self.recovery_times()
        by = {t: sum(1 for f in self.faults if f.kind == t) for t in FAULT_TYPES}
        med = f"{statistics.median(rt):.2f}" if rt else "-"
        mx = f"{max(rt):.2f}" if rt else "-"
        return (f"chaos: seed={self.seed} runs={self.runs} faults={len(self.faults)} "
                f"({' '.join(f'{k}={v}' for k, v in by.items())}) packages={self.packages} files={self.files} "
                f"duplicates={self.duplicates} lost={self.lost} corrupt={self.corrupt} "
                f"overwritten={self.overwritten} temporaries={self.temporaries} failed={self.failed} "
                f"unexplained_failed={self.unexplained_failed} hung={self.hung} human_retries={self.human_retries} "
                f"recovery_median_s={med} recovery_max_s={mx} elapsed_s={self.elapsed:.0f} "
                f"result={'PASS' if self.passed else 'FAIL'}")

    def as_dict(self) -> dict[str, object]:
        rt = self.recovery_times()
        return {"seed": self.seed, "runs": self.runs, "faults": len(self.faults),
                "by_type": {t: sum(1 for f in self.faults if f.kind == t) for t in FAULT_TYPES},
                "packages": self.packages, "files": self.files, "duplicates": self.duplicates, "lost": self.lost,
                "corrupt": self.corrupt, "overwritten": self.overwritten, "temporaries": self.temporaries,
                "failed": self.failed, "unexplained_failed": self.unexplained_failed, "hung": self.hung,
                "human_retries": self.human_retries,
                "recovery_median_s": statistics.median(rt) if rt else None,
                "recovery_max_s": max(rt) if rt else None, "elapsed_s": self.elapsed,
                "passed": self.passed, "problems": self.problems[:50]}


class Watcher(threading.Thread):
    """Snapshots every object in the watched folders every ``interval`` seconds.

    Archive objects must never change or vanish once seen (I2); the newest appearance of any
    object tells when the pipeline made progress (fault-to-recovery times).
    """

    def __init__(self, root: Path, interval: float = 0.05) -> None:
        super().__init__(daemon=True, name="chaos-watcher")
        self.root = root
        self.interval = interval
        self.stop = threading.Event()
        self.seen: dict[str, tuple[int, int, int]] = {}   # archive objects: (inode, size, mtime_ns)
        self.changed: set[str] = set()
        self.known: set[str] = set()                      # every object ever seen (progress)
        self.lock = threading.Lock()
        self.appearances: list[tuple[float, bool]] = []  # (when, in an archive)

    def scan(self) -> None:
        now = time.monotonic()
        for d in WATCHED_DIRS:
            base = self.root / d
            if not base.exists():
                continue
            archive = d in LTA_DIRS
            present: set[str] = set()
            for dirpath, _dirs, files in os.walk(base):
                for name in files:
                    if PARTIAL_MARK in name:
                        continue
                    p = os.path.join(dirpath, name)
                    rel = f"{d}/{os.path.relpath(p, base)}"
                    try:
                        st = os.stat(p)
                    except FileNotFoundError:
                        continue
                    present.add(rel)
                    with self.lock:
                        if rel not in self.known:
                            self.known.add(rel)
                            self.appearances.append((now, archive))
                        if archive:
                            sig = (st.st_ino, st.st_size, st.st_mtime_ns)
                            old = self.seen.setdefault(rel, sig)
                            if old != sig:
                                self.changed.add(rel)
            if archive:
                with self.lock:
                    for rel in [r for r in self.seen if r.startswith(d + "/") and r not in present]:
                        self.changed.add(rel)  # an archive object vanished

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            try:
                self.scan()
            except Exception as e:  # keep watching
                print(f"chaos: watcher error {e!r}", file=sys.stderr)

    def first_appearance_after(self, t: float, *, archive: bool = False) -> float | None:
        """When the first object (``archive``: archive object) appeared after ``t``, or ``None``."""
        with self.lock:
            later = [a for a, in_archive in self.appearances if a > t and (in_archive or not archive)]
        return min(later) if later else None


#: how long a stopped run waits for the run started in its place to finish (``wake_after_successor``), seconds
SUCCESSOR_WAIT_SECONDS = 20.0


class Harness:
    """One chaos run in ``workdir`` (see the module docstring)."""

    def __init__(self, workdir: Path, *, seed: int, faults: int, types: tuple[str, ...] = FAULT_TYPES,
                 points: tuple[str, ...] = NAMED_POINTS, units_per_round: int = 6, no_fencing: bool = False,
                 verbose: bool = False, round_timeout: float = 300.0, named_only: bool = False,
                 wake_after_successor: bool = False) -> None:
        self.root = workdir
        #: a stopped run is woken once the run started in its place has finished (not after the
        #: successor's first archive object, up to 8 s): every stale writer then wakes after its
        #: object was published by another, whatever the machine's load (the negative control)
        self.wake_after_successor = wake_after_successor
        self.rng = random.Random(seed)
        self.fig = Figures(seed=seed)
        self.target_faults = faults
        self.types = types
        self._type_bag: list[str] = []
        self.points = points
        self.units_per_round = units_per_round
        self.no_fencing = no_fencing
        self.named_only = named_only
        self.verbose = verbose
        self.round_timeout = round_timeout
        self.cfg = self.root / "packhorse.toml"
        self.manifest: dict[str, str] = {}   # source path -> sha256, recorded when written
        self.procs: list[subprocess.Popen[bytes]] = []
        self.markers = 0
        self.unit = 0
        self.watcher = Watcher(self.root)

    # -- plumbing -----------------------------------------------------------------
    def log(self, msg: str) -> None:
        if self.verbose:
            print(f"chaos: {msg}", file=sys.stderr, flush=True)

    def env(self, hooks: list[dict[str, object]] | None = None) -> dict[str, str]:
        env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "PACKHORSE_LOG_LEVEL": "ERROR"}
        env.pop("PACKHORSE_TEST_FAULTS", None)
        env.pop("PACKHORSE_TEST_NO_FENCING", None)
        # the test-side hooks (packhorse.runtime.hooks): the fault plan below, or the variant without fencing
        env["PACKHORSE_HOOKS__MODULE"] = str(REPO / "tests" / "fault_hooks.py")
        if hooks:
            env["PACKHORSE_TEST_FAULTS"] = json.dumps(hooks)
        if self.no_fencing:
            env["PACKHORSE_TEST_NO_FENCING"] = "1"
        return env

    def packhorse(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "packhorse", *args, "-c", str(self.cfg)], env=self.env(),
                              capture_output=True, text=True, timeout=timeout)

    def start_run(self, hooks: list[dict[str, object]] | None = None) -> subprocess.Popen[bytes]:
        p = subprocess.Popen([sys.executable, "-m", "packhorse", "run", "-c", str(self.cfg), "--until-idle",
                              "--quiet"], env=self.env(hooks), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)  # its own process group
        self.procs.append(p)
        self.fig.runs += 1
        return p

    def live(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def marker_hook(self) -> tuple[Path, dict[str, object]]:
        self.markers += 1
        marker = self.root / "markers" / f"m{self.markers}"
        point = self.rng.choice(self.points)
        return marker, {"point": point, "action": "pause", "seconds": 0.6, "marker": str(marker), "times": 1}

    # -- data -----------------------------------------------------------------------
    def setup(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "source").mkdir(exist_ok=True)
        (self.root / "markers").mkdir(exist_ok=True)
        self.cfg.write_text(CONFIG.format(lease=LEASE_SECONDS), encoding="utf-8")
        r = self.packhorse("init")
        if r.returncode != 0:
            raise SystemExit(f"chaos: packhorse init failed: {r.stderr}")

    def add_round_data(self) -> None:
        """Write ``units_per_round`` new observation units (one raw data package each)."""
        for _ in range(self.units_per_round):
            self.unit += 1
            for i in range(self.rng.randint(1, 3)):
                rel = f"cam{self.unit % 3}/obs{self.unit:05d}/frame_{i}.dat"
                data = self.rng.randbytes(self.rng.randint(1, 48) * 1024)
                p = self.root / "source" / rel
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(data)
                self.manifest[rel] = hashlib.sha256(data).hexdigest()
            self.fig.packages += 1
        self.fig.files = len(self.manifest)

    # -- faults ---------------------------------------------------------------------
    def wait_marker_or_delay(self, proc: subprocess.Popen[bytes], marker: Path, delay: float) -> str:
        """Wait until ``marker`` appears (named point) or ``delay`` passes; returns which."""
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline and proc.poll() is None:
            if marker.exists():
                return f"at named point {getattr(proc, 'chaos_point', '?')}"
            time.sleep(0.01)
        return f"after {delay:.2f}s"

    def record(self, kind: str, detail: str) -> Fault:
        f = Fault(kind, detail, time.monotonic())
        self.fig.faults.append(f)
        self.log(f"fault {len(self.fig.faults)}: {kind} {detail}")
        return f

    def inject(self, kind: str) -> bool:
        """Inject one fault of ``kind``; ``False`` if there was no running process to hit."""
        if kind == "double":
            self.start_run([{"point": "dispatch", "action": "duplicate"}])
            self.record(kind, "every dispatch delivered twice")
            return True
        if kind == "dberror":
            self.start_run([{"point": "manager.cycle", "action": "db_error", "times": 2}])
            self.record(kind, "database error in the middle of two manager cycles")
            return True
        targets = self.live()
        if not targets:
            return False
        proc = self.rng.choice(targets)
        marker = getattr(proc, "chaos_marker", None)
        if marker is not None and (self.named_only or self.rng.random() < 0.5):
            # at the named point its run was given: wait until a worker is inside it
            how = self.wait_marker_or_delay(proc, marker, 60.0)
            if not how.startswith("at named point"):
                return False
        else:
            delay = self.rng.uniform(0.05, 1.5)
            time.sleep(delay)
            how = f"after {delay:.2f}s"
        if proc.poll() is not None:
            return False
        if kind == "kill":
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            self.record(kind, f"SIGKILL pid {proc.pid} {how}")
            self.spawn()
            return True
        # stop: longer than the lease, a second run meanwhile, then wake the stale one
        os.killpg(proc.pid, signal.SIGSTOP)  # the run and its worker processes
        f = self.record(kind, f"SIGSTOP process group {proc.pid} {how}")
        time.sleep(LEASE_SECONDS + 1.0)
        started = time.monotonic()
        successor = self.spawn()
        if self.wake_after_successor:
            try:  # at most 20 s: the stopped run may hold its successor up (CI saw a 300 s wait)
                successor.wait(min(self.round_timeout, SUCCESSOR_WAIT_SECONDS))
            except subprocess.TimeoutExpired:
                pass
        # let the successor publish something in an archive first (up to 8 s), so the stale
        # worker wakes after its work was done by another (the post-mortem's sequence)
        deadline = started + 8.0
        while time.monotonic() < deadline and self.watcher.first_appearance_after(started, archive=True) is None:
            time.sleep(0.05)
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGCONT)
        f.detail += f" for {time.monotonic() - f.at:.1f}s"
        return True

    def next_type(self) -> str:
        """The next fault type: every type once, in a seeded random order, then again — so 20
        faults cover all four types (an independent choice per fault missed one about once in
        80 CI runs)."""
        if not self._type_bag:
            self._type_bag = list(self.types)
            self.rng.shuffle(self._type_bag)
        return self._type_bag.pop()

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start a run with a named-point pause hook (so a later fault can land inside it)."""
        marker, hook = self.marker_hook()
        p = self.start_run([hook])
        p.chaos_marker = marker  # type: ignore[attr-defined]
        p.chaos_point = hook["point"]  # type: ignore[attr-defined]
        return p

    def throttle(self, max_live: int = 2) -> None:
        """Let rounds overlap, but wait while more than ``max_live`` runs are alive."""
        deadline = time.monotonic() + self.round_timeout
        while len(self.live()) > max_live and time.monotonic() < deadline:
            time.sleep(0.05)

    def wait_round(self) -> None:
        deadline = time.monotonic() + self.round_timeout
        while self.live():
            if time.monotonic() > deadline:
                for p in self.live():
                    self.fig.hung += 1
                    self.fig.problems.append(f"packhorse run pid {p.pid} still running after {self.round_timeout}s")
                    p.kill()
                    p.wait()
                break
            time.sleep(0.05)
        end = time.monotonic()
        for f in self.fig.faults:
            if f.recovered_at is None:
                nxt = self.watcher.first_appearance_after(f.at)
                f.recovered_at = min(nxt, end) if nxt is not None else end

    # -- the run --------------------------------------------------------------------
    def run(self) -> Figures:
        t0 = time.monotonic()
        self.setup()
        self.watcher.start()
        try:
            while len(self.fig.faults) < self.target_faults:
                self.add_round_data()
                self.spawn()
                if self.rng.random() < 0.3:
                    self.spawn()  # two runs on one configuration at once
                for _ in range(self.rng.randint(1, 3)):
                    if len(self.fig.faults) >= self.target_faults:
                        break
                    kind = self.next_type()
                    if not self.inject(kind) and not self.live():
                        self.spawn()  # it finished before the fault: hit the next one
                        self.inject(kind)
                self.throttle()
            self.wait_round()
            self.finish()
        finally:
            self.watcher.stop.set()
            self.watcher.join()
            for p in self.live():
                p.kill()
        self.check()
        self.fig.elapsed = time.monotonic() - t0
        return self.fig

    def finish(self) -> None:
        """A last clean run (after a lease, so partials of killed writers are swept), and the
        human's part: retry what an open circuit breaker holds."""
        time.sleep(LEASE_SECONDS + 0.5)
        for _ in range(5):
            r = self.packhorse("run", "--until-idle", "--quiet")
            self.fig.runs += 1
            if r.returncode != 4:
                break
            listed = json.loads(self.packhorse("breaker", "list", "--json").stdout or "[]")
            for b in listed:
                if b["state"] == "open":
                    self.packhorse("retry", b["kind"], str(b["operation_id"]), "--reason", "chaos harness operator")
                    self.fig.human_retries += 1
        self.watcher.scan()

    # -- the independent checker ------------------------------------------------------
    def check(self) -> None:
        fig = self.fig
        for p in self.root.rglob(f"*{PARTIAL_MARK}*"):
            fig.temporaries += 1
            fig.problems.append(f"temporary file left: {p.relative_to(self.root)}")
        fig.overwritten = len(self.watcher.changed)
        fig.problems += [f"archive object changed or vanished: {r}" for r in sorted(self.watcher.changed)]
        failed_paths = self.failed_evidence()
        for d in LTA_DIRS:
            found: dict[str, int] = {}
            for tar_path in sorted((self.root / d).rglob("*.tar")):
                self.check_tar(tar_path, found)
            for rel, n in found.items():
                if n > 1:
                    fig.duplicates += n - 1
                    fig.problems.append(f"{d}: {rel} archived {n} times")
            for rel in self.manifest:
                if rel not in found and rel not in failed_paths:
                    fig.lost += 1
                    fig.problems.append(f"{d}: {rel} not archived")

    def check_tar(self, tar_path: Path, found: dict[str, int]) -> None:
        fig = self.fig
        try:
            with tarfile.open(tar_path) as tar:
                declared: dict[str, str] = {}
                payload: dict[str, str] = {}
                for m in tar:
                    _top, _, rest = m.name.partition("/")
                    if not m.isreg():
                        continue
                    f = tar.extractfile(m)
                    assert f is not None
                    data = f.read()
                    if rest == "manifest-sha256.txt":
                        for line in data.decode().splitlines():
                            sha, _, name = line.partition(" ")
                            declared[name.strip().removeprefix("data/")] = sha
                    elif rest.startswith("data/"):
                        payload[rest[5:]] = hashlib.sha256(data).hexdigest()
        except (tarfile.TarError, OSError, EOFError) as e:
            fig.corrupt += 1
            fig.problems.append(f"{tar_path}: unreadable tar: {e}")
            return
        for rel, sha in payload.items():
            found[rel] = found.get(rel, 0) + 1
            if self.manifest.get(rel) != sha or declared.get(rel) != sha:
                fig.corrupt += 1
                fig.problems.append(f"{tar_path.name}: {rel} sha256 {sha} != source {self.manifest.get(rel)} "
                                    f"/ manifest {declared.get(rel)}")

    def failed_evidence(self) -> set[str]:
        """FAILED operations by plain SQL: each needs an error context, a failure event and a
        notification. Returns source paths whose loss a FAILED operation explains."""
        con = sqlite3.connect(f"file:{self.root / 'packhorse.db'}?mode=ro", uri=True)
        try:
            rows = con.execute("SELECT id, kind, error_context, raw_data_package_id FROM operations "
                               "WHERE status = 'FAILED'").fetchall()
            explained: set[str] = set()
            for op_id, kind, ctx, pkg in rows:
                self.fig.failed += 1
                events = con.execute("SELECT count(*) FROM failure_events WHERE operation_id = ?", (op_id,)).fetchone()[0]
                notes = con.execute("SELECT count(*) FROM notification_outbox WHERE operation_id = ?",
                                    (op_id,)).fetchone()[0]
                if not ctx or not events or not notes:
                    self.fig.unexplained_failed += 1
                    self.fig.problems.append(f"FAILED {kind} {op_id} lacks evidence (context={bool(ctx)}, "
                                             f"events={events}, notifications={notes})")
                if pkg is not None:
                    explained |= {r[0] for r in con.execute(
                        "SELECT relative_path FROM raw_data_files WHERE raw_data_package_id = ?", (pkg,))}
                self.fig.problems.append(f"FAILED {kind} {op_id}")
            return explained
        finally:
            con.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--faults", type=int, default=20, help="faults to inject (default 20)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: random, printed)")
    ap.add_argument("--workdir", type=Path, default=None, help="where to run (default: a temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--types", default=",".join(FAULT_TYPES), help=f"fault types (default {','.join(FAULT_TYPES)})")
    ap.add_argument("--points", default=",".join(NAMED_POINTS), help="named fault points for kill/stop")
    ap.add_argument("--named-only", action="store_true", help="kill/stop only at named fault points")
    ap.add_argument("--units-per-round", type=int, default=6, help="new raw data packages per round")
    ap.add_argument("--no-fencing", action="store_true", help="TEST ONLY: switch fencing off; must FAIL")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 31)
    types = tuple(t for t in a.types.split(",") if t)
    bad = [t for t in types if t not in FAULT_TYPES]
    if bad:
        ap.error(f"--types: unknown fault type(s) {bad}; one of {FAULT_TYPES}")
    print(f"chaos: seed={seed} (replay: python benchmarks/chaos.py --faults {a.faults} --seed {seed}"
          f"{' --types ' + a.types if a.types != ','.join(FAULT_TYPES) else ''})", flush=True)
    workdir = a.workdir or Path(tempfile.mkdtemp(prefix="packhorse-chaos-"))
    h = Harness(workdir, seed=seed, faults=a.faults, types=types, points=tuple(a.points.split(",")),
                units_per_round=a.units_per_round, no_fencing=a.no_fencing, verbose=a.verbose,
                named_only=a.named_only)
    try:
        fig = h.run()
    finally:
        if not a.keep and a.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    for p in fig.problems[:20]:
        print(f"chaos: problem: {p}", file=sys.stderr)
    if a.json:
        a.json.write_text(json.dumps(fig.as_dict(), indent=2))
    print(fig.line(), flush=True)
    return 0 if fig.passed else 1


if __name__ == "__main__":
    sys.exit(main())
