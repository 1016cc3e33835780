"""Logging: structlog to stderr (console lines on a terminal, JSON otherwise or when asked).

Machine-readable command output goes to stdout alone; logs and progress go to stderr.
"""

from __future__ import annotations

import logging
import sys

import structlog

_FORMAT: dict[str, bool] = {}
_current: dict[str, object] = {"level": "INFO", "json": None}


def set_format(fmt: str) -> None:
    """Choose the log format for every later :func:`configure`: ``"json"`` or ``"console"``."""
    _FORMAT["json"] = fmt == "json"


def chosen_format() -> str | None:
    """``"json"`` or ``"console"`` if one was chosen (``--log-format``), else ``None``."""
    if "json" not in _FORMAT:
        return None
    return "json" if _FORMAT["json"] else "console"


def current_config() -> dict[str, object]:
    """The arguments of the last :func:`configure` call (worker processes copy them)."""
    return dict(_current)


def configure(level: str = "INFO", *, json: bool | None = None) -> None:
    """Configure structlog and the standard logging module.

    Args:
        level: ``DEBUG``/``INFO``/``WARNING``/``ERROR``.
        json: JSON lines; default: as chosen by :func:`set_format` (``--log-format``), else
            JSON unless stderr is a terminal.
    """
    lvl = getattr(logging, level.upper(), logging.INFO)
    if json is None:
        json = _FORMAT.get("json")
    _current.update(level=level, json=json)
    use_json = (not sys.stderr.isatty()) if json is None else json
    renderer = structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        # one write(2) per line: worker processes share stderr, and print() writes the line and
        # its newline separately, so lines of two processes could interleave
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=max(lvl, logging.WARNING), stream=sys.stderr)
