"""A real InfluxDB 1.x server for the tests: Debian's ``influxd`` (package ``influxdb``).

Each :class:`InfluxServer` is its own ``influxd`` with a generated configuration: HTTP and RPC
on free ports bound to 127.0.0.1, meta, data and WAL folders in the test's folder, reporting
and the internal monitor store off. :meth:`InfluxServer.stop` and :meth:`InfluxServer.start`
take it down and bring it back on the same port and data (an outage).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from free_ports import free_port
from shared_service import stop_pid, wait_until


def influxd_binary() -> str | None:
    """Debian's ``influxd`` (``apt-get install influxdb``), or ``None``."""
    return shutil.which("influxd")


class InfluxServer:
    """``influxd`` in ``folder`` on ``127.0.0.1:<port>`` (``url``)."""

    def __init__(self, folder: Path, port: int | None = None) -> None:
        self.folder = folder
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = folder / "influxdb.conf"
        self.config.write_text(f"""reporting-disabled = true
bind-address = "127.0.0.1:{free_port()}"
[meta]
  dir = "{folder / 'meta'}"
[data]
  dir = "{folder / 'data'}"
  wal-dir = "{folder / 'wal'}"
  query-log-enabled = false
[monitor]
  store-enabled = false
[http]
  bind-address = "127.0.0.1:{self.port}"
  log-enabled = false
""", encoding="utf-8")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> "InfluxServer":
        """Start ``influxd`` and wait until ``/ping`` answers."""
        program = influxd_binary()
        assert program is not None
        log = self.folder / "influxd.log"
        with open(log, "ab") as out:
            self.proc = subprocess.Popen([program, "-config", str(self.config)], stdout=out, stderr=subprocess.STDOUT,
                                         cwd=self.folder, start_new_session=True)

        def ready() -> bool:
            with urllib.request.urlopen(f"{self.url}/ping", timeout=1) as r:
                return r.status == 204

        wait_until(ready, proc=self.proc, log=log, what="InfluxDB (influxd)", timeout=60)
        return self

    def stop(self) -> None:
        """Stop the server this object started."""
        if self.proc is not None:
            stop_pid(self.proc.pid, self.proc)
            self.proc = None

    def query(self, q: str, database: str | None = None) -> list[dict[str, Any]]:
        """Run an InfluxQL statement; returns the rows of its first series as dicts."""
        params = {"q": q, **({"db": database} if database else {})}
        req = urllib.request.Request(f"{self.url}/query", data=urllib.parse.urlencode(params).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            body = json.loads(r.read())
        series = body["results"][0].get("series") or []
        if not series:
            return []
        cols = series[0]["columns"]
        return [dict(zip(cols, row)) for row in series[0]["values"]]


def influx_or_skip(folder: Path) -> InfluxServer:
    """An :class:`InfluxServer` in ``folder``, not started; skips the test if ``influxd`` is not
    installed (fails under ``CI=true``)."""
    if influxd_binary() is None:
        if os.environ.get("CI") == "true":
            raise RuntimeError("influxd is not installed (apt-get install influxdb)")
        pytest.skip("InfluxDB (apt-get install influxdb) is not installed")
    folder.mkdir(parents=True, exist_ok=True)
    return InfluxServer(folder)
