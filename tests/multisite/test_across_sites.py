"""Across real sites: three sites in network namespaces that share no file system, SFTP between
them, a central PostgreSQL and broker, and the link faults a long thin link has.

Every check is made from outside packhorse, on the archives' bytes: each package tar found in a
site's long-term archive is read with :mod:`tarfile`, and every source file must be in exactly
one package at every archive, with its bytes (lost, duplicated, corrupt: 0); an object that
was in an archive before a fault must still be the same file afterwards (overwritten: 0). The
seconds until everything is archived again are measured from the moment the link is back.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from typing import Any

import pytest
from testbed import SITES, TestBed, archived_files, bed_for_test

pytestmark = [pytest.mark.multisite, pytest.mark.timeout(900)]

DESTINATIONS = ["cologne", "cornell"]


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    # a site or link is news after 12 s (90 s by default), so the cuts below are notified
    b = bed_for_test(tmp_path_factory.mktemp("bed"), rate_mbit=200, config_extra={"service_dead_after_seconds": 12})
    try:
        yield b
    finally:
        b.down()


def write_files(bed: TestBed, observation: str, count: int, size: int) -> dict[str, str]:
    """``count`` files of ``size`` bytes into ``cam/<observation>/`` at fyst's source; ``{path: sha256}``."""
    folder = bed.root / "sites" / "fyst" / "source" / "cam" / observation
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for n in range(count):
        data = os.urandom(size)
        (folder / f"f{n:03d}.dat").write_bytes(data)
        out[f"cam/{observation}/f{n:03d}.dat"] = hashlib.sha256(data).hexdigest()
    return out


def archive_objects(bed: TestBed, site: str) -> dict[str, tuple[int, int]]:
    """Every object in ``site``'s archive: ``{relative path: (inode, mtime_ns)}``."""
    root = bed.root / "sites" / site / "archive"
    return {str(p.relative_to(root)): (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in root.rglob("*.tar") if "_packhorse" not in p.parts}


def tally(bed: TestBed, expected: dict[str, str], before: dict[str, dict[str, tuple[int, int]]]) -> dict[str, int]:
    """Lost, duplicated, corrupt and overwritten archive objects over both destinations."""
    counts = dict(lost=0, duplicated=0, corrupt=0, overwritten=0)
    for site in DESTINATIONS:
        got = archived_files(bed, site)
        for path, digest in expected.items():
            copies = got.get(path, [])
            counts["lost"] += not copies
            counts["duplicated"] += max(0, len(copies) - 1)
            counts["corrupt"] += sum(d != digest for d in copies)
        now = archive_objects(bed, site)
        counts["overwritten"] += sum(1 for k, v in before.get(site, {}).items() if now.get(k) != v)
    return counts


def wait_archived(bed: TestBed, expected: dict[str, str], timeout: float) -> float:
    """Seconds until every expected file is in every destination's archive (fails after ``timeout``)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if all(all(p in archived_files(bed, s) for p in expected) for s in DESTINATIONS):
            return time.monotonic() - start
        time.sleep(1)
    logs = "\n".join(f"--- {n}\n{bed.log(n)[-2500:]}" for n in ("manager-1", "monitor", *(f"worker-{s}" for s in SITES)))
    raise AssertionError(f"not archived within {timeout} s; status: {bed.status()}\n{logs}")


def notifications(bed: TestBed, *events: str) -> list[tuple[str, str, str]]:
    """``(level, event, subject)`` of the bed's queued notifications of ``events``, oldest first
    (as ``packhorse notifications --json`` from the centre lists them)."""
    r = bed.cli("central", "notifications", "--json", "-c", str(bed.config), timeout=60)
    rows = json.loads(r.stdout)
    return [(n["level"], n["event"], n["subject"]) for n in sorted(rows, key=lambda n: n["id"]) if n["event"] in events]


def wait_for(what: str, check: Callable[[], Any], timeout: float) -> Any:
    """Poll ``check`` every second until it returns something true (fails after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            assert got, f"{what}: not within {timeout} s"
            return got
        time.sleep(1)


def snapshot(bed: TestBed) -> dict[str, dict[str, tuple[int, int]]]:
    return {site: archive_objects(bed, site) for site in DESTINATIONS}


def test_sites_that_share_no_file_system_archive_a_tree_and_heal_a_source_site_cut_off_from_the_centre(bed: TestBed) -> None:
    expected = write_files(bed, "obs-a", 6, 300_000) | write_files(bed, "obs-b", 3, 1_000_000)
    wait_archived(bed, expected, 180)
    assert tally(bed, expected, {}) == dict(lost=0, duplicated=0, corrupt=0, overwritten=0)
    # no site could read another's folders: the destinations logged in to fyst's sshd to read them
    assert "Accepted publickey for root" in bed.log("sshd-fyst")

    # the source site is cut off from the centre (database, broker) and from the other sites for
    # longer than a lease (20 s) while its instruments keep writing
    before = snapshot(bed)
    bed.cut_site("fyst")
    expected |= write_files(bed, "obs-c", 4, 200_000)
    time.sleep(30)
    expected |= write_files(bed, "obs-d", 2, 200_000)
    bed.heal_site("fyst")
    healed = wait_archived(bed, expected, 240)
    assert tally(bed, expected, before) == dict(lost=0, duplicated=0, corrupt=0, overwritten=0)
    print(f"source site cut off 30 s: everything archived {healed:.0f} s after the link came back")
    # the operators heard once of the cut and once of its end, however many operations waited
    site_notes = ["site_unreachable", "site_reachable"]
    wait_for("site_reachable", lambda: len(notifications(bed, *site_notes)) >= 2, 60)
    assert notifications(bed, *site_notes) == [("WARNING", "site_unreachable", "Site fyst unreachable"),
                                               ("INFO", "site_reachable", "Site fyst reachable again")]

    # the central database restarted while a destination site is cut off
    before = snapshot(bed)
    bed.cut_site("cornell")
    expected |= write_files(bed, "obs-e", 3, 300_000)
    bed.restart_postgres(down_seconds=5)
    time.sleep(10)
    bed.heal_site("cornell")
    healed = wait_archived(bed, expected, 240)
    assert tally(bed, expected, before) == dict(lost=0, duplicated=0, corrupt=0, overwritten=0)
    print(f"database restarted while cornell was cut off: archived {healed:.0f} s after the link came back")


def test_a_transfer_cut_mid_stream_and_a_flapping_link_lose_nothing(bed: TestBed) -> None:
    bed.shape("cologne", 40)  # 40 Mbit/s: a 40 MB bundle takes about 8 s
    before = snapshot(bed)
    expected = write_files(bed, "obs-big", 4, 10_000_000)
    # wait until cologne's transfer is under way (a partial in its buffer), then cut SSH to fyst
    partials = bed.root / "sites" / "cologne" / "buffer"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(".packhorse-partial" in p.name for p in partials.rglob("*")):
        time.sleep(0.2)
    bed.cut_ssh("fyst")
    cut = time.monotonic()
    # the centre names the cut link while the transfers wait for it (a trial saw "no problems")
    links: list[str] = []
    while "link fyst-buffer → cologne-buffer" not in links and time.monotonic() - cut < 60:
        links = [str(b["subject"]) for b in bed.status().get("blocked", []) if b["cause"] == "link_unreachable"]
    assert "link fyst-buffer → cologne-buffer" in links, bed.status()
    assert all(link.startswith("link fyst-buffer → ") for link in links), links  # only the cut path
    # one notification for the cut link once it is news (12 s on this bed), however many transfers wait
    link_notes = ["link_unreachable", "link_reachable"]
    wait_for("link_unreachable", lambda: notifications(bed, *link_notes), 90)
    bed.heal_ssh("fyst")
    healed = wait_archived(bed, expected, 300)
    assert tally(bed, expected, before) == dict(lost=0, duplicated=0, corrupt=0, overwritten=0)
    assert not [b for b in bed.status().get("blocked", []) if b["cause"] == "link_unreachable"]
    # and one when it is back, for each link the cut held up (fyst's to cornell too, if a
    # transfer to cornell waited on it)
    def cuts_and_backs() -> tuple[list[str], list[str]]:
        notes = notifications(bed, *link_notes)
        assert all(level == ("WARNING" if event == "link_unreachable" else "INFO") for level, event, _ in notes)
        return ([subject.removesuffix(" cut") for _, event, subject in notes if event == "link_unreachable"],
                [subject.removesuffix(" back") for _, event, subject in notes if event == "link_reachable"])

    wait_for("link_reachable", lambda: len(cuts_and_backs()[1]) == len(cuts_and_backs()[0]), 60)
    cuts, backs = cuts_and_backs()
    assert "Link fyst-buffer -> cologne-buffer" in cuts and sorted(cuts) == sorted(backs) == sorted(set(cuts)), (
        cuts, backs)
    assert all(link.startswith("Link fyst-buffer -> ") for link in cuts), cuts
    print(f"SSH to the source cut mid-transfer for {time.monotonic() - cut - healed:.0f} s: archived {healed:.0f} s "
          "after it came back")

    # a link that drops and returns every few seconds for a minute
    before = snapshot(bed)
    expected2 = write_files(bed, "obs-flap", 3, 3_000_000)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        bed.cut_site("cornell")
        time.sleep(3)
        bed.heal_site("cornell")
        time.sleep(4)
    healed = wait_archived(bed, expected | expected2, 300)
    assert tally(bed, expected | expected2, before) == dict(lost=0, duplicated=0, corrupt=0, overwritten=0)
    print(f"cornell's link flapping for 60 s: archived {healed:.0f} s after the last return")
