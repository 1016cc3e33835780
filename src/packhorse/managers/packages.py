"""Raw data package manager: group registered, unpackaged files into packages.

Files of one group (see :func:`~packhorse.managers.scan.group_of`) form one package, split
at ``max_package_bytes`` (a larger file gets a package of its own) and at ``[extraction]
max_members`` tar members (a package every destination's tar reader would refuse is never made). A group that already has
a package gets a new one with a suffixed name (``a/b+2``, ``a/b+3``, ...). Files shallower
than ``group_depth`` form a package of their own folder (``_root`` for the location root).

Versions (README "Versions"): a package holds registrations of one ``version`` only. The
first contents of files go into ``a/b``, ``a/b+2``, …; the k-th versions of files whose
bytes changed after their earlier package was built into ``a/b+vk``, ``a/b+vk+2``, … with
``version = k`` (:func:`package_base`). A name, once given, always means the same bytes (I3).
Groups with unsettled files wait. A group's packages and their operations are created in one
transaction with its files' assignment, :data:`GROUPS_PER_COMMIT` groups per transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.orm import Session

from packhorse.bags.packaging import TAG_MEMBERS
from packhorse.db.models import RawDataFile, RawDataPackage, utcnow
from packhorse.domain import LocationRole, OperationKind
from packhorse.managers.wanted import create_missing, planned
from packhorse.operations.lifecycle import create_operations, dedup_key
from packhorse.runtime.context import ProcessContext

if TYPE_CHECKING:
    from packhorse.rules.convergence import Plan

ROOT_GROUP_NAME = "_root"
_FILES = RawDataFile.__table__
_PACKAGES = RawDataPackage.__table__
#: Groups packaged per transaction: each commit lets the first packages start (``on_commit``).
GROUPS_PER_COMMIT = 10


def package_base(group: str, version: int = 1) -> str:
    """The first name tried for a package of ``group`` holding files of ``version``: the group
    (``_root`` for the location root) for version 1, ``<group>+v<version>`` after."""
    base = group or ROOT_GROUP_NAME
    return base if version == 1 else f"{base}+v{version}"


def plan_group(files: Sequence[Any], limit: int, max_members: int | None = None) -> list[tuple[int, list[Any]]]:
    """How the unpackaged registrations of one group are packaged: ``[(version, files)]``, one
    entry per package, versions ascending, each split at ``limit`` bytes and at ``max_members``
    tar members (:func:`_split`).

    Args:
        files: rows with ``relative_path``, ``size`` (bytes) and ``version``.
        limit: ``max_package_bytes``.
        max_members: ``[extraction] max_members``, what every destination's tar reader accepts:
            a package gets at most ``max_members - TAG_MEMBERS`` files (its tar also holds the
            bag's tag files, :data:`packhorse.bags.packaging.TAG_MEMBERS`); ``None``: no count limit.
    """
    max_files = None if max_members is None else max(1, max_members - TAG_MEMBERS)
    by_version: dict[int, list[Any]] = {}
    for f in files:
        by_version.setdefault(int(f.version), []).append(f)
    return [(v, part) for v in sorted(by_version) for part in _split(by_version[v], limit, max_files)]


def name_for(group: str, taken: set[str], version: int = 1) -> str:
    base = package_base(group, version)
    if base not in taken:
        return base
    n = 2
    while f"{base}+{n}" in taken:
        n += 1
    return f"{base}+{n}"


def names_taken(session: Session, base: str, *, batch: int = 64) -> set[str]:
    """The package names in use among ``base``, ``base+2``, ``base+3``, … up to the first gap
    (enough for :func:`name_for`, which takes the lowest free one). Equality searches on the
    unique name index, ``batch`` names per query: not ``LIKE 'base+%'``, which reads the whole
    index and takes a ``_`` or ``%`` in a group name for a wildcard, nor a range, whose order
    depends on the PostgreSQL database's collation."""
    taken = set(session.scalars(select(RawDataPackage.name).where(RawDataPackage.name == base)))
    return (taken | _suffixes_taken(session, base, batch=batch)) if taken else taken


def _suffixes_taken(session: Session, base: str, *, batch: int = 64) -> set[str]:
    """The names in use among ``base+2``, ``base+3``, … up to the first gap, ``base`` itself
    known to be in use (:func:`names_taken`)."""
    taken: set[str] = set()
    first = 2
    while True:
        names = [f"{base}+{n}" for n in range(first, first + batch)]
        found = set(session.scalars(select(RawDataPackage.name).where(RawDataPackage.name.in_(names))))
        taken |= found
        if len(found) < batch:
            return taken
        first += batch


def names_taken_many(session: Session, bases: Collection[str]) -> dict[str, set[str]]:
    """:func:`names_taken` of every one of ``bases`` (names): one query for all of them, and
    the follow-up queries of :func:`names_taken` for its suffixed names (``base+2``, …) only for
    a base that query found in use (a group packaged before; the base is not asked about again).
    A transaction packaging many groups at once pays one round trip to the database here, not
    one per group (docs/benchmarks.md, "20,000 small files over a long thin link": a site
    reaches the database across the link)."""
    wanted = sorted(set(bases))
    used: set[str] = set()
    for i in range(0, len(wanted), 500):
        used |= set(session.scalars(select(RawDataPackage.name).where(RawDataPackage.name.in_(wanted[i:i + 500]))))
    return {b: (({b} | _suffixes_taken(session, b)) if b in used else set()) for b in wanted}


def _split(files: Sequence[Any], limit: int, max_files: int | None = None) -> list[list[Any]]:
    """Split rows with ``relative_path`` and ``size`` (bytes) into runs of at most ``limit`` bytes
    and at most ``max_files`` rows (sorted by path; a larger file is a run of its own)."""
    parts: list[list[Any]] = []
    cur: list[Any] = []
    size = 0
    for f in sorted(files, key=lambda f: f.relative_path.encode()):
        if cur and (size + f.size > limit or (max_files is not None and len(cur) >= max_files)):
            parts.append(cur)
            cur, size = [], 0
        cur.append(f)
        size += f.size
    if cur:
        parts.append(cur)
    return parts


def manage(ctx: ProcessContext, unsettled: dict[str, set[str]], *, locations: Collection[str] | None = None,
           groups: Collection[str] | None = None, on_commit: Callable[[], None] | None = None) -> int:
    """Create packages (and their ``raw_data_package`` operations); returns how many.

    Args:
        unsettled: per source location name, the groups whose files have not settled yet.
        locations: only these source locations (the distributed scan task packages its own
            location right after scanning it); default every source location.
        groups: only these groups (those a scan has just registered wholly:
            :func:`packhorse.managers.scan.scan_location`'s ``on_registered``); default all.
        on_commit: called after each committed transaction (of up to :data:`GROUPS_PER_COMMIT`
            groups), so the first packages can be dispatched while the rest are made.
    """
    created = 0
    for loc in ctx.settings.locations:
        if loc.role is not LocationRole.SOURCE or not loc.active:
            continue
        if locations is not None and loc.name not in locations:
            continue
        route = ctx.settings.route_from(loc.site)
        if route is None:
            continue
        loc_id = ctx.topology.location_ids[loc.name]
        buffer_name = ctx.settings.buffer_of(loc.site).name
        waiting = unsettled.get(loc.name, set())

        def unpackaged(s: Session) -> list[str]:
            return list(s.scalars(select(RawDataFile.group_path).where(
                RawDataFile.location_id == loc_id, RawDataFile.raw_data_package_id.is_(None)).distinct()))

        # the groups a scan has just registered need no read: the transaction below takes each
        # group's unpackaged files and leaves a group with none (a round trip saved a chunk of
        # a scan, across a long link)
        found = set(groups) if groups is not None else ctx.db.read(unpackaged)
        ready = [g for g in sorted(found) if g not in waiting]

        def tx(s: Session, chunk: list[str], loc_id: int = loc_id, site: str = loc.site,
               buffer_name: str = buffer_name) -> int:
            # A fixed handful of statements for the whole chunk, not a few per group: a site
            # across a long link pays a round trip to the database for each (a chunk of ten
            # groups took 41 statements, 4 s at a 100 ms round trip).
            conn = s.connection()
            files_of: dict[str, list[Any]] = {}
            for row in s.execute(select(RawDataFile.id, RawDataFile.relative_path, RawDataFile.size,
                                        RawDataFile.version, RawDataFile.group_path).where(
                    RawDataFile.location_id == loc_id, RawDataFile.group_path.in_(chunk),
                    RawDataFile.raw_data_package_id.is_(None))):
                files_of.setdefault(row.group_path, []).append(row)
            # groups with no file left were packaged meanwhile by another runner
            plans = {g: plan_group(files_of[g], ctx.settings.packaging.max_package_bytes,
                                   ctx.settings.extraction.max_members) for g in chunk if g in files_of}
            taken = names_taken_many(s, {package_base(g, v) for g, parts in plans.items() for v, _ in parts})
            now = utcnow()
            rows: list[dict[str, Any]] = []
            members: list[tuple[str, list[Any] | None]] = []  # (group, the part's files; None: the whole group)
            for group, parts in plans.items():
                for version, part in parts:
                    in_use = taken[package_base(group, version)]
                    name = name_for(group, in_use, version)
                    in_use.add(name)
                    rows.append(dict(name=name, group_path=group, source_location_id=loc_id, created_at=now,
                                     bagging_date=now.strftime("%Y-%m-%d"), file_count=len(part), version=version,
                                     payload_bytes=sum(f.size for f in part)))
                    members.append((group, None if len(parts) == 1 else part))
            if not rows:
                return 0
            # Core statements: this transaction holds the database's write lock; one INSERT of
            # every package (their ids in the order of ``rows``)
            ids = [r.id for r in conn.execute(insert(_PACKAGES).returning(_PACKAGES.c.id, sort_by_parameter_order=True),
                                              rows)]
            whole = [dict(b_group=g, b_package=pkg_id) for (g, part), pkg_id in zip(members, ids) if part is None]
            if whole:  # a whole group's files: no list of ids (one statement, its rows sent together)
                conn.execute(update(_FILES).where(
                    _FILES.c.location_id == loc_id, _FILES.c.group_path == bindparam("b_group"),
                    _FILES.c.raw_data_package_id.is_(None)).values(raw_data_package_id=bindparam("b_package")), whole)
            for (_, part), pkg_id in zip(members, ids):
                if part is not None:
                    file_ids = [f.id for f in part]
                    for i in range(0, len(file_ids), 500):
                        conn.execute(update(_FILES).where(_FILES.c.id.in_(file_ids[i:i + 500]))
                                     .values(raw_data_package_id=pkg_id))
            wanted = {dedup_key(OperationKind.RAW_DATA_PACKAGE, f"rdp{pkg_id}"): dict(
                site_id=ctx.topology.site_ids[site], raw_data_package_id=pkg_id, source_location_id=loc_id,
                destination_location_id=ctx.topology.location_ids[buffer_name]) for pkg_id in ids}
            create_operations(s, kind=OperationKind.RAW_DATA_PACKAGE, max_retries=ctx.settings.recovery.max_retries,
                              wanted=wanted)
            return len(wanted)

        for i in range(0, len(ready), GROUPS_PER_COMMIT):
            created += ctx.db.transact(lambda s, chunk=ready[i:i + GROUPS_PER_COMMIT]: tx(s, chunk))
            if on_commit is not None:
                on_commit()
    return created


def repair(ctx: ProcessContext, repairs: "Plan | None" = None) -> int:
    """Create the rebuilds of lost raw data packages from their registered source files that
    the desired state asks for (:func:`packhorse.rules.convergence.plan`: a package whose every copy
    is gone or bad, or a member of a lost bundle that must be rebuilt). The build is
    deterministic (I3), so the rebuilt tar has the recorded sha256. Returns how many.
    ``repairs``: the cycle's repair plan (:func:`packhorse.managers.wanted.planned`)."""
    return create_missing(ctx, OperationKind.RAW_DATA_PACKAGE, planned(ctx, OperationKind.RAW_DATA_PACKAGE, repairs))
