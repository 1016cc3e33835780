#!/usr/bin/env python3
"""packhorse source trees against each other (and the openssl script), alternating, on one of
``run_benchmarks.py``'s data sets: a before/after of a change.

Each tree is a folder holding ``src/packhorse`` (``git archive <commit> src | tar -x -C DIR``,
or the checkout itself). Every repeat runs each tree once (``packhorse run --until-idle
--quiet`` through ``PYTHONPATH=<tree>/src``, in a fresh run folder, after a ``sync``), the
order reversed every other repeat; ``script`` among the trees runs ``baseline.sh --hasher
openssl`` instead. Every packhorse run is checked as ``run_benchmarks.py`` checks it (every
package archived, nothing failed, buffers empty).

Printed per run and as medians: the wall time and the CPU time of the whole machine (user and
system seconds from ``/proc/stat``, read before and after the run: meaningful on a quiet
machine only). ``getrusage(RUSAGE_CHILDREN)`` would not do: the worker processes are children
of multiprocessing's fork server, not of ``packhorse run``, and their CPU time never reaches
it. CPU time depends less than wall time on the disk's mood, not on nothing: on this machine
one tree's CPU time moves by a tenth from run to run.

Usage::

    git archive HEAD~1 src | tar -x -C /tmp/before
    python benchmarks/ab_commits.py --repeats 6 /tmp/before . script
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_benchmarks as rb  # noqa: E402


def machine_cpu() -> tuple[float, float]:
    """(user, system) CPU seconds of the whole machine since boot (``/proc/stat``)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    return (v[0] + v[1]) / hz, v[2] / hz


def run_once(tree: str, source: Path, run_dir: Path, info: dict[str, int], workers: int) -> tuple[float, float, float]:
    """One run of ``tree`` (or the script): (wall s, user CPU s, system CPU s)."""
    rb.fresh(run_dir)
    subprocess.run(["sync"], check=True)
    if tree == "script":
        cmd = ["bash", str(rb.BASELINE), "--hasher", "openssl", str(source), str(run_dir)]
        env, cwd, cfg = dict(os.environ), None, None
    else:
        # a new installation each run over the same data set: the marker the last one left in
        # the source would be refused (another installation's root)
        shutil.rmtree(source / "_packhorse", ignore_errors=True)
        env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve() / "src")}
        # the demo's configuration writer (packhorse.cli.demo; packhorse.demo before the layers)
        code = (f"from pathlib import Path\ntry:\n    from packhorse.cli.demo import write_demo_config\n"
                f"except ImportError:\n    from packhorse.demo import write_demo_config\n"
                f"print(write_demo_config(Path({str(run_dir)!r}), {str(source)!r}, workers={workers}))")
        cfg = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                             check=True).stdout.strip()
        p = subprocess.run([sys.executable, "-m", "packhorse", "init", "-c", cfg], cwd=run_dir, env=env,
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"{tree}: packhorse init exited {p.returncode}\n{p.stderr[-2000:]}")
        cmd = [sys.executable, "-m", "packhorse", "run", "-c", cfg, "--until-idle", "--quiet"]
        cwd = run_dir
    u0, s0 = machine_cpu()
    t = time.monotonic()
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t
    u1, s1 = machine_cpu()
    if p.returncode != 0:
        raise SystemExit(f"{tree}: exit {p.returncode}\n{p.stderr[-2000:]}")
    if cfg is not None:
        rb.check_packhorse(Path(cfg), run_dir, info, env=env)
    rb.cleanup(run_dir)
    return wall, u1 - u0, s1 - s0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trees", nargs="+", help="folders holding src/packhorse, or 'script'")
    ap.add_argument("--set", default="b", choices=sorted(rb.DATASETS))
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--workers", type=int, default=4, help="packhorse [executor] workers (default 4, as run_benchmarks.py)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/packhorse-ab"))
    a = ap.parse_args()
    a.workdir.mkdir(parents=True, exist_ok=True)
    source, info = rb.ensure_dataset(a.workdir, a.set)
    rb.compile_bytecode()
    runs: dict[str, list[tuple[float, float, float]]] = {t: [] for t in a.trees}
    for r in range(a.repeats):
        for tree in a.trees if r % 2 == 0 else a.trees[::-1]:
            w, u, s = run_once(tree, source, a.workdir / "run", info, a.workers)
            runs[tree].append((w, u, s))
            print(f"{tree:32s} wall {w:6.2f} s  user {u:6.2f} s  system {s:6.2f} s", flush=True)
    for tree, rs in runs.items():
        print(f"median {tree:25s} wall {statistics.median(x[0] for x in rs):6.2f} s  user "
              f"{statistics.median(x[1] for x in rs):6.2f} s  system {statistics.median(x[2] for x in rs):6.2f} s "
              f"({len(rs)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
