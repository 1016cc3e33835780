"""Disk pressure inside ``packhorse run``: the disk monitor records the injected usage,
notifies the crossing, and the deletion manager frees the critical buffer before its 7-day
retention while buffers below warning keep their copies."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from support import run_packhorse, write_site_config


def test_critical_buffer_is_freed_before_retention_and_normal_buffers_wait(tmp_path: Path) -> None:
    site = tmp_path / "site"
    cfg = write_site_config(site)
    cfg.write_text(cfg.read_text().replace("retention_seconds = 0", "retention_seconds = 604800"))
    for unit in ("obs1", "obs2"):
        (site / "source" / "cam" / unit).mkdir(parents=True)
        (site / "source" / "cam" / unit / "a.dat").write_bytes(unit.encode() * 1000)
    usage = tmp_path / "usage.json"
    usage.write_text(json.dumps({"fyst-buffer": {"total": 10_000_000, "used": 9_000_000}}))
    env = {"PACKHORSE_TEST_DISK_USAGE": str(usage)}
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    r = run_packhorse("run", "-c", str(cfg), "--until-idle", "--quiet", env=env)
    assert r.returncode == 0, r.stderr
    status = json.loads(run_packhorse("status", "-c", str(cfg), "--json").stdout)
    assert status["packages"] == {"total": 2, "archived": 2, "failed": 0}
    copies = status["copies"]
    assert copies.get("fyst-buffer", {"count": 0})["count"] == 0  # critical: gone before the retention
    assert copies["cologne-buffer"]["count"] >= 2 and copies["cornell-buffer"]["count"] >= 2  # normal: kept
    assert copies["cologne-lta"]["count"] == 2 and copies["cornell-lta"]["count"] == 2
    assert not list((site / "sites" / "fyst" / "buffer").rglob("*.tar"))
    # a root is made by its first write: the run's first sample could not see cologne-buffer yet
    rows = {u["location"]: u for u in json.loads(run_packhorse("usage", "--measure", "--json", "-c", str(cfg),
                                                                env=env).stdout)}
    assert rows["fyst-buffer"]["level"] == "critical" and rows["cologne-buffer"]["level"] == "normal"
    notes = json.loads(run_packhorse("notifications", "--json", "-c", str(cfg)).stdout)
    assert [n["subject"] for n in notes if n["event"].startswith("disk_")] == [
        "Disk usage critical: fyst-buffer at 90.0%"]


def test_a_critical_episode_stops_deleting_once_df_is_back_under_the_recovery_threshold(tmp_path: Path) -> None:
    """Real bytes on a 64 MiB tmpfs: the buffer holds 12 archived packages (2 MiB each) and their
    24 MiB bundle, then ballast pushes it to ~89 %. The oldest copy (the bundle) is enough to get
    under 60 %; the episode must stop there, although the disk monitor's only sample (every
    60 s) still says 89 % after that deletion finished."""
    import os

    from tmpfs_support import df_percent, mount_tmpfs

    site = tmp_path / "site"
    cfg = write_site_config(site)
    cfg.write_text(cfg.read_text().replace("retention_seconds = 0", "retention_seconds = 604800"))
    for i in range(12):
        (site / "source" / "cam" / f"obs{i:02d}").mkdir(parents=True)
        (site / "source" / "cam" / f"obs{i:02d}" / "a.dat").write_bytes(os.urandom(2 << 20))
    with mount_tmpfs(site / "sites" / "fyst" / "buffer", 64) as buf:
        assert run_packhorse("init", "-c", str(cfg)).returncode == 0
        r = run_packhorse("run", "-c", str(cfg), "--until-idle", "--quiet")
        assert r.returncode == 0, r.stderr
        assert len(list((buf / "raw").rglob("*.tar"))) == 12 and len(list((buf / "bundles").glob("*.tar"))) == 1
        (buf / "ballast").write_bytes(os.urandom(8 << 20))  # not packhorse's: never deleted
        before = df_percent(buf)
        assert before > 85, before
        measured = json.loads(run_packhorse("usage", "--measure", "--json", "-c", str(cfg)).stdout)
        row = {u["location"]: u for u in measured}["fyst-buffer"]
        assert abs(row["percent"] - before) < 0.5 and row["level"] == "critical" and row["age_seconds"] < 60
        r = run_packhorse("run", "-c", str(cfg), "--until-idle", "--quiet")
        assert r.returncode == 0, r.stderr
        after = df_percent(buf)
        assert 45 < after < 60, after  # under the recovery threshold, and not far under it
        assert len(list((buf / "raw").rglob("*.tar"))) == 12  # the bundle was enough
        assert not list((buf / "bundles").glob("*.tar"))
        latest = {u["location"]: u for u in json.loads(run_packhorse("usage", "--json", "-c", str(cfg)).stdout)}
        assert abs(latest["fyst-buffer"]["percent"] - after) < 0.5  # measured again as it went
        notes = [n["event"] for n in json.loads(run_packhorse("notifications", "--json", "-c", str(cfg)).stdout)]
        assert "disk_critical" in notes and "disk_recovered" in notes


def test_a_full_destination_buffer_makes_the_work_wait_and_it_goes_on_by_itself_once_there_is_space(pipeline) -> None:
    """A write that meets a full file system (real ENOSPC: a small tmpfs) used to fail like any
    write error: retried, then FAILED, and only `packhorse reset` released it after space was
    freed (found by a trial). It waits for space instead: exit 4 with the location listed, no
    FAILED operation, and the next run goes on by itself once there is space."""
    import os

    from tmpfs_support import mount_tmpfs

    p = pipeline(bundle_max_wait_seconds=0, max_retries=1)
    data = p.source / "inst" / "obs1" / "a.fits"
    data.parent.mkdir(parents=True)
    data.write_bytes(os.urandom(3 << 20))  # a 3 MiB package
    with mount_tmpfs(p.location("cologne-buffer"), 8) as buf:  # a bundle and its package fit
        p.init()
        ballast = buf / "ballast"
        ballast.write_bytes(b"\0" * (6 << 20))  # 2 MiB of 8 left free: the bundle does not fit
        r = p.run(expect=4)
        status = p.status()
        assert status["failed_operations"] == [], status["failed_operations"]
        [full] = [b for b in status["blocked"] if b["cause"] == "location_full"]
        assert full["subject"] == "location cologne-buffer" and full["detail"]["operations_waiting"] == 1, full
        assert "free space at cologne-buffer" in full["release"], full
        assert "cologne-buffer is full" in r.stderr, r.stderr[-3000:]
        assert not [f for f in buf.rglob("*") if f.name.endswith(".packhorse-partial")]
        assert (p.location("cornell-lta") / "raw/inst/obs1.tar").is_file()  # the other site went on
        # `status` into a file or a pipe: the blocked work as lines, not a table padded to the
        # width of its longest text with thousands of rule characters (found by a trial)
        piped = p.cli("status").stdout
        assert "BLOCKED location cologne-buffer (location_full)" in piped, piped
        assert "release: free space at cologne-buffer" in piped, piped
        assert max(line.count("━") + line.count("─") for line in piped.splitlines()) < 200, piped
        # a second run looks for space again and meets the full disk again: the wait goes on,
        # and "since" stays the start of the wait, not the latest look
        time.sleep(1.1)
        p.run(expect=4)
        [again] = [b for b in p.status()["blocked"] if b["cause"] == "location_full"]
        assert again["since"] == full["since"], (again["since"], full["since"])
        # the start of the wait, in the one time format of the text surfaces (seconds, UTC)
        assert f"(location_full) since {full['since'].replace('T', ' ')[:19]} UTC:" in p.cli("status").stdout

        ballast.unlink()  # space is back: nothing to reset
        p.run()
        status = p.status()
        assert status["blocked"] == [] and status["failed_operations"] == [], status
        assert (p.location("cologne-lta") / "raw/inst/obs1.tar").is_file(), json.dumps(status["operations"])
        assert "FAILED" not in json.dumps(status["operations"]), status["operations"]


def test_an_unpack_that_fills_its_buffer_half_way_goes_on_once_its_first_packages_are_archived_and_freed(pipeline) -> None:
    """An unpack that fills its buffer half way: the packages it published and verified before
    are recorded with its wait for space (as a failure records them), so they are archived; their
    buffer copies are then freed although the unpack of their bundle is not done (it reads past
    packages archived at every archive of the site: it does not need them; they used to be kept
    for it, a deadlock found by a trial), and the freed space makes the waiting unpack due at
    once, not after its backoff (60 s here): the run ends with everything archived."""
    import os
    import sqlite3

    from tmpfs_support import mount_tmpfs

    p = pipeline(bundle_max_wait_seconds=2, retry_backoff_base_seconds=60, retry_backoff_max_seconds=600)
    for group in ("obs1", "obs2"):
        f = p.source / "inst" / group / "a.fits"
        f.parent.mkdir(parents=True)
        f.write_bytes(os.urandom(3 << 19))  # 1.5 MiB each: one bundle of 3 MiB
    with mount_tmpfs(p.location("cologne-buffer"), 6) as buf:
        p.init()
        (buf / "ballast").write_bytes(b"\0" * (1 << 20))  # 5 MiB free: the bundle and one package
        p.run(expect=0)
        db = sqlite3.connect(p.root / "packhorse.db")
        bundles = db.execute("SELECT COUNT(*) FROM data_transfer_packages").fetchone()[0]
        assert bundles == 1, "the two packages were not bundled together: the test needs one bundle"
        waited = db.execute("SELECT attempt FROM operations WHERE kind = 'unpack' AND destination_location_id = "
                            "(SELECT id FROM data_locations WHERE name = 'cologne-buffer')").fetchone()[0]
        assert waited >= 2, "the unpack did not meet the full buffer: the test needs it to"
        archived = {k for k in p.objects("cologne-lta") if k.startswith("raw/")}
        assert archived == {"raw/inst/obs1.tar", "raw/inst/obs2.tar"}, archived
        status = p.status()
        assert status["blocked"] == [] and status["failed_operations"] == [], status
        assert sorted(f.name for f in buf.rglob("*") if f.is_file()) == ["ballast", "location.json"]


def test_a_transfer_command_that_meets_a_full_buffer_waits_for_space_too(pipeline) -> None:
    """With ``method = "command"`` (``cp``) a full destination buffer still ended in a FAILED
    transfer (TransferCommandError "No space left on device") after the built-in copy had
    learnt to wait (found by a trial): the file system decides, whatever the command said."""
    import os

    from tmpfs_support import mount_tmpfs

    p = pipeline(bundle_max_wait_seconds=0, max_retries=1,
                 route_extra='method = "command"\ncommand = "cp {source} {destination}"')
    data = p.source / "inst" / "obs1" / "a.fits"
    data.parent.mkdir(parents=True)
    data.write_bytes(os.urandom(3 << 20))
    with mount_tmpfs(p.location("cologne-buffer"), 8) as buf:
        p.init()
        ballast = buf / "ballast"
        ballast.write_bytes(b"\0" * (6 << 20))
        p.run(expect=4)
        status = p.status()
        assert status["failed_operations"] == [], status["failed_operations"]
        assert [b["cause"] for b in status["blocked"]] == ["location_full"], status["blocked"]
        ballast.unlink()
        p.run()
        assert (p.location("cologne-lta") / "raw/inst/obs1.tar").is_file()
        assert p.status()["failed_operations"] == []


def test_a_bundle_larger_than_the_whole_destination_buffer_fails_and_says_so_instead_of_waiting_for_ever(pipeline) -> None:
    """A transfer whose bundle is larger than the destination buffer's whole file system waited
    for space for ever, listed as "full", though nothing could ever free enough (found by a
    trial). It fails instead, naming the location, the bytes it needs and the file system's
    size, with what releases it; the other destination goes on. Once the buffer is larger,
    ``packhorse reset`` releases it."""
    import os
    import subprocess

    from tmpfs_support import mount_tmpfs

    p = pipeline(bundle_max_wait_seconds=0, max_retries=1)
    data = p.source / "inst" / "obs1" / "a.fits"
    data.parent.mkdir(parents=True)
    data.write_bytes(os.urandom(5 << 20))  # a 5 MiB package: its bundle is larger than 4 MiB
    with mount_tmpfs(p.location("cologne-buffer"), 4) as buf:
        p.init()
        r = p.run(expect=3)  # FAILED operations
        status = p.status()
        [failed] = status["failed_operations"]
        assert failed["kind"] == "transfer" and failed["error_type"] == "NeverFitsError", failed
        assert "cologne-buffer" in failed["message"] and "can never fit" in failed["message"], failed
        # the bundle by its name, as everything else names it (not its database id: "bundle 1")
        assert re.search(r"\bbundle fyst-\d{8}T\d{6}Z-\d{6} ", failed["message"]), failed
        assert f"({4 << 20:,} bytes)" in failed["message"], failed
        assert "larger file system" in failed["diagnosis"] and "packhorse reset transfer" in failed["diagnosis"]
        assert not [b for b in status["blocked"] if b["cause"] == "location_full"], status["blocked"]
        assert not [f for f in buf.rglob("*") if f.name.endswith(".packhorse-partial")]
        assert (p.location("cornell-lta") / "raw/inst/obs1.tar").is_file()  # the other site went on
        assert "can never fit" in r.stderr, r.stderr[-3000:]

        # the operator grows the buffer (a remount with a larger size) and resets the transfer
        subprocess.run(["mount", "-o", "remount,size=16m", str(buf)], check=True)
        reset = p.cli("reset", "transfer", str(failed["id"]))
        assert reset.returncode == 0, reset.stderr
        p.run()
        assert (p.location("cologne-lta") / "raw/inst/obs1.tar").is_file()
        assert p.status()["failed_operations"] == []


@pytest.mark.parametrize("buffer", ["fyst-buffer", "cologne-buffer"])
def test_work_is_not_let_into_a_small_buffer_faster_than_it_can_leave(pipeline, buffer: str) -> None:
    """Packages were built into the source buffer as fast as they came (four workers at once),
    and bundles shipped into a destination buffer as fast as they came: a small buffer filled up
    with package tars no bundle fitted beside, or with bundles no package could be unpacked
    beside; nothing could be archived or freed, and the run waited for ever (found by two
    trials). A package is built, and a bundle let in, only while the buffer keeps room for what
    must be written beside it and for the work let in before: everything is archived, in one
    run."""
    import os

    from tmpfs_support import mount_tmpfs

    p = pipeline(bundle_max_wait_seconds=1, bundle_target_bytes=5 << 20, workers=4)
    for i in range(6):
        f = p.source / "inst" / f"obs{i}" / "a.fits"
        f.parent.mkdir(parents=True)
        f.write_bytes(os.urandom(5 << 19))  # 2.5 MiB packages; bundles of two
    with mount_tmpfs(p.location(buffer), 12) as buf:
        p.init()
        p.run(expect=0)
        status = p.status()
        assert status["packages"] == {"total": 6, "archived": 6, "failed": 0}, status["packages"]
        assert status["blocked"] == [] and status["failed_operations"] == [], status
        assert sorted(f.name for f in buf.rglob("*") if f.is_file()) == ["location.json"]


def test_space_an_operator_frees_is_found_by_a_running_service_before_the_backoff_ends(pipeline) -> None:
    """A service (plain ``packhorse run``) whose work waits for space at a full buffer went on
    only after its backoff (up to ``retry_backoff_max_seconds``) once an operator freed space:
    the manager cycle now sees the location has more bytes free than when the work was handed
    back and makes it due at once (60 s of backoff here; it goes on within seconds)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from support import SRC
    from tmpfs_support import mount_tmpfs

    p = pipeline(bundle_max_wait_seconds=0, retry_backoff_base_seconds=60, retry_backoff_max_seconds=600)
    data = p.source / "inst" / "obs1" / "a.fits"
    data.parent.mkdir(parents=True)
    data.write_bytes(os.urandom(3 << 20))
    with mount_tmpfs(p.location("cologne-buffer"), 8) as buf:
        p.init()
        ballast = buf / "ballast"
        ballast.write_bytes(b"\0" * (6 << 20))  # the bundle does not fit
        proc = subprocess.Popen([sys.executable, "-m", "packhorse", "run", "-c", str(p.config), "--quiet"],
                                cwd=p.root, env={**os.environ, "PYTHONPATH": str(SRC)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while not [b for b in p.status()["blocked"] if b["cause"] == "location_full"]:
                assert proc.poll() is None and time.monotonic() < deadline, "the transfer never waited for space"
                time.sleep(0.2)
            ballast.unlink()  # the operator frees space
            archived = p.location("cologne-lta") / "raw/inst/obs1.tar"
            deadline = time.monotonic() + 30
            while not archived.is_file():
                assert proc.poll() is None and time.monotonic() < deadline, "still waiting for its backoff"
                time.sleep(0.2)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.communicate(timeout=60)
        assert p.status()["failed_operations"] == []
