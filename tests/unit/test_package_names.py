"""A group packaged again gets the lowest free suffixed name (``a/b+2``, ``a/b+3``, …), found
by exact name lookups: ``_`` and ``%`` in a group name are ordinary characters."""

from __future__ import annotations

from packhorse.db.models import DataLocation, RawDataPackage, Site
from packhorse.db.session import Database
from packhorse.managers.packages import _name_for, names_taken


def _with_packages(db: Database, names: list[str]) -> None:
    def tx(s):  # type: ignore[no-untyped-def]
        s.add(Site(id=1, name="fyst"))
        s.flush()
        s.add(DataLocation(id=1, name="fyst-source", site_id=1, role="source", storage_type="disk", uri="/x"))
        s.flush()
        for n in names:
            s.add(RawDataPackage(name=n, group_path=n.split("+")[0], source_location_id=1, bagging_date="2026-11-30",
                                 file_count=1, payload_bytes=1))

    db.transact(tx)


def test_lowest_free_suffix_and_no_wildcards(empty_db: Database) -> None:
    _with_packages(empty_db, ["n/obs_1", "n/obs_1+2", "n/obs_1+4", "n/obsX1+3", "n/obs%1", "n/obs_1+2x"])
    taken = empty_db.read(lambda s: names_taken(s, "n/obs_1"))
    assert taken == {"n/obs_1", "n/obs_1+2", "n/obs_1+4"}  # not obsX1+3 (``_`` is no wildcard)
    assert _name_for("n/obs_1", taken) == "n/obs_1+3"
    assert empty_db.read(lambda s: names_taken(s, "n/new")) == set()
    assert _name_for("n/new", set()) == "n/new"


def test_long_runs_of_suffixes_are_followed_past_one_batch(empty_db: Database) -> None:
    _with_packages(empty_db, ["g"] + [f"g+{n}" for n in range(2, 150)])
    taken = empty_db.read(lambda s: names_taken(s, "g", batch=8))
    assert len(taken) == 149
    assert _name_for("g", taken) == "g+150"
