"""On the multi-site test bed: sites whose clocks run 5 minutes ahead of the centre's, and a
site's archive disk that goes away and comes back while the managers (in the centre) cannot see
any site's disk.

The source site ``fyst`` and the destination ``cologne`` run their packhorse processes with a
clock 300 s ahead of the centre's (the project's clock-shift hook, ``tests/clock_shift``: the
host clock packhorse and Celery's worker read). Their instruments' files carry future
modification times as the centre sees them. Every check is made on the archives' bytes
(lost, duplicated, corrupt, overwritten: 0), as in ``test_across_sites.py``.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from test_across_sites import archived_files, snapshot, tally, wait_archived, write_files
from testbed import CENTRAL_ADDRESS, PG_BIN, PG_PORT, TestBed, bed_for_test

pytestmark = [pytest.mark.multisite, pytest.mark.timeout(900)]

AHEAD = 300.0  # s: fyst's and cologne's clocks run this far ahead of the centre's
ZERO = dict(lost=0, duplicated=0, corrupt=0, overwritten=0)


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    b = bed_for_test(tmp_path_factory.mktemp("bed"), rate_mbit=200, clock_ahead={"fyst": AHEAD, "cologne": AHEAD},
                     settle_seconds=2)
    try:
        yield b
    finally:
        b.down()


def sql(bed: TestBed, query: str) -> str:
    """One value from the bed's ops database (``psql`` in the central namespace)."""
    r = bed.in_ns("central", str(PG_BIN / "psql"), "-h", CENTRAL_ADDRESS, "-p", str(PG_PORT), "-U", "postgres",
                  "-d", "packhorse", "-tAc", query)
    return r.stdout.strip()


def outage_open(bed: TestBed, location: str) -> bool:
    """``location`` has an open outage in the ops database."""
    return sql(bed, "SELECT count(*) FROM location_outages o JOIN data_locations l ON l.id = o.location_id "
                    f"WHERE l.name = '{location}'") == "1"


def test_sites_whose_clocks_run_5_minutes_ahead_archive_everything(bed: TestBed) -> None:
    start = time.monotonic()
    expected = write_files(bed, "obs-a", 4, 300_000)
    # an instrument host of fyst whose clock is ahead: its files' mtimes are 5 minutes in the
    # future for everyone whose clock is right
    future = write_files(bed, "obs-b", 4, 300_000)
    for rel in future:
        path = bed.root / "sites" / "fyst" / "source" / rel
        os.utime(path, (time.time() + AHEAD, time.time() + AHEAD))
    expected |= future
    took = wait_archived(bed, expected, 240)
    assert tally(bed, expected, {}) == ZERO
    print(f"fyst and cologne 5 minutes ahead: everything archived {took:.0f} s after the files were written "
          f"({time.monotonic() - start:.0f} s)")

    # a destination cut off for longer than the lease while its clock is ahead: nothing lost
    before = snapshot(bed)
    bed.cut_site("cologne")
    expected |= write_files(bed, "obs-c", 3, 200_000)
    time.sleep(25)
    bed.heal_site("cologne")
    healed = wait_archived(bed, expected, 240)
    assert tally(bed, expected, before) == ZERO
    print(f"cologne (5 minutes ahead) cut off 25 s: archived {healed:.0f} s after the link came back")

    # health, read from the centre, shows each site worker's offset to the database clock
    r = bed.cli("central", "health", "--json", "-c", str(bed.config), timeout=60)
    services = {(s["kind"], s["site"]): s for s in json.loads(r.stdout)["services"]}
    for site in ("fyst", "cologne"):
        w = services[("worker", site)]
        assert w["clock_offset_seconds"] == pytest.approx(-AHEAD, abs=5), w
        assert w["alive"] and w["age_seconds"] >= 0, w
    assert abs(services[("worker", "cornell")]["clock_offset_seconds"]) < 5
    text = bed.cli("central", "health", "-c", str(bed.config), timeout=60)
    assert "ahead of the database server's" in text.stderr and "worker:fyst" in text.stderr, text.stderr


def test_a_site_archive_disk_away_and_back_ends_its_outage_by_itself(bed: TestBed) -> None:
    archive = bed.root / "sites" / "cologne" / "archive"
    away = archive.with_name("archive.away")
    before = snapshot(bed)
    archive.rename(away)  # the disk is unmounted: its root is gone at cologne
    expected = write_files(bed, "obs-out", 3, 200_000)
    deadline = time.monotonic() + 180
    while not outage_open(bed, "cologne-archive"):
        assert time.monotonic() < deadline, f"no outage recorded; status: {bed.status()}"
        time.sleep(1)
    # cornell archives meanwhile; cologne waits
    got = archived_files(bed, "cornell")
    deadline = time.monotonic() + 180
    while not all(p in got for p in expected):
        assert time.monotonic() < deadline, "cornell did not archive while cologne's archive was away"
        time.sleep(1)
        got = archived_files(bed, "cornell")
    time.sleep(10)  # longer than retry_backoff_max_seconds (5 s): the waiting work backed off
    reason = sql(bed, "SELECT reason FROM location_outages")
    away.rename(archive)  # mounted again
    back = time.monotonic()
    while outage_open(bed, "cologne-archive"):
        assert time.monotonic() - back < 60, f"the outage did not end within 60 s; reason {reason!r}"
        time.sleep(0.5)
    ended = time.monotonic() - back
    healed = wait_archived(bed, expected, 240)
    assert tally(bed, expected, before) == ZERO
    # only the site's own processes judged its disk: its worker ended the outage, the managers
    # (which see an empty folder there) never did, and the reason is what cologne saw
    assert "location_available_again" in bed.log("worker-cologne")
    for n in ("manager-1", "manager-2"):
        assert "location_available_again" not in bed.log(n)
    print(f"cologne's archive away 10+ s: outage ended {ended:.1f} s after it was back (by cologne's worker), "
          f"archived {healed:.0f} s after; reason recorded: {reason}")
