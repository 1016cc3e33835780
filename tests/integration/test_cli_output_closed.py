"""A command whose output is closed by its reader (``packhorse locate … | head``) exits 141
(128 + SIGPIPE, as a shell reports a command SIGPIPE ended), never 1, which means "a check
found a problem" or "nothing matches"; the same command with its output read keeps its own
code. Runs ``python -m packhorse`` in subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import SRC, run_packhorse, write_site_config

# real `packhorse` processes writing into closed pipes: long (out of the default selection)
pytestmark = pytest.mark.long


def closed_output(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run packhorse with its stdout a pipe whose reader is gone before it starts."""
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.Popen([sys.executable, "-m", "packhorse", *args], stdout=w, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(SRC)}, cwd=cwd)
    finally:
        os.close(w)
    _, err = p.communicate(timeout=120)
    return subprocess.CompletedProcess(p.args, p.returncode, "", err)


def test_a_closed_output_exits_141_and_an_open_one_keeps_its_code(tmp_path: Path) -> None:
    cfg = write_site_config(tmp_path / "site")
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    # nothing matches: 1 when the output is read ...
    read = run_packhorse("locate", "-c", str(cfg), "nothing/of/this.fits")
    assert read.returncode == 1 and "nothing registered or packaged matches" in read.stdout
    # ... 141 when nobody reads it: the code says the output was cut, not what was found
    for args in (["locate", "-c", str(cfg), "nothing/of/this.fits"], ["locate", "-c", str(cfg), "--json", "x"],
                 ["status", "-c", str(cfg)], ["--help"], ["--version"]):
        p = closed_output(*args)
        assert p.returncode == 141, (args, p.returncode, p.stderr)
        assert "Traceback" not in p.stderr and "Exception ignored" not in p.stderr, p.stderr
    assert run_packhorse("--version").returncode == 0
