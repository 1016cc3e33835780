"""``delete_source_files``: only archived, unchanged, quiet files go; instrument folders stay (I1)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from support import run_packhorse, write_site_config


def _tree(source: Path) -> None:
    for rel, data in {"cam/obs1/a.dat": b"a" * 100, "cam/obs1/b.dat": b"b" * 200, "cam/obs2/c.dat": b"c"}.items():
        p = source / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        os.utime(p, (1_700_000_000, 1_700_000_000))


def _run(cfg: Path) -> None:
    r = run_packhorse("run", "-c", str(cfg), "--until-idle", "--quiet")
    assert r.returncode == 0, r.stderr


def test_source_files_go_only_after_the_retention_and_only_if_unchanged(tmp_path: Path) -> None:
    site = tmp_path / "site"
    keep = write_site_config(site, extra="[deletion]\ndelete_source_files = true\n")  # default: one day
    source = site / "source"
    _tree(source)
    assert run_packhorse("init", "-c", str(keep)).returncode == 0
    _run(keep)
    status = json.loads(run_packhorse("status", "-c", str(keep), "--json").stdout)
    assert status["packages"]["archived"] == status["packages"]["total"] == 2
    assert sorted(p.name for p in source.rglob("*.dat")) == ["a.dat", "b.dat", "c.dat"]  # within retention

    # the instrument appends to b.dat after it was archived; then the retention is over
    with open(source / "cam/obs1/b.dat", "ab") as f:
        f.write(b"late bytes")
    os.utime(source / "cam/obs1/b.dat", (1_700_000_100, 1_700_000_100))
    now = write_site_config(site, extra="[deletion]\ndelete_source_files = true\nsource_retention_seconds = 0\n")
    _run(now)
    assert not (source / "cam/obs1/a.dat").exists() and not (source / "cam/obs2/c.dat").exists()
    assert (source / "cam/obs2").is_dir()  # folders stay for the instrument
    # b.dat changed after cam/obs1 was archived: cam/obs1's deletion left it (not the bytes it
    # archived); its new content became version 2, and only once that was archived did it go
    found = json.loads(run_packhorse("locate", "cam/obs1/b.dat", "--json", "-c", str(now)).stdout)
    versions = {v["version"]: v for v in found["versions"]}
    assert versions[1]["package"] == "cam/obs1" and versions[1]["source_deleted_at"] is None
    assert versions[2]["package"] == "cam/obs1+v2" and versions[2]["source_deleted_at"] is not None
    assert versions[2]["sha256"] == hashlib.sha256(b"b" * 200 + b"late bytes").hexdigest()
    v2 = next(p for p in found["packages"] if p["name"] == "cam/obs1+v2")
    assert v2["archived_at"] is not None and v2["archived_at"] < versions[2]["source_deleted_at"]
    assert not (source / "cam/obs1/b.dat").exists()


def test_a_file_rewritten_in_place_with_its_mtime_put_back_is_kept_and_archived_as_a_new_version(tmp_path: Path) -> None:
    """Other bytes under the same size and mtime escape the scan (it compares size and mtime);
    the deletion of the source files hashed them and kept the file, but said nothing, and the
    new bytes were never archived (found by a trial). Now it warns and keeps the file, and the next
    listing of its folder registers the new bytes as version 2, which is archived, then deleted."""
    site = tmp_path / "site"
    keep = write_site_config(site, extra="[deletion]\ndelete_source_files = true\n")  # default: one day
    source = site / "source"
    _tree(source)
    assert run_packhorse("init", "-c", str(keep)).returncode == 0
    _run(keep)
    b = source / "cam/obs1/b.dat"
    b.write_bytes(b"B" * 200)  # the same size
    os.utime(b, (1_700_000_000, 1_700_000_000))  # and its mtime put back
    now = write_site_config(site, extra="[deletion]\ndelete_source_files = true\nsource_retention_seconds = 0\n")
    r = run_packhorse("run", "-c", str(now), "--until-idle")
    assert r.returncode == 0, r.stderr
    assert not (source / "cam/obs1/a.dat").exists()
    assert "source_file_rewritten_in_place" in r.stderr and "cam/obs1/b.dat" in r.stderr, r.stderr[-3000:]
    # a.dat's deletion changed the folder's mtime: the run's next scan listed it again and
    # registered b.dat's new bytes (else the next full listing does)
    _run(now)
    found = json.loads(run_packhorse("locate", "cam/obs1/b.dat", "--json", "-c", str(now)).stdout)
    versions = {v["version"]: v for v in found["versions"]}
    assert versions[1]["sha256"] == hashlib.sha256(b"b" * 200).hexdigest()
    assert versions[2]["sha256"] == hashlib.sha256(b"B" * 200).hexdigest(), versions
    assert versions[2]["source_deleted_at"] is not None and not b.exists()
