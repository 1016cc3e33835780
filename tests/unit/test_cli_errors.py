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
