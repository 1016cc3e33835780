"""Prometheus metrics read from the database, and runtime settings read by running services."""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families

from packhorse.config import load_config
from packhorse.db.models import Operation, utcnow
from packhorse.errors import RuntimeSettingError
from packhorse.runtime import audit
from packhorse.runtime.settings import RuntimeSettings, set_setting, unset_setting
from packhorse.status.metrics import registry_for, render
from support import write_site_config


def _samples(db) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(render(registry_for(db)).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _populate(empty_db) -> None:
    now = utcnow()
    from packhorse.db.models import Site

    def tx(s) -> None:
        s.add(Site(id=1, name="fyst"))
        s.flush()
        base = dict(site_id=1, attempt=1, retry_count=0, max_retries=3, stall_count=0, created_at=now, updated_at=now)
        s.add_all([
            Operation(kind="transfer", status="COMPLETED", dedup_key="a", bytes_done=1000,
                      started_at=now - dt.timedelta(seconds=10), finished_at=now, **base),
            Operation(kind="transfer", status="COMPLETED", dedup_key="b", bytes_done=24,
                      started_at=now - dt.timedelta(seconds=100), finished_at=now, **base),
            Operation(kind="unpack", status="IN_PROGRESS", dedup_key="c", bytes_done=0,
                      lease_expires_at=now - dt.timedelta(seconds=1), **base),
            Operation(kind="unpack", status="PENDING", dedup_key="d", bytes_done=0, **base),
            Operation(kind="unpack", status="PENDING", dedup_key="e", bytes_done=0,
                      not_before=now + dt.timedelta(hours=1), **base),
        ])

    empty_db.transact(tx)


def test_metrics_count_operations_stalls_queue_bytes_and_durations(empty_db) -> None:
    _populate(empty_db)
    m = _samples(empty_db)
    assert m[("packhorse_database_up", ())] == 1
    assert m[("packhorse_operations", (("kind", "transfer"), ("status", "COMPLETED")))] == 2
    assert m[("packhorse_operations", (("kind", "unpack"), ("status", "PENDING")))] == 2
    assert m[("packhorse_operations_stalled", (("kind", "unpack"),))] == 1
    assert m[("packhorse_queue_depth", (("kind", "unpack"),))] == 1  # the other waits for its backoff
    assert m[("packhorse_stage_bytes_total", (("kind", "transfer"),))] == 1024
    assert m[("packhorse_stage_duration_seconds_count", (("kind", "transfer"),))] == 2
    assert m[("packhorse_stage_duration_seconds_bucket", (("kind", "transfer"), ("le", "15.0")))] == 1
    assert m[("packhorse_stage_duration_seconds_bucket", (("kind", "transfer"), ("le", "300.0")))] == 2
    assert m[("packhorse_stage_duration_seconds_sum", (("kind", "transfer"),))] == pytest.approx(110, abs=0.01)


def test_metrics_report_an_unreadable_database_as_down(tmp_path: Path) -> None:
    from packhorse.db.session import Database

    db = Database(f"sqlite:///{tmp_path}/nothing-here.db")  # no schema
    m = _samples(db)
    assert m == {("packhorse_database_up", ()): 0}


def test_runtime_settings_are_validated_audited_and_reread_after_the_refresh_interval(tmp_path: Path, empty_db) -> None:
    settings = load_config(write_site_config(tmp_path / "site", poll_interval_seconds=7))
    rt = RuntimeSettings(empty_db, settings, refresh_seconds=3600)
    assert rt.refresh() and rt.poll_interval_seconds == 7
    set_setting(empty_db, "managers.poll_interval_seconds", "0.5", actor="test")
    assert not rt.refresh() and rt.poll_interval_seconds == 7  # not before the refresh interval
    assert rt.refresh(force=True) and rt.poll_interval_seconds == 0.5
    with pytest.raises(RuntimeSettingError, match="not a number"):
        set_setting(empty_db, "managers.poll_interval_seconds", "fast", actor="test")
    with pytest.raises(RuntimeSettingError, match="unknown runtime setting"):
        set_setting(empty_db, "executor.workers", "9", actor="test")
    assert unset_setting(empty_db, "managers.poll_interval_seconds", actor="test")
    rt.refresh(force=True)
    assert rt.poll_interval_seconds == 7
    log = empty_db.read(lambda s: audit.entries(s))
    assert [(e["action"], e["result"]) for e in log] == [
        ("settings.unset", "ok"), ("settings.set", "refused"), ("settings.set", "refused"), ("settings.set", "ok")]


def test_a_runtime_log_level_is_applied_to_the_running_process(tmp_path: Path, empty_db, capsys) -> None:
    from packhorse import logs

    settings = load_config(write_site_config(tmp_path / "site"))
    saved, saved_args = structlog.get_config(), logs.current_config()
    logs.configure("WARNING", json=True)
    rt = RuntimeSettings(empty_db, settings, refresh_seconds=3600)
    structlog.get_logger("t").debug("hidden_before")
    set_setting(empty_db, "log_level", "debug", actor="test")
    rt.refresh(force=True)
    structlog.get_logger("t").debug("shown_after")
    err = capsys.readouterr().err
    assert "shown_after" in err and "hidden_before" not in err
    # later tests must not log into this test's (closed) captured stderr
    structlog.configure(**saved)
    logs._current.update(saved_args)
    logging.getLogger().setLevel(logging.WARNING)


def test_every_metric_of_the_grafana_dashboard_is_exported(empty_db) -> None:
    import json
    import re

    _populate(empty_db)
    exported = set()
    for fam in text_string_to_metric_families(render(registry_for(empty_db)).decode()):
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(fam.type, [""])
        exported |= {fam.name + x for x in suffixes}
    dash = json.loads((Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json").read_text())
    used = {m for p in dash["panels"] for t in p["targets"] for m in re.findall(r"packhorse_[a-z_]+", t["expr"])}
    assert len(used) >= 8
    assert used <= exported, used - exported


def test_metrics_show_the_latest_disk_usage_of_each_location(empty_db) -> None:
    from packhorse.config import settings_from_dict
    from packhorse.db.models import DataLocation, Site
    from packhorse.rules.disk_usage import record_sample
    from packhorse.storage.usage import Usage

    def tx(s) -> None:
        s.add(Site(id=1, name="fyst"))
        s.flush()
        s.add(DataLocation(id=1, name="fyst-buffer", site_id=1, role="buffer", storage_type="disk", uri="/b"))

    empty_db.transact(tx)
    settings = settings_from_dict({}, environ={})
    record_sample(empty_db, settings, 1, "fyst-buffer", Usage(total=1000, used=500, free=500))
    record_sample(empty_db, settings, 1, "fyst-buffer", Usage(total=1000, used=900, free=100))  # the latest counts
    v = _samples(empty_db)
    assert v[("packhorse_disk_usage_bytes", (("kind", "used"), ("location", "fyst-buffer")))] == 900
    assert v[("packhorse_disk_usage_bytes", (("kind", "free"), ("location", "fyst-buffer")))] == 100
    assert v[("packhorse_disk_usage_bytes", (("kind", "total"), ("location", "fyst-buffer")))] == 1000
    assert v[("packhorse_disk_usage_ratio", (("location", "fyst-buffer"),))] == pytest.approx(0.9)
