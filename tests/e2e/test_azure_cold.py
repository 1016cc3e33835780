"""A cold Azure archive (the Archive tier, on Azurite) as a user meets it, through real
``packhorse`` processes: an archive attempt that fails after its blob was published and
archived is retried, waits for the blob's rehydration and finds it "already there" (it never
goes FAILED); ``verify`` says how many archived copies it could not read (exit 5, incomplete)
instead of a silent success; ``init`` that cannot reach the storage leaves no database behind."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

from e2e_helpers import Pipeline
from sqlalchemy import select

from azurite_support import ACCOUNT_KEY, azure_location
from packhorse.db.models import FailureEvent
from packhorse.db.session import Database
from support import run_packhorse, write_site_config

#: the one long-term archive of the route: cologne's, in a container on Azurite
DISK_LTA = """[[locations]]
name = "cologne-lta"
site = "cologne"
role = "long_term_archive"
path = "sites/cologne/archive"
"""


def _config(tmp_path: Path, azurite, container: str, *, connection_string: str | None = None) -> Path:  # type: ignore[no-untyped-def]
    cfg = write_site_config(tmp_path / "site", workers=1, extra=azure_location(
        "cologne-az", azurite, container, site="cologne", prefix="lta", cold=True, restore_poll_seconds=0.3,
        connection_string=connection_string or azurite.connection_string))
    text = cfg.read_text()
    assert DISK_LTA in text
    cfg.write_text(text.replace(DISK_LTA, "").replace('destination_sites = ["cologne", "cornell"]',
                                                      'destination_sites = ["cologne"]'))
    return cfg


def _archived_once(tmp_path: Path, azurite, container: str, *, env: dict[str, str] | None = None) -> Pipeline:  # type: ignore[no-untyped-def]
    p = Pipeline(_config(tmp_path, azurite, container), run_packhorse, tmp_path / "x")
    (p.source / "inst/obs01").mkdir(parents=True)
    (p.source / "inst/obs01/frame.fits").write_bytes(os.urandom(200_000))
    p.init()
    r = p.cli("run", "--until-idle", "--quiet", env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    st = p.status()
    assert st["packages"]["archived"] == st["packages"]["total"] == 1 and not st["failed_operations"], st
    return p


def _archived_key(azurite, container: str) -> str:  # type: ignore[no-untyped-def]
    raw = azurite.container(container)
    key = next(b.name for b in raw.list_blobs() if b.name.startswith("lta/raw/"))
    assert str(raw.get_blob_client(key).get_blob_properties().blob_tier) == "Archive"
    return key


def test_an_archive_retry_meeting_its_archived_blob_waits_for_the_rehydration_and_completes(azurite,
                                                                                            tmp_path: Path) -> None:
    # found by a user: the retry read the archived blob, met RestoreRequiredError and went FAILED.
    # The first archive attempt fails just after its blob was published (and moved to Archive):
    # the retry meets the archived blob under the package's name
    container = azurite.new_container()
    fail_once = [{"point": "long_term_archive.published", "action": "fail", "times": 1}]
    p = _archived_once(tmp_path, azurite, container, env={"PACKHORSE_TEST_FAULTS": json.dumps(fail_once)})
    db = Database(f"sqlite:///{p.root / 'packhorse.db'}")
    try:
        errors = db.read(lambda s: [e.error_type for e in s.scalars(select(FailureEvent))])
    finally:
        db.dispose()
    assert errors == ["RuntimeError"], errors  # the hook's; no RestoreRequiredError, nothing FAILED
    key = _archived_key(azurite, container)
    rehydrated = key.replace("lta/", "lta/_packhorse/rehydrated/", 1)
    assert azurite.container(container).get_blob_client(rehydrated).exists()  # compared through it


def test_verify_of_an_archived_copy_it_cannot_read_exits_incomplete_naming_it(azurite, tmp_path: Path) -> None:
    # found by a user: verify exited 0 having read nothing
    container = azurite.new_container()
    p = _archived_once(tmp_path, azurite, container)
    key = _archived_key(azurite, container)
    r = p.cli("verify")
    assert r.returncode == 5, r.stdout + r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("checked 0, ok 0") and "1 in cold storage, not restored: restore requested" in first, first
    assert f"AWAITING RESTORE cologne-az:{key[len('lta/'):]}" in r.stdout
    code, report = p.verify()  # Azurite rehydrates at once: now it is read and verified
    assert code == 0 and report["checked"] == report["ok"] == 1 and not report["awaiting_restore"], report


def test_init_that_cannot_reach_the_azure_account_leaves_no_database_and_a_rerun_starts_clean(
        azurite, tmp_path: Path) -> None:
    container = azurite.new_container()
    wrong_key = azurite.connection_string.replace(ACCOUNT_KEY, "A" * 86 + "==")
    cfg = _config(tmp_path, azurite, container, connection_string=wrong_key)
    db_file = cfg.parent / "packhorse.db"
    r = run_packhorse("init", "-c", str(cfg), cwd=cfg.parent)
    assert r.returncode == 2, r.stderr
    assert not db_file.exists() and not list(cfg.parent.glob("packhorse.db*")), list(cfg.parent.iterdir())
    assert f"looking up container '{container}' of account 'devstoreaccount1' failed" in r.stderr, r.stderr
    assert "None" not in r.stderr and "A" * 86 not in r.stderr and "Traceback" not in r.stderr
    assert "nothing done (no database created, no location marked)" in r.stderr, r.stderr
    # the location is named once per line, not "cornell-az: cornell-az:"
    assert not [line for line in r.stderr.splitlines() if line.strip().count(": ") >= 2
                and line.strip().split(": ")[0] == line.strip().split(": ")[1]], r.stderr
    assert not (cfg.parent / "sites").exists()  # no disk root made or marked either
    # the credentials fixed: init runs as the first time
    cfg.write_text(cfg.read_text().replace(wrong_key, azurite.connection_string))
    r = run_packhorse("init", "-c", str(cfg), cwd=cfg.parent)
    assert r.returncode == 0, r.stderr
    assert ": created (migration" in r.stdout, r.stdout + r.stderr
    with sqlite3.connect(db_file) as conn:
        assert conn.execute("SELECT count(*) FROM data_locations").fetchone()[0] >= 1
