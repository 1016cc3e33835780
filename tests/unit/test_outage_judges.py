"""Who may end a site's disk outage: only a process of that site (its workers), never the
distributed managers, which run on hosts of their own where the site's folder is absent or is
another folder of the same path. The embedded runner, which sees every site's storage, judges
every location as before."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from packhorse.config import load_config
from packhorse.db.models import LocationOutage
from packhorse.db.session import Database
from packhorse.rules.availability import check_outages, mark_locations, probe, record_outage
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from support import write_site_config


def make_ctx(folder: Path) -> ProcessContext:
    settings = load_config(write_site_config(folder))
    db = Database(settings.database_url)
    db.upgrade()
    c = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    mark_locations(c)  # as `packhorse init` does
    return c


def outages(ctx: ProcessContext) -> dict[str, str]:
    """Open outages: ``{location: reason}``."""
    rows = ctx.db.read(lambda s: list(s.scalars(select(LocationOutage))))
    return {ctx.topology.location_names[r.location_id]: r.reason for r in rows}


def test_a_managers_host_with_a_folder_at_a_sites_path_does_not_end_that_sites_outage(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path / "site")
    try:
        archive = ctx.settings.location_path("cologne-lta")
        away = tmp_path / "unmounted"
        archive.rename(away)  # cologne's archive disk is unmounted: its worker records the outage
        err = probe(ctx, "cologne-lta")
        assert err is not None
        record_outage(ctx, err)
        archive_reason = outages(ctx)["cologne-lta"]
        # the managers' host has a folder, with the marker, at that path (another disk, an old
        # copy): the managers' cycle must not take it for cologne's archive
        away.rename(archive)
        assert check_outages(ctx) == []
        assert outages(ctx) == {"cologne-lta": archive_reason}
        # another site's worker does not judge cologne's disk either
        assert check_outages(ctx, sites={"cornell"}) == []
        assert "cologne-lta" in outages(ctx)
        # cologne's own worker sees its archive back: the outage ends
        assert check_outages(ctx, sites={"cologne"}) == ["cologne-lta"]
        assert outages(ctx) == {}
    finally:
        ctx.db.dispose()


def test_a_site_worker_sees_its_disk_still_away_and_the_embedded_runner_judges_every_site(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path / "site")
    try:
        archive = ctx.settings.location_path("cornell-lta")
        archive.rename(tmp_path / "unmounted")
        # the site's worker looks: still away, the outage stays (it is recorded by an operation
        # meeting it, or here by the embedded runner's look at every location)
        assert check_outages(ctx, sites={"cornell"}) == []
        assert outages(ctx) == {}
        assert check_outages(ctx, every_location=True) == []
        assert "cornell-lta" in outages(ctx)
        assert check_outages(ctx, sites={"cornell"}) == []
        assert "cornell-lta" in outages(ctx)
        (tmp_path / "unmounted").rename(archive)
        assert check_outages(ctx, every_location=True) == ["cornell-lta"]
        assert outages(ctx) == {}
    finally:
        ctx.db.dispose()
