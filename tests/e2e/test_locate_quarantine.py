"""``packhorse locate`` shows where a repaired copy's bad bytes went: a real corrupted archive
copy, found by ``packhorse verify``, repaired by ``packhorse run``; the timeline reads found
corrupt → quarantined (the key under ``_packhorse/quarantine/``) → repaired, in that order, in
the JSON answer and in the text."""

from __future__ import annotations

import json
import os
import re


def test_locate_shows_the_bad_copy_moved_aside_between_its_detection_and_its_repair(pipeline):
    p = pipeline(bundle_max_wait_seconds=0)
    path = p.source / "inst" / "obs1" / "a.dat"
    path.parent.mkdir(parents=True)
    path.write_bytes(os.urandom(5000))
    p.init()
    p.run()
    copy = p.location("cologne-lta") / "raw/inst/obs1.tar"
    good = copy.read_bytes()
    rotten = good[:-1] + bytes([good[-1] ^ 1])  # same size, other bytes
    os.chmod(copy, 0o644)
    copy.write_bytes(rotten)
    assert p.cli("verify").returncode == 1
    p.run()
    assert copy.read_bytes() == good

    where = json.loads(p.cli("locate", "inst/obs1", "--json").stdout)
    pkg = where["packages"][0]
    [bad] = [c for c in pkg["copies"] if c["location"] == "cologne-lta" and c["status"] == "corrupt"]
    assert bad["quarantined_as"] and bad["quarantined_as"].startswith("_packhorse/quarantine/raw/inst/obs1.tar."), bad
    assert bad["quarantined_at"] and bad["found_bad_at"] <= bad["quarantined_at"], bad
    # the bytes are where locate says they are
    assert (p.location("cologne-lta") / bad["quarantined_as"]).read_bytes() == rotten
    events = [(e["event"], e["location"]) for e in pkg["timeline"]]
    found = events.index(("found corrupt", "cologne-lta"))
    moved = events.index(("quarantined", "cologne-lta"))
    repaired = [i for i, e in enumerate(events) if e == ("repaired", "cologne-lta")]
    assert found < moved < repaired[-1], events
    q = pkg["timeline"][moved]
    assert bad["quarantined_as"] in q["detail"] and q["at"] == bad["quarantined_at"], q
    assert q["kind"] == "fixity_check" and q["operation_id"], q  # who moved it

    text = p.cli("locate", "inst/obs1").stdout
    assert "moved aside to" in text and "quarantined" in text, text
    flat = "".join(text.split())  # the table may wrap the key
    assert "".join(bad["quarantined_as"].split()) in flat, text
    # times in the one format of the text surfaces (as `status` and the dashboard): seconds, UTC
    # said once, no microseconds or offsets (it printed 2026-12-06T05:57:00.476850+00:00)
    assert f"at {bad['quarantined_at'].replace('T', ' ')[:19]} UTC" in text, text
    assert not re.search(r"\d\d:\d\d:\d\d\.\d{6}|\+00:00|\d{4}-\d\d-\d\dT\d\d:", text), text
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", text), text

    # the API's locate answers the same (its schema holds the new fields)
    from fastapi.testclient import TestClient

    from packhorse.api.app import create_app
    from packhorse.api.tokens import create_token
    from packhorse.config import load_config
    from packhorse.db.session import Database

    settings = load_config(p.config)
    db = Database(settings.database_url)
    token = create_token(db, name="ops", role="observer", created_by="test")
    with TestClient(create_app(settings)) as client:
        r = client.get("/api/transfer/locate", params={"q": "inst/obs1"}, headers={"Authorization": f"Bearer {token}"})
    db.dispose()
    assert r.status_code == 200, r.text
    api = r.json()["packages"][0]
    assert [c for c in api["copies"] if c["quarantined_as"]] == [bad]
    assert [e for e in api["timeline"] if e["event"] == "quarantined"] == [q]
