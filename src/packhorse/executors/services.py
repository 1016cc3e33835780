"""The side services of ``packhorse run`` (embedded mode): the notifier, the disk monitor and
the backlog sampler (:mod:`packhorse.status.history`) in background threads, and the run's lifecycle notifications.

``packhorse run`` starts them with :func:`start_background` and stops them with
:meth:`BackgroundServices.stop`; with ``--until-idle`` the stop delivers what it can within
``[notifications] until_idle_delivery_seconds`` (10 s; digests still gathering go now, a
channel that fails is not tried again, no SMTP step outlasts the budget) and returns how many
stay queued in the durable outbox for ``packhorse notifier``; no lifecycle notifications are
sent (a batch run is not a service).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import structlog

from packhorse.db.session import Database
from packhorse.engine.outcome import review_notification
from packhorse.notify.lifecycle import ServiceLifecycle
from packhorse.notify.notifier import Notifier
from packhorse.notify.outbox import pending_count
from packhorse.rules.disk_usage import DiskMonitor
from packhorse.runtime.context import ProcessContext
from packhorse.status.history import BacklogSampler

log = structlog.get_logger(__name__)


@dataclass
class BackgroundServices:
    """Running side services; see the module docstring."""

    db: Database
    notifier: Notifier | None
    lifecycle: ServiceLifecycle | None
    stop_event: threading.Event = field(default_factory=threading.Event)
    #: set (by a signal handler) to end a drain early
    interrupt_drain: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def stop(self, reason: str, *, drain: bool = False) -> int:
        """Stop the threads (a delivery in progress is aborted: the notifier thread gets
        ``stop_grace_seconds``); queue "Service stopped" (``reason``); then deliver what can be
        delivered in a bounded time — with ``drain`` (the end of ``run --until-idle``) for
        ``until_idle_delivery_seconds``, else ``stop_grace_seconds`` for the "stopped" message.
        An unreachable mail server never holds the run: the rest stays in the outbox.

        Returns:
            the number of notifications still queued in the outbox.
        """
        self.stop_event.set()
        if self.notifier is not None:
            self.notifier.stop()
        grace = self.notifier.cfg.stop_grace_seconds if self.notifier is not None else 5.0
        for t in self.threads:
            t.join(timeout=grace if t.name == "notifier" else 30)
        if self.lifecycle is not None:
            self.lifecycle.stopped(reason)
        if self.notifier is not None and (drain or self.lifecycle is not None):
            cfg = self.notifier.cfg
            try:
                # a stopping service still delivers its own "stopped" message (and the rest)
                counts = (self.notifier.flush(cfg.until_idle_delivery_seconds, self.interrupt_drain) if drain
                          else self.notifier.flush(cfg.stop_grace_seconds))
                log.info("notifications_delivered_at_stop", **counts)
                return counts["queued"]
            except Exception as e:
                log.error("notification_delivery_at_stop_failed", error=repr(e))
        try:
            return pending_count(self.db)
        except Exception:
            return 0

def notifier_for(ctx: ProcessContext) -> Notifier:
    """The notifier of this process: the ``[notifications]`` channels, the process's hooks, and
    the engine's review at send time (:func:`packhorse.engine.outcome.review_notification`: a
    permanent failure repaired within the gather window does not page).

    Raises:
        ConfigError: a channel is misconfigured.
    """
    return Notifier(ctx.settings.notifications, ctx.db, hooks=ctx.hooks, review=review_notification)


def start_background(ctx: ProcessContext, *, service: str = "run", lifecycle: bool = True) -> BackgroundServices:
    """Start the disk monitor and (if enabled with a channel) the notifier in daemon threads.

    Args:
        ctx: the process context of the run.
        service: the service name used in lifecycle notifications.
        lifecycle: queue "Service started" now, "still alive" daily and "stopped" at stop.
    """
    cfg = ctx.settings.notifications
    notifier = notifier_for(ctx) if cfg.enabled and cfg.channels_configured else None
    life = None
    if lifecycle:
        life = ServiceLifecycle(ctx.db, service, still_alive_interval_seconds=cfg.still_alive_interval_seconds,
                                settings={"workers": ctx.settings.executor.workers,
                                          "lease_timeout_seconds": ctx.settings.recovery.lease_timeout_seconds,
                                          "locations": [l.name for l in ctx.settings.locations if l.active]})
        life.started()
    bg = BackgroundServices(ctx.db, notifier, life)
    monitor = DiskMonitor(ctx.db, ctx.settings, ctx.topology.location_ids, hooks=ctx.hooks)
    bg.threads.append(threading.Thread(target=monitor.serve, args=(bg.stop_event,), name="disk-monitor", daemon=True))
    sampler = BacklogSampler(ctx.db, ctx.settings)  # the dashboard's backlog history
    bg.threads.append(threading.Thread(target=sampler.serve, args=(bg.stop_event,), name="backlog-sampler",
                                       daemon=True))
    if notifier is not None:
        bg.threads.append(threading.Thread(target=notifier.serve, args=(bg.stop_event,),
                                           kwargs={"on_cycle": life.tick if life else None},
                                           name="notifier", daemon=True))
    for t in bg.threads:
        t.start()
    return bg
