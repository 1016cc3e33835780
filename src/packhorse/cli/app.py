"""What every ``packhorse`` command shares: the global options, exit codes, option types,
configuration and database opening, JSON output, and the one helper behind the commands that
act on one operation (``KIND ID [--reason] [--json]``).

Each cli module holds its commands in a :func:`command_set` of its own, which the ``packhorse``
application (:mod:`packhorse.cli`) loads only when one of them runs: a command's start-up
imports its own module and what it needs, not the database layer and every other command's
dependencies (``packhorse --version`` and ``validate`` need no SQLAlchemy; ``--help`` lists
every command, so it loads every command's module). This module therefore
imports the database and runtime layers only inside the functions that open them.

Exit codes: 0 ok, 1 a check found a problem, 2 configuration error, 3 an operation FAILED,
4 work is blocked and waits (by itself or on one command: :mod:`packhorse.status.blocked_work`). Machine-readable output (``--json``) goes to stdout
alone; logs and progress go to stderr.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Optional

import typer
from rich.console import Console

from packhorse import logs
from packhorse.config import Settings, load_config
from packhorse.errors import (
    ConfigError,
    DatabaseNotInitializedError,
    LocationUnavailableError,
    StorageServiceError,
    UnknownOperationError,
)

if TYPE_CHECKING:
    from packhorse.db.session import Database
    from packhorse.domain import OperationKind
    from packhorse.runtime.context import ProcessContext

EXIT_OK, EXIT_PROBLEM, EXIT_CONFIG, EXIT_FAILED, EXIT_BLOCKED = 0, 1, 2, 3, 4
#: ``validate``: every bag valid, one or more incomplete (payload files listed in fetch.txt not
#: there yet, RFC 8493 §2.2.3); ``verify``: nothing bad found, but copies in cold storage could
#: not be read (not restored: their restore is requested)
EXIT_INCOMPLETE = 5
#: the reader of the command's output closed it before the command was done (``packhorse
#: locate ... | head``): 128 + SIGPIPE, what a shell reports for a command that SIGPIPE ended,
#: so that it is never taken for "nothing matches" (1)
EXIT_OUTPUT_CLOSED = 128 + 13

#: what ``packhorse --help`` says first (the application's help)
HELP = "packhorse: pack raw data into BagIt bags, ship, verify and archive it exactly once."
err = Console(stderr=True)

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="TOML configuration file [default: ./packhorse.toml]")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout")]
KindArg = Annotated[str, typer.Argument(help="operation kind, e.g. long_term_archive")]
OperationIdArg = Annotated[int, typer.Argument(help="operation id", min=1, max=2**63 - 1)]
ReasonOpt = Annotated[str, typer.Option("--reason", help="why (logged and notified)")]
#: The instance name of a service among several of one kind on one host: part of its health
#: identity (packhorse.recovery.health.service_identity)
InstanceOpt = Annotated[Optional[str], typer.Option(
    "--instance", envvar="PACKHORSE_INSTANCE",
    help="name of this service among several of its kind on this host (its health identity)")]


def heartbeat(ctx: "ProcessContext", kind: str, *, instance: str | None, site: str | None = None) -> Any:
    """A started :class:`~packhorse.recovery.health.HeartbeatThread` of this service (kind,
    site, instance; intervals from ``[recovery]``); a bad ``--instance`` exits 2 naming it."""
    from packhorse.recovery.health import HeartbeatThread  # deferred: start-up time

    rec = ctx.settings.recovery
    try:
        t = HeartbeatThread(ctx.db, kind, site=site, instance=instance,
                            interval_seconds=rec.service_heartbeat_interval_seconds,
                            forget_after_seconds=rec.service_forget_after_seconds)
    except ConfigError as e:
        raise fail(str(e), EXIT_CONFIG) from None
    return t.start()


def _print_version(value: bool) -> None:
    if value:
        from packhorse import __version__  # deferred: start-up time

        print(f"packhorse {__version__}")
        raise typer.Exit(EXIT_OK)


def command_set(**options: Any) -> typer.Typer:
    """A typer application that holds the commands of one cli module (``options``: typer's, for
    a command group such as ``token``); :mod:`packhorse.cli` loads it when one of its commands
    runs. Help text is plain, as in the application itself (no rich markup)."""
    return typer.Typer(rich_markup_mode=None, **options)


def global_options(
    version: Annotated[bool, typer.Option("--version", "-V", callback=_print_version, is_eager=True,
                                          help="Print the packhorse version and exit")] = False,
    log_format: Annotated[Optional[str], typer.Option(
        "--log-format", help="Log lines on stderr: json or console [default: console on a terminal, else json]",
        envvar="PACKHORSE_LOG_FORMAT")] = None,
) -> None:
    """The options before the command (the application's callback, :mod:`packhorse.cli`):
    ``--version`` prints it and exits 0; ``--log-format`` other than json or console exits 2."""

    if log_format is not None:
        if log_format not in ("json", "console"):
            raise fail(f"--log-format: {log_format!r} is not one of json, console", EXIT_CONFIG)
        logs.set_format(log_format)


def fail(message: str, code: int) -> typer.Exit:
    """Print ``error: message`` on stderr and return the exit to raise."""
    print(f"error: {message}", file=sys.stderr)
    return typer.Exit(code)


def log_level(default: str) -> str:
    """The log level: ``PACKHORSE_LOG_LEVEL`` if set (checked: a typo must not silently log at
    another level), else ``default``. Raises ``typer.Exit(2)`` on an unknown level."""
    from packhorse.runtime.settings import LOG_LEVELS  # deferred: start-up time

    value = os.environ.get("PACKHORSE_LOG_LEVEL")
    if value is None:
        return default
    if value.strip().upper() not in LOG_LEVELS:
        raise fail(f"PACKHORSE_LOG_LEVEL: {value!r} is not a log level; one of {', '.join(LOG_LEVELS)}",
                   EXIT_CONFIG)
    return value.strip().upper()


def settings(config: Path | None) -> Settings:
    """The validated configuration of ``config`` (default ``./packhorse.toml``); a bad file
    exits 2 with the message naming the key."""
    try:
        return load_config(config)
    except ConfigError as e:
        raise fail(str(e), EXIT_CONFIG) from None


def database(settings: Settings, *, migrate_check: bool) -> Database:
    """Open the ops database; an unusable URL or an un-migrated schema exits 2."""
    from sqlalchemy.exc import SQLAlchemyError

    from packhorse.db.session import Database  # deferred: start-up time (SQLAlchemy)

    url = settings.database_url
    if migrate_check and url.startswith("sqlite:///") and not os.path.exists(url[len("sqlite:///"):]):
        # do not leave an empty database file behind: only `init` creates it
        raise fail(f"{settings.config_file}: database.url: the database file {url[len('sqlite:///'):]} does not "
                   "exist; "
                   "run `packhorse init` to create it",
                   EXIT_CONFIG)
    try:
        db = Database.from_settings(settings)
        if migrate_check:
            db.ensure_migrated()
        else:
            db.current_revision()  # connects: a wrong URL fails here, not half-way through
        return db
    except DatabaseNotInitializedError as e:
        raise fail(str(e), EXIT_CONFIG) from None
    except (SQLAlchemyError, ImportError, ValueError) as e:
        reason = getattr(e, "orig", None) or e
        raise fail(f"{settings.config_file}: database.url: cannot open {settings.database.url!r}: {reason}",
                   EXIT_CONFIG) from None


def context(config: Path | None, *, migrate_check: bool = True) -> ProcessContext:
    """Configuration, migrated database and registered topology of ``config``; logging at
    WARNING unless ``PACKHORSE_LOG_LEVEL`` says otherwise."""
    from packhorse.runtime.context import ProcessContext  # deferred: start-up time (storage backends)
    from packhorse.runtime.topology import sync_topology  # deferred: start-up time (ORM models)

    logs.configure(log_level("WARNING"))
    s = settings(config)
    db = database(s, migrate_check=migrate_check)
    return ProcessContext(settings=s, db=db, topology=sync_topology(db, s))


def print_json(data: Any) -> None:
    """``data`` as indented JSON on stdout (datetimes and other objects as ``str``)."""
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


#: Console width off a terminal (piped, redirected): wide enough that no table is cut or wrapped.
PIPE_WIDTH = 10_000


def table_console(**options: Any) -> Console:
    """The console tables are printed on (stdout). On a terminal it has the terminal's width;
    off one (a pipe, a file) rich would assume 80 columns and cut cells, so it is
    :data:`PIPE_WIDTH` wide (columns still only as wide as their content)."""
    console = Console(**options)
    if not console.is_terminal:
        console = Console(width=PIPE_WIDTH, **options)
    return console


def printable(text: str) -> str:
    """``text`` with its control characters (a newline, a tab, ESC) written as escapes
    (``\\n``, ``\\x1b``): one line of plain output stays one line and cannot move the
    terminal's cursor (a file name or an audit target a user chose)."""
    return "".join(c if c.isprintable() or c == " " else c.encode("unicode_escape").decode("ascii") for c in text)


def shown(name: str) -> str:
    """A path or name as a table cell shows it: :func:`printable`, and ``[`` escaped so rich
    never reads a file name as markup. ``--json`` keeps the name itself."""
    from rich.markup import escape

    return escape(printable(name))


def parse_kind(kind: str) -> "OperationKind":
    """``kind`` as an ``OperationKind``; an unknown kind exits 2 listing the valid ones."""
    from packhorse.domain import OperationKind  # deferred: start-up time

    try:
        return OperationKind(kind)
    except ValueError:
        raise fail(f"unknown operation kind {kind!r}; one of {', '.join(k.value for k in OperationKind)}",
                   EXIT_CONFIG) from None


def require_routes(settings: Settings) -> None:
    """Refuse (exit 2, naming the key) a configuration under which registered files would never
    be archived: no ``[[routes]]`` at all, or an active source location whose site no route
    leaves from."""
    from packhorse.domain import LocationRole  # deferred: start-up time

    if not settings.routes:
        raise fail(f"{settings.config_file}: routes: the configuration has no [[routes]]: nothing would ever be "
                   "archived; add one, "
                   'e.g. [[routes]] source_site = "SITE" destination_sites = ["OTHER"] (docs/configuration.md)',
                   EXIT_CONFIG)
    for i, loc in enumerate(settings.locations):
        if loc.role is LocationRole.SOURCE and loc.active and settings.route_from(loc.site) is None:
            raise fail(f"{settings.config_file}: locations[{i}].site: source location {loc.name!r} is at site "
                       f"{loc.site!r}, which no "
                       f"[[routes]] has as source_site: its files would never be archived", EXIT_CONFIG)


def check_read_only_sources(ctx: ProcessContext) -> list[str]:
    """The read-only sources (:func:`~packhorse.rules.availability.read_only_sources`), with a
    warning on stderr for each one found read-only without ``read_only = true``; exits 2
    naming them when ``delete_source_files`` is on."""
    from packhorse.rules.availability import read_only_sources, root_of  # deferred: start-up time

    try:
        found = read_only_sources(ctx)
    except ConfigError as e:
        raise fail(str(e), EXIT_CONFIG) from None
    for name in found:
        if not ctx.settings.location(name).read_only:
            err.print(f"warning: source location {name}: its root {root_of(ctx, name)} is read-only; packhorse "
                      "writes nothing there (no identity marker, no deletion); set read_only = true in its "
                      "[[locations]] entry to say so", markup=False)
    return found


def check_storage(ctx: ProcessContext) -> None:
    """Build every active location's backend (S3 write-once probe, Object Lock check) before
    any work runs; a refused store exits 2 naming the location; read-only sources are checked
    (:func:`check_read_only_sources`)."""
    from packhorse.domain import StorageType  # deferred: start-up time

    check_read_only_sources(ctx)
    try:
        for loc in ctx.settings.locations:
            # disk backends need no probe (and never create their root)
            if loc.active and loc.storage is not StorageType.DISK:
                try:
                    ctx.backend(loc.name)
                except LocationUnavailableError as e:  # a missing bucket: its work waits for it
                    err.print(f"warning: {e}; work on it waits until it is there", markup=False)
    except (ConfigError, StorageServiceError) as e:
        raise fail(str(e), EXIT_CONFIG) from None


def operation_action(
    kind: str,
    config: Path | None,
    as_json: bool,
    act: Callable[[ProcessContext, "OperationKind"], Any],
    describe: Callable[["OperationKind", Any], str],
    *,
    refused: tuple[type[Exception], ...] = (),
    precheck: Callable[[], None] | None = None,
) -> None:
    """The body of every command that acts on operations of one kind (reset, retry, breaker
    reset): parse ``kind`` (unknown: exit 2), run ``precheck`` (argument checks that need no
    database; it raises ``typer.Exit`` itself), open the configuration and database, call
    ``act(ctx, kind)``, then print its result as JSON (``--json``) or ``describe(kind, result)``.

    ``UnknownOperationError`` and the ``refused`` exceptions (the action declined, e.g. a reset of
    an operation that is not FAILED) print ``error: ...`` and exit 1.
    """

    k = parse_kind(kind)
    if precheck is not None:
        precheck()
    ctx = context(config)
    try:
        out = act(ctx, k)
    except (UnknownOperationError, *refused) as e:
        raise fail(str(e), EXIT_PROBLEM) from None
    if as_json:
        print_json(out)
    else:
        print(describe(k, out))
