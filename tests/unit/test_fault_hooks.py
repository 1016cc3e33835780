"""The test fault plan itself: a hook meant to fire once across a run's worker processes
(``marker`` equal to ``unless_exists``) fires in one of them, however many get there at once.

A run's worker processes once both paused at an archive write (both saw no marker yet); the test
killed the one whose pid the marker held and the other kept the run waiting for 300 s.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

from fault_hooks import FaultPlan


def _hit(plan: list[dict[str, Any]], barrier: Any) -> None:
    barrier.wait()
    FaultPlan(plan).hit("long_term_archive.writing")


def test_a_first_to_get_there_hook_fires_in_one_process_of_many(tmp_path: Path) -> None:
    marker, fired = tmp_path / "writing", tmp_path / "fired"
    fired.touch()
    plan = [{"point": "long_term_archive.writing", "action": "append", "path": str(fired), "data": "x",
             "marker": str(marker), "unless_exists": str(marker)}]
    mp = multiprocessing.get_context("fork")
    for _ in range(5):  # released together, several times: the race needs no luck to show
        marker.unlink(missing_ok=True)
        fired.write_text("")
        barrier = mp.Barrier(8)
        procs = [mp.Process(target=_hit, args=(plan, barrier)) for _ in range(8)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        assert [p.exitcode for p in procs] == [0] * 8
        assert fired.read_text() == "x"  # one process acted
        assert int(marker.read_text()) in {p.pid for p in procs}  # and the marker names it
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith("writing.")] == []  # no litter


def test_a_first_to_get_there_hook_that_does_not_fire_leaves_the_marker_free(tmp_path: Path) -> None:
    """A hook held back by ``if_exists`` or by ``times`` takes no marker: the process that does
    fire it later still acts, and the marker names that process."""
    marker, fired, go = tmp_path / "writing", tmp_path / "fired", tmp_path / "go"
    fired.touch()
    plan = [{"point": "long_term_archive.writing", "action": "append", "path": str(fired), "data": "x",
             "marker": str(marker), "unless_exists": str(marker), "if_exists": str(go)}]
    faults = FaultPlan(plan)
    faults.hit("long_term_archive.writing")  # not yet: the go file is missing
    assert not marker.exists() and fired.read_text() == ""
    go.touch()
    faults.hit("long_term_archive.writing")
    assert fired.read_text() == "x" and marker.read_text() == str(multiprocessing.current_process().pid)

    marker.unlink()
    fired.write_text("")
    spent = FaultPlan([{**plan[0], "if_exists": None, "times": 0}])
    spent.hit("long_term_archive.writing")  # its times are spent: it neither acts nor claims
    assert not marker.exists() and fired.read_text() == ""
