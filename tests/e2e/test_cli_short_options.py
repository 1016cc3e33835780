"""Short options and the skipped summary, through the real ``packhorse`` command: ``-V`` prints the
version, ``run -n`` is the dry run (nothing written), ``run -v`` logs every operation at INFO, and
``status`` summarises skipped source paths as a count per reason (``status --skipped`` lists
them) instead of printing every one before FAILED and BLOCKED.
"""

from __future__ import annotations

import os
from pathlib import Path

from packhorse import __version__
from support import run_packhorse


def test_short_options_and_skipped_paths_counted_per_reason(pipeline) -> None:
    p = pipeline(bundle_max_wait_seconds=0)
    data = p.source / "cam" / "obs1"
    data.mkdir(parents=True)
    (data / "frame.fits").write_bytes(os.urandom(50_000))
    for i in range(12):  # symbolic links are never followed: skipped, each with its reason
        os.symlink("frame.fits", data / f"link{i}.fits")

    v = run_packhorse("-V")
    assert v.returncode == 0 and v.stdout.strip() == f"packhorse {__version__}"

    p.init()
    before = sorted(Path(p.root).rglob("*"))
    dry = p.cli("run", "-n")
    assert dry.returncode == 0, dry.stderr
    assert "fyst-source" in dry.stdout, dry.stdout
    assert sorted(Path(p.root).rglob("*")) == before, "the dry run wrote something"

    run = p.cli("run", "--until-idle", "-v")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "operation_completed" in run.stderr, run.stderr[-3000:]

    text = p.cli("status").stdout
    assert "skipped: 12 source path(s) not archived (`packhorse status --skipped` lists them)" in text, text
    assert "link3.fits" not in text
    reasons = [line for line in text.splitlines() if line.startswith("  12 at fyst-source: ")]
    assert len(reasons) == 1, text
    listed = p.cli("status", "--skipped").stdout
    assert all(f"link{i}.fits" in listed for i in range(12)), listed
    assert len(p.status()["skipped"]) == 12  # --json keeps the whole list
