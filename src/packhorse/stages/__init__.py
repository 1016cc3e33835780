"""One module per operation kind: what the stage does, given a claimed operation.

:data:`STAGES` maps every runnable :class:`~packhorse.domain.OperationKind` to its function;
``tests/unit/test_owners.py`` checks that every kind × status pair has an owner (I5).
"""

from __future__ import annotations

from collections.abc import Callable

from packhorse.domain import OperationKind
from packhorse.stages import archive, bundle, deletion, fixity, package, staging, transfer, unpack
from packhorse.stages.base import Recorder, Records, Work

StageFn = Callable[[Work], Recorder]

STAGES: dict[OperationKind, StageFn] = {
    OperationKind.RAW_DATA_PACKAGE: package.run,
    OperationKind.DATA_TRANSFER_PACKAGE: bundle.run,
    OperationKind.TRANSFER: transfer.run,
    OperationKind.UNPACK: unpack.run,
    OperationKind.LONG_TERM_ARCHIVE: archive.run,
    OperationKind.DELETION: deletion.run,
    OperationKind.FIXITY_CHECK: fixity.run,
    OperationKind.STAGING: staging.run,
}

#: For the kinds whose operations run several to a task (:mod:`packhorse.operations.batching`),
#: what reads the first read of every stage of a task at once, before they run
#: (:func:`packhorse.engine.worker.execute_task`).
PRELOADS: dict[OperationKind, Callable[[list[Work]], None]] = {
    OperationKind.RAW_DATA_PACKAGE: package.preload,
    OperationKind.LONG_TERM_ARCHIVE: archive.preload,
}

__all__ = ["PRELOADS", "STAGES", "Recorder", "Records", "StageFn", "Work"]
