"""Test-side fault hooks (:mod:`packhorse.runtime.hooks`): a JSON fault plan, simulated disk usage.

Handed to packhorse either directly (``ProcessContext(..., hooks=FaultPlan([...]))``) or, for
``packhorse`` subprocesses and their worker processes, through ``[hooks] module`` pointing at
this file: ``tests/conftest.py`` sets ``PACKHORSE_HOOKS__MODULE`` to it for the whole test
session (benchmarks/chaos.py does the same for its runs). :func:`make_hooks` then reads, in
every process, the test-only environment variables (only test code reads them):

* ``PACKHORSE_TEST_FAULTS``: JSON, a list of hooks ``{"point": NAME, "action": ACTION, ...}``
  (read at every hit, so ``monkeypatch.setenv`` works in-process too). Actions:

  - ``"pause"``: create the file ``marker`` (if given), then sleep ``seconds``;
  - ``"wait_for"``: create the file ``marker`` (if given), then wait until the file ``path``
    exists (at most ``seconds``, default 60): the test decides when the work goes on;
  - ``"corrupt"``: flip the first byte of the object this thread published last through the
    fault layer (disk and memory backends), so the verification by re-reading must catch it;
  - ``"corrupt_partial"``: flip the first byte of the unpublished file of the write this
    thread opened last through the fault layer (disk: its partial file, after its buffer is
    flushed): bytes damaged on the medium after they were written and before they are
    published, which the read-back before publication must refuse;
  - ``"fail"``: raise ``RuntimeError`` (a retryable failure);
  - ``"db_error"``: raise :class:`~packhorse.errors.TransientDatabaseError`;
  - ``"append"``: append ``data`` (text) to the file ``path`` (a source file that grows or
    changes at that point), then create ``marker`` if given;
  - ``"rewrite"``: change the first byte of the file ``path``, keeping its size (other bytes,
    same size), then create ``marker`` if given;
  - ``"remove"``: delete the file ``path`` (a source file that vanishes), then create
    ``marker`` if given;
  - ``"rename"``: rename ``path`` to ``to`` if ``path`` is there and ``to`` is not (a folder
    or a location's root taken away: an unmounted disk), then create ``marker`` if given;
  - ``"duplicate"`` (point ``dispatch``): a mode, :meth:`FaultPlan.active`.

  A hook fires at most ``times`` times per process (default: always). ``"unless_exists":
  PATH`` stops it once that file exists; ``"if_exists": PATH`` starts it only once that file
  exists. A hook whose ``marker`` is its ``unless_exists`` fires once in all processes: the
  first to get there creates the marker (with its pid) atomically, and only it acts (two worker
  processes that both saw no marker would otherwise both pause).
* ``PACKHORSE_TEST_DISK_USAGE``: a JSON file ``{"<location>": {"total": bytes, "used":
  bytes}}`` read at every measurement of the disk monitor (other locations: the file system).
* ``PACKHORSE_TEST_COLD_RESTORE_SECONDS``: every cold location (``cold = true``) gets a
  :class:`memory_backend.ColdLayer`: a restore is ready that many seconds after it was
  requested (the request is a marker object in the location, seen by every process).
* ``PACKHORSE_TEST_WRITE_LOG``: a file; every resumable write
  (:meth:`~packhorse.storage.base.StorageBackend.open_resumable_write`) that is published
  appends a JSON line ``{"location", "key", "pid", "taken_over_bytes", "kept_bytes",
  "written_bytes", "io_write_bytes", "seconds"}``: the bytes taken over from an earlier
  attempt's partial and kept after verification, the bytes handed to ``write`` by this
  attempt, and the growth of the process's ``write_bytes`` (``/proc/self/io``: bytes the
  process caused to be sent to storage) from the write's start to just before publication.
* ``PACKHORSE_TEST_NO_FENCING=1``: the chaos harness's variant without fencing
  (:mod:`tests.unfenced`, loaded from the file next to this one).
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from packhorse.errors import TransientDatabaseError
from packhorse.runtime.hooks import Hooks
from packhorse.storage.base import Entry, PendingWrite, PublishResult, StorageBackend
from packhorse.storage.layers import Layer, PendingLayer, innermost
from packhorse.storage.usage import Usage, UsageProvider, filesystem_usage

FAULTS_ENV = "PACKHORSE_TEST_FAULTS"
DISK_USAGE_ENV = "PACKHORSE_TEST_DISK_USAGE"
NO_FENCING_ENV = "PACKHORSE_TEST_NO_FENCING"
WRITE_LOG_ENV = "PACKHORSE_TEST_WRITE_LOG"
COLD_ENV = "PACKHORSE_TEST_COLD_RESTORE_SECONDS"
HERE = Path(__file__).resolve()


def _plan_from_env() -> list[dict[str, Any]]:
    raw = os.environ.get(FAULTS_ENV)
    if not raw:
        return []
    data = json.loads(raw)
    return data if isinstance(data, list) else [data]


def _claim(marker: str) -> bool:
    """Create ``marker`` holding this process's pid, unless it exists: True if this process
    created it. Atomic across processes (a hard link to a private file, which fails if the name
    is taken), and the marker never exists without its pid."""
    mine = Path(f"{marker}.{os.getpid()}.{threading.get_ident()}")
    mine.write_text(str(os.getpid()))
    try:
        os.link(mine, marker)
        return True
    except FileExistsError:
        return False
    finally:
        mine.unlink()


class _Published(threading.local):
    last: tuple[StorageBackend, str] | None = None
    writing: "weakref.ref[PendingWrite] | None" = None  # weak: a dropped write must be collectable


class _FaultPending(PendingLayer):
    def __init__(self, inner: PendingWrite, layer: "FaultLayer") -> None:
        super().__init__(inner)
        self._layer = layer
        layer.plan.published.writing = weakref.ref(self)

    def publish(self, expected_sha256: str | None = None) -> PublishResult:
        result = self.inner.publish(expected_sha256)
        self._layer.plan.published.last = (self._layer.inner, self.key)
        return result


def _io_write_bytes() -> int:
    """``write_bytes`` of ``/proc/self/io``: bytes this process caused to be sent to storage,
    those of its reaped child processes (a transfer command's) included (Linux adds a child's
    I/O accounting to its parent's when the parent waits for it)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise AssertionError("/proc/self/io has no write_bytes")


class _CountedPending(_FaultPending):
    """A resumable write whose bytes are counted for ``PACKHORSE_TEST_WRITE_LOG``."""

    def __init__(self, inner: PendingWrite, layer: "FaultLayer", log_path: str) -> None:
        super().__init__(inner, layer)
        self._log_path = log_path
        self._taken_over = inner.resumed_bytes
        self._kept = 0
        self._written = 0
        self._io_start = _io_write_bytes()
        self._started = time.monotonic()

    def keep_prefix(self, nbytes: int, hasher: Any) -> None:
        self.inner.keep_prefix(nbytes, hasher)
        self._kept = nbytes

    def write(self, data: bytes | bytearray | memoryview) -> int:
        n = self.inner.write(data)
        self._written += n
        return n

    def adopt_local_file(self) -> None:  # a command wrote the file: count what it added
        self.inner.adopt_local_file()
        self._written = self.inner.size - self._kept

    def publish(self, expected_sha256: str | None = None) -> PublishResult:
        record = {"location": self._layer.location, "key": self.key, "pid": os.getpid(),
                  "taken_over_bytes": self._taken_over, "kept_bytes": self._kept, "written_bytes": self._written,
                  "io_write_bytes": _io_write_bytes() - self._io_start,
                  "seconds": round(time.monotonic() - self._started, 3)}
        result = super().publish(expected_sha256)
        with open(self._log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        return result


class FaultLayer(Layer):
    """The storage layer of a :class:`FaultPlan`: remembers what this thread published, so a
    ``corrupt`` hook can damage it on the medium (behind the backend's back)."""

    def __init__(self, inner: StorageBackend, plan: "FaultPlan") -> None:
        super().__init__(inner)
        self.plan = plan

    def open_write(self, key: str) -> PendingWrite:
        return _FaultPending(self.inner.open_write(key), self)

    def walk(self, prefix: str = "", *, reuse: Any = None, everything: bool = False) -> Iterator[Entry]:
        """The inner walk; a walk of a folder (``prefix`` given, as the package stage looks at
        its files) hits ``storage.walk_folder`` once the folder was found, before its entries
        are looked at: a root taken away there is gone in the middle of the listing."""
        entries = self.inner.walk(prefix, reuse=reuse, everything=everything)
        if not prefix:
            yield from entries
            return
        first = next(entries, None)
        if first is None:
            return
        self.plan.hit("storage.walk_folder")
        yield first
        yield from entries

    def open_resumable_write(self, key: str, token: int, **wait: Any) -> PendingWrite:
        pending = self.inner.open_resumable_write(key, token, **wait)
        log_path = os.environ.get(WRITE_LOG_ENV)
        return _CountedPending(pending, self, log_path) if log_path else _FaultPending(pending, self)


def corrupt_partial(pending: PendingWrite) -> None:
    """Flip the first byte of the unpublished file of the disk write ``pending`` (flushed first)."""
    bottom: Any = pending
    while isinstance(bottom, PendingLayer):
        bottom = bottom.inner
    path = bottom.local_path
    if path is None:
        raise AssertionError(f"cannot corrupt the unpublished bytes of {type(bottom).__name__}")
    bottom._file.flush()
    with open(path, "r+b") as f:
        b = f.read(1)
        f.seek(0)
        f.write(bytes([(b[0] if b else 0) ^ 0xFF]))


def corrupt_object(backend: StorageBackend, key: str) -> None:
    """Flip the first byte of ``key`` on the medium of a disk (or memory) backend."""
    bottom = innermost(backend)
    path = bottom.local_path(key)
    if path is not None:
        os.chmod(path, 0o644)
        with open(path, "r+b") as f:
            b = f.read(1)
            f.seek(0)
            f.write(bytes([(b[0] if b else 0) ^ 0xFF]))
        os.chmod(path, 0o444)
        return
    corrupt = getattr(bottom, "corrupt", None)
    if corrupt is None:
        raise AssertionError(f"cannot corrupt {key!r} on {type(bottom).__name__}")
    corrupt(key)


class FaultPlan(Hooks):
    """Hooks that run a fault plan (see the module docstring).

    Args:
        plan: the hooks; ``None`` reads ``PACKHORSE_TEST_FAULTS`` at every hit.
        disk_usage_file: a JSON file of simulated disk figures; ``None`` reads
            ``PACKHORSE_TEST_DISK_USAGE``.
        usage: a :data:`~packhorse.storage.usage.UsageProvider` of a test (wins over the file).
    """

    def __init__(self, plan: list[dict[str, Any]] | None = None, *, disk_usage_file: str | None = None,
                 usage: UsageProvider | None = None) -> None:
        self.plan = plan
        self.disk_usage_file = disk_usage_file
        self.usage = usage
        self.published = _Published()
        self._lock = threading.Lock()
        self._fired: dict[int, int] = {}

    def hooks(self) -> list[dict[str, Any]]:
        return self.plan if self.plan is not None else _plan_from_env()

    def active(self, point: str, action: str) -> bool:
        return any(h.get("point") == point and h.get("action") == action for h in self.hooks())

    def hit(self, point: str) -> None:
        for i, hook in enumerate(self.hooks()):
            if hook.get("point") != point:
                continue
            if hook.get("unless_exists") and Path(hook["unless_exists"]).exists():
                continue
            if hook.get("if_exists") and not Path(hook["if_exists"]).exists():
                continue
            with self._lock:
                times = hook.get("times")
                if times is not None and self._fired.get(i, 0) >= int(times):
                    continue
                # claimed last, just before acting: a hook that does not fire never takes the marker
                if (hook.get("marker") and hook.get("marker") == hook.get("unless_exists")
                        and not _claim(hook["marker"])):
                    continue  # another process got there first (the check above is not atomic)
                self._fired[i] = self._fired.get(i, 0) + 1
            action = hook.get("action")
            if action == "pause":
                if hook.get("marker"):
                    Path(hook["marker"]).write_text(str(os.getpid()))
                time.sleep(float(hook.get("seconds", 1)))
            elif action == "wait_for":
                if hook.get("marker"):
                    Path(hook["marker"]).write_text(str(os.getpid()))
                deadline = time.monotonic() + float(hook.get("seconds", 60))
                while not Path(hook["path"]).exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
            elif action == "corrupt":
                last = self.published.last
                if last is not None:
                    corrupt_object(*last)
            elif action == "corrupt_partial":
                writing = self.published.writing() if self.published.writing is not None else None
                if writing is not None:
                    corrupt_partial(writing)
            elif action == "fail":
                raise RuntimeError(f"test fault at {point}")
            elif action == "db_error":
                raise TransientDatabaseError(f"test fault at {point}: database unavailable")
            elif action == "rename":
                source, to = Path(hook["path"]), Path(hook["to"])
                if source.exists() and not to.exists():
                    source.rename(to)
                if hook.get("marker"):
                    Path(hook["marker"]).write_text(str(os.getpid()))
            elif action in ("append", "rewrite", "remove"):
                target = Path(hook["path"])
                if action == "append":
                    with open(target, "a", encoding="utf-8") as f:
                        f.write(str(hook.get("data", "more")))
                elif action == "rewrite":
                    with open(target, "r+b") as f:
                        first = f.read(1)
                        f.seek(0)
                        f.write(bytes([(first[0] if first else 0) ^ 0x20]))
                else:
                    target.unlink(missing_ok=True)
                if hook.get("marker"):
                    Path(hook["marker"]).write_text(str(os.getpid()))

    def storage_layer(self, backend: StorageBackend) -> StorageBackend:
        layer: StorageBackend = FaultLayer(backend, self)
        restore_seconds = os.environ.get(COLD_ENV)
        if restore_seconds and backend.cold:
            layer = _load_sibling("memory_backend").ColdLayer(layer, restore_seconds=float(restore_seconds))
        return layer

    def disk_usage(self) -> UsageProvider | None:
        if self.usage is not None:
            return self.usage
        path = self.disk_usage_file or os.environ.get(DISK_USAGE_ENV)
        if not path:
            return None

        def provider(location: str, root: Path) -> Usage:
            figures = json.loads(Path(path).read_text(encoding="utf-8"))
            if location not in figures:
                return filesystem_usage(location, root)
            f = figures[location]
            total, used = int(f["total"]), int(f["used"])
            return Usage(total=total, used=used, free=int(f.get("free", total - used)))

        return provider


_siblings: dict[str, Any] = {}


def _load_sibling(name: str) -> Any:
    """The test module ``tests/<name>.py`` (loaded by path: ``tests/`` need not be importable)."""
    if name not in _siblings:
        spec = importlib.util.spec_from_file_location(f"packhorse_tests_{name}", HERE.with_name(f"{name}.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _siblings[name] = module
    return _siblings[name]


def make_hooks(settings: object) -> Hooks:
    """``[hooks] module`` entry point: the environment's fault plan, and without fencing when
    ``PACKHORSE_TEST_NO_FENCING=1`` (the chaos harness's variant)."""
    plan = FaultPlan()
    if os.environ.get(NO_FENCING_ENV) == "1":
        return _load_sibling("unfenced").Unfenced(plan)
    return plan
