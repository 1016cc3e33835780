"""How file and member names are written into human messages (refusals, skip reasons,
validation problems).

A name in a message is quoted with :func:`quoted`: Python's ``repr`` of it, cut after
:data:`QUOTED_CHARACTERS` characters with its full length said (a hostile archive's 4 KB
member name would otherwise fill the message, the log line and the notification). Where the
name is data (an error's ``path``, a database row, a ``--json`` field), it is kept whole.

Two names that one normalizing file system would merge (the same text in Unicode NFC and
NFD) print identically; :func:`twins` shows each one's form and the code points where they
differ.

Text that came from outside (a request body, a file name read with ``surrogateescape``) may
hold a lone surrogate or raw bytes, which UTF-8 and JSON cannot carry; :func:`json_safe` turns
such values into text that can be stored, logged and answered (the audit log, the API's 422).
"""

from __future__ import annotations

import unicodedata
from typing import Any

#: The characters of a name a message quotes; a longer name is cut there (:func:`quoted`).
QUOTED_CHARACTERS = 200
#: The code points :func:`twins` shows of each name's differing part.
SHOWN_CODE_POINTS = 8


def quoted(name: str, limit: int = QUOTED_CHARACTERS) -> str:
    """``name`` quoted for a human message: ``repr(name)``, or for a name of more than
    ``limit`` characters the ``repr`` of its first ``limit`` and its length in characters:
    ``'dddd…dd'… (4,200 characters)``. A name not in Unicode NFC says its form after it
    (``'café.txt' (NFD)``), so two messages about normalization twins read apart.

    Args:
        name: a file, member or object name (any ``str``, surrogates included).
        limit: characters kept, > 0.
    """
    text = _cut(name, limit)
    shape = form(name)
    return text if shape == "NFC" else f"{text} ({shape})"


def _cut(name: str, limit: int = QUOTED_CHARACTERS) -> str:
    if len(name) <= limit:
        return repr(name)
    return f"{name[:limit]!r}… ({len(name):,} characters)"


def form(name: str) -> str:
    """The Unicode normalization form ``name`` is in: ``"NFC"``, ``"NFD"`` (a name that is
    both, one without composable characters, is ``"NFC"``) or ``"neither NFC nor NFD"``."""
    if unicodedata.is_normalized("NFC", name):
        return "NFC"
    if unicodedata.is_normalized("NFD", name):
        return "NFD"
    return "neither NFC nor NFD"


def _code_points(part: str) -> str:
    shown = " ".join(f"U+{ord(c):04X}" for c in part[:SHOWN_CODE_POINTS])
    return shown + (" …" if len(part) > SHOWN_CODE_POINTS else "") if part else "nothing"


def twins(name: str, other: str) -> str:
    """Two names told apart for a message, when they may print alike (the same text in two
    normalization forms): ``"'café' (NFD: U+0065 U+0301) and 'café' (NFC: U+00E9)"``: each
    quoted (as :func:`quoted` does), with its form (:func:`form`) and the code points of the part
    where the two differ (from the base character before the first difference to the end of
    the difference; at most :data:`SHOWN_CODE_POINTS`)."""
    start = 0
    while start < min(len(name), len(other)) and name[start] == other[start]:
        start += 1
    # back to a base character: "e" + U+0301 against U+00E9 differ from the "e" on
    while start > 0 and any(start < len(s) and unicodedata.combining(s[start]) for s in (name, other)):
        start -= 1
    end = 0  # the length of the common end, not reaching into the difference
    while end < min(len(name), len(other)) - start and name[-1 - end] == other[-1 - end]:
        end += 1
    while end > 0 and any(unicodedata.combining(s[len(s) - end]) for s in (name, other)):
        end -= 1
    return (f"{_cut(name)} ({form(name)}: {_code_points(name[start:len(name) - end])}) and "
            f"{_cut(other)} ({form(other)}: {_code_points(other[start:len(other) - end])})")


def json_safe(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, tuples, strings, numbers, ``None``, bytes) with every
    string encodable as UTF-8: a lone surrogate becomes its ``\\udcxx`` escape, bytes become
    text (UTF-8, undecodable bytes as ``\\xNN``); other values are returned unchanged.
    Dict keys are made safe too. Never raises."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "backslashreplace")
    if isinstance(value, dict):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
