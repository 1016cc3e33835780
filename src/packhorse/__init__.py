"""packhorse: verified, write-once transfer and archiving of raw scientific data.

The public surface is small; everything else is private to the package.
"""

from packhorse.config import Settings, load_config
from packhorse.domain import CopyStatus, LocationRole, OperationKind, Status, StorageType
from packhorse.errors import (
    ConfigError,
    DestinationConflictError,
    LeaseLostError,
    OperationError,
    PackhorseError,
    UnsafePathError,
    VerificationError,
)

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "CopyStatus",
    "DestinationConflictError",
    "LeaseLostError",
    "LocationRole",
    "OperationError",
    "OperationKind",
    "PackhorseError",
    "Settings",
    "Status",
    "StorageType",
    "UnsafePathError",
    "VerificationError",
    "__version__",
    "load_config",
]
