"""``packhorse run`` with the InfluxDB metrics sink on, against Debian's real InfluxDB 1.x:
every finished operation is a ``function_metrics`` point and every transfer, unpack and
archive copy a ``data_transfer`` point, written from the worker processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from e2e_helpers import Pipeline

from influxdb_support import influx_or_skip
from support import SRC, run_packhorse, write_site_config


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


def test_points_and_mail_of_a_run_arrive_after_influxdb_and_the_mail_server_were_down(tmp_path):
    """A service run that starts with InfluxDB and the mail server both down archives all the
    same (neither delays an operation); once both are back, InfluxDB holds a point for every
    finished operation (kept in the sink's queue meanwhile, none dropped at this size) and the
    notifications go out."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
    from smtp_server import SmtpServer, free_port, smtp_settings, toml_table

    server = influx_or_skip(tmp_path / "influx")
    mail = SmtpServer(free_port())
    extra = (f'[metrics.influxdb]\nurl = "{server.url}"\ndatabase = "packhorse"\n'
             "flush_interval_seconds = 0.2\nretry_seconds = 0.5\n"
             + toml_table("notifications", smtp_settings(mail.port, max_retries=1000)))  # retried, never dead here
    cfg = write_site_config(tmp_path / "site", extra=extra, bundle_max_wait_seconds=1)
    source = tmp_path / "site" / "source"
    for i in range(3):
        (source / f"inst/obs{i:02d}").mkdir(parents=True)
        for j in range(4):
            (source / f"inst/obs{i:02d}/frame{j}.fits").write_bytes(os.urandom(50_000))
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen([sys.executable, "-m", "packhorse", "run", "-c", str(cfg)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path / "site")
    try:
        def status() -> dict:
            r = run_packhorse("status", "-c", str(cfg), "--json", cwd=tmp_path / "site")
            return json.loads(r.stdout) if r.returncode in (0, 3, 4) and r.stdout.startswith("{") else {}

        deadline = time.monotonic() + 180
        while (status().get("packages") or {}).get("archived") != 3:  # archived with both servers down
            assert proc.poll() is None and time.monotonic() < deadline, status()
            time.sleep(0.5)
        server.start()
        server.query("CREATE DATABASE packhorse")
        mail.start()
        st = status()
        completed = sum(by.get("COMPLETED", 0) for by in st["operations"].values())
        deadline = time.monotonic() + 120
        while True:
            points = server.query("SELECT * FROM function_metrics", "packhorse")
            if len(points) >= completed or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert len(points) >= completed, (len(points), st["operations"])
        assert {r["operation"] for r in points} >= {"raw_data_package", "data_transfer_package", "transfer",
                                                    "unpack", "long_term_archive"}
        archives = [r for r in server.query("SELECT * FROM data_transfer", "packhorse")
                    if r["operation"] == "long_term_archive"]
        assert len(archives) == 6  # three packages at two archives
        mail.inbox.wait_for(lambda: any("started" in s.lower() for s in mail.inbox.subjects()), timeout=60)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        server.stop()
        mail.stop()
