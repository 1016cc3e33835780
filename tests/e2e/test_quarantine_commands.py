"""The quarantine's lifecycle as real processes on real folders: ``packhorse quarantine list``,
``packhorse quarantine purge`` (never inside ``[quarantine] min_retention_seconds``; audited;
``--dry-run``), and quarantined bytes in ``packhorse status`` and ``packhorse usage``."""

from __future__ import annotations

import datetime as dt
import json
import secrets
from pathlib import Path

from packhorse.storage.base import StorageBackend
from support import run_packhorse, write_site_config

QUARANTINE = "_packhorse/quarantine"


def quarantine_name(key: str, days_ago: float) -> str:
    """The key :meth:`StorageBackend.quarantine_key` would have given ``key`` ``days_ago`` days ago."""
    at = dt.datetime.now(dt.UTC) - dt.timedelta(days=days_ago)
    return f"{QUARANTINE}/{key}.{at:%Y%m%dT%H%M%S.%fZ}-{secrets.token_hex(4)}"


def put(root: Path, key: str, size: int) -> Path:
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return path


def cli(cfg: Path, *args: str) -> "object":
    return run_packhorse(*args, "-c", str(cfg))


def test_quarantine_list_purge_status_and_usage(tmp_path: Path) -> None:
    cfg = write_site_config(tmp_path / "site")
    assert cli(cfg, "init").returncode == 0
    lta = tmp_path / "site" / "sites" / "cologne" / "archive"
    buf = tmp_path / "site" / "sites" / "cornell" / "buffer"
    old_file = quarantine_name("raw/cam/obs1.tar", 40)
    put(lta, old_file, 1000)
    young = StorageBackend.quarantine_key("raw/cam/obs2.tar")  # moved aside now, as a repair does
    put(lta, young, 500)
    old_folder = quarantine_name("cam/obs3", 45)  # a staged folder moved aside whole
    put(buf, f"{old_folder}/data/a.dat", 300)
    put(buf, f"{old_folder}/bagit.txt", 20)
    put(lta, f"{QUARANTINE}/notes.txt", 7)  # put there by hand: no stamp, never purged

    listed = cli(cfg, "quarantine", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    doc = json.loads(listed.stdout)
    by_key = {e["key"]: e for e in doc["entries"]}
    assert set(by_key) == {old_file, young, old_folder, f"{QUARANTINE}/notes.txt"}
    assert by_key[old_file]["original_key"] == "raw/cam/obs1.tar" and by_key[old_file]["size_bytes"] == 1000
    assert 39.9 * 86400 < by_key[old_file]["age_seconds"] < 40.1 * 86400
    assert (by_key[old_folder]["kind"], by_key[old_folder]["size_bytes"]) == ("folder", 320)
    assert by_key[young]["age_seconds"] < 600
    assert by_key[f"{QUARANTINE}/notes.txt"]["quarantined_at"] is None
    assert doc["locations"]["cologne-lta"] == {"count": 3, "bytes": 1507}
    assert doc["min_retention_seconds"] == 30 * 86400
    text = cli(cfg, "quarantine", "list")
    assert text.returncode == 0 and "4 quarantined entries, 1,827 bytes" in text.stdout

    # counted in disk usage and in status
    usage = cli(cfg, "usage", "--measure", "--json")
    assert usage.returncode == 0, usage.stderr
    rows = {r["location"]: r for r in json.loads(usage.stdout)}
    assert rows["cologne-lta"]["quarantined_bytes"] == 1507 and rows["cornell-buffer"]["quarantined_bytes"] == 320
    assert rows["fyst-buffer"]["quarantined_bytes"] == 0
    assert "quarantined" in cli(cfg, "usage").stdout
    status = json.loads(cli(cfg, "status", "--json").stdout)
    assert status["quarantine"]["bytes"] == 1827
    assert status["quarantine"]["locations"]["cologne-lta"]["bytes"] == 1507
    assert "quarantined: 1,827 bytes" in cli(cfg, "status").stdout

    # inside the minimum retention: refused, nothing removed, audited as refused
    refused = cli(cfg, "quarantine", "purge", "--older-than", "7", "--reason", "disk is full")
    assert refused.returncode == 2
    assert "minimum retention of 30 days" in refused.stderr and "min_retention_seconds" in refused.stderr
    assert (lta / old_file).exists()
    blank = cli(cfg, "quarantine", "purge", "--older-than", "30", "--reason", " ")
    assert blank.returncode == 2 and "--reason" in blank.stderr

    # dry run: says what would go, removes nothing
    dry = cli(cfg, "quarantine", "purge", "--older-than", "30", "--reason", "looked at", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert sorted(e["key"] for e in json.loads(dry.stdout)["removed"]) == sorted([old_file, old_folder])
    assert (lta / old_file).exists() and (buf / old_folder).is_dir()
    # -n is --dry-run, as for `packhorse run`
    short = cli(cfg, "quarantine", "purge", "--older-than", "30", "--reason", "looked at", "-n", "--json")
    assert short.returncode == 0, short.stderr
    assert sorted(e["key"] for e in json.loads(short.stdout)["removed"]) == sorted([old_file, old_folder])
    assert json.loads(short.stdout)["dry_run"] is True
    assert (lta / old_file).exists() and (buf / old_folder).is_dir()

    done = cli(cfg, "quarantine", "purge", "--older-than", "30", "--reason", "looked at")
    assert done.returncode == 0, done.stderr
    assert "removed 2 entries, 1,320 bytes; 2 kept" in done.stdout
    assert [p.name for p in (lta / QUARANTINE / "raw" / "cam").iterdir()] == [Path(young).name]
    assert not (buf / QUARANTINE / "cam").exists() and (buf / QUARANTINE).is_dir()  # emptied folders go
    assert (lta / young).exists() and (lta / QUARANTINE / "notes.txt").exists()

    audit = json.loads(cli(cfg, "audit", "--json").stdout)
    purges = [a for a in audit if a["action"] == "quarantine.purge"]
    # newest first: the purge, the blank reason, the one inside the retention; the dry runs are not audited
    assert [a["result"] for a in purges] == ["ok", "refused", "refused"]
    assert "--reason" in purges[1]["message"] and "2592000)" in purges[2]["message"]
    assert purges[0]["details"]["reason"] == "looked at"
    assert sorted(purges[0]["details"]["removed"]) == sorted([f"cologne-lta:{old_file}", f"cornell-buffer:{old_folder}"])
    assert purges[0]["details"]["removed_bytes"] == 1320

    # the purge measured again: status and usage show what is left
    rows = {r["location"]: r for r in json.loads(cli(cfg, "usage", "--json").stdout)}
    assert rows["cologne-lta"]["quarantined_bytes"] == 507 and rows["cornell-buffer"]["quarantined_bytes"] == 0
    assert json.loads(cli(cfg, "status", "--json").stdout)["quarantine"]["bytes"] == 507


def test_minimum_retention_is_configurable_and_unavailable_locations_are_not_touched(tmp_path: Path) -> None:
    cfg = write_site_config(tmp_path / "site", extra="[quarantine]\nmin_retention_seconds = 86400\n")
    assert cli(cfg, "init").returncode == 0
    lta = tmp_path / "site" / "sites" / "cologne" / "archive"
    gone = tmp_path / "site" / "sites" / "cornell" / "archive"
    two_days = quarantine_name("raw/a.tar", 2)
    put(lta, two_days, 10)
    put(gone, quarantine_name("raw/b.tar", 2), 10)
    (gone / "_packhorse" / "location.json").unlink()  # the wrong disk, or an empty mount point
    assert cli(cfg, "quarantine", "purge", "--older-than", "0.5", "--reason", "r").returncode == 2
    out = cli(cfg, "quarantine", "purge", "--older-than", "1", "--reason", "looked at", "--json")
    assert out.returncode == 1, out.stderr  # a location could not be looked at
    doc = json.loads(out.stdout)
    assert [e["key"] for e in doc["removed"]] == [two_days] and not (lta / two_days).exists()
    assert [(n["location"], n["cause"]) for n in doc["not_listed"]] == [("cornell-lta", "unavailable")]
    assert len(list((gone / QUARANTINE / "raw").iterdir())) == 1  # kept
    assert cli(cfg, "quarantine", "list", "--location", "nowhere").returncode == 2
    # on a host of one site, the other sites' disks are not there: --site looks at its own only
    own = cli(cfg, "quarantine", "list", "--site", "cologne", "--json")
    assert own.returncode == 0, own.stderr
    assert set(json.loads(own.stdout)["locations"]) == {"cologne-buffer", "cologne-lta"}
    assert cli(cfg, "quarantine", "list", "--site", "nowhere").returncode == 2
