"""Integration-test fixtures: the embedded pipeline run in this process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from packhorse.config import load_config
from packhorse.db.session import Database
from packhorse.rules.availability import mark_locations
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from support import write_site_config


@pytest.fixture
def pipeline_ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ProcessContext:
    """A three-site configuration on SQLite whose ``LocalRunner`` runs operations in threads of
    this process (``pool = "thread"``), so a test can patch and observe every step."""
    monkeypatch.setenv("PACKHORSE_EXECUTOR__POOL", "thread")
    settings = load_config(write_site_config(tmp_path / "site", bundle_max_wait_seconds=0))
    db = Database(settings.database_url)
    db.upgrade()
    c = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    mark_locations(c)  # as `packhorse init` does: every location root exists and is marked
    yield c
    db.dispose()


@pytest.fixture
def pg_db() -> Iterator[Database]:
    """An ops database of its own on the shared PostgreSQL server, migrated (skipped when the
    server is unreachable; failed with ``CI=true``)."""
    from distributed_support import postgres_database

    url, drop = postgres_database()
    db = Database(url, pool_size=2, max_overflow=2)
    db.upgrade()
    yield db
    db.dispose()
    drop()
