"""Packaging honours the ``[extraction]`` limits every destination reads tars with (DESIGN.md
I6), on the embedded pipeline: a folder of more files than ``max_members`` is split into
packages that fit, and a file larger than ``max_member_bytes`` is refused when it is packaged,
naming the file, instead of being built, shipped and refused at every destination together
with its bundle's other packages."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import select

from packhorse.config import load_config
from packhorse.db.models import Operation, PhysicalCopy, RawDataFile, RawDataPackage
from packhorse.db.session import Database
from packhorse.domain import CopyStatus, OperationKind, Status
from packhorse.errors import ConfigError
from packhorse.executors.local import LocalRunner
from packhorse.rules.availability import mark_locations
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from support import write_settled, write_site_config


def _ctx(folder: Path, **overrides: object) -> ProcessContext:
    settings = load_config(write_site_config(folder, bundle_max_wait_seconds=0, settle_seconds=0, **overrides))
    db = Database(settings.database_url)
    db.upgrade()
    c = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    mark_locations(c)
    return c


@pytest.fixture(autouse=True)
def _threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PACKHORSE_EXECUTOR__POOL", "thread")


def _archived(ctx: ProcessContext) -> dict[str, set[str]]:
    """package name -> the long-term archives holding a present copy of it."""
    lta = {ctx.topology.location_ids[n] for n in ("cologne-lta", "cornell-lta")}

    def q(s):  # type: ignore[no-untyped-def]
        return list(s.execute(select(RawDataPackage.name, PhysicalCopy.location_id)
                              .join(PhysicalCopy, PhysicalCopy.raw_data_package_id == RawDataPackage.id)
                              .where(PhysicalCopy.status == CopyStatus.PRESENT.value)))
    out: dict[str, set[str]] = {}
    for name, loc in ctx.db.read(q):
        if loc in lta:
            out.setdefault(name, set()).add(ctx.location_name(loc))
    return out


def _files_by_package(ctx: ProcessContext) -> dict[str, set[str]]:
    def q(s):  # type: ignore[no-untyped-def]
        return list(s.execute(select(RawDataPackage.name, RawDataFile.relative_path)
                              .join(RawDataFile, RawDataFile.raw_data_package_id == RawDataPackage.id)))
    out: dict[str, set[str]] = {}
    for name, path in ctx.db.read(q):
        out.setdefault(name, set()).add(path)
    return out


def _failed(ctx: ProcessContext) -> list[tuple[str, dict]]:
    return ctx.db.read(lambda s: list(s.execute(select(Operation.kind, Operation.error_context)
                                                .where(Operation.status == Status.FAILED.value))))


def test_a_folder_of_more_files_than_max_members_is_split_into_packages_that_arrive(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path / "s", extra="[extraction]\nmax_members = 7\n")  # 4 tag files + 3 payload files
    try:
        source = ctx.settings.location_path("fyst-source")
        names = {f"inst/obs/f{i:02d}.dat" for i in range(10)}
        for rel in names:
            write_settled(source / rel, rel.encode())
        LocalRunner(ctx).run(until_idle=True)
        assert _failed(ctx) == []
        packages = _files_by_package(ctx)
        assert set().union(*packages.values()) == names
        assert max(len(f) for f in packages.values()) == 3, packages
        assert _archived(ctx) == {name: {"cologne-lta", "cornell-lta"} for name in packages}
    finally:
        ctx.db.dispose()


def test_a_file_larger_than_max_member_bytes_is_refused_at_packaging_and_the_rest_arrives(tmp_path: Path) -> None:
    # (a package's tar is larger than its payload: headers, the 10 KiB record; 64 KiB holds these)
    ctx = _ctx(tmp_path / "s", max_package_bytes=32 << 10, extra=f"[extraction]\nmax_member_bytes = {64 << 10}\n")
    try:
        source = ctx.settings.location_path("fyst-source")
        write_settled(source / "inst/obs/big.dat", os.urandom(100_000))
        write_settled(source / "inst/obs/small.dat", b"small")
        write_settled(source / "inst/obs2/other.dat", b"other")
        LocalRunner(ctx).run(until_idle=True)
        failed = _failed(ctx)
        assert [kind for kind, _ in failed] == [OperationKind.RAW_DATA_PACKAGE.value], failed
        context = failed[0][1]
        assert context["error_type"] == "PackageLimitError" and context["will_retry"] is False
        assert "'inst/obs/big.dat' is 100000 bytes, more than extraction.max_member_bytes = 65536" in context["message"]
        packages = _files_by_package(ctx)
        big = next(name for name, files in packages.items() if "inst/obs/big.dat" in files)
        archived = _archived(ctx)
        assert big not in archived  # never built, never shipped
        assert {n: archived.get(n) for n in packages if n != big} == {
            n: {"cologne-lta", "cornell-lta"} for n in packages if n != big}
        assert len(packages) == 3
    finally:
        ctx.db.dispose()


def test_start_up_refuses_max_members_below_a_bag_of_one_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"extraction.max_members: 4 is less than 5"):
        load_config(write_site_config(tmp_path / "s", extra="[extraction]\nmax_members = 4\n"))
