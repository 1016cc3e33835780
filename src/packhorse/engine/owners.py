"""I5 "every state has an owner": the owner map, built from the live registrations.

For each (:class:`~packhorse.domain.OperationKind`, :class:`~packhorse.domain.Status`) pair
:func:`owner_map` lists the components that move such an operation on, read from what the
code actually registers — never from a hand-written table, so a kind keyed by a string no task
registers (the seeds' bug #69) shows up as an orphan:

* ``PENDING`` — the dispatcher of either mode (``engine.pipeline.DISPATCH_ORDER``, the one list
  both executors dispatch from) hands it to a worker, which runs the stage registered in
  ``stages.STAGES``;
* ``SCHEDULED`` — the same, plus the reconciler (``reconciler.RECONCILED_STATUSES``) for a lost
  dispatch;
* ``IN_PROGRESS`` — the worker holding the lease (``stages.STAGES``), the stalled-task monitor's
  handler (``monitor.RECOVERY_HANDLERS``) when the lease expires, and the reconciler when no
  lease covers it;
* ``FAILED`` — a human, reached through the notification registered for it
  (``engine.outcome.HUMAN_NOTIFICATIONS``);
* ``COMPLETED`` — terminal: nothing may pick it up again (``claim`` only takes ``PENDING`` /
  ``SCHEDULED``).

A pair is owned only if *every* owner its status needs is registered (a ``PENDING`` operation
with a stage but no dispatcher would wait forever). :func:`creators` names, per kind, the
pipeline step that creates its operations (``engine.pipeline.STEPS``).
"""

from __future__ import annotations

from packhorse import stages
from packhorse.domain import OperationKind, Status

# module references, not names: the I5 test takes registrations away to see the orphans
from packhorse.engine import outcome, pipeline
from packhorse.recovery import monitor, reconciler


def owner_map() -> dict[tuple[OperationKind, Status], list[str]]:
    """``{(kind, status): [owner, ...]}`` for every pair, from the live registrations.

    An empty list means nobody moves the pair on (an I5 violation).
    """
    out: dict[tuple[OperationKind, Status], list[str]] = {}
    for kind in OperationKind:
        worker = kind in stages.STAGES
        dispatched = kind in pipeline.DISPATCH_ORDER
        for status in Status:
            owners: list[str] = []
            if status is Status.PENDING and worker and dispatched:
                owners = ["dispatcher", "worker"]
            elif status is Status.SCHEDULED and worker and dispatched and status in reconciler.RECONCILED_STATUSES:
                owners = ["dispatcher", "worker", "reconciler"]
            elif status is Status.IN_PROGRESS and worker and kind in monitor.RECOVERY_HANDLERS \
                    and status in reconciler.RECONCILED_STATUSES:
                owners = ["worker (lease)", "stalled-task monitor", "reconciler"]
            elif status is Status.FAILED and status in outcome.HUMAN_NOTIFICATIONS:
                owners = [f"human (notification {outcome.HUMAN_NOTIFICATIONS[status][0]!r})"]
            elif status is Status.COMPLETED:
                owners = ["terminal"]
            out[(kind, status)] = owners
    return out


def orphans(kinds: list[OperationKind] | None = None) -> list[tuple[str, str]]:
    """The (kind, status) pairs of ``kinds`` (default: all) that no component owns."""
    wanted = set(kinds) if kinds is not None else set(OperationKind)
    return sorted((k.value, s.value) for (k, s), owners in owner_map().items() if k in wanted and not owners)


def creators() -> dict[OperationKind, list[str]]:
    """``{kind: [pipeline step, ...]}``: the steps of :data:`packhorse.engine.pipeline.STEPS` that create
    operations of each kind (an empty list: no step creates it)."""
    return {kind: [s.name for s in pipeline.STEPS if s.kind is kind] for kind in OperationKind}
