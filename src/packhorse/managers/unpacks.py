"""Unpack manager: a bundle that arrived at a destination buffer is unpacked there."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from packhorse.db.models import DataTransferPackage, PhysicalCopy
from packhorse.domain import CopyStatus, OperationKind
from packhorse.managers.wanted import buffer_location_ids, create_missing, new_only, planned
from packhorse.operations.lifecycle import dedup_key
from packhorse.runtime.context import ProcessContext

if TYPE_CHECKING:
    from packhorse.rules.convergence import Plan


def manage(ctx: ProcessContext, repairs: "Plan | None" = None) -> int:
    """Create missing ``unpack`` operations; returns how many. ``repairs``: the
    cycle's repair plan (:func:`packhorse.managers.wanted.planned`)."""

    def find(s: Session) -> dict[str, dict[str, Any]]:
        rows = s.execute(
            select(DataTransferPackage.id, DataTransferPackage.source_site_id, PhysicalCopy.location_id)
            .join(PhysicalCopy, PhysicalCopy.data_transfer_package_id == DataTransferPackage.id)
            .where(PhysicalCopy.location_id.in_(buffer_location_ids(ctx)),
                   PhysicalCopy.status == CopyStatus.PRESENT.value)
        ).all()
        wanted: dict[str, dict[str, Any]] = {}
        for dtp_id, site_id, loc_id in rows:
            loc = ctx.location_name(loc_id)
            loc_site = ctx.topology.location_site[loc]
            if loc_site == ctx.topology.site_name(site_id):
                continue  # the source buffer: nothing to unpack there
            wanted[dedup_key(OperationKind.UNPACK, f"dtp{dtp_id}", loc)] = dict(
                data_transfer_package_id=dtp_id, source_location_id=loc_id, destination_location_id=loc_id,
                site_id=ctx.topology.site_ids[loc_site])
        return new_only(s, wanted)

    # the forward flow's first operations, and the repairs of lost copies (:mod:`packhorse.rules.convergence`)
    return create_missing(ctx, OperationKind.UNPACK, {**ctx.db.read(find), **planned(ctx, OperationKind.UNPACK, repairs)})
