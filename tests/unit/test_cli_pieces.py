"""Pieces of the everyday command line: scan filters, the byte rate limit, transfer command
placeholders, progress text (never above 100 %), configuration checks of the new keys."""

from __future__ import annotations

import io

import pytest

from packhorse.cli.progress import StageCount, describe, eta_seconds
from packhorse.config import settings_from_dict
from packhorse.errors import ConfigError
from packhorse.ratelimit import RateLimiter, ThrottledReader
from packhorse.scanfilter import PathFilter, check_pattern
from packhorse.stages.transfer import command_args
from support import write_settled


def test_include_exclude_patterns_match_like_rsync_filters():
    f = PathFilter(include=("*.fits", "logs/*.txt"), exclude=("scratch", "inst2/obs0*", "**/tmp_*"))
    assert f.accepts("inst/obs1/a.fits") and f.accepts("top.fits") and f.accepts("logs/run.txt")
    assert not f.accepts("inst/obs1/a.txt")           # not included
    assert not f.accepts("logs/deep/run.txt")         # '*' does not cross folders
    assert not f.accepts("a/scratch/b.fits")          # a name at any depth, folders too
    assert not f.accepts("inst2/obs01/c.fits") and f.accepts("inst2/obs11/c.fits")  # anchored at the root
    assert not f.accepts("x/y/tmp_1.fits")
    assert PathFilter().accepts("anything/at/all") and not PathFilter().active


@pytest.mark.parametrize("bad", ["", "/", "../x", "a//b", "a\\b", "[abc"])
def test_unusable_patterns_are_named(bad):
    assert check_pattern(bad)


def test_rate_limiter_keeps_the_rate_with_an_injected_clock():
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    lim = RateLimiter(1000, burst_seconds=0.5, clock=lambda: now[0], sleep=sleep)
    for _ in range(10):
        lim.take(500)  # 5000 bytes: 500 of burst, then 4500 at 1000 bytes/s
    assert now[0] == pytest.approx(4.5)
    lim.set_rate(250)
    start = now[0]
    for _ in range(20):
        lim.take(250)  # 5000 bytes at the new rate (plus the 500-byte debt): about 20 s
    assert 20.0 <= now[0] - start <= 22.5


def test_a_rate_lowered_during_a_wait_holds_for_the_rest_of_that_wait():
    """A transfer that started alone and learns mid-wait that it has half the route's limit
    keeps to the half from that slice on, not from its next 1 MiB read (the route's limit was
    exceeded by 20 % when two transfers started a moment apart)."""
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    lim = RateLimiter(1000, burst_seconds=0.0, clock=lambda: now[0], sleep=sleep)
    lowered: list[float] = []

    def on_wait() -> None:
        if not lowered:
            lowered.append(now[0])
            lim.set_rate(500)

    lim.take(1000, on_wait)  # one slice (0.1 s, 100 bytes) at 1000/s, then 900 bytes at 500/s
    assert lowered == [pytest.approx(0.1)]
    assert now[0] == pytest.approx(0.1 + 900 / 500)
    now[0] = 0.0
    plain = RateLimiter(1000, burst_seconds=0.0, clock=lambda: now[0], sleep=sleep)
    plain.take(1000)  # without on_wait: one sleep at the rate of the moment
    assert now[0] == pytest.approx(1.0)


def test_throttled_reader_reads_everything_and_accounts_every_byte():
    taken: list[int] = []

    class Counting(RateLimiter):
        def take(self, nbytes: int, on_wait=None) -> None:  # type: ignore[no-untyped-def]
            taken.append(nbytes)

    data = bytes(range(256)) * 100
    r = ThrottledReader(io.BytesIO(data), Counting(1.0))
    buf = bytearray(1000)
    out = b""
    while n := r.readinto(buf):
        out += bytes(buf[:n])
    assert out == data and sum(taken) == len(data)


@pytest.mark.parametrize(("rate", "piece"), [(None, 1 << 20), (1e9, 1 << 20), (300_000, 300_000), (1000, 64 * 1024)])
def test_throttled_reads_come_in_pieces_of_about_a_second_and_whole_blocks_without_a_limit(rate, piece):
    # a rate-limited copy writes what it was let through about every second (at least 64 KiB
    # at a time); an unlimited one keeps its 1 MiB blocks
    data = bytes(3 << 20)
    r = ThrottledReader(io.BytesIO(data), RateLimiter(rate, sleep=lambda s: None))
    buf = bytearray(1 << 20)
    sizes = []
    while n := r.readinto(buf):
        sizes.append(n)
    assert sum(sizes) == len(data) and max(sizes) == piece


def test_command_template_gets_the_bandwidth_limit():
    args = command_args("rsync --bwlimit={bandwidth_limit_kib} {source} {destination}", "/a b", "/c", 2 * 1024**2)
    assert args == ["rsync", "--bwlimit=2048", "/a b", "/c"]
    assert command_args("rclone copyto --bwlimit {bandwidth_limit} {source} {destination}", "s", "d", 5000)[3] == "5000"
    # {partial}: the same partial file, for a command that resumes it
    assert command_args("rsync --partial --append-verify {source} {partial}", "/s", "/d/.b.t2.x.packhorse-partial") == [
        "rsync", "--partial", "--append-verify", "/s", "/d/.b.t2.x.packhorse-partial"]


def _config(**route: object) -> dict[str, object]:
    return {"sites": [{"name": "a"}, {"name": "b"}],
            "locations": [{"name": "a-src", "site": "a", "role": "source", "path": "src", "include": ["*.fits"]},
                          {"name": "a-buf", "site": "a", "role": "buffer", "path": "abuf"},
                          {"name": "b-buf", "site": "b", "role": "buffer", "path": "bbuf"},
                          {"name": "b-lta", "site": "b", "role": "long_term_archive", "path": "blta"}],
            "routes": [{"source_site": "a", "destination_sites": ["b"], **route}]}


def test_a_command_that_ignores_the_bandwidth_limit_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"routes\[0\]: .*bandwidth_limit"):
        settings_from_dict(_config(method="command", command="cp {source} {destination}",
                                   bandwidth_limit_bytes_per_second=10**6), base_dir=tmp_path, environ={})
    s = settings_from_dict(_config(bandwidth_limit_bytes_per_second=10**6), base_dir=tmp_path, environ={})
    assert s.routes[0].bandwidth_limit_bytes_per_second == 10**6


def test_include_on_a_location_that_is_not_a_source_is_refused(tmp_path):
    data = _config()
    data["locations"][1]["exclude"] = ["*.tmp"]  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"locations\[1\]: .*only apply to role 'source'"):
        settings_from_dict(data, base_dir=tmp_path, environ={})


def test_progress_text_never_passes_100_percent_and_gives_an_eta():
    c = StageCount("transfer", done=3, failed=0, total=10, bytes_done=30 * 1024**2, bytes_total=100 * 1024**2)
    text = describe(c, 10.0)
    assert text.startswith("shipped 3/10 bundles 30.0 MiB/100.0 MiB") and "3.0 MiB/s" in text
    assert eta_seconds(c, 10.0) == pytest.approx(70 / 3)  # 70 MiB left at 3 MiB/s
    assert "ETA 0:23" in text
    over = StageCount("long_term_archive", done=12, failed=0, total=12, bytes_done=99, bytes_total=99)
    assert describe(over, 5.0).startswith("archived 12/12") and "ETA" not in describe(over, 5.0)
    # one failed of five: not "5/5" (a trial read "packaged 5/5 packages … 1 FAILED" as complete)
    failed = StageCount("raw_data_package", done=4, failed=1, total=5, bytes_done=4, bytes_total=5)
    text = describe(failed, 5.0)
    assert text.startswith("packaged 4/5 packages") and text.endswith("1 FAILED"), text


def _initialized(tmp_path, **config):  # type: ignore[no-untyped-def]
    """A three-site configuration under ``tmp_path``, its ops database and every location
    marked, as `packhorse init` leaves them: ``(settings, db, ctx)``."""
    from packhorse.config import load_config
    from packhorse.db.session import Database
    from packhorse.rules.availability import mark_locations
    from packhorse.runtime.context import ProcessContext
    from packhorse.runtime.topology import sync_topology
    from support import write_site_config

    settings = load_config(write_site_config(tmp_path / "site", **config))
    db = Database.from_settings(settings)
    db.upgrade()
    ctx = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    mark_locations(ctx)
    return settings, db, ctx


def test_the_plan_decides_modified_registrations_as_the_scan_does(tmp_path):
    # a registration in a package not built yet ("wait") touched: nothing; with new bytes of the
    # same size: registered again into a package of its own; an unpackaged registration
    # modified ("update"): registered again in place and packaged once, not twice
    import os
    import time
    from concurrent.futures import ThreadPoolExecutor

    from packhorse.managers import packages
    from packhorse.managers.scan import scan_all
    from packhorse.status.dry_run import plan_run

    settings, db, ctx = _initialized(tmp_path, settle_seconds=30)
    src = settings.location_path("fyst-source")
    write_settled(src / "inst" / "obs1" / "a.fits", b"a" * 100)
    with ThreadPoolExecutor(2) as pool:
        scan_all(ctx, pool)
    assert packages.manage(ctx, {}) == 1  # inst/obs1: planned, not built
    write_settled(src / "inst" / "obs2" / "b.fits", b"b" * 200)
    with ThreadPoolExecutor(2) as pool:
        scan_all(ctx, pool)  # inst/obs2 registered, not packaged

    later = time.time() - 45  # settled still (settle_seconds = 30), another mtime
    os.utime(src / "inst" / "obs1" / "a.fits", (later, later))  # a touch
    (src / "inst" / "obs2" / "b.fits").write_bytes(b"B" * 200)
    os.utime(src / "inst" / "obs2" / "b.fits", (later, later))
    plan = plan_run(settings, db)
    assert (plan["register"][0]["files"], plan["register"][0]["bytes"]) == (1, 200), plan["register"]
    assert [(x["name"], x["files"], x["bytes"]) for x in plan["package"]] == [("inst/obs2", 1, 200)]

    (src / "inst" / "obs1" / "a.fits").write_bytes(b"A" * 100)  # new bytes, same size and mtime as the touch
    os.utime(src / "inst" / "obs1" / "a.fits", (later, later))
    plan = plan_run(settings, db)
    assert plan["register"][0]["files"] == 2, plan["register"]
    assert [(x["name"], x["files"]) for x in plan["package"]] == [("inst/obs1+2", 1), ("inst/obs2", 1)]


def test_the_plan_skips_a_file_it_cannot_open_as_the_scan_does(tmp_path, monkeypatch):
    # a file without read permission for packhorse (seen as root without CAP_DAC_OVERRIDE): the
    # dry run counted it as to be packaged while the run skipped it; both open it the one way now
    from concurrent.futures import ThreadPoolExecutor

    from packhorse.managers.scan import scan_all
    from packhorse.status.dry_run import plan_run
    from packhorse.storage.disk import DiskBackend

    settings, db, ctx = _initialized(tmp_path)
    src = settings.location_path("fyst-source")
    write_settled(src / "inst" / "obs1" / "a.fits", b"a" * 100)
    write_settled(src / "inst" / "obs1" / "locked.fits", b"b" * 200)
    real_open = DiskBackend.open_read

    def open_read(self, key):  # type: ignore[no-untyped-def]
        if key.endswith("locked.fits"):
            raise PermissionError(13, "Permission denied", key)
        return real_open(self, key)

    monkeypatch.setattr(DiskBackend, "open_read", open_read)
    plan = plan_run(settings, db)
    entry = plan["register"][0]
    assert (entry["files"], entry["bytes"]) == (1, 100), entry
    assert entry["skipped"] == [{"path": "inst/obs1/locked.fits", "reason": "not readable: Permission denied"}]
    assert [(x["name"], x["files"]) for x in plan["package"]] == [("inst/obs1", 1)]
    with ThreadPoolExecutor(2) as pool:
        result = scan_all(ctx, pool)
    assert (result.registered, result.skipped) == (1, [("inst/obs1/locked.fits", "not readable: Permission denied")])


def test_the_plan_of_a_database_with_work_under_way_lists_what_is_left(tmp_path):
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from sqlalchemy import func, select

    from packhorse.db.models import Operation, RawDataFile
    from packhorse.managers import packages
    from packhorse.managers.scan import scan_all
    from packhorse.status.dry_run import plan_run

    settings, db, ctx = _initialized(tmp_path, settle_seconds=30)
    src = settings.location_path("fyst-source")
    write_settled(src / "inst" / "obs1" / "a.fits", b"a" * 100)
    with ThreadPoolExecutor(2) as pool:
        scan_all(ctx, pool)
    assert packages.manage(ctx, {}) == 1  # inst/obs1: packaged, not archived
    write_settled(src / "inst" / "obs1" / "b.fits", b"b" * 200)  # new in the same group
    write_settled(src / "inst" / "obs2" / "c.fits", b"c" * 300)
    Path(src / "inst" / "obs3").mkdir()
    (src / "inst" / "obs3" / "fresh.fits").write_bytes(b"f")  # still settling
    rows = db.read(lambda s: (s.scalar(select(func.count()).select_from(RawDataFile)),
                              s.scalar(select(func.count()).select_from(Operation))))

    plan = plan_run(settings, db)
    assert plan["register"][0]["files"] == 2 and plan["register"][0]["settling"] == 1
    assert [(p["name"], p["files"], p["bytes"]) for p in plan["package"]] == [("inst/obs1+2", 1, 200),
                                                                            ("inst/obs2", 1, 300)]
    assert plan["continue"] == [{"name": "inst/obs1", "archive_at": ["cologne-lta", "cornell-lta"],
                                 "missing_at": ["cologne-lta", "cornell-lta"]}]
    assert plan["totals"]["archive_copies"] == 2 * 2 + 2
    assert db.read(lambda s: (s.scalar(select(func.count()).select_from(RawDataFile)),
                              s.scalar(select(func.count()).select_from(Operation)))) == rows  # nothing written


def test_a_name_with_a_newline_or_markup_is_one_row_of_the_locate_table(capsys) -> None:
    from packhorse.cli.app import shown
    from packhorse.cli.operator import _print_located

    assert shown("obs1/new\nline.txt") == "obs1/new\\nline.txt"
    assert shown("ünï cödé.fits") == "ünï cödé.fits"  # printable names as they are
    found = {"matched": True, "query": "new", "truncated": False, "packages": [],
             "versions": [{"location": "fyst-source", "path": "inst/obs1/new\nline[bold].txt", "version": 1,
                           "size": 3, "sha256": "ab" * 32, "registered_at": "2026-12-03T12:00:00",
                           "package": "inst/obs1"}]}
    _print_located(found)
    out = capsys.readouterr().out
    [row] = [line for line in out.splitlines() if "fyst-source" in line]
    assert "inst/obs1/new\\nline[bold].txt" in row  # one row, the newline shown, the brackets kept


def test_the_plan_names_a_source_location_that_is_not_there(tmp_path):
    # found by a trial: with the source folder moved away (or an empty folder in its place) the
    # dry run said "would register 0 file(s)" while the real run waits for it and exits 4
    from packhorse.status.dry_run import plan_run

    settings, db, _ctx = _initialized(tmp_path, settle_seconds=0)
    src = settings.location_path("fyst-source")
    write_settled(src / "inst" / "obs1" / "a.fits", b"a" * 100)
    assert plan_run(settings, db)["register"][0]["files"] == 1

    src.rename(src.with_name("moved-away"))
    entry = plan_run(settings, db)["register"][0]
    assert entry["files"] == 0 and "fyst-source" in entry["unavailable"]
    src.mkdir()  # an empty folder where the marked root was
    entry = plan_run(settings, db)["register"][0]
    assert "identity marker" in entry["unavailable"]
    db.dispose()


def _live_report(objects: list[dict], *, ok: bool, error: str | None = None) -> dict:
    op = {"kind": "raw_data_package", "id": 7, "status": "COMPLETED", "stalled": False, "attempt": 1,
          "attempt_words": "attempt 1", "retry_count": 0, "max_retries": 3, "stall_count": 0, "raw_data_package": "inst/obs-1",
          "data_transfer_package": None, "source_location": "fyst-source", "destination_location": "fyst-buffer"}
    return {"operation": op, "diagnosis": "completed", "diagnosis_source": "database", "failure_events": [],
            "copies": [], "live_check": {"checked": [{"location": "fyst-source", "storage": "disk", "ok": ok,
                                                      "error": error, "objects": objects}],
                                         "skipped": [], "host": "site-host"}}


def _obj(path: str, size: int | None, expected: int | None, expect: str = "file", note: str | None = None) -> dict:
    exists = size is not None
    ok = expect == "not_required" or (exists and (expected is None or size == expected))
    return {"path": path, "expected_size": expected, "expect": expect, "note": note, "exists": exists,
            "size": size, "ok": ok}


def test_the_live_check_says_what_it_looked_at_for_each_object(capsys):
    """`diagnose --live` in text: each object and what was found (present with its recorded
    size, absent but not required, missing, another size), and that sizes, not bytes, were
    compared (``verify`` compares bytes)."""
    from packhorse.cli.operator import _print_report

    _print_report(_live_report([_obj("a.fits", 10, 10), _obj("b.fits", 7, 9), _obj("c.fits", None, 4),
                                _obj("raw/x.tar", None, 5, "not_required", "removed on purpose")], ok=False))
    out = capsys.readouterr().out
    assert "live fyst-source: PROBLEM" in out
    assert "a.fits: present, 10 bytes as recorded" in out
    assert "b.fits: 7 bytes, recorded 9: DIFFERENT SIZE" in out
    assert "c.fits: MISSING" in out
    assert "raw/x.tar: absent, not required (removed on purpose)" in out
    assert "looked at on site-host: each object's existence and size, not its bytes" in out


def test_a_live_check_of_many_files_prints_those_in_question_and_a_count(capsys):
    from packhorse.cli.operator import LIVE_OBJECTS_SHOWN, _print_report

    many = [_obj(f"f{i:03d}.dat", 1, 1) for i in range(LIVE_OBJECTS_SHOWN + 20)] + [_obj("gone.dat", None, 3)]
    _print_report(_live_report(many, ok=False))
    out = capsys.readouterr().out
    assert "gone.dat: MISSING" in out and "f000.dat" not in out
    assert f"… {LIVE_OBJECTS_SHOWN + 20} more object(s): {LIVE_OBJECTS_SHOWN + 20} as required" in out
    # more in question than are shown: counted, not hidden (a trial had to work out 137 - 87)
    lost = [_obj(f"g{i:03d}.dat", None, 2) for i in range(LIVE_OBJECTS_SHOWN + 5)] + [_obj("h.dat", 2, 2)] * 20
    _print_report(_live_report(lost, ok=False))
    out = capsys.readouterr().out
    assert out.count(": MISSING") == LIVE_OBJECTS_SHOWN
    assert "… 25 more object(s): 5 more in question, 20 as required (--json lists each)" in out
    # nothing in question among many: a count alone
    _print_report(_live_report([_obj(f"k{i}", 1, 1) for i in range(LIVE_OBJECTS_SHOWN + 6)], ok=True))
    out = capsys.readouterr().out
    assert f"    {LIVE_OBJECTS_SHOWN + 6} object(s): {LIVE_OBJECTS_SHOWN + 6} as required" in out and "… " not in out


def test_a_packages_diagnosis_lists_each_operation_once_and_details_only_the_unfinished(capsys):
    """``diagnose --package``: one line per operation, each artifact's copies once (not once per
    operation: a package of 14 operations printed 169 lines), and the full report (failure
    events, the diagnosis) of the operations that are not completed."""
    from packhorse.cli.operator import _print_package

    copies = [{"artifact": "raw_data_package", "name": "inst/obs-1", "location": loc, "role": "buffer",
               "status": "deleted", "path": "raw/inst/obs-1.tar", "verified_at": "2026-12-04T09:00:00+00:00",
               "deleted_at": "2026-12-04T11:00:00+00:00"}
              for loc in ("fyst-buffer", "cologne-buffer")]

    def report(op_id: int, kind: str, status: str, diagnosis: str, events: list[dict]) -> dict:
        r = _live_report([], ok=True)
        r["operation"].update(id=op_id, kind=kind, status=status)
        return {**r, "diagnosis": diagnosis, "failure_events": events, "copies": copies, "live_check": None}

    event = {"created_at": "2026-12-04T10:00:00+00:00", "attempt": 2, "failure": "failure 2", "error_type": "VerificationError",
             "message": "read back other bytes", "will_retry": False}
    _print_package("inst/obs-1", [report(1, "raw_data_package", "COMPLETED", "completed; nothing to do", []),
                                  report(4, "transfer", "COMPLETED", "completed after 2 attempt(s)", [dict(event)]),
                                  report(9, "long_term_archive", "FAILED", "the bytes read back differ", [event])])
    out = capsys.readouterr().out
    assert "operations of inst/obs-1" in out
    assert out.count("raw/inst/obs-1.tar") == 2  # the copies once: two locations, not two per operation
    assert "1 failure event(s): packhorse diagnose transfer 4" in out  # history of a finished one: a pointer
    assert "long_term_archive 9: FAILED" in out and "failure 2: VerificationError: read back other bytes" in out
    assert "transfer 4: COMPLETED" not in out and "raw_data_package 1: COMPLETED" not in out
    # a deleted copy shows when it was deleted, not a verification of bytes no longer there
    assert out.count("deleted 2026-12-04T11:00:00+00:00") == 2 and "2026-12-04T09:00" not in out


def test_locate_text_says_when_a_package_name_is_also_a_folder(capsys):
    from packhorse.cli.operator import _print_located

    _print_located({"query": "chai", "matched": "package", "versions": [], "packages": [], "truncated": False,
                    "also_folder": True})
    out = capsys.readouterr().out
    assert "chai is also a source folder holding other packages' files: packhorse locate chai/ lists them" in out
