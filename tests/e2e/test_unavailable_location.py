"""Storage that is absent is not empty (DESIGN.md "Architecture"), with real processes.

A source root and an archive root taken away during a run (an unmounted disk, a renamed
folder) are never re-created or written into; the work on them waits, ``status`` lists them as
blocked, and once they are back the next plain ``packhorse run --until-idle`` finishes
everything and exits 0 — no reset, no SQL, no configuration change. An empty mount point (the
root without its identity marker) blocks writes too; a root with data and no marker (a
deployment from before markers) is adopted by ``packhorse init``. Copies recorded ``missing``
whose bytes are back are recognised after a read-back, never rewritten.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_helpers import MARKER_KEY, Pipeline, assert_archived_everywhere, source_files

from support import SRC


def _source(p: Pipeline, groups: int, start: int = 0, size: int = 300_000) -> None:
    for g in range(start, start + groups):
        for f in range(2):
            path = p.source / "cam" / f"obs{g}" / f"frame{f}.fits"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(os.urandom(size))


def _blocked(p: Pipeline) -> dict[str, dict]:
    return {b["detail"]["location"]: b for b in p.status()["blocked"] if b["cause"] == "location_unavailable"}


def _db(p: Pipeline) -> sqlite3.Connection:
    return sqlite3.connect(p.root / "packhorse.db")


def test_source_and_archive_roots_taken_away_during_a_run_wait_and_resume(pipeline, tmp_path: Path) -> None:
    p = pipeline(bundle_max_wait_seconds=0)
    _source(p, groups=4)
    p.init()
    expected = source_files(p.source)
    assert len(expected) == 8
    archive = p.location("cologne-lta")
    assert (archive / MARKER_KEY).is_file() and (p.source / MARKER_KEY).is_file()  # marked by init

    marker = tmp_path / "packaging"
    source_away, archive_away = tmp_path / "source-unmounted", tmp_path / "archive-unmounted"
    # the package write is held until both disks are gone (a fixed pause could end first on a loaded machine)
    faults = [{"point": "raw_data_package.write", "action": "wait_for", "path": str(archive_away), "seconds": 120,
               "marker": str(marker), "times": 1}]
    env = {**os.environ, "PYTHONPATH": str(SRC), "PACKHORSE_TEST_FAULTS": json.dumps(faults)}
    proc = subprocess.Popen([sys.executable, "-m", "packhorse", "run", "-c", str(p.config), "--until-idle",
                             "--quiet"], env=env, cwd=p.root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no package was being written"
            time.sleep(0.02)
        # the disks go away in the middle of the run: one package is being written, the others wait
        os.rename(p.source, source_away)
        os.rename(archive, archive_away)
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stderr = err.decode(errors="replace")
    # the only work left waits for the world outside: exit 4 (blocked), not 0, not 3 (failed)
    assert proc.returncode == 4, stderr[-4000:]
    assert "blocked: location cologne-lta" in stderr and "blocked: location fyst-source" in stderr, stderr[-4000:]
    # nothing was created or written under the missing paths
    assert not p.source.exists() and not archive.exists()

    status = p.status()
    assert status["failed_operations"] == [] and status["packages"]["failed"] == 0
    blocked = _blocked(p)
    assert set(blocked) == {"fyst-source", "cologne-lta"}, status["blocked"]
    for name, path in (("fyst-source", p.source), ("cologne-lta", archive)):
        b = blocked[name]
        assert b["exit_code"] == 4 and b["since"] and b["detail"]["path"] == str(path)
        assert f"remount / restore {path}" in b["release"] and "resumes by itself" in b["release"]
    assert blocked["fyst-source"]["detail"]["operations_waiting"] >= 1  # the packages not yet written
    assert blocked["cologne-lta"]["detail"]["operations_waiting"] >= 1  # the archive copies
    text = p.cli("status")
    assert "BLOCKED location cologne-lta" in text.stdout and "remount / restore" in text.stdout, text.stdout
    # problems first: the first line says two locations are unavailable, since when, before any table
    first = text.stdout.lstrip().splitlines()[0]
    assert first.startswith("UNAVAILABLE: 2 data location(s) unavailable") and " since 20" in first, text.stdout
    assert [x["cause"] for x in status["problems"]] == ["location_unavailable"]
    code, report = p.verify()
    assert not [m for m in report["missing"] if m["location"] == "cologne-lta"] and not archive.exists()
    with _db(p) as db:
        assert db.execute("SELECT count(*) FROM physical_copies WHERE status IN ('missing', 'corrupt')").fetchone()[0] == 0
        # one notification per outage, however often the locations were looked at
        events = db.execute("SELECT context FROM notification_outbox WHERE event = 'location_unavailable'").fetchall()
        assert sorted(json.loads(c)["location"] for (c,) in events) == ["cologne-lta", "fyst-source"]

    # the disks come back: a plain run finishes everything by itself
    os.rename(source_away, p.source)
    os.rename(archive_away, archive)
    p.run(expect=0)
    assert_archived_everywhere(p, expected)
    status = p.status()
    assert status["blocked"] == [] and status["failed_operations"] == []
    assert status["packages"]["archived"] == status["packages"]["total"] >= 4
    code, report = p.verify()
    assert code == 0, report
    with _db(p) as db:
        back = db.execute("SELECT context FROM notification_outbox WHERE event = 'location_available'").fetchall()
        assert sorted(json.loads(c)["location"] for (c,) in back) == ["cologne-lta", "fyst-source"]


def test_an_empty_mount_point_blocks_writes_and_init_adopts_an_unmarked_root_with_data(pipeline, tmp_path: Path) -> None:
    p = pipeline(bundle_max_wait_seconds=0)
    _source(p, groups=1)
    p.init()
    p.run(expect=0)
    archive = p.location("cologne-lta")
    before = p.snapshot("cologne-lta")

    # "unmounted": the archive disk is gone, an empty mount point is left where it was
    os.rename(archive, tmp_path / "disk")
    archive.mkdir()
    _source(p, groups=1, start=1)
    r = p.run(expect=4)
    assert os.listdir(archive) == [], "packhorse wrote into the empty mount point"
    b = _blocked(p)["cologne-lta"]
    assert b["detail"]["marker_only"] is True and "packhorse init" in b["release"]
    assert "no identity marker" in b["reason"] and "blocked: location cologne-lta" in r.stderr
    # verify judges none of the copies there: an empty mount point is not evidence of loss
    code, report = p.verify()
    assert code == 1 and [(u["location"], u["copies"]) for u in report["unavailable"]] == [("cologne-lta", 1)]
    assert report["missing"] == [] and report["unrepaired"] == []
    assert os.listdir(archive) == []
    # following the release advice must not adopt the empty mount point: the database records
    # copies there, so `init` refuses and writes nothing (it says how to replace lost storage)
    init = p.cli("init")
    assert init.returncode == 2 and "--replace cologne-lta" in init.stderr and "empty" in init.stderr, init.stderr
    assert os.listdir(archive) == [], "init marked an empty mount point holding none of the recorded copies"

    # "mounted" again: everything is archived, the old objects untouched
    archive.rmdir()
    os.rename(tmp_path / "disk", archive)
    p.run(expect=0)
    assert_archived_everywhere(p, source_files(p.source))
    after = p.snapshot("cologne-lta")
    assert {k: v for k, v in after.items() if k in before} == before

    # a deployment from before markers: a root with data and no marker waits for `packhorse init`
    os.chmod(archive / "_packhorse", 0o755)
    os.unlink(archive / MARKER_KEY)
    _source(p, groups=1, start=2)
    r = p.run(expect=4)
    assert "packhorse init" in r.stderr and "no identity marker" in r.stderr, r.stderr[-3000:]
    init = p.cli("init")
    assert init.returncode == 0 and "location cologne-lta: adopted" in init.stdout, (init.stdout, init.stderr)
    assert json.loads((archive / MARKER_KEY).read_text())["location"] == "cologne-lta"
    p.run(expect=0)
    assert_archived_everywhere(p, source_files(p.source))
    assert p.status()["blocked"] == []


def test_init_never_creates_a_missing_root_that_holds_recorded_copies(pipeline, tmp_path: Path) -> None:
    # an archive disk mounted at /mnt/x with its root /mnt/x/packhorse: unmounted, the root
    # itself is gone. Following `packhorse init` (the upgrade routine) must not create a fresh
    # root there and archive everything again onto the wrong disk
    p = pipeline(bundle_max_wait_seconds=0)
    _source(p, groups=1)
    p.init()
    p.run(expect=0)
    archive = p.location("cologne-lta")
    os.rename(archive, tmp_path / "disk")
    init = p.cli("init")
    assert init.returncode == 2, init.stderr
    assert "cologne-lta" in init.stderr and "is missing" in init.stderr and "--replace cologne-lta" in init.stderr
    assert not archive.exists(), "init created the missing root of a location holding recorded copies"
    p.run(expect=4)
    assert not archive.exists(), "packhorse wrote under the missing root"
    # mounted again: nothing to do but resume
    os.rename(tmp_path / "disk", archive)
    assert p.cli("init").returncode == 0
    p.run(expect=0)
    assert_archived_everywhere(p, source_files(p.source))
    # new storage replacing lost storage, where the root is created afresh: said explicitly
    os.rename(archive, tmp_path / "lost")
    init = p.cli("init", "--replace", "cologne-lta")
    assert init.returncode == 0 and json.loads((archive / MARKER_KEY).read_text())["location"] == "cologne-lta"
    p.run(expect=0)
    assert_archived_everywhere(p, source_files(p.source))


def test_init_replace_marks_new_empty_storage_and_the_lost_copies_are_made_again(pipeline, tmp_path: Path) -> None:
    p = pipeline(bundle_max_wait_seconds=0)
    _source(p, groups=2)
    p.init()
    p.run(expect=0)
    archive = p.location("cologne-lta")
    os.rename(archive, tmp_path / "lost-disk")  # the disk died; a new, empty one is mounted
    archive.mkdir()
    init = p.cli("init", "--replace", "cologne-lta")
    assert init.returncode == 0 and "replacing lost storage" in init.stdout, (init.stdout, init.stderr)
    assert json.loads((archive / MARKER_KEY).read_text())["location"] == "cologne-lta"
    assert p.cli("init", "--replace", "no-such-location").returncode == 2
    p.run(expect=0)
    assert_archived_everywhere(p, source_files(p.source))
    code, report = p.verify()
    assert code == 0 and report["missing"] == [] and report["unrepaired"] == [], report


def test_a_root_marked_as_another_location_is_unavailable_and_never_re_marked(pipeline) -> None:
    p = pipeline()
    _source(p, groups=1)
    p.init()
    cologne, cornell = p.location("cologne-lta"), p.location("cornell-lta")
    # the wrong disk mounted: cornell's marker on cologne's root
    os.chmod(cologne / "_packhorse", 0o755)
    os.unlink(cologne / MARKER_KEY)
    (cologne / MARKER_KEY).write_bytes((cornell / MARKER_KEY).read_bytes())
    p.run(expect=4)
    assert not [k for k in p.objects("cologne-lta")], "packhorse wrote onto another location's storage"
    assert "marked as location 'cornell-lta'" in _blocked(p)["cologne-lta"]["reason"]
    r = p.cli("init")
    assert r.returncode == 2 and "already marked as location 'cornell-lta'" in r.stderr, r.stderr


@pytest.mark.parametrize("impostor", ["00000000-0000-4000-8000-000000000000", None])
def test_a_marker_naming_the_location_with_another_uuid_is_unavailable_until_replaced(
        pipeline, tmp_path: Path, impostor: str | None) -> None:
    # a disk of another installation (or a marker copied onto blank storage, its uuid left out)
    # names the location but is not its storage: nothing is written there, `init` refuses it
    # without --replace
    p = pipeline(bundle_max_wait_seconds=0)
    _source(p, groups=1)
    p.init()
    p.run(expect=0)
    archive = p.location("cologne-lta")
    mine = json.loads((archive / MARKER_KEY).read_text())
    os.rename(archive, tmp_path / "disk")
    (archive / "_packhorse").mkdir(parents=True)
    fake = {k: v for k, v in mine.items() if k != "uuid"}
    if impostor is not None:
        fake["uuid"] = impostor
    (archive / MARKER_KEY).write_text(json.dumps(fake))
    _source(p, groups=1, start=1)
    r = p.run(expect=4)
    assert not [k for k in p.objects("cologne-lta")], "packhorse wrote onto another installation's storage"
    reason = _blocked(p)["cologne-lta"]["reason"]
    assert f"uuid {impostor}" in reason and mine["uuid"] in reason, reason
    assert "blocked: location cologne-lta" in r.stderr
    init = p.cli("init")
    assert init.returncode == 2 and mine["uuid"] in init.stderr and "--replace cologne-lta" in init.stderr, init.stderr
    # the right disk back: resumes by itself
    (archive / MARKER_KEY).unlink()
    (archive / "_packhorse").rmdir()
    archive.rmdir()
    os.rename(tmp_path / "disk", archive)
    p.run(expect=0)
    assert_archived_everywhere(p, source_files(p.source))
    # new storage that really replaces it, carrying a marker of its own: said explicitly
    os.rename(archive, tmp_path / "old")
    (archive / "_packhorse").mkdir(parents=True)
    (archive / MARKER_KEY).write_text(json.dumps({**mine, "uuid": "11111111-1111-4111-8111-111111111111"}))
    assert p.cli("init", "--replace", "cologne-lta").returncode == 0
    p.run(expect=0)
    assert_archived_everywhere(p, source_files(p.source))


def test_copies_recorded_missing_whose_bytes_are_back_are_recognised_not_rewritten(pipeline) -> None:
    p = pipeline(bundle_max_wait_seconds=0)
    _source(p, groups=2)
    p.init()
    p.run(expect=0)
    before = p.snapshot("cologne-lta")
    with _db(p) as db:  # as an older packhorse left them after an audit ran while the disk was away
        ids = [i for (i,) in db.execute(
            "SELECT c.id FROM physical_copies c JOIN data_locations l ON l.id = c.location_id "
            "WHERE l.name = 'cologne-lta' AND c.status = 'present' ORDER BY c.id")]
        assert len(ids) == 2
        db.execute("UPDATE physical_copies SET status = 'missing' WHERE id IN (?, ?)", ids)
    # `verify` reads the first back and recognises it...
    code, report = p.verify()
    assert code == 0, report
    assert len(report["recognised"]) == 2 and {r["location"] for r in report["recognised"]} == {"cologne-lta"}
    with _db(p) as db:
        db.execute("UPDATE physical_copies SET status = 'missing' WHERE id = ?", (ids[1],))
    # ...and the audit of a plain run recognises the other by itself
    p.run(expect=0)
    with _db(p) as db:
        rows = db.execute("SELECT status FROM physical_copies WHERE id IN (?, ?)", ids).fetchall()
        assert [s for (s,) in rows] == ["present", "present"]
        assert db.execute("SELECT count(*) FROM physical_copies c JOIN data_locations l ON l.id = c.location_id "
                          "WHERE l.name = 'cologne-lta'").fetchone()[0] == 2  # no second copy recorded
    assert p.snapshot("cologne-lta") == before  # same inodes, same bytes: nothing rewritten


def test_a_source_root_taken_away_while_a_package_looks_at_its_files_loses_none_of_them(pipeline, tmp_path: Path) -> None:
    # the root goes while the package stage lists its files (after the walk found the root and
    # the folder, before it looked at the files): every file looks gone, but the location is
    # what is missing; the package waits for it, no file is taken out of it
    p = pipeline(bundle_max_wait_seconds=0)
    _source(p, groups=2, size=1000)
    p.init()
    expected = source_files(p.source)
    away, armed, marker = tmp_path / "source-unmounted", tmp_path / "packaging", tmp_path / "renamed"
    faults = [{"point": "raw_data_package.sources", "action": "pause", "seconds": 0, "marker": str(armed)},
              {"point": "storage.walk_folder", "action": "rename", "path": str(p.source), "to": str(away),
               "if_exists": str(armed), "marker": str(marker), "unless_exists": str(marker)}]
    r = p.cli("run", "--until-idle", "--quiet", env={"PACKHORSE_TEST_FAULTS": json.dumps(faults)})
    assert marker.exists() and not p.source.exists()
    assert r.returncode == 4, r.stderr[-4000:]
    status = p.status()
    assert status["skipped"] == [] and status["failed_operations"] == [], status
    assert set(_blocked(p)) == {"fyst-source"}, status["blocked"]
    with _db(p) as db:
        assert db.execute("SELECT count(*) FROM withdrawn_files").fetchone()[0] == 0
        assert db.execute("SELECT count(*) FROM notification_outbox WHERE event = 'source_files_vanished'"
                          ).fetchone()[0] == 0

    os.rename(away, p.source)
    p.run(expect=0)
    assert_archived_everywhere(p, expected)
    status = p.status()
    assert status["skipped"] == [] and status["blocked"] == []
    assert status["packages"]["archived"] == status["packages"]["total"] == 2


def test_a_root_another_installation_marked_is_refused_until_adopted(pipeline, tmp_path: Path) -> None:
    # a second installation (its own ops database) configured onto the first one's archive, or
    # a demo pointed at its source: neither takes over what the other's database owns
    from support import run_packhorse, write_site_config

    p = pipeline(bundle_max_wait_seconds=0)
    _source(p, groups=1, size=1000)
    p.init()
    p.run(expect=0)
    archive = p.location("cologne-lta")
    before = {f.relative_to(archive): f.read_bytes() for f in archive.rglob("*") if f.is_file()}

    other = write_site_config(tmp_path / "other")
    other.write_text(other.read_text(encoding="utf-8").replace('path = "sites/cologne/archive"',
                                                               f'path = "{archive}"'), encoding="utf-8")
    r = run_packhorse("init", "-c", str(other))
    assert r.returncode == 2, r.stderr
    assert "cologne-lta" in r.stderr and "marked by another packhorse installation" in r.stderr, r.stderr
    assert "packhorse init --adopt cologne-lta" in r.stderr, r.stderr
    # onto both archives: one `init` names both refusals (it used to stop at the first, one
    # retry per location), and marks the locations that are its own
    both = write_site_config(tmp_path / "both")
    both.write_text(both.read_text(encoding="utf-8")
                    .replace('path = "sites/cologne/archive"', f'path = "{archive}"')
                    .replace('path = "sites/cornell/archive"', f'path = "{p.location("cornell-lta")}"'),
                    encoding="utf-8")
    r = run_packhorse("init", "-c", str(both))
    assert r.returncode == 2, r.stderr
    assert "2 refusals" in r.stderr and "--adopt cologne-lta" in r.stderr and "--adopt cornell-lta" in r.stderr, r.stderr
    assert (tmp_path / "both" / "sites/cologne/buffer" / MARKER_KEY).is_file()  # its own: marked
    run_packhorse("run", "-c", str(other), "--until-idle", "--quiet")  # whatever it says: it writes nothing there
    demo = run_packhorse("demo", "--source", str(p.source), "--workdir", str(tmp_path / "demo"), "--quiet")
    assert demo.returncode == 2 and "marked by another packhorse installation" in demo.stderr, demo.stderr
    assert {f.relative_to(archive): f.read_bytes() for f in archive.rglob("*") if f.is_file()} == before

    # this database really replaces the other one's: taken over, marked anew; every object kept,
    # the old marker too (in the quarantine)
    old_marker = (archive / MARKER_KEY).read_bytes()
    r = run_packhorse("init", "-c", str(other), "--adopt", "cologne-lta")
    assert r.returncode == 0, r.stderr
    assert "location cologne-lta: taken over from the other installation" in r.stdout, (r.stdout, r.stderr)
    after = {f.relative_to(archive): f.read_bytes() for f in archive.rglob("*") if f.is_file()}
    kept = [v for k, v in after.items() if k.parts[:2] == ("_packhorse", "quarantine")]
    assert kept == [old_marker], kept
    assert {k: v for k, v in after.items() if k.parts[0] != "_packhorse"} == \
        {k: v for k, v in before.items() if k.parts[0] != "_packhorse"}
    assert json.loads((archive / MARKER_KEY).read_text())["installation"] != json.loads(old_marker)["installation"]
    assert run_packhorse("init", "-c", str(other)).returncode == 0  # recorded now: no --adopt needed again
    # the first installation's database, run again (a trial restored a lost database and ran it
    # after the new one adopted its roots: it wrote and deleted beside the new one's copies):
    # the root is no longer its own, and nothing there changes
    r = p.run(expect=4)
    assert "cologne-lta" in _blocked(p), _blocked(p)
    assert {f.relative_to(archive): f.read_bytes() for f in archive.rglob("*") if f.is_file()} == after


SECOND_COLOGNE_ARCHIVE = """
[[locations]]
name = "cologne-lta2"
site = "cologne"
role = "long_term_archive"
path = "sites/cologne/archive2"
"""


def test_a_repair_does_not_wait_for_an_unrelated_archive_and_waits_visibly_when_it_must(pipeline, tmp_path: Path) -> None:
    """A copy lost at one archive is repaired from a good copy at another while a third archive
    (another site's) is unavailable: the repair used to check every other copy first, met the
    unavailable one and waited for it, unseen (status said no operation waited for it) and
    `run --until-idle` never ended (found by a trial). When the only good copy is on the
    unavailable archive, the repair waits for it visibly: the run exits 4, status counts it,
    diagnose names the location, and it runs as soon as the location is back."""
    p = pipeline(bundle_max_wait_seconds=0, extra=SECOND_COLOGNE_ARCHIVE)
    _source(p, groups=1)
    p.init()
    p.run()
    name = "raw/cam/obs0.tar"
    good = (p.location("cologne-lta") / name).read_bytes()
    archive2 = p.root / "sites/cologne/archive2"
    assert (archive2 / name).read_bytes() == good
    cornell, cornell_away = p.location("cornell-lta"), tmp_path / "cornell-unmounted"

    os.chmod(archive2 / name, 0o644)
    (archive2 / name).unlink()  # lost at cologne-lta2
    os.rename(cornell, cornell_away)  # another site's archive away
    assert p.verify()[0] == 1
    r = p.cli("run", "--until-idle", "--quiet")
    assert r.returncode == 4, r.stderr[-3000:]  # repaired; only the unavailable archive is left
    assert (archive2 / name).read_bytes() == good, "not repaired from the good copy at cologne-lta"
    assert set(_blocked(p)) == {"cornell-lta"}, _blocked(p)

    os.chmod(archive2 / name, 0o644)
    (archive2 / name).unlink()
    os.chmod(p.location("cologne-lta") / name, 0o644)
    (p.location("cologne-lta") / name).unlink()  # now the only good copy is at cornell, which is away
    assert p.verify()[0] == 1
    started = time.monotonic()
    r = p.cli("run", "--until-idle", "--quiet")
    assert r.returncode == 4, r.stderr[-3000:]
    assert time.monotonic() - started < 120
    blocked = _blocked(p)["cornell-lta"]
    assert blocked["detail"]["operations_waiting"] >= 1, blocked
    waiting = [row for row in _db(p).execute(
        "SELECT kind, id FROM operations WHERE status = 'PENDING' AND kind = 'fixity_check'")]
    assert waiting, "no fixity check waits for cornell-lta"
    d = p.cli("diagnose", waiting[0][0], str(waiting[0][1]))
    assert "waiting for data location cornell-lta" in d.stdout, d.stdout

    os.rename(cornell_away, cornell)  # back: the repairs run at once (no backoff to wait out)
    p.run()
    for loc in ("cologne-lta", "cornell-lta"):
        assert (p.location(loc) / name).read_bytes() == good, loc
    assert (archive2 / name).read_bytes() == good


def test_the_blocked_line_counts_the_work_a_stopped_run_left_queued_for_an_unavailable_archive(pipeline) -> None:
    """A second ``run --until-idle`` with an archive away left its archive operation SCHEDULED
    (queued when it stopped; the next run queues it again), and ``status`` then said "0
    operation(s) wait for it" although that operation still waits for the archive."""
    p = pipeline(bundle_max_wait_seconds=0)
    _source(p, groups=1, size=5000)
    p.init()
    archive = p.location("cologne-lta")
    away = archive.with_name(archive.name + "-unmounted")
    archive.rename(away)
    counts = []
    for _ in range(2):
        p.run(expect=4)
        counts.append(_blocked(p)["cologne-lta"]["detail"]["operations_waiting"])
        time.sleep(1.1)
    assert counts == [1, 1], counts
    assert "1 operation(s) wait for it" in _blocked(p)["cologne-lta"]["reason"]
    away.rename(archive)
    p.run()
    assert "cologne-lta" not in _blocked(p)
