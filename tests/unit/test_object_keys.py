"""Object keys (:func:`packhorse.storage.base.check_key`, I6): relative, ``/``-separated, no
empty, ``.`` or ``..`` component, no backslash or NUL, no component ending in the partial-file
suffix. The check runs once per file of every full scan, so it is written with substring tests;
these tests hold it to the rule written out component by component."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packhorse.errors import UnsafePathError
from packhorse.storage.base import PARTIAL_SUFFIX, check_key


def allowed_by_the_rule(key: str) -> bool:
    """The rule of the contract, one component at a time."""
    if not key or key.startswith("/") or "\\" in key or "\x00" in key:
        return False
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return False
    return not any(p.endswith(PARTIAL_SUFFIX) for p in parts)


def allowed(key: str) -> bool:
    try:
        return check_key(key) == key
    except UnsafePathError:
        return False


@pytest.mark.parametrize("key", ["a", "a/b.dat", "...", "a/.../b", ".hidden/x", "a/..b", "a/b..", "x.packhorse-partialx",
                                 f"a/{PARTIAL_SUFFIX}x/b", "é/ü.fits"])
def test_safe_keys_are_returned(key: str) -> None:
    assert check_key(key) == key


@pytest.mark.parametrize("key", ["", "/a", "a/", "a//b", ".", "..", "./a", "a/.", "a/./b", "../a", "a/..", "a/../b",
                                 "a\\b", "a\x00b", f"a{PARTIAL_SUFFIX}", f"a{PARTIAL_SUFFIX}/b",
                                 f"x/.f.0123456789ab{PARTIAL_SUFFIX}"])
def test_unsafe_keys_are_refused_naming_the_key(key: str) -> None:
    with pytest.raises(UnsafePathError) as err:
        check_key(key)
    assert repr(key) in str(err.value) or not key


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.sampled_from(["", ".", "..", "...", "a", "b.dat", "/", "\\", "\x00", PARTIAL_SUFFIX,
                                 ".packhorse", "-partial", "é"]), max_size=8).map("".join))
def test_the_check_is_the_rule_of_the_contract(key: str) -> None:
    assert allowed(key) == allowed_by_the_rule(key)
