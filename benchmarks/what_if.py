#!/usr/bin/env python3
"""What-if runs: packhorse with a candidate fix patched in at run time (src/ is not touched).

    python benchmarks/what_if.py --workdir /work/bench b none bufsize bufsize,bufwrite count

Each argument after the data set is one run with a comma-separated list of patches:

* ``none``: unpatched (the control run);
* ``bufsize``: tarfile stream buffer 64 KiB instead of ``packaging.COPY_BUFSIZE`` (1 MiB);
* ``bufwrite``: partial files written through a 1 MiB ``io.BufferedWriter``;
* ``notee``: ``TeeReader.read`` without its sha256 (nothing reads ``TeeReader.hash``);
* ``nofsync``: ``os.fsync`` does nothing (to see what durability costs; not a fix);
* ``deferred``: SQLite ``BEGIN`` instead of ``BEGIN IMMEDIATE`` (not a fix as is);
* ``count``: count and time the main loop's managers, dispatch and idle checks;
* ``trace``: print when (s after start) the main process starts, scans, runs each manager
  (with its duration and what it returned), dispatches, and reaches the end of ``run``.

The data set comes from ``run_benchmarks.py`` (generated in ``--workdir`` if missing). Every run
is checked like a benchmark run and printed with its phase timeline (s after start). These are
single runs: compare them with a ``none`` run made just before or after, the disk's speed drifts.
The patches reach into packhorse internals and may stop applying when those change.
"""

from __future__ import annotations

import io
import os
import sys


def _apply(patches: set[str]) -> None:
    import packhorse.bags.packaging as pk

    if "bufsize" in patches:
        pk.COPY_BUFSIZE = 64 * 1024
    if "bufwrite" in patches:
        from packhorse.storage import disk

        orig_init = disk._DiskPendingWrite.__init__

        def init(self, *a, **k):  # type: ignore[no-untyped-def]
            orig_init(self, *a, **k)
            self._file = io.BufferedWriter(self._file, 1 << 20)

        disk._DiskPendingWrite.__init__ = init  # type: ignore[method-assign]
    if "notee" in patches:
        def read(self, n=-1):  # type: ignore[no-untyped-def]
            data = self._src.read(n)
            if data:
                self._sink.write(data)
                self.size += len(data)
            return data

        pk.TeeReader.read = read  # type: ignore[method-assign]
    if "nofsync" in patches:
        os.fsync = lambda fd: None
    if "deferred" in patches:
        from sqlalchemy import event

        from packhorse.db import session as sess

        orig_make = sess.make_engine

        def make_engine(url):  # type: ignore[no-untyped-def]
            eng = orig_make(url)
            for fn in list(eng.dispatch.begin):
                event.remove(eng, "begin", fn)
            event.listen(eng, "begin", lambda conn: conn.exec_driver_sql("BEGIN"))
            return eng

        sess.make_engine = make_engine
    if "count" in patches:
        import atexit
        import collections
        import time

        from packhorse.executors import local
        from packhorse.managers import archives, bundles, deletions, packages, transfers, unpacks

        stats: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])

        def wrap(obj, name, label):  # type: ignore[no-untyped-def]
            f = getattr(obj, name)

            def w(*a, **k):  # type: ignore[no-untyped-def]
                t = time.perf_counter()
                try:
                    return f(*a, **k)
                finally:
                    s = stats[label]
                    s[0] += 1
                    s[1] += time.perf_counter() - t

            setattr(obj, name, w)

        for m in (packages, bundles, transfers, unpacks, archives, deletions):
            wrap(m, "manage", f"managers.{m.__name__.rsplit('.', 1)[1]}.manage")
        wrap(local, "scan_all", "scan_all")
        wrap(local.LocalRunner, "manage", "LocalRunner.manage (all managers)")
        wrap(local.LocalRunner, "dispatch", "LocalRunner.dispatch")
        wrap(local.LocalRunner, "_active_summary", "LocalRunner._active_summary")
        atexit.register(lambda: sys.stderr.write(
            "".join(f"COUNT {k}: {int(v[0])} calls, {v[1]:.2f} s\n" for k, v in stats.items())))


def _trace() -> None:
    import atexit
    import time

    from packhorse.executors import local
    from packhorse.managers import archives, bundles, deletions, packages, transfers, unpacks

    t0 = float(os.environ.get("WHAT_IF_T0") or time.time())

    def say(text: str) -> None:
        sys.stderr.write(f"TRACE {time.time() - t0:6.2f} {text}\n")

    say("imported")

    def wrap(obj, name, label, show=lambda r: ""):  # type: ignore[no-untyped-def]
        f = getattr(obj, name)

        def w(*a, **k):  # type: ignore[no-untyped-def]
            t = time.perf_counter()
            r = f(*a, **k)
            el = time.perf_counter() - t
            if el > 0.02 or show(r):
                say(f"{label} {el:.3f} s {show(r)}")
            return r

        setattr(obj, name, w)

    for m in (packages, bundles, transfers, unpacks, archives, deletions):
        wrap(m, "manage", m.__name__.rsplit(".", 1)[1], lambda r: f"-> {r!r}" if r else "")
    wrap(local, "scan_all", "scan_all", lambda r: f"registered {r.registered}")
    wrap(local.LocalRunner, "dispatch", "dispatch", lambda r: f"-> {r}" if r else "")
    wrap(local.LocalRunner, "run", "LocalRunner.run")
    atexit.register(say, "atexit")


def _child() -> None:
    if "trace" in os.environ.get("WHAT_IF_PATCHES", "").split(","):
        _trace()
    _apply(set(filter(None, os.environ.get("WHAT_IF_PATCHES", "").split(","))))
    from packhorse.cli import main

    main()


def _parent() -> int:
    import argparse
    import subprocess
    import time
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import run_benchmarks as rb

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/packhorse-what-if"))
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("set", choices=sorted(rb.DATASETS))
    ap.add_argument("variants", nargs="+", help="comma-separated patches per run, or none")
    a = ap.parse_args()
    a.workdir.mkdir(parents=True, exist_ok=True)
    source, info = rb.ensure_dataset(a.workdir, a.set)
    run = a.workdir / "run"
    for variant in a.variants:
        cfg, _ = rb.setup_packhorse(source, run, a.workers)
        t, t0 = time.monotonic(), time.time()
        env = {**os.environ, "WHAT_IF_PATCHES": "" if variant == "none" else variant, "WHAT_IF_CHILD": "1",
               "WHAT_IF_T0": repr(t0)}
        p = subprocess.run([sys.executable, __file__, "run", "-c", str(cfg), "--until-idle", "--quiet"],
                           cwd=run, env=env, capture_output=True, text=True)
        elapsed = time.monotonic() - t
        if p.returncode != 0:
            print(f"{variant}: exit {p.returncode}\n{p.stderr}", file=sys.stderr)
            return 1
        rb.check_packhorse(cfg, run, info)
        phases = rb.timeline(run, t0)
        rb.cleanup(run)
        print(f"{variant:28s} {elapsed:6.2f} s  " + "  ".join(
            f"{k}:{v['first_start']}-{v['last_finish']}" for k, v in phases.items() if isinstance(v, dict)))
        for line in p.stderr.splitlines():
            if line.startswith(("COUNT ", "TRACE ")):
                print("    " + line[6:])
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    if os.environ.get("WHAT_IF_CHILD"):
        _child()
    else:
        sys.exit(_parent())
