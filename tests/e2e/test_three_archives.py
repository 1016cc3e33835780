"""Three long-term archives of three kinds at once, end to end: ``cologne-lta`` in a bucket on
SeaweedFS (a real S3), ``cornell-lta`` a folder, and ``cornell-az`` a container on Azurite
whose blobs go to the Archive tier (cold storage). A byte flipped in each copy behind
packhorse's back is found by the fixity audit (the archived blob after a rehydration) and
every copy is repaired; judged by the bytes in the three stores, the copy rows and
``packhorse verify``."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from e2e_helpers import Pipeline
from sqlalchemy import select

from azurite_support import azure_location, flip_first_byte, read_blob
from packhorse.config import load_config
from packhorse.db.models import PhysicalCopy, RawDataPackage
from packhorse.db.session import Database
from packhorse.domain import CopyStatus
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from s3_support import bucket_objects, s3_site_config
from support import run_packhorse

INTERVAL = 2.0


def _copies(ctx: ProcessContext, loc: str) -> list[str]:
    loc_id = ctx.topology.location_ids[loc]
    return ctx.db.read(lambda s: [c.status for c in s.scalars(
        select(PhysicalCopy).where(PhysicalCopy.location_id == loc_id).order_by(PhysicalCopy.id))])


def _flip_s3(server, bucket: str, key: str) -> None:  # type: ignore[no-untyped-def]
    c = server.client()
    obj = c.get_object(Bucket=bucket, Key=key)
    data = bytearray(obj["Body"].read())
    data[len(data) // 2] ^= 0x01
    c.put_object(Bucket=bucket, Key=key, Body=bytes(data), Metadata=obj["Metadata"])


def _flip_disk(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))


def test_a_flipped_byte_in_a_disk_an_s3_and_an_archived_azure_copy_is_repaired_in_all_three(seaweedfs, azurite,
                                                                                           tmp_path):
    container = azurite.new_container()
    azure = azure_location("cornell-az", azurite, container, site="cornell", prefix="lta", cold=True,
                           restore_poll_seconds=0.3, fixity_interval_seconds=INTERVAL,
                           connection_string=azurite.connection_string)
    cfg, bucket = s3_site_config(tmp_path / "site", seaweedfs, s3_extra={"fixity_interval_seconds": INTERVAL},
                                 extra=azure)
    cfg.write_text(cfg.read_text().replace('path = "sites/cornell/archive"\n',
                                           f'path = "sites/cornell/archive"\nfixity_interval_seconds = {INTERVAL}\n'))
    p = Pipeline(cfg, run_packhorse, tmp_path / "x")
    (p.source / "inst/obs01").mkdir(parents=True)
    (p.source / "inst/obs01/frame.fits").write_bytes(os.urandom(300_000))
    p.init()
    p.run()
    st = p.status()
    assert st["packages"]["archived"] == st["packages"]["total"] == 1 and not st["failed_operations"], st
    settings = load_config(cfg)
    ctx = ProcessContext(settings=settings, db=Database(settings.database_url), topology=sync_topology(
        Database(settings.database_url), settings))
    pkg = ctx.db.read(lambda s: s.scalars(select(RawDataPackage)).one())
    key = f"raw/{pkg.name}.tar"
    disk_copy = p.root / "sites/cornell/archive" / key
    good = disk_copy.read_bytes()
    assert hashlib.sha256(good).hexdigest() == pkg.sha256
    raw = azurite.container(container)
    # three copies of the same bytes; the Azure one in the Archive tier
    assert bucket_objects(seaweedfs, bucket)[f"lta/{key}"] == good
    assert str(raw.get_blob_client(f"lta/{key}").get_blob_properties().blob_tier) == "Archive"
    assert read_blob(raw, f"lta/{key}") == good

    time.sleep(INTERVAL + 0.5)  # every copy is due for its next check
    _flip_s3(seaweedfs, bucket, f"lta/{key}")
    _flip_disk(disk_copy)
    flip_first_byte(raw, f"lta/{key}")
    assert read_blob(raw, f"lta/{key}") != good

    p.run()

    for loc in ("cologne-lta", "cornell-lta", "cornell-az"):
        statuses = _copies(ctx, loc)
        assert CopyStatus.CORRUPT.value in statuses and statuses[-1] == CopyStatus.PRESENT.value, (loc, statuses)
    assert bucket_objects(seaweedfs, bucket)[f"lta/{key}"] == good
    assert disk_copy.read_bytes() == good
    assert read_blob(raw, f"lta/{key}") == good
    assert str(raw.get_blob_client(f"lta/{key}").get_blob_properties().blob_tier) == "Archive"  # archived again
    assert any(b.name.startswith(f"lta/_packhorse/quarantine/{key}.") for b in raw.list_blobs())  # kept aside
    # verify: the archived blob is not readable, so its rehydration is asked for and it is listed
    # as awaiting it; Azurite rehydrates at once, so the next verify reads all three
    code, report = p.verify()
    assert code == 5 and report["checked"] == report["ok"] == 2, report  # incomplete, not a silent success
    assert report["awaiting_restore"] == [{"location": "cornell-az", "path": key}], report
    code, report = p.verify()
    assert code == 0 and report["checked"] == report["ok"] == 3 and not report["awaiting_restore"], report
