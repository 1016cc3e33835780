"""Desired state, converged (DESIGN.md "Converging, not only advancing"), end to end: real
``packhorse`` processes after a fault, judged from outside — the bytes in every archive (GNU
tar, ``bagit``, sha256 against the source files), the quarantined bad objects, the copy rows,
the notification outbox and exit codes. No ``reset``, no SQL, no configuration change between
the fault and the plain ``packhorse run --until-idle`` that must converge.

The faults: every archive copy of a package corrupt (source files still there); a bundle
deleted from the source buffer before its transfer; a bundle or a package whose bytes rot in a
buffer before the operation that reads it (transfer, unpack, archive); and the one dead end — every copy bad and
the source files gone — which must be loud (exit 3, ``blocked``, CRITICAL notification).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import LTAS, QUARANTINE_PREFIX, Pipeline, assert_archived_everywhere, sha256_file, source_files
from sqlalchemy import create_engine, select, text
from sqlalchemy.orm import Session

from packhorse.db.models import Notification, RawDataPackage
from support import SRC, write_settled

# two observation units: two packages, one bundle (a repair of one ships it in a bundle of its own)
GROUPS = ("inst/obs01", "inst/obs02")


def write_source(p: Pipeline) -> None:
    for i, g in enumerate(GROUPS):
        write_settled(p.source / g / "frame.fits", os.urandom(200_000 + i))
        write_settled(p.source / g / "meta.txt", f"observation {g}\n".encode())


def db_url(p: Pipeline) -> str:
    return os.environ.get("PACKHORSE_DATABASE__URL") or f"sqlite:///{p.root / 'packhorse.db'}"


def query(p: Pipeline, fn: Any) -> Any:
    """Plain reads of the ops database, from outside packhorse's own code paths."""
    engine = create_engine(db_url(p))
    try:
        with Session(engine) as s:
            return fn(s)
    finally:
        engine.dispose()


def package_names(p: Pipeline) -> list[str]:
    return query(p, lambda s: sorted(s.scalars(select(RawDataPackage.name))))


def corrupt_archive_copies(p: Pipeline, name: str) -> dict[str, bytes]:
    """Flip one byte of the package's tar in every archive; returns the bad bytes per archive."""
    out = {}
    for lta in LTAS:
        path = p.location(lta) / f"raw/{name}.tar"
        os.chmod(path, 0o644)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
        os.chmod(path, 0o444)
        out[lta] = bytes(data)
    return out


def quarantined(p: Pipeline, lta: str, name: str) -> list[bytes]:
    return [path.read_bytes() for key, path in sorted(p.objects(lta).items())
            if key.startswith(f"{QUARANTINE_PREFIX}raw/{name}.tar.")]


def copy_statuses(p: Pipeline, name: str) -> dict[str, list[str]]:
    def q(s: Session) -> dict[str, list[str]]:
        rows = s.execute(text(
            "SELECT l.name, c.status FROM physical_copies c JOIN data_locations l ON l.id = c.location_id "
            "JOIN raw_data_packages r ON r.id = c.raw_data_package_id WHERE r.name = :n ORDER BY c.id"), {"n": name})
        out: dict[str, list[str]] = {}
        for loc, st in rows:
            out.setdefault(loc, []).append(st)
        return out

    return query(p, q)


def notifications(p: Pipeline) -> list[tuple[str, str, str, str]]:
    return query(p, lambda s: [(n.level, n.event, n.subject, n.body) for n in
                               s.scalars(select(Notification).order_by(Notification.id))])


def assert_converged(p: Pipeline) -> None:
    """Every source file archived and verified in every archive, nothing left in the buffers,
    nothing waiting on a human."""
    assert_archived_everywhere(p, source_files(p.source))
    st = p.status()
    pk = st["packages"]
    assert pk["total"] == len(GROUPS) and pk["archived"] == pk["total"] and pk["failed"] == 0, pk
    assert st["failed_operations"] == [] and st["blocked"] == [], (st["failed_operations"], st["blocked"])
    for lta in LTAS:
        assert st["copies"][lta]["count"] == len(GROUPS), st["copies"]
    code, report = p.verify()
    assert code == 0 and report["ok"] == report["checked"] == 2 * len(GROUPS), report
    assert report["unrepaired"] == [], report


def archived_once(pipeline: Any, **config: Any) -> Pipeline:
    p = pipeline(**config)
    write_source(p)
    p.init()
    p.run()
    st = p.status()
    assert st["packages"]["archived"] == st["packages"]["total"] == len(GROUPS), st["packages"]
    return p


def test_every_archive_copy_corrupt_is_re_archived_from_the_source_files(pipeline) -> None:
    p = archived_once(pipeline, bundle_max_wait_seconds=0.5)
    name = package_names(p)[0]
    good = {lta: sha256_file(p.location(lta) / f"raw/{name}.tar") for lta in LTAS}
    bad = corrupt_archive_copies(p, name)
    code, report = p.verify()
    assert code == 1 and sorted(c["location"] for c in report["corrupt"]) == list(LTAS), report
    st = p.status()
    assert st["packages"]["archived"] == len(GROUPS) - 1, st["packages"]  # derived from the copies, at once

    p.run()  # a plain run: no reset, no SQL, no configuration change

    assert_converged(p)
    for lta in LTAS:
        assert sha256_file(p.location(lta) / f"raw/{name}.tar") == good[lta]
        assert quarantined(p, lta, name) == [bad[lta]], f"{lta}: the bad object must be moved aside, unchanged"
        assert copy_statuses(p, name)[lta] == ["corrupt", "present"]
    events = [(lvl, ev) for lvl, ev, _, _ in notifications(p)]
    assert ("CRITICAL", "no_good_source") not in events
    assert events.count(("INFO", "fixity_repaired")) == len(LTAS), events
    # it travelled in a bundle of its own: its sibling, archived at both sites, was neither
    # rebuilt nor shipped again (one copy of it ever at each buffer)
    bundles = query(p, lambda s: s.execute(text(
        "SELECT COUNT(DISTINCT data_transfer_package_id) FROM raw_data_packages")).scalar())
    assert bundles == 2, "the repaired package was to travel alone"
    statuses = copy_statuses(p, package_names(p)[1])
    assert statuses["fyst-buffer"] == statuses["cologne-buffer"] == statuses["cornell-buffer"] == ["deleted"], statuses


def test_a_package_whose_siblings_sources_are_gone_is_repaired_from_its_own_source_files(pipeline) -> None:
    """Every archive copy of a package bad, its own source files intact, its bundle's sibling
    removed from the source by hand (routine once archived): the repair used to need the whole
    bundle rebuilt, tried to rebuild the sibling, failed, and declared the package a dead end
    (found by a trial). It is rebuilt alone and shipped in a bundle of its own; nothing FAILS."""
    p = archived_once(pipeline, bundle_max_wait_seconds=0.5)
    name, sibling = package_names(p)
    good = {lta: sha256_file(p.location(lta) / f"raw/{name}.tar") for lta in LTAS}
    corrupt_archive_copies(p, name)
    for path in (p.source / sibling).iterdir():
        path.unlink()
    assert p.verify()[0] == 1  # the bad copies are recorded

    p.run()  # exit 0: nothing FAILED, nothing blocked

    st = p.status()
    assert st["packages"] == {"total": 2, "archived": 2, "failed": 0}, st["packages"]
    assert st["failed_operations"] == [] and st["blocked"] == [], (st["failed_operations"], st["blocked"])
    code, report = p.verify()
    assert code == 0 and report["ok"] == report["checked"] == 2 * len(GROUPS), report
    for lta in LTAS:
        assert sha256_file(p.location(lta) / f"raw/{name}.tar") == good[lta]
        assert copy_statuses(p, name)[lta] == ["corrupt", "present"]
    ops = query(p, lambda s: s.execute(text(
        "SELECT o.kind FROM operations o JOIN raw_data_packages r ON o.raw_data_package_id = r.id "
        f"WHERE r.name = '{sibling}' AND o.kind = 'raw_data_package'")).all())
    assert len(ops) == 1, "the sibling was rebuilt again"


def test_a_folder_standing_at_an_archive_key_is_moved_aside_and_the_copy_made_again(pipeline) -> None:
    # someone replaced an archive copy by a folder of the same name: the copy counts as
    # missing; the repair moves the folder aside whole (unread, nothing lost) and writes the copy
    p = archived_once(pipeline, bundle_max_wait_seconds=0.5)
    name = package_names(p)[0]
    archive = p.location("cologne-lta")
    key = archive / f"raw/{name}.tar"
    good = sha256_file(key)
    key.unlink()
    key.mkdir()
    (key / "notes.txt").write_text("not a package copy", encoding="utf-8")
    code, report = p.verify()
    assert code == 1 and [(m["location"], m["path"]) for m in report["missing"]] == [
        ("cologne-lta", f"raw/{name}.tar")], report

    p.run()  # a plain run: no reset, no SQL, no configuration change

    assert_converged(p)
    assert key.is_file() and sha256_file(key) == good
    [moved] = [f for f in (archive / QUARANTINE_PREFIX).rglob("notes.txt")]
    assert moved.read_text(encoding="utf-8") == "not a package copy" and moved.parent.name.startswith(
        f"{name.rpartition('/')[2]}.tar.")
    code, report = p.verify()
    assert code == 0, report


def damage_when_paused(p: Pipeline, tmp_path: Path, start: Any, stop: Any, *, point: str = "transfer.start",
                       locations: tuple[str, ...] = ("fyst-buffer",), prefix: str = "bundles/",
                       corrupt: bool = False, replace_with: Path | None = None) -> list[Path]:
    """Run until an operation has been claimed and is held at hook ``point`` (nothing read
    yet; every operation that reaches it waits there until the damage is done), then delete
    every object under ``prefix`` in ``locations`` (``corrupt``: overwrite four bytes in the
    middle of each in place instead; ``replace_with``: copy that file's bytes over each). ``start(env)`` starts packhorse with the hook, ``stop()`` is called once
    the objects are damaged (``None``: keep running). Returns the damaged files."""
    marker = tmp_path / "paused"
    damaged = tmp_path / "damaged"
    # the operation waits until the damage is done (not a fixed pause: on a loaded machine a
    # pause could end before the damage, and the operation would finish on intact bytes)
    env = {"PACKHORSE_TEST_FAULTS": json.dumps([{"point": point, "action": "wait_for", "path": str(damaged),
                                                 "seconds": 120, "marker": str(marker),
                                                 "unless_exists": str(damaged)}])}
    start(env)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert time.monotonic() < deadline, f"no operation reached {point}"
        time.sleep(0.1)
    files = [path for loc in locations for key, path in p.objects(loc).items() if key.startswith(prefix)]
    assert files, (locations, prefix)
    for f in files:
        os.chmod(f, 0o644)
        if replace_with is not None:
            f.write_bytes(replace_with.read_bytes())
        elif corrupt:
            with open(f, "r+b") as fh:
                fh.seek(f.stat().st_size // 2)
                fh.write(b"\xde\xad\xbe\xef")
        else:
            f.unlink()
    damaged.write_text("")
    if stop is not None:
        stop()
    return files


def killable_run(p: Pipeline) -> tuple[Any, Any]:
    """``(start, stop)`` for :func:`damage_when_paused`: ``packhorse run --until-idle`` in a
    process group of its own, and its SIGKILL."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(env: dict[str, str]) -> None:
        procs.append(subprocess.Popen([sys.executable, "-m", "packhorse", "run", "--until-idle", "--quiet", "-c",
                                       str(p.config)], cwd=p.root, env={**os.environ, "PYTHONPATH": str(SRC), **env},
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))

    def stop() -> None:
        os.killpg(procs[0].pid, signal.SIGKILL)
        procs[0].wait(30)

    return start, stop


def background_run(p: Pipeline) -> tuple[Any, Any]:
    """``(start, wait)`` for :func:`damage_when_paused`: ``packhorse run --until-idle`` left to
    go on after the fault, and ``wait()`` for its exit code."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(env: dict[str, str]) -> None:
        procs.append(subprocess.Popen([sys.executable, "-m", "packhorse", "run", "--until-idle", "--quiet", "-c",
                                       str(p.config)], cwd=p.root, env={**os.environ, "PYTHONPATH": str(SRC), **env},
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))

    def wait() -> int:
        try:
            return procs[0].wait(240)
        except subprocess.TimeoutExpired:
            os.killpg(procs[0].pid, signal.SIGKILL)
            procs[0].wait(30)
            raise

    return start, wait


def quarantined_files(p: Pipeline, location: str) -> list[Path]:
    """The files moved into ``location``'s quarantine."""
    return [f for f in (p.location(location) / "_packhorse" / "quarantine").rglob("*") if f.is_file()]


def test_bundle_deleted_before_its_transfer_is_rebuilt_and_shipped(pipeline, tmp_path: Path) -> None:
    p = pipeline(bundle_max_wait_seconds=0.5)
    write_source(p)
    p.init()
    start, stop = killable_run(p)  # the run dies with the transfers in flight (a crash, a reboot)
    damage_when_paused(p, tmp_path, start, stop)

    p.run()  # a plain run: no reset, no SQL, no configuration change

    assert_converged(p)
    assert p.objects("fyst-buffer") == {}, "the rebuilt bundle and packages are freed once archived"
    # the transfers that met the missing bundle failed (history), the rebuilt one shipped it
    ops = query(p, lambda s: s.execute(text(
        "SELECT kind, dedup_key, status FROM operations WHERE kind IN ('data_transfer_package', 'transfer') "
        "ORDER BY id")).all())
    # the first build and its rebuild (all completed); a transfer that met the missing bundle
    # failed, and each destination got it from a completed one. Which transfers met it depends
    # on the timing: one held until after the rebuild finds the bundle back and completes (seen
    # in CI under load), which is as good
    shown = "\n".join(map(str, ops))
    builds = [o.status for o in ops if o.kind == "data_transfer_package"]
    assert len(builds) >= 2 and set(builds) == {"COMPLETED"}, shown
    assert any(o.kind == "transfer" and o.status == "FAILED" for o in ops), shown
    for dest in ("cologne-buffer", "cornell-buffer"):
        assert any(o.kind == "transfer" and f"->{dest}" in o.dedup_key and o.status == "COMPLETED" for o in ops), shown


def test_bundle_corrupt_in_the_source_buffer_is_quarantined_rebuilt_and_shipped(pipeline, tmp_path: Path) -> None:
    # a bundle whose bytes rotted in the buffer used to fail every transfer, and the rebuild then
    # met different bytes under its name (DestinationConflictError): a dead end
    p = pipeline(bundle_max_wait_seconds=0.5)
    write_source(p)
    p.init()
    start, stop = killable_run(p)
    damage_when_paused(p, tmp_path, start, stop, corrupt=True)

    p.run()  # a plain run: no reset, no SQL, no configuration change

    assert_converged(p)
    bad = quarantined_files(p, "fyst-buffer")
    # the transfers to both destinations may meet the bad bytes at once: each moves them aside
    # (no-replace hard links of the one bad file; nothing is overwritten or lost)
    assert 1 <= len(bad) <= 2 and all(b"\xde\xad\xbe\xef" in f.read_bytes() for f in bad), bad
    # `locate` says where the rotten bundle went: its copy's row records the quarantine key
    root = p.location("fyst-buffer")
    keys = {str(f.relative_to(root)) for f in bad}
    bundle = bad[0].name.split(".tar.")[0]
    where = json.loads(p.cli("locate", bundle, "--json").stdout)["packages"][0]
    moved = [c for c in where["copies"] if c["location"] == "fyst-buffer" and c["quarantined_as"]]
    assert len(moved) == 1 and moved[0]["quarantined_as"] in keys and moved[0]["status"] == "missing", where["copies"]
    assert [e["location"] for e in where["timeline"] if e["event"] == "quarantined"] == ["fyst-buffer"], where


@pytest.mark.parametrize("damage", ["deleted", "replaced"])
def test_a_package_lost_or_damaged_in_the_source_buffer_before_bundling_is_rebuilt_and_bundled(
        pipeline, tmp_path: Path, damage: str) -> None:
    # the bundle build met a raw package tar gone (SourceMissingError) or holding another
    # package's bytes (SourceChangedError) and FAILED for good: the package was rebuilt (or not
    # even that), the bundle never built again, every run exited 3 until a `reset`
    p = pipeline(bundle_max_wait_seconds=0.5)
    write_source(p)
    p.init()
    start, wait = background_run(p)
    # "replaced": another valid package tar (its sibling in the bundle) copied over it
    sibling = p.location("fyst-buffer") / f"raw/{GROUPS[0]}.tar" if damage == "replaced" else None
    damaged = damage_when_paused(p, tmp_path, start, None, point="data_transfer_package.start",
                                 prefix=f"raw/{GROUPS[1]}.tar", replace_with=sibling)
    bad_bytes = damaged[0].read_bytes() if damage == "replaced" else None
    assert [f.name for f in damaged] == ["obs02.tar"], damaged
    first = wait()  # the run that met the fault goes on by itself

    p.run()  # and a plain run after it: no reset, no SQL, no configuration change

    assert first == 0, "the run that met the fault heals it itself"
    assert_converged(p)
    assert [k for k in p.objects("fyst-buffer") if not k.startswith(QUARANTINE_PREFIX)] == [], \
        "the rebuilt bundle and packages are freed once archived"
    ops = query(p, lambda s: s.execute(text(
        "SELECT kind, status, error_context FROM operations WHERE kind IN ('data_transfer_package', 'raw_data_package') "
        "ORDER BY id")).all())
    bundles = [(o.status, _json(o.error_context).get("error_type")) for o in ops if o.kind == "data_transfer_package"]
    # the build that met the bad package failed (history now), the rebuilt bundle completed
    expected_error = "SourceMissingError" if damage == "deleted" else "SourceChangedError"
    assert bundles == [("FAILED", expected_error), ("COMPLETED", None)], bundles
    assert [o.status for o in ops if o.kind == "raw_data_package"] == ["COMPLETED"] * 3, ops
    bad = quarantined_files(p, "fyst-buffer")
    if damage == "replaced":  # moved aside as it was, never overwritten
        assert [f.read_bytes() for f in bad] == [bad_bytes], bad
    else:
        assert bad == []


def test_a_package_damaged_in_the_source_buffer_and_recorded_corrupt_by_verify_is_rebuilt(
        pipeline, tmp_path: Path) -> None:
    # packages at rest in the source buffer, not bundled yet; one damaged and found by `verify`
    # before any bundle build met it: the rebuild of the package met the bad bytes under its key
    # (DestinationConflictError), FAILED for good, and status called the package "no good
    # source" although its source files were intact
    p = pipeline(bundle_max_wait_seconds=3600)
    write_source(p)
    p.init()
    run = subprocess.Popen([sys.executable, "-m", "packhorse", "run", "--quiet", "-c", str(p.config)], cwd=p.root,
                           env={**os.environ, "PYTHONPATH": str(SRC)}, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len([k for k in p.objects("fyst-buffer") if k.startswith("raw/")]) < len(GROUPS) \
                or copy_statuses(p, GROUPS[1]).get("fyst-buffer") != ["present"]:
            assert time.monotonic() < deadline, "the packages were not built"
            time.sleep(0.1)
    finally:
        os.killpg(run.pid, signal.SIGTERM)
        run.wait(60)
    assert query(p, lambda s: s.scalar(text(
        "SELECT count(*) FROM operations WHERE kind = 'data_transfer_package'"))) == 0, "bundled too early"
    tar = p.location("fyst-buffer") / f"raw/{GROUPS[1]}.tar"
    os.chmod(tar, 0o644)
    with open(tar, "r+b") as fh:
        fh.seek(tar.stat().st_size // 2)
        fh.write(b"\xde\xad\xbe\xef")
    bad_bytes = tar.read_bytes()
    code, report = p.verify()
    assert code == 1 and [c["location"] for c in report["corrupt"]] == ["fyst-buffer"], report

    p.run()  # a plain run: no reset, no SQL, no configuration change

    assert_converged(p)
    assert [f.read_bytes() for f in quarantined_files(p, "fyst-buffer")] == [bad_bytes], \
        "the damaged package tar is moved aside as it was, never overwritten"
    assert p.status()["blocked"] == []
    # `locate` shows it: found corrupt (by verify), then moved aside (where), then written again
    [moved] = quarantined_files(p, "fyst-buffer")
    where = json.loads(p.cli("locate", GROUPS[1], "--json").stdout)["packages"][0]
    [row] = [c for c in where["copies"] if c["location"] == "fyst-buffer" and c["quarantined_as"]]
    assert row["quarantined_as"] == str(moved.relative_to(p.location("fyst-buffer"))), row
    events = [(e["event"], e["location"]) for e in where["timeline"]]
    assert events.index(("found corrupt", "fyst-buffer")) < events.index(("quarantined", "fyst-buffer")), events
    moved_by = where["timeline"][events.index(("quarantined", "fyst-buffer"))]
    assert moved_by["kind"] == "raw_data_package" and moved_by["operation_id"], moved_by  # the rebuild moved it


def _json(value: Any) -> dict[str, Any]:
    """A JSON column read with plain SQL: text on SQLite, already decoded on PostgreSQL."""
    return (json.loads(value) if isinstance(value, str) else value) or {}


@pytest.mark.parametrize("point, prefix", [("unpack.start", "bundles/"), ("long_term_archive.start", "raw/")],
                         ids=["bundle-before-unpack", "package-before-archive"])
def test_a_copy_rotten_in_a_destination_buffer_is_quarantined_and_shipped_again(
        pipeline, tmp_path: Path, point: str, prefix: str) -> None:
    # the unpack of a bundle, or the archive of a package, whose bytes rotted in the destination
    # buffer failed on every retry, and nothing shipped it again: no archive copy, ever
    p = pipeline(bundle_max_wait_seconds=0.5)
    write_source(p)
    p.init()
    start, stop = killable_run(p)
    damaged = damage_when_paused(p, tmp_path, start, stop, point=point, locations=("cologne-buffer", "cornell-buffer"),
                                 prefix=prefix, corrupt=True)

    p.run()  # a plain run: no reset, no SQL, no configuration change

    assert_converged(p)
    bad = quarantined_files(p, "cologne-buffer") + quarantined_files(p, "cornell-buffer")
    # every damaged bundle is read by its unpack; a damaged package may have been archived
    # before the damage (its buffer copy is then freed, not read): the others are quarantined
    assert bad and all(b"\xde\xad\xbe\xef" in f.read_bytes() for f in bad), (bad, damaged)
    if prefix == "bundles/":
        assert len(bad) == len(damaged), (bad, damaged)


SOURCE_DELETION = "[deletion]\ndelete_source_files = true\nsource_retention_seconds = 0\n"


def test_every_copy_bad_and_the_source_gone_is_the_one_loud_dead_end(pipeline) -> None:
    p = archived_once(pipeline, bundle_max_wait_seconds=0.5, extra=SOURCE_DELETION)
    assert source_files(p.source) == {}, "the source files were deleted once archived"
    name, sibling = package_names(p)
    # one copy goes bad first and is repaired from the other: its place then has two records
    path = p.location(LTAS[0]) / f"raw/{name}.tar"
    os.chmod(path, 0o644)
    path.write_bytes(path.read_bytes()[:-1])
    assert p.verify()[0] == 1
    p.run()
    assert p.verify()[0] == 0 and copy_statuses(p, name)[LTAS[0]] == ["corrupt", "present"]
    time.sleep(1.1)  # the copies were written over a second before they are found bad
    found_bad = dt.datetime.now(dt.UTC).replace(microsecond=0)
    bad = corrupt_archive_copies(p, name)
    code, _ = p.verify()
    assert code == 1

    r = p.run(expect=3)

    assert f"blocked: package {name}:" in r.stderr, r.stderr[-3000:]
    st = p.status()
    items = [b for b in st["blocked"] if b["cause"] == "no_good_source"]
    assert [b["subject"] for b in items] == [f"package {name}"], st["blocked"]
    item = items[0]
    assert item["exit_code"] == 3 and item["since"], item
    # since the copies were found bad, not since they were written
    assert dt.datetime.fromisoformat(item["since"]) >= found_bad, (item["since"], found_bad)
    assert "no good copy" in item["reason"] and "deleted" in item["reason"], item
    # what works: a good copy put back at an archive key; the deleted source files are not read again
    assert all(f"{lta}:raw/{name}.tar" in item["release"] for lta in LTAS) and "`packhorse run`" in item["release"], item
    assert "restoring its source files does not help" in item["release"], item
    assert sorted(c["location"] for c in item["detail"]["bad_copies"]) == list(LTAS), item  # each place once
    assert st["packages"]["archived"] == 1, st["packages"]  # the sibling only
    # loud: one CRITICAL notification naming the package and every copy that failed
    critical = [(subj, body) for lvl, ev, subj, body in notifications(p) if lvl == "CRITICAL" and ev == "no_good_source"]
    assert critical, notifications(p)
    subj, body = critical[0]
    assert name in subj and all(f"{lta}:raw/{name}.tar" in body for lta in LTAS), body
    # nothing was overwritten, nothing rebuilt: the bad bytes are where they were
    for lta in LTAS:
        assert (p.location(lta) / f"raw/{name}.tar").read_bytes() == bad[lta]
    assert p.objects("fyst-buffer") == {}
    # the diagnostic report says what was tried
    d = p.cli("diagnose", "--package", name)
    assert d.returncode == 1, d.stderr
    assert "no good source left" in d.stdout and "tried:" in d.stdout and "deleted" in d.stdout, d.stdout
    p.run(expect=3)  # still a dead end, still loud, still nothing touched
    for lta in LTAS:
        assert (p.location(lta) / f"raw/{name}.tar").read_bytes() == bad[lta]


def test_every_copy_bad_and_the_source_files_removed_by_hand_fails_the_rebuild_loudly(pipeline) -> None:
    p = archived_once(pipeline, bundle_max_wait_seconds=0.5)
    name = package_names(p)[0]
    bad = corrupt_archive_copies(p, name)
    for path in (p.source / name).iterdir():  # gone behind packhorse's back
        path.unlink()
    assert p.verify()[0] == 1

    r = p.run(expect=3)

    # the rebuild was tried, from the registered files, and failed naming the file; the
    # package keeps its name and recorded bytes (never rebuilt from fewer files)
    assert "raw_data_package" in r.stderr and "SourceMissingError" in r.stderr, r.stderr[-3000:]
    assert package_names(p) == sorted(f"inst/{g.split('/')[1]}" for g in GROUPS)
    st = p.status()
    item = next(b for b in st["blocked"] if b["cause"] == "no_good_source")
    assert item["subject"] == f"package {name}" and "FAILED" in item["reason"], item
    failed = item["detail"]["failed_operation"]
    assert failed[0] == "raw_data_package" and f"packhorse reset raw_data_package {failed[1]}" in item["release"]
    assert any(lvl == "CRITICAL" and ev == "no_good_source" and name in subj for lvl, ev, subj, _ in notifications(p))
    for lta in LTAS:
        assert (p.location(lta) / f"raw/{name}.tar").read_bytes() == bad[lta]


def wait_until(what: str, check: Any, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_deletion_not_safe_yet_waits_and_frees_the_buffers_once_the_lost_copy_is_made_again(
        pipeline, tmp_path: Path) -> None:
    # a package deleted from a destination buffer between its unpack and its archive: the bundle
    # deletions planned while every destination held every package then met their rule broken
    # and FAILED for good (DeletionNotSafeError); every run exited 3, the bundle stayed in all
    # buffers until `reset deletion --all-failed`
    p = pipeline(bundle_max_wait_seconds=0.5, workers=6)
    write_source(p)
    p.init()
    go, released, repair = tmp_path / "go", tmp_path / "released", tmp_path / "repair"
    archiving, deleting = tmp_path / "archiving", tmp_path / "deleting"
    start, wait = background_run(p)
    # every archive waits (claimed, nothing read) until `go`; every deletion (claimed, its rule
    # not checked yet) until `released`; after the fault, the unpack that makes the lost copy
    # again until `repair`: the test orders plan, fault, deletion and repair exactly
    start({"PACKHORSE_TEST_FAULTS": json.dumps([
        {"point": "long_term_archive.start", "action": "wait_for", "path": str(go), "marker": str(archiving)},
        {"point": "deletion.start", "action": "wait_for", "path": str(released), "marker": str(deleting)},
        {"point": "unpack.start", "action": "wait_for", "path": str(repair), "if_exists": str(go)}])})
    wait_until("the bundle deletions planned while every destination holds every package", lambda: query(
        p, lambda s: s.scalar(text("SELECT count(*) FROM operations WHERE kind = 'deletion' "
                                   "AND data_transfer_package_id IS NOT NULL"))) >= 1 and archiving.exists())
    lost = p.location("cologne-buffer") / f"raw/{GROUPS[0]}.tar"
    os.chmod(lost, 0o644)
    lost.unlink()  # by hand, behind packhorse's back
    go.write_text("")
    wait_until("the lost copy recorded missing", lambda: copy_statuses(p, GROUPS[0]).get("cologne-buffer", [])[:1]
               == ["missing"])
    released.write_text("")
    # the deletions check their rule while the lost copy is still missing
    wait_until("the deletions decided", lambda: query(p, lambda s: s.scalar(text(
        "SELECT count(*) FROM operations WHERE kind = 'deletion' AND status IN ('SCHEDULED', 'IN_PROGRESS')"))) == 0)
    repair.write_text("")
    first = wait()

    p.run()  # a plain run: no reset, no SQL, no configuration change

    assert first == 0, "the run that met the fault heals it itself"
    assert_converged(p)
    for buf in ("fyst-buffer", "cologne-buffer", "cornell-buffer"):
        assert p.objects(buf) == {}, f"{buf}: every copy is freed once it is safe"
    deletions = query(p, lambda s: s.execute(text(
        "SELECT status, count(*) FROM operations WHERE kind = 'deletion' GROUP BY status")).all())
    assert dict(deletions).keys() == {"COMPLETED"}, deletions
    events = query(p, lambda s: s.scalar(text(
        "SELECT count(*) FROM failure_events f JOIN operations o ON o.id = f.operation_id WHERE o.kind = 'deletion'")))
    assert events == 0, "waiting for the rule is not a failure"


def _put_back(p: Pipeline, lta: str, name: str, data: bytes) -> Path:
    """Write ``data`` over the package's (bad) object in ``lta``, by hand, as an operator would."""
    path = p.location(lta) / f"raw/{name}.tar"
    os.chmod(path, 0o644)
    path.write_bytes(data)
    return path


def test_no_good_source_released_by_a_good_copy_put_back_converges_on_a_plain_run(pipeline) -> None:
    # a new-user trial: every archive copy rotten and a source file changed (the rebuild fails
    # with SourceChangedError): blocked, as documented; the good bytes written back as the
    # release text said stayed recorded corrupt, were never read again, and every run exited 3
    p = archived_once(pipeline, bundle_max_wait_seconds=0.5)
    name = package_names(p)[0]
    good = (p.location(LTAS[0]) / f"raw/{name}.tar").read_bytes()
    bad = corrupt_archive_copies(p, name)
    meta = p.source / name / "meta.txt"
    write_settled(meta, meta.read_bytes() + b"appended later\n")
    assert p.verify()[0] == 1

    r = p.run(expect=3)

    assert "SourceChangedError" in r.stderr, r.stderr[-3000:]
    item = next(b for b in p.status()["blocked"] if b["cause"] == "no_good_source")
    assert item["subject"] == f"package {name}", item
    sha = hashlib.sha256(good).hexdigest()
    release = item["release"]
    assert sha in release and f"{LTAS[0]}:raw/{name}.tar" in release and "`packhorse run`" in release, release
    p.run(expect=3)  # looked at again: still bad, still blocked, nothing touched
    for lta in LTAS:
        assert (p.location(lta) / f"raw/{name}.tar").read_bytes() == bad[lta]

    put = _put_back(p, LTAS[0], name, good)  # what the release text says
    inode = os.stat(put).st_ino

    p.run()  # a plain run: no reset, no SQL, exit 0

    assert os.stat(put).st_ino == inode and put.read_bytes() == good  # recognised, not rewritten
    assert (p.location(LTAS[1]) / f"raw/{name}.tar").read_bytes() == good  # repaired from it
    assert quarantined(p, LTAS[1], name) == [bad[LTAS[1]]] and quarantined(p, LTAS[0], name) == []
    statuses = copy_statuses(p, name)
    assert statuses[LTAS[0]] == ["present"] and statuses[LTAS[1]] == ["corrupt", "present"], statuses
    st = p.status()
    assert st["blocked"] == [] and st["failed_operations"] == [], (st["blocked"], st["failed_operations"])
    assert st["packages"]["archived"] == st["packages"]["total"] == len(GROUPS) + 1, st["packages"]  # + the new version
    assert ("INFO", "fixity_copy_back") in [(lvl, ev) for lvl, ev, _, _ in notifications(p)]
    code, report = p.verify()
    assert code == 0 and report["unrepaired"] == [], report


def test_no_good_source_released_by_a_good_copy_put_back_is_recognised_by_verify(pipeline) -> None:
    p = archived_once(pipeline, bundle_max_wait_seconds=0.5, extra=SOURCE_DELETION)
    name = package_names(p)[0]
    good = (p.location(LTAS[1]) / f"raw/{name}.tar").read_bytes()
    bad = corrupt_archive_copies(p, name)
    assert p.verify()[0] == 1
    p.run(expect=3)
    item = next(b for b in p.status()["blocked"] if b["cause"] == "no_good_source")
    # the source files were deleted by packhorse: restoring them is no way out, and not offered
    assert "reset" not in item["release"] and "does not help" in item["release"], item["release"]

    _put_back(p, LTAS[1], name, good)
    code, report = p.verify()
    assert code == 1 and report["recognised"] == [
        {"location": LTAS[1], "path": f"raw/{name}.tar", "recorded": "corrupt"}], report
    assert [(u["location"], u["status"]) for u in report["unrepaired"]] == [(LTAS[0], "corrupt")], report
    assert p.status()["packages"]["archived"] == 1  # not yet: one archive copy is still bad

    p.run()

    assert (p.location(LTAS[0]) / f"raw/{name}.tar").read_bytes() == good
    assert quarantined(p, LTAS[0], name) == [bad[LTAS[0]]]
    st = p.status()
    assert st["blocked"] == [] and st["failed_operations"] == [] and st["packages"]["archived"] == len(GROUPS), st
    assert p.verify()[0] == 0


def test_a_transfer_failed_on_its_deleted_bundle_and_repaired_pages_nobody(pipeline, tmp_path: Path) -> None:
    """The bundle is deleted under its transfer, which fails permanently; the bundle is rebuilt
    and shipped in the same run. The digest of that failure goes out (at the run's end, the
    gather window still open) after the repair: INFO "Repaired without you" to the everyday
    list, nothing to the on-call address that only ERROR reaches."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
    from smtp_server import SmtpServer, smtp_settings, toml_table  # the real SMTP server of the integration suite

    server = SmtpServer().start()
    try:
        notify_cfg = smtp_settings(server.port, digest_gather_seconds=120,
                                      smtp={"recipients_by_level": {"ERROR": ["oncall@example.org"],
                                                                    "CRITICAL": ["oncall@example.org"]}})
        p = pipeline(bundle_max_wait_seconds=0.5, extra=toml_table("notifications", notify_cfg))
        write_source(p)
        p.init()
        start, stop = killable_run(p)
        damage_when_paused(p, tmp_path, start, stop)
        p.run()
        assert_converged(p)
        failed = query(p, lambda s: s.execute(text(
            "SELECT id FROM operations WHERE kind = 'transfer' AND status = 'FAILED'")).all())
        mails = [(rcpts, m["Subject"]) for rcpts, m in server.inbox.messages]
    finally:
        server.stop()
    assert failed, "no transfer met the deleted bundle"
    assert [s for r, s in mails if "oncall@example.org" in r] == [], mails  # nobody paged
    assert any("Repaired without you" in s and r == ["ops@example.org"] for r, s in mails), mails
    assert not any("Permanent failure" in s for _, s in mails), mails
    levels = {(lvl, ev) for lvl, ev, *_ in notifications(p) if ev in ("permanent_failure", "failure_repaired")}
    assert levels == {("INFO", "failure_repaired")}, levels
