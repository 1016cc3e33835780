"""One server process per test run, shared by every pytest-xdist worker (SeaweedFS, Azurite).

A session-scoped fixture runs once per worker process, and starting a storage server takes
seconds (SeaweedFS about 20 s), so the first worker that asks starts it and the others join it:

* ``<folder>/<name>.lock`` is held (``flock``) while the state is read or changed;
* ``<folder>/<name>.json`` holds the server's process id, what clients need (endpoint, ports)
  and the process ids of the pytest processes using it;
* :meth:`SharedService.release` removes the caller; the last user stops the server (only the
  process that was started here, by its id).

``folder`` is the run's pytest temporary root (shared by the workers of one run, its own for
every run), see :func:`run_folder`. A server whose users all died (a killed run) is stopped
and started afresh by the next run that finds its state.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

#: ``start(data folder) -> (server process, info for clients)``
Starter = Callable[[Path], tuple[subprocess.Popen[bytes], dict[str, Any]]]


def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder shared by all workers of this pytest run (the parent of a worker's base
    temporary folder under xdist, the base temporary folder itself without it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def alive(pid: int) -> bool:
    """Is process ``pid`` running (a zombie counts as gone)?"""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stop_pid(pid: int, proc: subprocess.Popen[bytes] | None = None, timeout: float = 15.0) -> None:
    """Stop the server process ``pid`` that these helpers started: SIGTERM, then SIGKILL after
    ``timeout`` seconds. ``proc``: its :class:`subprocess.Popen` if this process started it (reaped)."""
    if not alive(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return
        time.sleep(0.1)
    if alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)


#: what a server's log says when a port it was given was taken before it bound it
PORT_TAKEN = ("address already in use", "eaddrinuse")


def start_with_retries(start: Starter, attempts: int = 3) -> Starter:
    """``start`` retried (up to ``attempts`` times, each drawing fresh ports) when it fails
    because a port it was given was taken between being drawn and being bound (its error names
    :data:`PORT_TAKEN`); any other failure is raised at once (:mod:`free_ports`)."""

    def starter(data: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
        for attempt in range(1, attempts + 1):
            try:
                return start(data)
            except RuntimeError as e:
                if attempt == attempts or not any(s in str(e).lower() for s in PORT_TAKEN):
                    raise
        raise AssertionError("unreachable")

    return starter


class SharedService:
    """A server shared by the pytest processes of one run (see the module docstring).

    Args:
        name: file name stem of the lock and state files (``seaweedfs``, ``azurite``).
        folder: :func:`run_folder`.
        start: :data:`Starter`; called with ``folder / name`` (the server's data folder).
    """

    def __init__(self, name: str, folder: Path, start: Starter) -> None:
        self.name = name
        self.folder = folder
        self._start = start
        self._proc: subprocess.Popen[bytes] | None = None
        self._state = folder / f"{name}.json"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.folder / f"{self.name}.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> dict[str, Any] | None:
        try:
            return dict(json.loads(self._state.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return None

    def acquire(self) -> dict[str, Any]:
        """Join the running server, or start it; returns its info (``endpoint`` and the like)."""
        with self._locked():
            state = self._read()
            if state is not None:
                users = [u for u in state["users"] if alive(u)]
                if alive(state["pid"]) and users:
                    state["users"] = [*users, os.getpid()]
                    self._state.write_text(json.dumps(state), encoding="utf-8")
                    return dict(state["info"])
                stop_pid(state["pid"])  # left by a run that was killed
            data = self.folder / self.name
            data.mkdir(parents=True, exist_ok=True)
            self._proc, info = self._start(data)
            state = {"pid": self._proc.pid, "users": [os.getpid()], "info": info}
            self._state.write_text(json.dumps(state), encoding="utf-8")
            return info

    def release(self) -> None:
        """Leave the server; the last user stops it."""
        with self._locked():
            state = self._read()
            if state is None:
                return
            state["users"] = [u for u in state["users"] if u != os.getpid() and alive(u)]
            if state["users"]:
                self._state.write_text(json.dumps(state), encoding="utf-8")
                return
            stop_pid(state["pid"], self._proc if self._proc is not None and self._proc.pid == state["pid"] else None)
            self._state.unlink(missing_ok=True)


def wait_until(ready: Callable[[], bool], *, proc: subprocess.Popen[bytes], log: Path, what: str,
               timeout: float = 90.0) -> None:
    """Poll ``ready()`` until it is true; raise ``RuntimeError`` (with the log's tail) if the
    server exits or ``timeout`` seconds pass (the server is stopped then)."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {log.read_text(errors='replace')[-3000:]}")
        try:
            if ready():
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        if time.monotonic() > deadline:
            stop_pid(proc.pid, proc)
            raise RuntimeError(f"{what} was not ready within {timeout:.0f} s: "
                               f"{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.3)
