"""A source location whose folder does not exist (a typo, an unmounted disk) is reported, and
``run --until-idle`` still ends: it must not look like "nothing to archive", nor hang."""

from __future__ import annotations

import json
from pathlib import Path

from support import run_packhorse, write_site_config


def test_run_until_idle_ends_and_reports_a_missing_source_folder(tmp_path: Path) -> None:
    cfg = write_site_config(tmp_path / "site", source="not-there")
    (tmp_path / "site" / "not-there").rmdir()
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    r = run_packhorse("run", "-c", str(cfg), "--until-idle", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "source_folder_missing" in r.stderr
    assert "service_loop_cycle_failed" not in r.stderr and "Traceback" not in r.stderr
    status = json.loads(run_packhorse("status", "-c", str(cfg), "--json").stdout)
    assert any(s["path"] == "." and "does not exist" in s["reason"] for s in status["skipped"])
