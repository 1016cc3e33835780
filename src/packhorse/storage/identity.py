"""The identity marker of a data location: storage that is absent is not empty.

DESIGN.md "Architecture": every location root carries an identity marker written by
``packhorse init`` (as NGAS marks each of its volumes with a volume-id file); no backend
creates a missing root; work on an unavailable location waits and resumes by itself
(:mod:`packhorse.rules.availability`).

The marker is the object :data:`MARKER_KEY` (``_packhorse/location.json``) under the
location's root (disk: a file below the root folder; S3: an object under the location's
prefix), under the reserved prefix, so ``list`` never yields it and a scan never registers it.
It is written once (the backend's write-once publication, I2) and holds JSON::

    {"format": "packhorse-location-identity/1", "location": "cologne-lta", "site": "cologne",
     "role": "long_term_archive", "storage": "disk", "uuid": "…", "installation": "…",
     "created_at": "2026-…Z", "packhorse_version": "…"}

``installation`` is the uuid of the installation (ops database) that marked it
(:class:`~packhorse.db.models.Installation`; absent in markers written before it existed).

A location is *available* when its root is there and its marker names it
(:func:`check_identity`); a missing root (an unmounted disk, a renamed folder, a deleted
bucket), an empty mount point without the marker, or a marker naming another location (the
wrong disk mounted) make it *unavailable*, never "empty".
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from packhorse.errors import (
    ConfigError,
    DestinationConflictError,
    LocationUnavailableError,
    RestoreRequiredError,
    SourceMissingError,
)
from packhorse.storage.base import RESERVED_PREFIX, StorageBackend

#: Key of the identity marker under every location root.
MARKER_KEY = RESERVED_PREFIX + "location.json"
#: Value of the marker's ``format`` field.
MARKER_FORMAT = "packhorse-location-identity/1"
#: Largest marker read (bytes): anything bigger is not a packhorse marker.
MAX_MARKER_BYTES = 64 * 1024


@dataclass(frozen=True)
class InitResult:
    """What :func:`mark_location` did: ``action`` is ``"created"`` (a new, empty root),
    ``"adopted"`` (an existing buffer or archive root with objects and no marker: an existing
    deployment), ``"initialised"`` (a source root with files and no marker: the instrument's
    data, packhorse's to read from now on), ``"marked"`` (an existing empty root), ``"taken
    over"`` (marked anew for this installation by ``init --adopt``) or ``"already marked"``;
    ``objects`` counts the objects found under an adopted, initialised or taken-over root."""

    location: str
    action: str
    objects: int = 0


def where(backend: StorageBackend) -> str:
    """The location root as an operator names it: a folder path, or ``s3://bucket/prefix``."""
    root = getattr(backend, "root", None)
    if root is not None:
        return str(root)
    bucket = getattr(backend, "bucket", None)
    if bucket is not None:
        return f"s3://{bucket}/{getattr(backend, 'prefix', '')}"
    container = getattr(backend, "container", None)
    if container is not None:
        return f"azure://{container}/{getattr(backend, 'prefix', '')}"
    return backend.location


def read_marker(backend: StorageBackend) -> dict[str, Any] | None:
    """The location's marker as a dict, ``None`` if there is none.

    On cold storage (tape, Glacier: ``backend.cold``) the marker may itself have moved to the
    archive tier, where reading it needs a restore (hours, and billed). Its presence is then
    known from the store's listing and the name in it is not: the dict returned is
    ``{"format": MARKER_FORMAT, "location": None, "in_cold_storage": True}`` and the callers
    take the location as marked (an empty bucket or prefix still has no marker, so storage
    that is absent is still never taken for empty).

    Raises:
        LocationUnavailableError: the root itself is missing (the backend says so).
        ValueError: the marker is not valid marker JSON (message names the location).
    """
    try:
        if backend.stat(MARKER_KEY) is None:
            return None
        with backend.open_read(MARKER_KEY) as f:
            raw = f.read(MAX_MARKER_BYTES + 1)
    except SourceMissingError:
        return None
    except RestoreRequiredError:
        return {"format": MARKER_FORMAT, "location": None, "in_cold_storage": True}
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{backend.location}: identity marker {MARKER_KEY} at {where(backend)} is not JSON: {e}") from None
    if not isinstance(data, dict) or data.get("format") != MARKER_FORMAT or not isinstance(data.get("location"), str):
        raise ValueError(f"{backend.location}: {MARKER_KEY} at {where(backend)} is not a packhorse location marker")
    return data


def other_installation(marker: dict[str, Any], installation: str | None) -> str | None:
    """The uuid of the installation that wrote ``marker`` (:func:`read_marker`) when it is not
    ``installation`` (this database's); ``None`` when it is, when ``installation`` is not known
    yet, or when the marker names none (one written before installations were named, or one in
    cold storage, which cannot be read). The one test of "marked by another installation" for
    :func:`check_identity`, :func:`mark_location` and ``packhorse init``."""
    other = marker.get("installation")
    return other if installation is not None and isinstance(other, str) and other != installation else None


def check_identity(backend: StorageBackend, location: str, expected_uuid: str | None = None,
                   installation: str | None = None) -> None:
    """Raise :class:`LocationUnavailableError` unless ``backend``'s root is there and its
    marker names ``location`` and, when ``expected_uuid`` is given (the uuid ``packhorse init``
    recorded in the ops database), carries that uuid (DESIGN.md "Architecture"; read-only, a
    stat and a small read). A marker in cold storage cannot be read and is not compared.

    With no ``expected_uuid`` (this database never recorded a marker for ``location``), a
    marker naming another installation than ``installation`` (this database's
    :class:`~packhorse.db.models.Installation` uuid) is refused too: its copies belong to that
    installation's ops database, and only ``packhorse init --adopt`` takes the root over (a
    fresh database whose ``init`` was refused must not write there). A marker naming no
    installation (written before installations were named) is accepted.

    Raises:
        LocationUnavailableError: ``marker_only=False`` for a missing root; ``marker_only=True``
            for a root without a marker (an unmounted mount point, or an existing deployment not
            yet marked); ``marker_only=False`` for a marker naming another location, carrying
            another uuid (``wrong_uuid=True``: storage of another installation, or a marker
            copied onto blank storage), naming another installation while this database
            recorded none for it (``wrong_uuid=True``), or unreadable.
    """
    root = backend.root_missing()
    if root is not None:
        raise LocationUnavailableError(f"data location {location}: {root}", location=location, reason=root)
    try:
        marker = read_marker(backend)
    except ValueError as e:
        raise LocationUnavailableError(str(e), location=location, reason=str(e)) from None
    if marker is None:
        reason = (f"the root {where(backend)} has no identity marker {MARKER_KEY} (an unmounted mount point, or "
                  "storage not marked yet: `packhorse init` marks an existing root and keeps its data)")
        raise LocationUnavailableError(f"data location {location}: {reason}", location=location, reason=reason,
                                       marker_only=True)
    if marker["location"] is not None and marker["location"] != location:
        reason = (f"the root {where(backend)} is marked as location {marker['location']!r}, not {location!r} "
                  "(other storage mounted there?)")
        raise LocationUnavailableError(f"data location {location}: {reason}", location=location, reason=reason)
    found = marker.get("uuid")
    if expected_uuid is not None and not marker.get("in_cold_storage") and found != expected_uuid:
        # a marker without a uuid is not this location's either: every marker init writes has one
        reason = (f"the root {where(backend)} carries an identity marker of {location!r} with uuid {found}, but "
                  f"this installation marked {location!r} with uuid {expected_uuid} (storage of another "
                  f"installation, or a marker copied onto other storage?); if this storage really replaces "
                  f"the old: `packhorse init --replace {location}`")
        raise LocationUnavailableError(f"data location {location}: {reason}", location=location, reason=reason,
                                       wrong_uuid=True)
    other = other_installation(marker, installation)
    if expected_uuid is None and other is not None:
        reason = (f"the root {where(backend)} is marked by another packhorse installation (installation {other}), "
                  f"and this installation's database has never marked {location!r}: its copies belong to that "
                  f"installation's ops database. Check the path or bucket in the configuration; if this database "
                  f"really replaces that installation's (its database was lost): `packhorse init --adopt {location}`")
        raise LocationUnavailableError(f"data location {location}: {reason}", location=location, reason=reason,
                                       wrong_uuid=True)


def mark_location(backend: StorageBackend, *, location: str, site: str, role: str, storage: str,
                  version: str, installation: str | None = None, take_over: bool = False) -> InitResult:
    """Create the root of ``location`` if needed and write its identity marker (``packhorse
    init``; the only code that creates a root). An existing buffer or archive root with objects
    and no marker is adopted (an existing deployment: its objects are kept as they are); a
    source root (``role`` ``"source"``) with files and no marker is initialised: its files are
    the instrument's data, not an earlier deployment's.

    With ``take_over`` (``init --adopt``), a root marked as ``location`` by another
    installation than ``installation`` is marked anew for this one: the old marker is moved
    into the location's quarantine (kept, never deleted) and a new one, with a new uuid, is
    written, so the other installation's database, if it ever runs again, finds the root
    unavailable instead of writing and deleting beside this one's copies (its recorded uuid no
    longer matches). Result action ``"taken over"``.

    Raises:
        ConfigError: the root is marked as another location (never re-marked).
        StorageServiceError / OSError: the root could not be created or written.
    """
    created = backend.create_root()
    try:
        marker = read_marker(backend)
    except ValueError as e:
        raise ConfigError(f"{e}; move it aside if this storage belongs to {location!r}") from None
    taking_over = False
    if marker is not None:
        if marker["location"] is not None and marker["location"] != location:
            raise ConfigError(f"data location {location}: the root {where(backend)} is already marked as location "
                              f"{marker['location']!r}; refusing to re-mark it (check the path or bucket in the "
                              "configuration)")
        if not (take_over and other_installation(marker, installation)):
            return InitResult(location, "already marked")
        backend.quarantine(MARKER_KEY)  # the other installation's marker, kept
        taking_over = True
    objects = 0 if created else sum(1 for _ in backend.list())
    body = json.dumps({
        "format": MARKER_FORMAT, "location": location, "site": site, "role": role, "storage": storage,
        "uuid": str(uuid.uuid4()), **({"installation": installation} if installation else {}), "created_at": dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z"),
        "packhorse_version": version,
    }, indent=2, sort_keys=True).encode("utf-8") + b"\n"
    try:
        with backend.open_write(MARKER_KEY) as w:
            w.write(body)
            w.publish()
    except DestinationConflictError:  # a concurrent `packhorse init` marked it first
        again = read_marker(backend)
        if again is None or again["location"] not in (None, location):
            raise
        return InitResult(location, "already marked")
    if taking_over:
        return InitResult(location, "taken over", objects)
    if created or not objects:
        return InitResult(location, "created" if created else "marked", objects)
    return InitResult(location, "initialised" if role == "source" else "adopted", objects)


#: Value of a read-only source's fingerprint ``format`` field.
FINGERPRINT_FORMAT = "packhorse-root-fingerprint/1"
#: How many files of the root a fingerprint samples (and a check stats at most).
FINGERPRINT_SAMPLE = 8


def root_read_only(backend: StorageBackend) -> bool:
    """The root of a disk location is on a read-only file system (``statvfs`` ``ST_RDONLY``:
    a read-only mount or bind mount, an NFS export mounted ``ro``) or not writable for this
    process (``access(W_OK)``). ``False`` for a missing root and for storage without a root
    folder (S3: read-only there is a matter of the credentials, configured with ``read_only``).
    Read-only; never raises."""
    root = getattr(backend, "root", None)
    if root is None:
        return False
    try:
        return bool(os.statvfs(root).f_flag & os.ST_RDONLY) or not os.access(root, os.W_OK)
    except OSError:
        return False


def root_fingerprint(backend: StorageBackend, *, location: str, uuid_: str,
                     sample: list[tuple[str, int, int]] | None = None) -> dict[str, Any]:
    """The identity of a read-only source root, kept in the ops database instead of a marker
    written there (``packhorse init``; :class:`~packhorse.db.models.DataLocation` ``fingerprint``)::

        {"format": FINGERPRINT_FORMAT, "location": "fyst-source", "uuid": "…",
         "device": 2049, "inode": 131073,            # os.stat of the root (disk only)
         "sample": [["cam/obs1/f.fits", 1048576, 1733400000000000000], …],  # key, bytes, mtime ns
         "recorded_at": "2026-…Z"}

    ``sample`` defaults to the first :data:`FINGERPRINT_SAMPLE` objects the root lists (empty
    for an empty root). Read-only.

    Raises:
        LocationUnavailableError: the root is missing.
    """
    why = backend.root_missing()
    if why is not None:
        raise LocationUnavailableError(f"data location {location}: {why}", location=location, reason=why)
    device = inode = None
    root = getattr(backend, "root", None)
    if root is not None:
        st = os.stat(root)
        device, inode = st.st_dev, st.st_ino
    if sample is None:
        sample = [(o.key, o.size, o.mtime_ns if o.mtime_ns is not None else int(o.mtime * 1e9))
                  for o in itertools.islice(backend.list(), FINGERPRINT_SAMPLE)]
    return {"format": FINGERPRINT_FORMAT, "location": location, "uuid": uuid_, "device": device, "inode": inode,
            "sample": [list(x) for x in sample[:FINGERPRINT_SAMPLE]],
            "recorded_at": dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")}


def check_fingerprint(backend: StorageBackend, location: str, recorded: dict[str, Any] | None,
                      registered: Callable[[], list[tuple[str, int, int]]] = list) -> None:
    """Raise :class:`LocationUnavailableError` unless the root of read-only source ``location``
    is the one ``packhorse init`` fingerprinted (:func:`root_fingerprint`): the same device and
    inode of the root, or — after a remount gave it another device number — at least one file
    of the recorded sample or of ``registered()`` (up to :data:`FINGERPRINT_SAMPLE` files the
    ops database registered there: key, bytes, mtime ns) there with the same size and mtime.
    Read-only: a stat of the root and of a few files.

    The invariant: a read-only source that is unmounted (an empty mount point), or another
    export mounted in its place, is *unavailable*, never "empty" or "new files", although no
    marker can be written there.

    Raises:
        LocationUnavailableError: the root is missing (``marker_only=False``); no fingerprint
            is recorded (``marker_only=True``: ``packhorse init`` records it); the root is not
            the recorded one (``marker_only=False``).
    """
    why = backend.root_missing()
    if why is not None:
        raise LocationUnavailableError(f"data location {location}: {why}", location=location, reason=why)
    if recorded is None:
        reason = (f"the read-only source {where(backend)} has no identity recorded yet (packhorse writes no marker "
                  "there: `packhorse init` records its fingerprint in the ops database)")
        raise LocationUnavailableError(f"data location {location}: {reason}", location=location, reason=reason,
                                       marker_only=True)
    root = getattr(backend, "root", None)
    now = None
    if root is not None and recorded.get("device") is not None:
        st = os.stat(root)
        now = (st.st_dev, st.st_ino)
        if now == (recorded["device"], recorded["inode"]):
            return
    sample = [tuple(x) for x in recorded.get("sample") or []]
    sample += [x for x in registered() if x not in sample]
    for key, size, mtime_ns in sample[:2 * FINGERPRINT_SAMPLE]:
        try:
            info = backend.stat(key)
        except (SourceMissingError, OSError, ValueError):
            continue
        if info is not None and info.size == size and (info.mtime_ns is None or info.mtime_ns == mtime_ns):
            return
    if now is None and not sample:
        return  # nothing to tell it by (an object store's empty prefix at init): taken as it is
    was = f"device {recorded.get('device')}, inode {recorded.get('inode')}"
    reason = (f"the root {where(backend)} is not the read-only source recorded by `packhorse init` ({was}; now "
              f"{'device %s, inode %s' % now if now else 'unknown'}; none of the {len(sample)} recorded file(s) is "
              "there with its size and mtime): an unmounted mount point or another export mounted there?")
    raise LocationUnavailableError(f"data location {location}: {reason}", location=location, reason=reason)
