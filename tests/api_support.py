"""Helpers of the operator-surface tests: a real installation whose transfers FAILED,
an in-process API client with an admin and an observer token, and a free TCP port.

``failed_installation(folder)`` runs the real pipeline (``packhorse init`` + ``packhorse run``
in subprocesses) with a transfer command that cannot start and ``max_retries = 0``: both
transfer operations (fyst → cologne, fyst → cornell) end FAILED with a TransferCommandError,
a failure event and an error context. ``fix_installation(config)`` rewrites the route's
command to ``cp`` so a reset operation can complete.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from support import run_packhorse, write_site_config

BROKEN = 'method = "command"\ncommand = "cpx {source} {destination}"'
FIXED = 'method = "command"\ncommand = "cp {source} {destination}"'
#: Distinctive text in the failure of every broken transfer: must never reach an observer.
ERROR_TEXT = "could not start"


def failed_installation(folder: Path, **overrides: object) -> Path:
    """A three-site installation in ``folder`` with two FAILED transfer operations; returns its config."""
    cfg = write_site_config(folder, max_retries=0, route_extra=BROKEN, **overrides)
    (folder / "source" / "cam" / "obs1").mkdir(parents=True, exist_ok=True)
    (folder / "source" / "cam" / "obs1" / "a.dat").write_bytes(b"alpha" * 100)
    r = run_packhorse("init", "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    r = run_packhorse("run", "-c", str(cfg), "--until-idle", "--quiet")
    assert r.returncode == 3 and "TransferCommandError" in r.stderr, r.stderr
    return cfg


def fix_installation(cfg: Path, **overrides: object) -> Path:
    """Rewrite the config with a working transfer command (same folder, same database)."""
    return write_site_config(cfg.parent, max_retries=0, route_extra=FIXED, **overrides)


def clone(cfg: Path, dest: Path) -> Path:
    """Copy the whole installation (config, database, site folders); returns the new config."""
    shutil.copytree(cfg.parent, dest, symlinks=True)
    return dest / cfg.name


@dataclass
class Api:
    """An in-process API client (``client``) and tokens of both roles."""

    client: object
    admin: str
    observer: str

    @staticmethod
    def auth(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}


def api_for(cfg: Path) -> Api:
    """A TestClient of the API of the installation at ``cfg`` with fresh admin/observer tokens."""
    from fastapi.testclient import TestClient

    from packhorse.api.app import create_app
    from packhorse.api.tokens import create_token
    from packhorse.config import load_config

    app = create_app(load_config(cfg))
    db = app.state.ctx.db
    admin = create_token(db, name="test-admin", role="admin", created_by="test")
    observer = create_token(db, name="test-observer", role="observer", created_by="test")
    return Api(TestClient(app), admin, observer)


def start_serving(args: list[str], log_path: Path, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    """Start ``packhorse ARGS`` (``api --port 0`` or ``run --api --api-port 0``) in a subprocess
    with stderr in ``log_path``; returns ``(process, base URL)`` once it is listening."""
    import os
    import re
    import subprocess
    import sys
    import time

    from support import SRC

    log = log_path.open("w")
    proc = subprocess.Popen([sys.executable, "-m", "packhorse", *args], stdout=subprocess.DEVNULL, stderr=log,
                            env={**os.environ, "PYTHONPATH": str(SRC)})
    log.close()
    deadline = time.monotonic() + timeout
    while not (m := re.search(r"serving on (http://127\.0\.0\.1:\d+)", log_path.read_text())):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise AssertionError(f"packhorse {' '.join(args)} did not start serving:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.1)
    return proc, m.group(1)


def stop(proc) -> int:  # type: ignore[no-untyped-def]
    """SIGTERM the process and wait for it (kill after 60 s); returns its exit code."""
    import signal
    import subprocess

    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return int(proc.wait(timeout=60))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return -9
