"""A source location whose folder does not exist (a typo, an unmounted disk) is reported, and
``run --until-idle`` still ends: it must not look like "nothing to archive", nor hang.
``packhorse init`` never creates a source folder (instruments write there), and a run treats
the missing folder as an unavailable location (DESIGN.md "Architecture": storage that is absent
is not empty): blocked, exit 4, nothing forgotten."""

from __future__ import annotations

import json
from pathlib import Path

from support import run_packhorse, write_site_config


def test_init_refuses_a_missing_source_folder_and_marks_the_rest(tmp_path: Path) -> None:
    cfg = write_site_config(tmp_path / "site", source="not-there")
    (tmp_path / "site" / "not-there").rmdir()
    r = run_packhorse("init", "-c", str(cfg))
    assert r.returncode == 2 and "fyst-source" in r.stderr and "not-there" in r.stderr, r.stderr
    assert "does not create a source folder" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "site" / "not-there").exists()
    assert (tmp_path / "site" / "sites" / "cologne" / "archive" / "_packhorse" / "location.json").is_file()


def test_run_until_idle_ends_and_reports_a_missing_source_folder(tmp_path: Path) -> None:
    cfg = write_site_config(tmp_path / "site", source="not-there")
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    (tmp_path / "site" / "not-there" / "_packhorse" / "location.json").unlink()
    (tmp_path / "site" / "not-there" / "_packhorse").rmdir()
    (tmp_path / "site" / "not-there").rmdir()  # unmounted, or renamed, after init
    r = run_packhorse("run", "-c", str(cfg), "--until-idle", timeout=120)
    assert r.returncode == 4, r.stderr
    assert "blocked: location fyst-source" in r.stderr and "does not exist" in r.stderr
    assert "service_loop_cycle_failed" not in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "site" / "not-there").exists()
    status = json.loads(run_packhorse("status", "-c", str(cfg), "--json").stdout)
    [b] = [b for b in status["blocked"] if b["cause"] == "location_unavailable"]
    assert b["subject"] == "location fyst-source" and "does not exist" in b["reason"]
