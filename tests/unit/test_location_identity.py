"""The identity marker of a data location (``packhorse.storage.identity``): a location is
available only when its root carries a marker naming it — also on cold storage, where the
marker itself may have moved to the archive tier and cannot be read without a restore."""

from __future__ import annotations

import pytest

from memory_backend import ColdLayer, MemoryBackend
from packhorse.errors import ConfigError, LocationUnavailableError
from packhorse.storage.identity import MARKER_KEY, check_identity, mark_location, read_marker


def _mark(backend, location: str = "cologne-lta"):
    return mark_location(backend, location=location, site="cologne", role="long_term_archive",
                         storage="s3", version="test")


def test_a_marked_root_is_available_and_an_unmarked_one_is_not():
    store = MemoryBackend("cologne-lta")
    with pytest.raises(LocationUnavailableError) as e:
        check_identity(store, "cologne-lta")
    assert e.value.marker_only and MARKER_KEY in str(e.value)
    assert _mark(store).action in ("created", "marked")
    check_identity(store, "cologne-lta")
    assert read_marker(store)["location"] == "cologne-lta"


def test_a_marker_naming_another_location_makes_it_unavailable_and_init_refuses_it():
    store = MemoryBackend("cologne-lta")
    _mark(store, "cornell-lta")
    with pytest.raises(LocationUnavailableError, match="marked as location 'cornell-lta'"):
        check_identity(store, "cologne-lta")
    with pytest.raises(ConfigError, match="already marked as location 'cornell-lta'"):
        _mark(store)


def test_a_cold_location_whose_marker_needs_a_restore_is_still_available():
    # `packhorse init` wrote the marker; in every later process the store's archive tier holds it
    # (tape, Glacier): reading it would need a restore, yet the location is there and marked
    store = MemoryBackend("cologne-lta")
    _mark(ColdLayer(store, restore_seconds=3600, clock=lambda: 0.0))
    later = ColdLayer(store, restore_seconds=3600, clock=lambda: 0.0)
    check_identity(later, "cologne-lta")  # raised RestoreRequiredError before: every cycle failed
    assert read_marker(later) == {"format": "packhorse-location-identity/1", "location": None,
                                  "in_cold_storage": True}
    assert _mark(later).action == "already marked"  # init again: nothing rewritten


def test_an_empty_cold_location_is_still_unavailable():
    with pytest.raises(LocationUnavailableError) as e:
        check_identity(ColdLayer(MemoryBackend("cologne-lta"), restore_seconds=1, clock=lambda: 0.0), "cologne-lta")
    assert e.value.marker_only


def _site(tmp_path):
    from packhorse.config import load_config
    from packhorse.db.session import Database
    from packhorse.rules.availability import mark_locations
    from packhorse.runtime.context import ProcessContext
    from packhorse.runtime.topology import sync_topology
    from support import write_site_config

    settings = load_config(write_site_config(tmp_path / "site"))
    (settings.location_path("fyst-source")).mkdir(parents=True, exist_ok=True)
    db = Database(settings.database_url)
    db.upgrade()
    ctx = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    mark_locations(ctx)
    return ctx


def test_init_counts_only_copies_whose_bytes_should_be_there(tmp_path):
    """A copy recorded missing and since made again at its location (or, at a buffer, whose
    package is archived) is history: it does not make an empty, unmarked root look like an
    unmounted disk. A missing copy still owed there does; so does a live one."""
    import shutil

    from packhorse.db.models import PhysicalCopy, RawDataPackage, utcnow
    from packhorse.rules.availability import _recorded_copies, mark_locations

    ctx = _site(tmp_path)
    ids = ctx.topology.location_ids

    def add(s, pkg, loc, status):
        s.add(PhysicalCopy(raw_data_package_id=pkg, location_id=ids[loc], path="raw/x.tar", size=1,
                           sha256="a" * 64, status=status, verified_at=utcnow()))
        s.flush()

    def tx(s):
        pkg = RawDataPackage(name="inst/x", group_path="inst/x", source_location_id=ids["fyst-source"],
                             bagging_date="2026-12-01", file_count=1, payload_bytes=1, size=1, sha256="a" * 64)
        s.add(pkg)
        s.flush()
        add(s, pkg.id, "cologne-buffer", "missing")  # deleted by hand before its archive
        add(s, pkg.id, "cornell-lta", "missing")     # an archive copy not made again yet
        return pkg.id

    pkg = ctx.db.transact(tx)
    assert _recorded_copies(ctx, "cologne-buffer") == 1  # owed: nothing replaced it, not archived
    assert _recorded_copies(ctx, "cornell-lta") == 1
    ctx.db.transact(lambda s: add(s, pkg, "cologne-buffer", "deleted"))  # unpacked again, archived, freed
    assert _recorded_copies(ctx, "cologne-buffer") == 0
    # the trial: that buffer's root emptied and unmarked; init marks it again
    root = ctx.settings.location_path("cologne-buffer")
    shutil.rmtree(root)
    root.mkdir()
    mark_locations(ctx)
    assert read_marker(ctx.backend("cologne-buffer")) is not None
    # a missing buffer copy of an archived package is owed nowhere either
    ctx.db.transact(lambda s: add(s, pkg, "cornell-buffer", "missing"))
    assert _recorded_copies(ctx, "cornell-buffer") == 1
    ctx.db.transact(lambda s: setattr(s.get(RawDataPackage, pkg), "archived_at", utcnow()))
    assert _recorded_copies(ctx, "cornell-buffer") == 0
    assert _recorded_copies(ctx, "cornell-lta") == 1  # an archive copy is owed whatever the package's state
    # and an empty, unmarked archive root where a copy is owed is still refused
    root = ctx.settings.location_path("cornell-lta")
    shutil.rmtree(root)
    root.mkdir()
    with pytest.raises(ConfigError, match="records 1 copy"):
        mark_locations(ctx)


def test_init_of_one_site_marks_only_that_sites_locations(tmp_path):
    # distributed: each site's folders are on its own hosts, so `init --site` on a host of each
    # site marks that site's locations and never creates another site's folders here
    import shutil

    from packhorse.rules.availability import mark_locations

    ctx = _site(tmp_path)
    for loc in ctx.settings.locations:
        if loc.role.value != "source":
            shutil.rmtree(ctx.settings.location_path(loc.name))
    done = mark_locations(ctx, sites=["cologne"])
    cologne = sorted(l.name for l in ctx.settings.locations if l.site == "cologne")
    assert sorted(r.location for r in done) == cologne
    for loc in ctx.settings.locations:
        made = ctx.settings.location_path(loc.name).exists()
        assert made == (loc.site == "cologne" or loc.role.value == "source"), loc.name
    with pytest.raises(ConfigError, match="--site names no configured site: nowhere"):
        mark_locations(ctx, sites=["nowhere"])
    with pytest.raises(ConfigError, match="--replace names a location of a site not marked here"):
        mark_locations(ctx, replace=["fyst-buffer"], sites=["cologne"])


def test_init_refuses_a_marker_that_is_not_json_naming_it_without_a_traceback(tmp_path):
    from packhorse.rules.availability import mark_locations

    ctx = _site(tmp_path)
    marker = ctx.settings.location_path("cologne-lta") / MARKER_KEY
    marker.chmod(0o644)
    marker.write_text("{not json")
    with pytest.raises(ConfigError, match=r"is not JSON.*move it aside if this storage belongs to 'cologne-lta'"):
        mark_locations(ctx)
    assert marker.read_text() == "{not json"
