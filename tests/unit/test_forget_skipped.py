"""``packhorse skipped forget`` (:func:`packhorse.actions.operator.forget_skipped`): a blank reason is
refused, and a relative path listed in two source locations is refused until the operator
names the location (a trial forgot both at once)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from packhorse.actions.operator import forget_skipped
from packhorse.config import load_config
from packhorse.db.models import WithdrawnFile, utcnow
from packhorse.errors import EmptyReasonError, NotSkippedError
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from packhorse.status.reporting import status_report
from support import write_site_config

SECOND_SOURCE = ('[[locations]]\nname = "fyst-source2"\nsite = "fyst"\nrole = "source"\n'
                 'path = "sites/fyst/source2"\n')


@pytest.fixture
def ctx(tmp_path: Path, empty_db) -> ProcessContext:
    settings = load_config(write_site_config(tmp_path / "site", extra=SECOND_SOURCE))
    c = ProcessContext(settings=settings, db=empty_db, topology=sync_topology(empty_db, settings))
    now = utcnow() - dt.timedelta(hours=1)
    for loc in ("fyst-source", "fyst-source2"):
        empty_db.transact(lambda s, loc=loc: s.add(WithdrawnFile(
            location_id=c.topology.location_ids[loc], relative_path="cam/obs1/b.dat", version=1, size=3,
            sha256="a" * 64, mtime_ns=0, registered_at=now, package_name="cam/obs1", cause="vanished",
            reason="gone from the source before it was packaged", withdrawn_at=now)))
    return c


def _listed(ctx: ProcessContext) -> list[str]:
    return sorted(f"{s['location']}:{s['path']}" for s in status_report(ctx)["skipped"])


@pytest.mark.parametrize("reason", ["", "   "])
def test_a_blank_reason_is_refused_and_nothing_is_forgotten(ctx: ProcessContext, reason: str) -> None:
    with pytest.raises(EmptyReasonError):
        forget_skipped(ctx, "fyst-source:cam/obs1/b.dat", reason=reason, actor="t")
    assert _listed(ctx) == ["fyst-source2:cam/obs1/b.dat", "fyst-source:cam/obs1/b.dat"]


def test_a_path_listed_in_two_source_locations_needs_its_location(ctx: ProcessContext) -> None:
    with pytest.raises(NotSkippedError, match="more than one source location .*fyst-source:cam/obs1/b.dat.*"
                                              "fyst-source2:cam/obs1/b.dat.*LOCATION:PATH"):
        forget_skipped(ctx, "cam/obs1/b.dat", reason="gone", actor="t")
    assert len(_listed(ctx)) == 2
    done = forget_skipped(ctx, "fyst-source2:cam/obs1/b.dat", reason="gone", actor="t")
    assert [(d["location"], d["path"]) for d in done] == [("fyst-source2", "cam/obs1/b.dat")]
    assert _listed(ctx) == ["fyst-source:cam/obs1/b.dat"]
    # now only one location lists it: the relative path names it alone
    assert [d["location"] for d in forget_skipped(ctx, "cam/obs1/b.dat", reason="gone", actor="t")] == ["fyst-source"]
    assert _listed(ctx) == []
