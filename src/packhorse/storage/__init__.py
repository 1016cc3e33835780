"""Storage backends: one narrow interface (:mod:`.base`), one module per storage type."""

from packhorse.storage.base import ObjectInfo, PendingWrite, PublishResult, StorageBackend, check_key
from packhorse.storage.registry import backend_for, compose

__all__ = ["ObjectInfo", "PendingWrite", "PublishResult", "StorageBackend", "backend_for", "check_key", "compose"]
