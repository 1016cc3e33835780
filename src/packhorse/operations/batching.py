"""How runnable operations are grouped into tasks, the unit of work an executor hands to a
worker, the same for both executors (DESIGN.md "Architecture": one pipeline; the embedded
runner's pool task and the distributed executor's broker message are both a task).

A task is one operation, or several small operations of one kind that run together with the
database work of one (:func:`packhorse.engine.worker.execute_task`: one claim statement, one
completion transaction, each operation still with its own row, lease, fencing token and
outcome, I3):

* up to :data:`DELETION_BATCH` deletions of buffer copies (:func:`batchable`);
* up to :data:`SMALL_BATCH` operations of one of the :data:`SMALL_BATCH_KINDS` on raw data
  packages of at most :data:`SMALL_BATCH_BYTES`, at most that many bytes in all
  (:func:`small_operations`): builds of small packages (their payload bytes) and their
  long-term-archive copies (their package bytes).

Every other operation is a task of its own, and so is an operation that stalled before
(``stall_count`` > 0: its worker died or hung under it, and its circuit breaker may be
half-open, letting one trial attempt through): a worker's death stalls every operation of its
task, so a package that kills its worker must not take the others of its batch down with it
again and again until their breakers open too (DESIGN.md I5, "every state has an owner"; the
circuit breaker is per operation). A few milliseconds of database work per operation
were most of a small operation's cost (benchmark (b), docs/benchmarks.md); on PostgreSQL one
claim and one completion a transaction cost about 1.2–1.5 ms of CPU, a batch's about 0.2 ms an
operation ("Control plane"). Across a long link each of them is also round trips: a site whose
database is 100 ms away paid about a second a package build in claims, completions and broker
deliveries ("20,000 small files over a long thin link").
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from packhorse.db.models import Operation, RawDataPackage
from packhorse.domain import OperationKind, Status

#: Buffer-copy deletions one task holds at most.
DELETION_BATCH = 16
#: Operations of one small-batch kind (package builds, or long-term-archive copies) one task
#: holds at most. A task's claim, completion and broker delivery cost a site 100 ms from its
#: database about a second whatever its size, and a scan registering ten groups a chunk got
#: them built as a task of 8 and a task of 2 (docs/benchmarks.md, "20,000 small files over a
#: long thin link"); :data:`SMALL_BATCH_BYTES` still bounds what one task holds.
SMALL_BATCH = 16
#: The most bytes one task of small operations holds (bytes): package bytes for an archive
#: copy, payload bytes for a package build. A larger package is built or archived alone: its
#: completion must not wait for others' bytes, and its per-operation costs are small beside
#: its bytes.
SMALL_BATCH_BYTES = 64 * 2**20

_DELETION = OperationKind.DELETION.value
_ARCHIVE = OperationKind.LONG_TERM_ARCHIVE.value
_BUILD = OperationKind.RAW_DATA_PACKAGE.value
#: The operation kinds whose operations on small raw data packages run together.
SMALL_BATCH_KINDS = frozenset({_BUILD, _ARCHIVE})
_DELETIONS = "deletions"  # a batch of deletions; a batch of small operations is named by its kind


def batchable(kind: str, physical_copy_id: int | None) -> bool:
    """Whether an operation may run in a batch of buffer-copy deletions (a deletion of a
    physical copy; a deletion of a source file is not)."""
    return kind == _DELETION and physical_copy_id is not None


def operations_per_task(kind: str) -> int:
    """The most operations of ``kind`` one task (one broker message) can hold: what the
    reconciler allows per message still queued (:class:`packhorse.recovery.reconciler.BrokerWatch`)."""
    return DELETION_BATCH if kind == _DELETION else SMALL_BATCH if kind in SMALL_BATCH_KINDS else 1


def small_operations(conn: Connection | Session, rows: Sequence[Any]) -> dict[int, int]:
    """``{operation id: bytes}`` of the operations among ``rows`` (with ``id`` and ``kind``)
    that a task may run together: long-term-archive copies of raw data packages of at most
    :data:`SMALL_BATCH_BYTES` (their package size), and builds of raw data packages whose
    payload is at most that (their payload bytes; the package tar is a little larger, its
    headers and manifests). One query, and none without operations of those kinds."""
    ids = [r.id for r in rows if r.kind in SMALL_BATCH_KINDS]
    if not ids:
        return {}
    q = (select(Operation.id, Operation.kind, RawDataPackage.size, RawDataPackage.payload_bytes)
         .join(RawDataPackage, RawDataPackage.id == Operation.raw_data_package_id)
         .where(Operation.id.in_(ids)))
    out: dict[int, int] = {}
    for op_id, kind, size, payload in conn.execute(q):
        n = size if kind == _ARCHIVE else payload
        if n is not None and n <= SMALL_BATCH_BYTES:
            out[op_id] = n
    return out


def in_flight(conn: Connection | Session, key: Callable[[Any], Hashable]) -> dict[Hashable, int]:
    """``{key: operations}``: the ``SCHEDULED`` and ``IN_PROGRESS`` operations of the
    :data:`SMALL_BATCH_KINDS` by ``key`` of their row (with ``site_id``, ``source_location_id``,
    ``destination_location_id`` and ``kind``: the distributed executor's queue). The worker
    processes they keep busy have no room for a new task to spread to (:func:`group_tasks`'s
    ``busy``). One query, grouped in the database."""
    q = (select(Operation.site_id, Operation.source_location_id, Operation.destination_location_id,
                Operation.kind, func.count())
         .where(Operation.status.in_([Status.SCHEDULED.value, Status.IN_PROGRESS.value]),
                Operation.kind.in_(sorted(SMALL_BATCH_KINDS)))
         .group_by(Operation.site_id, Operation.source_location_id, Operation.destination_location_id,
                   Operation.kind))
    out: dict[Hashable, int] = {}
    for r in conn.execute(q):
        k = key(r)
        out[k] = out.get(k, 0) + int(r[4])
    return out


def group_tasks(rows: Sequence[Any], small: dict[int, int], *, slots: int | None = None,
                key: Callable[[Any], Hashable] | None = None, spread: int | None = None,
                busy: dict[Hashable, int] | None = None) -> list[list[int]]:
    """Group runnable ``rows`` (in dispatch order, with ``id``, ``kind``,
    ``physical_copy_id`` and optionally ``stall_count``) into tasks: ``[[operation id, …], …]``
    in that order. An operation that stalled before is a task of its own (module docstring).

    Small operations of one kind (package builds, archive copies) are spread over ``slots``
    (or ``spread``) tasks before any task gets two of them, so a few packages still go one to a
    worker: ``k`` of them go ``min(SMALL_BATCH, ⌈k / slots⌉)`` to a task. Deletions always go
    :data:`DELETION_BATCH` to a task (each is small, and their rules are checked in one pass).

    Args:
        small: :func:`small_operations` of ``rows``.
        slots: the most tasks wanted (the embedded runner's free task slots; the rows beyond
            them are not taken). ``None``: every row.
        key: rows of one task share it (the distributed executor: the queue a message goes
            to, its site, location and kind). ``None``: any rows of one batch kind.
        spread: without ``slots``, the tasks each key's small operations of a kind are spread over
            (the distributed executor: the worker processes of a site, ``executor.workers``).
            ``None`` with ``slots`` ``None``: full batches.
        busy: with ``spread``, the operations each key already has queued or running
            (:func:`in_flight`): they hold that many of its worker processes, so the new ones
            are spread over the rest (at least one task). A site whose database is far away
            paid a second a task in round trips; archive copies trickling in a few at a time
            went one to a message behind a backlog ("20,000 small files over a long thin link").
    """
    def key_of(r: Any) -> Hashable:
        return key(r) if key is not None else None

    over = slots if slots is not None else spread
    count: dict[tuple[str, Hashable], int] = {}  # small operations of each kind and key
    for r in rows:
        if r.id in small and not getattr(r, "stall_count", 0):
            count[(r.kind, key_of(r))] = count.get((r.kind, key_of(r)), 0) + 1
    tasks: list[list[int]] = []
    open_batch: dict[tuple[str, Hashable], tuple[list[int], list[int]]] = {}  # → (ids, [bytes])
    for r in rows:
        group = (None if getattr(r, "stall_count", 0)  # stalled before: alone (module docstring)
                 else _DELETIONS if batchable(r.kind, r.physical_copy_id)
                 else r.kind if r.id in small else None)
        size = small.get(r.id, 0)
        where = (group, key_of(r)) if group is not None else None
        if group is not None and group != _DELETIONS:
            free = over if over is None or slots is not None else max(1, over - (busy or {}).get(key_of(r), 0))
            most = SMALL_BATCH if free is None else min(SMALL_BATCH, max(1, -(-count[(group, key_of(r))] // free)))
        else:
            most = DELETION_BATCH
        batch = open_batch.get(where) if where is not None else None
        if batch is None or len(batch[0]) >= most or batch[1][0] + size > SMALL_BATCH_BYTES:
            if slots is not None and len(tasks) == slots:
                break
            batch = ([], [0])
            tasks.append(batch[0])
            if where is not None:
                open_batch[where] = batch
        batch[0].append(r.id)
        batch[1][0] += size
    return tasks
