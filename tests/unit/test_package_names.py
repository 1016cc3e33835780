"""Package names: a group packaged again gets the lowest free suffixed name (``a/b+2``, ``a/b+3``,
…), found by exact name lookups (``_`` and ``%`` in a group name are ordinary characters); each
name has its own bag folder inside the tar."""

from __future__ import annotations

import urllib.parse
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import event

from packhorse.db.models import DataLocation, RawDataPackage, Site
from packhorse.db.session import Database
from packhorse.managers.packages import name_for as _name_for
from packhorse.managers.packages import names_taken, names_taken_many
from packhorse.stages.package import bag_dir_name


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


def test_the_names_of_many_groups_are_found_with_one_query_and_follow_ups_only_where_used(empty_db: Database) -> None:
    _with_packages(empty_db, ["a/x", "a/x+2", "a/y+v2", "c/z"])
    statements: list[tuple[str, Any]] = []
    event.listen(empty_db.engine, "before_cursor_execute", lambda *a: statements.append((a[2], a[3])))
    taken = empty_db.read(lambda s: names_taken_many(s, ["a/x", "a/y", "a/y+v2", "b/new", "b/other"]))
    assert taken == {"a/x": {"a/x", "a/x+2"}, "a/y": set(), "a/y+v2": {"a/y+v2"}, "b/new": set(), "b/other": set()}
    # one query for the five names, then one for the suffixed names of each of the two already
    # in use: no name is asked about twice (the bases are not asked about again)
    asked = [p for q, params in statements if "raw_data_packages" in q for p in params]
    assert sum("raw_data_packages" in q for q, _ in statements) == 1 + 2
    assert len(asked) == len(set(asked)), sorted(asked)


def _decode(bag_dir: str) -> str:
    """The inverse of ``bag_dir_name`` (the test's own)."""
    return "/".join(urllib.parse.unquote(part) for part in bag_dir.split("__"))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.text(alphabet="_a%25F+.", min_size=1, max_size=6), min_size=1, max_size=4))
def test_bag_folder_names_are_one_to_one(parts: list[str]) -> None:
    # two packages must never unpack into one folder: the name can be read back from it
    name = "/".join(parts)
    bag = bag_dir_name(name)
    assert "/" not in bag and bag
    assert _decode(bag) == name


def test_bag_folder_names_of_plain_names_are_unchanged() -> None:
    assert bag_dir_name("instrument-00/obs-0003") == "instrument-00__obs-0003"
    assert bag_dir_name("_root+2") == "_root+2" and bag_dir_name("a_b/c_d") == "a_b__c_d"
    assert {bag_dir_name("a__b/c"), bag_dir_name("a/b__c")} == {"a%5F%5Fb__c", "a__b%5F%5Fc"}
