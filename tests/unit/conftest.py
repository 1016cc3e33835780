"""Unit-test fixtures: an empty, migrated SQLite ops database per test (migrated once per run)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from packhorse.db.session import Database


@pytest.fixture(scope="session")
def migrated_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database file migrated once per test run (copied for each test: upgrade is the slow part)."""
    path = tmp_path_factory.mktemp("template") / "t.db"
    d = Database(f"sqlite:///{path}")
    d.upgrade()
    d.dispose()  # the last connection closing checkpoints the WAL into the file
    return path


@pytest.fixture
def empty_db(tmp_path: Path, migrated_file: Path) -> Database:
    """A fresh copy of the migrated database, for this test alone."""
    shutil.copyfile(migrated_file, tmp_path / "t.db")
    d = Database(f"sqlite:///{tmp_path}/t.db")
    yield d
    d.dispose()
