"""The process context: what one process of packhorse holds for its whole life.

A :class:`ProcessContext` is built once per process (after any fork: the local runner's worker
processes, every Celery pool child, each CLI command) and handed to the managers, the stages,
the pipeline and the services. It owns nothing but references: the settings, the database
(one engine per process; DESIGN.md "Architecture"), the topology (name ↔ id maps of sites and
data locations) and a cache of storage backends, one per data location.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .config import Settings
from .db.session import Database
from .topology import Topology

if TYPE_CHECKING:
    from .storage.base import StorageBackend


@dataclass
class ProcessContext:
    """Process-wide things every component needs: settings, database, topology, backends.

    Attributes:
        settings: the validated configuration.
        db: the ops database of this process (never shared across a fork).
        topology: ids of the configured sites and data locations (:func:`packhorse.topology.sync_topology`).
    """

    settings: Settings
    db: Database
    topology: Topology
    _backends: dict[str, "StorageBackend"] = field(default_factory=dict)

    def backend(self, location: str) -> "StorageBackend":
        """The (cached) storage backend of data location ``location``.

        Raises:
            KeyError: ``location`` is not configured.
        """
        b = self._backends.get(location)
        if b is None:
            from .storage.registry import backend_for

            b = self._backends[location] = backend_for(self.settings, location, db=self.db)
        return b

    def location_name(self, location_id: int | None) -> str:
        """Name of data location ``location_id``.

        Raises:
            KeyError: no configured location has this id.
        """
        assert location_id is not None
        return self.topology.location_names[location_id]
