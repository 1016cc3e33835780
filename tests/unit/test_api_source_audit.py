"""``GET /api/transfer/locate`` for a file the source audit registered: the version carries
``found_by`` and ``why`` (the locate answer's schema holds them); ``/metrics`` counts it. Real files, a real SQLite ops
database, FastAPI's test client."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fastapi.testclient import TestClient

from packhorse.api.app import create_app
from packhorse.api.tokens import create_token
from packhorse.config import load_config
from packhorse.db.session import Database
from packhorse.managers.scan import hash_source, scan_all
from packhorse.managers.source_audit import audit_source
from packhorse.rules.availability import mark_locations
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from support import write_site_config


def test_locate_over_http_says_which_version_the_source_audit_found(tmp_path: Path) -> None:
    settings = load_config(write_site_config(tmp_path / "site", settle_seconds=0))
    db = Database(settings.database_url)
    db.upgrade()
    ctx = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    mark_locations(ctx)
    p = settings.location_path("fyst-source") / "cam/obs1/a.dat"
    p.parent.mkdir(parents=True)
    p.write_bytes(b"a" * 100)
    t = time.time() - 60
    os.utime(p, (t, t))
    with ThreadPoolExecutor(1) as pool:
        scan_all(ctx, pool)
    st = os.stat(p)
    p.write_bytes(b"A" * 100)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert [c["action"] for c in audit_source(ctx, "fyst-source", hash_source).changed] == ["update"]
    token = create_token(db, name="ops", role="observer", created_by="test")
    with TestClient(create_app(settings, ctx=ctx)) as client:
        r = client.get("/api/transfer/locate", params={"q": "cam/obs1/a.dat"},
                       headers={"Authorization": f"Bearer {token}"})
        metrics = client.get("/metrics").text
    db.dispose()
    assert 'packhorse_source_audit_changed_total{location="fyst-source"} 1.0' in metrics
    assert 'packhorse_source_audit_completed_timestamp_seconds{location="fyst-source"}' in metrics
    assert r.status_code == 200, r.text
    (v,) = r.json()["versions"]
    assert v["found_by"] == "source_audit" and "unchanged size and mtime" in v["why"]
