"""Storage backends: one narrow interface (:mod:`.base`), one module per storage type.

Building a location's backend is :mod:`.registry`'s (``backend_for``, ``compose``), imported from
there: importing one backend module (``packhorse.storage.disk``, for a bag read from a disk)
does not load every storage type's SDK and the database the registry needs.
"""

from packhorse.storage.base import ObjectInfo, PendingWrite, PublishResult, StorageBackend, check_key

__all__ = ["ObjectInfo", "PendingWrite", "PublishResult", "StorageBackend", "check_key"]
