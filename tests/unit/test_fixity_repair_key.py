"""The dedup key of a fixity repair operation has one owner (:mod:`packhorse.rules.fixity`): the
fixity manager builds it, ``packhorse diagnose`` and ``packhorse locate`` read it back."""

from __future__ import annotations

from packhorse.domain import OperationKind
from packhorse.managers.fixity_checks import recheck_key
from packhorse.operations.lifecycle import dedup_key
from packhorse.rules.fixity import is_repair, parse_repair_key, repair_key


def test_a_repair_key_round_trips_through_builder_and_parser() -> None:
    key = repair_key(17, 4, "cologne-lta")
    assert key == "fixity_check:repair-copy17@copy4->cologne-lta"
    assert parse_repair_key(key) == (17, 4)
    assert is_repair(key)
    assert parse_repair_key(repair_key(1, 230, "a->b")) == (1, 230)  # a location name is not parsed


def test_other_fixity_keys_are_not_repairs() -> None:
    audit = dedup_key(OperationKind.FIXITY_CHECK, "copy17@1765000000.000000", "cologne-lta")
    recheck = dedup_key(OperationKind.FIXITY_CHECK, recheck_key(17, 1765000000.0, 1765000000.5), "cologne-lta")
    other_kind = dedup_key(OperationKind.LONG_TERM_ARCHIVE, "repair-copy17@copy4", "cologne-lta")
    for key in (audit, recheck, other_kind, "", None):
        assert parse_repair_key(key) is None, key
        assert not is_repair(key)
