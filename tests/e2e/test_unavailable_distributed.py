"""Storage that is absent is not empty, in distributed mode (PostgreSQL, a Celery worker per
site, a manager, Redis): an archive root that is away when the cluster runs is not re-created
or written into; its archive operations wait (deferred, none FAILED) while the other archive is
filled, ``status`` lists it as blocked, and once it is back the cluster finishes by itself."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from e2e_helpers import Pipeline, assert_archived_everywhere, assert_clean_finish, source_files

from distributed_support import Cluster, postgres_database, redis_url, wait_for, write_source

pytestmark = [pytest.mark.slow, pytest.mark.long]


def test_an_archive_root_away_in_distributed_mode_waits_and_resumes(site_config, cli, tmp_path: Path) -> None:
    db_url, drop = postgres_database()
    config = site_config(bundle_max_wait_seconds=1, poll_interval_seconds=0.5)
    write_source(config.parent / "source", groups=3, files_per_group=2, size=128 << 10)
    cluster = Cluster(config, db_url, redis_url())
    p = Pipeline(config, cli, tmp_path / "extracted")
    archive = p.location("cologne-lta")
    away = tmp_path / "cologne-archive-unmounted"
    try:
        cluster.init()
        os.rename(archive, away)  # the cologne archive disk is not mounted when work arrives
        cluster.start_all(monitor=True)  # as deployed: `status` lists a cluster without one (service_missing)

        def waiting() -> dict | None:
            st = cluster.status()
            blocked = {b["detail"]["location"]: b for b in st["blocked"] if b["cause"] == "location_unavailable"}
            b = blocked.get("cologne-lta")
            if b is None or b["detail"]["operations_waiting"] < 1 or st["copies"]["cornell-lta"]["count"] < 3:
                return None
            return st

        st = wait_for(waiting, 240, "cologne's archive operations to wait for its root", interval=1.0)
        assert not archive.exists(), "the archive root was re-created while it was away"
        assert st["failed_operations"] == [] and st["packages"]["archived"] == 0
        assert st["copies"]["cologne-lta"]["count"] == 0
        os.rename(away, archive)  # mounted again: nothing to reset
        st = cluster.wait_finished(240, packages=3)
    finally:
        cluster.stop_all()
    try:
        assert_clean_finish(st)
        assert st["blocked"] == []
        assert_archived_everywhere(p, source_files(config.parent / "source"))
    finally:
        drop()


def test_a_sites_archive_back_ends_its_outage_by_the_sites_own_worker(site_config, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # distributed, the managers run on hosts of their own and judge no site's disk: the site's
    # worker looks at its own site's open outages, with no work waiting and no manager running
    from sqlalchemy import func, select

    from packhorse.config import load_config
    from packhorse.db.models import LocationOutage
    from packhorse.db.session import Database
    from packhorse.rules.availability import probe, record_outage
    from packhorse.runtime.context import ProcessContext
    from packhorse.runtime.topology import load_topology

    db_url, drop = postgres_database()
    config = site_config(poll_interval_seconds=0.5)
    cluster = Cluster(config, db_url, redis_url())
    monkeypatch.setenv("PACKHORSE_DATABASE__URL", db_url)
    settings = load_config(config)
    db = Database(db_url)
    try:
        cluster.init()
        ctx = ProcessContext(settings=settings, db=db, topology=load_topology(db, settings))
        archive = settings.location_path("cologne-lta")
        away = tmp_path / "cologne-archive-unmounted"
        os.rename(archive, away)  # an archive operation at cologne met its disk unmounted
        err = probe(ctx, "cologne-lta")
        assert err is not None
        record_outage(ctx, err)
        os.rename(away, archive)  # mounted again
        cluster.start_worker("cologne")

        def open_outages() -> int:
            return int(db.read(lambda s: s.scalar(select(func.count()).select_from(LocationOutage))))

        wait_for(lambda: open_outages() == 0, 60, "cologne's worker to end its archive's outage", interval=0.5)
        assert "location_available_again" in cluster.log("worker-cologne")
    finally:
        cluster.stop_all()
        db.dispose()
        drop()
