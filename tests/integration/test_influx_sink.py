"""The InfluxDB metrics sink against Debian's real InfluxDB 1.x server: the points and their
names, and an outage (the server down, then back) that never delays a caller, is logged once,
and loses only what did not fit in the queue (counted)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import structlog

from influxdb_support import influx_or_skip
from packhorse.config import InfluxDBConfig
from packhorse.runtime.influx import DROPPED, InfluxSink, line


def _sink(url: str, **kw) -> InfluxSink:  # type: ignore[no-untyped-def]
    cfg = InfluxDBConfig(url=url, database="packhorse", flush_interval_seconds=0.1, retry_seconds=0.2,
                         timeout_seconds=2, close_timeout_seconds=2, **kw)
    return InfluxSink(cfg)


def test_line_protocol_escapes_names_and_types_fields() -> None:
    assert line("data_transfer", {"source": "fyst buffer", "destination": "a,b", "empty": ""},
                {"file_size_bytes": 3, "duration_seconds": 0.5, "success": True, "note": 'say "hi"'}, 7) == (
        'data_transfer,destination=a\\,b,source=fyst\\ buffer file_size_bytes=3i,duration_seconds=0.5,'
        'success=true,note="say \\"hi\\"" 7')
    with pytest.raises(ValueError):
        line("m", {}, {}, 1)


def test_finished_operations_are_points_in_influxdb(tmp_path: Path) -> None:
    server = influx_or_skip(tmp_path / "influx").start()
    try:
        server.query("CREATE DATABASE packhorse")
        sink = _sink(server.url)
        sink.operation_finished(kind="long_term_archive", duration_seconds=2.0, success=True, size_bytes=1_000_000,
                                source="cologne-buffer", destination="cologne-lta")
        sink.operation_finished(kind="fixity_check", duration_seconds=0.25, success=False, size_bytes=10,
                                source=None, destination="cologne-lta")
        assert sink.flush(10)
        transfers = server.query("SELECT * FROM data_transfer", "packhorse")
        assert [(r["operation"], r["source"], r["destination"], r["file_size_bytes"], r["duration_seconds"],
                 r["transfer_rate_mbps"], r["success"]) for r in transfers] == [
            ("long_term_archive", "cologne-buffer", "cologne-lta", 1_000_000, 2.0, 4.0, True)]
        functions = server.query("SELECT * FROM function_metrics", "packhorse")
        assert sorted((r["operation"], r["duration_seconds"], r["success"]) for r in functions) == [
            ("fixity_check", 0.25, False), ("long_term_archive", 2.0, True)]
        sink.close()
    finally:
        server.stop()


@pytest.fixture
def info_logs():  # type: ignore[no-untyped-def]
    """structlog passing INFO on, whatever level an earlier test of this process configured
    (``packhorse.logs.configure`` at WARNING drops ``influxdb_back`` before any capture sees it:
    found when CI ran this test after such a test); the configuration is restored after."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    yield
    structlog.configure(**saved)


def test_an_outage_never_delays_the_caller_is_logged_once_and_loses_only_what_overflowed(tmp_path: Path,
                                                                                          info_logs: None) -> None:
    server = influx_or_skip(tmp_path / "influx")  # not started: InfluxDB is down
    sink = _sink(server.url, queue_points=6, batch_points=2)
    dropped_before = DROPPED._value.get()
    with structlog.testing.capture_logs() as logs:
        started = time.monotonic()
        for i in range(5):  # 10 points: 2 in the batch in hand, 6 queued, 2 dropped
            sink.operation_finished(kind="transfer", duration_seconds=1.0, success=True, size_bytes=i,
                                    source="fyst-buffer", destination="cologne-buffer")
            time.sleep(0.05)
        assert time.monotonic() - started < 0.25 + 5 * 0.05  # queued, never waited on
        time.sleep(0.6)  # several retries while down
        server.start()
        try:
            server.query("CREATE DATABASE packhorse")
            assert sink.flush(15)
            rows = server.query("SELECT * FROM function_metrics", "packhorse")
            transfers = server.query("SELECT * FROM data_transfer", "packhorse")
        finally:
            sink.close()
            server.stop()
    assert len(rows) + len(transfers) == 8
    assert DROPPED._value.get() - dropped_before == 2
    # this sink's events only: a sink another test of this process left running logs its own
    events = [e["event"] for e in logs if e["event"].startswith("influxdb_") and e.get("url") == server.url]
    assert events == ["influxdb_unavailable", "influxdb_back"], events  # once per outage, not per point
    assert [e["dropped_points"] for e in logs if e["event"] == "influxdb_back" and e.get("url") == server.url] == [2]

