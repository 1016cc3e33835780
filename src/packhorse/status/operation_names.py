"""The package and data location behind each operation, as SQL columns for the read-only views.

:func:`package_and_location` names an operation's package (raw data package or bundle, direct or
through the physical copy a deletion or fixity check works on) and the data location where its
work happens (the destination, else the source, else the copy's location): the overview, the
blocked-work list and the failure groups name operations the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import func
from sqlalchemy.orm import aliased

from packhorse.db.models import (
    DataLocation,
    DataTransferPackage,
    Operation,
    PhysicalCopy,
    RawDataPackage,
)

if TYPE_CHECKING:
    pass


def package_and_location():  # type: ignore[no-untyped-def]
    """``(package name column, location name column, join(query))``: the names of each
    operation's package and of the data location where its work happens (the destination,
    else the source, else a deletion's copy location); ``join`` adds the outer joins."""
    rp, dp, pc = aliased(RawDataPackage), aliased(DataTransferPackage), aliased(PhysicalCopy)
    rp2, dp2, loc = aliased(RawDataPackage), aliased(DataTransferPackage), aliased(DataLocation)
    package = func.coalesce(rp.name, dp.name, rp2.name, dp2.name)
    # where the work happens: the destination, else the source, else (deletions) the copy's location
    loc_id = func.coalesce(Operation.destination_location_id, Operation.source_location_id, pc.location_id)

    def join(q):  # type: ignore[no-untyped-def]
        return (q.outerjoin(rp, rp.id == Operation.raw_data_package_id)
                .outerjoin(dp, dp.id == Operation.data_transfer_package_id)
                .outerjoin(pc, pc.id == Operation.physical_copy_id)
                .outerjoin(rp2, rp2.id == pc.raw_data_package_id)
                .outerjoin(dp2, dp2.id == pc.data_transfer_package_id)
                .outerjoin(loc, loc.id == loc_id))

    return package, loc.name, join
