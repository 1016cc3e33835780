"""Names in messages: cut after 200 characters with their length; two names one normalizing
file system merges are told apart by their form and code points."""

from __future__ import annotations

from packhorse.names import QUOTED_CHARACTERS, form, quoted, twins


def test_a_name_up_to_the_limit_is_quoted_whole_and_a_longer_one_is_cut_with_its_length() -> None:
    assert quoted("a" * QUOTED_CHARACTERS) == repr("a" * QUOTED_CHARACTERS)
    long = "x" * 4096
    assert quoted(long) == f"{'x' * QUOTED_CHARACTERS!r}… (4,096 characters)"
    assert quoted("bad\udcff") == repr("bad\udcff")  # a surrogate-escaped byte stays visible


def test_twins_show_each_form_and_the_differing_code_points() -> None:
    nfc, nfd = "caf\u00e9.txt", "cafe\u0301.txt"
    assert (form(nfc), form(nfd), form("plain")) == ("NFC", "NFD", "NFC")
    assert form("e\u0301\u00e9") == "neither NFC nor NFD"
    assert twins(nfd, nfc) == f"{nfd!r} (NFD: U+0065 U+0301) and {nfc!r} (NFC: U+00E9)"
    # the difference starts at a base character, even where the two share it
    assert twins("e\u0301", "e\u0300") == "'e\u0301' (NFD: U+0065 U+0301) and 'e\u0300' (NFD: U+0065 U+0300)"
    # a long run of differences shows its first code points only
    assert twins("e\u0301" * 10, "\u00e9" * 10).count("U+") == 8 + 8


def test_a_name_not_in_nfc_says_its_form_so_messages_about_twins_read_apart() -> None:
    # two validation problems, one about each twin, printed identically (found by an attacker's trial)
    nfc, nfd = "data/caf\u00e9.txt", "data/cafe\u0301.txt"
    assert quoted(nfc) == repr(nfc)
    assert quoted(nfd) == f"{nfd!r} (NFD)"
    assert quoted("x" * 300 + "e\u0301").endswith("… (302 characters) (NFD)")
