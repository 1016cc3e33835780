"""Progress of one ``packhorse run`` (or ``demo``), per stage, counting this run's work only.

A stage is file registration (the scan) or an operation kind. Its work in this run is every
operation that finished since the run started plus every one not finished yet (whenever it
was created: left-overs of an earlier run are this run's work), so ``done <= total`` always
and a bar never passes 100 %. Rates are averages since the start of the run; the ETA is the
remaining bytes (or operations, for stages without bytes) at that rate.

On a terminal :class:`TerminalProgress` draws rich bars on stderr; off one
:class:`SummaryLines` writes one summary line every ``interval`` seconds (a JSON log event
``run_progress`` instead with ``--log-format json``).
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, TextIO

from sqlalchemy import case, func, or_, select
from sqlalchemy.orm import Session

from packhorse.db.models import DataTransferPackage, Operation, RawDataFile, RawDataPackage, utcnow
from packhorse.domain import DONE_WORD, OperationKind, Status

#: Stage names shown, in pipeline order (operation kinds not named here show as their kind).
STAGE_NAMES: dict[str, str] = {"scan": "registered", **{k.value: w for k, w in DONE_WORD.items()}}
#: What one item of a stage is (registration counts files, the others operations on these).
UNITS: dict[str, str] = {
    "scan": "files",
    OperationKind.RAW_DATA_PACKAGE.value: "packages",
    OperationKind.DATA_TRANSFER_PACKAGE.value: "bundles",
    OperationKind.TRANSFER.value: "bundles",
    OperationKind.UNPACK.value: "bundles",
    OperationKind.LONG_TERM_ARCHIVE.value: "copies",  # one per package and archive location
    OperationKind.STAGING.value: "packages",
    OperationKind.FIXITY_CHECK.value: "copies",
    OperationKind.DELETION.value: "copies",
}
#: Kinds whose bytes are not moved (a deletion): counted in operations only.
NO_BYTES = {OperationKind.DELETION.value}
UNFINISHED = (Status.PENDING.value, Status.SCHEDULED.value, Status.IN_PROGRESS.value)


@dataclass
class StageCount:
    """This run's work of one stage: items (files or operations) done / failed / total and
    bytes done / total (``None``: no total known, e.g. registration)."""

    stage: str
    done: int = 0
    failed: int = 0
    total: int | None = None
    bytes_done: int = 0
    bytes_total: int | None = None

    @property
    def name(self) -> str:
        return STAGE_NAMES.get(self.stage, self.stage)


def run_counts(session: Session, since: dt.datetime) -> list[StageCount]:
    """Per-stage counts of the run that started at ``since`` (UTC), in pipeline order;
    stages without work in this run are left out."""
    out: list[StageCount] = []
    files, nbytes = session.execute(select(func.count(), func.coalesce(func.sum(RawDataFile.size), 0))
                                    .where(RawDataFile.registered_at >= since)).one()
    if files:
        out.append(StageCount("scan", done=int(files), bytes_done=int(nbytes)))
    size = func.coalesce(RawDataPackage.size, RawDataPackage.payload_bytes, DataTransferPackage.size, 0)
    finished = Operation.finished_at >= since
    rows = session.execute(
        select(Operation.kind,
               func.sum(case((Operation.status == Status.COMPLETED.value, 1), else_=0)),
               func.sum(case((Operation.status == Status.FAILED.value, 1), else_=0)),
               func.count(),
               func.sum(case((Operation.status == Status.COMPLETED.value, size),
                             (Operation.status == Status.IN_PROGRESS.value, Operation.bytes_done),
                             else_=0)),
               func.sum(size))
        .outerjoin(RawDataPackage, RawDataPackage.id == Operation.raw_data_package_id)
        .outerjoin(DataTransferPackage, DataTransferPackage.id == Operation.data_transfer_package_id)
        .where(or_(finished, Operation.status.in_(UNFINISHED)))
        .group_by(Operation.kind))
    by_kind = {kind: (int(d or 0), int(f or 0), int(t or 0), int(bd or 0), int(bt or 0))
               for kind, d, f, t, bd, bt in rows}
    for kind in [k for k in STAGE_NAMES if k in by_kind] + sorted(k for k in by_kind if k not in STAGE_NAMES):
        d, f, t, bd, bt = by_kind[kind]
        if kind in NO_BYTES:
            bd, bt_opt = 0, None
        else:
            bt_opt = bt
            bd = min(bd, bt)
        out.append(StageCount(kind, done=d, failed=f, total=t, bytes_done=bd, bytes_total=bt_opt))
    return out


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def eta_seconds(c: StageCount, elapsed: float) -> float | None:
    """Seconds left for stage ``c`` at its average rate over ``elapsed`` seconds; ``None``
    when no total or no rate is known yet."""
    if elapsed <= 0:
        return None
    if c.bytes_total and c.bytes_done:
        return max(0.0, c.bytes_total - c.bytes_done) / (c.bytes_done / elapsed)
    finished = c.done + c.failed
    if c.total is not None and finished:
        return max(0, c.total - finished) / (finished / elapsed)
    return None


def describe(c: StageCount, elapsed: float) -> str:
    """One stage as text, e.g. ``shipped 3/10 bundles 12.0 MiB/40.0 MiB, 1.2 MiB/s,
    0.3 bundles/s, ETA 0:23`` (:data:`UNITS`); ``N FAILED`` when some failed. The count is of
    the items done: a stage with failures never reads as complete ("packaged 4/5 …, 1
    FAILED", not "5/5")."""
    unit = UNITS.get(c.stage, "operations")
    finished = c.done + c.failed
    count = f"{c.done}" if c.total is None else f"{min(c.done, c.total)}/{c.total}"
    parts = [f"{c.name} {count} {unit}"]
    if c.stage not in NO_BYTES:
        parts[0] += f" {_size(c.bytes_done)}" + ("" if c.bytes_total is None else f"/{_size(c.bytes_total)}")
    if elapsed > 0:
        if c.stage not in NO_BYTES:
            parts.append(f"{_size(c.bytes_done / elapsed)}/s")
        parts.append(f"{c.done / elapsed:.1f} {unit}/s")
    if c.failed:
        parts.append(f"{c.failed} FAILED")
    eta = eta_seconds(c, elapsed)
    if eta is not None and c.total is not None and finished < c.total:
        parts.append(f"ETA {_duration(eta)}")
    return ", ".join(parts)


class _Base:
    """Reads this run's counts at most every ``every`` seconds (each read is one query)."""

    def __init__(self, read: Callable[[Callable[[Session], Any]], Any], *, every: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read, self._every, self._clock = read, every, clock
        self.started = clock()
        self.since = utcnow()
        self._last: float | None = None

    def counts(self) -> list[StageCount]:
        return self._read(lambda s: run_counts(s, self.since))

    def due(self, force: bool) -> bool:
        now = self._clock()
        if not force and self._last is not None and now - self._last < self._every:
            return False
        self._last = now
        return True


class SummaryLines(_Base):
    """Off a terminal: one line ``packhorse run: M:SS: stage …; stage …`` every
    ``interval`` seconds on ``stream`` (and a last one at the end), or a ``run_progress`` log
    event per interval when ``as_log`` (``--log-format json``)."""

    def __init__(self, read: Callable[[Callable[[Session], Any]], Any], *, interval: float,
                 stream: TextIO | None = None, as_log: bool = False, label: str = "packhorse run",
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(read, every=interval, clock=clock)
        self._last = self.started  # the first line after one interval, not at once
        self.stream = stream or sys.stderr
        self.as_log, self.label = as_log, label

    def __enter__(self) -> "SummaryLines":
        return self

    def __exit__(self, *a: object) -> None:
        self.tick(force=True)

    def line(self, counts: list[StageCount], elapsed: float) -> str:
        """The summary line of ``counts`` after ``elapsed`` seconds."""
        body = "; ".join(describe(c, elapsed) for c in counts) or "nothing to do yet"
        return f"{self.label}: {_duration(elapsed)}: {body}"

    def tick(self, force: bool = False) -> None:
        if not self.due(force):
            return
        counts = self.counts()
        elapsed = self._clock() - self.started
        if self.as_log:
            import structlog

            structlog.get_logger(__name__).warning(
                "run_progress", elapsed_seconds=round(elapsed, 1),
                stages={c.name: {"done": c.done, "failed": c.failed, "total": c.total, "bytes_done": c.bytes_done,
                                 "bytes_total": c.bytes_total, "eta_seconds": eta_seconds(c, elapsed)}
                        for c in counts})
        else:
            self.stream.write(self.line(counts, elapsed) + "\n")
            self.stream.flush()


class TerminalProgress(_Base):
    """On a terminal: one rich bar per stage on stderr (done / total operations of this run,
    bytes, rates and ETA as :func:`describe`), redrawn every 2 s."""

    def __init__(self, read: Callable[[Callable[[Session], Any]], Any], *, console: Any,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from rich.progress import BarColumn, Progress, TextColumn

        super().__init__(read, every=2.0, clock=clock)
        self.progress = Progress(TextColumn("{task.description:<15}"), BarColumn(), TextColumn("{task.fields[text]}"),
                                 console=console, transient=False)
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> "TerminalProgress":
        self.progress.start()
        return self

    def __exit__(self, *a: object) -> None:
        self.tick(force=True)
        self.progress.stop()

    def tick(self, force: bool = False) -> None:
        if not self.due(force):
            return
        elapsed = self._clock() - self.started
        for c in self.counts():
            task = self.tasks.get(c.stage)
            if task is None:
                task = self.tasks[c.stage] = self.progress.add_task(c.name, total=None, text="")
            finished = c.done + c.failed
            total = c.total if c.total else None
            self.progress.update(task, completed=min(finished, total) if total else finished, total=total,
                                 text=describe(c, elapsed).removeprefix(c.name + " "))
