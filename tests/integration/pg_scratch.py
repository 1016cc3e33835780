"""A scratch PostgreSQL database for a test (shared server 127.0.0.1:5432, trust auth): created
with a unique name, migrated, dropped afterwards. Skips when the server is unreachable, fails
under ``CI=true``."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text

from packhorse.db.session import Database

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def scratch_postgres(migrate: bool = True) -> Iterator[Database]:
    """Yield a :class:`Database` on a new, uniquely named PostgreSQL database (migrated unless
    ``migrate`` is false); drop it afterwards."""
    try:
        admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
        with admin.connect() as c:
            c.execute(text("SELECT 1"))
    except Exception as e:  # noqa: BLE001
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL is required in CI: {e}")
        pytest.skip(f"PostgreSQL not reachable at 127.0.0.1:5432: {e}")
    name = f"packhorse_issue7_{uuid.uuid4().hex[:12]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    db = Database(f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}")
    try:
        if migrate:
            db.upgrade()
        yield db
    finally:
        db.dispose()
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()


