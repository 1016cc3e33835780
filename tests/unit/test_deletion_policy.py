"""The deletion policy under disk pressure: usage figures are injected through the
usage provider; the order, the thresholds and every "never" are checked on the operations the
deletion manager creates and on what the deletion stage does to the bytes."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from fault_hooks import FaultPlan
from packhorse.config import load_config
from packhorse.db.models import (
    DataTransferPackage,
    FailureEvent,
    Operation,
    PhysicalCopy,
    RawDataPackage,
    utcnow,
)
from packhorse.db.session import Database
from packhorse.domain import OperationKind, Status
from packhorse.engine.worker import Outcome, execute_deletions, execute_operation
from packhorse.managers import deletions
from packhorse.operations.lifecycle import create_operation, dedup_key
from packhorse.rules.availability import mark_locations
from packhorse.rules.disk_usage import measure_all
from packhorse.rules.policy import deletion_blockers, deletion_blockers_many
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from packhorse.storage.usage import Usage
from support import write_site_config

TOTAL = 10_000
DAY = dt.timedelta(days=1)


#: the sites' lease: long enough that a loaded machine (a renewal held up for seconds) never
#: costs a test its claim; the test of a deletion outliving its lease asks for a short one. With
#: the suite's 2 s lease a batch's completion was once refused on a machine at load 10 (a
#: renewal 3.2 s late).
LEASE_SECONDS = 30.0


class Site:
    """A three-site configuration (fyst -> cologne, cornell), its database and helpers."""

    def __init__(self, tmp_path: Path, *, retention: int = 604800, extra: str = "",
                 database_url: str | None = None, lease_seconds: float = LEASE_SECONDS) -> None:
        cfg = write_site_config(tmp_path / "site", extra=extra, lease_timeout_seconds=lease_seconds,
                                heartbeat_interval_seconds=min(1.0, lease_seconds / 6))
        text = cfg.read_text().replace("retention_seconds = 0", f"retention_seconds = {retention}")
        if database_url:
            text = text.replace('url = "sqlite:///packhorse.db"', f'url = "{database_url}"')
        cfg.write_text(text)
        self.settings = load_config(cfg)
        self.db = Database(self.settings.database_url)
        self.db.upgrade()
        self.ctx = ProcessContext(settings=self.settings, db=self.db, topology=sync_topology(self.db, self.settings))
        mark_locations(self.ctx)  # as `packhorse init` does: every location root exists and is marked
        self.ids = self.ctx.topology.location_ids
        self.usage: dict[str, Usage] = {}
        self.hooks = FaultPlan([], usage=lambda name, root: self.usage.get(name, Usage(TOTAL, 0, TOTAL)))
        self.ctx.hooks = self.hooks  # simulated disk figures come in through the context's hooks

    def package(self, name: str, *, archived_days_ago: float | None, size: int = 1000,
                buffer: str = "fyst-buffer", archives: dict[str, str] | None = None,
                used_days_ago: float | None = None) -> tuple[int, int]:
        """A raw data package with a verified copy (and its bytes) at ``buffer`` and archive
        copies ``{location: "verified"|"unverified"|"corrupt"|"missing"}``; returns
        (package id, buffer copy id)."""
        archives = {"cologne-lta": "verified", "cornell-lta": "verified"} if archives is None else archives
        now = utcnow()
        key = f"raw/{name}.tar"
        path = self.settings.location_path(buffer) / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)

        def tx(s: Session) -> tuple[int, int]:
            pkg = RawDataPackage(name=name, group_path=name, source_location_id=self.ids["fyst-source"],
                                 created_at=now - 30 * DAY, bagging_date="2026-01-01", file_count=1,
                                 payload_bytes=size, size=size, sha256="a" * 64,
                                 archived_at=None if archived_days_ago is None else now - archived_days_ago * DAY)
            s.add(pkg)
            s.flush()
            used = now - (used_days_ago if used_days_ago is not None else 20) * DAY
            copy = PhysicalCopy(raw_data_package_id=pkg.id, location_id=self.ids[buffer], path=key, size=size,
                                sha256="a" * 64, status="present", created_at=used, verified_at=used)
            s.add(copy)
            for loc, state in archives.items():
                s.add(PhysicalCopy(raw_data_package_id=pkg.id, location_id=self.ids[loc], path=key, size=size,
                                   sha256="a" * 64, status="present" if state in ("verified", "unverified") else state,
                                   created_at=now - 29 * DAY,
                                   verified_at=None if state == "unverified" else now - 29 * DAY))
            s.flush()
            return pkg.id, copy.id

        return self.db.transact(tx)

    def pressure(self, location: str, percent: float) -> None:
        used = int(TOTAL * percent / 100)
        self.usage[location] = Usage(TOTAL, used, TOTAL - used)
        measure_all(self.db, self.settings, self.ids, hooks=self.hooks)

    def deletion_order(self) -> list[int]:
        """Copy ids of the deletion operations, in creation (= dispatch) order."""
        deletions.manage(self.ctx)
        return self.db.read(lambda s: list(s.scalars(
            select(Operation.physical_copy_id).where(Operation.kind == OperationKind.DELETION.value)
            .order_by(Operation.id))))

    def add_operation(self, kind: OperationKind, subject: str, **kw: Any) -> int:
        def tx(s: Session) -> int:
            op = create_operation(s, kind=kind, dedup_key=dedup_key(kind, subject), site_id=self.ctx.topology.site_ids["fyst"],
                                  max_retries=3, **kw)
            assert op is not None
            return op.id

        return self.db.transact(tx)


@pytest.fixture
def database_url() -> str | None:
    """The ops database of the sites (``None``: a SQLite file; the PostgreSQL run overrides it)."""
    return None


@pytest.fixture
def make_site(tmp_path: Path, database_url: str | None):
    """Factory: ``make_site(extra="", retention=604800, lease_seconds=LEASE_SECONDS) -> Site``;
    cleaned up after the test."""
    made: list[Site] = []

    def make(extra: str = "", retention: int = 604800, lease_seconds: float = LEASE_SECONDS) -> Site:
        made.append(Site(tmp_path / f"s{len(made)}", extra=extra, database_url=database_url, retention=retention,
                         lease_seconds=lease_seconds))
        return made[-1]

    yield make
    for s in made:
        s.db.dispose()


@pytest.fixture
def site(make_site):  # type: ignore[no-untyped-def]
    return make_site()


def test_below_warning_only_copies_past_their_retention_go(site: Site) -> None:
    _, old = site.package("old", archived_days_ago=8)
    site.package("recent", archived_days_ago=1)
    site.package("unarchived", archived_days_ago=None)
    site.pressure("fyst-buffer", 50)
    assert site.deletion_order() == [old]
    created, wait = deletions.manage(site.ctx)
    assert created == 0 and wait is not None and 5.9 * 86400 < wait < 6.1 * 86400


def test_warning_changes_nothing_but_critical_takes_the_oldest_archived_first_until_below_recovery(site: Site) -> None:
    copies = [site.package(f"p{i}", archived_days_ago=days, size=1000)[1] for i, days in enumerate([2, 4, 1, 3, 5])]
    site.package("unarchived", archived_days_ago=None)
    site.pressure("fyst-buffer", 80)  # warning: retention still holds
    assert site.deletion_order() == []
    site.pressure("fyst-buffer", 90)  # critical: 9,000 of 10,000 used, recovery below 6,000
    # oldest archived first (5, 4, 3 days ago); after three copies usage would be 6,000 -> 3,000 more would be 60 %,
    # which is not below 60 %: a fourth goes, then it stops (5,000 = 50 %)
    assert site.deletion_order() == [copies[4], copies[1], copies[3], copies[0]]


def test_critical_counts_deletions_already_in_flight(site: Site) -> None:
    copies = [site.package(f"p{i}", archived_days_ago=5 - i, size=1000)[1] for i in range(4)]
    site.pressure("fyst-buffer", 66)  # nothing happens yet
    assert site.deletion_order() == []
    site.pressure("fyst-buffer", 86)
    assert site.deletion_order() == copies[:3]  # 8,600 -> 5,600
    site.pressure("fyst-buffer", 86)  # deletions not yet run: the monitor still sees 86 %
    assert site.deletion_order() == copies[:3]  # no more: the pending ones already bring it below 60 %


def test_emergency_takes_every_copy_with_enough_archive_copies_least_recently_used_first(make_site) -> None:
    site = make_site("[deletion]\narchive_copies_required = 1\n")
    # one verified archive copy of two (enough with archive_copies_required = 1), not "archived"
    a = site.package("a", archived_days_ago=None, used_days_ago=1, archives={"cologne-lta": "verified"})[1]
    b = site.package("b", archived_days_ago=3, used_days_ago=9)[1]
    c = site.package("c", archived_days_ago=None, used_days_ago=5, archives={"cornell-lta": "verified"})[1]
    site.package("none", archived_days_ago=None, archives={"cologne-lta": "unverified"})
    site.pressure("fyst-buffer", 90)
    assert site.deletion_order() == [b]  # critical: only archived copies
    # an archive operation read "c" from the buffer half a day ago: now it is the most recently used
    pkg_c = site.db.read(lambda s: s.get(PhysicalCopy, c).raw_data_package_id)
    read_c = site.add_operation(OperationKind.LONG_TERM_ARCHIVE, "c", raw_data_package_id=pkg_c,
                                source_location_id=site.ids["fyst-buffer"])

    def finished(s: Session) -> None:
        op = s.get(Operation, read_c)
        op.status, op.finished_at = Status.COMPLETED.value, utcnow() - DAY / 2  # type: ignore[union-attr]

    site.db.transact(finished)
    site.pressure("fyst-buffer", 97)  # emergency: least recently used first, down below 60 %
    assert site.deletion_order() == [b, a, c]


def test_emergency_stops_once_usage_would_fall_below_recovery(site: Site) -> None:
    copies = [site.package(f"p{i}", archived_days_ago=2, used_days_ago=10 - i, size=1500)[1] for i in range(5)]
    site.pressure("fyst-buffer", 96)  # 9,600 -> 8,100 -> 6,600 -> 5,100: three copies
    assert site.deletion_order() == copies[:3]


def test_pressure_never_breaks_the_safety_rules(make_site) -> None:
    site = make_site("[deletion]\narchive_copies_required = 1\n")
    no_archive = site.package("no-archive", archived_days_ago=None, archives={"cologne-lta": "unverified"})
    corrupt = site.package("rotten", archived_days_ago=10,
                           archives={"cologne-lta": "corrupt", "cornell-lta": "verified"})
    missing = site.package("gone", archived_days_ago=10,
                           archives={"cologne-lta": "verified", "cornell-lta": "missing"})
    busy = site.package("busy", archived_days_ago=10)
    waiting = site.package("waiting", archived_days_ago=10)
    ok = site.package("ok", archived_days_ago=10)
    # an archive operation reading "busy" from the buffer is running; a transfer of the bundle
    # carrying "waiting" failed once and waits for its retry backoff
    site.add_operation(OperationKind.LONG_TERM_ARCHIVE, "busy", raw_data_package_id=busy[0],
                       source_location_id=site.ids["fyst-buffer"])

    def bundle(s: Session) -> int:
        dtp = DataTransferPackage(name="bundle-1", source_site_id=site.ctx.topology.site_ids["fyst"],
                                  bagging_date="2026-01-01", package_count=1)
        s.add(dtp)
        s.flush()
        s.get(RawDataPackage, waiting[0]).data_transfer_package_id = dtp.id  # type: ignore[union-attr]
        return dtp.id

    dtp_id = site.db.transact(bundle)
    t = site.add_operation(OperationKind.TRANSFER, "bundle-1", data_transfer_package_id=dtp_id,
                           source_location_id=site.ids["fyst-buffer"],
                           destination_location_id=site.ids["cologne-buffer"])

    def backoff(s: Session) -> None:
        op = s.get(Operation, t)
        op.retry_count, op.not_before = 1, utcnow() + dt.timedelta(seconds=300)  # type: ignore[union-attr]

    site.db.transact(backoff)
    site.pressure("fyst-buffer", 99)
    assert site.deletion_order() == [ok[1]]
    reasons = site.db.read(lambda s: {name: deletion_blockers(s, site.ctx, s.get(PhysicalCopy, c))
                                      for name, (_, c) in [("no-archive", no_archive), ("rotten", corrupt),
                                                           ("gone", missing), ("busy", busy),
                                                           ("waiting", waiting)]})
    assert any("0 of 1 required verified archive copies" in r for r in reasons["no-archive"])
    assert any("last verified copy" in r for r in reasons["no-archive"])
    assert any("is corrupt (failed its last fixity check)" in r for r in reasons["rotten"])
    assert any("is missing (failed its last fixity check)" in r for r in reasons["gone"])
    assert any("long_term_archive operation" in r and "PENDING" in r for r in reasons["busy"])
    assert any(f"transfer operation {t} (PENDING)" in r for r in reasons["waiting"])
    # the rules of many copies at once (the manager's batch) are each copy's own rules
    def bundle_copy(s: Session) -> None:
        s.add(PhysicalCopy(data_transfer_package_id=dtp_id, location_id=site.ids["fyst-buffer"], path="b.tar",
                           size=1, sha256="b" * 64, status="present", verified_at=utcnow()))

    site.db.transact(bundle_copy)
    every = site.db.read(lambda s: {c.id: deletion_blockers(s, site.ctx, c) for c in s.scalars(select(PhysicalCopy))})
    assert site.db.read(lambda s: deletion_blockers_many(s, site.ctx, list(s.scalars(select(PhysicalCopy))))) == every
    assert len(every) == 18 and sum(1 for r in every.values() if not r) == 1  # "ok" alone may go
    # archive copies are never candidates
    archive_copies = site.db.read(lambda s: list(s.scalars(select(PhysicalCopy.id).where(
        PhysicalCopy.location_id == site.ids["cologne-lta"]))))
    assert not set(archive_copies) & set(site.deletion_order())


def _copy(site: Site, copy_id: int) -> PhysicalCopy:
    return site.db.read(lambda s: s.get(PhysicalCopy, copy_id))


def test_the_stage_checks_again_before_the_bytes_go(site: Site) -> None:
    pkg, copy = site.package("late-trouble", archived_days_ago=10)
    assert site.deletion_order() == [copy]
    op = site.db.read(lambda s: s.scalar(select(Operation.id).where(Operation.physical_copy_id == copy)))
    # after the operation was created, an operation starts reading the copy: it waits, not deleted
    other = site.add_operation(OperationKind.LONG_TERM_ARCHIVE, "again", raw_data_package_id=pkg,
                               source_location_id=site.ids["fyst-buffer"])
    assert execute_operation(site.ctx, op, "w1") is Outcome.DEFERRED
    assert _copy(site, copy).status == "present"
    assert (site.settings.location_path("fyst-buffer") / "raw/late-trouble.tar").exists()
    site.db.transact(lambda s: setattr(s.get(Operation, other), "status", Status.COMPLETED.value))
    # then the fixity audit finds an archive copy corrupt: not safe yet, never a permanent failure
    site.db.transact(lambda s: s.execute(
        PhysicalCopy.__table__.update().where(PhysicalCopy.raw_data_package_id == pkg,
                                              PhysicalCopy.location_id == site.ids["cornell-lta"])
        .values(status="corrupt")))
    site.db.transact(lambda s: setattr(s.get(Operation, op), "not_before", None))
    assert execute_operation(site.ctx, op, "w1") is Outcome.DEFERRED
    assert _copy(site, copy).status == "present"
    assert (site.settings.location_path("fyst-buffer") / "raw/late-trouble.tar").exists()
    row = site.db.read(lambda s: s.get(Operation, op))
    assert (row.status, row.retry_count) == ("PENDING", 0) and row.not_before is not None
    assert row.error_context["waiting"] == "deletion_rule" and "corrupt" in row.error_context["message"]
    assert site.db.read(lambda s: s.query(FailureEvent).filter(FailureEvent.operation_id == op).count()) == 0
    # a long backoff (set here, so the test does not depend on the clock): while the rule does
    # not hold, the manager leaves it waiting
    later = utcnow() + dt.timedelta(hours=1)
    site.db.transact(lambda s: setattr(s.get(Operation, op), "not_before", later))
    deletions.manage(site.ctx)
    assert site.db.read(lambda s: s.get(Operation, op).not_before) == later
    # the archive copy repaired: the manager makes it due at once, and it deletes
    site.db.transact(lambda s: s.execute(
        PhysicalCopy.__table__.update().where(PhysicalCopy.raw_data_package_id == pkg,
                                              PhysicalCopy.location_id == site.ids["cornell-lta"])
        .values(status="present")))
    assert deletions.wake_safe_deletions(site.ctx) == 1
    assert execute_operation(site.ctx, op, "w1") is Outcome.COMPLETED
    assert _copy(site, copy).status == "deleted"
    assert not (site.settings.location_path("fyst-buffer") / "raw/late-trouble.tar").exists()
    assert site.db.read(lambda s: s.get(Operation, op).error_context) is None


def test_a_slow_deletion_keeps_its_claim_and_two_deleters_delete_once(make_site, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
                                                                     tmp_path: Path) -> None:
    """The lease is 2 s; the deletion pauses 3 s with its bytes still there: the heartbeat renews
    the claim, so it is not stalled, and a second deleter started meanwhile does nothing."""
    site = make_site(lease_seconds=2)
    _, copy = site.package("slow", archived_days_ago=10)
    assert site.deletion_order() == [copy]
    op = site.db.read(lambda s: s.scalar(select(Operation.id).where(Operation.physical_copy_id == copy)))
    marker = tmp_path / "deleting"
    site.hooks.plan = [{"point": "deletion.delete", "action": "pause", "seconds": 3, "marker": str(marker)}]
    results: list[Outcome] = []
    first = threading.Thread(target=lambda: results.append(execute_operation(site.ctx, op, "deleter-1")))
    first.start()
    while not marker.exists():
        assert first.is_alive()
        threading.Event().wait(0.02)
    threading.Event().wait(2.5)  # longer than the lease: only the heartbeat keeps it
    second = execute_operation(site.ctx, op, "deleter-2")
    first.join(30)
    assert second is Outcome.SKIPPED
    assert results == [Outcome.COMPLETED]
    row = site.db.read(lambda s: s.get(Operation, op))
    assert (row.status, row.attempt, row.stall_count) == ("COMPLETED", 1, 0)
    assert _copy(site, copy).status == "deleted"
    assert not (site.settings.location_path("fyst-buffer") / "raw/slow.tar").exists()
    assert execute_operation(site.ctx, op, "deleter-3") is Outcome.SKIPPED


def test_deletions_run_together_each_with_its_own_outcome(site: Site) -> None:
    """A batch (benchmark (b): the database work of one for many small deletions):
    every copy the rules allow goes and its operation completes; a copy the rules block stays
    and only its operation waits (handed back PENDING, never FAILED: while an operation still
    reads it, and while an archive copy is corrupt); an operation already done is skipped."""
    made = {name: site.package(name, archived_days_ago=10) for name in ("a", "b", "busy", "rotten", "c")}
    assert sorted(site.deletion_order()) == sorted(c for _, c in made.values())
    ops = site.db.read(lambda s: {c: i for i, c in s.execute(select(Operation.id, Operation.physical_copy_id))})
    site.add_operation(OperationKind.LONG_TERM_ARCHIVE, "busy", raw_data_package_id=made["busy"][0],
                       source_location_id=site.ids["fyst-buffer"])
    site.db.transact(lambda s: s.execute(
        PhysicalCopy.__table__.update().where(PhysicalCopy.raw_data_package_id == made["rotten"][0],
                                              PhysicalCopy.location_id == site.ids["cornell-lta"])
        .values(status="corrupt")))
    done = ops[made["c"][1]]
    assert execute_operation(site.ctx, done, "w0") is Outcome.COMPLETED
    order = [ops[made[n][1]] for n in ("a", "busy", "b", "rotten", "c")]
    outcomes = execute_deletions(site.ctx, order, "w1")
    assert outcomes == [Outcome.COMPLETED, Outcome.DEFERRED, Outcome.COMPLETED, Outcome.DEFERRED, Outcome.SKIPPED]
    buffer = site.settings.location_path("fyst-buffer")
    for name, gone in (("a", True), ("b", True), ("c", True), ("busy", False), ("rotten", False)):
        assert (buffer / f"raw/{name}.tar").exists() is not gone, name
        assert _copy(site, made[name][1]).status == ("deleted" if gone else "present"), name
    rows = site.db.read(lambda s: {i: (st, a) for i, st, a in s.execute(
        select(Operation.id, Operation.status, Operation.attempt).where(Operation.id.in_(order)))})
    assert [rows[i] for i in order] == [("COMPLETED", 1), ("PENDING", 1), ("COMPLETED", 1), ("PENDING", 1),
                                        ("COMPLETED", 1)]
    ctx = site.db.read(lambda s: s.get(Operation, ops[made["rotten"][1]]).error_context)
    assert ctx["error_type"] == "DeletionNotSafeError" and "corrupt" in ctx["message"]
    assert ctx["waiting"] == "deletion_rule"


def test_a_stale_deletion_in_a_batch_records_nothing_for_itself_alone(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    # between the marks and the completion another attempt takes one of the operations over:
    # its completion is refused (the fencing token moved on), the other one completes
    made = {name: site.package(name, archived_days_ago=10) for name in ("x", "y")}
    site.deletion_order()
    ops = site.db.read(lambda s: {c: i for i, c in s.execute(select(Operation.id, Operation.physical_copy_id))})
    x, y = ops[made["x"][1]], ops[made["y"][1]]
    import packhorse.stages.deletion as stage

    real = stage.delete_bytes

    def takeover(work, copy):  # type: ignore[no-untyped-def]
        real(work, copy)
        if work.op.id == x:
            site.db.transact(lambda s: setattr(s.get(Operation, x), "attempt", 7))

    monkeypatch.setattr(stage, "delete_bytes", takeover)
    assert execute_deletions(site.ctx, [x, y], "w1") == [Outcome.STALE, Outcome.COMPLETED]
    assert _copy(site, made["y"][1]).status == "deleted"
    assert _copy(site, made["x"][1]).status == "deletion_pending"  # the current attempt finishes it
    assert site.db.read(lambda s: s.get(Operation, x).status) == "IN_PROGRESS"


def test_a_fault_of_one_copy_in_a_batch_fails_that_deletion_alone(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    # the batch's one pass over the rules meets a fault that is one copy's (not the database's):
    # each copy is then checked on its own, so the others are deleted and only that one's
    # operation fails (and is retried), as when every deletion ran alone
    made = {name: site.package(name, archived_days_ago=10) for name in ("x", "y", "z")}
    site.deletion_order()
    ops = site.db.read(lambda s: {c: i for i, c in s.execute(select(Operation.id, Operation.physical_copy_id))})
    import packhorse.rules.policy as policy

    real = policy.deletion_blockers_many
    bad_copy = made["y"][1]

    def faulty(session, ctx, copies, **kw):  # type: ignore[no-untyped-def]
        if any(c.id == bad_copy for c in copies):
            raise RuntimeError(f"copy {bad_copy}: a fault of this copy alone")
        return real(session, ctx, copies, **kw)

    monkeypatch.setattr(policy, "deletion_blockers_many", faulty)
    order = [ops[made[n][1]] for n in ("x", "y", "z")]
    assert execute_deletions(site.ctx, order, "w1") == [Outcome.COMPLETED, Outcome.RETRY, Outcome.COMPLETED]
    assert [_copy(site, made[n][1]).status for n in ("x", "y", "z")] == ["deleted", "present", "deleted"]
    buffer = site.settings.location_path("fyst-buffer")
    assert [(buffer / f"raw/{n}.tar").exists() for n in ("x", "y", "z")] == [False, True, False]
    from packhorse.db.models import FailureEvent

    assert site.db.read(lambda s: [(e.operation_id, e.error_type) for e in s.scalars(select(FailureEvent))]) == [
        (ops[bad_copy], "RuntimeError")]


def _package_reads(site: Site, fn: Any, about: str = "FROM raw_data_packages") -> int:
    """How many statements containing ``about`` (reading ``raw_data_packages``, by default)
    ``fn()`` makes."""
    from sqlalchemy import event

    seen: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if about in statement:
            seen.append(statement)

    event.listen(site.db._engine, "before_cursor_execute", count)
    try:
        fn()
    finally:
        event.remove(site.db._engine, "before_cursor_execute", count)
    return len(seen)


def test_a_batch_reads_its_packages_once_whatever_its_size(make_site) -> None:
    # the rules of every copy in the manager's batch and in a batch of deletions find the
    # packages loaded once (not one query per copy: the preloaded objects must stay referenced,
    # the session's identity map is weak)
    reads = {}
    for n in (1, 6):
        site = make_site()
        for i in range(n):
            site.package(f"p{i}", archived_days_ago=10)
        reads[n, "manager"] = _package_reads(site, site.deletion_order)
        ops = site.db.read(lambda s: list(s.scalars(select(Operation.id).where(
            Operation.kind == OperationKind.DELETION.value))))
        assert len(ops) == n
        reads[n, "deletions"] = _package_reads(site, lambda: execute_deletions(site.ctx, ops, "w"))
    assert reads[6, "manager"] == reads[1, "manager"], reads
    assert reads[6, "deletions"] == reads[1, "deletions"], reads


def test_a_batch_of_deletions_checks_every_rule_in_statements_that_do_not_grow_with_it(make_site) -> None:
    # the rules of a worker's batch are checked in one pass (mark_copies), not copy by copy
    # with a savepoint each: a few milliseconds of database work per deletion were most of
    # a small deletion's cost (benchmark (b)); every copy is still deleted and recorded
    statements, deleted = {}, {}
    for n in (1, 12):
        site = make_site()
        copies = [site.package(f"p{i}", archived_days_ago=10)[1] for i in range(n)]
        site.deletion_order()
        ops = site.db.read(lambda s: list(s.scalars(select(Operation.id).where(
            Operation.kind == OperationKind.DELETION.value))))
        outcomes: list[Outcome] = []
        statements[n] = _package_reads(site, lambda: outcomes.extend(execute_deletions(site.ctx, ops, "w")),
                                       about="")
        assert outcomes == [Outcome.COMPLETED] * n
        deleted[n] = [_copy(site, c).status for c in copies]
        assert not any((site.settings.location_path("fyst-buffer") / f"raw/p{i}.tar").exists() for i in range(n))
    assert deleted == {1: ["deleted"], 12: ["deleted"] * 12}
    # claims and completions are one statement per operation at most; the rules none
    assert statements[12] - statements[1] <= 11, statements


def test_critical_counts_copies_deleted_since_the_sample_when_it_cannot_measure_again(make_site) -> None:
    """The sample was taken before the first deletions finished: those bytes are already gone,
    so the episode stops at the recovery threshold instead of going on from the old figure."""
    site = make_site()
    copies = [site.package(f"p{i}", archived_days_ago=1)[1] for i in range(9)]
    site.pressure("fyst-buffer", 90)  # 9000 of 10000
    first = site.deletion_order()
    assert first == copies[:4]  # 9000 - 4 x 1000 = 5000 < 6000
    for op_id in site.db.read(lambda s: list(s.scalars(select(Operation.id).where(
            Operation.kind == OperationKind.DELETION.value)))):
        assert execute_operation(site.ctx, op_id, "w") is Outcome.COMPLETED

    def unmeasurable(name: str, root: Path) -> Usage:
        raise OSError("the manager cannot see this disk")

    site.hooks.usage = unmeasurable
    assert site.deletion_order() == first  # nothing more: 9000 - 4000 deleted since the sample


def test_critical_measures_again_after_deleting_and_stops_below_recovery(make_site) -> None:
    site = make_site()
    for i in range(9):
        site.package(f"p{i}", archived_days_ago=1)
    root = site.settings.location_path("fyst-buffer")

    def on_disk(name: str, r: Path) -> Usage:
        used = sum(p.stat().st_size for p in root.rglob("*.tar")) if name == "fyst-buffer" else 0
        return Usage(TOTAL, used, TOTAL - used)

    site.hooks.usage = on_disk
    measure_all(site.db, site.settings, site.ids, hooks=site.hooks)
    first = site.deletion_order()
    assert len(first) == 4
    for op_id in site.db.read(lambda s: list(s.scalars(select(Operation.id)))):
        execute_operation(site.ctx, op_id, "w")
    assert site.deletion_order() == first
    from packhorse.rules.disk_usage import latest_usage

    latest = site.db.read(lambda s: latest_usage(s)["fyst-buffer"])
    assert (latest.used_bytes, latest.alert_level) == (5000, "normal")  # measured again, recovered


def test_a_bundles_packages_stay_at_the_source_buffer_while_one_of_them_is_repaired(make_site) -> None:  # type: ignore[no-untyped-def]
    # "rotten" lost both archive copies; its bundle is rebuilt at fyst-buffer from every package
    # it carries. With retention 0 its sibling's copy there, rebuilt for that build, was freed
    # at once, rebuilt and freed again, for ever (a trial's livelock): it is kept until the
    # repair is done; the sibling's copy at a destination buffer is no build's input
    site = make_site(retention=0)
    rotten = site.package("rotten", archived_days_ago=1, archives={"cologne-lta": "corrupt", "cornell-lta": "corrupt"})
    sibling = site.package("sibling", archived_days_ago=1)
    at_dest = site.package("sibling-dest", archived_days_ago=1, buffer="cologne-buffer")
    alone = site.package("alone", archived_days_ago=1)  # another bundle's package

    def bundles(s: Session) -> None:
        for name, members in (("bundle-1", [rotten, sibling, at_dest]), ("bundle-2", [alone])):
            dtp = DataTransferPackage(name=name, source_site_id=site.ctx.topology.site_ids["fyst"],
                                      bagging_date="2026-01-01", package_count=len(members))
            s.add(dtp)
            s.flush()
            for pid, _ in members:
                s.get(RawDataPackage, pid).data_transfer_package_id = dtp.id  # type: ignore[union-attr]

    site.db.transact(bundles)
    reasons = site.db.read(lambda s: {c: deletion_blockers(s, site.ctx, s.get(PhysicalCopy, c))
                                      for c in (sibling[1], at_dest[1], alone[1])})
    assert [r for r in reasons[sibling[1]] if "of its bundle" in r] == [
        f"the archive copy of package {rotten[0]} of its bundle at {loc} is corrupt (failed its last fixity "
        "check): the bundle may be rebuilt from this copy" for loc in ("cologne-lta", "cornell-lta")]
    assert reasons[at_dest[1]] == [] and reasons[alone[1]] == []
    assert sibling[1] not in site.deletion_order()

    # the repair brought the archive copies back: the sibling goes
    def repaired(s: Session) -> None:
        for loc in ("cologne-lta", "cornell-lta"):
            s.add(PhysicalCopy(raw_data_package_id=rotten[0], location_id=site.ids[loc], path="raw/rotten.tar",
                               size=1000, sha256="a" * 64, status="present", verified_at=utcnow()))

    site.db.transact(repaired)
    assert site.db.read(lambda s: deletion_blockers(s, site.ctx, s.get(PhysicalCopy, sibling[1]))) == []
    assert sibling[1] in site.deletion_order()


def test_the_distributed_executor_sends_a_batch_of_deletions_as_one_message_whose_task_runs_them_once(
        site: Site) -> None:
    """Both executors run the same tasks (packhorse.operations.batching): the Celery dispatcher publishes
    20 buffer-copy deletions of one queue as two messages (16 and 4), each claimed and completed
    by its worker with the database work of one; every copy's bytes go and its operation
    completes at attempt 1. The same message delivered again (at-least-once) does nothing."""
    import types

    from packhorse.executors import celery_app

    made = [site.package(f"p{i:02d}", archived_days_ago=10) for i in range(20)]
    assert len(site.deletion_order()) == 20
    sent: list[tuple[str, list[Any], str]] = []
    app = types.SimpleNamespace(send_task=lambda name, args, queue, **kw: sent.append((name, args, queue)))
    dispatched = celery_app.dispatch_pending(site.ctx, app)  # type: ignore[arg-type]
    assert len(dispatched) == 20
    assert [(name, len(args[0]), queue) for name, args, queue in sent] == [
        ("packhorse.run_operations", 16, "fyst_fyst-buffer_deletion"), ("packhorse.run_operations", 4, "fyst_fyst-buffer_deletion")]
    assert {tuple(op) for _, args, _ in sent for op in args[0]} == {(d.operation_id, 1) for d in dispatched}
    celery_app._SETTINGS[id(app)] = site.settings
    task = types.SimpleNamespace(app=app, request=types.SimpleNamespace(id="message-1", retries=0))
    try:
        outcomes = [celery_app.run_operations_task(task, args[0]) for _, args, _ in sent]
        assert outcomes == [["completed"] * 16, ["completed"] * 4]
        assert celery_app.run_operations_task(task, sent[0][1][0]) == ["skipped"] * 16  # delivered twice
    finally:
        del celery_app._SETTINGS[id(app)]
        for key in [k for k in celery_app._CONTEXTS if k[1] == id(site.settings)]:
            celery_app._CONTEXTS.pop(key).db.dispose()
    buffer = site.settings.location_path("fyst-buffer")
    assert not any((buffer / f"raw/p{i:02d}.tar").exists() for i in range(20))
    assert {_copy(site, c).status for _, c in made} == {"deleted"}
    rows = site.db.read(lambda s: set(s.execute(select(Operation.status, Operation.attempt).where(
        Operation.kind == OperationKind.DELETION.value)).all()))
    assert rows == {("COMPLETED", 1)}
