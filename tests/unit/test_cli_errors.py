"""Configuration refused at start: the error names the key (the processes' exit 2 is tested in
``tests/e2e/test_startup_errors.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from packhorse.config import settings_from_dict
from packhorse.errors import ConfigError


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
