#!/usr/bin/env python3
"""Two (or more) packhorse source trees against each other on one small data set, alternating.

For a quick before/after of a change when the machine is too busy for ``run_benchmarks.py``:
each tree (a folder holding ``src/packhorse``, e.g. ``git archive`` of a commit) runs ``packhorse
run --until-idle --quiet`` once per argument, in the order given, on the same generated files
(``FILES`` files of 0-16 KiB in ``GROUPS`` groups, made once in ``--workdir``). Prints the wall
time and the CPU time (user + system) of each run's process tree, and checks that every package
was archived and nothing failed. Wall times of one invocation are comparable only on a quiet
machine; CPU time much less depends on the load.

Usage::

    python benchmarks/ab_commits.py 2000 10 /tmp/before /tmp/after /tmp/before /tmp/after
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", type=int)
    ap.add_argument("groups", type=int)
    ap.add_argument("trees", nargs="+", type=Path)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/packhorse-ab"))
    a = ap.parse_args()
    src = a.workdir / "data"
    if not src.exists():
        rng = random.Random(1)
        for i in range(a.files):
            g = i % a.groups
            d = src / f"inst-{g // 10:02d}" / f"obs-{g % 10:04d}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"f{i:06d}.dat").write_bytes(rng.randbytes(rng.randint(0, 16384)))
        past = time.time() - 3600
        for dp, _, fs in os.walk(src):
            for f in fs:
                os.utime(os.path.join(dp, f), (past, past))
    for tree in a.trees:
        env = {**os.environ, "PYTHONPATH": f"{tree}/src"}
        run = a.workdir / "run"
        shutil.rmtree(run, ignore_errors=True)
        run.mkdir(parents=True)
        # a new installation each run: the source's marker of the last one would be refused
        shutil.rmtree(Path(src) / "_packhorse", ignore_errors=True)
        code = (f"from pathlib import Path; from packhorse.demo import write_demo_config; "
                f"print(write_demo_config(Path({str(run)!r}), {str(src)!r}, workers=4))")
        cfg = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                             check=True).stdout.strip()
        subprocess.run([sys.executable, "-m", "packhorse", "init", "-c", cfg], cwd=run, env=env, check=True,
                       capture_output=True)
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "packhorse", "run", "-c", cfg, "--until-idle", "--quiet"],
                           cwd=run, env=env, capture_output=True, text=True)
        wall = time.monotonic() - t
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        st = json.loads(subprocess.run([sys.executable, "-m", "packhorse", "status", "-c", cfg, "--json"], cwd=run,
                                       env=env, capture_output=True, text=True).stdout)
        cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
        ok = p.returncode == 0 and st["packages"]["archived"] == st["packages"]["total"] and not st["failed_operations"]
        print(f"{tree}: wall {wall:.2f} s, cpu {cpu:.2f} s, packages archived {st['packages']['archived']}/"
              f"{st['packages']['total']}{'' if ok else ' BROKEN: ' + p.stderr[-500:]}", flush=True)
        shutil.rmtree(run, ignore_errors=True)
    shutil.rmtree(a.workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
