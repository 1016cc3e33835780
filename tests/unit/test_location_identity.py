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
