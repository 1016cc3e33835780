#!/usr/bin/env python3
"""Control-plane benchmarks: claims and fenced completions, the idle manager cycle at scale,
the scan of an unchanged tree against ``find``.

Three parts (``--parts``, default all); each reports its figure and the target it is held to,
and every run checks its outcome (a wrong result aborts the benchmark):

* ``claims``: ``--operations`` PENDING operations (default 4,000), ``--workers`` worker
  processes (default 8) started together; each claims its share of the operations at the token
  they were dispatched at (:func:`packhorse.operations.lifecycle.claim`) and completes each claim with a
  fenced completion (:func:`packhorse.engine.outcome.complete_in`), one transaction each. One
  operation in ten is also handed to a second worker (a duplicate delivery), whose claim must be
  refused. Batched mode (``--batches``, N > 1) claims N at once (``claim_many``) and completes
  them in one transaction (``complete_many``), as the deletion batch of a worker does. Afterwards every operation must be ``COMPLETED`` at attempt 1, each
  completed once (I3), and the refused claims must be exactly the duplicates. Reported:
  completed operations per second over the wall time of all workers (start barrier to the last
  one done), the median of ``--repeats`` runs, on SQLite (a file in the work folder, WAL) and on
  PostgreSQL (a scratch database on ``--pg``, dropped afterwards). Targets: ≥ 500/s SQLite,
  ≥ 2,000/s PostgreSQL.
* ``idle``: a database (SQLite file, and PostgreSQL with ``--pg``) holding ``--files`` raw
  files (default 1,000,000) in ``--packages`` archived raw data packages (default 100,000),
  each with its verified archive copy and its completed operations, bulk-inserted; then one
  :func:`packhorse.engine.pipeline.manager_cycle` (no scan) is timed ``--repeats`` times: it must
  create nothing. Target: the median under 1 s. The query plans of the cycle are checked for
  full reads of a growing table (SQLite ``EXPLAIN QUERY PLAN``: ``SCAN <table>``; PostgreSQL
  ``EXPLAIN``: ``Seq Scan on <table>``, after ``VACUUM ANALYZE``).
* ``scan``: a tree of ``--tree-files`` empty files (default 1,000,000; 1,000 files per
  ``<instrument>/<obs unit>`` folder) in a temporary folder of ``--workdir``, all registered;
  timed ``--repeats`` times, interleaved: ``find ROOT -printf '%s %T@\\n' > /dev/null``, the
  full scan (:func:`packhorse.managers.scan.scan_location` without a cache: what a fresh
  ``packhorse run`` and every 30th scan of one do, in as many processes as its runner allows,
  :mod:`packhorse.managers.scanshards`), the same full scan in one process, and the scan of
  ``packhorse run`` (with its :class:`~packhorse.managers.scan.ScanCache`, after one warming
  scan). Each scan
  must register nothing and skip nothing. Target: the scan no slower than 2× ``find``. The
  tree is deleted as soon as it is measured.

Usage::

    python benchmarks/control_plane.py --parts claims --pg postgresql+psycopg://postgres@127.0.0.1:5432/postgres
    python benchmarks/control_plane.py --parts idle --files 1000000 --packages 100000
    python benchmarks/control_plane.py --parts scan --tree-files 1000000 --workdir /var/tmp

Figures of this machine: docs/benchmarks.md "Control plane".
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, func, select, text

from packhorse.db.models import Operation
from packhorse.db.session import Database
from packhorse.domain import OperationKind, Status

KIND = OperationKind.TRANSFER


# ------------------------------------------------------------------------------ claims


def _claims_worker(url: str, jobs: list[tuple[int, int]], batch: int, start: Any, out: Any) -> None:
    from packhorse.engine.outcome import complete_in, complete_many
    from packhorse.operations.lifecycle import claim, claim_many

    db = Database(url)
    owner = f"bench:{os.getpid()}"
    done = refused = 0
    out.put("ready")
    start.wait()
    t0 = time.perf_counter()
    if batch <= 1:
        for op_id, token in jobs:
            c = claim(db, op_id, owner, 300, token=token)
            if c is None:
                refused += 1
                continue

            def finish(s: Any, c: Any = c) -> bool:
                return complete_in(s, c)

            if db.transact(finish):
                done += 1
    else:
        for i in range(0, len(jobs), batch):
            part = dict(jobs[i:i + batch])
            claims = claim_many(db, part, owner, 300)  # type: ignore[arg-type]
            refused += len(part) - len(claims)

            def finish_all(s: Any, claims: Any = claims) -> int:
                return len(complete_many(s, claims.values()))

            done += db.transact(finish_all)
    out.put((done, refused, t0, time.perf_counter()))
    db.dispose()


def _seed_operations(db: Database, n: int) -> list[int]:
    from packhorse.db.models import Site
    from packhorse.operations.lifecycle import create_operations, dedup_key

    def tx(s: Any) -> list[int]:
        site = s.scalar(select(Site.id).where(Site.name == "bench"))
        if site is None:
            site_row = Site(name="bench")
            s.add(site_row)
            s.flush()
            site = site_row.id
        tag = uuid.uuid4().hex[:8]
        create_operations(s, kind=KIND, max_retries=3, wanted={
            dedup_key(KIND, f"bench-{tag}-{i}"): {"site_id": site} for i in range(n)})
        return list(s.scalars(select(Operation.id).where(Operation.dedup_key.like(f"%bench-{tag}-%"))
                              .order_by(Operation.id)))

    return db.transact(tx)


def claims_run(url: str, *, operations: int, workers: int, batch: int) -> dict[str, Any]:
    """One run of the claims part on database ``url`` (migrated); returns its figures."""
    db = Database(url)
    ids = _seed_operations(db, operations)
    stripes: list[list[tuple[int, int]]] = [[] for _ in range(workers)]
    duplicates = 0
    for i, op_id in enumerate(ids):
        stripes[i % workers].append((op_id, 0))
        if i % 10 == 0:  # a duplicate delivery to another worker, late in its list
            stripes[(i + 1) % workers].append((op_id, 0))
            duplicates += 1
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_claims_worker, args=(url, s, batch, start, out)) for s in stripes]
    for p in procs:
        p.start()
    # every worker imported and waiting (on 2 cores 8 imports take longer than the 2 s slept
    # here before, and a late import ran inside the timed window)
    for _ in procs:
        assert out.get(timeout=600) == "ready"
    start.set()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    done = sum(r[0] for r in results)
    refused = sum(r[1] for r in results)
    wall = max(r[3] for r in results) - min(r[2] for r in results)

    def check(s: Any) -> tuple[int, int, int]:
        q = select(func.count()).select_from(Operation).where(Operation.id.in_(ids))
        completed = s.scalar(q.where(Operation.status == Status.COMPLETED.value, Operation.attempt == 1))
        return completed, s.scalar(q), s.scalar(select(func.max(Operation.attempt)).where(Operation.id.in_(ids)))

    completed, total, max_attempt = db.read(check)
    db.dispose()
    if not (completed == total == operations == done and refused == duplicates and max_attempt == 1):
        raise SystemExit(f"claims: wrong outcome: completed {completed}/{total}, done {done}, refused {refused} "
                         f"(duplicates {duplicates}), max attempt {max_attempt}")
    return {"operations": operations, "workers": workers, "batch": batch, "wall_seconds": wall,
            "per_second": done / wall, "duplicates_refused": refused}


def _sqlite_url(workdir: Path, name: str) -> str:
    path = workdir / f"{name}-{uuid.uuid4().hex[:8]}.db"
    return f"sqlite:///{path}"


def _pg_scratch(admin_url: str) -> tuple[str, Any]:
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    name = f"packhorse_bench_{uuid.uuid4().hex[:10]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    base = admin_url.rsplit("/", 1)[0]

    def drop() -> None:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()

    return f"{base}/{name}", drop


def part_claims(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    backends = [("sqlite", 500.0)] + ([("postgresql", 2000.0)] if args.pg else [])
    for name, target in backends:
        for batch in args.batches:
            runs = []
            for _ in range(args.repeats):
                if name == "sqlite":
                    url = _sqlite_url(args.workdir, "claims")
                    Database(url).upgrade()
                    drop = None
                else:
                    url, drop = _pg_scratch(args.pg)
                    Database(url).upgrade()
                try:
                    runs.append(claims_run(url, operations=args.operations, workers=args.workers, batch=batch))
                finally:
                    if drop is not None:
                        drop()
                    else:
                        for suffix in ("", "-wal", "-shm", ".writer-lock"):  # the database and its sidecars
                            Path(url[len("sqlite:///"):] + suffix).unlink(missing_ok=True)
            rates = [r["per_second"] for r in runs]
            med = statistics.median(rates)
            key = f"{name}/batch={batch}"
            out[key] = {"median_per_second": med, "runs_per_second": rates, "target_per_second": target,
                        "met": med >= target}
            print(f"claims {key}: {med:,.0f} claims+completions/s (runs: {', '.join(f'{r:,.0f}' for r in rates)}); "
                  f"target >= {target:,.0f}/s: {'met' if med >= target else 'NOT met'}", flush=True)
    return out


# ------------------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="claims,idle,scan")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pg", default=None, help="admin URL of a PostgreSQL server (scratch databases)")
    ap.add_argument("--operations", type=int, default=4000)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batches", type=lambda v: [int(x) for x in v.split(",")], default=[1, 16])
    ap.add_argument("--files", type=int, default=1_000_000)
    ap.add_argument("--packages", type=int, default=100_000)
    ap.add_argument("--tree-files", type=int, default=1_000_000)
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    parts = args.parts.split(",")
    result: dict[str, Any] = {"started": dt.datetime.now(dt.UTC).isoformat(), "cpus": os.cpu_count(),
                              "argv": sys.argv}
    if "claims" in parts:
        result["claims"] = part_claims(args)
    if "idle" in parts:
        from control_plane_scale import part_idle

        result["idle"] = part_idle(args)
    if "scan" in parts:
        from control_plane_scale import part_scan

        result["scan"] = part_scan(args)
    results = Path(__file__).resolve().parent / "results"
    results.mkdir(exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    (results / f"control-plane-{stamp}.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
