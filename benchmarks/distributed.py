#!/usr/bin/env python3
"""The distributed executor end to end: one of ``run_benchmarks.py``'s data sets archived by
``packhorse manager`` and one ``packhorse worker`` per site (Celery over Redis, PostgreSQL),
for source trees against each other (a before/after of a change), alternating.

Each tree is a folder holding ``src/packhorse`` (``git archive <commit> src | tar -x -C DIR``,
or the checkout itself). Every run: a fresh run folder with ``packhorse demo``'s three-site
configuration (fyst → cologne, cornell) switched to ``executor.kind = "celery"`` through the
environment, a scratch PostgreSQL database, a Redis database of its own (``--redis-db``, emptied
before the run), ``packhorse init``; then the manager and the three workers (``--concurrency
--workers``) start together and the clock runs until every raw data package is archived at
both destinations, every operation is ``COMPLETED`` and no copy is left in a buffer (the ops
database is polled every 0.2 s). A run that does not get there in ``--timeout`` seconds, or
ends with an operation not ``COMPLETED``, aborts the benchmark.

Printed per run and as medians: the wall time, the machine's user and system CPU time
(``/proc/stat``: a quiet machine only), the operations, and the broker messages the workers
received (``Task … received`` lines of their logs).

The manager runs its cycle every ``--poll`` seconds (the managers of the distributed mode are
not woken by completions, unlike the embedded runner's): the figure holds the hops' waits for
the next cycle, the same for both trees.

Usage::

    git archive HEAD~1 src | tar -x -C /tmp/before
    python benchmarks/distributed.py --repeats 3 --workdir /work/tmp/bench /tmp/before .
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine, text

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_benchmarks as rb  # noqa: E402
from ab_commits import machine_cpu  # noqa: E402

SITES = ("fyst", "cologne", "cornell")
_DONE = text("""
    SELECT (SELECT count(*) FROM raw_data_packages),
           (SELECT count(*) FROM raw_data_packages WHERE archived_at IS NOT NULL),
           (SELECT count(*) FROM operations WHERE status <> 'COMPLETED'),
           (SELECT count(*) FROM operations),
           (SELECT count(*) FROM physical_copies c JOIN data_locations l ON l.id = c.location_id
             WHERE l.role = 'buffer' AND c.status = 'present')
""")


def run_once(tree: str, source: Path, run_dir: Path, args: argparse.Namespace) -> dict[str, float]:
    """One distributed run of ``tree``: wall s, user and system CPU s, operations, messages."""
    rb.fresh(run_dir)
    shutil.rmtree(source / "_packhorse", ignore_errors=True)  # every run is a new installation
    subprocess.run(["sync"], check=True)
    admin = create_engine(args.pg, isolation_level="AUTOCOMMIT")
    name = f"packhorse_dist_{uuid.uuid4().hex[:10]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    url = f"{args.pg.rsplit('/', 1)[0]}/{name}"
    broker = f"{args.redis.rstrip('/')}/{args.redis_db}"
    subprocess.run(["redis-cli", "-u", broker, "FLUSHDB"], check=True, capture_output=True)  # our own number only
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve() / "src"),
           "PACKHORSE_DATABASE__URL": url, "PACKHORSE_EXECUTOR__KIND": "celery",
           "PACKHORSE_EXECUTOR__BROKER_URL": broker, "PACKHORSE_MANAGERS__POLL_INTERVAL_SECONDS": str(args.poll),
           "PACKHORSE_PACKAGING__BUNDLE_MAX_WAIT_SECONDS": "1", "PACKHORSE_LOG_LEVEL": "INFO"}
    code = (f"from pathlib import Path; from packhorse.cli.demo import write_demo_config; "
            f"print(write_demo_config(Path({str(run_dir)!r}), {str(source)!r}, workers={args.workers}))")
    cfg = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True).stdout.strip()
    ph = [sys.executable, "-m", "packhorse"]
    p = subprocess.run([*ph, "init", "-c", cfg], cwd=run_dir, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{tree}: packhorse init exited {p.returncode}\n{p.stderr[-2000:]}")
    engine = create_engine(url)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    u0, s0 = machine_cpu()
    t0 = time.monotonic()
    try:
        for site in SITES:
            with open(run_dir / f"worker-{site}.log", "wb") as log:
                procs[site] = subprocess.Popen([*ph, "worker", "--site", site, "--concurrency", str(args.workers),
                                                "-c", cfg], cwd=run_dir, env=env, stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True)
        with open(run_dir / "manager.log", "wb") as log:
            procs["manager"] = subprocess.Popen([*ph, "manager", "-c", cfg], cwd=run_dir, env=env, stdout=log,
                                                stderr=subprocess.STDOUT, start_new_session=True)
        while True:
            with engine.connect() as c:
                total, archived, open_ops, ops, buffered = c.execute(_DONE).one()
            if total and archived == total and not open_ops and not buffered:
                break
            if time.monotonic() - t0 > args.timeout:
                raise SystemExit(f"{tree}: not finished after {args.timeout} s ({archived}/{total} packages "
                                 f"archived, {open_ops} operations open, {buffered} buffer copies)")
            time.sleep(0.2)
        wall = time.monotonic() - t0
        u1, s1 = machine_cpu()
    finally:
        for proc in procs.values():
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        engine.dispose()
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()
        subprocess.run(["redis-cli", "-u", broker, "FLUSHDB"], capture_output=True)
    messages = sum(len(re.findall(r"Task packhorse\.run_operations?\[[^\]]*\] received", (run_dir / f"worker-{s}.log").read_text(
        errors="replace"))) for s in SITES)
    if total != args.expect_packages:
        raise SystemExit(f"{tree}: {total} packages, expected {args.expect_packages}")
    rb.cleanup(run_dir)
    return {"wall": wall, "user": u1 - u0, "system": s1 - s0, "operations": ops, "messages": messages}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trees", nargs="+", help="folders holding src/packhorse")
    ap.add_argument("--set", default="b", choices=sorted(rb.DATASETS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2, help="--concurrency of each site's worker (default 2)")
    ap.add_argument("--poll", type=float, default=0.5, help="the manager's poll interval, s (default 0.5)")
    ap.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
                    help="an admin URL of the PostgreSQL server (a scratch database is made per run)")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379", help="the Redis server")
    ap.add_argument("--redis-db", type=int, default=13, help="a Redis database number of this benchmark's own")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/packhorse-distributed"))
    a = ap.parse_args()
    a.workdir.mkdir(parents=True, exist_ok=True)
    source, info = rb.ensure_dataset(a.workdir, a.set)
    a.expect_packages = info["groups"]
    rb.compile_bytecode()
    runs: dict[str, list[dict[str, float]]] = {t: [] for t in a.trees}
    for r in range(a.repeats):
        for tree in a.trees if r % 2 == 0 else a.trees[::-1]:
            x = run_once(tree, source, a.workdir / "run", a)
            runs[tree].append(x)
            print(f"{tree:32s} wall {x['wall']:6.2f} s  user {x['user']:6.2f} s  system {x['system']:6.2f} s  "
                  f"{x['operations']} operations, {x['messages']} messages", flush=True)
    for tree, xs in runs.items():
        med = {k: statistics.median(x[k] for x in xs) for k in ("wall", "user", "system", "messages")}
        print(f"median {tree:25s} wall {med['wall']:6.2f} s  user {med['user']:6.2f} s  system "
              f"{med['system']:6.2f} s  {med['messages']:.0f} messages ({len(xs)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
