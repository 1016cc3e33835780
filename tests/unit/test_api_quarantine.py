"""The quarantine through the HTTP API: ``GET /api/admin/quarantine`` lists what the disk
locations' quarantines hold, ``POST /api/admin/quarantine/purge`` removes entries older than the
minimum retention (422 inside it; audited). Real files, a real SQLite ops database, FastAPI's
test client."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from packhorse.api.app import create_app
from packhorse.api.tokens import create_token
from packhorse.config import load_config
from packhorse.db.session import Database
from packhorse.rules.availability import mark_locations
from packhorse.runtime import audit
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from support import write_site_config


@pytest.fixture
def api(tmp_path: Path):
    settings = load_config(write_site_config(tmp_path / "site"))
    db = Database(settings.database_url)
    db.upgrade()
    ctx = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    mark_locations(ctx)
    token = create_token(db, name="ops", role="admin", created_by="test")
    with TestClient(create_app(settings, ctx=ctx)) as client:
        yield client, {"Authorization": f"Bearer {token}"}, ctx
    db.dispose()


def put(ctx: ProcessContext, location: str, key: str, days_ago: float, size: int) -> Path:
    at = dt.datetime.now(dt.UTC) - dt.timedelta(days=days_ago)
    p = ctx.settings.location_path(location) / f"_packhorse/quarantine/{key}.{at:%Y%m%dT%H%M%S.%fZ}-0123abcd"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b"x" * size)
    return p


def test_list_and_purge_over_http(api) -> None:
    client, auth, ctx = api
    old = put(ctx, "cologne-lta", "raw/cam/obs1.tar", 31, 100)
    young = put(ctx, "cologne-lta", "raw/cam/obs2.tar", 1, 50)
    r = client.get("/api/admin/quarantine", headers=auth)
    assert r.status_code == 200, r.text
    assert r.json()["locations"]["cologne-lta"] == {"count": 2, "bytes": 150}
    assert client.get("/api/admin/quarantine?location=nowhere", headers=auth).status_code == 422

    refused = client.post("/api/admin/quarantine/purge", headers=auth, json={"older_than_days": 3, "reason": "full"})
    assert refused.status_code == 422 and "minimum retention" in refused.json()["detail"]
    assert old.exists()

    done = client.post("/api/admin/quarantine/purge", headers=auth, json={"older_than_days": 30, "reason": "seen"})
    assert done.status_code == 200, done.text
    assert [e["original_key"] for e in done.json()["removed"]] == ["raw/cam/obs1.tar"]
    assert not old.exists() and young.exists()
    entries = ctx.db.read(lambda s: audit.entries(s, action="quarantine.purge"))
    assert [(e["actor"], e["result"]) for e in entries] == [("token:ops", "ok"), ("token:ops", "refused")]
