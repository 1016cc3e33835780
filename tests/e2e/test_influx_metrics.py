"""``packhorse run`` with the InfluxDB metrics sink on, against Debian's real InfluxDB 1.x:
every finished operation is a ``function_metrics`` point and every transfer, unpack and
archive copy a ``data_transfer`` point, written from the worker processes."""

from __future__ import annotations

import os

from e2e_helpers import Pipeline

from influxdb_support import influx_or_skip
from support import run_packhorse, write_site_config


def test_a_run_leaves_its_operations_as_points_in_influxdb(tmp_path):
    server = influx_or_skip(tmp_path / "influx").start()
    try:
        server.query("CREATE DATABASE packhorse")
        extra = (f'[metrics.influxdb]\nurl = "{server.url}"\ndatabase = "packhorse"\n'
                 "flush_interval_seconds = 0.2\n")
        cfg = write_site_config(tmp_path / "site", extra=extra)
        p = Pipeline(cfg, run_packhorse, tmp_path / "x")
        (p.source / "inst/obs01").mkdir(parents=True)
        (p.source / "inst/obs01/frame.fits").write_bytes(os.urandom(200_000))
        p.init()
        p.run()
        st = p.status()
        assert st["packages"]["archived"] == st["packages"]["total"] == 1, st
        functions = server.query("SELECT * FROM function_metrics", "packhorse")
        kinds = {r["operation"] for r in functions}
        assert {"raw_data_package", "data_transfer_package", "transfer", "unpack", "long_term_archive",
                "deletion"} <= kinds, kinds  # buffer copies freed (retention 0) in batches
        assert all(r["success"] is True and r["duration_seconds"] >= 0 for r in functions)
        transfers = server.query("SELECT * FROM data_transfer", "packhorse")
        archives = sorted(r["destination"] for r in transfers if r["operation"] == "long_term_archive")
        assert archives == ["cologne-lta", "cornell-lta"], transfers
        assert {r["operation"] for r in transfers} == {"transfer", "unpack", "long_term_archive"}
        assert all(r["file_size_bytes"] > 0 for r in transfers if r["operation"] == "long_term_archive")
    finally:
        server.stop()
