"""The ``idle`` and ``scan`` parts of ``benchmarks/control_plane.py`` (see its docstring)."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sqlalchemy import event, func, select

from packhorse.cli.demo import write_demo_config
from packhorse.config import load_config
from packhorse.db.models import Base, RawDataFile, RawDataPackage
from packhorse.db.session import Database
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology

GROWING = {"raw_data_files", "raw_data_packages", "data_transfer_packages", "physical_copies", "operations",
           "failure_events", "notification_outbox", "skipped_files", "withdrawn_files"}
#: the tables a package's state spans (cloned per synthetic package), in insertion order
CLONED = ["data_transfer_packages", "raw_data_packages", "raw_data_files", "physical_copies", "operations"]
#: the id columns of those tables, by the table they refer to
FKS = {"raw_data_package_id": "raw_data_packages", "data_transfer_package_id": "data_transfer_packages",
       "physical_copy_id": "physical_copies"}
UNIQUE_TEXT = {("data_transfer_packages", "name"), ("raw_data_packages", "name"), ("operations", "dedup_key")}


def _packhorse(*args: str, cwd: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "packhorse", *args], cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"packhorse {' '.join(args)} exited {p.returncode}: {p.stderr[-2000:]}")


def _context(cfg: Path) -> ProcessContext:
    settings = load_config(cfg)
    db = Database(settings.database_url)
    return ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))


# ------------------------------------------------------------------------------ idle


def _seed_archive(work: Path, files_per_package: int, database_url: str | None = None) -> Path:
    """One package of ``files_per_package`` small files taken through the whole pipeline
    (``packhorse run --until-idle``, on ``database_url`` if given, else the demo's SQLite
    file): a real idle state to clone."""
    source = work / "source"
    group = source / "inst" / "obs-seed"
    group.mkdir(parents=True)
    for i in range(files_per_package):
        (group / f"frame-{i:04d}.dat").write_bytes(os.urandom(64))
        os.utime(group / f"frame-{i:04d}.dat", (time.time() - 3600, time.time() - 3600))
    cfg = write_demo_config(work, str(source), workers=2)
    if database_url is not None:
        text = cfg.read_text(encoding="utf-8")
        assert 'url = "sqlite:///packhorse.db"' in text
        cfg.write_text(text.replace('url = "sqlite:///packhorse.db"', f'url = "{database_url}"'), encoding="utf-8")
    _packhorse("init", "-c", str(cfg), cwd=work)
    _packhorse("run", "-c", str(cfg), "--until-idle", "--quiet", cwd=work)
    return cfg


def _clone(db: Database, copies: int) -> None:
    """Copy every row of the seed package's state ``copies - 1`` times (new ids, names and
    paths: ``obs-seed`` → ``obs-<k>``), bulk-inserted."""
    tables = {t: Base.metadata.tables[t] for t in CLONED}
    with db._engine.begin() as conn:
        seed = {t: [dict(r._mapping) for r in conn.execute(select(tables[t]))] for t in CLONED}
        top = {t: max((r["id"] for r in rows), default=0) for t, rows in seed.items()}
    chunk = max(1, 200_000 // max(1, sum(len(r) for r in seed.values())))
    for start in range(1, copies, chunk):
        batch: dict[str, list[dict[str, Any]]] = {t: [] for t in CLONED}
        for k in range(start, min(copies, start + chunk)):
            tag = f"obs-{k:07d}"
            for t, rows in seed.items():
                for r in rows:
                    n = dict(r)
                    n["id"] = r["id"] + k * top[t]
                    for col, ref in FKS.items():
                        if n.get(col) is not None:
                            n[col] = n[col] + k * top[ref]
                    for col, v in r.items():
                        if isinstance(v, str) and "obs-seed" in v:
                            n[col] = v.replace("obs-seed", tag)
                        elif (t, col) in UNIQUE_TEXT and isinstance(v, str):
                            n[col] = f"{v}#{tag}"
                    batch[t].append(n)
        with db._engine.begin() as conn:
            for t in CLONED:
                if batch[t]:
                    conn.execute(tables[t].insert(), batch[t])


def _full_reads(db: Database, statements: dict[str, Any]) -> list[str]:
    """Statements whose query plan reads a growing table in full (SQLite ``SCAN <table>``,
    PostgreSQL ``Seq Scan on <table>``)."""
    url = db.url
    if not url.startswith("sqlite"):
        out = []
        with db._engine.connect() as conn:
            for sql, params in statements.items():
                if not sql.lstrip().upper().startswith(("SELECT", "UPDATE", "DELETE", "WITH")):
                    continue
                try:
                    plan = conn.exec_driver_sql(f"EXPLAIN {sql}", params).fetchall()
                except Exception:  # noqa: BLE001 - a statement EXPLAIN cannot take is not a read
                    conn.rollback()
                    continue
                for (line,) in plan:
                    m = re.search(r"Seq Scan on (\w+)", line)
                    if m and m.group(1) in GROWING:
                        out.append(f"{line.strip()}: {sql[:200]}")
            conn.rollback()
        return out
    con = sqlite3.connect(url[len("sqlite:///"):])
    out = []
    try:
        for sql, params in statements.items():
            try:
                plan = con.execute(f"EXPLAIN QUERY PLAN {sql}", params if isinstance(params, (tuple, list)) else ()).fetchall()
            except sqlite3.Error:
                continue
            for row in plan:
                m = re.match(r"SCAN (\w+)", row[-1])
                if m and m.group(1) in GROWING:
                    out.append(f"{row[-1]}: {sql[:200]}")
    finally:
        con.close()
    return out


def part_idle(args: argparse.Namespace) -> dict[str, Any]:
    """The idle cycle on SQLite, and on PostgreSQL (a scratch database) with ``--pg``."""
    from control_plane import _pg_scratch

    out = {"sqlite": _idle_on(args, None)}
    if args.pg:
        url, drop = _pg_scratch(args.pg)
        try:
            out["postgresql"] = _idle_on(args, url)
        finally:
            drop()
    return out


def _idle_on(args: argparse.Namespace, database_url: str | None) -> dict[str, Any]:
    from packhorse.engine.pipeline import CycleInput, manager_cycle

    per = max(1, args.files // args.packages)
    name = "sqlite" if database_url is None else "postgresql"
    work = Path(tempfile.mkdtemp(prefix="packhorse-idle-", dir=args.workdir))
    try:
        cfg = _seed_archive(work, per, database_url)
        os.chdir(work)
        ctx = _context(cfg)
        t0 = time.perf_counter()
        _clone(ctx.db, args.packages)
        built = time.perf_counter() - t0
        files = ctx.db.read(lambda s: s.scalar(select(func.count()).select_from(RawDataFile)))
        packages = ctx.db.read(lambda s: s.scalar(select(func.count()).select_from(RawDataPackage)))
        unarchived = ctx.db.read(lambda s: s.scalar(select(func.count()).select_from(RawDataPackage)
                                                    .where(RawDataPackage.archived_at.is_(None))))
        print(f"idle ({name}): {files:,} raw files, {packages:,} packages ({unarchived} not archived) inserted in "
              f"{built:.0f} s", flush=True)
        # fresh statistics for the planner, as a long-lived database has (and on PostgreSQL the
        # visibility map autovacuum keeps, outside a transaction)
        with ctx.db._engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            c.exec_driver_sql("VACUUM ANALYZE" if name == "postgresql" else "ANALYZE")
        inp = CycleInput(unsettled={"fyst-source": set()})
        statements: dict[str, Any] = {}

        @event.listens_for(ctx.db._engine, "before_cursor_execute")
        def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
            if not executemany:
                statements.setdefault(statement, parameters)

        manager_cycle(ctx, inp)  # warm: the first cycle after a start reads cold pages
        event.remove(ctx.db._engine, "before_cursor_execute", capture)
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            result = manager_cycle(ctx, inp)
            times.append(time.perf_counter() - t)
            if result.total:
                raise SystemExit(f"idle: the cycle created work on an idle database: {result.created}")
        scans = _full_reads(ctx.db, statements)
        med = statistics.median(times)
        print(f"idle manager cycle ({name}) over {files:,} files / {packages:,} packages: median {med:.3f} s "
              f"(runs: {', '.join(f'{x:.3f}' for x in times)}); target < 1 s: {'met' if med < 1 else 'NOT met'}; "
              f"full reads of growing tables: {len(scans)}", flush=True)
        for s in scans:
            print("  ", s)
        ctx.db.dispose()
        return {"files": files, "packages": packages, "median_seconds": med, "runs_seconds": times,
                "target_seconds": 1.0, "met": med < 1.0, "full_reads": scans, "insert_seconds": built}
    finally:
        os.chdir(args.workdir)
        shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------------------ scan


def _make_tree(root: Path, n: int, per_folder: int = 1000) -> int:
    folders = max(1, n // per_folder)
    instruments = max(1, min(10, folders))
    made = 0
    old = time.time() - 3600
    for f in range(folders):
        d = root / f"inst-{f % instruments:02d}" / f"obs-{f:05d}"
        d.mkdir(parents=True, exist_ok=True)
        base = str(d)
        for i in range(per_folder):
            p = f"{base}/frame-{i:04d}.dat"
            os.close(os.open(p, os.O_WRONLY | os.O_CREAT, 0o644))
            os.utime(p, (old, old))
            made += 1
    return made


def _find(root: Path) -> float:
    t = time.perf_counter()
    subprocess.run(["find", str(root), "-printf", "%s %T@\\n"], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t


def part_scan(args: argparse.Namespace) -> dict[str, Any]:
    from packhorse.managers.scan import ScanCache, scan_location

    work = Path(tempfile.mkdtemp(prefix="packhorse-scan-", dir=args.workdir))
    try:
        tree = work / "source"
        t = time.perf_counter()
        made = _make_tree(tree, args.tree_files)
        print(f"scan: {made:,} empty files made in {time.perf_counter() - t:.0f} s", flush=True)
        cfg = write_demo_config(work, str(tree), workers=2)
        _packhorse("init", "-c", str(cfg), cwd=work)
        os.chdir(work)
        ctx = _context(cfg)
        pool = ThreadPoolExecutor(2)
        t = time.perf_counter()
        first = scan_location(ctx, "fyst-source", pool)
        register = time.perf_counter() - t
        if first.registered != made or first.skipped:
            raise SystemExit(f"scan: first scan registered {first.registered} of {made}, skipped {first.skipped[:5]}")
        print(f"scan: first scan registered {made:,} files in {register:.1f} s", flush=True)
        cache = ScanCache()
        scan_location(ctx, "fyst-source", pool, cache)  # the warming scan of a `packhorse run`
        cache.scans = 1  # the steady state: not a 30th (full) scan
        # "full scan": what a fresh `packhorse run` and every 30th scan of one do (processes as
        # its runner gives them: min(workers, cores)); "full scan, one process": the same listing
        # made by this process alone (a location below SHARD_MIN_FILES, or the distributed scan)
        processes = max(1, min(2, os.cpu_count() or 1))
        # as the runner's fork server does (packhorse.executors.local): the listing processes
        # start with packhorse's modules loaded
        multiprocessing.set_forkserver_preload(["packhorse.managers.scanshards", "packhorse.managers.scan",
                                                "packhorse.storage.registry"])
        kinds = ["find", "full scan", "full scan, one process", "packhorse run scan"]
        times: dict[str, list[float]] = {k: [] for k in kinds}
        for r in range(args.repeats):
            order = list(kinds)
            if r % 2:
                order.reverse()
            for what in order:
                if what == "find":
                    times[what].append(_find(tree))
                    continue
                t = time.perf_counter()
                res = scan_location(ctx, "fyst-source", pool, None if what.startswith("full scan") else cache,
                                    processes=1 if what == "full scan, one process" else processes)
                times[what].append(time.perf_counter() - t)
                if res.registered or res.skipped or res.pending_settle:
                    raise SystemExit(f"scan: an unchanged tree changed: {res.registered} registered, "
                                     f"{res.skipped[:5]} skipped")
        pool.shutdown()
        ctx.db.dispose()
        med = {k: statistics.median(v) for k, v in times.items()}
        out: dict[str, Any] = {"files": made, "first_scan_seconds": register, "runs": times, "median": med}
        for what in kinds[1:]:
            ratio = med[what] / med["find"]
            out[f"{what} / find"] = ratio
            print(f"scan of an unchanged tree of {made:,} files, {what}: median {med[what]:.2f} s vs find "
                  f"{med['find']:.2f} s = {ratio:.2f}x (runs: {', '.join(f'{x:.2f}' for x in times[what])}; find "
                  f"{', '.join(f'{x:.2f}' for x in times['find'])}); target <= 2x: {'met' if ratio <= 2 else 'NOT met'}",
                  flush=True)
        return out
    finally:
        os.chdir(args.workdir)
        shutil.rmtree(work, ignore_errors=True)
