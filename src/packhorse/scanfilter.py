"""Include / exclude glob patterns of a source location, applied when it is scanned.

Patterns are matched against paths relative to the location's root, ``/`` separating folders
(as rsync and rclone filters are):

* ``*`` matches within one name, ``?`` one character, ``[abc]`` one of a set; ``**`` matches
  across folders (``raw/**/*.fits``).
* A pattern without ``/`` matches any single name at any depth: the file's own name or one of
  its folders (``*.tmp``, ``scratch``).
* A pattern with ``/`` is anchored at the root (a leading ``/`` is allowed) and matches the
  file's path or one of its folders (``inst1/obs0*`` takes every file below ``inst1/obs01/``).

A file is registered when ``include`` is empty or one of its patterns matches, and no
``exclude`` pattern matches (exclude wins). Files left out are neither registered nor listed as
skipped: leaving them out is what the configuration asked for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


def check_pattern(pattern: str) -> str | None:
    """Why ``pattern`` cannot be used (empty, a ``..`` or empty folder part, an unclosed
    ``[``), or ``None`` if it can."""
    body = pattern[1:] if pattern.startswith("/") else pattern
    if not body:
        return "empty pattern"
    if "\\" in body:
        return "backslashes are not allowed (folders are separated by '/')"
    parts = body.rstrip("/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "empty, '.' or '..' folder part"
    if body.count("[") != body.count("]"):
        return "unclosed '['"
    return None


def _regex(pattern: str) -> re.Pattern[str]:
    """The regular expression of a pattern with ``/``, or of one name (no ``/``)."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            j = pattern.index("]", i + 1)
            inner = pattern[i + 1:j]
            if inner.startswith("!"):
                inner = "^" + inner[1:]
            out.append("[" + inner.replace("\\", "\\\\") + "]")
            i = j + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out) + r"\Z")


@dataclass(frozen=True)
class _Pattern:
    text: str
    anchored: bool
    regex: re.Pattern[str]

    def matches(self, path: str) -> bool:
        parts = path.split("/")
        if not self.anchored:
            return any(self.regex.match(p) for p in parts)
        return any(self.regex.match("/".join(parts[:n])) for n in range(1, len(parts) + 1))


def _compile(pattern: str) -> _Pattern:
    problem = check_pattern(pattern)
    if problem:
        raise ValueError(f"pattern {pattern!r}: {problem}")
    body = pattern.lstrip("/").rstrip("/")
    anchored = "/" in pattern.rstrip("/")
    return _Pattern(pattern, anchored, _regex(body))


@dataclass(frozen=True)
class PathFilter:
    """The include / exclude patterns of one source location (``locations[].include`` and
    ``.exclude``). Raises ``ValueError`` on a pattern :func:`check_pattern` refuses."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    _inc: tuple[_Pattern, ...] = field(default=(), init=False, repr=False, compare=False)
    _exc: tuple[_Pattern, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_inc", tuple(_compile(p) for p in self.include))
        object.__setattr__(self, "_exc", tuple(_compile(p) for p in self.exclude))

    @property
    def active(self) -> bool:
        """True when there is at least one pattern."""
        return bool(self._inc or self._exc)

    def accepts(self, path: str) -> bool:
        """True if the file at ``path`` (relative, ``/``-separated) is to be registered."""
        if self._inc and not any(p.matches(path) for p in self._inc):
            return False
        return not self.excludes(path)

    def excludes(self, path: str) -> bool:
        """True if an ``exclude`` pattern matches ``path`` (a file or a folder)."""
        return any(p.matches(path) for p in self._exc)

    def why_left_out(self, path: str) -> str | None:
        """Why the file at ``path`` is not registered, naming the pattern: ``"excluded by
        pattern '<exclude pattern>'"`` (the first that matches; exclude wins) or ``"matches no
        include pattern ('<a>', '<b>')"``; ``None`` if :meth:`accepts` takes it."""
        for p in self._exc:
            if p.matches(path):
                return f"excluded by pattern {p.text!r}"
        if self._inc and not any(p.matches(path) for p in self._inc):
            return "matches no include pattern (" + ", ".join(repr(p.text) for p in self._inc) + ")"
        return None


def location_filter(location: object) -> PathFilter:
    """The :class:`PathFilter` of a ``LocationConfig`` (its ``include`` and ``exclude``)."""
    return PathFilter(tuple(getattr(location, "include", ()) or ()), tuple(getattr(location, "exclude", ()) or ()))
