"""The InfluxDB metrics sink: finished operations as InfluxDB points, beside Prometheus.

Off unless ``[metrics.influxdb] url`` is set. Points (the observatory system's names):

* ``data_transfer`` — one per finished ``transfer``, ``unpack``, ``long_term_archive`` and
  ``staging``: tags ``operation`` (the operation kind), ``source``, ``destination`` (data
  location names); fields ``file_size_bytes`` (integer, bytes), ``duration_seconds`` (float),
  ``transfer_rate_mbps`` (float, megabits per second: bytes × 8 / 10⁶ / seconds) and
  ``success`` (boolean).
* ``function_metrics`` — one per finished operation of any kind: tag ``operation``; fields
  ``duration_seconds`` and ``success``.

"Finished" is an attempt that completed (success) or failed (success false, retried or not);
a deferred or stale attempt is not finished.

Off the operation's path: :meth:`InfluxSink.record` only puts the point on a bounded
in-memory queue (it never blocks and never raises); a daemon thread writes batches over HTTP
(1.x: ``POST /write?db=``; 2.x: ``POST /api/v2/write?org=&bucket=`` with the token). While
InfluxDB is down or slow the batch in hand is retried every ``retry_seconds`` and new points
wait in the queue; points that find the queue full are dropped and counted in the process's
Prometheus counter ``packhorse_influxdb_points_dropped_total`` (:data:`DROPPED`). An outage is
logged once when it starts (WARNING ``influxdb_unavailable``) and once when it ends (INFO
``influxdb_back``, with the points dropped meanwhile), never per point. An operation is never
delayed or failed by the sink.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping

import structlog
from prometheus_client import CollectorRegistry, Counter

from packhorse.config import InfluxDBConfig

log = structlog.get_logger(__name__)

#: per-process registry of the sink's own counters (the database-backed ``/metrics`` cannot see
#: what one process dropped)
REGISTRY = CollectorRegistry()
#: points the sink could not write (the queue was full during an InfluxDB outage)
DROPPED = Counter("packhorse_influxdb_points_dropped", "InfluxDB points dropped (queue full while InfluxDB "
                  "was down or slow)", registry=REGISTRY)
#: points written to InfluxDB
WRITTEN = Counter("packhorse_influxdb_points_written", "InfluxDB points written", registry=REGISTRY)

#: operation kinds that move bytes between two locations (a ``data_transfer`` point each)
TRANSFER_KINDS = frozenset({"transfer", "unpack", "long_term_archive", "staging"})

FieldValue = float | int | bool | str


def _escape_key(s: str) -> str:
    return s.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ")


def _field(v: FieldValue) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return f"{v}i"
    if isinstance(v, float):
        return repr(v)
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def line(measurement: str, tags: Mapping[str, str], fields: Mapping[str, FieldValue], ts_ns: int) -> str:
    """One point in InfluxDB line protocol (tags sorted, empty tag values left out).

    Raises:
        ValueError: no fields.
    """
    if not fields:
        raise ValueError(f"{measurement}: a point needs at least one field")
    head = measurement.replace(",", "\\,").replace(" ", "\\ ")
    tag_part = "".join(f",{_escape_key(k)}={_escape_key(v)}" for k, v in sorted(tags.items()) if v)
    field_part = ",".join(f"{_escape_key(k)}={_field(v)}" for k, v in fields.items())
    return f"{head}{tag_part} {field_part} {ts_ns}"


class InfluxSink:
    """Writes points to InfluxDB from a queue, in batches, on a daemon thread (see the module).

    Args:
        cfg: ``[metrics.influxdb]``; ``cfg.url`` must be set.
        clock_ns: the points' timestamps (ns since the epoch).
    """

    def __init__(self, cfg: InfluxDBConfig, *, clock_ns: "type[time.time_ns] | None" = None) -> None:
        assert cfg.url is not None
        self.cfg = cfg
        self._queue: queue.Queue[str] = queue.Queue(maxsize=cfg.queue_points)
        self._clock_ns = clock_ns or time.time_ns
        self._stop = threading.Event()
        #: points queued or in the batch in hand, not yet written nor dropped (guarded by ``_written``)
        self._unwritten = 0
        self._written = threading.Condition()
        self._down_since: float | None = None
        self._dropped_in_outage = 0
        if cfg.database:
            query = {"db": cfg.database, "precision": "ns"}
            self._endpoint = f"{cfg.url.rstrip('/')}/write?{urllib.parse.urlencode(query)}"
        else:
            query = {"org": cfg.org or "", "bucket": cfg.bucket or "", "precision": "ns"}
            self._endpoint = f"{cfg.url.rstrip('/')}/api/v2/write?{urllib.parse.urlencode(query)}"
        self._thread = threading.Thread(target=self._run, name="influxdb-sink", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # -- recording (never blocks, never raises) ---------------------------------------
    def record(self, measurement: str, tags: Mapping[str, str], fields: Mapping[str, FieldValue]) -> None:
        """Queue one point; a full queue drops it (counted in :data:`DROPPED`)."""
        with self._written:
            self._unwritten += 1
        try:
            self._queue.put_nowait(line(measurement, tags, fields, self._clock_ns()))
        except queue.Full:
            DROPPED.inc()
            self._dropped_in_outage += 1
            self._settled(1)
        except Exception as e:  # noqa: BLE001 - the sink must never fail an operation
            self._settled(1)
            log.warning("influxdb_point_not_recorded", measurement=measurement, error=str(e))

    def _settled(self, points: int) -> None:
        """``points`` were written or dropped: wake :meth:`flush` when nothing is left."""
        with self._written:
            self._unwritten -= points
            self._written.notify_all()

    def operation_finished(self, *, kind: str, duration_seconds: float, success: bool, size_bytes: int | None,
                           source: str | None, destination: str | None) -> None:
        """The points of one finished operation attempt: ``function_metrics`` always, and
        ``data_transfer`` for the kinds in :data:`TRANSFER_KINDS`."""
        duration = max(0.0, float(duration_seconds))
        self.record("function_metrics", {"operation": kind}, {"duration_seconds": duration, "success": success})
        if kind in TRANSFER_KINDS:
            size = int(size_bytes or 0)
            rate = size * 8 / 1e6 / duration if duration > 0 else 0.0
            self.record("data_transfer", {"operation": kind, "source": source or "", "destination": destination or ""},
                        {"file_size_bytes": size, "duration_seconds": duration, "transfer_rate_mbps": rate,
                         "success": success})

    # -- writing ------------------------------------------------------------------------
    def _post(self, body: bytes) -> None:
        req = urllib.request.Request(self._endpoint, data=body, method="POST",
                                     headers={"Content-Type": "text/plain; charset=utf-8"})
        if self.cfg.token is not None:
            req.add_header("Authorization", f"Token {self.cfg.token.get_secret_value()}")
        with urllib.request.urlopen(req, timeout=self.cfg.timeout_seconds) as resp:  # noqa: S310 - configured URL
            if resp.status not in (200, 204):
                raise OSError(f"InfluxDB answered HTTP {resp.status}")

    def _take_batch(self) -> list[str]:
        try:
            batch = [self._queue.get(timeout=self.cfg.flush_interval_seconds)]
        except queue.Empty:
            return []
        while len(batch) < self.cfg.batch_points:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _run(self) -> None:
        batch: list[str] = []
        while True:
            if not batch:
                if self._stop.is_set() and self._queue.empty():
                    return
                batch = self._take_batch()
                if not batch:
                    continue
            try:
                self._post(("\n".join(batch) + "\n").encode("utf-8"))
            except (OSError, urllib.error.URLError, ValueError) as e:
                if self._down_since is None:
                    self._down_since = time.monotonic()
                    self._dropped_in_outage = 0
                    log.warning("influxdb_unavailable", url=self.cfg.url, error=str(e),
                                detail="points wait in the queue and are written when InfluxDB is back")
                if self._stop.wait(self.cfg.retry_seconds):  # closing while InfluxDB is down
                    DROPPED.inc(len(batch))
                    self._settled(len(batch))
                    return
                continue
            WRITTEN.inc(len(batch))
            if self._down_since is not None:
                log.info("influxdb_back", url=self.cfg.url, down_seconds=round(time.monotonic() - self._down_since, 1),
                         dropped_points=self._dropped_in_outage)
                self._down_since = None
            self._settled(len(batch))  # after the log: a flush that returns has seen the outage end
            batch = []

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every point recorded so far, queued or in the batch in hand, was written
        or dropped (``True``), or ``timeout`` seconds passed (``False``)."""
        with self._written:
            return self._written.wait_for(lambda: self._unwritten <= 0, timeout)

    def close(self, timeout: float | None = None) -> None:
        """Write what is queued (for at most ``timeout`` s, default ``cfg.close_timeout_seconds``)
        and stop the thread; points still unwritten then are counted as dropped."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(self.cfg.close_timeout_seconds if timeout is None else timeout)
        left = self._queue.qsize()
        if left:
            DROPPED.inc(left)
            self._settled(left)
