"""Problems first (status/problems.py): one line per kind of problem, most urgent first, with
the count and the oldest "since", red (needs a human) before yellow (resumes by itself)."""

from __future__ import annotations

from packhorse.status.problems import problem_lines


def _blocked(cause: str, subject: str, since: str | None, exit_code: int = 4) -> dict:
    return {"cause": cause, "subject": subject, "since": since, "exit_code": exit_code, "reason": "r", "release": "x"}


def test_nothing_wrong_is_no_line() -> None:
    assert problem_lines([], []) == []


def test_lines_are_grouped_by_cause_with_counts_and_the_oldest_since_humans_first() -> None:
    failed = [{"id": 7, "kind": "transfer", "failed_at": "2026-12-05T10:00:00.123456+00:00"},
              {"id": 9, "kind": "unpack", "failed_at": "2026-12-05T09:00:00+00:00"}]
    blocked = [_blocked("location_unavailable", "location cologne-lta", "2026-12-05T11:00:00+00:00"),
               _blocked("circuit_breaker", "transfer 3", "2026-12-05T08:00:00+00:00"),
               _blocked("location_unavailable", "location cornell-lta", "2026-12-05T10:30:00+00:00"),
               _blocked("no_good_source", "package p1", None, exit_code=3)]
    lines = problem_lines(failed, blocked)
    assert [(x["label"], x["cause"], x["count"], x["needs_human"]) for x in lines] == [
        ("FAILED", "failed", 2, True), ("DEAD END", "no_good_source", 1, True),
        ("UNAVAILABLE", "location_unavailable", 2, False), ("BLOCKED", "circuit_breaker", 1, False)]
    assert lines[0]["since"] == "2026-12-05T09:00:00+00:00"
    assert lines[0]["text"].startswith("FAILED: 2 operation(s): a human must act")
    assert lines[0]["text"].endswith("since 2026-12-05 09:00:00 UTC")
    assert lines[2]["subjects"] == ["location cologne-lta", "location cornell-lta"]
    assert "since" not in lines[1]["text"]  # no time known: none invented


def test_an_unknown_cause_is_still_a_line() -> None:
    [line] = problem_lines([], [_blocked("something_new", "x 1", None)])
    assert line["text"] == "BLOCKED: 1 blocked by something new"


def test_a_line_about_sites_or_locations_names_them() -> None:
    # "UNREACHABLE: 1 site(s) unreachable …" did not say which site; the operator had to read on
    from packhorse.status.problems import problem_lines

    blocked = [{"cause": "site_unreachable", "subject": "site fyst", "since": "2026-12-06T06:00:07+00:00",
                "exit_code": 4}] + [{"cause": "location_unavailable", "subject": f"location l{i}", "exit_code": 4}
                                    for i in range(5)]
    lines = {x["cause"]: x["text"] for x in problem_lines([], blocked)}
    assert lines["site_unreachable"].startswith("UNREACHABLE: 1 site(s) unreachable") and "(site fyst)" in lines[
        "site_unreachable"]
    assert "(location l0, location l1, location l2, …)" in lines["location_unavailable"]


def test_a_cluster_whose_managers_or_monitor_are_all_dead_is_a_problem_not_silence(tmp_path) -> None:
    """A trial killed both managers of the test bed: ``status`` said "no problems" while no new
    work could be made. In distributed mode (workers heartbeat) a central service kind with none
    alive is a NOT RUNNING line that needs a human; embedded mode never has one."""
    import datetime as dt

    from packhorse.config import load_config
    from packhorse.db.models import ServiceHeartbeat, utcnow
    from packhorse.db.session import Database
    from packhorse.runtime.context import ProcessContext
    from packhorse.runtime.topology import sync_topology
    from packhorse.status.blocked_work import EXIT_NEEDS_HUMAN, blocked_items
    from support import write_site_config

    settings = load_config(write_site_config(tmp_path / "site"))
    db = Database(settings.database_url)
    db.upgrade()
    ctx = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    missing = lambda: [i for i in db.read(lambda s: blocked_items(s, ctx)) if i.cause == "service_missing"]  # noqa: E731
    assert missing() == []  # embedded: nothing heartbeats as a worker or manager
    now, long_ago = utcnow(), utcnow() - dt.timedelta(hours=1)
    db.transact(lambda s: s.add_all([
        ServiceHeartbeat(service="worker:fyst@obs1", kind="worker", host="obs1", pid=1, site="fyst",
                         started_at=now, last_seen=now),
        ServiceHeartbeat(service="manager:1@ops", kind="manager", host="ops", pid=2, instance="1",
                         started_at=long_ago, last_seen=long_ago),
        ServiceHeartbeat(service="manager:2@ops", kind="manager", host="ops", pid=3, instance="2",
                         started_at=long_ago, last_seen=long_ago)]))
    items = missing()
    assert [i.subject for i in items] == ["service manager", "service monitor"]
    manager, monitor = items
    assert manager.exit_code == EXIT_NEEDS_HUMAN and manager.since == long_ago.isoformat()
    assert manager.detail["services"] == ["manager:1@ops", "manager:2@ops"] and "nothing is dispatched" in manager.reason
    assert monitor.since is None and "none has ever run" in monitor.reason
    [line] = problem_lines([], [i.as_json() for i in items])
    assert line["label"] == "NOT RUNNING" and line["needs_human"]
    assert line["subjects"] == ["service manager", "service monitor"]
    # a manager comes back: only the monitor is missing
    db.transact(lambda s: s.add(ServiceHeartbeat(service="manager:3@ops", kind="manager", host="ops", pid=4,
                                                 instance="3", started_at=now, last_seen=now)))
    assert [i.subject for i in missing()] == ["service monitor"]
    db.dispose()
