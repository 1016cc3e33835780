"""Fault hooks: the one way tests and the chaos harness reach into a running packhorse.

Product code never switches behaviour on a test flag. Instead every process holds one
:class:`Hooks` object, handed to the stage context (:attr:`~packhorse.runtime.context.ProcessContext.hooks`), the
notifier and the disk monitor; in production it is :data:`NO_HOOKS`, which does nothing.
A test hands in its own object, either directly (in-process tests build the context with
``hooks=...``) or, for ``packhorse`` subprocesses and their worker processes, through the
configuration key ``[hooks] module`` (or the environment override
``PACKHORSE_HOOKS__MODULE``): a Python file or dotted module defining
``make_hooks(settings) -> Hooks``. :func:`hooks_for` loads it once per process, so a worker
process started by the local executor (fork or forkserver) or by Celery, which builds its own
context from the same settings, gets the same hooks. The test-side modules live under
``tests/`` (``tests/fault_hooks.py``: a JSON fault plan; ``tests/unfenced.py``: the chaos
harness's variant without fencing).

What a hooks object can do:

* :meth:`Hooks.hit` is called at named points of the work (``<kind>.writing`` after the first
  chunk of a copy, ``<kind>.write`` before the last lease check, ``<kind>.publishing`` after
  it, ``<kind>.published`` after publication, ``deletion.delete``, ``manager.cycle``,
  ``scan.started`` (a distributed scan holding its scan lease, before it reads anything),
  ``worker.consumer`` (a Celery worker's consumer starting),
  ``notify.delivered``, ``notify.smtp.session``); it may pause or raise there.
* :meth:`Hooks.active` answers mode questions (``("dispatch", "duplicate")``: the local
  dispatcher delivers every task twice, as an at-least-once broker may).
* :meth:`Hooks.storage_layer` wraps each backend innermost in the stack composed by
  :func:`packhorse.storage.registry.compose`: storage faults (a corrupted object, a store
  that answers "busy") come in there, through the backend interface.
* :meth:`Hooks.disk_usage` replaces the file system's figures for the disk monitor.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packhorse.errors import ConfigError

if TYPE_CHECKING:
    from packhorse.config import Settings
    from packhorse.storage.base import StorageBackend
    from packhorse.storage.usage import UsageProvider


class Hooks:
    """The no-op hooks of production; tests subclass it (see the module docstring)."""

    def hit(self, point: str) -> None:
        """Called when the work reaches ``point``; may sleep or raise."""

    def active(self, point: str, action: str) -> bool:
        """True if the mode ``action`` is switched on at ``point`` (default: never)."""
        return False

    def storage_layer(self, backend: "StorageBackend") -> "StorageBackend":
        """Return ``backend`` wrapped in a fault layer, or ``backend`` itself (default)."""
        return backend

    def disk_usage(self) -> "UsageProvider | None":
        """A :data:`~packhorse.storage.usage.UsageProvider` to use instead of the file system, or ``None``."""
        return None


#: The hooks of production: nothing happens at any point.
NO_HOOKS = Hooks()

_loaded: dict[str, Hooks] = {}
_lock = threading.Lock()


def _import(spec: str) -> Any:
    if spec.endswith(".py") or "/" in spec:
        path = Path(spec)
        if not path.is_file():
            raise ConfigError(f"[hooks] module: no such file {spec!r}")
        name = f"packhorse_hooks_{abs(hash(str(path.resolve())))}"
        mod_spec = importlib.util.spec_from_file_location(name, path)
        if mod_spec is None or mod_spec.loader is None:
            raise ConfigError(f"[hooks] module: cannot load {spec!r}")
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(spec)
    except ImportError as e:
        raise ConfigError(f"[hooks] module: cannot import {spec!r}: {e}") from None


def hooks_for(settings: "Settings") -> Hooks:
    """The hooks of this process for ``settings`` (``[hooks] module``), loaded once per process;
    :data:`NO_HOOKS` when the key is unset.

    Raises:
        ConfigError: the module cannot be loaded, has no ``make_hooks``, or it returned
            something that is not a :class:`Hooks`.
    """
    spec = settings.hooks.module
    if not spec:
        return NO_HOOKS
    with _lock:
        hooks = _loaded.get(spec)
        if hooks is None:
            module = _import(spec)
            factory = getattr(module, "make_hooks", None)
            if factory is None:
                raise ConfigError(f"[hooks] module {spec!r} defines no make_hooks(settings)")
            hooks = factory(settings)
            if not isinstance(hooks, Hooks):
                raise ConfigError(f"[hooks] module {spec!r}: make_hooks returned {type(hooks).__name__}, "
                                  "not a packhorse.runtime.hooks.Hooks")
            _loaded[spec] = hooks
        return hooks
