"""The test bed's own promise (docs/multisite.md): ``up`` again in the same folder starts
afresh, even while a bed brought up there by another process still runs. A trial's second
``up`` met "ip netns add" refused (the namespaces were still there), tore the old bed down in
its failure path, and left none running."""

from __future__ import annotations

from pathlib import Path

import pytest
from testbed import CENTRAL_ADDRESS, TestBed, namespaces_work

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
    finally:
        again.down()
    assert not any(Path("/run/netns", ns).exists() for ns in again.ns.values())


def _answers(bed: TestBed, port: int) -> bool:
    """A TCP connection to the central namespace's ``port`` is accepted."""
    probe = f"import socket; socket.create_connection(({CENTRAL_ADDRESS!r}, {port}), timeout=2).close()"
    return bed.in_ns("central", "python3", "-c", probe, check=False).returncode == 0
