"""The storage contract of ``packhorse.storage.base`` (I2, I4, I6), run against every backend.

Add a backend by adding a :class:`Harness` factory to :data:`HARNESSES`: the generic tests
only use the backend interface plus the harness' medium-level hooks (count leftover partial
writes, corrupt a stored object behind the backend's back). Backends: ``disk``; ``s3``
(moto's S3 server over HTTP on loopback, conditional creates); ``s3-leased`` (the same
server with ``write_once_probe = false``: per-object leases in a SQLite ops database and a
check before every write); ``s3-seaweedfs`` (a real S3 implementation, SeaweedFS, one server
for the run: ``tests/seaweedfs_support.py``); ``azure`` (Azure Blob Storage on Azurite, one
emulator for the run: ``tests/azurite_support.py``); ``memory`` (the in-memory backend of unit tests,
``tests/memory_backend.py``); and each of these as the composed layer stack packhorse runs
(``<backend>+stack``: logging, retry, read rate and a fault layer, composed by
:func:`packhorse.storage.registry.compose`). Every harness is also run as a cold store
(:class:`memory_backend.ColdLayer`: restore requested, then readable). Disk-only and S3-only
checks are at the end.
"""

from __future__ import annotations

import gc
import hashlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from azurite_support import flip_first_byte
from fault_hooks import FaultPlan
from memory_backend import ColdLayer, MemoryBackend
from packhorse.errors import (
    DestinationConflictError,
    LocationUnavailableError,
    OperationDeferred,
    RestoreRequiredError,
    SourceMissingError,
    StorageBusyError,
    UnsafePathError,
    VerificationError,
)
from packhorse.runtime.hooks import NO_HOOKS
from packhorse.stages.base import copy_object
from packhorse.storage.azure import AzureBackend, make_container_client
from packhorse.storage.base import CHUNK_BYTES, PARTIAL_SUFFIX, EntryKind, StorageBackend
from packhorse.storage.disk import DiskBackend
from packhorse.storage.layers import Layer, innermost
from packhorse.storage.registry import compose


@dataclass
class Harness:
    """A backend under test and hooks that look at its storage medium directly."""

    backend: StorageBackend
    #: number of unpublished partial writes left on the medium
    count_partials: Callable[[], int]
    #: replace the stored bytes of ``key`` (same size) without going through the backend
    corrupt: Callable[[str], None]
    #: an unpublished writer leaves a partial on the medium (disk) rather than nothing (S3
    #: spools unpublished bytes locally)
    partials_on_medium: bool = True
    #: a backend of the same kind over a root that does not exist, and a check that it still
    #: does not (``None``: the backend has no root of its own, as the memory backend)
    missing_root: Callable[[], tuple[StorageBackend, Callable[[], bool]]] | None = None


def _disk(tmp_path: Path) -> Harness:
    root = tmp_path / "root"
    root.mkdir()  # `packhorse init` creates roots; a backend never does
    backend = DiskBackend("loc", root)

    def missing_root() -> tuple[StorageBackend, Callable[[], bool]]:
        absent = tmp_path / "unmounted" / "root"
        return DiskBackend("loc", absent), lambda: (tmp_path / "unmounted").exists()

    def count_partials() -> int:
        return sum(1 for p in root.rglob("*") if p.name.endswith(PARTIAL_SUFFIX))

    def corrupt(key: str) -> None:
        p = root / key
        data = bytearray(p.read_bytes())
        data[0] ^= 0xFF
        os.chmod(p, 0o644)  # published objects are read-only
        p.write_bytes(bytes(data))

    return Harness(backend, count_partials, corrupt, missing_root=missing_root)


def _s3_harness(request: pytest.FixtureRequest, *, leased: bool, server_fixture: str = "moto_s3") -> Harness:
    from packhorse.storage.s3 import MIN_PART_BYTES, S3Backend, make_client

    server = request.getfixturevalue(server_fixture)
    bucket = server.new_bucket()
    raw = server.client()
    client = make_client(endpoint_url=server.endpoint_url, region="us-east-1", path_style=True)
    kwargs: dict[str, object] = dict(multipart_threshold_bytes=MIN_PART_BYTES + 1024**2,
                                     multipart_part_bytes=MIN_PART_BYTES)
    if leased:
        from packhorse.db.session import Database
        from packhorse.storage.object_lease import db_object_lease

        tmp_path = request.getfixturevalue("tmp_path")
        db = Database(f"sqlite:///{tmp_path / 'ops.db'}")
        db.upgrade()
        kwargs.update(conditional_writes=False, object_lease=db_object_lease(db, "loc", lease_seconds=30,
                                                                             wait_seconds=30))
    backend = S3Backend("loc", client, bucket, "archive root/", **kwargs)  # type: ignore[arg-type]
    if not leased:
        assert backend.probe_write_once() is True  # moto and SeaweedFS honour If-None-Match: *

    def count_partials() -> int:
        return len(backend.incomplete_uploads())

    def corrupt(key: str) -> None:
        full = backend.prefix + key
        obj = raw.get_object(Bucket=bucket, Key=full)
        data = bytearray(obj["Body"].read())
        data[0] ^= 0xFF
        # an unconditional overwrite behind packhorse's back, keeping the recorded metadata
        raw.put_object(Bucket=bucket, Key=full, Body=bytes(data), Metadata=obj["Metadata"])

    def missing_root() -> tuple[StorageBackend, Callable[[], bool]]:
        absent = f"{bucket}-absent"
        b = S3Backend("loc", client, absent, "archive root/", **kwargs)  # type: ignore[arg-type]
        return b, lambda: absent in {x["Name"] for x in raw.list_buckets()["Buckets"]}

    return Harness(backend, count_partials, corrupt, partials_on_medium=False, missing_root=missing_root)


def _azure_harness(request: pytest.FixtureRequest) -> Harness:
    server = request.getfixturevalue("azurite")
    container = server.new_container()
    raw = server.container(container)
    client = make_container_client(account_url=server.account_url, container=container,
                                   connection_string=server.connection_string, location="loc")
    # blocks of 1 MiB above 1 MiB: the resumable-write tests (2 MiB + 123 bytes) go up in blocks
    backend = AzureBackend("loc", client, "archive root/", block_threshold_bytes=1024**2, block_bytes=1024**2)
    assert backend.probe_write_once() is True  # Azurite honours If-None-Match: * (409 BlobAlreadyExists)

    def corrupt(key: str) -> None:
        flip_first_byte(raw, backend.prefix + key)

    def missing_root() -> tuple[StorageBackend, Callable[[], bool]]:
        absent = f"{container}-absent"
        c = make_container_client(account_url=server.account_url, container=absent,
                                  connection_string=server.connection_string, location="loc")
        b = AzureBackend("loc", c, "archive root/", block_threshold_bytes=1024**2, block_bytes=1024**2)
        return b, lambda: absent in {x.name for x in server.service().list_containers()}

    return Harness(backend, lambda: len(backend.uncommitted_blobs()), corrupt, partials_on_medium=False,
                   missing_root=missing_root)


def _memory() -> Harness:
    backend = MemoryBackend("loc")
    return Harness(backend, lambda: 0, backend.corrupt, partials_on_medium=False)


def _stacked(inner: Harness) -> Harness:
    """The backend as packhorse runs it: every layer of compose(), a fault layer innermost."""
    stack = compose(inner.backend, hooks=FaultPlan([]), read_bytes_per_second=1e12)
    assert isinstance(stack, Layer) and stack.layers() == ["LoggingLayer", "RetryLayer", "ReadRateLayer",
                                                          "FaultLayer", type(inner.backend).__name__]
    missing = inner.missing_root

    def missing_root() -> tuple[StorageBackend, Callable[[], bool]]:
        assert missing is not None
        b, exists = missing()
        return compose(b, hooks=FaultPlan([]), read_bytes_per_second=1e12), exists

    return Harness(stack, inner.count_partials, inner.corrupt, inner.partials_on_medium,
                   missing_root=missing_root if missing is not None else None)


_BASES: dict[str, Callable[[pytest.FixtureRequest, Path], Harness]] = {
    "disk": lambda request, tmp_path: _disk(tmp_path),
    "s3": lambda request, tmp_path: _s3_harness(request, leased=False),
    "s3-leased": lambda request, tmp_path: _s3_harness(request, leased=True),
    "s3-seaweedfs": lambda request, tmp_path: _s3_harness(request, leased=False, server_fixture="seaweedfs"),
    "memory": lambda request, tmp_path: _memory(),
    "azure": lambda request, tmp_path: _azure_harness(request),
}
HARNESSES: dict[str, Callable[[pytest.FixtureRequest, Path], Harness]] = {
    **_BASES,
    **{f"{name}+stack": (lambda request, tmp_path, f=f: _stacked(f(request, tmp_path))) for name, f in _BASES.items()},
}


@pytest.fixture(params=sorted(HARNESSES))
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    return HARNESSES[request.param](request, tmp_path)


@pytest.fixture
def backend(harness: Harness) -> StorageBackend:
    return harness.backend


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def put(b: StorageBackend, key: str, data: bytes, **kw: str):  # type: ignore[no-untyped-def]
    with b.open_write(key) as w:
        for i in range(0, len(data), 7):  # several writes
            w.write(data[i:i + 7])
        return w.publish(**kw)


def get(b: StorageBackend, key: str) -> bytes:
    with b.open_read(key) as f:
        return f.read()


def keys(b: StorageBackend, prefix: str = "") -> list[str]:
    return [o.key for o in b.list(prefix)]


# ------------------------------------------------------------------------------ publish


def test_publish_then_read_back(backend: StorageBackend) -> None:
    data = b"raw package bytes\n" * 100
    r = put(backend, "packages/a.tar", data)
    assert (r.key, r.size, r.sha256, r.already_there) == ("packages/a.tar", len(data), sha(data), False)
    assert get(backend, "packages/a.tar") == data
    info = backend.stat("packages/a.tar")
    assert info is not None and (info.key, info.size) == ("packages/a.tar", len(data))
    assert backend.sha256("packages/a.tar") == sha(data)
    assert keys(backend) == ["packages/a.tar"]


def test_publish_empty_object(backend: StorageBackend) -> None:
    r = put(backend, "empty", b"")
    assert (r.size, r.sha256) == (0, sha(b""))
    assert get(backend, "empty") == b""


def test_nothing_visible_before_publish(harness: Harness) -> None:
    b = harness.backend
    with b.open_write("k") as w:
        w.write(b"half")
        assert b.stat("k") is None
        assert keys(b) == []
        with pytest.raises(SourceMissingError, match="'k'"):
            b.open_read("k")
        w.publish()
    assert get(b, "k") == b"half"


def test_publish_again_same_bytes_is_already_there(backend: StorageBackend) -> None:
    put(backend, "k", b"same bytes")
    r = put(backend, "k", b"same bytes")
    assert (r.already_there, r.size, r.sha256) == (True, 10, sha(b"same bytes"))
    assert get(backend, "k") == b"same bytes"
    assert keys(backend) == ["k"]


def test_publish_again_different_bytes_conflicts_and_keeps_original(harness: Harness) -> None:
    b = harness.backend
    put(b, "dir/k", b"original")
    for other in (b"ORIGINAL", b"original plus more", b""):
        with pytest.raises(DestinationConflictError, match="'dir/k' already holds different bytes") as ei:
            put(b, "dir/k", other)
        assert ei.value.path == "dir/k" and not ei.value.is_retryable
        if len(other) == len(b"original"):  # same size: the message says which bytes it found
            assert sha(b"original") in str(ei.value), str(ei.value)
        assert get(b, "dir/k") == b"original"
    assert harness.count_partials() == 0


def test_publish_with_wrong_expected_sha256_publishes_nothing(harness: Harness) -> None:
    b = harness.backend
    with pytest.raises(VerificationError, match="expected " + "0" * 64 + "; nothing published") as ei:
        put(b, "k", b"bytes", expected_sha256="0" * 64)
    assert ei.value.path == "k"
    assert b.stat("k") is None and keys(b) == []
    assert harness.count_partials() == 0
    # and the key is still free for the right bytes
    assert put(b, "k", b"bytes", expected_sha256=sha(b"bytes")).already_there is False


def test_publish_with_right_expected_sha256_onto_existing_same(backend: StorageBackend) -> None:
    put(backend, "k", b"x")
    assert put(backend, "k", b"x", expected_sha256=sha(b"x")).already_there is True


def _race(b: StorageBackend, payloads: list[bytes]) -> list[object]:
    """Publish ``payloads[i]`` under one key from one thread each, all at once."""
    barrier = threading.Barrier(len(payloads))
    results: list[object] = [None] * len(payloads)

    def run(i: int) -> None:
        try:
            with b.open_write("race/obj") as w:
                w.write(payloads[i])
                barrier.wait(timeout=10)
                results[i] = w.publish()
        except Exception as e:  # collected and asserted on below
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(payloads))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return results


def test_concurrent_publish_same_bytes(harness: Harness) -> None:
    b = harness.backend
    data = b"identical" * 1000
    results = _race(b, [data] * 8)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert errors == []
    assert sorted(r.already_there for r in results) == [False] + [True] * 7  # type: ignore[attr-defined]
    assert all(r.sha256 == sha(data) for r in results)  # type: ignore[attr-defined]
    assert keys(b) == ["race/obj"] and get(b, "race/obj") == data
    assert harness.count_partials() == 0


def test_concurrent_publish_different_bytes(harness: Harness) -> None:
    b = harness.backend
    payloads = [f"writer {i}".encode() * 50 for i in range(8)]
    results = _race(b, payloads)
    wins = [i for i, r in enumerate(results) if not isinstance(r, BaseException)]
    losses = [r for r in results if isinstance(r, BaseException)]
    assert len(wins) == 1
    assert results[wins[0]].already_there is False  # type: ignore[attr-defined]
    assert len(losses) == 7 and all(isinstance(e, DestinationConflictError) for e in losses), losses
    assert get(b, "race/obj") == payloads[wins[0]]
    assert harness.count_partials() == 0


# ------------------------------------------------------------------------- abort / crash


def test_abort_leaves_nothing(harness: Harness) -> None:
    b = harness.backend
    w = b.open_write("a/k")
    w.write(b"some bytes")
    w.abort()
    w.abort()  # idempotent
    assert b.stat("a/k") is None and keys(b) == [] and harness.count_partials() == 0


def test_exception_inside_block_aborts(harness: Harness) -> None:
    b = harness.backend
    with pytest.raises(RuntimeError, match="boom"):
        with b.open_write("a/k") as w:
            w.write(b"some bytes")
            raise RuntimeError("boom")
    assert b.stat("a/k") is None and keys(b) == [] and harness.count_partials() == 0


def test_leaving_block_without_publish_aborts(harness: Harness) -> None:
    b = harness.backend
    with b.open_write("a/k") as w:
        w.write(b"some bytes")
    assert b.stat("a/k") is None and keys(b) == [] and harness.count_partials() == 0


def test_killed_writer_leaves_only_a_partial_that_cleanup_removes(harness: Harness) -> None:
    b = harness.backend
    put(b, "a/done", b"complete")
    # a killed process: bytes written, neither publish nor abort ever runs
    w = b.open_write("a/k")
    w.write(b"x" * 1000)
    w2 = b.open_write("b/deep/k2")
    w2.write(b"y")
    del w, w2
    gc.collect()
    left = 2 if harness.partials_on_medium else 0
    assert harness.count_partials() == left
    assert b.stat("a/k") is None and b.stat("b/deep/k2") is None
    assert keys(b) == ["a/done"]
    assert keys(b, "a/") == ["a/done"]
    assert b.cleanup_partials(3600) == 0  # too young
    assert harness.count_partials() == left
    assert b.cleanup_partials(0) == left
    assert harness.count_partials() == 0
    assert keys(b) == ["a/done"] and get(b, "a/done") == b"complete"
    # the key is free for a new attempt
    assert put(b, "a/k", b"retry").already_there is False


def _transfer_work(attempt: int) -> SimpleNamespace:
    """What :func:`~packhorse.stages.base.copy_object` needs of a claimed operation: its attempt
    (the fencing token), hooks, the lease checks (never lost here) and the progress count."""
    done: list[int] = []
    return SimpleNamespace(ctx=SimpleNamespace(hooks=NO_HOOKS), claim=SimpleNamespace(attempt=attempt), info={},
                           check=lambda: None, progress=done.append, done=done)


@pytest.mark.parametrize("killed_at", [0, 1000, CHUNK_BYTES + 5], ids=["empty", "small", "over-a-chunk"])
def test_a_killed_resumable_write_of_any_size_is_finished_by_the_next_attempt(harness: Harness,
                                                                              killed_at: int) -> None:
    # attempt 1 of a transfer is killed with ``killed_at`` bytes written (0: the partial was
    # created and nothing had reached it yet); attempt 2 copies through the transfer's own path
    # and must finish in that one attempt, whatever the partial holds
    b = harness.backend
    data = os.urandom(2 * CHUNK_BYTES + 123)
    source = MemoryBackend("src")
    put(source, "bundles/b.tar", data)
    w = b.open_resumable_write("bundles/b.tar", 1)
    w.write(data[:killed_at])
    del w  # a killed process: neither publish nor abort ever runs
    gc.collect()
    assert harness.count_partials() == (1 if harness.partials_on_medium else 0)
    work = _transfer_work(attempt=2)
    result = copy_object(work, source, "bundles/b.tar", b, "bundles/b.tar", size=len(data),  # type: ignore[arg-type]
                         sha256=sha(data), point="transfer", resume=True, to_buffer=True)
    assert result.already_there is False and result.sha256 == sha(data)
    assert get(b, "bundles/b.tar") == data
    assert harness.count_partials() == 0
    assert work.info.get("resumed_bytes", 0) == (killed_at if harness.partials_on_medium else 0)
    assert sum(work.done) == len(data)


# -------------------------------------------------------------------------- read / sha256


def test_open_read_missing_raises_source_missing(backend: StorageBackend) -> None:
    with pytest.raises(SourceMissingError, match="'nope/x' does not exist") as ei:
        backend.open_read("nope/x")
    assert ei.value.path == "nope/x"
    assert backend.stat("nope/x") is None


def test_sha256_rereads_the_stored_bytes(harness: Harness) -> None:
    b = harness.backend
    r = put(b, "k", b"good bytes")
    harness.corrupt("k")
    assert b.sha256("k") != r.sha256
    assert b.sha256("k") == sha(get(b, "k"))
    assert get(b, "k") != b"good bytes"


def test_publish_onto_corrupted_object_is_a_conflict(harness: Harness) -> None:
    # "already there" is decided by re-reading, never by size alone
    b = harness.backend
    put(b, "k", b"good bytes")
    harness.corrupt("k")
    with pytest.raises(DestinationConflictError):
        put(b, "k", b"good bytes")


# ------------------------------------------------------------------------------ delete


def test_delete(backend: StorageBackend) -> None:
    put(backend, "a/b/k", b"x")
    put(backend, "a/other", b"y")
    assert backend.delete("a/b/k") is True
    assert backend.stat("a/b/k") is None
    with pytest.raises(SourceMissingError):
        backend.open_read("a/b/k")
    assert keys(backend) == ["a/other"]
    assert backend.delete("a/b/k") is False
    assert backend.delete("never/existed") is False
    # a deleted key can be written again
    assert put(backend, "a/b/k", b"new").already_there is False
    assert get(backend, "a/b/k") == b"new"


# -------------------------------------------------------------------------- quarantine


def test_quarantine_moves_the_object_aside_and_frees_the_key(harness: Harness) -> None:
    b = harness.backend
    put(b, "raw/a b.tar", b"rotten bytes")
    put(b, "raw/other.tar", b"other")
    q = b.quarantine("raw/a b.tar")
    assert q is not None and q.startswith("_packhorse/quarantine/raw/a b.tar.")
    assert b.stat("raw/a b.tar") is None
    assert get(b, q) == b"rotten bytes"  # kept, readable for a post-mortem
    assert keys(b) == ["raw/other.tar"]  # packhorse's own keys are never listed
    assert put(b, "raw/a b.tar", b"good bytes").already_there is False  # the key is free for a repair
    q2 = b.quarantine("raw/a b.tar")
    assert q2 is not None and q2 != q and get(b, q) == b"rotten bytes" and get(b, q2) == b"good bytes"
    assert b.quarantine("raw/never.tar") is None


# ------------------------------------------------------------------------------ listing


def test_list_sorted_with_prefixes(backend: StorageBackend) -> None:
    names = ["b/2", "a/10", "a/1", "a b/x", "ab", "a/sub/z", "z", "ä/y"]
    for i, k in enumerate(names):
        put(backend, k, bytes([i]) * (i + 1))
    assert keys(backend) == sorted(names)
    assert keys(backend, "a/") == ["a/1", "a/10", "a/sub/z"]
    assert keys(backend, "a") == ["a b/x", "a/1", "a/10", "a/sub/z", "ab"]
    assert keys(backend, "a/1") == ["a/1", "a/10"]
    assert keys(backend, "ä") == ["ä/y"]
    assert keys(backend, "nothing") == []
    sizes = {o.key: o.size for o in backend.list()}
    assert sizes == {k: i + 1 for i, k in enumerate(names)}


@pytest.mark.parametrize("key", ["with space/file name.tar", "Köln/µ-wave ☃.tar", "日本/観測 1.dat", " lead", "trail "])
def test_keys_with_spaces_and_non_ascii(backend: StorageBackend, key: str) -> None:
    data = key.encode() * 3
    assert put(backend, key, data).key == key
    assert get(backend, key) == data
    assert keys(backend) == [key]
    assert backend.sha256(key) == sha(data)
    assert backend.delete(key) is True and keys(backend) == []


UNSAFE = ["../x", "a/../../x", "/abs", "/etc/passwd", "a//b", "a/./b", "./a", "a/", "", "a\\b", "a\x00b",
          "k" + PARTIAL_SUFFIX, "dir/.k.abc" + PARTIAL_SUFFIX, "dir" + PARTIAL_SUFFIX + "/k"]


@pytest.mark.parametrize("key", UNSAFE)
def test_unsafe_keys_are_refused(harness: Harness, tmp_path: Path, key: str) -> None:
    b = harness.backend
    ops: list[Callable[[], object]] = [lambda: b.open_write(key), lambda: b.open_read(key),
                                       lambda: b.stat(key), lambda: b.delete(key), lambda: b.sha256(key)]
    for op in ops:
        with pytest.raises(UnsafePathError) as ei:
            op()
        assert repr(key) in str(ei.value)
    assert keys(b) == [] and harness.count_partials() == 0
    assert not (tmp_path / "x").exists()


# ------------------------------------------------------------------------------ walk


def files_walked(b: StorageBackend, prefix: str = "") -> list[tuple[str, int]]:
    return [(e.path, e.size) for e in b.walk(prefix) if e.kind is EntryKind.FILE]


def test_walk_yields_every_object_with_size_and_mtime_below_its_start(harness: Harness) -> None:
    b = harness.backend
    for key, data in [("night-1/obs-2/b.dat", b"bb"), ("night-1/obs-2/a.dat", b"a"), ("night-1/obs-10/c.dat", b"ccc"),
                      ("night-2/d.dat", b""), ("top.txt", b"top")]:
        put(b, key, data)
    entries = list(b.walk())
    assert (entries[0].path, entries[0].kind) == ("", EntryKind.FOLDER)  # the start comes first
    files = [e for e in entries if e.kind is EntryKind.FILE]
    assert sorted((e.path, e.size) for e in files) == [
        ("night-1/obs-10/c.dat", 3), ("night-1/obs-2/a.dat", 1), ("night-1/obs-2/b.dat", 2), ("night-2/d.dat", 0),
        ("top.txt", 3)]
    for e in files:  # the walk's size and mtime are the object's
        info = b.stat(e.path)
        assert info is not None and info.size == e.size
        assert abs(e.mtime_ns / 1e9 - info.mtime) < 1.0
        assert e.error is None
    # within one folder, entries come sorted by name
    assert [p for p, _ in files_walked(b, "night-1/obs-2")] == ["night-1/obs-2/a.dat", "night-1/obs-2/b.dat"]
    assert files_walked(b, "night-2") == [("night-2/d.dat", 0)]
    assert files_walked(b, "night-3") == []  # a folder with nothing in it: nothing, not an error


def test_walk_leaves_out_unpublished_writes_and_packhorses_own_objects(harness: Harness) -> None:
    b = harness.backend
    put(b, "keep/a.dat", b"a")
    put(b, "bad/b.dat", b"b")
    assert b.quarantine("bad/b.dat") is not None  # now under _packhorse/quarantine/
    with b.open_write("keep/half.dat") as w:
        w.write(b"not yet")
        assert [p for p, _ in files_walked(b)] == ["keep/a.dat"]
    assert not any(e.path.startswith("_packhorse") for e in b.walk())


def test_walk_of_an_absent_location_raises_never_lists_empty(harness: Harness) -> None:
    if harness.missing_root is None:  # no root of its own: the memory backend switched off
        gone: StorageBackend = MemoryBackend("loc")
        gone.available = False  # type: ignore[attr-defined]
        exists = None
    else:
        gone, exists = harness.missing_root()
    with pytest.raises(LocationUnavailableError, match="data location loc"):
        list(gone.walk())
    assert exists is None or not exists()  # and the walk did not create it


def test_walk_refuses_an_unsafe_start(backend: StorageBackend) -> None:
    with pytest.raises(UnsafePathError):
        list(backend.walk("../elsewhere"))


# ---------------------------------------------------------------------------- disk-only


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# ------------------------------------------------------------------------------ absent storage


def test_no_backend_creates_a_missing_root(harness: Harness) -> None:
    """Storage that is absent is not empty (DESIGN.md "Architecture"): over a missing root every
    call says "unavailable" (never "no such object", never an empty listing) and nothing is
    created — no folder, no bucket."""
    if harness.missing_root is None:
        pytest.skip("this backend has no root of its own")
    b, exists = harness.missing_root()
    assert b.root_missing() is not None
    for call in (lambda: b.stat("raw/a.tar"), lambda: b.open_read("raw/a.tar"), lambda: keys(b),
                 lambda: b.delete("raw/a.tar"), lambda: b.quarantine("raw/a.tar"),
                 lambda: put(b, "raw/a.tar", b"bytes that must not land anywhere"),
                 lambda: put(b, "top-level.tar", b"nor here")):
        with pytest.raises(LocationUnavailableError) as e:
            call()
        assert e.value.location == "loc" and not e.value.marker_only
        assert not exists(), "a backend created its missing root"
    assert b.cleanup_partials(0) == 0
    assert not exists()


def test_root_taken_away_and_back(harness: Harness, tmp_path: Path) -> None:
    """A root that goes away after objects were published (an unmounted disk) is unavailable,
    not empty; back in place, the same objects are there again."""
    b = harness.backend
    root = getattr(innermost_of(b), "root", None)
    if root is None:
        pytest.skip("only a folder root can be taken away here (an S3 bucket: the missing-bucket test)")
    put(b, "raw/a.tar", b"archived")
    away = tmp_path / "away"
    os.rename(root, away)
    try:
        with pytest.raises(LocationUnavailableError):
            b.stat("raw/a.tar")
        with pytest.raises(LocationUnavailableError):
            keys(b)
        with pytest.raises(LocationUnavailableError):
            put(b, "raw/b.tar", b"new")
        assert not Path(root).exists()
    finally:
        os.rename(away, root)
    assert get(b, "raw/a.tar") == b"archived" and keys(b) == ["raw/a.tar"]


def innermost_of(b: StorageBackend) -> StorageBackend:
    from packhorse.storage.layers import innermost

    return innermost(b)


def test_cold_store_needs_a_restore_before_reading(harness: Harness) -> None:
    clock = FakeClock()
    warm = harness.backend
    put(warm, "raw/cold.tar", b"archived long ago")  # written before the location went cold
    cold = ColdLayer(warm, restore_seconds=60, clock=clock)
    assert cold.cold and cold.stat("raw/cold.tar") is not None  # listed and stat-able, not readable
    assert not cold.restore_ready("raw/cold.tar")
    with pytest.raises(RestoreRequiredError, match="'raw/cold.tar'"):
        cold.open_read("raw/cold.tar")
    cold.request_restore("raw/cold.tar")
    cold.request_restore("raw/cold.tar")  # idempotent: the first request's time counts
    clock.now += 59
    assert not cold.restore_ready("raw/cold.tar")
    clock.now += 1
    assert cold.restore_ready("raw/cold.tar") and get(cold, "raw/cold.tar") == b"archived long ago"
    assert cold.sha256("raw/cold.tar") == sha(b"archived long ago")
    with pytest.raises(SourceMissingError):
        cold.request_restore("raw/never-there.tar")
    r = put(cold, "raw/new.tar", b"just published")  # the hot tier: readable for the verification
    assert not r.already_there and get(cold, "raw/new.tar") == b"just published"


def test_a_cold_object_met_by_a_publication_is_restored_and_read_never_taken_on_trust(harness: Harness) -> None:
    # "already there" of an object in cold storage that is not restored: the restore is
    # requested and the operation waits (OperationDeferred, the location's poll interval), it
    # never fails with RestoreRequiredError (found by a user on Azure's Archive tier)
    clock = FakeClock()
    put(harness.backend, "raw/cold.tar", b"archived long ago")
    cold = ColdLayer(harness.backend, restore_seconds=60, clock=clock)
    with pytest.raises(OperationDeferred, match="'?raw/cold.tar'?.* restore requested") as e:
        cold.holds("raw/cold.tar", len(b"archived long ago"), sha(b"archived long ago"))
    assert e.value.seconds == cold.restore_poll_seconds
    with pytest.raises(OperationDeferred):  # still waiting; the first request's time counts
        cold.holds("raw/cold.tar", len(b"archived long ago"), sha(b"archived long ago"))
    clock.now += 60
    assert cold.holds("raw/cold.tar", len(b"archived long ago"), sha(b"archived long ago")) is True
    with pytest.raises(DestinationConflictError):  # another size: a conflict without a restore
        cold.holds("raw/cold.tar", 3, sha(b"abc"))


@pytest.fixture
def disk(tmp_path: Path) -> DiskBackend:
    (tmp_path / "root").mkdir()
    return DiskBackend("loc", tmp_path / "root")


def test_disk_published_object_is_read_only_and_dir_has_no_partials(disk: DiskBackend) -> None:
    put(disk, "a/k", b"x")
    path = disk.root / "a" / "k"
    assert path.stat().st_mode & 0o777 == 0o444
    assert sorted(p.name for p in (disk.root / "a").iterdir()) == ["k"]


def test_disk_symlinked_folder_escaping_root_is_refused(disk: DiskBackend, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    (disk.root / "escape").symlink_to(outside)
    with pytest.raises(UnsafePathError, match="'escape/new' resolves outside the location root"):
        disk.open_write("escape/new")
    with pytest.raises(UnsafePathError, match="'escape/deeper/new' resolves outside"):
        disk.open_write("escape/deeper/new")
    with pytest.raises(UnsafePathError, match="'escape/secret' resolves outside"):
        disk.open_read("escape/secret")
    with pytest.raises(UnsafePathError):
        disk.delete("escape/secret")
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    assert (outside / "secret").read_bytes() == b"secret"


def test_disk_symlinked_root_itself_is_fine(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    b = DiskBackend("loc", tmp_path / "link")
    put(b, "a/k", b"x")
    assert (real / "a" / "k").read_bytes() == b"x" and get(b, "a/k") == b"x"


def test_disk_symlink_object_is_not_followed(disk: DiskBackend, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"secret")
    (disk.root / "link").symlink_to(secret)
    with pytest.raises(UnsafePathError, match="'link' is a symlink"):
        disk.open_read("link")
    with pytest.raises(UnsafePathError):
        disk.sha256("link")
    with pytest.raises(UnsafePathError, match="'link' is not a regular file"):
        disk.stat("link")
    assert keys(disk) == []


def test_disk_publish_onto_a_symlink_never_writes_through_it(disk: DiskBackend, tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"outside")
    (disk.root / "k").symlink_to(target)
    for data in (b"outside", b"new bytes"):  # same bytes as the link target, and different
        with pytest.raises(UnsafePathError, match="'k' is not a regular file"):
            put(disk, "k", data)
    assert target.read_bytes() == b"outside"
    assert os.path.islink(disk.root / "k")
    assert sum(1 for p in disk.root.iterdir() if p.name.endswith(PARTIAL_SUFFIX)) == 0


def test_disk_list_skips_symlinks_and_partials(disk: DiskBackend, tmp_path: Path) -> None:
    put(disk, "a/k", b"x")
    (tmp_path / "f").write_bytes(b"f")
    (disk.root / "a" / "link").symlink_to(tmp_path / "f")
    (disk.root / "a" / (".k.123" + PARTIAL_SUFFIX)).write_bytes(b"partial")
    assert keys(disk) == ["a/k"]


def test_disk_delete_prunes_empty_folders_but_not_root(disk: DiskBackend) -> None:
    put(disk, "a/b/c/k", b"x")
    assert disk.delete("a/b/c/k") is True
    assert disk.root.is_dir() and list(disk.root.iterdir()) == []


def test_disk_remove_partials_of_one_key_only(disk: DiskBackend) -> None:
    w1 = disk.open_write("a/k[1]")
    w1.write(b"1")
    w2 = disk.open_write("a/other")
    w2.write(b"2")
    del w1, w2
    gc.collect()
    assert disk.remove_partials_of("a/k[1]") == 1
    assert [p.name.startswith(".other.") for p in (disk.root / "a").iterdir()] == [True]


def test_disk_remove_partials_of_leaves_a_live_writers_partial_alone(disk: DiskBackend) -> None:
    """Two audits repairing the same copy at once: the second's removal of leftover partials
    took the first's partial away under it, whose publication then failed with
    FileNotFoundError (seen in a fixity test). A partial whose writer holds its flock is not
    leftover."""
    live = disk.open_write("raw/k.tar")
    live.write(b"live bytes")
    assert disk.remove_partials_of("raw/k.tar") == 0
    with disk.open_write("raw/k.tar") as other:  # the other repair writes its own partial
        other.write(b"live bytes")
        other.publish()
    live.publish()  # the same bytes there already: fine (it raised FileNotFoundError: its partial was gone)
    assert disk.open_read("raw/k.tar").read() == b"live bytes"
    assert not [p for p in (disk.root / "raw").iterdir() if p.name.endswith(PARTIAL_SUFFIX)]


def test_disk_remove_partials_of_a_folder_pruned_meanwhile_finds_none(disk: DiskBackend,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A deletion of the last object of a folder prunes it while the next write of a key there
    looks for its leftover partials (an unpack into a buffer whose copies are being freed):
    nothing to remove, not a FileNotFoundError that failed the unpack for good."""
    with disk.open_write("raw/inst-2/obs-1.tar") as w:
        w.write(b"x")
        w.publish()
    real_scandir = os.scandir

    def pruned_first(path):  # type: ignore[no-untyped-def]
        if str(path) == str(disk.root / "raw/inst-2"):
            assert disk.delete("raw/inst-2/obs-1.tar") is True  # the deletion's prune, just now
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", pruned_first)
    assert disk.remove_partials_of("raw/inst-2/obs-2.tar") == 0
    monkeypatch.undo()
    assert not (disk.root / "raw/inst-2").exists()
    with disk.open_write("raw/inst-2/obs-2.tar") as w:  # the write goes on: its folder is made again
        w.write(b"y")
        w.publish()
    assert disk.stat("raw/inst-2/obs-2.tar").size == 1


def test_disk_file_in_the_way_of_a_folder_is_a_conflict(disk: DiskBackend) -> None:
    # a file occupies the folder name a key needs: permanent conflict, nothing touched
    with disk.open_write("raw") as w:
        w.write(b"i am a file")
        w.publish()
    with pytest.raises(DestinationConflictError, match="'raw/a.tar'"):
        disk.open_write("raw/a.tar")
    assert disk.open_read("raw").read() == b"i am a file"


def test_disk_open_write_survives_a_concurrent_prune_of_its_folder(disk: DiskBackend, monkeypatch) -> None:
    # a concurrent delete() prunes the empty folder right after open_write created it
    real_path = DiskBackend._path
    pruned: list[Path] = []

    def racing_path(self: DiskBackend, key: str, *, create_parents: bool = False) -> Path:
        path = real_path(self, key, create_parents=create_parents)
        if create_parents and not pruned:
            path.parent.rmdir()
            pruned.append(path.parent)
        return path

    monkeypatch.setattr(DiskBackend, "_path", racing_path)
    with pytest.raises(StorageBusyError, match="'raw/inst/obs.tar'"):  # the backend says "try again"
        disk.open_write("raw/inst/obs.tar")
    pruned.clear()
    pauses: list[float] = []
    stack = compose(disk, sleep=pauses.append)  # ... and the retry layer of the composed stack does
    with stack.open_write("raw/inst/obs.tar") as w:
        w.write(b"payload")
        w.publish()
    assert pruned and pauses == [0.05] and stack.open_read("raw/inst/obs.tar").read() == b"payload"


def test_disk_folder_is_invisible_until_published_and_never_replaced(disk: DiskBackend) -> None:
    with disk.open_folder_write("staged/inst/obs") as pending:
        bag = pending.path / "obs-bag"
        (bag / "data").mkdir(parents=True)
        (bag / "data" / "a.dat").write_bytes(b"payload")
        assert disk.folder("staged/inst/obs") is None and keys(disk) == []  # partial folders are not listed
        assert pending.publish(bag) is True
    published = disk.folder("staged/inst/obs")
    assert published is not None and (published / "data" / "a.dat").read_bytes() == b"payload"
    assert keys(disk) == ["staged/inst/obs/data/a.dat"]
    with disk.open_folder_write("staged/inst/obs") as second:  # a concurrent attempt's folder
        (second.path / "data").mkdir()
        (second.path / "data" / "a.dat").write_bytes(b"other")
        assert second.publish() is False  # the key was taken: nothing replaced
    assert (published / "data" / "a.dat").read_bytes() == b"payload"
    assert [p.name for p in published.parent.iterdir()] == ["obs"]  # both partial folders are gone


def test_disk_quarantine_folder_moves_a_published_folder_aside_whole_and_frees_the_key(disk: DiskBackend) -> None:
    with disk.open_folder_write("inst/obs") as pending:
        (pending.path / "data").mkdir()
        (pending.path / "data" / "a.dat").write_bytes(b"damaged")
        assert pending.publish() is True
    before = os.stat(disk.folder("inst/obs") / "data" / "a.dat")  # type: ignore[operator]
    aside = disk.quarantine_folder("inst/obs")
    assert aside is not None and aside.startswith("_packhorse/quarantine/inst/obs.")
    assert disk.folder("inst/obs") is None  # the key is free for a new folder
    moved = disk.root / aside / "data" / "a.dat"
    after = os.stat(moved)
    assert moved.read_bytes() == b"damaged" and (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)
    assert disk.quarantine_folder("inst/obs") is None  # nothing there: nothing moved
    put(disk, "inst/file", b"x")
    with pytest.raises(UnsafePathError):  # a file is not a folder: left where it is
        disk.quarantine_folder("inst/file")
    assert get(disk, "inst/file") == b"x"


def test_disk_partial_folder_is_removed_by_abort_and_by_cleanup(disk: DiskBackend) -> None:
    with disk.open_folder_write("staged/a") as pending:
        (pending.path / "f").write_bytes(b"x")
    assert not pending.path.exists()  # left without publishing
    crashed = disk.open_folder_write("staged/b")  # a crashed extraction
    (crashed.path / "deep").mkdir()
    (crashed.path / "deep" / "f").write_bytes(b"x")
    assert disk.cleanup_partials(3600) == 0 and crashed.path.exists()  # young: an extraction may still run
    old = time.time() - 7200
    for p in (crashed.path / "deep" / "f", crashed.path / "deep", crashed.path):
        os.utime(p, (old, old))
    assert disk.cleanup_partials(3600) == 1 and not crashed.path.exists()
    with pytest.raises(UnsafePathError):
        disk.open_folder_write("../outside")
    with pytest.raises(UnsafePathError, match="not inside the partial folder"):
        disk.open_folder_write("staged/c").publish(disk.root)
    put(disk, "staged/file", b"a file")
    with pytest.raises(UnsafePathError, match="not a folder"):
        disk.folder("staged/file")


def test_disk_walk_reports_links_and_special_files_without_following_them(disk: DiskBackend, tmp_path: Path) -> None:
    root = disk.root
    put(disk, "obs/a.dat", b"a")
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "secret.dat").write_bytes(b"not the location's")
    os.symlink(outside, root / "obs" / "linked-folder")
    os.symlink(outside / "deep" / "secret.dat", root / "obs" / "linked-file")
    os.symlink(root / "obs" / "nowhere", root / "obs" / "dangling")
    os.mkfifo(root / "obs" / "pipe")
    (root / "obs" / "left.packhorse-partial").write_bytes(b"a source may hold such a name")
    kinds = {e.path: e.kind for e in disk.walk()}
    assert kinds == {"": EntryKind.FOLDER, "obs": EntryKind.FOLDER, "obs/a.dat": EntryKind.FILE,
                     "obs/dangling": EntryKind.SYMLINK, "obs/left.packhorse-partial": EntryKind.FILE,
                     "obs/linked-file": EntryKind.SYMLINK, "obs/linked-folder": EntryKind.SYMLINK,
                     "obs/pipe": EntryKind.SPECIAL}


def test_disk_walk_reports_names_that_are_not_utf8_as_they_are(disk: DiskBackend) -> None:
    os.makedirs(disk.root / "obs")
    with open(os.path.join(os.fsencode(disk.root), b"obs", b"caf\xe9.dat"), "wb") as f:
        f.write(b"latin-1 name")
    [entry] = [e for e in disk.walk() if e.kind is EntryKind.FILE]
    assert os.fsencode(entry.path) == b"obs/caf\xe9.dat" and entry.size == 12


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every folder")
def test_disk_walk_reports_an_unreadable_folder_and_goes_on(disk: DiskBackend) -> None:
    put(disk, "closed/a.dat", b"a")
    put(disk, "open/b.dat", b"b")
    os.chmod(disk.root / "closed", 0)
    try:
        entries = {e.path: e for e in disk.walk()}
    finally:
        os.chmod(disk.root / "closed", 0o755)
    assert entries["closed"].kind is EntryKind.FOLDER and entries["closed"].error == "Permission denied"
    assert "closed/a.dat" not in entries and entries["open/b.dat"].kind is EntryKind.FILE


def test_disk_walk_reuses_an_unchanged_folder_and_walks_its_subfolders(disk: DiskBackend) -> None:
    put(disk, "night/a.dat", b"a")
    put(disk, "night/obs/b.dat", b"b")
    asked: list[tuple[str, int]] = []
    night_mtime = os.stat(disk.root / "night").st_mtime_ns

    def reuse(path: str, mtime_ns: int) -> list[str] | None:
        asked.append((path, mtime_ns))
        return ["night/obs"] if path == "night" else None

    entries = [(e.path, e.kind) for e in disk.walk(reuse=reuse)]
    # night's own files are not listed again; its subfolder is walked afresh
    assert entries == [("", EntryKind.FOLDER), ("night", EntryKind.FOLDER), ("night/obs", EntryKind.FOLDER),
                       ("night/obs/b.dat", EntryKind.FILE)]
    assert ("night", night_mtime) in asked


def test_disk_walk_never_creates_a_missing_root(tmp_path: Path) -> None:
    b = DiskBackend("src", tmp_path / "not-mounted")
    with pytest.raises(LocationUnavailableError, match="not-mounted"):
        list(b.walk())
    assert not (tmp_path / "not-mounted").exists()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.dat").write_bytes(b"x")
    os.symlink(tmp_path / "elsewhere", tmp_path / "not-mounted")  # mounted later, as a link
    assert files_walked(b) == [("x.dat", 1)]


def test_disk_quarantine_moves_a_folder_or_link_standing_at_a_key_aside_unread(disk: DiskBackend, tmp_path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"not the archive's")
    (disk.root / "raw").mkdir()
    (disk.root / "raw" / "dir.tar").mkdir()
    (disk.root / "raw" / "dir.tar" / "notes").write_bytes(b"someone's folder")
    os.symlink(outside, disk.root / "raw" / "link.tar")
    for key in ("raw/dir.tar", "raw/link.tar"):
        aside = disk.quarantine(key)
        assert aside is not None and aside.startswith(f"_packhorse/quarantine/{key}.")
        assert not os.path.lexists(disk.root / key)  # the key is free for the copy it must hold
        assert put(disk, key, b"the copy").already_there is False and get(disk, key) == b"the copy"
    moved = sorted((disk.root / "_packhorse/quarantine/raw").iterdir())
    assert [m.name.split(".tar.")[0] for m in moved] == ["dir", "link"]
    assert (moved[0] / "notes").read_bytes() == b"someone's folder"
    assert os.path.islink(moved[1]) and os.readlink(moved[1]) == str(outside)  # moved, never followed
    assert outside.read_bytes() == b"not the archive's"


# ------------------------------------------------------------------------------ deferred hash


def _deferred_put(b: StorageBackend, key: str, data: bytes, expected: str) -> tuple[bool, object]:
    with b.open_write(key) as w:
        deferred = w.defer_hash()
        for i in range(0, len(data), 7):
            w.write(data[i:i + 7])
        return deferred, w.publish(expected)


def test_a_write_with_a_deferred_hash_is_checked_and_published(harness: Harness) -> None:
    b = harness.backend
    data = b"archived bytes\n" * 50
    deferred, r = _deferred_put(b, "raw/a.tar", data, sha(data))
    # disk reads its partial back before publishing; the others hash as they write
    assert deferred is isinstance(innermost(b), DiskBackend)
    assert (r.size, r.sha256, r.already_there, r.read_back) == (len(data), sha(data), False, deferred)
    assert get(b, "raw/a.tar") == data
    # the same bytes again: already there, checked the same way
    assert _deferred_put(b, "raw/a.tar", data, sha(data))[1].already_there is True
    assert harness.count_partials() == 0


def test_a_write_with_a_deferred_hash_and_other_bytes_publishes_nothing(harness: Harness) -> None:
    b = harness.backend
    with pytest.raises(VerificationError, match="nothing published") as ei:
        _deferred_put(b, "k", b"bytes", "0" * 64)
    assert ei.value.path == "k"
    assert b.stat("k") is None and keys(b) == [] and harness.count_partials() == 0


def test_a_hash_cannot_be_deferred_once_bytes_are_written(backend: StorageBackend) -> None:
    with backend.open_write("k") as w:
        w.write(b"x")
        with pytest.raises(RuntimeError, match="after 1 bytes were written"):
            w.defer_hash()


def test_disk_bytes_damaged_after_writing_are_refused_before_they_are_published(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    b = DiskBackend("loc", root)
    data = os.urandom(2 * 1024**2)
    with b.open_write("raw/a.tar") as w:
        assert w.defer_hash() is True
        w.write(data)  # one write larger than the file's buffer: on the medium at once
        with open(w.local_path, "r+b") as f:  # damaged behind the writer's back
            f.write(bytes([data[0] ^ 0xFF]))
        with pytest.raises(VerificationError, match="before publishing, expected .*; nothing published"):
            w.publish(sha(data))
    assert b.stat("raw/a.tar") is None and [p for p in root.rglob("*") if p.is_file()] == []
