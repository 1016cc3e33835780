"""The deletion policy's order, thresholds and never-rules on PostgreSQL, the production ops
database: the scenarios of ``tests/unit/test_deletion_policy.py``, collected here
again with a PostgreSQL ``database_url``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from pg_scratch import scratch_postgres  # noqa: E402
from test_deletion_policy import (  # noqa: E402,F401 (fixtures and tests collected again here)
    make_site,
    site,
    test_critical_counts_deletions_already_in_flight,
    test_emergency_takes_every_copy_with_enough_archive_copies_least_recently_used_first,
    test_pressure_never_breaks_the_safety_rules,
    test_the_stage_checks_again_before_the_bytes_go,
    test_warning_changes_nothing_but_critical_takes_the_oldest_archived_first_until_below_recovery,
)


@pytest.fixture
def database_url() -> Iterator[str]:
    """A scratch PostgreSQL database (the sites migrate it themselves)."""
    for db in scratch_postgres(migrate=False):
        url = db.engine.url.render_as_string(hide_password=False)
        db.dispose()
        yield url
