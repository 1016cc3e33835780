"""Staging end to end: ``packhorse stage NAME --to LOCATION`` then ``packhorse run``
extracts archived packages into a processing location, verified against their bag manifests;
from a cold S3 archive the operation waits for the (simulated) restore without failing."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import bagit
from e2e_helpers import Pipeline, source_files
from sqlalchemy import select

from packhorse.db.models import FailureEvent, Operation, PhysicalCopy
from packhorse.domain import CopyStatus, OperationKind, Status
from s3_support import S3Server, bucket_objects, s3_location, s3_site_config
from support import run_packhorse

PROCESSING = ('[[locations]]\nname = "cologne-processing"\nsite = "cologne"\nrole = "processing"\n'
              'path = "sites/cologne/processing"\n')


def _pipeline(tmp_path: Path, server: S3Server, *, cold: bool) -> tuple[Pipeline, str]:
    extra = {"cold": True, "restore_poll_seconds": 0.3} if cold else {}
    cfg, bucket = s3_site_config(tmp_path / "site", server, s3_extra=extra, extra=PROCESSING)
    if cold:  # both archives cold: the staging source must be restored first
        text = cfg.read_text()
        block = ('[[locations]]\nname = "cornell-lta"\nsite = "cornell"\nrole = "long_term_archive"\n'
                 'path = "sites/cornell/archive"\n')
        cfg.write_text(text.replace(block, s3_location("cornell-lta", server, server.new_bucket(), site="cornell",
                                                       **extra)))
    p = Pipeline(cfg, run_packhorse, tmp_path / "x")
    for unit in ("obs01", "obs02"):
        (p.source / "chai" / unit / "sub dir").mkdir(parents=True)
        (p.source / "chai" / unit / "frame ü.fits").write_bytes(os.urandom(200_000))
        (p.source / "chai" / unit / "sub dir" / "log.txt").write_bytes(f"log of {unit}\n".encode())
    p.init()
    p.run()
    assert p.status()["packages"]["archived"] == 2
    return p, bucket


def _ops(p: Pipeline) -> list[Operation]:
    from test_fixity import context

    ctx = context(p.config)
    return ctx.db.read(lambda s: list(s.scalars(select(Operation).where(
        Operation.kind == OperationKind.STAGING.value))))


def test_stage_from_cold_archive_waits_for_the_restore_then_extracts_verified(seaweedfs, tmp_path, monkeypatch):
    # the test-side cold store (tests/fault_hooks.py): a restore takes 2 s in every process
    monkeypatch.setenv("PACKHORSE_TEST_COLD_RESTORE_SECONDS", "2")
    p, bucket = _pipeline(tmp_path, seaweedfs, cold=True)
    expected = {rel: sha for rel, (sha, _m) in source_files(p.source).items() if rel.startswith("chai/obs01/")}

    r = p.cli("stage", "obs01", "--to", "cologne-processing")
    assert r.returncode == 0, r.stderr
    assert "staging operation" in r.stdout and "created" in r.stdout
    t0 = time.monotonic()
    p.run()
    elapsed = time.monotonic() - t0

    staged = p.root / "sites/cologne/processing/chai/obs01"
    bag = bagit.Bag(str(staged))
    bag.validate()  # the reference library agrees
    got = {f.relative_to(staged / "data").as_posix(): hashlib.sha256(f.read_bytes()).hexdigest()
           for f in (staged / "data").rglob("*") if f.is_file()}
    assert got == expected
    assert not (p.root / "sites/cologne/processing/chai/obs02").exists()
    assert not [x for x in (p.root / "sites/cologne/processing").iterdir() if x.name.startswith(".packhorse")]
    # it waited for the restore (2 s), without failing or counting retries
    assert elapsed >= 2.0
    (op,) = _ops(p)
    assert op.status == Status.COMPLETED.value and op.retry_count == 0
    from test_fixity import context

    ctx = context(p.config)
    assert ctx.db.read(lambda s: s.scalars(select(FailureEvent).where(FailureEvent.operation_id == op.id)).all()) == []
    loc_id = ctx.topology.location_ids["cologne-processing"]
    copies = ctx.db.read(lambda s: [(c.path, c.status) for c in s.scalars(
        select(PhysicalCopy).where(PhysicalCopy.location_id == loc_id))])
    assert copies == [("chai/obs01", CopyStatus.PRESENT.value)]
    assert any(k.startswith("lta/_packhorse/restore/") for k in bucket_objects(seaweedfs, bucket))

    # staging twice is a no-op
    before = os.stat(staged / "bag-info.txt")
    r = p.cli("stage", "chai/obs01", "--to", "cologne-processing")
    assert r.returncode == 0 and "already requested" in r.stdout, r.stdout
    p.run()
    assert len(_ops(p)) == 1
    after = os.stat(staged / "bag-info.txt")
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)
    code, report = p.verify()
    assert code == 5, report  # incomplete: copies in cold storage could not be read, never a silent 0
    # only the restored copy could be read now; the others get a restore request
    assert (report["checked"], report["ok"]) == (1, 1)
    assert sorted((a["location"], a["path"]) for a in report["awaiting_restore"]) == [
        ("cologne-lta", "raw/chai/obs02.tar"), ("cornell-lta", "raw/chai/obs01.tar"), ("cornell-lta", "raw/chai/obs02.tar")]


def test_stage_refuses_bad_requests(seaweedfs, tmp_path):
    p, _bucket = _pipeline(tmp_path, seaweedfs, cold=False)
    r = p.cli("stage", "obs99", "--to", "cologne-processing")
    assert r.returncode == 1 and "no raw data package or observation unit called 'obs99'" in r.stderr
    r = p.cli("stage", "obs01", "--to", "cologne-lta")
    assert r.returncode == 2 and "'cologne-lta' has role 'long_term_archive'" in r.stderr
    r = p.cli("stage", "obs01", "--to", "nowhere")
    assert r.returncode == 2 and "unknown data location 'nowhere'" in r.stderr
    # a warm archive: staged at once
    assert p.cli("stage", "obs02", "--to", "cologne-processing").returncode == 0
    p.run()
    bagit.Bag(str(p.root / "sites/cologne/processing/chai/obs02")).validate()


def _staged_tree(folder: Path) -> dict[str, tuple[int, int, str]]:
    """``{path: (inode, mtime_ns, sha256)}`` of every file of a staged folder."""
    return {f.relative_to(folder).as_posix(): (f.stat().st_ino, f.stat().st_mtime_ns,
                                               hashlib.sha256(f.read_bytes()).hexdigest())
            for f in folder.rglob("*") if f.is_file()}


def _staged_pipeline(pipeline, interval: float | None = None) -> Pipeline:  # type: ignore[no-untyped-def]
    """One package archived at cologne-lta and cornell-lta and staged into cologne-processing
    (the same site as cologne-lta); ``interval``: cologne-lta's fixity interval."""
    from support import write_settled

    p = pipeline(bundle_max_wait_seconds=0, extra=PROCESSING)
    if interval is not None:
        text = p.config.read_text()
        p.config.write_text(text.replace('path = "sites/cologne/archive"\n',
                                         f'path = "sites/cologne/archive"\nfixity_interval_seconds = {interval}\n'))
    write_settled(p.source / "inst/obs01/frame.fits", os.urandom(300_000))
    write_settled(p.source / "inst/obs01/meta.txt", b"observation 1\n")
    p.init()
    p.run()
    assert p.cli("stage", "obs01", "--to", "cologne-processing").returncode == 0
    p.run()
    assert (p.root / "sites/cologne/processing/inst/obs01/bag-info.txt").is_file()
    return p


def test_a_staged_folder_is_no_source_of_a_repair_and_never_checked_as_a_package_copy(pipeline):
    # a new-user trial: once a package was staged at the archive's site, the repair of that
    # archive's copy read the staged folder as a package tar ("is not a regular file") and
    # FAILED for good, although another archive held a verified copy; every run exited 3
    p = _staged_pipeline(pipeline, interval=2.0)
    key = "raw/inst/obs01.tar"
    archive = p.location("cologne-lta") / key
    good = archive.read_bytes()
    staged = p.root / "sites/cologne/processing/inst/obs01"
    before = _staged_tree(staged)

    # a copy gone, recorded by `verify`: the repair reads the copies it may be repaired from
    os.chmod(archive, 0o644)
    archive.unlink()
    code, report = p.verify()
    assert code == 1 and [(m["location"], m["path"]) for m in report["missing"]] == [("cologne-lta", key)], report
    p.run()
    assert archive.read_bytes() == good
    st = p.status()
    assert st["failed_operations"] == [] and st["blocked"] == [] and st["packages"]["archived"] == 1, st

    # a copy rotten, found by the audit: its siblings are checked at once, never the staged folder
    time.sleep(2.5)
    os.chmod(archive, 0o644)
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0x01
    archive.write_bytes(bytes(data))
    p.run()
    assert archive.read_bytes() == good
    st = p.status()
    assert st["failed_operations"] == [] and st["blocked"] == [] and st["packages"]["archived"] == 1, st
    code, report = p.verify()
    assert code == 0 and report["unrepaired"] == [], report
    assert [(x["path"], x["status"]) for x in report["staged"]] == [("inst/obs01", "ok")], report
    assert _staged_tree(staged) == before  # the processing team's folder: never touched
    from test_fixity import context

    ctx = context(p.config)
    loc_id = ctx.topology.location_ids["cologne-processing"]
    assert ctx.db.read(lambda s: [c.status for c in s.scalars(select(PhysicalCopy).where(
        PhysicalCopy.location_id == loc_id))]) == [CopyStatus.PRESENT.value]


def test_stage_again_moves_a_damaged_staged_folder_aside_and_stages_a_verified_copy(pipeline):
    # a new-user trial: `stage --again` (as README and `verify` suggest) failed with
    # DestinationConflictError "already exists and does not match the package", exit 3
    p = _staged_pipeline(pipeline)
    processing = p.root / "sites/cologne/processing"
    staged = processing / "inst/obs01"
    payload = staged / "data/inst/obs01/frame.fits"
    good = payload.read_bytes()
    payload.write_bytes(bytes([good[0] ^ 0xFF]) + good[1:])  # damaged by processing (a random first byte may be any)
    (staged / "data/inst/obs01/notes.txt").write_bytes(b"added by hand\n")
    damaged = _staged_tree(staged)

    # without --again nothing touches it: staging twice is a no-op
    plain = p.cli("stage", "obs01", "--to", "cologne-processing")
    assert plain.returncode == 0 and "already requested" in plain.stdout, plain.stdout
    p.run()
    assert _staged_tree(staged) == damaged
    v = p.cli("verify")
    assert v.returncode == 1 and "STAGED CORRUPT cologne-processing:inst/obs01" in v.stdout and "--again" in v.stdout

    again = p.cli("stage", "obs01", "--to", "cologne-processing", "--again")
    assert again.returncode == 0 and "created" in again.stdout, again.stdout + again.stderr
    p.run()  # exit 0

    assert payload.read_bytes() == good and not (staged / "data/inst/obs01/notes.txt").exists()
    bagit.Bag(str(staged)).validate()
    # the damaged folder moved aside whole into the location's quarantine, not changed
    (aside,) = [f for f in (processing / "_packhorse/quarantine/inst").iterdir()]
    assert aside.name.startswith("obs01.")
    assert _staged_tree(aside) == damaged  # same inodes, times and bytes: renamed, not copied
    code, report = p.verify()
    assert code == 0 and [(x["path"], x["status"]) for x in report["staged"]] == [("inst/obs01", "ok")], report
    st = p.status()
    assert st["failed_operations"] == [] and st["blocked"] == [], st
    from test_fixity import context

    ctx = context(p.config)
    loc_id = ctx.topology.location_ids["cologne-processing"]
    assert ctx.db.read(lambda s: [c.status for c in s.scalars(select(PhysicalCopy).where(
        PhysicalCopy.location_id == loc_id).order_by(PhysicalCopy.id))]) == [CopyStatus.CORRUPT.value,
                                                                              CopyStatus.PRESENT.value]
    assert not [x for x in processing.iterdir() if x.name.startswith(".packhorse") or x.name.endswith("partial")]
