"""Mirror the configured sites and data locations into the ops database (ids for foreign keys).

A location removed from the configuration stays in the database (its copies still exist) and
is marked inactive. Keys of stored objects are fixed here: one naming rule for every location.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from packhorse.config import Settings
from packhorse.db.models import DataLocation, Installation, Site
from packhorse.db.session import Database
from packhorse.domain import LocationRole
from packhorse.errors import DatabaseNotInitializedError


def raw_package_key(name: str) -> str:
    """Object key of raw data package ``name`` at any location: ``raw/<name>.tar``."""
    return f"raw/{name}.tar"


def bundle_key(name: str) -> str:
    """Object key of data transfer package ``name`` at any location: ``bundles/<name>.tar``."""
    return f"bundles/{name}.tar"


@dataclass
class Topology:
    """Name ↔ id maps of sites and data locations, and each location's role and site."""
    site_ids: dict[str, int] = field(default_factory=dict)
    location_ids: dict[str, int] = field(default_factory=dict)
    location_names: dict[int, str] = field(default_factory=dict)
    location_site: dict[str, str] = field(default_factory=dict)
    location_role: dict[str, LocationRole] = field(default_factory=dict)
    #: the identity marker's uuid recorded by ``packhorse init`` per location (``None``: not yet)
    location_marker: dict[str, str | None] = field(default_factory=dict)
    #: the identity ``packhorse init`` recorded for a read-only source (no marker is written
    #: there: :func:`packhorse.storage.identity.root_fingerprint`); ``None`` for the others
    location_fingerprint: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    #: this installation's uuid (:class:`~packhorse.db.models.Installation`; ``None`` before the
    #: first ``packhorse init``): a root marked by another installation is not ours
    installation: str | None = None

    def site_name(self, site_id: int) -> str:
        """The name of site ``site_id``."""
        for name, i in self.site_ids.items():
            if i == site_id:
                return name
        raise KeyError(site_id)


def sync_topology(db: Database, settings: Settings) -> Topology:
    """Insert/update sites and locations from ``settings``; return the id maps."""
    def tx(s: Session) -> Topology:
        topo = Topology()
        existing_sites = {x.name: x for x in s.scalars(select(Site))}
        for site in settings.sites:
            row = existing_sites.get(site.name)
            if row is None:
                row = Site(name=site.name)
                s.add(row)
                s.flush()
            topo.site_ids[site.name] = row.id
        for name, row in existing_sites.items():
            topo.site_ids.setdefault(name, row.id)
        existing = {x.name: x for x in s.scalars(select(DataLocation))}
        configured = set()
        for loc in settings.locations:
            configured.add(loc.name)
            uri = str(settings.location_path(loc.name)) if loc.path else loc.name
            row = existing.get(loc.name)
            if row is None:
                row = DataLocation(name=loc.name, site_id=topo.site_ids[loc.site], role=loc.role.value,
                                   storage_type=loc.storage.value, uri=uri, active=loc.active)
                s.add(row)
                s.flush()
            else:
                row.site_id = topo.site_ids[loc.site]
                row.role, row.storage_type, row.uri, row.active = loc.role.value, loc.storage.value, uri, loc.active
            topo.location_ids[loc.name] = row.id
            topo.location_names[row.id] = loc.name
            topo.location_site[loc.name] = loc.site
            topo.location_role[loc.name] = loc.role
            topo.location_marker[loc.name] = row.marker_uuid
            topo.location_fingerprint[loc.name] = row.fingerprint
        topo.installation = s.scalar(select(Installation.uuid).where(Installation.id == 1))
        for name, row in existing.items():
            if name not in configured:
                row.active = False
                topo.location_ids[name] = row.id
                topo.location_names[row.id] = name
                topo.location_role[name] = LocationRole(row.role)
        return topo

    return db.transact(tx)


def load_topology(db: Database, settings: Settings) -> Topology:
    """Read the id maps of the configured sites and locations without writing (distributed
    workers: one configuration, many processes; only ``packhorse init`` and the manager write
    the topology).

    Raises:
        DatabaseNotInitializedError: a configured site or location is not in the database yet
            (run ``packhorse init`` with this configuration).
    """
    def tx(s: Session) -> Topology:
        topo = Topology()
        names = {}
        for row in s.scalars(select(Site)):
            topo.site_ids[row.name] = row.id
            names[row.id] = row.name
        for row in s.scalars(select(DataLocation)):
            topo.location_ids[row.name] = row.id
            topo.location_names[row.id] = row.name
            topo.location_site[row.name] = names[row.site_id]
            topo.location_role[row.name] = LocationRole(row.role)
            topo.location_marker[row.name] = row.marker_uuid
            topo.location_fingerprint[row.name] = row.fingerprint
        topo.installation = s.scalar(select(Installation.uuid).where(Installation.id == 1))
        missing = [x.name for x in settings.sites if x.name not in topo.site_ids]
        missing += [x.name for x in settings.locations if x.name not in topo.location_ids]
        if missing:
            raise DatabaseNotInitializedError(
                f"sites/locations {', '.join(missing)} are not in the database; run `packhorse init`")
        return topo

    return db.read(tx)
