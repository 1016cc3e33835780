#!/usr/bin/env python3
"""Summarize a ``py-spy record --format raw --threads`` profile of ``packhorse run``.

    python benchmarks/profile_summary.py benchmarks/results/<stamp>-profile-b.txt [--top 15]

Samples whose innermost frame is a wait (a thread pool waiting for work, ``Event.wait``,
``time.sleep``, a thread join) are counted as idle and left out; the shares printed are of the
remaining (busy) samples of all threads together, so on 2 cores up to 200 % of the wall time
can be busy. Three views:

* ``where``: busy samples by thread and pipeline part — the stage a worker (thread or worker
  process: ``run_benchmarks.py --profile`` records them with ``--subprocesses``) runs
  (``stages/<kind>.py``; ``db`` when inside ``Database.transact``), the main loop's managers
  (``managers/<name>.py``), dispatch, scan, lease heartbeats, start-up;
* ``self``: innermost frame (the function actually on the CPU or in a system call);
* ``inclusive``: packhorse functions with everything they call.
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

IDLE_LEAVES = (
    "Condition.wait (threading.py", "Event.wait (threading.py", "Thread.join (threading.py",
    "_wait_for_tstate_lock (threading.py", "sleep (", "select (", "SimpleQueue.get",
    "_worker (concurrent/futures/thread.py", "Queue.get (queue.py",
)
_FRAME = re.compile(r"^(?P<fn>.*) \((?P<file>[^:()]*)(?::(?P<line>\d+))?\)$")


def _short(frame: str, *, line: bool = False) -> str:
    m = _FRAME.match(frame)
    if not m:
        return frame
    file = m["file"]
    if "site-packages/" in file:
        file = file.split("site-packages/", 1)[1]
    return f"{m['fn']} ({file}{':' + m['line'] if line and m['line'] else ''})"


def _where(thread: str, frames: list[str]) -> str:
    joined = ";".join(frames)
    if thread.startswith("heartbeat"):
        return "heartbeat threads (lease renewal)"
    if thread.startswith("scan"):
        return "scan threads (sha256 of source files)"
    if thread.startswith("worker") or "_run_in_worker_process" in joined or "forkserver.py" in joined:
        m = re.search(r"packhorse/stages/(\w+)\.py", joined)
        if m:
            stage_at = joined.index(m.group(0))
            db = "Database.transact" in joined[stage_at:]
            return f"worker: stage {m.group(1)}" + (" (db)" if db else "")
        if "_run_in_worker_process" in joined or "execute_operation" in joined:
            return "worker: claim / lease / completion (db)"
        return "worker process: start-up (fork server, initializer)"
    if "LocalRunner.run" not in joined:
        return "main: start-up (imports, config, database)" if "LocalRunner" not in joined else "main: other"
    m = re.search(r"packhorse/managers/(\w+)\.py", joined)
    if m:
        return f"main: manager {m.group(1)}"
    for fn, label in (("LocalRunner.dispatch", "main: dispatch"), ("scan_all", "main: scan"),
                      ("LocalRunner._active_summary", "main: idle check"), ("LocalRunner.recover", "main: recover")):
        if fn in joined:
            return label
    return "main: loop / other"


def summarize(raw: Path, top: int = 15) -> dict[str, object]:
    """Busy-sample shares (percent) by ``where``, ``self`` and ``inclusive`` (packhorse frames)."""
    where: collections.Counter[str] = collections.Counter()
    self_c: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = idle = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        parts = stack.split(";")
        thread = ""
        frames: list[str] = []
        for p in parts:
            if p.startswith("process "):
                continue
            if p.startswith("thread ("):
                thread = p.split(": ", 1)[1] if ": " in p else p
                continue
            frames.append(p)
        if not frames:
            continue
        total += n
        leaf = frames[-1]
        if any(leaf.startswith(x) or x in leaf for x in IDLE_LEAVES):
            idle += n
            continue
        where[_where(thread, frames)] += n
        self_c[_short(leaf, line=True)] += n
        for f in {_short(f) for f in frames if "packhorse/" in f}:
            incl[f] += n
    busy = total - idle
    pct = lambda c, k=top: [(name, round(100 * v / busy, 1)) for name, v in c.most_common(k)]  # noqa: E731
    return {"samples": total, "busy_samples": busy, "where": pct(where, 30), "self": pct(self_c),
            "inclusive": pct(incl)}


def print_summary(s: dict[str, object], indent: str = "") -> None:
    print(f"{indent}{s['busy_samples']} busy samples of {s['samples']} (idle waits left out); shares of busy samples:")
    for view in ("where", "self", "inclusive"):
        print(f"{indent}  {view}:")
        for name, p in s[view]:  # type: ignore[union-attr]
            print(f"{indent}    {p:5.1f}%  {name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("raw", type=Path)
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    print_summary(summarize(a.raw, a.top))


if __name__ == "__main__":
    main()
