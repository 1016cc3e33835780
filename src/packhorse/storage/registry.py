"""Build the storage backend of a data location: the one place where backends are composed."""

from __future__ import annotations

from ..config import Settings
from ..domain import StorageType
from ..errors import ConfigError
from .base import StorageBackend
from .disk import DiskBackend


def backend_for(settings: Settings, location_name: str) -> StorageBackend:
    """Return the backend for data location ``location_name``.

    Raises:
        ConfigError: unknown location or unsupported storage type.
    """
    try:
        loc = settings.location(location_name)
    except KeyError:
        raise ConfigError(f"unknown data location {location_name!r}") from None
    if loc.storage is StorageType.DISK:
        return DiskBackend(loc.name, settings.location_path(loc.name))
    raise ConfigError(f"locations: storage type {loc.storage.value!r} of {loc.name!r} is not supported yet")
