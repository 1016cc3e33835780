"""How runnable operations are grouped into tasks, the unit of work an executor hands to a
worker, the same for both executors (DESIGN.md "Architecture": one pipeline; the embedded
runner's pool task and the distributed executor's broker message are both a task).

A task is one operation, or several small operations of one kind that run together with the
database work of one (:func:`packhorse.engine.worker.execute_task`: one claim statement, one
completion transaction, each operation still with its own row, lease, fencing token and
outcome, I3):

* up to :data:`DELETION_BATCH` deletions of buffer copies (:func:`batchable`);
* up to :data:`ARCHIVE_BATCH` long-term-archive operations of raw data packages of at most
  :data:`ARCHIVE_BATCH_BYTES`, at most that many bytes in all (:func:`small_archives`).

Every other operation is a task of its own, and so is an operation that stalled before
(``stall_count`` > 0: its worker died or hung under it, and its circuit breaker may be
half-open, letting one trial attempt through): a worker's death stalls every operation of its
task, so a package that kills its worker must not take the others of its batch down with it
again and again until their breakers open too (DESIGN.md I5, "every state has an owner"; the
circuit breaker is per operation). A few milliseconds of database work per operation
were most of a small operation's cost (benchmark (b), docs/benchmarks.md); on PostgreSQL one
claim and one completion a transaction cost about 1.2–1.5 ms of CPU, a batch's about 0.2 ms an
operation ("Control plane").
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from packhorse.db.models import Operation, RawDataPackage
from packhorse.domain import OperationKind

#: Buffer-copy deletions one task holds at most.
DELETION_BATCH = 16
#: Long-term-archive operations of small raw data packages one task holds at most.
ARCHIVE_BATCH = 8
#: The most package bytes one task of archive operations holds (bytes). A larger package is
#: archived alone: its completion must not wait for others' bytes, and its per-operation
#: costs are small beside its bytes.
ARCHIVE_BATCH_BYTES = 64 * 2**20

_DELETION = OperationKind.DELETION.value
_ARCHIVE = OperationKind.LONG_TERM_ARCHIVE.value
_DELETIONS, _ARCHIVES = "deletions", "archives"  # the kinds of batch a task can be


def batchable(kind: str, physical_copy_id: int | None) -> bool:
    """Whether an operation may run in a batch of buffer-copy deletions (a deletion of a
    physical copy; a deletion of a source file is not)."""
    return kind == _DELETION and physical_copy_id is not None


def operations_per_task(kind: str) -> int:
    """The most operations of ``kind`` one task (one broker message) can hold: what the
    reconciler allows per message still queued (:class:`packhorse.recovery.reconciler.BrokerWatch`)."""
    return DELETION_BATCH if kind == _DELETION else ARCHIVE_BATCH if kind == _ARCHIVE else 1


def small_archives(conn: Connection | Session, rows: Sequence[Any]) -> dict[int, int]:
    """``{operation id: package size in bytes}`` of the long-term-archive operations among
    ``rows`` (with ``id`` and ``kind``) whose raw data package is at most
    :data:`ARCHIVE_BATCH_BYTES`: those a task may run together. One query, and none without
    archive operations."""
    ids = [r.id for r in rows if r.kind == _ARCHIVE]
    if not ids:
        return {}
    q = (select(Operation.id, RawDataPackage.size)
         .join(RawDataPackage, RawDataPackage.id == Operation.raw_data_package_id)
         .where(Operation.id.in_(ids), RawDataPackage.size <= ARCHIVE_BATCH_BYTES))
    return {op_id: size for op_id, size in conn.execute(q)}


def group_tasks(rows: Sequence[Any], small: dict[int, int], *, slots: int | None = None,
                key: Callable[[Any], Hashable] | None = None, spread: int | None = None) -> list[list[int]]:
    """Group runnable ``rows`` (in dispatch order, with ``id``, ``kind``,
    ``physical_copy_id`` and optionally ``stall_count``) into tasks: ``[[operation id, …], …]``
    in that order. An operation that stalled before is a task of its own (module docstring).

    Archive operations of small packages are spread over ``slots`` (or ``spread``) tasks
    before any task gets two of them, so a few packages still go one to a worker: ``k`` of them
    go ``min(ARCHIVE_BATCH, ⌈k / slots⌉)`` to a task. Deletions always go
    :data:`DELETION_BATCH` to a task (each is small, and their rules are checked in one pass).

    Args:
        small: :func:`small_archives` of ``rows``.
        slots: the most tasks wanted (the embedded runner's free task slots; the rows beyond
            them are not taken). ``None``: every row.
        key: rows of one task share it (the distributed executor: the queue a message goes
            to, its site, location and kind). ``None``: any rows of one batch kind.
        spread: without ``slots``, the tasks each key's archive operations are spread over
            (the distributed executor: the worker processes of a site, ``executor.workers``).
            ``None`` with ``slots`` ``None``: full batches.
    """
    def key_of(r: Any) -> Hashable:
        return key(r) if key is not None else None

    over = slots if slots is not None else spread
    archives: dict[Hashable, int] = {}
    for r in rows:
        if r.id in small and not getattr(r, "stall_count", 0):
            archives[key_of(r)] = archives.get(key_of(r), 0) + 1
    tasks: list[list[int]] = []
    open_batch: dict[tuple[str, Hashable], tuple[list[int], list[int]]] = {}  # → (ids, [bytes])
    for r in rows:
        group = (None if getattr(r, "stall_count", 0)  # stalled before: alone (module docstring)
                 else _DELETIONS if batchable(r.kind, r.physical_copy_id)
                 else _ARCHIVES if r.id in small else None)
        size = small.get(r.id, 0)
        where = (group, key_of(r)) if group is not None else None
        if group == _ARCHIVES:
            most = ARCHIVE_BATCH if over is None else min(ARCHIVE_BATCH, max(1, -(-archives[key_of(r)] // over)))
        else:
            most = DELETION_BATCH
        batch = open_batch.get(where) if where is not None else None
        if batch is None or len(batch[0]) >= most or batch[1][0] + size > ARCHIVE_BATCH_BYTES:
            if slots is not None and len(tasks) == slots:
                break
            batch = ([], [0])
            tasks.append(batch[0])
            if where is not None:
                open_batch[where] = batch
        batch[0].append(r.id)
        batch[1][0] += size
    return tasks
