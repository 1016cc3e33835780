"""A transfer whose SSH link to the source site is cut waits for the link, however long the cut,
and says so.

A trial cut the SSH path alone (the sites still heard from the centre) for seven minutes on the
test bed: the transfers' 100 retries ran out (about 6.5 minutes at the bed's 5 s backoff cap,
about 8 hours at the default 300 s), they went FAILED and needed a human after the link came
back; meanwhile ``status`` said "no problems" and ``diagnose`` said "retry 52 of 50".
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, select

from packhorse.config import load_config
from packhorse.db.models import FailureEvent, LinkOutage, Notification, Operation, SiteOutage, utcnow
from packhorse.db.session import Database
from packhorse.domain import OperationKind, Status
from packhorse.engine.outcome import record_failure
from packhorse.errors import SshConnectionError
from packhorse.operations.lifecycle import claim, create_operation, heartbeat
from packhorse.recovery.link_reachability import cut_links, track_links
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from packhorse.status.blocked_work import EXIT_WAITING, blocked_items
from packhorse.status.diagnose import diagnose_operation
from packhorse.status.metrics import collect_values
from packhorse.status.problems import problem_lines
from support import write_site_config


def _installation(tmp_path: Path) -> tuple[Any, Database, ProcessContext]:
    """``(settings, ops database, process context)`` of a three-site installation in ``tmp_path``
    (its database migrated; the URL from ``PACKHORSE_DATABASE__URL`` when the test sets it)."""
    settings = load_config(write_site_config(tmp_path / "site"))
    db = Database(settings.database_url)
    db.upgrade()
    return settings, db, ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))


def _transfer(ctx: ProcessContext, bundle: str, destination: str = "cologne") -> int:
    """A new transfer of ``bundle`` from fyst's buffer to ``destination``'s; its id."""
    ids = ctx.topology.location_ids
    return ctx.db.transact(lambda s: create_operation(
        s, kind=OperationKind.TRANSFER, dedup_key=f"transfer:{bundle}:{destination}",
        site_id=ctx.topology.site_ids[destination], max_retries=50, source_location_id=ids["fyst-buffer"],
        destination_location_id=ids[f"{destination}-buffer"])).id


def _age_failures(db: Database, seconds: float) -> None:
    """Every failure event so far happened ``seconds`` earlier than recorded."""
    def tx(s: Any) -> None:
        for event in s.scalars(select(FailureEvent)):
            event.created_at -= dt.timedelta(seconds=seconds)

    db.transact(tx)


def test_a_transfer_cut_off_from_its_source_retries_without_limit_and_status_names_the_link(tmp_path: Path) -> None:
    settings, db, ctx = _installation(tmp_path)
    op_id = _transfer(ctx, "b1")

    cut = SshConnectionError("data location fyst-buffer: no connection to 10.201.0.1:2201 (timed out)",
                             host="10.201.0.1:2201")
    for _ in range(120):  # far beyond max_retries and the old cap of 100
        c = claim(db, op_id, "cologne-worker", 30)
        assert c is not None
        out = record_failure(db, c, cut, backoff_base=0, backoff_max=0)
        assert out.will_retry and out.status is Status.PENDING
    op = db.read(lambda s: s.get(type(c.operation), op_id))
    assert op.status == "PENDING" and op.retry_count == 120

    # the wait is in status, named by its link and dated by its first failure
    first = db.read(lambda s: s.query(FailureEvent.created_at).order_by(FailureEvent.id).first()[0])
    [item] = db.read(lambda s: [i for i in blocked_items(s, ctx) if i.cause == "link_unreachable"])
    assert item.subject == "link fyst-buffer → cologne-buffer" and item.exit_code == EXIT_WAITING
    assert item.since == first.isoformat() and item.detail["operations"] == [op_id]
    assert "10.201.0.1:2201" in item.reason and "resume" in item.release
    [line] = problem_lines([], [item.as_json()])
    assert line["label"] == "UNREACHABLE" and line["subjects"] == ["link fyst-buffer → cologne-buffer"]

    # diagnose says it waits for the link, with no limit, not "retry 120 of 50"
    later = first + dt.timedelta(seconds=0.001)
    db.transact(lambda s: s.get(type(c.operation), op_id).__setattr__("not_before", later + dt.timedelta(hours=1)))
    said = db.read(lambda s: diagnose_operation(s, OperationKind.TRANSFER, op_id, now=later))["diagnosis"]
    assert said.startswith("waiting for the link to 10.201.0.1:2201") and "no limit" in said, said
    assert "of 50" not in said

    # handed back since for another wait (space at its destination): that wait is listed, not the link
    db.transact(lambda s: s.get(type(c.operation), op_id).__setattr__("error_context", {"waiting": "space"}))
    assert not db.read(lambda s: [i for i in blocked_items(s, ctx) if i.cause == "link_unreachable"])


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The ops database on SQLite (embedded) or on the shared PostgreSQL server (distributed)."""
    if request.param == "sqlite":
        yield
        return
    from distributed_support import postgres_database

    url, drop = postgres_database()
    monkeypatch.setenv("PACKHORSE_DATABASE__URL", url)
    yield
    drop()


def test_a_cut_is_dated_from_its_own_first_failure_not_from_an_earlier_cut(tmp_path: Path, database_url: None) -> None:
    """An earlier cut, then another failure, then a new cut: ``since`` is the new cut's first
    lost connection, for each transfer on its own (one aggregate read, on both databases)."""
    settings, db, ctx = _installation(tmp_path)
    ops = [_transfer(ctx, f"b{n}") for n in (1, 2)]
    cut = SshConnectionError("data location fyst-buffer: no connection to 10.201.0.1:2201 (timed out)",
                             host="10.201.0.1:2201")

    def fail(op_id: int, error: Exception) -> int:
        c = claim(db, op_id, "cologne-worker", 30)
        assert c is not None
        record_failure(db, c, error, backoff_base=0, backoff_max=0)
        return db.read(lambda s: s.query(FailureEvent.id).filter_by(operation_id=op_id)
                       .order_by(FailureEvent.id.desc()).first()[0])

    def created(event_id: int) -> str:
        return db.read(lambda s: s.get(FailureEvent, event_id).created_at.isoformat())

    fail(ops[0], cut)                                    # an earlier cut of the first transfer ...
    fail(ops[0], OSError("disk hiccup at the destination"))  # ... ended by another failure
    second = fail(ops[0], cut)                           # a new cut
    fail(ops[0], cut)
    first_of_other = fail(ops[1], cut)                   # the second transfer: one cut only
    fail(ops[1], cut)
    [item] = db.read(lambda s: [i for i in blocked_items(s, ctx) if i.cause == "link_unreachable"])
    assert item.detail["operations"] == ops
    assert item.since == min(created(second), created(first_of_other))
    # the first transfer alone (the second handed back for another wait): the new cut's first failure
    db.transact(lambda s: s.get(Operation, ops[1]).__setattr__("error_context", {"waiting": "space"}))
    [item] = db.read(lambda s: [i for i in blocked_items(s, ctx) if i.cause == "link_unreachable"])
    assert item.detail["operations"] == [ops[0]] and item.since == created(second)
    db.dispose()


def test_a_cut_link_is_notified_once_after_its_grace_and_once_when_a_transfer_moves_bytes_again(
        tmp_path: Path, database_url: None) -> None:
    """One WARNING ``link_unreachable`` per cut (after ``service_dead_after_seconds``, however many
    transfers wait and however many passes run), kept while a retry is connecting, and one INFO
    ``link_reachable`` once a transfer over the link reports a byte moved."""
    settings, db, ctx = _installation(tmp_path)
    ops = [_transfer(ctx, f"b{n}") for n in (1, 2, 3)]
    cut = SshConnectionError("data location fyst-buffer: no connection to 10.201.0.1:2201 (timed out)",
                             host="10.201.0.1:2201")
    for op_id in ops:
        for _ in range(3):
            c = claim(db, op_id, "cologne-worker", 30)
            assert c is not None
            record_failure(db, c, cut, backoff_base=0, backoff_max=0)

    def notes() -> list[tuple[str, str, str]]:
        return db.read(lambda s: [(n.level, n.event, n.subject) for n in s.scalars(
            select(Notification).where(Notification.event.like("link_%")).order_by(Notification.id))])

    assert track_links(db, settings) == ([], [])  # cut for less than the grace: not news yet
    assert notes() == []
    # the cut began longer ago than the grace
    grace = settings.recovery.service_dead_after_seconds
    _age_failures(db, grace + 5)
    assert track_links(db, settings) == (["fyst-buffer → cologne-buffer"], [])
    assert track_links(db, settings) == ([], [])  # a second pass (or monitor) says nothing more
    assert notes() == [("WARNING", "link_unreachable", "Link fyst-buffer -> cologne-buffer cut")]
    body = db.read(lambda s: s.scalars(select(Notification.body)).one())
    assert "3 transfer(s)" in body and "10.201.0.1:2201" in body
    # Prometheus sees the cut link (one series while it lasts)
    gauges = db.read(collect_values)
    assert list(gauges["links_unreachable"]) == [("fyst-buffer", "cologne-buffer")]
    assert gauges["links_unreachable"][("fyst-buffer", "cologne-buffer")] >= grace

    # every transfer is claimed again: connecting, no byte moved yet, the link still counts as cut
    claims = [claim(db, op_id, "cologne-worker", 30) for op_id in ops]
    assert all(claims)
    [link] = db.read(cut_links)
    assert link["operations"] == ops
    assert track_links(db, settings) == ([], [])
    # one transfer moves bytes again (its heartbeat says so): the link is back for the others too
    assert heartbeat(db, claims[0], 30, bytes_done=65536)
    assert track_links(db, settings) == ([], [])  # two still connect: not yet
    for c in claims[1:]:
        assert heartbeat(db, c, 30, bytes_done=1)
    assert track_links(db, settings) == ([], ["fyst-buffer → cologne-buffer"])
    assert track_links(db, settings) == ([], [])
    assert notes() == [("WARNING", "link_unreachable", "Link fyst-buffer -> cologne-buffer cut"),
                       ("INFO", "link_reachable", "Link fyst-buffer -> cologne-buffer back")]
    assert db.read(lambda s: s.scalars(select(LinkOutage)).all()) == []
    assert db.read(collect_values)["links_unreachable"] == {}
    db.dispose()


def test_a_flapping_link_begins_a_new_cut_at_each_drop_and_is_news_only_if_one_drop_lasts(
        tmp_path: Path, database_url: None) -> None:
    """A transfer whose connection carried bytes before it failed (``step`` = after data) begins
    a new cut: ``since`` moves to it, and a link that drops for a few seconds at a time is never
    notified (a trial of the design without this saw one pair of notifications per drop once the
    first drop was older than the grace)."""
    settings, db, ctx = _installation(tmp_path)
    op_id = _transfer(ctx, "b1")

    def fail(step: str) -> int:
        c = claim(db, op_id, "cologne-worker", 30)
        assert c is not None
        record_failure(db, c, SshConnectionError("data location fyst-buffer: cut", host="10.201.0.1", step=step),
                       backoff_base=0, backoff_max=0)
        return db.read(lambda s: s.scalar(select(FailureEvent.id).order_by(FailureEvent.id.desc()).limit(1)))

    def since() -> str:
        [link] = db.read(cut_links)
        return link["since"].isoformat()

    def created(event_id: int) -> str:
        return db.read(lambda s: s.get(FailureEvent, event_id).created_at.isoformat())

    first = fail(SshConnectionError.BEFORE_DATA)
    fail(SshConnectionError.BEFORE_DATA)
    assert since() == created(first)  # one cut: nothing moved since it began
    _age_failures(db, settings.recovery.service_dead_after_seconds + 5)  # long enough ago to be news
    assert track_links(db, settings)[0] == ["fyst-buffer → cologne-buffer"]
    # the link came back (bytes moved) and dropped again: a new cut, dated from this drop
    dropped = fail(SshConnectionError.AFTER_DATA)
    fail(SshConnectionError.BEFORE_DATA)
    assert since() == created(dropped)
    # the old cut's record ends and the new drop is not news yet: no second WARNING
    c = claim(db, op_id, "cologne-worker", 30)
    assert c is not None and heartbeat(db, c, 30, bytes_done=4096)
    assert track_links(db, settings) == ([], ["fyst-buffer → cologne-buffer"])
    record_failure(db, c, SshConnectionError("cut", host="10.201.0.1", step=SshConnectionError.AFTER_DATA),
                   backoff_base=0, backoff_max=0)
    assert track_links(db, settings) == ([], [])
    events = db.read(lambda s: [n.event for n in s.scalars(select(Notification).order_by(Notification.id))])
    assert events == ["link_unreachable", "link_reachable"]
    db.dispose()



def test_the_links_of_a_site_cut_off_from_the_centre_are_not_told_again(tmp_path: Path, database_url: None) -> None:
    """A trial cut a whole site off: one ``site_unreachable`` and, 60 s later, a
    ``link_unreachable`` for each of its links (the destinations' transfers from it fail on SSH
    too), and as many INFO ones at the heal. The site's line is the one: its links are not listed
    nor notified while it is recorded cut off, and a link recorded cut before is not taken for
    back meanwhile."""
    settings, db, ctx = _installation(tmp_path)
    ops = {dst: _transfer(ctx, "b1", dst) for dst in ("cologne", "cornell")}
    cut = SshConnectionError("data location fyst-buffer: cut", host="10.201.0.1")
    c = claim(db, ops["cologne"], "cologne-worker", 30)
    assert c is not None
    record_failure(db, c, cut, backoff_base=0, backoff_max=0)
    grace = settings.recovery.service_dead_after_seconds
    _age_failures(db, grace + 5)
    assert track_links(db, settings)[0] == ["fyst-buffer → cologne-buffer"]  # the SSH path alone, first

    # then the whole of fyst is cut off from the centre, and recorded so (its workers' heartbeats stopped)
    db.transact(lambda s: s.add(SiteOutage(site="fyst", since=utcnow(), noticed_at=utcnow())))
    c = claim(db, ops["cornell"], "cornell-worker", 30)
    assert c is not None
    record_failure(db, c, cut, backoff_base=0, backoff_max=0)
    _age_failures(db, grace + 5)
    assert db.read(cut_links) == []  # the site's line is the one
    assert [i.cause for i in db.read(lambda s: blocked_items(s, ctx)) if i.cause == "link_unreachable"] == []
    assert db.read(collect_values)["links_unreachable"] == {}
    assert track_links(db, settings) == ([], [])  # cornell's link not told, cologne's not taken for back
    assert db.read(lambda s: [(o.source, o.destination) for o in s.scalars(select(LinkOutage))]) == [
        ("fyst-buffer", "cologne-buffer")]

    # fyst is back, its SSH path still cut: both links are the news now, each once
    db.transact(lambda s: s.execute(delete(SiteOutage)))
    assert track_links(db, settings) == (["fyst-buffer → cornell-buffer"], [])
    events = db.read(lambda s: [n.subject for n in s.scalars(select(Notification).order_by(Notification.id))])
    assert events == ["Link fyst-buffer -> cologne-buffer cut", "Link fyst-buffer -> cornell-buffer cut"]
    db.dispose()
