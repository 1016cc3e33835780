"""Start-up errors are configuration errors: exit 2 with a message naming the key, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from packhorse.config import settings_from_dict
from packhorse.errors import ConfigError
from support import run_packhorse


@pytest.mark.parametrize("url", ["sqlite:////nonexistent/dir/x.db", "mysql://x/y", "nonsense"])
@pytest.mark.parametrize("command", ["init", "status"])
def test_unusable_database_url_exits_2_naming_the_key(tmp_path: Path, url: str, command: str) -> None:
    cfg = tmp_path / "packhorse.toml"
    cfg.write_text(f'[database]\nurl = "{url}"\n', encoding="utf-8")
    r = run_packhorse(command, "-c", str(cfg))
    assert r.returncode == 2, r.stderr
    assert "database.url" in r.stderr and "Traceback" not in r.stderr


def test_two_locations_that_are_one_folder_through_a_symlink_are_refused(tmp_path: Path) -> None:
    (tmp_path / "shared" / "lta").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(tmp_path / "shared" / "lta")
    data = {
        "sites": [{"name": "a"}],
        "locations": [
            {"name": "lta1", "site": "a", "role": "long_term_archive", "path": "shared/lta"},
            {"name": "lta2", "site": "a", "role": "long_term_archive", "path": "alias"},
        ],
    }
    with pytest.raises(ConfigError, match=r"locations\[1\]\.path: 'alias' \(location 'lta2'\) overlaps"):
        settings_from_dict(data, base_dir=tmp_path, environ={})


def test_an_environment_variable_with_an_unknown_section_is_refused() -> None:
    with pytest.raises(ConfigError, match="PACKHORSE_PACKAGIN__GROUP_DEPTH: unknown section 'packagin'"):
        settings_from_dict({}, environ={"PACKHORSE_PACKAGIN__GROUP_DEPTH": "3"})


def test_errors_from_environment_overrides_say_so() -> None:
    with pytest.raises(ConfigError, match=r"environment overrides\): executor\.workers"):
        settings_from_dict({}, source="x.toml", environ={"PACKHORSE_EXECUTOR__WORKERS": "0"})


def test_more_archive_copies_required_than_archives_is_refused(tmp_path: Path) -> None:
    data = {
        "sites": [{"name": "a"}, {"name": "b"}],
        "locations": [
            {"name": "a-src", "site": "a", "role": "source", "path": "src"},
            {"name": "a-buf", "site": "a", "role": "buffer", "path": "abuf"},
            {"name": "b-buf", "site": "b", "role": "buffer", "path": "bbuf"},
            {"name": "b-lta", "site": "b", "role": "long_term_archive", "path": "blta"},
        ],
        "routes": [{"source_site": "a", "destination_sites": ["b"]}],
        "deletion": {"archive_copies_required": 2},
    }
    with pytest.raises(ConfigError, match="deletion.archive_copies_required: 2 .* 1 long-term archive"):
        settings_from_dict(data, base_dir=tmp_path, environ={})


def test_run_refuses_an_executor_that_is_not_available(tmp_path: Path) -> None:
    cfg = tmp_path / "packhorse.toml"
    cfg.write_text('[executor]\nkind = "celery"\n', encoding="utf-8")
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    r = run_packhorse("run", "-c", str(cfg), "--until-idle")
    assert r.returncode == 2 and "executor.kind" in r.stderr
    # it says what to start instead (issue 4)
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
