"""The pipeline's partial-file sweep reaches object storage in distributed mode too: a site's
worker, when it starts, aborts the incomplete S3 multipart uploads a crashed publisher left
at that site's archive (the embedded runner always did; the distributed workers swept disk
only). Against moto's S3 server on loopback."""

from __future__ import annotations

from pathlib import Path

from packhorse.config import load_config
from packhorse.db.session import Database
from packhorse.executors.celery_app import cleanup_site_partials
from packhorse.runtime.topology import sync_topology
from s3_support import s3_site_config


def _uploads(server, bucket: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [u["Key"] for u in server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


def test_a_sites_worker_start_aborts_abandoned_multipart_uploads_of_its_archive(moto_s3, tmp_path: Path) -> None:
    # moto only: the sweep waits a day, and only moto dates an upload in the past (SeaweedFS
    # dates it now, as AWS does)
    s3_server = moto_s3
    cfg, bucket = s3_site_config(tmp_path / "site", s3_server)
    settings = load_config(cfg)
    db = Database(settings.database_url)
    db.upgrade()
    sync_topology(db, settings)  # what `packhorse init` does
    db.dispose()
    # a publisher killed in the middle of a multipart upload (moto dates every upload 2010:
    # older than the day the sweep waits for)
    s3_server.client().create_multipart_upload(Bucket=bucket, Key="lta/raw/inst/obs01.tar")
    assert _uploads(s3_server, bucket) == ["lta/raw/inst/obs01.tar"]

    assert cleanup_site_partials(settings, "cornell") == 0  # another site's worker leaves it
    assert _uploads(s3_server, bucket) == ["lta/raw/inst/obs01.tar"]
    assert cleanup_site_partials(settings, "cologne") == 1
    assert _uploads(s3_server, bucket) == []
