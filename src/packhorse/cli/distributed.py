"""Distributed services, each its own long-running process: Celery ``worker`` per site,
``manager``, stalled-task ``monitor``, ``notifier``, ``disk-monitor`` and the HTTP ``api``
(see docs/deployment.md)."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from packhorse import logs
from packhorse.cli.app import (
    EXIT_CONFIG,
    EXIT_OK,
    ConfigOpt,
    InstanceOpt,
    JsonOpt,
    command_set,
    context,
    fail,
    heartbeat,
    log_level,
    print_json,
    require_routes,
)
from packhorse.errors import ConfigError
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.settings import RuntimeSettings

#: this module's commands (loaded by packhorse.cli when one of them runs)
commands = command_set()


def _celery_settings(config: Path | None) -> ProcessContext:
    ctx = context(config)
    if ctx.settings.executor.kind != "celery" or not ctx.settings.executor.broker_url:
        raise fail("executor.kind: the distributed services need executor.kind = \"celery\" and "
                    "executor.broker_url (redis://… or amqp://…); `packhorse run` is the embedded mode",
                    EXIT_CONFIG)
    return ctx


@commands.command()
def worker(
    site: Annotated[str, typer.Option("--site", help="the site whose queues this worker consumes")],
    kinds: Annotated[Optional[str], typer.Option("--kinds", help="only these kinds, comma separated "
                                                 "(operation kinds and 'scan'); default all")] = None,
    concurrency: Annotated[Optional[int], typer.Option("--concurrency", min=1, help="pool processes "
                                                       "[default: executor.workers]")] = None,
    loglevel: Annotated[str, typer.Option("--loglevel", help="Celery log level")] = "INFO",
    config: ConfigOpt = None,
    instance: InstanceOpt = None,
) -> None:
    """Run a Celery worker of one site: it consumes exactly that site's queues (distributed mode)."""
    from packhorse.executors.celery_app import run_worker  # deferred: start-up time

    ctx = _celery_settings(config)
    ctx.db.dispose()  # pool children open their own connections
    wanted = [k.strip() for k in kinds.split(",") if k.strip()] if kinds else None
    try:
        code = run_worker(ctx.settings, site, kinds=wanted, concurrency=concurrency, loglevel=loglevel,
                          instance=instance)
    except ConfigError as e:
        raise fail(str(e), EXIT_CONFIG) from None
    if code:  # a worker that had to stop exits non-zero: its service manager restarts it
        raise typer.Exit(code)


@commands.command()
def manager(
    config: ConfigOpt = None,
    max_seconds: Annotated[Optional[float], typer.Option("--max-seconds", help="stop after this long")] = None,
    instance: InstanceOpt = None,
) -> None:
    """Run the pipeline's managers and the dispatcher to Celery (distributed mode; any number may run at once)."""
    from packhorse.executors.celery_app import Manager  # deferred: start-up time

    ctx = _celery_settings(config)
    require_routes(ctx.settings)
    logs.configure(log_level("INFO"))
    from packhorse.recovery.health import check_instance  # deferred: start-up time

    try:
        mgr = Manager(ctx.settings, instance=check_instance(instance))
    except ConfigError as e:
        raise fail(str(e), EXIT_CONFIG) from None

    def stop(signum: int, _frame: object) -> None:
        print(f"packhorse manager: signal {signum}: stopping", file=sys.stderr)
        mgr.stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    mgr.run(max_seconds=max_seconds)


def _serve(ctx: ProcessContext, service: str, body: Any, *, instance: str | None = None) -> None:
    """Run ``body(stop_event, lifecycle)`` as a service until SIGINT/SIGTERM, with its
    started / still-alive / stopped notifications and its health heartbeat (kind ``service``,
    listed by ``packhorse health`` like every other service; removed when it stops)."""
    import threading

    from packhorse.notify.lifecycle import ServiceLifecycle  # deferred: start-up time

    stop_event = threading.Event()
    reason: list[str] = []

    def on_signal(signum: int, _frame: object) -> None:
        reason.append(f"signal {signum}")
        stop_event.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    life = ServiceLifecycle(ctx.db, service,
                            still_alive_interval_seconds=ctx.settings.notifications.still_alive_interval_seconds)
    life.started()
    health = heartbeat(ctx, service, instance=instance)
    why = "stopped"
    try:
        body(stop_event, life)
        why = reason[0] if reason else "stopped"
    except BaseException as e:
        why = f"error: {type(e).__name__}: {e}"
        raise
    finally:
        health.stop(remove=True)
        life.stopped(why)
        for s, h in old.items():
            signal.signal(s, h)


@commands.command()
def notifier(config: ConfigOpt = None, instance: InstanceOpt = None) -> None:
    """Deliver the notification outbox (SMTP, apprise) until stopped: retries with backoff, dead letters."""
    from packhorse.executors.services import notifier_for  # deferred: start-up time

    ctx = context(config)
    cfg = ctx.settings.notifications
    if not cfg.enabled or not cfg.channels_configured:
        raise fail("notifications: no channel configured (set [notifications.smtp] or apprise_urls) "
                    "or notifications.enabled = false", EXIT_CONFIG)
    try:
        n = notifier_for(ctx)
    except ConfigError as e:
        raise fail(str(e), EXIT_CONFIG) from None
    print(f"packhorse notifier: delivering through {', '.join(c.name for c in n.channels)}", file=sys.stderr)

    def body(stop_event: Any, life: Any) -> None:
        import threading

        # delivery in a thread: a signal only has to set stop_event, and a send in progress is
        # aborted, so the service stops within seconds whatever the mail server does
        t = threading.Thread(target=n.serve, args=(stop_event,), kwargs={"on_cycle": life.tick},
                             name="notifier", daemon=True)
        t.start()
        while not stop_event.wait(0.5) and t.is_alive():
            pass
        n.stop()
        t.join(timeout=cfg.stop_grace_seconds)

    _serve(ctx, "notifier", body, instance=instance)
    n.flush(cfg.stop_grace_seconds)  # its own "stopped" message, if the server takes it at once


@commands.command("disk-monitor")
def disk_monitor(config: ConfigOpt = None, instance: InstanceOpt = None) -> None:
    """Measure every active disk location every disk_usage.interval_seconds (60 s) until stopped."""
    from packhorse.rules.disk_usage import DiskMonitor  # deferred: start-up time

    ctx = context(config)
    monitor = DiskMonitor(ctx.db, ctx.settings, ctx.topology.location_ids, hooks=ctx.hooks)

    def body(stop_event: Any, life: Any) -> None:
        import threading

        t = threading.Thread(target=monitor.serve, args=(stop_event,), daemon=True)
        t.start()
        while not stop_event.wait(1.0):
            life.tick()
        t.join(timeout=30)

    _serve(ctx, "disk-monitor", body, instance=instance)
@commands.command()
def monitor(
    config: ConfigOpt = None,
    once: Annotated[bool, typer.Option("--once", help="Run one cycle, print what it did, exit")] = False,
    as_json: JsonOpt = False,
    instance: InstanceOpt = None,
) -> None:
    """Run the stalled-task monitor (circuit breakers) and the reconciler as a service."""
    from packhorse.engine.pipeline import recover  # deferred: start-up time
    from packhorse.recovery.loop import ServiceLoop  # deferred: start-up time

    ctx = context(config)
    rec = ctx.settings.recovery
    broker = None
    if ctx.settings.executor.kind == "celery":  # the reconciler asks the broker what is still queued
        from packhorse.executors.celery_app import BrokerQueues, make_app  # deferred: start-up time
        from packhorse.recovery.reconciler import BrokerWatch  # deferred: start-up time

        broker = BrokerWatch.for_settings(BrokerQueues(ctx, make_app(ctx.settings)), ctx.settings)
        if once:  # one pass: what the broker no longer holds now is lost
            broker.confirm = 0.0
    if once:
        report = recover(ctx, broker=broker)
        data = {"reset": report.reset, "blocked": report.blocked, "unhandled": report.unhandled,
                "let_through": report.let_through}
        if as_json:
            print_json(data)
        else:
            print(" ".join(f"{k}={','.join(map(str, v)) or '-'}" for k, v in data.items()))
        raise typer.Exit(EXIT_OK)
    runtime = RuntimeSettings(ctx.db, ctx.settings)  # `packhorse config set` reaches a running monitor

    def interval() -> float:
        runtime.refresh()
        return runtime.monitor_interval_seconds

    loop = ServiceLoop(ctx.db, "monitor", lambda _session: recover(ctx, broker=broker),
                       interval_seconds=interval,
                       max_consecutive_errors=ctx.settings.managers.max_consecutive_errors,
                       notification_cooldown_seconds=rec.notification_cooldown_seconds)

    def stop(signum: int, _frame: object) -> None:
        loop.stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    health = heartbeat(ctx, "monitor", instance=instance)
    try:
        loop.run()
    finally:
        health.stop(remove=True)


def serve_api(ctx: ProcessContext, host: str, port: int) -> "Any":
    """Start the HTTP API in a background thread; returns the uvicorn server (``should_exit``
    stops it). Prints ``packhorse api: serving on http://HOST:PORT`` on stderr once listening."""
    import threading

    import uvicorn

    from packhorse.api.app import create_app  # deferred: start-up time

    server = uvicorn.Server(uvicorn.Config(create_app(ctx.settings, ctx=ctx), host=host, port=port,
                                          log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, name="api", daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.05)
    if not server.started:
        raise fail(f"api: cannot listen on {host}:{port}", EXIT_CONFIG)
    bound = server.servers[0].sockets[0].getsockname()[1] if server.servers else port
    print(f"packhorse api: serving on http://{host}:{bound}", file=sys.stderr, flush=True)
    if not _is_loopback(host):
        print(f"packhorse api: warning: {host} is not a loopback address and this is plain HTTP: bearer tokens "
              "cross the network in clear text; serve it behind a TLS reverse proxy "
              "(docs/operator-guide.md, 'Serving over TLS')", file=sys.stderr, flush=True)
    return server


def _is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@commands.command()
def api(
    config: ConfigOpt = None,
    host: Annotated[Optional[str], typer.Option("--host", help="address to listen on [default: api.host]")] = None,
    port: Annotated[Optional[int], typer.Option("--port", help="port (0: any free port) [default: api.port]")] = None,
    instance: InstanceOpt = None,
) -> None:
    """Serve the HTTP API, /metrics and the web dashboard until stopped; listed by packhorse
    health (kind api) while it serves."""
    ctx = context(config)
    server = serve_api(ctx, host or ctx.settings.api.host, ctx.settings.api.port if port is None else port)
    stop = {"now": False}

    def on_signal(signum: int, _frame: object) -> None:
        stop["now"] = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    # a heartbeat as every other service has: health lists it, and tells when it died
    health = heartbeat(ctx, "api", instance=instance)
    try:
        while not stop["now"] and not server.should_exit:
            time.sleep(0.2)
    finally:
        server.should_exit = True
        health.stop(remove=True)
