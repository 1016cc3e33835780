"""Shared fixtures (helpers live in ``tests/support.py``, importable as ``support``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from support import run_packhorse, write_site_config


@pytest.fixture
def site_config(tmp_path: Path):
    """Factory: ``site_config(**overrides) -> Path`` of a three-site config in ``tmp_path / "site"``."""

    def make(**overrides: Any) -> Path:
        return write_site_config(tmp_path / "site", **overrides)

    return make


@pytest.fixture
def cli():
    """Run ``packhorse`` in a subprocess: ``cli(*args, env=None) -> CompletedProcess``."""
    return run_packhorse


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on a free loopback port for the whole session (see ``s3_support``)."""
    from s3_support import start_or_skip

    server = start_or_skip()
    yield server
    server.stop()
