"""``packhorse init`` on a fresh source that holds the instrument's files says it initialised it
(with how many files it holds), not "adopted" — adopted is for an archive or buffer root holding
an earlier deployment's objects."""

from __future__ import annotations

from pathlib import Path

import pytest

from packhorse.cli.pipeline import init
from packhorse.config import load_config
from support import write_site_config


def test_init_calls_a_fresh_source_with_data_initialised(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_site_config(tmp_path / "site")
    source = load_config(config).location_path("fyst-source")
    (source / "cam" / "obs1").mkdir(parents=True)
    for name in ("a.fits", "b.fits", "c.fits"):
        (source / "cam" / "obs1" / name).write_bytes(b"x")
    init(config=config, replace=None, site=None, adopt=None)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("location fyst-source:")]
    assert lines == [f"location fyst-source: initialised and marked at {source} (holds 3 file(s) to archive)"]


def test_init_still_adopts_an_archive_root_holding_objects(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_site_config(tmp_path / "site")
    settings = load_config(config)
    lta = next(loc.name for loc in settings.locations if loc.role.value == "long_term_archive")
    root = settings.location_path(lta)
    (root / "raw").mkdir(parents=True)
    (root / "raw" / "obs1.tar").write_bytes(b"x")
    init(config=config, replace=None, site=None, adopt=None)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(f"location {lta}:")]
    assert lines == [f"location {lta}: adopted and marked at {root} (1 object(s) kept as they are)"]
