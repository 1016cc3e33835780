"""A read-only source (DESIGN.md "Storage that is absent is not empty"), with a real read-only
bind mount: ``packhorse init`` writes nothing into it and keeps its identity in the ops
database (a uuid and a fingerprint of the root); ``packhorse run --until-idle`` archives it;
unmounted (an empty mount point) or swapped for another export, it is unavailable — nothing is
registered from the wrong tree — and once the right export is back the work goes on by itself.
A source found read-only at start-up without ``read_only = true`` is treated so with a warning,
and ``delete_source_files`` is refused for it, naming it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_helpers import Pipeline, assert_archived_everywhere, source_files


@contextlib.contextmanager
def read_only_bind(export: Path, mount_point: Path) -> Iterator[None]:
    """``export`` bind-mounted read-only on ``mount_point`` for the block (unmounted after it)."""
    r = subprocess.run(["mount", "--bind", str(export), str(mount_point)], capture_output=True, text=True)
    if r.returncode != 0:
        reason = f"cannot bind-mount {export} (needs root): {r.stderr.strip()}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        r = subprocess.run(["mount", "-o", "remount,ro,bind", str(mount_point)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        yield
    finally:
        subprocess.run(["umount", str(mount_point)], capture_output=True)


def _export(folder: Path, groups: int, prefix: str = "obs") -> None:
    for g in range(groups):
        for f in range(2):
            path = folder / "cam" / f"{prefix}{g}" / f"frame{f}.fits"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(os.urandom(150_000))


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = Path(dirpath) / name
            st = os.lstat(p)
            out[p.relative_to(folder).as_posix()] = (st.st_size if not p.is_dir() else 0, st.st_mtime_ns)
    return out


def _configure_read_only(p: Pipeline) -> None:
    text = p.config.read_text()
    p.config.write_text(text.replace('role = "source"\n', 'role = "source"\nread_only = true\n', 1))


def _blocked(p: Pipeline) -> dict[str, dict]:
    return {b["detail"]["location"]: b for b in p.status()["blocked"] if b["cause"] == "location_unavailable"}


def test_a_read_only_source_is_archived_without_a_write_and_told_from_another_export(pipeline, tmp_path) -> None:
    p = pipeline(bundle_max_wait_seconds=0)
    _configure_read_only(p)
    export, other = tmp_path / "export", tmp_path / "other-export"
    _export(export, groups=3)
    _export(other, groups=2, prefix="foreign")
    before = _tree(export)
    expected = source_files(export)
    with read_only_bind(export, p.source):
        init = p.cli("init")
        assert init.returncode == 0, init.stderr
        assert "fyst-source: read-only source: nothing written there" in init.stdout, (init.stdout, init.stderr)
        with sqlite3.connect(p.root / "packhorse.db") as db:
            (fingerprint,) = db.execute("SELECT fingerprint FROM data_locations WHERE name = 'fyst-source'").fetchone()
        assert fingerprint and '"inode"' in fingerprint
        # the dry run looks at it as the run does: by its fingerprint, not for a marker
        dry = p.cli("run", "--dry-run", "--json")
        assert dry.returncode == 0, dry.stderr
        (entry,) = [r for r in json.loads(dry.stdout)["register"] if r["location"] == "fyst-source"]
        assert "unavailable" not in entry and entry["files"] == 6, entry
        p.run(expect=0)
        assert_archived_everywhere(p, expected)
        assert p.status()["packages"]["archived"] == 3
    assert _tree(export) == before, "packhorse wrote into the read-only source"
    assert not (export / "_packhorse").exists()

    # unmounted: the empty mount point is not an empty source
    assert os.listdir(p.source) == []
    r = p.run(expect=4)
    assert "blocked: location fyst-source" in r.stderr, r.stderr[-3000:]
    b = _blocked(p)["fyst-source"]
    assert "not the read-only source recorded" in b["reason"], b
    assert os.listdir(p.source) == []

    # another export mounted in its place: unavailable, nothing of it registered
    with read_only_bind(other, p.source):
        p.run(expect=4)
        assert "fyst-source" in _blocked(p)
        with sqlite3.connect(p.root / "packhorse.db") as db:
            assert db.execute("SELECT count(*) FROM raw_data_files WHERE relative_path LIKE '%foreign%'"
                              ).fetchone() == (0,)
        # init does not take it for the source either
        again = p.cli("init")
        assert again.returncode == 2 and "fyst-source" in again.stderr and "--replace fyst-source" in again.stderr

    # the right export is back: a plain run goes on by itself, nothing new, nothing reset
    with read_only_bind(export, p.source):
        p.run(expect=0)
        status = p.status()
        assert status["blocked"] == [] and status["failed_operations"] == []
        assert status["packages"]["archived"] == status["packages"]["total"] == 3
    assert _tree(export) == before


def test_a_source_found_read_only_at_start_up_is_not_written_and_refuses_delete_source_files(pipeline, tmp_path):
    p = pipeline(bundle_max_wait_seconds=0, extra="[deletion]\ndelete_source_files = true\n")
    export = tmp_path / "export"
    _export(export, groups=2)
    before = _tree(export)
    with read_only_bind(export, p.source):
        init = p.cli("init")
        assert init.returncode == 2, init.stderr
        assert "delete_source_files" in init.stderr and "fyst-source" in init.stderr and "read-only" in init.stderr

        p.config.write_text(p.config.read_text().replace("delete_source_files = true", "delete_source_files = false"))
        init = p.cli("init")
        assert init.returncode == 0, init.stderr
        assert "warning: source location fyst-source" in init.stderr and "read-only" in init.stderr, init.stderr
        p.run(expect=0)
        assert_archived_everywhere(p, source_files(export))
        # turned on again after init: the run refuses at start-up, naming the location
        p.config.write_text(p.config.read_text().replace("delete_source_files = false", "delete_source_files = true"))
        r = p.cli("run", "--until-idle", "--quiet")
        assert r.returncode == 2 and "fyst-source" in r.stderr and "delete_source_files" in r.stderr, r.stderr
    assert _tree(export) == before
