"""Poison messages: a broker message a worker cannot decode is dropped, counted and logged, never fatal.

A broker only carries "please run operation N" messages (DESIGN.md "Architecture"): a message
that cannot be read carries no work that the database does not hold, so dropping it loses
nothing (the reconciler re-dispatches any operation whose message was lost). What must never
happen is that one such message stops a worker: upstream, a Redis list entry that is not a
kombu JSON envelope (``redis-cli lpush <queue> garbage``), or an envelope whose body is not
base64, raises inside kombu's Redis transport before Celery sees a message, and the worker
stops with "Unrecoverable error" (celery/celery#4308).

Two guards, both ending in :func:`dropped` (one ERROR log line ``broker_message_dropped`` per
message, with the queue, the reason, the start of the raw bytes and the running counts):

* :class:`PoisonSafeRedisTransport` (``broker_transport`` of every ``redis://`` app,
  :func:`packhorse.executors.celery_app.make_app`): its channel checks every entry it pops
  from a queue list before handing it to kombu; an entry kombu could not turn into a message
  (not JSON, not an envelope, a body not in its ``body_encoding``, no delivery tag) is dropped
  (it has already left the list: nothing to acknowledge).
* :class:`PoisonCountingConsumer` (``worker_consumer`` of every app): a message kombu could
  read but Celery cannot run (no task header, an unknown task name, a body that does not
  deserialize, invalid arguments) is rejected without requeue, on either broker (RabbitMQ
  then drops it, or dead-letters it when the queue has a dead-letter exchange).

:data:`POISON` holds this process's counts (:class:`PoisonCount`); they are also in every log
line, so a log search counts them across restarts.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import structlog
from celery.worker.consumer import Consumer
from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads

log = structlog.get_logger(__name__)

#: Bytes of a dropped message's raw content kept in its log line.
PREVIEW_CHARS = 200


class PoisonCount:
    """Thread-safe counts of the messages this process dropped, per queue."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_queue: Counter[str] = Counter()

    def add(self, queue: str) -> tuple[int, int]:
        """Count one dropped message of ``queue``; returns ``(count of that queue, total)``."""
        with self._lock:
            self._by_queue[queue] += 1
            return self._by_queue[queue], sum(self._by_queue.values())

    def by_queue(self) -> dict[str, int]:
        """``{queue name: messages dropped}`` so far in this process."""
        with self._lock:
            return dict(self._by_queue)

    def total(self) -> int:
        """Messages dropped so far in this process."""
        with self._lock:
            return sum(self._by_queue.values())


#: The counts of this process.
POISON = PoisonCount()


def preview(raw: Any) -> str:
    """The first :data:`PREVIEW_CHARS` characters of a message's raw content, printable."""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        text = bytes(raw)[:PREVIEW_CHARS].decode("utf-8", "replace")
    else:
        text = repr(raw)[:PREVIEW_CHARS]
    return text


def dropped(queue: str, reason: str, raw: Any) -> None:
    """Count and log (ERROR ``broker_message_dropped``, once per message) a message of ``queue``
    that was dropped because of ``reason``; ``raw`` is its raw content (bytes or a decoded
    envelope). Never raises: a log that fails must not stop the worker either."""
    try:
        n, total = POISON.add(queue)
        log.error("broker_message_dropped", queue=queue, reason=reason, raw=preview(raw),
                  dropped_from_queue=n, dropped_total=total)
    except Exception:  # noqa: BLE001 - counting is best effort; consuming goes on
        pass


class PoisonSafeRedisChannel(kombu_redis.Channel):
    """kombu's Redis channel, but an entry popped from a queue list that kombu cannot turn into
    a message is dropped (:func:`dropped`) instead of raising out of the consumer loop."""

    def undecodable(self, raw: bytes | str) -> tuple[Any, str | None]:
        """``(payload, None)`` for an entry kombu can deliver, else ``(raw, reason)``.

        The check builds the message as kombu's consumer callback will (JSON envelope,
        ``properties.delivery_tag``, body decoded with its ``body_encoding``), so nothing it
        lets through can fail there."""
        try:
            payload = loads(bytes_to_str(raw))
            self.Message(payload, channel=self)
        except Exception as exc:  # noqa: BLE001 - whatever kombu would have raised on it
            return raw, f"{type(exc).__name__}: {exc}"[:300]
        return payload, None

    def _brpop_read(self, **options: Any) -> bool:
        """kombu 5.7's ``_brpop_read`` with the entry checked before delivery (see the class)."""
        try:
            try:
                dest__item = self.client.parse_response(self.client.connection, "BRPOP", **options)
            except self.connection_errors:
                # if there's a ConnectionError, disconnect so the next iteration reconnects
                self.client.connection.disconnect()
                raise
            if not dest__item:
                raise kombu_redis.Empty()
            dest, item = dest__item
            dest = bytes_to_str(dest).rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(dest)
            payload, reason = self.undecodable(item)
            if reason is not None:
                dropped(dest, reason, item)
                return True
            self.connection._deliver(payload, dest)
            return True
        finally:
            self._in_poll = None
            self._flush_brpop_reauth()


class PoisonSafeRedisTransport(kombu_redis.Transport):
    """kombu's Redis transport with :class:`PoisonSafeRedisChannel` (``broker_transport``
    ``"packhorse.executors.poison_messages:PoisonSafeRedisTransport"``)."""

    Channel = PoisonSafeRedisChannel


#: ``broker_transport`` of a ``redis://`` broker URL.
REDIS_TRANSPORT = f"{__name__}:PoisonSafeRedisTransport"


def _queue_of(message: Any) -> str:
    info = getattr(message, "delivery_info", None) or {}
    return str(info.get("routing_key") or info.get("queue") or info.get("exchange") or "?")


def _reject(message: Any) -> None:
    try:
        message.reject(requeue=False)
    except Exception as exc:  # noqa: BLE001 - a connection lost meanwhile: the broker redelivers it
        log.warning("broker_message_reject_failed", queue=_queue_of(message), error=repr(exc))


class PoisonCountingConsumer(Consumer):
    """Celery's consumer, but every message it cannot run is rejected without requeue and
    counted, with one log line naming its queue (:func:`dropped`), on either broker."""

    def start(self) -> None:
        """Start consuming; the hook point ``worker.consumer`` (tests: a consumer that must
        stop, whose worker then exits non-zero) is hit first."""
        hooks = getattr(self.app, "packhorse_hooks", None)
        if hooks is not None:
            hooks.hit("worker.consumer")
        super().start()

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        """The body does not deserialize (bad JSON, a content type not accepted)."""
        dropped(_queue_of(message), f"undecodable body: {type(exc).__name__}: {exc}"[:300], message.body)
        _reject(message)

    def on_unknown_message(self, body: Any, message: Any) -> None:
        """No task header (not a Celery message)."""
        dropped(_queue_of(message), "not a task message (no task header)", message.body)
        _reject(message)

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        """A task name no task of this worker has."""
        name = (message.headers or {}).get("task") if isinstance(message.headers, dict) else None
        dropped(_queue_of(message), f"unknown task {name!r}", message.body)
        _reject(message)

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        """A task message Celery refuses (bad arguments, content not allowed)."""
        dropped(_queue_of(message), f"invalid task message: {type(exc).__name__}: {exc}"[:300], message.body)
        _reject(message)


#: ``worker_consumer`` of every app.
CONSUMER = f"{__name__}:PoisonCountingConsumer"

__all__ = ["CONSUMER", "POISON", "REDIS_TRANSPORT", "PoisonCount", "PoisonCountingConsumer",
           "PoisonSafeRedisChannel", "PoisonSafeRedisTransport", "dropped"]
