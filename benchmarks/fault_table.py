#!/usr/bin/env python3
"""The distributed-mode fault table of docs/reliability.md, as measured.

Runs the fault tests of the distributed mode (real processes: PostgreSQL, Celery workers,
manager, monitor; Redis and RabbitMQ) ``--runs`` times, one test process, with
``PACKHORSE_FAULT_TABLE`` naming a file: each test appends one JSON line per fault it healed
(``tests/distributed_support.report_heal``): its kind, broker, the seconds from the fault's end
(or its injection where it does not end, or the run's start where it lasts the whole run: the
``counted from`` column) until the work was done again, and the source files lost, duplicated
or corrupt and the archive objects overwritten, counted from the archives' bytes. Prints the
markdown table (one row per kind and broker: runs, the four counts summed over the runs, the
seconds median and max) with the date, commit and load, and the tests that failed, if any (a
failed run reports no seconds: it is listed, not hidden).

Usage::

    .venv/bin/python benchmarks/fault_table.py --runs 2
    .venv/bin/python benchmarks/fault_table.py --runs 1 -k "poison or paused"   # a subset
    .venv/bin/python benchmarks/fault_table.py --report a.jsonl b.jsonl   # the table of kept records
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: the fault tests of the distributed mode (each reports one HEAL record when it passes)
TESTS = [
    "tests/chaos/test_distributed_chaos.py",
    "tests/chaos/test_poison_messages.py::test_worker_survives_poison_messages_and_keeps_working",
    "tests/chaos/test_dispatch_lost.py",
    "tests/chaos/test_scan_lease_paused_holder.py",
    "tests/chaos/test_broker_restart.py",
    "tests/chaos/test_database_outage_keeps_leases.py::"
    "test_a_database_restart_costs_no_lease_and_no_stall[celery-handed_back-10.0-17.0-redis]",
    "tests/chaos/test_database_outage_keeps_leases.py::"
    "test_a_database_restart_costs_no_lease_and_no_stall[celery-handed_back-10.0-17.0-rabbitmq]",
    "tests/e2e/test_clock_offset.py",
    "tests/e2e/test_convergence_distributed.py::test_bundle_deleted_before_its_transfer_is_rebuilt_and_shipped",
]
COUNTS = ("lost", "duplicated", "corrupt", "overwritten")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def commit() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return r.stdout.strip() + (" (with uncommitted changes)" if dirty else "")


def run_once(table: Path, junit: Path, basetemp: Path, keyword: str | None) -> tuple[int, list[str], float]:
    """One pytest process over :data:`TESTS`; returns (exit code, failed test ids, seconds)."""
    cmd = [sys.executable, "-m", "pytest", "-p", "no:randomly", "-n", "0", "-q", "-m", "long or chaos",
           f"--basetemp={basetemp}", f"--junitxml={junit}", *(["-k", keyword] if keyword else []), *TESTS]
    start = time.monotonic()
    r = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PACKHORSE_FAULT_TABLE": str(table)})
    took = time.monotonic() - start
    failed = []
    if junit.exists():
        for case in ET.parse(junit).iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed.append(f"{case.get('classname')}::{case.get('name')}")
    return r.returncode, failed, took


def table(records: list[dict]) -> str:  # type: ignore[type-arg]
    rows: dict[tuple[str, str], list[dict]] = {}  # type: ignore[type-arg]
    for rec in records:
        rows.setdefault((rec["kind"], rec["broker"]), []).append(rec)
    out = ["| fault | broker | runs | lost | duplicated | corrupt | overwritten | seconds to heal, median / max "
           "| counted from |", "|---|---|---|---|---|---|---|---|---|"]
    for (kind, broker), recs in rows.items():
        secs = [r["seconds"] for r in recs]
        sums = [sum(r[c] for r in recs) for c in COUNTS]
        heal = f"{secs[0]:.1f}" if len(secs) == 1 else f"{statistics.median(secs):.1f} / {max(secs):.1f}"
        since = "; ".join(sorted({r["since"] for r in recs}))
        out.append(f"| {kind} | {broker} | {len(recs)} | " + " | ".join(map(str, sums)) + f" | {heal} | {since} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1, help="how many times to run the whole selection (default 1)")
    ap.add_argument("-k", dest="keyword", help="pytest -k expression: a subset of the fault tests")
    ap.add_argument("--records", type=Path, help="keep the JSON lines in this file (default: a temp file)")
    ap.add_argument("--report", type=Path, nargs="+", metavar="JSONL",
                    help="run nothing: print the table of records kept earlier (--records) in these files")
    args = ap.parse_args()
    if args.report:
        kept = [json.loads(line) for f in args.report for line in f.read_text().splitlines() if line.strip()]
        print(table(kept))
        return 1 if any(any(r[c] for c in COUNTS) for r in kept) else 0
    work = Path(tempfile.mkdtemp(prefix="fault-table-"))
    records_file = args.records or work / "heal.jsonl"
    started = datetime.now(timezone.utc)
    loads = [load()]
    failures: list[str] = []
    walls = []
    for n in range(args.runs):
        code, failed, took = run_once(records_file, work / f"junit-{n}.xml", work / f"pt-{n}", args.keyword)
        loads.append(load())
        walls.append(took)
        failures += [f"run {n + 1}: {f}" for f in failed] or ([f"run {n + 1}: pytest exit {code}"] if code else [])
        print(f"run {n + 1}/{args.runs}: pytest exit {code}, {took:.0f} s, {len(failed)} failed, load {loads[-1]}",
              file=sys.stderr)
    records = [json.loads(line) for line in records_file.read_text().splitlines() if line.strip()] \
        if records_file.exists() else []
    print(f"Measured {started:%Y-%m-%d %H:%M} UTC, commit {commit()}, {os.cpu_count()} cores, "
          f"load average (1/5/15 min) before and after each run: {' → '.join(loads)}; "
          f"{args.runs} run(s) of the selection, {', '.join(f'{w:.0f} s' for w in walls)}.")
    print()
    print(table(records))
    print()
    print("Failed: " + ("; ".join(failures) if failures else "none"))
    return 1 if failures or any(any(r[c] for c in COUNTS) for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
