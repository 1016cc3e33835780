"""The process context: what one process of packhorse holds for its whole life.

A :class:`ProcessContext` is built once per process (after any fork: the local runner's worker
processes, every Celery pool child, each CLI command) and handed to the managers, the stages,
the pipeline and the services. It owns nothing but references: the settings, the database
(one engine per process; DESIGN.md "Architecture"), the topology (name ↔ id maps of sites and
data locations), the process's fault hooks (:mod:`packhorse.runtime.hooks`; :data:`~packhorse.runtime.hooks.NO_HOOKS`
in production) and a cache of storage backends, one layer stack per data location and use
(:func:`packhorse.storage.registry.backend_for`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from packhorse.config import Settings
from packhorse.db.session import Database
from packhorse.runtime.hooks import Hooks, hooks_for
from packhorse.runtime.topology import Topology
from packhorse.storage.registry import backend_for

if TYPE_CHECKING:
    from packhorse.runtime.influx import InfluxSink
    from packhorse.storage.base import StorageBackend


@dataclass
class ProcessContext:
    """Process-wide things every component needs: settings, database, topology, backends.

    Attributes:
        settings: the validated configuration.
        db: the ops database of this process (never shared across a fork).
        topology: ids of the configured sites and data locations (:func:`packhorse.runtime.topology.sync_topology`).
        hooks: fault hooks handed in by a test; by default those of ``[hooks] module``
            (:func:`packhorse.runtime.hooks.hooks_for`), i.e. none in production.
    """

    settings: Settings
    db: Database
    topology: Topology
    hooks: Hooks = None  # type: ignore[assignment]  # set in __post_init__
    _backends: dict[tuple[str, bool], "StorageBackend"] = field(default_factory=dict)
    _metrics_sink: InfluxSink | None = None

    def __post_init__(self) -> None:
        if self.hooks is None:
            self.hooks = hooks_for(self.settings)

    def backend(self, location: str, *, fixity: bool = False) -> "StorageBackend":
        """The (cached) storage backend of data location ``location``: the composed layer
        stack of :func:`packhorse.storage.registry.backend_for`; ``fixity=True`` gives the
        stack whose reads keep to the location's ``fixity_bytes_per_second``.

        Raises:
            ConfigError: ``location`` is not configured, or its store is refused.
        """
        b = self._backends.get((location, fixity))
        if b is None:

            b = self._backends[(location, fixity)] = backend_for(self.settings, location, db=self.db,
                                                                hooks=self.hooks, fixity=fixity)
        return b

    def metrics_sink(self) -> InfluxSink | None:
        """This process's InfluxDB sink (:mod:`packhorse.runtime.influx`; started on first use), or
        ``None`` when ``[metrics.influxdb] url`` is not set."""
        if self._metrics_sink is None and self.settings.metrics.influxdb.url:
            from packhorse.runtime.influx import InfluxSink  # optional: Prometheus client

            self._metrics_sink = InfluxSink(self.settings.metrics.influxdb)
        return self._metrics_sink

    def location_name(self, location_id: int | None) -> str:
        """Name of data location ``location_id``.

        Raises:
            KeyError: no configured location has this id.
        """
        assert location_id is not None
        return self.topology.location_names[location_id]
