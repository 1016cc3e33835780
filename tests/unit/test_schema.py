"""The schema itself refuses what code must never write (free-text kinds, a second live copy,
duplicate operations), and the Alembic migrations build exactly the models' schema (I3, I5)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from packhorse.db.models import (
    Base,
    DataLocation,
    DataTransferPackage,
    FailureEvent,
    Operation,
    PhysicalCopy,
    RawDataPackage,
    Site,
    utcnow,
)
from packhorse.db.session import Database
from packhorse.domain import CopyStatus, OperationKind, Status
from packhorse.errors import DatabaseNotInitializedError
from support import describe_schema

SHA = "a" * 64


@pytest.fixture
def db(empty_db: Database) -> Database:
    d = empty_db

    def seed(s: Session) -> None:
        site = Site(id=1, name="fyst")
        s.add(site)
        s.flush()
        s.add_all([
            DataLocation(id=1, name="fyst-buffer", site_id=1, role="buffer", storage_type="disk", uri="/b"),
            DataLocation(id=2, name="cologne-lta", site_id=1, role="long_term_archive", storage_type="disk", uri="/a"),
        ])
        s.flush()
        s.add(RawDataPackage(id=1, name="instr/ou1", group_path="instr/ou1", source_location_id=1,
                             bagging_date="2024-01-01", file_count=1, payload_bytes=1))
        s.add(DataTransferPackage(id=1, name="bundle-1", source_site_id=1, bagging_date="2024-01-01",
                                  package_count=1))

    d.transact(seed)
    yield d
    d.dispose()


def insert(db: Database, *objs: Any) -> None:
    def tx(s: Session) -> None:
        for o in objs:
            s.add(o)
            s.flush()

    db.transact(tx)


def op(**kw: Any) -> Operation:
    values: dict[str, Any] = dict(kind="transfer", status="PENDING", dedup_key="transfer:x", site_id=1,
                                  attempt=0, retry_count=0, max_retries=3, stall_count=0, bytes_done=0)
    values.update(kw)
    return Operation(**values)


def copy(status: str = "present", **kw: Any) -> PhysicalCopy:
    values: dict[str, Any] = dict(raw_data_package_id=1, location_id=2, path="p.tar", size=1, sha256=SHA, status=status)
    values.update(kw)
    return PhysicalCopy(**values)


def refused(db: Database, *objs: Any, constraint: str) -> None:
    with pytest.raises(IntegrityError) as ei:
        insert(db, *objs)
    assert constraint in str(ei.value.orig), str(ei.value.orig)


def count(db: Database, model: type[Base]) -> int:
    return db.transact(lambda s: s.query(model).count())


# -------------------------------------------------------------------------- operations


def test_every_enum_kind_and_status_is_accepted(db: Database) -> None:
    objs = [op(kind=k.value, status=st.value, dedup_key=f"{k.value}:{st.value}")
            for k in OperationKind for st in Status]
    insert(db, *objs)
    assert count(db, Operation) == len(OperationKind) * len(Status)


@pytest.mark.parametrize("kind", ["archive", "Transfer", "long-term-archive", ""])
def test_free_text_kind_is_refused(db: Database, kind: str) -> None:
    refused(db, op(kind=kind), constraint="ck_operations_kind")
    assert count(db, Operation) == 0


def test_free_text_status_is_refused(db: Database) -> None:
    refused(db, op(status="DONE"), constraint="ck_operations_status")
    refused(db, op(status="pending"), constraint="ck_operations_status")


def test_negative_counters_are_refused(db: Database) -> None:
    refused(db, op(attempt=-1), constraint="ck_operations_counters")


def test_duplicate_dedup_key_is_refused(db: Database) -> None:
    insert(db, op(dedup_key="transfer:pkg->cologne"))
    refused(db, op(dedup_key="transfer:pkg->cologne", kind="unpack"), constraint="operations.dedup_key")
    assert count(db, Operation) == 1


def test_failure_event_kind_is_checked(db: Database) -> None:
    insert(db, op(id=1))
    ev = dict(operation_id=1, attempt=1, retry_count=0, error_type="X", message="m", will_retry=False,
              error_context={}, created_at=utcnow())
    insert(db, FailureEvent(kind="transfer", **ev))
    refused(db, FailureEvent(kind="archive", **ev), constraint="ck_failure_events_kind")


def test_foreign_keys_are_enforced(db: Database) -> None:
    refused(db, op(site_id=999), constraint="FOREIGN KEY")


def test_location_role_and_storage_type_are_checked(db: Database) -> None:
    refused(db, DataLocation(name="x", site_id=1, role="scratch", storage_type="disk", uri="/x"),
            constraint="ck_data_locations_role")
    refused(db, DataLocation(name="x", site_id=1, role="buffer", storage_type="tape", uri="/x"),
            constraint="ck_data_locations_storage_type")


# ---------------------------------------------------------------------- physical copies


@pytest.mark.parametrize("second", ["present", "deletion_pending"])
@pytest.mark.parametrize("first", ["present", "deletion_pending"])
def test_second_live_copy_of_a_raw_package_is_refused(db: Database, first: str, second: str) -> None:
    insert(db, copy(first))
    refused(db, copy(second, path="other.tar"), constraint="physical_copies.raw_data_package_id")
    assert count(db, PhysicalCopy) == 1


def test_second_live_copy_of_a_bundle_is_refused(db: Database) -> None:
    insert(db, copy(raw_data_package_id=None, data_transfer_package_id=1))
    refused(db, copy(raw_data_package_id=None, data_transfer_package_id=1),
            constraint="physical_copies.data_transfer_package_id")


@pytest.mark.parametrize("dead", ["deleted", "missing", "corrupt"])
def test_dead_copies_do_not_block_a_new_live_one(db: Database, dead: str) -> None:
    insert(db, copy(dead), copy(dead), copy("present"))
    assert sorted(db.transact(lambda s: [c.status for c in s.query(PhysicalCopy)])) == sorted([dead, dead, "present"])
    refused(db, copy("present"), constraint="physical_copies")


def test_live_copies_at_other_locations_or_of_other_artifacts_are_allowed(db: Database) -> None:
    insert(db, copy(), copy(location_id=1), copy(raw_data_package_id=None, data_transfer_package_id=1))
    assert count(db, PhysicalCopy) == 3


def test_copy_status_and_artifact_are_checked(db: Database) -> None:
    refused(db, copy("gone"), constraint="ck_physical_copies_status")
    refused(db, copy(raw_data_package_id=None), constraint="ck_physical_copies_one_artifact")
    refused(db, copy(data_transfer_package_id=1), constraint="ck_physical_copies_one_artifact")
    assert {s.value for s in CopyStatus} == {"present", "deletion_pending", "deleted", "missing", "corrupt"}


# ---------------------------------------------------------------------------- migrations


def test_head_revision_is_the_head_of_the_migration_scripts(tmp_path: Path) -> None:
    # Database.head_revision is a constant (no Alembic import at start): it must follow the scripts
    from alembic.script import ScriptDirectory

    d = Database(f"sqlite:///{tmp_path}/h.db")
    assert d.head_revision() == ScriptDirectory.from_config(d._alembic_config()).get_current_head()


def test_upgrade_builds_exactly_the_models_schema(tmp_path: Path) -> None:
    d = Database(f"sqlite:///{tmp_path}/m.db")
    d.upgrade()
    with d.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    assert diff == []
    assert d.current_revision() == d.head_revision()
    d.ensure_migrated()  # does not raise
    d.dispose()
    # what alembic does not compare (check constraints, partial-index predicates) must match too
    ref = create_engine(f"sqlite:///{tmp_path}/ref.db")
    Base.metadata.create_all(ref)
    ref.dispose()
    migrated, expected = describe_schema(f"sqlite:///{tmp_path}/m.db"), describe_schema(f"sqlite:///{tmp_path}/ref.db")
    assert migrated == expected
    live = [s for s in expected["partial_index_sql"] if "uq_physical_copies_live" in s]
    assert len(live) == 2 and all("'present', 'deletion_pending'" in s for s in live)
    assert any("ix_raw_data_packages_not_archived" in s and "archived_at IS NULL" in s
               for s in expected["partial_index_sql"])
    assert set(expected) - {"partial_index_sql"} == set(Base.metadata.tables)
    assert [n for n, _ in expected["operations"]["checks"]] == [
        "ck_operations_counters", "ck_operations_kind", "ck_operations_status"]


def test_upgrade_is_idempotent_and_downgrade_removes_every_table(tmp_path: Path) -> None:
    d = Database(f"sqlite:///{tmp_path}/m.db")
    d.upgrade()
    d.upgrade()  # already at head: nothing to do
    d.downgrade("base")
    with d.engine.connect() as conn:
        assert set(inspect(conn).get_table_names()) <= {"alembic_version"}
    assert d.current_revision() is None
    with pytest.raises(DatabaseNotInitializedError):
        d.ensure_migrated()
    d.upgrade()  # and back
    with d.engine.connect() as conn:
        assert set(Base.metadata.tables) <= set(inspect(conn).get_table_names())
    d.dispose()


def test_ensure_migrated_on_empty_database_says_run_init(tmp_path: Path) -> None:
    d = Database(f"sqlite:///{tmp_path}/empty.db")
    with pytest.raises(DatabaseNotInitializedError, match="has no packhorse schema") as ei:
        d.ensure_migrated()
    assert "packhorse init" in str(ei.value)
    assert str(tmp_path / "empty.db") in str(ei.value)
    d.dispose()


def test_ensure_migrated_on_older_revision_names_it(tmp_path: Path) -> None:
    d = Database(f"sqlite:///{tmp_path}/old.db")
    d.upgrade()
    with d.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0000'"))
    with pytest.raises(DatabaseNotInitializedError, match="is at migration 0000.*packhorse init"):
        d.ensure_migrated()
    d.dispose()

