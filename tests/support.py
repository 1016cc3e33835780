"""Test support shared by every suite (importable as ``support``): a three-site configuration and a CLI runner.

``write_site_config(folder, **overrides)`` writes ``packhorse.toml`` for fyst → cologne,
cornell (one buffer per site, one long-term archive per destination) with test-sized timings
(a 2 s lease) and returns its path. ``run_packhorse(*args)`` runs ``packhorse`` in a
subprocess (real process, real exit code).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

SRC = Path(__file__).resolve().parents[1] / "src"

BASE_CONFIG = """\
[database]
url = "sqlite:///packhorse.db"
[executor]
kind = "local"
workers = {workers}
[[sites]]
name = "fyst"
[[sites]]
name = "cologne"
[[sites]]
name = "cornell"
[[locations]]
name = "fyst-source"
site = "fyst"
role = "source"
path = "{source}"
[[locations]]
name = "fyst-buffer"
site = "fyst"
role = "buffer"
path = "sites/fyst/buffer"
retention_seconds = 0
[[locations]]
name = "cologne-buffer"
site = "cologne"
role = "buffer"
path = "sites/cologne/buffer"
retention_seconds = 0
[[locations]]
name = "cologne-lta"
site = "cologne"
role = "long_term_archive"
path = "sites/cologne/archive"
[[locations]]
name = "cornell-buffer"
site = "cornell"
role = "buffer"
path = "sites/cornell/buffer"
retention_seconds = 0
[[locations]]
name = "cornell-lta"
site = "cornell"
role = "long_term_archive"
path = "sites/cornell/archive"
[[routes]]
source_site = "fyst"
destination_sites = ["cologne", "cornell"]
{route_extra}
[packaging]
group_depth = {group_depth}
max_package_bytes = {max_package_bytes}
settle_seconds = {settle_seconds}
bundle_target_bytes = {bundle_target_bytes}
bundle_max_wait_seconds = {bundle_max_wait_seconds}
[managers]
poll_interval_seconds = {poll_interval_seconds}
[recovery]
lease_timeout_seconds = {lease_timeout_seconds}
heartbeat_interval_seconds = {heartbeat_interval_seconds}
monitor_interval_seconds = {monitor_interval_seconds}
max_retries = {max_retries}
retry_backoff_base_seconds = {retry_backoff_base_seconds}
retry_backoff_max_seconds = {retry_backoff_max_seconds}
{extra}
"""

DEFAULTS: dict[str, Any] = dict(
    workers=2, source="source", route_extra="", group_depth=2, max_package_bytes=10 * 1024**3,
    settle_seconds=0, bundle_target_bytes=1024**3, bundle_max_wait_seconds=300, poll_interval_seconds=1,
    lease_timeout_seconds=2, heartbeat_interval_seconds=0.3, monitor_interval_seconds=0.2, max_retries=3,
    retry_backoff_base_seconds=0.05, retry_backoff_max_seconds=0.2, extra="",
)


def write_site_config(folder: Path, **overrides: Any) -> Path:
    """Write a three-site ``packhorse.toml`` into ``folder``; returns its path."""
    values = {**DEFAULTS, **overrides}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / str(values["source"])).mkdir(parents=True, exist_ok=True) if not os.path.isabs(str(values["source"])) else None
    path = folder / "packhorse.toml"
    path.write_text(BASE_CONFIG.format(**values), encoding="utf-8")
    return path



def run_packhorse(*args: str, env: dict[str, str] | None = None, timeout: float = 300,
                  cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m packhorse ARGS`` in a subprocess; returns the completed process."""
    full_env = {**os.environ, "PYTHONPATH": str(SRC), **(env or {})}
    return subprocess.run([sys.executable, "-m", "packhorse", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=cwd)


def describe_schema(engine_url: str) -> dict[str, Any]:
    """Everything the schema enforces, table by table, as the database reports it (SQLite or
    PostgreSQL): columns, keys, unique and check constraints, indexes, and under
    ``"partial_index_sql"`` the SQL of every partial index (what Alembic does not compare)."""
    from sqlalchemy import create_engine, inspect, text

    def normalize(sql: str | None) -> str:
        return re.sub(r"\s+", " ", str(sql or "")).strip()

    engine = create_engine(engine_url)
    try:
        with engine.connect() as conn:
            insp = inspect(conn)
            out: dict[str, Any] = {}
            for t in sorted(insp.get_table_names()):
                if t == "alembic_version":
                    continue
                out[t] = {
                    "columns": [(c["name"], str(c["type"]), c["nullable"]) for c in insp.get_columns(t)],
                    "pk": insp.get_pk_constraint(t)["constrained_columns"],
                    "fks": sorted((tuple(f["constrained_columns"]), f["referred_table"]) for f in insp.get_foreign_keys(t)),
                    "unique": sorted((u["name"], tuple(u["column_names"])) for u in insp.get_unique_constraints(t)),
                    "checks": sorted((c["name"], normalize(c["sqltext"])) for c in insp.get_check_constraints(t)),
                    "indexes": sorted((i["name"], tuple(i["column_names"]), bool(i["unique"])) for i in insp.get_indexes(t)),
                }
            query = ("SELECT indexdef FROM pg_indexes WHERE schemaname = 'public' AND indexdef LIKE '% WHERE %'"
                     if conn.dialect.name == "postgresql" else
                     "SELECT sql FROM sqlite_master WHERE type = 'index' AND sql LIKE '%WHERE%'")
            out["partial_index_sql"] = sorted(normalize(r[0]) for r in conn.execute(text(query)))
            return out
    finally:
        engine.dispose()


def write_settled(path: Path, data: bytes) -> None:
    """Write a source file whose mtime is a minute old (settled for any test configuration)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    old = time.time() - 60
    os.utime(path, (old, old))


def no_such_pid() -> int:
    """A pid no process has: one above the kernel's ``pid_max`` (a process that is gone,
    without starting and ending one)."""
    with open("/proc/sys/kernel/pid_max") as f:
        return int(f.read()) + 1


def best_seconds(fn: Callable[[], T], repeat: int) -> tuple[float, T]:
    """Call ``fn`` ``repeat`` times; the fastest wall time in seconds (``time.perf_counter``) and
    the last result. For cost-shape tests that compare two sizes of input (linear, not
    quadratic): the best of a few runs is the least disturbed by other work on the machine."""
    best = float("inf")
    result: Any = None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return best, result


def seed_rows(db: Any, site: str, locations: list[tuple[str, str]], packages: list[tuple[str, str]]) -> None:
    """Rows for a test's ops database (a :class:`packhorse.db.session.Database`): site ``site``
    (id 1), its data locations ``[(name, role), …]`` (ids 1, 2, … in order, disk), and raw data
    packages ``[(name, group path), …]`` (ids 1, 2, … in order, of the first location, one file
    of 10 bytes each)."""
    from packhorse.db.models import DataLocation, RawDataPackage, Site

    def tx(s: Any) -> None:
        s.add(Site(id=1, name=site))
        s.flush()
        for i, (name, role) in enumerate(locations, 1):
            s.add(DataLocation(id=i, name=name, site_id=1, role=role, storage_type="disk", uri=f"/loc{i}"))
        s.flush()
        for i, (name, group) in enumerate(packages, 1):
            s.add(RawDataPackage(id=i, name=name, group_path=group, source_location_id=1, bagging_date="2026-12-05",
                                 file_count=1, payload_bytes=10))

    db.transact(tx)


def package_at_source_buffer(ctx: Any, i: int, *, age_seconds: float = 0.0) -> int:
    """A raw data package ``inst/obsNN`` (``NN`` = ``i``) made ``age_seconds`` ago from
    ``fyst-source``, present at ``fyst-buffer`` and not bundled (``size`` 1000 + ``i`` bytes),
    in the ops database of ``ctx`` (a :class:`packhorse.runtime.context.ProcessContext` of
    :func:`write_site_config`'s sites). Returns its id."""
    import datetime as dt

    from packhorse.db.models import PhysicalCopy, RawDataPackage, utcnow
    from packhorse.domain import CopyStatus

    def tx(s: Any) -> int:
        then = utcnow() - dt.timedelta(seconds=age_seconds)
        pkg = RawDataPackage(name=f"inst/obs{i:02d}", group_path=f"inst/obs{i:02d}", bagging_date="2026-01-01",
                             file_count=1, payload_bytes=100, size=1000 + i, sha256=f"{i:064x}", created_at=then,
                             source_location_id=ctx.topology.location_ids["fyst-source"])
        s.add(pkg)
        s.flush()
        s.add(PhysicalCopy(raw_data_package_id=pkg.id, location_id=ctx.topology.location_ids["fyst-buffer"],
                           path=f"raw/inst/obs{i:02d}.tar", size=1000 + i, sha256=f"{i:064x}",
                           status=CopyStatus.PRESENT.value, created_at=then, verified_at=then))
        return pkg.id

    return ctx.db.transact(tx)


class RecordingChannel:
    """A notification channel for tests that keeps what it is sent (``got``); it takes the
    levels in ``levels`` (``None``: every level)."""

    def __init__(self, name: str = "mail", levels: set[str] | None = None) -> None:
        self.name = name
        self.levels = levels
        self.got: list[Any] = []

    def wants(self, level: str) -> bool:
        return self.levels is None or level in self.levels

    def send(self, message: Any, *, timeout: float | None = None) -> None:
        self.got.append(message)

    def abort(self) -> None:
        pass
