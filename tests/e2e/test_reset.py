"""A FAILED operation is handed back with ``packhorse reset`` once the cause is fixed."""

from __future__ import annotations

import json
from pathlib import Path

from support import run_packhorse, write_site_config


def test_reset_after_fixing_a_broken_transfer_command_archives_everything(tmp_path: Path) -> None:
    site = tmp_path / "site"
    broken = write_site_config(site, max_retries=0,
                               route_extra='method = "command"\ncommand = "cpx {source} {destination}"')
    (site / "source" / "cam" / "obs1").mkdir(parents=True)
    (site / "source" / "cam" / "obs1" / "a.dat").write_bytes(b"alpha")
    assert run_packhorse("init", "-c", str(broken)).returncode == 0
    r = run_packhorse("run", "-c", str(broken), "--until-idle", "--quiet")
    assert r.returncode == 3 and "TransferCommandError" in r.stderr

    fixed = write_site_config(site, max_retries=0,
                              route_extra='method = "command"\ncommand = "cp {source} {destination}"')
    # nothing happens by itself: FAILED waits for a human
    assert run_packhorse("run", "-c", str(fixed), "--until-idle", "--quiet").returncode == 3
    refused = run_packhorse("reset", "transfer", "999", "-c", str(fixed))
    assert refused.returncode == 1 and "no transfer operation with id 999" in refused.stderr
    out = run_packhorse("reset", "transfer", "--all-failed", "--reason", "typo fixed", "-c", str(fixed), "--json")
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["reset"]) == 2  # one per destination site
    r = run_packhorse("run", "-c", str(fixed), "--until-idle", "--quiet")
    assert r.returncode == 0, r.stderr
    status = json.loads(run_packhorse("status", "-c", str(fixed), "--json").stdout)
    assert status["packages"] == {"total": 1, "archived": 1, "failed": 0}
    assert status["failed_operations"] == []
    again = run_packhorse("reset", "transfer", "--all-failed", "-c", str(fixed), "--json")
    assert json.loads(again.stdout)["reset"] == []
    # in words: nothing was FAILED, nothing for `packhorse run` to pick up; the audit says so too
    words = run_packhorse("reset", "transfer", "--all-failed", "-c", str(fixed))
    assert words.returncode == 0 and "no FAILED transfer operation: nothing reset" in words.stdout, words
    log = json.loads(run_packhorse("audit", "-c", str(fixed), "--json").stdout)
    assert log[0]["action"] == "operation.reset_all_failed" and log[0]["message"] == \
        "no FAILED transfer operation: nothing reset", log[0]
