"""Fixtures of the end-to-end tests (helpers live in :mod:`e2e_helpers`)."""

from __future__ import annotations

from typing import Any

import pytest
from e2e_helpers import Pipeline


@pytest.fixture
def pipeline(site_config, cli, tmp_path):
    """Factory: ``pipeline(**config_overrides) -> Pipeline`` (config written, not yet initialised)."""

    def make(**overrides: Any) -> Pipeline:
        return Pipeline(site_config(**overrides), cli, tmp_path / "extracted")

    return make
