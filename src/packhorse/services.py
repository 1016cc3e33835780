"""The side services of ``packhorse run`` (embedded mode): the notifier, the disk monitor and
the backlog sampler (:mod:`packhorse.history`) in background threads, and the run's lifecycle notifications (issue #7).

``packhorse run`` starts them with :func:`start_background` and stops them with
:meth:`BackgroundServices.stop`; with ``--until-idle`` the stop drains the notification outbox
first (every deliverable notification ends ``sent`` or, after its retries, ``dead``) and no
lifecycle notifications are sent (a batch run is not a service).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import structlog

from .diskusage import DiskMonitor
from .history import BacklogSampler
from .notify.lifecycle import ServiceLifecycle
from .notify.notifier import Notifier
from .context import ProcessContext

log = structlog.get_logger(__name__)


@dataclass
class BackgroundServices:
    """Running side services; see the module docstring."""

    notifier: Notifier | None
    lifecycle: ServiceLifecycle | None
    stop_event: threading.Event = field(default_factory=threading.Event)
    #: set (by a signal handler) to end a drain early
    interrupt_drain: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def stop(self, reason: str, *, drain: bool = False) -> None:
        """Stop the threads; queue "Service stopped" (``reason``); with ``drain`` deliver the
        outbox until every notification is sent or dead."""
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=60)
        if self.lifecycle is not None:
            self.lifecycle.stopped(reason)
        if self.notifier is not None and (drain or self.lifecycle is not None):
            try:
                # a stopping service still delivers its own "stopped" message (and the rest)
                counts = self.notifier.drain(self.interrupt_drain) if drain else self.notifier.run_once()
                log.info("notifications_drained", **counts)
            except Exception as e:
                log.error("notification_drain_failed", error=repr(e))


def start_background(ctx: ProcessContext, *, service: str = "run", lifecycle: bool = True) -> BackgroundServices:
    """Start the disk monitor and (if enabled with a channel) the notifier in daemon threads.

    Args:
        ctx: the process context of the run.
        service: the service name used in lifecycle notifications.
        lifecycle: queue "Service started" now, "still alive" daily and "stopped" at stop.
    """
    cfg = ctx.settings.notifications
    notifier = Notifier(cfg, ctx.db) if cfg.enabled and cfg.channels_configured else None
    life = None
    if lifecycle:
        life = ServiceLifecycle(ctx.db, service, still_alive_interval_seconds=cfg.still_alive_interval_seconds,
                                settings={"workers": ctx.settings.executor.workers,
                                          "lease_timeout_seconds": ctx.settings.recovery.lease_timeout_seconds,
                                          "locations": [l.name for l in ctx.settings.locations if l.active]})
        life.started()
    bg = BackgroundServices(notifier, life)
    monitor = DiskMonitor(ctx.db, ctx.settings, ctx.topology.location_ids)
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
