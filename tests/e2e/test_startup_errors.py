"""Start-up errors are configuration errors: a real ``packhorse`` process exits 2 with a message
naming the key, and no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import run_packhorse, write_site_config


@pytest.mark.parametrize("url", ["sqlite:////nonexistent/dir/x.db", "mysql://x/y", "nonsense"])
@pytest.mark.parametrize("command", ["init", "status"])
def test_unusable_database_url_exits_2_naming_the_key(tmp_path: Path, url: str, command: str) -> None:
    cfg = tmp_path / "packhorse.toml"
    cfg.write_text(f'[database]\nurl = "{url}"\n', encoding="utf-8")
    r = run_packhorse(command, "-c", str(cfg))
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"error: {cfg}") and ": database.url:" in r.stderr  # the file, then the key
    assert "Traceback" not in r.stderr


def test_run_refuses_an_executor_that_is_not_available(tmp_path: Path) -> None:
    cfg = tmp_path / "packhorse.toml"
    cfg.write_text('[executor]\nkind = "celery"\n', encoding="utf-8")
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    r = run_packhorse("run", "-c", str(cfg), "--until-idle")
    assert r.returncode == 2 and r.stderr.startswith(f"error: {cfg}") and ": executor.kind:" in r.stderr
    # it says what to start instead
    assert "packhorse manager" in r.stderr and "packhorse worker --site" in r.stderr and "packhorse monitor" in r.stderr


def test_status_before_init_leaves_no_database_file_behind(tmp_path: Path) -> None:
    cfg = tmp_path / "packhorse.toml"
    cfg.write_text('[database]\nurl = "sqlite:///ops.db"\n', encoding="utf-8")
    r = run_packhorse("status", "-c", str(cfg))
    assert r.returncode == 2 and "packhorse init" in r.stderr
    assert not (tmp_path / "ops.db").exists()


@pytest.mark.parametrize("command", [("status",), ("run", "--until-idle")])
def test_an_unknown_log_level_is_refused_naming_the_variable(tmp_path: Path, command: tuple[str, ...]) -> None:
    # a typo must not silently log at another level (found by a new-user trial)
    cfg = tmp_path / "packhorse.toml"
    cfg.write_text('[database]\nurl = "sqlite:///p.db"\n', encoding="utf-8")
    r = run_packhorse(*command, "-c", str(cfg), env={"PACKHORSE_LOG_LEVEL": "bogus"})
    assert r.returncode == 2, r.stderr
    assert "PACKHORSE_LOG_LEVEL: 'bogus' is not a log level" in r.stderr and "Traceback" not in r.stderr
    ok = run_packhorse("status", "-c", str(cfg), env={"PACKHORSE_LOG_LEVEL": "debug"})
    assert "PACKHORSE_LOG_LEVEL" not in ok.stderr


def test_demo_with_a_missing_source_creates_nothing(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    r = run_packhorse("demo", "--source", str(tmp_path / "nonexistent"), "--workdir", str(workdir))
    assert r.returncode == 2 and "--source:" in r.stderr and "is not a folder" in r.stderr, r.stderr
    assert not workdir.exists()  # found by a new-user trial: an empty folder was left behind


def test_demo_refuses_a_source_marked_by_another_installation_with_exit_2(tmp_path: Path) -> None:
    # a folder another installation archives carries that installation's identity marker:
    # the demo must neither re-mark it nor fail like a crash (exit 1); it is a setup error
    cfg = write_site_config(tmp_path / "other")
    cfg.write_text(cfg.read_text(encoding="utf-8").replace('"fyst-source"', '"telescope-raw"'), encoding="utf-8")
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    source = cfg.parent / "source"
    marker = (source / "_packhorse" / "location.json").read_bytes()
    r = run_packhorse("demo", "--source", str(source), "--workdir", str(tmp_path / "demo"), "--quiet")
    assert r.returncode == 2, r.stderr
    assert "already marked as location" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert (source / "_packhorse" / "location.json").read_bytes() == marker  # left as it was

def test_worker_and_manager_refuse_a_wrong_setup_with_exit_2(tmp_path: Path) -> None:
    cfg = write_site_config(tmp_path)
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    r = run_packhorse("manager", "-c", str(cfg))  # executor.kind = "local"
    assert r.returncode == 2 and 'executor.kind = "celery"' in r.stderr, r.stderr
    env = {"PACKHORSE_EXECUTOR__KIND": "celery", "PACKHORSE_EXECUTOR__BROKER_URL": "memory://"}
    r = run_packhorse("worker", "--site", "koeln", "-c", str(cfg), env=env)
    assert r.returncode == 2 and "--site: unknown site 'koeln'" in r.stderr, r.stderr
    r = run_packhorse("worker", "--site", "cologne", "--kinds", "archive", "-c", str(cfg), env=env)
    assert r.returncode == 2 and "--kinds: unknown kind 'archive'" in r.stderr, r.stderr
