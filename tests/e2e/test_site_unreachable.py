"""A site cut off from the centre is one line and one notification, not one per operation, and
one more when it heals (DESIGN.md I5). The centre sees a cut site as workers whose heartbeats
stopped: `status` lists it as blocked (`site_unreachable`, since its last heartbeat), `health`
exits 1 naming it, and the monitor's passes queue one WARNING `site_unreachable` per cut and one
INFO `site_reachable` when a worker of the site heartbeats again.

Real CLI processes (`packhorse monitor --once`, `status`, `health`) on a real SQLite ops
database; the cut is played by the site's worker heartbeat rows, as a site's link going down
leaves them (the multi-site test bed cuts a real link: tests/multisite)."""

from __future__ import annotations

import datetime as dt
import json

from sqlalchemy import select, update

from api_support import api_for
from packhorse.db.models import Notification, ServiceHeartbeat, utcnow
from packhorse.db.session import Database
from support import run_packhorse


def _notes(db: Database) -> list[tuple[str, str, str]]:
    return db.read(lambda s: [(n.level, n.event, n.subject) for n in s.scalars(
        select(Notification).where(Notification.event.in_(["site_unreachable", "site_reachable"]))
        .order_by(Notification.id))])


def test_a_site_cut_off_is_listed_notified_once_and_once_more_when_it_heals(site_config) -> None:
    config = site_config()
    assert run_packhorse("init", "-c", str(config), cwd=config.parent).returncode == 0
    url = f"sqlite:///{config.parent / 'packhorse.db'}"
    db = Database(url)
    now = utcnow()
    cut_at = now - dt.timedelta(minutes=10)
    try:
        # cologne's two workers (on hosts of their own) last heartbeat ten minutes ago; cornell's is alive
        db.transact(lambda s: s.add_all([
            ServiceHeartbeat(service=f"worker:cologne:{i}@dc1-{i}", kind="worker", host=f"dc1-{i}", pid=100 + i,
                             site="cologne", instance=str(i), started_at=cut_at, last_seen=cut_at) for i in (1, 2)]
            + [ServiceHeartbeat(service="worker:cornell@dc2", kind="worker", host="dc2", pid=7, site="cornell",
                                started_at=now, last_seen=now)]
            # the centre's manager and monitor, alive (a cluster without them is a problem of its own)
            + [ServiceHeartbeat(service=f"{kind}@central", kind=kind, host="central", pid=8, started_at=now,
                                last_seen=now) for kind in ("manager", "monitor")]))

        for _ in range(2):  # two passes (or two monitors): one notification
            once = run_packhorse("monitor", "--once", "-c", str(config), cwd=config.parent)
            assert once.returncode == 0, once.stderr
        assert _notes(db) == [("WARNING", "site_unreachable", "Site cologne unreachable")]

        status = json.loads(run_packhorse("status", "--json", "-c", str(config), cwd=config.parent).stdout)
        [item] = [b for b in status["blocked"] if b["cause"] == "site_unreachable"]
        assert item["subject"] == "site cologne" and item["since"].startswith(cut_at.isoformat()[:19])
        assert item["detail"]["workers"] == ["worker:cologne:1@dc1-1", "worker:cologne:2@dc1-2"]
        assert [p["label"] for p in status["problems"]] == ["UNREACHABLE"]
        health = run_packhorse("health", "-c", str(config), cwd=config.parent)
        assert health.returncode == 1 and "site cologne unreachable since" in health.stderr, health.stderr
        assert "site cornell" not in health.stderr
        # the browser's report is the terminal's (a trial found the API's without the cut-off site)
        as_json = json.loads(run_packhorse("health", "--json", "-c", str(config), cwd=config.parent).stdout)
        api = api_for(config)
        served = api.client.get("/api/health", headers=api.auth(api.observer)).json()  # type: ignore[attr-defined]
        assert [u["subject"] for u in served["sites_unreachable"]] == ["site cologne"]
        assert served["sites_unreachable"][0]["since"].startswith(cut_at.isoformat()[:19])
        for key in ("scans_overdue", "no_monitor", "leases_not_reclaimed", "dead"):
            assert served[key] == as_json[key], key
        assert [(u["subject"], u["since"], u["detail"]["workers"]) for u in served["sites_unreachable"]] == [
            (u["subject"], u["since"], u["detail"]["workers"]) for u in as_json["sites_unreachable"]]
        # Prometheus sees it too (the outage the monitor recorded)
        metrics = api.client.get("/metrics").text
        assert 'packhorse_site_unreachable{site="cologne"} 1.0' in metrics, metrics
        assert 'packhorse_site_unreachable{site="cornell"} 0.0' in metrics
        # cologne holds no source: nothing is said of instruments' files waiting there
        assert "source location" not in served["sites_unreachable"][0]["reason"]

        # the link is back: a worker of cologne heartbeats again
        db.transact(lambda s: s.execute(update(ServiceHeartbeat).where(ServiceHeartbeat.service
                                                                       == "worker:cologne:1@dc1-1")
                                        .values(last_seen=utcnow())))
        for _ in range(2):
            assert run_packhorse("monitor", "--once", "-c", str(config), cwd=config.parent).returncode == 0
        notes = _notes(db)
        assert notes == [("WARNING", "site_unreachable", "Site cologne unreachable"),
                         ("INFO", "site_reachable", "Site cologne reachable again")], notes
        status = json.loads(run_packhorse("status", "--json", "-c", str(config), cwd=config.parent).stdout)
        assert [b for b in status["blocked"] if b["cause"] == "site_unreachable"] == []
        assert 'packhorse_site_unreachable{site="cologne"} 0.0' in api.client.get("/metrics").text
    finally:
        db.dispose()
