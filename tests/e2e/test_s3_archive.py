"""End-to-end with an S3 long-term archive: ``cologne-lta`` is a bucket on SeaweedFS (a
real S3 server; a store ignoring ``If-None-Match`` is moto's, patched), ``cornell-lta`` a folder. The rest of the pipeline runs unchanged through
``storage/registry.py``; judged by the objects in the bucket (bags validated with ``bagit``
after download), ``status`` and ``verify``."""

from __future__ import annotations

import hashlib
import subprocess
import tarfile

import bagit
from e2e_helpers import Pipeline, source_files

from packhorse.storage.s3 import MIN_PART_BYTES
from s3_support import bucket_objects, s3_site_config
from support import run_packhorse


def test_pipeline_archives_into_s3_and_disk(seaweedfs, tmp_path):
    cfg, bucket = s3_site_config(tmp_path / "site", seaweedfs, workers=2,
                                 s3_extra={"multipart_threshold_bytes": MIN_PART_BYTES,
                                           "multipart_part_bytes": MIN_PART_BYTES})
    p = Pipeline(cfg, run_packhorse, tmp_path / "x")
    src = p.source
    (src / "inst/obs01").mkdir(parents=True)
    (src / "inst/obs01/big frame.fits").write_bytes(b"\x01" * (MIN_PART_BYTES + 4321))  # multipart
    (src / "inst/obs02 ü").mkdir(parents=True)
    (src / "inst/obs02 ü/small.fits").write_bytes(b"small\n")
    expected = source_files(src)
    p.init()
    p.run()
    status = p.status()
    assert status["packages"]["archived"] == status["packages"]["total"] == 2, status["packages"]
    assert status["failed_operations"] == []
    assert status["copies"]["cologne-lta"]["count"] == 2 and status["copies"]["cornell-lta"]["count"] == 2
    code, report = p.verify()
    assert code == 0 and report["checked"] == report["ok"] and not report["corrupt"] and not report["missing"]

    objects = bucket_objects(seaweedfs, bucket)
    assert sorted(objects) == sorted(f"lta/raw/{b.info['External-Identifier']}.tar" for b in p.bags("cornell-lta"))
    payload = {}
    for i, (key, data) in enumerate(sorted(objects.items())):
        tar_path = tmp_path / f"{i}.tar"
        tar_path.write_bytes(data)
        out = tmp_path / f"s3x{i}"
        out.mkdir()
        assert subprocess.run(["tar", "xf", str(tar_path), "-C", str(out)]).returncode == 0
        (bag_dir,) = list(out.iterdir())
        bag = bagit.Bag(str(bag_dir))
        bag.validate()
        assert key == f"lta/raw/{bag.info['External-Identifier']}.tar"
        for f in (bag_dir / "data").rglob("*"):
            if f.is_file():
                payload[f.relative_to(bag_dir / "data").as_posix()] = hashlib.sha256(f.read_bytes()).hexdigest()
        with tarfile.open(tar_path):
            pass
    assert payload == {rel: sha for rel, (sha, _mtime) in expected.items()}
    # the archive copies are byte-identical across the disk and the S3 archive
    for key, data in objects.items():
        disk = (p.location("cornell-lta") / key.removeprefix("lta/")).read_bytes()
        assert data == disk
    # running again archives nothing twice
    p.run()
    assert sorted(bucket_objects(seaweedfs, bucket)) == sorted(objects)


def test_run_refuses_a_store_ignoring_if_none_match(tmp_path):
    from s3_support import start_or_skip

    server = start_or_skip(ignore_if_none_match=True)
    try:
        cfg, bucket = s3_site_config(tmp_path / "site", server)
        (cfg.parent / "source" / "inst" / "obs").mkdir(parents=True)
        (cfg.parent / "source" / "inst" / "obs" / "f").write_bytes(b"x")
        p = Pipeline(cfg, run_packhorse, tmp_path / "x")
        # refused by `packhorse init` (it checks every location before it writes anything), naming
        # the location and the header, credentials never printed
        r = p.cli("init")
        assert r.returncode == 2 and "'cologne-lta'" in r.stderr and "If-None-Match" in r.stderr, r.stderr
        assert "packhorse-test-secret" not in r.stderr
        # the refused init created nothing, so `run` has nothing to run and says what to do
        assert not (cfg.parent / "packhorse.db").exists()
        r = p.cli("run", "--until-idle", "--quiet")
        assert r.returncode == 2 and "run `packhorse init`" in r.stderr, r.stderr
        assert "packhorse-test-secret" not in r.stderr
        assert bucket_objects(server, bucket) == {}
    finally:
        server.stop()
