"""Runtime settings: a few settings an admin may change while services run.

They live in the ``runtime_settings`` table (``packhorse config set KEY VALUE`` or
``PUT /api/admin/settings/{key}``), override the configuration file, and are picked up by
running services within ``managers.runtime_settings_refresh_seconds`` (default 60 s) without
a restart. Every change is appended to the audit log.

Keys (:data:`KEYS`):

* ``managers.poll_interval_seconds`` — how often managers look for new work (float > 0, s).
* ``recovery.monitor_interval_seconds`` — how often lease recovery looks for stalls (float > 0, s).
* ``log_level`` — ``DEBUG``, ``INFO``, ``WARNING``, ``ERROR`` or ``CRITICAL``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from packhorse import logs
from packhorse.config import Settings
from packhorse.db.models import RuntimeSetting, utcnow
from packhorse.db.session import Database
from packhorse.errors import RuntimeSettingError
from packhorse.runtime import audit

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass(frozen=True)
class Key:
    """One runtime-settable key: how to parse a value, where its file default is, and the JSON
    Schema of the values it accepts (``schema``: what the API's OpenAPI document shows for it)."""

    name: str
    description: str
    parse: Callable[[Any], Any]
    default: Callable[[Settings], Any]
    schema: dict[str, Any]


def _positive_seconds(key: str) -> Callable[[Any], float]:
    def parse(value: Any) -> float:
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise RuntimeSettingError(f"{key}: {value!r} is not a number of seconds") from None
        if not v > 0 or v != v or v == float("inf"):
            raise RuntimeSettingError(f"{key}: {value!r} must be a positive, finite number of seconds")
        return v

    return parse


def _log_level(value: Any) -> str:
    v = str(value).upper()
    if v not in LOG_LEVELS:
        raise RuntimeSettingError(f"log_level: {value!r} is not one of {', '.join(LOG_LEVELS)}")
    return v


#: The values :func:`_positive_seconds` accepts (a numeric string such as ``"5"`` too).
_SECONDS_SCHEMA: dict[str, Any] = {"type": "number", "exclusiveMinimum": 0,
                                   "description": "seconds: a positive, finite number"}

KEYS: dict[str, Key] = {k.name: k for k in (
    Key("managers.poll_interval_seconds", "how often managers look for new work (seconds)",
        _positive_seconds("managers.poll_interval_seconds"), lambda s: s.managers.poll_interval_seconds,
        _SECONDS_SCHEMA),
    Key("recovery.monitor_interval_seconds", "how often lease recovery looks for stalled operations (seconds)",
        _positive_seconds("recovery.monitor_interval_seconds"), lambda s: s.recovery.monitor_interval_seconds,
        _SECONDS_SCHEMA),
    Key("log_level", "log level of running services", _log_level, lambda s: None,
        {"type": "string", "enum": list(LOG_LEVELS), "description": "a log level (any letter case)"}),
)}


def value_schemas() -> list[dict[str, Any]]:
    """The JSON Schema of each key's values, titled with the key and described with its
    description: ``[{"title": key, "description": …, "type": …, …}]`` in :data:`KEYS` order
    (the alternatives of the API's ``SettingIn.value``)."""
    return [{**k.schema, "title": k.name, "description": f"{k.name}: {k.description}; {k.schema['description']}"}
            for k in KEYS.values()]


def _key(name: str) -> Key:
    try:
        return KEYS[name]
    except KeyError:
        raise RuntimeSettingError(f"unknown runtime setting {name!r}; one of {', '.join(KEYS)}") from None


def parse_value(name: str, value: Any) -> Any:
    """Validate ``value`` for key ``name``; returns the parsed value.

    Raises:
        RuntimeSettingError: unknown key or unacceptable value.
    """
    return _key(name).parse(value)


def set_setting(db: Database, name: str, value: Any, *, actor: str) -> Any:
    """Store ``value`` for ``name`` (validated) and audit the change; returns the parsed value.

    Raises:
        RuntimeSettingError: unknown key or unacceptable value (audited as ``refused``).
    """
    try:
        parsed = parse_value(name, value)
    except RuntimeSettingError as e:
        audit.record(db, actor=actor, action="settings.set", target=name, details={"value": value},
                     result="refused", message=str(e))
        raise

    def tx(s: Session) -> Any:
        row = s.get(RuntimeSetting, name)
        old = json.loads(row.value) if row else None
        if row is None:
            s.add(RuntimeSetting(key=name, value=json.dumps(parsed), updated_at=utcnow(), updated_by=actor))
        else:
            row.value, row.updated_at, row.updated_by = json.dumps(parsed), utcnow(), actor
        return old

    old = db.transact(tx)
    audit.record(db, actor=actor, action="settings.set", target=name, details={"value": parsed, "previous": old})
    return parsed


def unset_setting(db: Database, name: str, *, actor: str) -> bool:
    """Remove the override of ``name`` (the file's value applies again); audited.

    Returns:
        whether an override existed.

    Raises:
        RuntimeSettingError: unknown key.
    """
    _key(name)
    existed = db.transact(lambda s: s.execute(delete(RuntimeSetting).where(RuntimeSetting.key == name)).rowcount) == 1
    audit.record(db, actor=actor, action="settings.unset", target=name, details={"existed": existed})
    return existed


def stored(session: Session) -> dict[str, Any]:
    """The stored overrides: ``{key: value}`` (unknown keys of a newer version are skipped)."""
    return {r.key: json.loads(r.value) for r in session.scalars(select(RuntimeSetting)) if r.key in KEYS}


def effective(session: Session, settings: Settings, name: str) -> Any:
    """The value of key ``name`` in force now: the stored override read in ``session``, else the
    file's. For views judged by a setting a running service follows (``status``, ``health`` and
    ``/metrics`` judge a lease "not reclaimed" by the monitor interval the monitor uses).

    Raises:
        RuntimeSettingError: ``name`` is not a runtime setting."""
    key = _key(name)
    value = stored_value(session, name)
    return key.default(settings) if value is None else value


def stored_value(session: Session, name: str) -> Any | None:
    """The override of key ``name`` stored now (read in ``session``), ``None`` when there is none."""
    row = session.get(RuntimeSetting, name)
    return json.loads(row.value) if row is not None else None


def describe(session: Session, settings: Settings) -> list[dict[str, Any]]:
    """Every key with its effective value: ``[{"key", "value", "default", "source" ("runtime" or
    "file"), "description", "updated_at", "updated_by"}]``."""
    rows = {r.key: r for r in session.scalars(select(RuntimeSetting))}
    out = []
    for k in KEYS.values():
        r = rows.get(k.name)
        out.append({"key": k.name, "value": json.loads(r.value) if r else k.default(settings),
                    "default": k.default(settings), "source": "runtime" if r else "file",
                    "description": k.description, "updated_at": r.updated_at.isoformat() if r else None,
                    "updated_by": r.updated_by if r else None})
    return out


class RuntimeSettings:
    """What a running service reads: file settings overlaid with the stored overrides.

    :meth:`refresh` re-reads the table when ``refresh_seconds`` passed since the last read
    (call it every loop iteration; it is cheap in between). A changed ``log_level`` is applied
    to logging at once. A database error keeps the last values (logged by the caller's loop).

    Args:
        db: the ops database.
        settings: the file settings (defaults).
        refresh_seconds: how often to re-read, default ``managers.runtime_settings_refresh_seconds``.
    """
    def __init__(self, db: Database, settings: Settings, refresh_seconds: float | None = None) -> None:
        self.db = db
        self.settings = settings
        self.refresh_seconds = (settings.managers.runtime_settings_refresh_seconds
                                if refresh_seconds is None else refresh_seconds)
        self._values: dict[str, Any] = {}
        self._read_at = float("-inf")
        self._lock = threading.Lock()
        self._applied_level: str | None = None

    def refresh(self, *, force: bool = False) -> bool:
        """Re-read the overrides if due (or ``force``); returns whether they were read."""
        with self._lock:
            if not force and time.monotonic() - self._read_at < self.refresh_seconds:
                return False
            self._read_at = time.monotonic()
        try:
            values = self.db.read(stored)
        except Exception:
            return False
        with self._lock:
            self._values = values
        level = values.get("log_level")
        if level and level != self._applied_level:

            logs.configure(level, json=logs.current_config().get("json"))  # type: ignore[arg-type]
            self._applied_level = level
        return True

    def seconds_until_refresh(self) -> float:
        """Seconds until the next read is due (loops should not sleep longer than this)."""
        return max(0.0, self.refresh_seconds - (time.monotonic() - self._read_at))

    def get(self, name: str) -> Any:
        """The effective value of key ``name`` (override, else the file's)."""
        with self._lock:
            if name in self._values:
                return self._values[name]
        return _key(name).default(self.settings)

    @property
    def poll_interval_seconds(self) -> float:
        """Effective ``managers.poll_interval_seconds``."""
        return float(self.get("managers.poll_interval_seconds"))

    @property
    def monitor_interval_seconds(self) -> float:
        """Effective ``recovery.monitor_interval_seconds``."""
        return float(self.get("recovery.monitor_interval_seconds"))
