"""A scan registers its files in chunks of whole groups and hands each chunk's settled groups
to ``on_registered`` (packhorse.managers.scan): packaging starts while the rest of a large tree
is hashed, a group is never packaged half-registered, and a group still settling waits."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import select
from test_scan_cache import make_ctx, source, write

from packhorse.db.models import RawDataFile, RawDataPackage
from packhorse.managers import packages
from packhorse.managers import scan as scan_module
from packhorse.managers.scan import scan_all


@pytest.fixture
def ctx(tmp_path: Path):  # type: ignore[no-untyped-def]
    c = make_ctx(tmp_path / "site", settle_seconds=5)
    yield c
    c.db.dispose()


def test_each_chunk_of_whole_groups_is_registered_and_packaged_before_the_next_is_hashed(
        ctx, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(scan_module, "REGISTER_CHUNK_FILES", 3)
    root = source(ctx)
    for g in range(4):  # 4 groups of 2 settled files
        for f in range(2):
            write(root / f"inst/obs{g}/f{f}.dat", bytes([g, f]) * 10)
    write(root / "inst/obs4/old.dat", b"old")
    write(root / "inst/obs4/new.dat", b"still being written", age=0)  # obs4 settles later
    calls: list[tuple[list[str], set[str], set[str]]] = []

    def on_registered(location: str, groups: list[str]) -> None:
        # what the database holds when the chunk is handed over; then package it, as the runner does
        files = set(ctx.db.read(lambda s: list(s.scalars(select(RawDataFile.relative_path)))))
        packages.manage(ctx, {}, locations={location}, groups=groups)
        pkgs = set(ctx.db.read(lambda s: list(s.scalars(select(RawDataPackage.name)))))
        calls.append((groups, files, pkgs))

    with ThreadPoolExecutor(2) as pool:
        result = scan_all(ctx, pool, on_registered=on_registered)
    assert result.registered == 9 and result.unsettled_groups["fyst-source"] == {"inst/obs4"}
    # chunks of at least 3 files ending at a group's end: obs0+obs1 (4 files), obs2+obs3, obs4 waits
    assert [c[0] for c in calls] == [["inst/obs0", "inst/obs1"], ["inst/obs2", "inst/obs3"]]
    first_files, first_pkgs = calls[0][1], calls[0][2]
    assert first_files == {f"inst/obs{g}/f{f}.dat" for g in (0, 1) for f in (0, 1)}  # the rest not yet hashed
    assert first_pkgs == {"inst/obs0", "inst/obs1"}  # packaged while the scan went on
    # the group still settling: its settled file registered (9 = 8 + old.dat), no package
    assert "inst/obs4/old.dat" in set(ctx.db.read(lambda s: list(s.scalars(select(RawDataFile.relative_path)))))
    assert set(ctx.db.read(lambda s: list(s.scalars(select(RawDataPackage.name))))) == {
        f"inst/obs{g}" for g in range(4)}


def test_without_a_callback_a_scan_registers_everything_as_before(ctx) -> None:  # type: ignore[no-untyped-def]
    root = source(ctx)
    for g in range(3):
        write(root / f"inst/obs{g}/a.dat", b"a" * (g + 1))
    with ThreadPoolExecutor(2) as pool:
        assert scan_all(ctx, pool).registered == 3
    assert not ctx.db.read(lambda s: list(s.scalars(select(RawDataPackage.name))))  # the cycle packages them


def test_files_named_like_packhorse_s_own_are_reported_not_left_out(ctx) -> None:  # type: ignore[no-untyped-def]
    # found by a new-user trial: a source file named like a partial write of packhorse's, or
    # put in its reserved folder, was neither archived nor listed as skipped (I1)
    root = source(ctx)
    write(root / "inst/obs1/good.dat", b"good")
    write(root / "inst/obs1/.raw.0123456789ab.packhorse-partial", b"the instrument's")
    write(root / "_packhorse/notes.txt", b"an operator's note")
    with ThreadPoolExecutor(2) as pool:
        result = scan_all(ctx, pool)
    assert result.registered == 1
    reasons = dict(result.skipped)
    assert "reserved suffix" in reasons["inst/obs1/.raw.0123456789ab.packhorse-partial"]
    assert "identity marker" in reasons["_packhorse/notes.txt"]
    assert "_packhorse/location.json" not in reasons  # the marker itself is packhorse's own


def test_packaging_ten_groups_costs_the_statements_of_one(ctx) -> None:  # type: ignore[no-untyped-def]
    """A site across a long link from the database pays a round trip per statement: the
    packages of a chunk of groups (new ones, and one packaged before) are made in
    a fixed handful of statements, whatever the number of groups, with the names and file
    assignments a group at a time would give."""
    from sqlalchemy import event

    root = source(ctx)
    for g in range(10):
        for f in range(3):
            write(root / f"inst/obs{g}/f{f}.dat", bytes([g, f]) * 10)
    with ThreadPoolExecutor(2) as pool:
        scan_all(ctx, pool)
    assert packages.manage(ctx, {}, groups=["inst/obs0"]) == 1  # packaged before: the next is +2
    write(root / "inst/obs0/late.dat", b"late")
    with ThreadPoolExecutor(2) as pool:
        scan_all(ctx, pool)
    statements: list[str] = []
    event.listen(ctx.db.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    created = packages.manage(ctx, {})
    # SQLite answers an INSERT … RETURNING a row at a time (in the process: no round trip);
    # PostgreSQL gets the packages in one statement. Everything else is a fixed handful: the
    # transactions, the chunk's files, the names in use (and the follow-up of the one group
    # packaged before), one UPDATE of every group's files, one INSERT of the operations.
    others = [" ".join(q.split())[:60] for q in statements if not q.lstrip().startswith("INSERT INTO raw_data_packages")]
    assert created == 10 and len(others) <= 9, others
    names = set(ctx.db.read(lambda s: list(s.scalars(select(RawDataPackage.name)))))
    assert {"inst/obs0", "inst/obs0+2", "inst/obs1", "inst/obs9"} <= names and len(names) == 11
    unassigned = ctx.db.read(lambda s: list(s.scalars(select(RawDataFile.id).where(
        RawDataFile.raw_data_package_id.is_(None)))))
    assert unassigned == []
