"""The test bed's own promise (docs/multisite.md): ``up`` again in the same folder starts
afresh, even while a bed brought up there by another process still runs. A trial's second
``up`` met "ip netns add" refused (the namespaces were still there), tore the old bed down in
its failure path, and left none running."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from testbed import CENTRAL_ADDRESS, TestBed, namespaces_work

TESTBED = Path(__file__).with_name("testbed.py")

pytestmark = [pytest.mark.multisite, pytest.mark.timeout(300)]


def test_up_again_in_the_same_folder_replaces_a_bed_still_running(tmp_path: Path) -> None:
    why = namespaces_work()
    if why:
        pytest.skip(why)
    first = TestBed(tmp_path / "bed").up(packhorse=False)
    again = TestBed(tmp_path / "bed")  # another process: it knows none of the first one's processes
    try:
        again.up(packhorse=False)
        r = again.in_ns("fyst", "ip", "-brief", "address", check=False)
        assert r.returncode == 0 and "10.201.1.2" in r.stdout, r.stdout + r.stderr
        assert first.procs and all(p.poll() is not None for p in first.procs.values())  # the old bed's are gone
        # the SSH path dropped and restored by hand (`testbed.py cut-ssh|heal-ssh`: another process)
        by_hand = TestBed(tmp_path / "bed")
        by_hand.cut_ssh("fyst")
        assert not _answers(again, 2201) and _answers(again, 2202)  # fyst's relay alone is gone
        by_hand.heal_ssh("fyst")
        assert _answers(again, 2201)
        by_hand.procs["relay-fyst"].kill()
        by_hand.procs["relay-fyst"].wait()
        # a whole site's link taken down and brought back by hand, through the command line
        assert _reaches(again, "fyst", 2202)
        for action, reaches in (("cut-site", False), ("heal-site", True)):
            r = subprocess.run([sys.executable, str(TESTBED), action, str(tmp_path / "bed"), "fyst"],
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            deadline = time.monotonic() + 10  # a link brought up carries traffic within moments
            while _reaches(again, "fyst", 2202) is not reaches and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _reaches(again, "fyst", 2202) is reaches, action
            assert _reaches(again, "cologne", 2202)  # the other sites keep their links
    finally:
        again.down()
    assert not any(Path("/run/netns", ns).exists() for ns in again.ns.values())


def _reaches(bed: TestBed, ns: str, port: int) -> bool:
    """From namespace ``ns``, a TCP connection to the central namespace's ``port`` is accepted."""
    probe = f"import socket; socket.create_connection(({CENTRAL_ADDRESS!r}, {port}), timeout=2).close()"
    return bed.in_ns(ns, "python3", "-c", probe, check=False).returncode == 0


def _answers(bed: TestBed, port: int) -> bool:
    """A TCP connection to the central namespace's ``port`` is accepted."""
    probe = f"import socket; socket.create_connection(({CENTRAL_ADDRESS!r}, {port}), timeout=2).close()"
    return bed.in_ns("central", "python3", "-c", probe, check=False).returncode == 0
