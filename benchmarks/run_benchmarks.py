#!/usr/bin/env python3
"""End-to-end benchmark: ``packhorse run --until-idle`` against ``benchmarks/baseline.sh``.

Data sets (generated once per work folder, deterministic):

* ``a``: 2 GiB in 4 files of 512 MiB of pseudo-random bytes, in two ``<instrument>/<obs unit>``
  groups (two raw data packages of 1 GiB, so two bundles at the default 1 GiB bundle target).
* ``b``: 20,000 files of 0–16 KiB (uniform sizes) over 100 ``<instrument>/<obs unit>`` groups.

For every data set each side runs ``--repeats`` times, alternating which side goes first, each
time in a fresh run folder (deleted afterwards) after a ``sync``; the page cache is not dropped,
so both sides find the source files cached. The packhorse side times ``packhorse run -c CFG
--until-idle --quiet`` (``packhorse init`` is timed separately and not counted); the baseline
side times the whole script. Every packhorse run is checked (exit code 0, ``packhorse status
--json``: every package archived, nothing failed, buffers empty; archive folders hold every
package) and so is every baseline run; a broken run aborts the benchmark.

Before the runs, packhorse's own modules are compiled to bytecode (``compileall``), as ``pip
install .`` does at install time: from an editable install under ``PYTHONDONTWRITEBYTECODE=1``
(this machine's environment) Python would otherwise compile every module from source at each
start, in ``packhorse run`` and again in its fork server (about 0.4 s each here).

``--profile`` adds one packhorse run per data set under ``py-spy record`` (not timed with the
others) and prints its hot spots; the raw stacks go to ``benchmarks/results/``.

Usage::

    python benchmarks/run_benchmarks.py                      # both sets, 2 repeats
    python benchmarks/run_benchmarks.py --sets b --repeats 3 --profile
    python benchmarks/run_benchmarks.py --workdir /big/disk/bench --keep-data

The JSON result goes to ``benchmarks/results/<UTC time>.json`` (gitignored).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_summary import print_summary, summarize  # noqa: E402

from packhorse.cli.demo import write_demo_config  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BASELINE = HERE / "baseline.sh"
RESULTS = HERE / "results"

MiB = 1024**2
GiB = 1024**3

#: packhorse runs with the demo's three-site configuration (fyst → cologne, cornell; one
#: buffer per site, one archive per destination; settle 0; bundles up to 1 GiB), the same
#: file ``packhorse demo`` writes (``packhorse.cli.demo.write_demo_config``).
BUNDLE_TARGET = GiB
DESTINATION_LTAS = ("cologne-lta", "cornell-lta")
BUFFERS = ("fyst-buffer", "cologne-buffer", "cornell-buffer")


# ------------------------------------------------------------------------------ data sets

def _write_random(path: Path, size: int, rng: random.Random, block: int = 8 * MiB) -> None:
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(block, left)
            f.write(rng.randbytes(n))
            left -= n


def gen_a(root: Path) -> dict[str, int]:
    """2 GiB in 4 files of 512 MiB, two groups of two."""
    rng = random.Random(0xA)
    n = 0
    for group in ("primecam/obs-0001", "primecam/obs-0002"):
        (root / group).mkdir(parents=True, exist_ok=True)
        for i in range(2):
            _write_random(root / group / f"scan-{i}.bin", 512 * MiB, rng)
            n += 1
    return {"files": n, "bytes": 4 * 512 * MiB, "groups": 2}


def gen_b(root: Path) -> dict[str, int]:
    """20,000 files of 0–16 KiB over 100 groups (10 instruments × 10 observation units)."""
    rng = random.Random(0xB)
    total = 0
    for i in range(20_000):
        g = i % 100
        folder = root / f"instrument-{g // 10:02d}" / f"obs-{g % 10:04d}"
        if i < 100:
            folder.mkdir(parents=True, exist_ok=True)
        size = rng.randint(0, 16 * 1024)
        (folder / f"frame-{i:05d}.dat").write_bytes(rng.randbytes(size))
        total += size
    return {"files": 20_000, "bytes": total, "groups": 100}


def _gen_small(root: Path, files: int, seed: int) -> dict[str, int]:
    """``files`` files of 0–4 KiB (uniform), 200 to a group (``instrument-NN/obs-NNNN``)."""
    rng = random.Random(seed)
    groups = files // 200
    total = 0
    for i in range(files):
        g = i % groups
        folder = root / f"instrument-{g // 100:02d}" / f"obs-{g % 100:04d}"
        if i < groups:
            folder.mkdir(parents=True, exist_ok=True)
        size = rng.randint(0, 4 * 1024)
        (folder / f"frame-{i:06d}.dat").write_bytes(rng.randbytes(size))
        total += size
    return {"files": files, "bytes": total, "groups": groups}


def gen_c(root: Path) -> dict[str, int]:
    """Scale reference: 20,000 files of 0–4 KiB in 100 groups of 200."""
    return _gen_small(root, 20_000, 0xC)


def gen_d(root: Path) -> dict[str, int]:
    """Scale: 200,000 files of 0–4 KiB in 1,000 groups of 200 (ten times set c)."""
    return _gen_small(root, 200_000, 0xD)


DATASETS = {
    "a": ("2 GiB in 4 files (2 groups)", gen_a),
    "b": ("20,000 files of 0-16 KiB (100 groups)", gen_b),
    "c": ("20,000 files of 0-4 KiB (100 groups; scale reference)", gen_c),
    "d": ("200,000 files of 0-4 KiB (1,000 groups; scale)", gen_d),
}
#: Scale pairs: (large set, its reference): the large one's seconds per file against the
#: reference's, measured in the same invocation.
SCALE_PAIRS = (("d", "c"),)


def ensure_dataset(workdir: Path, name: str) -> tuple[Path, dict[str, int]]:
    root = workdir / "data" / name
    marker = workdir / "data" / f"{name}.json"
    if marker.exists() and root.is_dir():
        return root, json.loads(marker.read_text())
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    t = time.monotonic()
    info = DATASETS[name][1](root)
    # make every mtime clearly in the past (settle_seconds = 0 anyway) and flush to disk
    past = time.time() - 3600
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            os.utime(os.path.join(dirpath, f), (past, past))
    subprocess.run(["sync"], check=True)
    marker.write_text(json.dumps(info))
    print(f"  generated data set {name}: {info['files']} files, {info['bytes']:,} bytes "
          f"in {time.monotonic() - t:.1f} s", flush=True)
    return root, info


# ------------------------------------------------------------------------------ runs

class BenchmarkError(RuntimeError):
    pass


def packhorse_cmd() -> list[str]:
    exe = shutil.which("packhorse")
    return [exe] if exe else [sys.executable, "-m", "packhorse"]


def compile_bytecode() -> None:
    """Compile packhorse's modules (``__pycache__``), as ``pip install .`` does."""
    exe = shutil.which("packhorse")
    python = Path(exe).resolve().parent / "python" if exe else Path(sys.executable)
    code = ("import compileall, pathlib, packhorse; "
            "compileall.compile_dir(str(pathlib.Path(packhorse.__file__).parent), quiet=1)")
    subprocess.run([str(python if python.exists() else sys.executable), "-c", code], check=True)


#: packhorse's own folder under every location root (the identity marker ``init`` writes, the
#: quarantine): not data, left out of the checks of what a run left behind
RESERVED = "_packhorse"


def files_under(path: Path) -> list[Path]:
    """Every file below ``path`` outside packhorse's reserved folder of the root."""
    if not path.exists():
        return []
    return [Path(d) / f for d, _, fs in os.walk(path) for f in fs
            if Path(d).relative_to(path).parts[:1] != (RESERVED,)]


def fresh(run_dir: Path) -> None:
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    subprocess.run(["sync"], check=True)


def cleanup(run_dir: Path) -> None:
    shutil.rmtree(run_dir, ignore_errors=True)
    subprocess.run(["sync"], check=True)


def run_baseline(source: Path, run_dir: Path, info: dict[str, int], hasher: str) -> dict[str, object]:
    fresh(run_dir)
    t = time.monotonic()
    p = subprocess.run(["bash", str(BASELINE), "--timings", "--hasher", hasher, str(source), str(run_dir / "work")],
                       capture_output=True, text=True)
    elapsed = time.monotonic() - t
    if p.returncode != 0:
        raise BenchmarkError(f"baseline.sh exited {p.returncode}:\n{p.stderr}")
    sites = run_dir / "work" / "sites"
    for d in ("cologne", "cornell"):
        tars = [f for f in files_under(sites / d / "archive") if f.suffix == ".tar"]
        if len(tars) != info["groups"]:
            raise BenchmarkError(f"baseline: {d} archive holds {len(tars)} package tars, expected {info['groups']}")
    left = [f for d in ("fyst", "cologne", "cornell") for f in files_under(sites / d / "buffer")]
    if left:
        raise BenchmarkError(f"baseline: buffers not empty: {left[:3]}")
    archived = sum(f.stat().st_size for f in files_under(sites / "cologne" / "archive"))
    hops = {}
    for line in p.stderr.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == "s":
            hops[parts[0]] = float(parts[1])
    cleanup(run_dir)
    return {"seconds": elapsed, "archive_bytes_per_site": archived, "hops": hops}


def check_packhorse(cfg: Path, run_dir: Path, info: dict[str, int],
                    env: dict[str, str] | None = None) -> dict[str, object]:
    # env: the environment of the packhorse that made the run (ab_commits: another source tree,
    # whose database may be at another migration)
    p = subprocess.run([*packhorse_cmd(), "status", "-c", str(cfg), "--json"], capture_output=True, text=True,
                       cwd=run_dir, env=env)
    if p.returncode != 0:
        raise BenchmarkError(f"packhorse status exited {p.returncode}: {p.stderr}")
    st = json.loads(p.stdout)
    problems = []
    pk = st["packages"]
    if pk["total"] != info["groups"] or pk["archived"] != pk["total"] or pk["failed"]:
        problems.append(f"packages {pk}, expected {info['groups']} all archived")
    if st["files"]["registered"] != info["files"] or st["files"]["unpackaged"]:
        problems.append(f"files {st['files']}, expected {info['files']} registered, 0 unpackaged")
    if st["failed_operations"]:
        problems.append(f"failed operations {st['failed_operations']}")
    for kind, counts in st["operations"].items():
        if set(counts) - {"COMPLETED"}:
            problems.append(f"operations {kind}: {counts}")
    for loc in BUFFERS:
        if st["copies"][loc]["count"]:
            problems.append(f"{loc} still has {st['copies'][loc]} present copies")
    for loc in DESTINATION_LTAS:
        if st["copies"][loc]["count"] != info["groups"]:
            problems.append(f"{loc} has {st['copies'][loc]} copies, expected {info['groups']}")
    if st["skipped"]:
        problems.append(f"skipped files: {st['skipped'][:3]}")
    sites = run_dir / "data"  # the demo configuration's layout
    for d in ("cologne", "cornell"):
        tars = [f for f in files_under(sites / d / "archive") if f.suffix == ".tar"]
        if len(tars) != info["groups"]:
            problems.append(f"{d} archive folder holds {len(tars)} package tars, expected {info['groups']}")
    left = [f for d in ("fyst", "cologne", "cornell") for f in files_under(sites / d / "buffer")]
    if left:
        problems.append(f"buffer folders not empty: {[str(f) for f in left[:3]]}")
    if problems:
        raise BenchmarkError("packhorse run is broken:\n  " + "\n  ".join(problems))
    return {"operations": {k: v.get("COMPLETED", 0) for k, v in st["operations"].items()},
            "archive_bytes_per_site": st["copies"]["cologne-lta"]["bytes"]}


def timeline(run_dir: Path, t0: float) -> dict[str, object]:
    """Per operation kind: count, first start and last finish (s after the run started), busy seconds."""
    import sqlite3

    def off(ts: str | None) -> float | None:
        if ts is None:
            return None
        return round(dt.datetime.fromisoformat(ts).replace(tzinfo=dt.timezone.utc).timestamp() - t0, 2)

    con = sqlite3.connect(run_dir / "packhorse.db")
    try:
        out: dict[str, object] = {"files_registered_at": off(con.execute(
            "select max(registered_at) from raw_data_files").fetchone()[0])}
        for kind, n, first, last, busy in con.execute(
                "select kind, count(*), min(started_at), max(finished_at), "
                "sum((julianday(finished_at) - julianday(started_at)) * 86400) from operations "
                "group by kind order by min(started_at)"):
            out[kind] = {"count": n, "first_start": off(first), "last_finish": off(last), "busy_seconds": round(busy, 2)}
        # every object the pipeline published (package, bundle, its transfers, the unpacked
        # packages, the archive copies), deleted buffer copies included: the bytes it had to write
        out["bytes_written"] = con.execute("select coalesce(sum(size), 0) from physical_copies").fetchone()[0]
        return out
    finally:
        con.close()


def setup_packhorse(source: Path, run_dir: Path, workers: int) -> tuple[Path, float]:
    fresh(run_dir)
    # every run is a new installation (its own ops database) over the same data set: the
    # marker the last run's installation left in the source would be refused (another
    # installation's root), and it is none of the data set's files
    shutil.rmtree(source / "_packhorse", ignore_errors=True)
    cfg = write_demo_config(run_dir, str(source), workers=workers)
    t = time.monotonic()
    p = subprocess.run([*packhorse_cmd(), "init", "-c", str(cfg)], capture_output=True, text=True, cwd=run_dir)
    if p.returncode != 0:
        raise BenchmarkError(f"packhorse init exited {p.returncode}: {p.stderr}")
    return cfg, time.monotonic() - t


def run_packhorse(source: Path, run_dir: Path, info: dict[str, int], workers: int,
                  wrap: list[str] | None = None) -> dict[str, object]:
    cfg, init_s = setup_packhorse(source, run_dir, workers)
    cmd = [*packhorse_cmd(), "run", "-c", str(cfg), "--until-idle", "--quiet"]
    if wrap:
        cmd = [*wrap, sys.executable, "-m", "packhorse", *cmd[len(packhorse_cmd()):]]
    t, t0 = time.monotonic(), time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=run_dir)
    memory = MemorySampler(proc.pid)
    memory.start()
    out, err = proc.communicate()
    elapsed = time.monotonic() - t
    memory.stop()
    p = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if p.returncode != 0:
        raise BenchmarkError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    checked = check_packhorse(cfg, run_dir, info)
    phases = timeline(run_dir, t0)
    cleanup(run_dir)
    return {"seconds": elapsed, "init_seconds": init_s, "stderr": p.stderr[-2000:], **checked, "timeline": phases,
            "memory": memory.result()}


class MemorySampler:
    """Peak memory of a process and all its descendants (``packhorse run``, its fork server and
    worker processes), sampled from ``/proc`` every ``interval`` seconds in a thread.

    ``result()``: ``tree_pss_peak_bytes`` — the largest sum over the tree of each process's
    proportional set size (``smaps_rollup`` Pss: shared pages split between their users, so
    the sum is what the tree really holds); ``tree_rss_peak_bytes`` — the same with plain RSS
    (shared pages counted once per process: an upper bound); ``main_hwm_bytes`` — the
    main process's own peak RSS (``VmHWM``); ``max_process_hwm_bytes`` — the largest ``VmHWM`` of
    any process of the tree; ``processes`` — how many were seen."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        import threading

        self.pid = pid
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.pss_peak = self.rss_peak = 0
        self.hwm: dict[int, int] = {}

    @staticmethod
    def _children(pid: int) -> list[int]:
        out = []
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out += [int(c) for c in f.read().split()]
        except OSError:
            pass
        return out

    @staticmethod
    def _field(path: str, name: str) -> int:
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith(name):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError):
            pass
        return 0

    def sample(self) -> None:
        tree, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo += self._children(pid)
        pss = rss = 0
        for pid in tree:
            pss += self._field(f"/proc/{pid}/smaps_rollup", "Pss:")
            rss += self._field(f"/proc/{pid}/status", "VmRSS:")
            hwm = self._field(f"/proc/{pid}/status", "VmHWM:")
            if hwm:
                self.hwm[pid] = max(self.hwm.get(pid, 0), hwm)
        self.pss_peak = max(self.pss_peak, pss)
        self.rss_peak = max(self.rss_peak, rss)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def result(self) -> dict[str, int]:
        return {"tree_pss_peak_bytes": self.pss_peak, "tree_rss_peak_bytes": self.rss_peak,
                "main_hwm_bytes": self.hwm.get(self.pid, 0),
                "max_process_hwm_bytes": max(self.hwm.values(), default=0), "processes": len(self.hwm)}


# ------------------------------------------------------------------------------ profiling

def profile_packhorse(name: str, source: Path, run_dir: Path, info: dict[str, int], workers: int,
                      stamp: str, gil: bool = False) -> dict[str, object] | None:
    pyspy = shutil.which("py-spy")
    if not pyspy:
        print("  py-spy not installed (pip install py-spy): no profile", flush=True)
        return None
    RESULTS.mkdir(exist_ok=True)
    raw = RESULTS / f"{stamp}-profile-{name}.txt"
    wrap = [pyspy, "record", "--format", "raw", "--threads", "--nonblocking", "--subprocesses", "--rate", "100", "-o", str(raw),
            *(["--gil"] if gil else []), "--"]
    r = run_packhorse(source, run_dir, info, workers, wrap=wrap)
    summary = summarize(raw)
    print(f"  profile of packhorse on ({name}) under py-spy: {r['seconds']:.1f} s -> {raw}", flush=True)
    print_summary(summary, indent="    ")
    return {"seconds": r["seconds"], "raw": str(raw), **summary}


# ------------------------------------------------------------------------------ main

def disk_probe(workdir: Path, mib: int = 512) -> float:
    """MB/s of writing ``mib`` MiB with dd + fsync into ``workdir`` (the disk's speed drifts)."""
    f = workdir / "disk-probe"
    t = time.monotonic()
    subprocess.run(["dd", "if=/dev/zero", f"of={f}", "bs=1M", f"count={mib}", "conv=fsync", "status=none"], check=True)
    el = time.monotonic() - t
    f.unlink()
    subprocess.run(["sync"], check=True)
    return round(mib * MiB / el / 1e6, 1)


def machine() -> dict[str, object]:
    def sh(*cmd: str) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()
        except OSError:
            return ""

    cpu = next((l.split(":", 1)[1].strip() for l in sh("lscpu").splitlines() if l.startswith("Model name")), "")
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"nproc": os.cpu_count(), "cpu": cpu, "memory_bytes": mem, "kernel": platform.release(),
            "python": platform.python_version(), "disk": sh("df", "-hT", str(RESULTS.parent)).splitlines()[-1:],
            "tools": {t: sh(t, "--version").splitlines()[0] if sh(t, "--version") else "" for t in
                      ("tar", "rsync", "sha256sum")} | {"openssl": sh("openssl", "version")},
            "packhorse": sh(*packhorse_cmd(), "version"),
            "commit": sh("git", "-C", str(REPO), "rev-parse", "--short", "HEAD"),
            "src_dirty": bool(sh("git", "-C", str(REPO), "status", "--porcelain", "src"))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, help="folder for data sets and runs (default: a new one under /tmp)")
    ap.add_argument("--sets", default="a,b", help="comma-separated data sets: a, b, c, d (default a,b; c,d: the "
                                                  "scale pair, 20,000 and 200,000 files of 0-4 KiB)")
    ap.add_argument("--repeats", type=int, default=2, help="runs per side and data set (default 2; median taken; 0 with --profile: profile only)")
    ap.add_argument("--hashers", default="sha256sum,openssl",
                    help="baseline variants by hashing tool (default sha256sum,openssl; the first is the reference)")
    ap.add_argument("--workers", type=int, default=4, help="packhorse [executor] workers (default 4)")
    ap.add_argument("--profile", action="store_true", help="one extra packhorse run per set under py-spy")
    ap.add_argument("--profile-gil", action="store_true",
                    help="with --profile: only samples holding the interpreter (py-spy --gil): Python's own work, no system calls")
    ap.add_argument("--keep-data", action="store_true", help="keep the generated data sets")
    args = ap.parse_args()

    own_workdir = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="packhorse-bench-", dir="/tmp")) if own_workdir else args.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    hashers = [h for h in args.hashers.split(",") if h]
    sets = [s for s in args.sets.split(",") if s]
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    result: dict[str, object] = {"started_at": stamp, "machine": machine(), "repeats": args.repeats,
                                 "workers": args.workers, "sets": {}}
    print(f"workdir {workdir}; packhorse: {' '.join(packhorse_cmd())}", flush=True)
    compile_bytecode()
    try:
        for name in sets:
            source, info = ensure_dataset(workdir, name)
            probe = disk_probe(workdir)
            print(f"  ({name}) disk probe: {probe} MB/s (dd 512 MiB + fsync)", flush=True)
            run_dir = workdir / "run"
            sides = [f"baseline-{h}" for h in hashers] + ["packhorse"]
            runs: dict[str, list[dict[str, object]]] = {s: [] for s in sides}
            for i in range(args.repeats):
                order = sides if i % 2 == 0 else sides[::-1]  # alternate who goes first
                for side in order:
                    if side == "packhorse":
                        r = run_packhorse(source, run_dir, info, args.workers)
                    else:
                        r = run_baseline(source, run_dir, info, side.split("-", 1)[1])
                    runs[side].append(r)
                    extra = (f" (hops {r['hops']})" if "hops" in r else
                             f" (init {r['init_seconds']:.2f} s, peak memory of the process tree "
                             f"{r['memory']['tree_pss_peak_bytes'] / 1e6:.0f} MB PSS, "
                             f"{r['memory']['tree_rss_peak_bytes'] / 1e6:.0f} MB RSS)")
                    print(f"  ({name}) run {i + 1} {side:20s} {r['seconds']:7.2f} s{extra}", flush=True)
            probe_after = disk_probe(workdir)
            print(f"  ({name}) disk probe after: {probe_after} MB/s", flush=True)
            entry: dict[str, object] = {"description": DATASETS[name][0], **info, "runs": runs,
                                        "disk_probe_MBps": {"before": probe, "after": probe_after}}
            if args.repeats:
                med = {s: statistics.median(float(r["seconds"]) for r in runs[s]) for s in sides}  # type: ignore[arg-type]
                entry["median_seconds"] = med
                entry["ratio"] = {s: med["packhorse"] / med[s] for s in sides if s != "packhorse"}
                entry["seconds_per_file"] = {s: med[s] / info["files"] for s in sides}
                # the write floor: the bytes packhorse had to write at the disk's sequential
                # fsync'd speed measured in this invocation (mean of the probes around the set)
                written = statistics.median(int(r["timeline"]["bytes_written"]) for r in runs["packhorse"])  # type: ignore[index]
                floor = written / ((probe + probe_after) / 2 * 1e6)
                entry["write_floor"] = {"bytes_written": written, "seconds": floor,
                                        "ratio": med["packhorse"] / floor}
                entry["peak_memory_bytes"] = max(int(r["memory"]["tree_pss_peak_bytes"]) for r in runs["packhorse"])  # type: ignore[index]
            if args.profile:
                entry["profile"] = profile_packhorse(name, source, run_dir, info, args.workers, stamp, gil=args.profile_gil)
            result["sets"][name] = entry  # type: ignore[index]
            if not args.keep_data:
                shutil.rmtree(source, ignore_errors=True)
                (workdir / "data" / f"{name}.json").unlink(missing_ok=True)
    finally:
        shutil.rmtree(workdir / "run", ignore_errors=True)
        if own_workdir and not args.keep_data:
            shutil.rmtree(workdir, ignore_errors=True)

    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{stamp}.json"
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print()
    ref = f"baseline-{hashers[0]}" if hashers else None
    head = f"{'set':4s} " + " ".join(f"{s:>20s}" for s in [*(f'baseline-{h}' for h in hashers), "packhorse"])
    head += "".join(f"  {'ratio vs ' + h:>20s}" for h in hashers)
    print(head)
    for name, e in result["sets"].items():  # type: ignore[attr-defined]
        if "median_seconds" not in e:
            continue
        med = e["median_seconds"]
        line = f"{name:4s} " + " ".join(f"{med[s]:19.2f}s" for s in med)
        line += "".join(f"  {e['ratio'][f'baseline-{h}']:19.2f}x" for h in hashers)
        print(line)
    sets_done = result["sets"]  # type: ignore[assignment]
    for large, small in SCALE_PAIRS:
        if "seconds_per_file" in sets_done.get(large, {}) and "seconds_per_file" in sets_done.get(small, {}):
            a, b = sets_done[large], sets_done[small]
            ratio = a["seconds_per_file"]["packhorse"] / b["seconds_per_file"]["packhorse"]
            result.setdefault("scale", {})[f"{large}/{small}"] = ratio  # type: ignore[union-attr]
            print(f"scale ({large} vs {small}): packhorse {a['seconds_per_file']['packhorse'] * 1e3:.3f} ms/file "
                  f"vs {b['seconds_per_file']['packhorse'] * 1e3:.3f} ms/file = {ratio:.2f}x; peak memory "
                  f"{a['peak_memory_bytes'] / 1e6:.0f} MB vs {b['peak_memory_bytes'] / 1e6:.0f} MB (PSS, process tree)")
    for name, e in sets_done.items():
        if "write_floor" in e:
            wf = e["write_floor"]
            print(f"write floor ({name}): {wf['bytes_written'] / 1e6:,.0f} MB written at the probed speed = "
                  f"{wf['seconds']:.2f} s; packhorse {e['median_seconds']['packhorse']:.2f} s = {wf['ratio']:.2f}x")
        if "peak_memory_bytes" in e:
            print(f"peak memory ({name}): {e['peak_memory_bytes'] / 1e6:.0f} MB PSS of packhorse run's process tree")
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"\nresult: {out}" + (f" (reference baseline: {ref})" if ref else ""))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchmarkError as e:
        print(f"BENCHMARK ABORTED: {e}", file=sys.stderr)
        sys.exit(1)
