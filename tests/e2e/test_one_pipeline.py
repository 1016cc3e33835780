"""One pipeline for both modes, end to end: the same scripted scenario — archive a source tree,
then let a month pass and flip one byte in an archive copy, which the fixity audit finds and
repairs — run in embedded mode (``packhorse run --until-idle`` on SQLite) and in distributed
mode (PostgreSQL, Redis, one worker per site) with **two managers and two monitors**, the
first manager SIGKILLed in the middle of the run. Both must create the same operations (same
kinds, subjects, destinations, all COMPLETED), so two managers made no duplicate bundle,
transfer or deletion and a killed manager left nothing undone; the repaired copy holds the
original bytes.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from e2e_helpers import Pipeline, assert_clean_finish
from sqlalchemy import create_engine, select, text
from sqlalchemy.orm import Session

from distributed_support import Cluster, postgres_database, redis_url, wait_for
from packhorse.db.models import DataLocation, DataTransferPackage, Operation, PhysicalCopy, RawDataPackage
from packhorse.domain import CopyStatus, OperationKind
from support import write_site_config

pytestmark = [pytest.mark.slow, pytest.mark.long]

GROUPS = 3
#: a bundle per raw package (every package reaches the bundle target alone): what one manager
#: makes is then known exactly, whatever the timing
CONFIG = dict(bundle_target_bytes=1, bundle_max_wait_seconds=1, poll_interval_seconds=0.5)
FLIPPED = "raw/inst/obs01.tar"


def _write_source(root: Path) -> None:
    rng = random.Random(7)  # the same bytes in both modes
    for g in range(GROUPS):
        for i in range(2):
            p = root / f"inst/obs{g:02d}/frame_{i:02d}.fits"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(rng.randbytes(64_000 + 1000 * g + i))
            then = time.time() - 120
            os.utime(p, (then, then))


def _engine(url: str):  # type: ignore[no-untyped-def]
    return create_engine(url)


def _operations(url: str) -> Counter[tuple[str, str, str, str]]:
    """Every operation as (kind, status, subject, where), the subject by name: a raw package's
    name, a bundle's sorted package names, or a copy's location and subject."""
    engine = _engine(url)
    try:
        with Session(engine) as s:
            locs = {l.id: l.name for l in s.scalars(select(DataLocation))}
            pkgs = {p.id: p for p in s.scalars(select(RawDataPackage))}
            carried: dict[int, list[str]] = {}
            for p in pkgs.values():
                if p.data_transfer_package_id is not None:
                    carried.setdefault(p.data_transfer_package_id, []).append(p.name)
            copies = {c.id: c for c in s.scalars(select(PhysicalCopy))}

            def subject(rdp: int | None, dtp: int | None) -> str:
                if rdp is not None:
                    return pkgs[rdp].name
                return "bundle[" + ",".join(sorted(carried.get(dtp or -1, []))) + "]"

            out: Counter[tuple[str, str, str, str]] = Counter()
            for o in s.scalars(select(Operation)):
                if o.physical_copy_id is not None:
                    c = copies[o.physical_copy_id]
                    what = subject(c.raw_data_package_id, c.data_transfer_package_id) + "@" + locs[c.location_id]
                else:
                    what = subject(o.raw_data_package_id, o.data_transfer_package_id)
                where = locs.get(o.destination_location_id or -1) or locs.get(o.source_location_id or -1) or "-"
                out[(o.kind, o.status, what, where)] += 1
            return out
    finally:
        engine.dispose()


def _age_archive_copies(url: str) -> None:
    """Let a month pass for the fixity audit: every archive copy was last verified 31 days ago."""
    engine = _engine(url)
    try:
        with engine.begin() as c:
            then = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=31)
            c.execute(text("UPDATE physical_copies SET verified_at = :t, created_at = :t WHERE location_id IN "
                           "(SELECT id FROM data_locations WHERE role = 'long_term_archive')"), {"t": then})
    finally:
        engine.dispose()


def _flip_byte(root: Path) -> bytes:
    path = root / "sites/cornell/archive" / FLIPPED
    good = path.read_bytes()
    os.chmod(path, 0o644)
    rotten = bytearray(good)
    rotten[len(rotten) // 2] ^= 0x01
    path.write_bytes(bytes(rotten))
    return good


def _repaired(url: str) -> bool:
    engine = _engine(url)
    try:
        with Session(engine) as s:
            ops = s.execute(select(Operation.status).where(Operation.kind == OperationKind.FIXITY_CHECK.value)).all()
            corrupt = s.scalar(select(PhysicalCopy.id).where(PhysicalCopy.status == CopyStatus.CORRUPT.value))
            return len(ops) == GROUPS * 2 and {o.status for o in ops} == {"COMPLETED"} and corrupt is not None
    finally:
        engine.dispose()


def _bundles(url: str) -> int:
    engine = _engine(url)
    try:
        with Session(engine) as s:
            return len(s.scalars(select(DataTransferPackage.id)).all())
    finally:
        engine.dispose()


def _check_repair(root: Path, good: bytes) -> None:
    path = root / "sites/cornell/archive" / FLIPPED
    assert hashlib.sha256(path.read_bytes()).hexdigest() == hashlib.sha256(good).hexdigest()


def _embedded(site_config, cli, tmp_path: Path) -> Counter[tuple[str, str, str, str]]:
    p = Pipeline(site_config(**CONFIG), cli, tmp_path / "x-embedded")
    _write_source(p.source)
    p.init()
    p.run()
    assert_clean_finish(p.status())
    url = f"sqlite:///{p.root / 'packhorse.db'}"
    good = _flip_byte(p.root)
    _age_archive_copies(url)
    p.run()
    assert _repaired(url)
    _check_repair(p.root, good)
    return _operations(url)


def test_same_scenario_same_operations_embedded_and_with_two_managers_and_two_monitors(
        site_config, cli, tmp_path: Path, tmp_path_factory) -> None:
    embedded = _embedded(site_config, cli, tmp_path)

    other = tmp_path_factory.mktemp("distributed")
    config = write_site_config(other / "site", **CONFIG)
    _write_source(config.parent / "source")
    db_url, drop = postgres_database()
    cluster = Cluster(config, db_url, redis_url())
    try:
        cluster.init()
        for site in ("fyst", "cologne", "cornell"):
            cluster.start_worker(site)
        for i in (1, 2):
            cluster.start(f"manager-{i}", "manager", "--instance", str(i))
            cluster.start(f"monitor-{i}", "monitor", "--instance", str(i))
        # kill the first manager in the middle of the run: once bundling has started
        wait_for(lambda: _bundles(db_url) >= 1, 180, "the first bundle")
        first = cluster.procs["manager-1"]
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
        st = cluster.wait_finished(300, packages=GROUPS)
        assert_clean_finish(st)
        good = _flip_byte(config.parent)
        _age_archive_copies(db_url)
        wait_for(lambda: _repaired(db_url), 180, "the fixity audit to find and repair the flipped byte")
        _check_repair(config.parent, good)
        distributed = _operations(db_url)
    finally:
        cluster.stop_all()
        drop()

    assert distributed == embedded
    kinds = Counter(k for (k, *_), n in embedded.items() for _ in range(n))
    # one manager's worth: a bundle per package, shipped to and unpacked at two sites, every
    # buffer copy deleted once (each of the three buffers held every package and every bundle),
    # every archive copy audited once
    assert kinds == {"raw_data_package": GROUPS, "data_transfer_package": GROUPS, "transfer": 2 * GROUPS,
                     "unpack": 2 * GROUPS, "long_term_archive": 2 * GROUPS, "deletion": 3 * 2 * GROUPS,
                     "fixity_check": 2 * GROUPS}
