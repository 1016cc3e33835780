"""The chaos harness's variant of packhorse without fencing (test-only; never in product code).

The chaos harness must show that it detects what fencing prevents: with this variant a stale
worker that wakes after its lease was taken over publishes anyway and overwrites the object
its successor published, and the harness's watcher must report it. Product code has no switch
for this; building :class:`Unfenced` in a process (``make_hooks`` of ``tests/fault_hooks.py``
under ``PACKHORSE_TEST_NO_FENCING=1``, in the ``packhorse run`` process and in every worker
process, each of which builds its context from the same ``[hooks] module``) replaces, in that
process only:

* :func:`packhorse.operations.lifecycle.fenced` by a predicate without the fencing token (heartbeats,
  completions and failures of a stale attempt are written), and the prebuilt completion and
  claim statements with it (the batch statements are built again on first use);
* :meth:`packhorse.operations.lease.LeaseKeeper.check` by one that never stops the work;
* the storage stack's innermost layer by :class:`OverwritingLayer`: publication replaces an
  existing object (delete, then publish) instead of refusing to, and neither the successor
  (``remove_partials_of``) nor the start-up sweep (``cleanup_partials``) removes a stale
  attempt's partial file.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import and_

import packhorse.engine.pipeline as pipeline
import packhorse.operations.lease as lease
import packhorse.operations.lifecycle as operations
from packhorse.domain import Status
from packhorse.runtime.hooks import Hooks
from packhorse.storage.base import PendingWrite, PublishResult, StorageBackend
from packhorse.storage.layers import Layer, PendingLayer


def _unfenced(operation_id: Any, attempt: Any, status: Status | Collection[Status] = Status.IN_PROGRESS) -> Any:
    """:func:`packhorse.operations.lifecycle.fenced` without the token: any attempt of the operation."""
    t = operations.Operation.__table__
    wanted = [status] if isinstance(status, Status) else list(status)
    return and_(t.c.id == operation_id, t.c.status.in_([s.value for s in wanted]))


def _install() -> None:
    if getattr(operations, "_unfenced_installed", False):
        return
    operations.fenced = _unfenced  # type: ignore[assignment]
    operations._COMPLETE = operations._complete_statements()
    operations._CLAIM = operations._claim_statement()
    operations._CLAIM_MANY.clear()  # rebuilt with the unfenced predicate on first use
    operations._COMPLETE_MANY.clear()
    pipeline._SCHEDULE = pipeline._schedule_statements()
    lease.LeaseKeeper.check = lambda self: None  # type: ignore[method-assign]
    operations._unfenced_installed = True  # type: ignore[attr-defined]


class _Overwriting(PendingLayer):
    def __init__(self, inner: PendingWrite, backend: StorageBackend) -> None:
        super().__init__(inner)
        self._backend = backend

    def publish(self, expected_sha256: str | None = None) -> PublishResult:
        if self._backend.stat(self.key) is not None:
            self._backend.delete(self.key, prune=False)
        return self.inner.publish(expected_sha256)


class OverwritingLayer(Layer):
    """Publication replaces; partial files of stale attempts stay (see the module docstring)."""

    def open_write(self, key: str) -> PendingWrite:
        return _Overwriting(self.inner.open_write(key), self.inner)

    def open_resumable_write(self, key: str, token: int, **wait: Any) -> PendingWrite:
        return _Overwriting(self.inner.open_write(key), self.inner)  # no resumption without fencing

    def remove_partials_of(self, key: str) -> int:
        return 0

    def cleanup_partials(self, older_than_seconds: float, *, resumable_older_than_seconds: float | None = None) -> int:
        return 0


class Unfenced(Hooks):
    """The hooks of ``plan`` plus packhorse without fencing in this process."""

    def __init__(self, plan: Hooks) -> None:
        self.plan = plan
        _install()

    def hit(self, point: str) -> None:
        self.plan.hit(point)

    def active(self, point: str, action: str) -> bool:
        return self.plan.active(point, action)

    def storage_layer(self, backend: StorageBackend) -> StorageBackend:
        return OverwritingLayer(self.plan.storage_layer(backend))

    def disk_usage(self) -> Any:
        return self.plan.disk_usage()
