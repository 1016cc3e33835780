"""Desired state, converged: the copies every raw data package must have, and the work that
brings the real copies there (DESIGN.md "Converging, not only advancing"; I1, I2, I3).

**Desired state.** For every raw data package the route of its source site defines the copies
it must have: one present, verified copy at every active long-term archive location of every
destination site. *Archived* means exactly that, computed from the copy rows
(:func:`packhorse.rules.policy.is_archived`); the cached ``archived_at`` is recomputed in the
same transaction as every change of an archive copy's status (:mod:`packhorse.rules.fixity`, the
archive and repair stages) and swept by the fixity manager, so it cannot go stale.

**Forward flow and repairs.** The managers advance new packages along the route (package →
bundle → transfer → unpack → archive) with their first-generation operations. This module
looks only where that flow has lost its bytes — copies recorded ``corrupt`` or ``missing``
with no live copy at their location yet (few rows, found through the ``(location_id, status)``
index, so an idle cycle costs one small query) — and derives, per package and destination
site, the next step from the nearest good source of the right bytes that still exists:

1. a present copy of the package at the destination site, or a present copy at any
   long-term archive: the fixity manager repairs the bad archive copy from it (the bad object
   is quarantined, never overwritten: I2);
2. a present copy of its bundle at the destination buffer: unpack it again;
3. a present copy of its bundle at the source buffer: transfer it again;
4. every package of the bundle present at the source buffer: rebuild the bundle (builds are
   deterministic, I3: the same bytes, recorded sha256, "already there" downstream); this is
   also how a bundle whose first build FAILED on a package tar lost or damaged in the source
   buffer is built once the package has been rebuilt;
5. otherwise the packages to ship again go in a bundle of their own: each is rebuilt from its
   registered source files where it is not at the source buffer (byte-identical, I3), then
   taken out of its old bundle (:attr:`Plan.detach`, by the bundle manager, a compare-and-set)
   and bundled anew with whatever waits there. Its siblings are neither rebuilt nor shipped:
   one package of a 1 GiB bundle costs its own bytes, and a sibling whose source files are
   gone does not hold it back. A bundle a package was taken out of is never built again (its
   recorded bytes carry that package); an unpack of a copy of it still somewhere reads past
   the package (:mod:`packhorse.stages.unpack`).

A step already in flight (an active operation on the package or its bundle towards that
site) is waited for. Each repair operation has its own dedup key: the first-generation key
with a ``#g<n>`` suffix, where ``n`` counts the copies of the artifacts that step reads or
fills, at the locations it reads or fills, which are gone (deleted, missing, corrupt): for a
bundle build, the bundle's and its packages' copies at the source buffer; for an unpack, the
bundle's and its packages' at the destination buffer. Counts only grow, so any number
of managers derive the same key (DESIGN.md "One pipeline, many managers"), a repair is never
blocked by the COMPLETED first-generation operation, and a repair that FAILED stays FAILED
(a human's) instead of being recreated in a loop.

**The one dead end.** When no good source of a package's bytes exists anywhere (every copy
bad, and its source files deleted or a rebuild from them FAILED), :func:`plan` reports a
:class:`DeadEnd`: ``status`` lists it in ``blocked`` (cause ``no_good_source``, exit code 3),
a CRITICAL notification names the package and the copies that failed, and ``packhorse
diagnose --package`` says what was tried (:func:`describe`). Its release: a copy with the
recorded sha256 put back under the key of one of its bad archive copies is read back and
recognised by the fixity audit (once per ``packhorse run``, and hourly;
:mod:`packhorse.managers.fixity_checks`) or by ``packhorse verify``, and the other copies are repaired
from it; or, where a rebuild FAILED, its source files restored as they were built and that
rebuild reset.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from packhorse.db.models import (
    DataLocation,
    DataTransferPackage,
    Operation,
    PhysicalCopy,
    RawDataFile,
    RawDataPackage,
)
from packhorse.domain import (
    ACTIVE_STATUSES,
    LIVE_COPY_STATUSES,
    CopyStatus,
    LocationRole,
    OperationKind,
    Status,
)
from packhorse.operations.lifecycle import dedup_key
from packhorse.rules.policy import archive_locations, holds_artifact_bytes, is_archived

if TYPE_CHECKING:
    from packhorse.runtime.context import ProcessContext

_LIVE = tuple(s.value for s in LIVE_COPY_STATUSES)
_BAD = (CopyStatus.CORRUPT.value, CopyStatus.MISSING.value)
_ACTIVE = tuple(s.value for s in ACTIVE_STATUSES)
#: Kinds whose FAILED operation is superseded by a later COMPLETED one of the same kind,
#: artifact and destination (a repair generation): :func:`superseded_failures`.
CONVERGING_KINDS = (OperationKind.RAW_DATA_PACKAGE, OperationKind.DATA_TRANSFER_PACKAGE, OperationKind.TRANSFER,
                    OperationKind.UNPACK, OperationKind.LONG_TERM_ARCHIVE)


def generation_key(kind: OperationKind, subject: str, destination: str | None, generation: int) -> str:
    """The dedup key of a repair: the first-generation key, ``#g<generation>`` appended when
    ``generation`` > 0 (one key per generation, so a repair is never blocked by the COMPLETED
    first operation; DESIGN.md I3)."""
    key = dedup_key(kind, subject, destination)
    return key if generation == 0 else f"{key}#g{generation}"


@dataclass(frozen=True)
class DeadEnd:
    """A raw data package with no good source of its bytes left anywhere.

    Attributes:
        package_id, name: the package.
        bad_copies: ``[{"location", "path", "status"}]`` of its copies recorded corrupt/missing.
        tried: one sentence per source looked for and why it cannot serve.
        since: when its last copy was found bad (UTC), if known.
        failed_operation: ``(kind, id)`` of a FAILED rebuild, if one was tried.
        sha256: the package's recorded sha256 (hex), what a copy put back must have.
        source_deleted: its source files were deleted after archiving (restoring them does
            not make it rebuildable again).
        archive_keys: ``location:key`` of its bad copies at long-term archives, where a good
            copy put back is recognised.
    """
    package_id: int
    name: str
    bad_copies: list[dict[str, str]]
    tried: list[str]
    since: dt.datetime | None = None
    failed_operation: tuple[str, int] | None = None
    sha256: str | None = None
    source_deleted: bool = False
    archive_keys: list[str] = field(default_factory=list)


@dataclass
class Plan:
    """What :func:`plan` derived: operations to create per kind (``{dedup_key: create kwargs}``,
    the shape of :func:`packhorse.managers.wanted.create_missing`), the packages whose
    ``archived_at`` cache is stale, and the dead ends."""

    wanted: dict[OperationKind, dict[str, dict[str, Any]]] = field(default_factory=dict)
    stale_archived: list[int] = field(default_factory=list)
    dead_ends: list[DeadEnd] = field(default_factory=list)
    #: package id -> (the bundle it is to be taken out of, its source site): packages at their
    #: source buffer to ship again whose bundle is not rebuilt (a sibling is not at the source
    #: buffer); the bundle manager takes them out (:func:`packhorse.managers.bundles.manage`)
    #: and bundles them anew, with whatever else waits there
    detach: dict[int, tuple[int, str]] = field(default_factory=dict)

    def want(self, kind: OperationKind, key: str, **kwargs: Any) -> None:
        self.wanted.setdefault(kind, {})[key] = kwargs


@dataclass
class _Copy:
    id: int
    raw: int | None
    dtp: int | None
    loc: int
    status: str
    path: str
    verified: bool
    created_at: dt.datetime
    found_bad_at: dt.datetime | None = None


def _copies(s: Session, col: Any, ids: Iterable[int]) -> list[_Copy]:
    ids = sorted(set(ids))
    out: list[_Copy] = []
    for k in range(0, len(ids), 500):
        out += [_Copy(r.id, r.raw_data_package_id, r.data_transfer_package_id, r.location_id, r.status, r.path,
                      r.verified_at is not None, r.created_at, r.found_bad_at)
                for r in s.execute(select(PhysicalCopy.id, PhysicalCopy.raw_data_package_id,
                                          PhysicalCopy.data_transfer_package_id, PhysicalCopy.location_id,
                                          PhysicalCopy.status, PhysicalCopy.path, PhysicalCopy.verified_at,
                                          PhysicalCopy.created_at, PhysicalCopy.found_bad_at)
                                   .where(col.in_(ids[k:k + 500])))]
    return out


def _bad_rows(s: Session, ctx: "ProcessContext") -> list[Any]:
    """Every copy row recorded ``corrupt`` / ``missing`` outside processing locations (a staged
    folder is no copy of the package's bytes, :func:`holds_artifact_bytes`), found through the
    ``(location_id, status)`` index (both columns bound: no scan of the copy table, whatever
    its size)."""
    return list(s.execute(select(PhysicalCopy.id, PhysicalCopy.raw_data_package_id,
                                 PhysicalCopy.data_transfer_package_id, PhysicalCopy.location_id)
                          .where(PhysicalCopy.location_id.in_(select(DataLocation.id).where(
                                     DataLocation.role != LocationRole.PROCESSING.value)),  # staged folders: not lost bytes
                                 PhysicalCopy.status.in_(_BAD))).all())


def lost_copies(s: Session, ctx: "ProcessContext", bad: list[Any] | None = None) -> list[Any]:
    """Copy rows recorded ``corrupt`` / ``missing`` (``id, raw_data_package_id,
    data_transfer_package_id, location_id``) whose artifact has no live copy at that location:
    where the pipeline lost bytes and nothing has replaced them yet. ``bad``: the rows of
    :func:`_bad_rows` when the caller has them."""
    bad = _bad_rows(s, ctx) if bad is None else bad
    if not bad:
        return []
    live = {(c.raw, c.dtp, c.loc) for c in
            _copies(s, PhysicalCopy.raw_data_package_id, [b.raw_data_package_id for b in bad if b.raw_data_package_id])
            + _copies(s, PhysicalCopy.data_transfer_package_id,
                      [b.data_transfer_package_id for b in bad if b.data_transfer_package_id])
            if c.status in _LIVE}
    return [b for b in bad if (b.raw_data_package_id, b.data_transfer_package_id, b.location_id) not in live]


def _unfinished_losses(s: Session, bad: list[Any]) -> list[Any]:
    """The rows of ``bad`` (:func:`_bad_rows`) whose raw data package — or one of the packages
    of whose bundle — is not archived yet: a loss replaced at its own location (a rebuilt
    bundle) still drives the steps after it until the packages are archived."""
    if not bad:
        return []
    raw = sorted({b.raw_data_package_id for b in bad if b.raw_data_package_id is not None})
    dtp = sorted({b.data_transfer_package_id for b in bad if b.data_transfer_package_id is not None})
    open_raw: set[int] = set()
    open_dtp: set[int] = set()
    for k in range(0, max(len(raw), len(dtp)), 500):
        if raw[k:k + 500]:
            open_raw |= set(s.scalars(select(RawDataPackage.id).where(
                RawDataPackage.id.in_(raw[k:k + 500]), RawDataPackage.archived_at.is_(None))))
        if dtp[k:k + 500]:
            open_dtp |= set(s.scalars(select(RawDataPackage.data_transfer_package_id).where(
                RawDataPackage.data_transfer_package_id.in_(dtp[k:k + 500]), RawDataPackage.archived_at.is_(None))))
    return [b for b in bad if b.raw_data_package_id in open_raw or b.data_transfer_package_id in open_dtp]


def repair_sources(ctx: "ProcessContext", location: str, copies: Iterable[Any]) -> list[Any]:
    """The copies (rows with ``location_id`` and ``status``) a bad copy at ``location`` may be
    repaired from by the fixity stage: present copies at any long-term archive, or at another
    location of the same site that holds the package's bytes (a buffer;
    :func:`holds_artifact_bytes`: a staged folder at a processing location is not a source).
    A buffer at another site is not one: bytes cross sites only by transfer, along the route
    (its method and bandwidth limit)."""
    site = ctx.topology.location_site.get(location)
    out = []
    for c in copies:
        name = ctx.location_name(c.location_id)
        if c.status != CopyStatus.PRESENT.value or name == location or not holds_artifact_bytes(ctx, name):
            continue
        if ctx.topology.location_role.get(name) is LocationRole.LONG_TERM_ARCHIVE or \
                ctx.topology.location_site.get(name) == site:
            out.append(c)
    return out


def plan(s: Session, ctx: "ProcessContext") -> Plan:
    """Derive the repair work (module docstring) in the caller's read-only unit of work.

    Returns:
        a :class:`Plan`; empty (after one small query) when no copy has been lost.
    """
    out = Plan()
    # losses nothing replaced yet (stale "archived" marks among them), and losses replaced at
    # their own location whose packages are still on their way to the archives
    bad = _bad_rows(s, ctx)
    if not bad:
        return out
    seen: set[int] = set()
    lost = [b for b in lost_copies(s, ctx, bad) + _unfinished_losses(s, bad) if not (b.id in seen or seen.add(b.id))]
    if not lost:
        return out
    topo = ctx.topology
    trig_pkgs = {b.raw_data_package_id for b in lost if b.raw_data_package_id is not None}
    trig_bundles = {b.data_transfer_package_id for b in lost if b.data_transfer_package_id is not None}
    if trig_bundles:
        trig_pkgs |= set(s.scalars(select(RawDataPackage.id).where(
            RawDataPackage.data_transfer_package_id.in_(sorted(trig_bundles)))))
    pkgs = {p.id: p for p in s.execute(select(
        RawDataPackage.id, RawDataPackage.name, RawDataPackage.source_location_id,
        RawDataPackage.data_transfer_package_id, RawDataPackage.archived_at).where(
        RawDataPackage.id.in_(sorted(trig_pkgs))))}
    bundle_ids = {p.data_transfer_package_id for p in pkgs.values() if p.data_transfer_package_id is not None}
    members: dict[int, list[int]] = {}
    for pid, bid in s.execute(select(RawDataPackage.id, RawDataPackage.data_transfer_package_id).where(
            RawDataPackage.data_transfer_package_id.in_(sorted(bundle_ids)))):
        members.setdefault(bid, []).append(pid)
    all_pkgs = set(pkgs) | {m for ms in members.values() for m in ms}
    rows = s.execute(select(RawDataPackage.id, RawDataPackage.name, RawDataPackage.sha256)
                     .where(RawDataPackage.id.in_(sorted(all_pkgs)))).all()
    names = {r.id: r.name for r in rows}
    shas = {r.id: r.sha256 for r in rows}
    copies_of: dict[int, list[_Copy]] = {}
    for c in _copies(s, PhysicalCopy.raw_data_package_id, all_pkgs):
        if holds_artifact_bytes(ctx, ctx.location_name(c.loc)):  # a staged folder is no source, nor a loss
            copies_of.setdefault(c.raw, []).append(c)  # type: ignore[arg-type]
    bcopies_of: dict[int, list[_Copy]] = {}
    for c in _copies(s, PhysicalCopy.data_transfer_package_id, bundle_ids):
        bcopies_of.setdefault(c.dtp, []).append(c)  # type: ignore[arg-type]
    ops = s.execute(select(Operation.id, Operation.kind, Operation.status, Operation.dedup_key,
                           Operation.raw_data_package_id, Operation.data_transfer_package_id,
                           Operation.destination_location_id, Operation.error_context)
                    .where((Operation.raw_data_package_id.in_(sorted(all_pkgs)))
                           | (Operation.data_transfer_package_id.in_(sorted(bundle_ids))))).all()
    keys = {o.dedup_key: o for o in ops}
    active = [o for o in ops if o.status in _ACTIVE]
    source_gone = set(s.scalars(select(RawDataFile.raw_data_package_id).where(
        RawDataFile.raw_data_package_id.in_(sorted(all_pkgs)), RawDataFile.source_deleted_at.is_not(None))))
    bundle_rows = s.execute(select(DataTransferPackage.id, DataTransferPackage.name, DataTransferPackage.package_count)
                            .where(DataTransferPackage.id.in_(sorted(bundle_ids)))).all() if bundle_ids else []
    # a bundle some package was taken out of (shipped again in a bundle of its own) is never
    # built again: its recorded bytes carry that package
    split = {r.id for r in bundle_rows if r.package_count is not None and r.package_count > len(members.get(r.id, []))}

    def present_at(cs: list[_Copy], loc: int) -> _Copy | None:
        return next((c for c in cs if c.loc == loc and c.status == CopyStatus.PRESENT.value), None)

    def gone_at(cs: list[_Copy], locs: Iterable[int]) -> int:
        locs = set(locs)
        return sum(1 for c in cs if c.loc in locs and c.status not in _LIVE)

    def busy(kind: OperationKind, *, raw: int | None = None, dtp: int | None = None,
             dest: Iterable[int] | None = None) -> bool:
        dests = None if dest is None else set(dest)
        return any(o.kind == kind.value and (raw is None or o.raw_data_package_id == raw)
                   and (dtp is None or o.data_transfer_package_id == dtp)
                   and (dests is None or o.destination_location_id in dests) for o in active)

    need_bundle: dict[int, set[int]] = {}   # bundle -> trigger packages waiting for it
    need_rebuild: dict[int, set[int]] = {}  # package (not bundled) -> itself
    for pid, p in sorted(pkgs.items()):
        src_site = topo.location_site.get(ctx.location_name(p.source_location_id))
        route = ctx.settings.route_from(src_site) if src_site else None
        if route is None:
            continue
        mine = copies_of.get(pid, [])
        archive_ids = [topo.location_ids[l.name] for d in route.destination_sites
                       for l in ctx.settings.locations_at(d, LocationRole.LONG_TERM_ARCHIVE)]
        live_locs = {c.loc for c in mine if c.status in _LIVE}
        if p.archived_at is not None and not set(archive_ids) <= {c.loc for c in mine if c.status ==
                                                                    CopyStatus.PRESENT.value and c.verified}:
            out.stale_archived.append(pid)
        any_archive_copy = any(c.status == CopyStatus.PRESENT.value and
                               topo.location_role.get(ctx.location_name(c.loc)) is LocationRole.LONG_TERM_ARCHIVE
                               for c in mine)
        sbuf = topo.location_ids[ctx.settings.buffer_of(src_site).name]  # type: ignore[arg-type]
        for dest in route.destination_sites:
            ltas = [topo.location_ids[l.name] for l in ctx.settings.locations_at(dest, LocationRole.LONG_TERM_ARCHIVE)]
            need = [l for l in ltas if l not in live_locs]
            if not need:
                continue
            dbuf = topo.location_ids[ctx.settings.buffer_of(dest).name]
            bad_here = any(c.loc in need and c.status in _BAD for c in mine)
            if present_at(mine, dbuf) is not None:
                # at the destination buffer: a bad archive copy is the fixity repair's; a never
                # archived location the archive manager's, once per buffer copy (generation)
                gen = gone_at(mine, [dbuf])
                for lta in need:
                    legacy = dedup_key(OperationKind.LONG_TERM_ARCHIVE, f"rdp{pid}", ctx.location_name(lta))
                    if gen == 0 or legacy not in keys or any(c.loc == lta and c.status in _BAD for c in mine) \
                            or busy(OperationKind.LONG_TERM_ARCHIVE, raw=pid, dest=[lta]):
                        continue
                    out.want(OperationKind.LONG_TERM_ARCHIVE,
                             generation_key(OperationKind.LONG_TERM_ARCHIVE, f"rdp{pid}", ctx.location_name(lta), gen),
                             raw_data_package_id=pid, source_location_id=dbuf, destination_location_id=lta,
                             site_id=topo.site_ids[dest])
                continue
            if bad_here and any_archive_copy:
                continue  # the fixity repair copies it from that archive
            if busy(OperationKind.LONG_TERM_ARCHIVE, raw=pid, dest=need) or \
                    busy(OperationKind.FIXITY_CHECK, raw=pid, dest=need):
                continue
            bid = p.data_transfer_package_id
            if bid is None:  # not bundled yet: the forward flow bundles it once it is at the source buffer
                if present_at(mine, sbuf) is None:
                    need_rebuild.setdefault(pid, set()).add(pid)
                continue
            if busy(OperationKind.TRANSFER, dtp=bid, dest=[dbuf]) or busy(OperationKind.UNPACK, dtp=bid, dest=[dbuf]):
                continue
            bcs = bcopies_of.get(bid, [])
            here = present_at(bcs, dbuf)
            if here is not None:
                gen = gone_at(bcs, [dbuf]) + sum(gone_at(copies_of.get(m, []), [dbuf]) for m in members.get(bid, []))
                out.want(OperationKind.UNPACK, generation_key(OperationKind.UNPACK, f"dtp{bid}",
                                                              ctx.location_name(dbuf), gen),
                         data_transfer_package_id=bid, source_location_id=dbuf, destination_location_id=dbuf,
                         site_id=topo.site_ids[dest])
                continue
            at_source = present_at(bcs, sbuf)
            if at_source is not None:
                gen = gone_at(bcs, [sbuf, dbuf])
                out.want(OperationKind.TRANSFER, generation_key(OperationKind.TRANSFER, f"dtp{bid}",
                                                                ctx.location_name(dbuf), gen),
                         data_transfer_package_id=bid, source_location_id=sbuf, destination_location_id=dbuf,
                         site_id=topo.site_ids[dest])
                continue
            need_bundle.setdefault(bid, set()).add(pid)

    def rebuild(mid: int, sbuf: int, site_id: int, src_loc: int, *, want: bool = True) -> str | None:
        """Want a rebuild of package ``mid`` at ``sbuf`` (unless ``want`` is false); returns
        why it cannot be rebuilt, or None."""
        if mid in source_gone:
            return f"its source files at {ctx.location_name(src_loc)} were deleted after archiving"
        gen = gone_at(copies_of.get(mid, []), [sbuf])
        key = generation_key(OperationKind.RAW_DATA_PACKAGE, f"rdp{mid}", None, gen)
        prior = keys.get(key)
        if prior is not None and prior.status == Status.FAILED.value:
            msg = (prior.error_context or {}).get("message") or "failed"
            return f"the rebuild from its source files (raw_data_package operation {prior.id}) FAILED: {msg}"
        if prior is None and want and not busy(OperationKind.RAW_DATA_PACKAGE, raw=mid):
            out.want(OperationKind.RAW_DATA_PACKAGE, key, site_id=site_id, raw_data_package_id=mid,
                     source_location_id=src_loc, destination_location_id=sbuf)
        return None

    src_loc_of = dict(s.execute(select(RawDataPackage.id, RawDataPackage.source_location_id).where(
        RawDataPackage.id.in_(sorted(all_pkgs)))).all()) if all_pkgs else {}
    stuck: dict[int, list[str]] = {}
    for pid in sorted(need_rebuild):
        src_loc = src_loc_of[pid]
        site = topo.location_site[ctx.location_name(src_loc)]
        why = rebuild(pid, topo.location_ids[ctx.settings.buffer_of(site).name], topo.site_ids[site], src_loc)
        if why:
            stuck.setdefault(pid, []).append(f"{names[pid]}: {why}")
    for bid, waiting in sorted(need_bundle.items()):
        if busy(OperationKind.DATA_TRANSFER_PACKAGE, dtp=bid):
            continue
        first = pkgs[min(waiting)]
        site = topo.location_site[ctx.location_name(first.source_location_id)]
        sbuf = topo.location_ids[ctx.settings.buffer_of(site).name]
        bcs = bcopies_of.get(bid, [])
        absent = [m for m in sorted(members.get(bid, [])) if present_at(copies_of.get(m, []), sbuf) is None]
        if not absent and bid not in split:
            # the build reads its packages at the source buffer and fills the bundle's copy
            # there: a build that FAILED because a package was gone or bad (recorded so by its
            # failure) is followed by a new generation once that package is rebuilt
            gen = gone_at(bcs, [sbuf]) + sum(gone_at(copies_of.get(m, []), [sbuf]) for m in members.get(bid, []))
            out.want(OperationKind.DATA_TRANSFER_PACKAGE,
                     generation_key(OperationKind.DATA_TRANSFER_PACKAGE, f"dtp{bid}", None, gen),
                     site_id=topo.site_ids[site], data_transfer_package_id=bid, destination_location_id=sbuf)
            continue
        # a sibling is not at the source buffer (freed once archived, its source files perhaps
        # gone): the packages to ship again go in a bundle of their own, rebuilt from their
        # source files first where they are not there; the siblings are neither rebuilt nor
        # shipped (a rebuilt sibling would only be freed again). Not while an operation on the
        # bundle is in flight anywhere: its membership changes.
        if any(o.data_transfer_package_id == bid for o in active):
            continue
        for pid in sorted(waiting):
            if present_at(copies_of.get(pid, []), sbuf) is not None:
                out.detach[pid] = (bid, site)
            elif why := rebuild(pid, sbuf, topo.site_ids[site], src_loc_of[pid]):
                stuck.setdefault(pid, []).append(f"{names[pid]}: {why}")
    for pid, why in sorted(stuck.items()):
        mine = copies_of.get(pid, [])
        # one per place: a copy repaired and bad again has two records, the latest speaks
        bad = list({(c.loc, c.path): c for c in sorted(mine, key=lambda c: c.id) if c.status in _BAD}.values())
        failed = next(((o.kind, o.id) for o in sorted(ops, key=lambda o: -o.id)
                       if o.raw_data_package_id == pid and o.kind == OperationKind.RAW_DATA_PACKAGE.value
                       and o.status == Status.FAILED.value), None)
        tried = ["no present copy at any long-term archive or destination buffer",
                 "no copy of the package or of its bundle at any buffer", *why]
        out.dead_ends.append(DeadEnd(pid, names[pid], [{"location": ctx.location_name(c.loc), "path": c.path,
                                                        "status": c.status} for c in bad], tried,
                                     max((c.found_bad_at or c.created_at for c in bad), default=None), failed,
                                     sha256=shas.get(pid),
                                     source_deleted=pid in source_gone,
                                     archive_keys=[f"{ctx.location_name(c.loc)}:{c.path}" for c in bad
                                                   if topo.location_role.get(ctx.location_name(c.loc))
                                                   is LocationRole.LONG_TERM_ARCHIVE]))
    return out


def superseded_failures(s: Session, failed: list[Any]) -> set[int]:
    """Ids among ``failed`` operations (rows with ``id, kind, raw_data_package_id,
    data_transfer_package_id, destination_location_id``) of the converging kinds whose work is
    done by other means: a later operation of the same kind, artifact and destination
    COMPLETED (a repair generation, module docstring), or the raw data package it was for (for
    a bundle's operation: every package the bundle carries) is archived now — e.g. a rebuild
    from changed source files that FAILED, made pointless by a good copy put back in an archive.
    The failure is history, not work left for a human."""
    kinds = {k.value for k in CONVERGING_KINDS}
    mine = [f for f in failed if f.kind in kinds]
    if not mine:
        return set()
    raw_ids = sorted({f.raw_data_package_id for f in mine if f.raw_data_package_id})
    dtp_ids = sorted({f.data_transfer_package_id for f in mine if f.data_transfer_package_id})
    archived: set[int] = set()
    open_bundles: set[int] = set()
    bundled: set[int] = set()
    for k in range(0, max(len(raw_ids), len(dtp_ids)), 500):
        if raw_ids[k:k + 500]:
            archived |= set(s.scalars(select(RawDataPackage.id).where(
                RawDataPackage.id.in_(raw_ids[k:k + 500]), RawDataPackage.archived_at.is_not(None))))
        if dtp_ids[k:k + 500]:
            for bid, at in s.execute(select(RawDataPackage.data_transfer_package_id, RawDataPackage.archived_at)
                                     .where(RawDataPackage.data_transfer_package_id.in_(dtp_ids[k:k + 500]))):
                bundled.add(bid)
                if at is None:
                    open_bundles.add(bid)
    out = {f.id for f in mine
           if (f.raw_data_package_id in archived if f.raw_data_package_id else
               f.data_transfer_package_id in bundled and f.data_transfer_package_id not in open_bundles)}
    mine = [f for f in mine if f.id not in out]
    if not mine:
        return out
    done = s.execute(select(Operation.id, Operation.kind, Operation.raw_data_package_id,
                            Operation.data_transfer_package_id, Operation.destination_location_id)
                     .where(Operation.status == Status.COMPLETED.value, Operation.kind.in_(sorted(kinds)),
                            (Operation.raw_data_package_id.in_(sorted({f.raw_data_package_id for f in mine
                                                                        if f.raw_data_package_id})))
                            | (Operation.data_transfer_package_id.in_(
                                sorted({f.data_transfer_package_id for f in mine if f.data_transfer_package_id})))))
    latest: dict[tuple[Any, ...], int] = {}
    for d in done:
        k = (d.kind, d.raw_data_package_id, d.data_transfer_package_id, d.destination_location_id)
        latest[k] = max(latest.get(k, 0), d.id)
    return out | {f.id for f in mine
                  if latest.get((f.kind, f.raw_data_package_id, f.data_transfer_package_id,
                                 f.destination_location_id), 0) > f.id}


def describe(s: Session, ctx: "ProcessContext", name: str) -> dict[str, Any] | None:
    """The desired state of raw data package ``name`` against its real copies, for
    ``packhorse diagnose --package`` (read-only).

    Returns:
        ``None`` for no such raw data package, else ``{"package", "archived": bool,
        "archives": {location: "present, verified" | status | "no copy"}, "repairs": [dedup keys
        of repair operations the managers will create next], "dead_end": None | {"bad_copies",
        "tried", "release"}}``.
    """
    pkg = s.scalars(select(RawDataPackage).where(RawDataPackage.name == name)).first()
    if pkg is None:
        return None
    site = ctx.topology.location_site[ctx.location_name(pkg.source_location_id)]
    state: dict[str, str] = {}
    rows = s.execute(select(PhysicalCopy.location_id, PhysicalCopy.status, PhysicalCopy.verified_at)
                     .where(PhysicalCopy.raw_data_package_id == pkg.id).order_by(PhysicalCopy.id)).all()
    for loc in archive_locations(ctx, site):
        mine = [r for r in rows if ctx.location_name(r.location_id) == loc]
        last = mine[-1] if mine else None
        state[loc] = ("no copy" if last is None else "present, verified" if last.status == CopyStatus.PRESENT.value
                      and last.verified_at else last.status)
    p = plan(s, ctx)
    repairs = sorted(k for ws in p.wanted.values() for k, v in ws.items()
                     if v.get("raw_data_package_id") == pkg.id
                     or (pkg.data_transfer_package_id and v.get("data_transfer_package_id") == pkg.data_transfer_package_id))
    dead = next((d for d in p.dead_ends if d.package_id == pkg.id), None)
    return {"package": pkg.name, "archived": is_archived(s, ctx, pkg), "archives": state, "repairs": repairs,
            "dead_end": None if dead is None else {"bad_copies": dead.bad_copies, "tried": dead.tried,
                                                   "release": dead_end_release(dead)}}


def dead_end_release(d: "DeadEnd") -> str:
    """What a human must do for dead end ``d`` (the ``release`` of its blocked item): only what
    works. A copy with the recorded sha256 put back under the key of one of its bad archive
    copies is read back and recognised by the next ``packhorse run`` (:func:`recheck_key`) or
    ``packhorse verify``, and the other copies are repaired from it. Restoring the source files
    helps only where a rebuild from them FAILED (then that operation is reset); after packhorse
    deleted them (``delete_source_files``) they are not read again."""
    keys = d.archive_keys or [f"raw/{d.name}.tar in one of its archives"]
    sha = f" {d.sha256}" if d.sha256 else ""
    text = (f"put the bytes back: write a copy with the recorded sha256{sha} as {' or '.join(keys)}, then "
            "`packhorse run` (or `packhorse verify`): it is read back and recognised, and the other copies are "
            "repaired from it")
    if d.failed_operation:
        text += (f"; or restore the source files of {d.name} exactly as they were when it was built "
                 f"(`packhorse locate {d.name}` lists them), then `packhorse reset {d.failed_operation[0]} "
                 f"{d.failed_operation[1]}`")
    elif d.source_deleted:
        text += "; restoring its source files does not help: packhorse deleted them after archiving"
    return text
