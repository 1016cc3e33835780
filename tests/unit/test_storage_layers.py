"""The storage layer stack (packhorse.storage.layers, composed by registry.compose): the one
retry loop, the read rate, the order of the layers, and faults coming in through a layer."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from botocore.exceptions import ClientError

from fault_hooks import FaultPlan
from memory_backend import MemoryBackend
from packhorse.errors import StorageBusyError, StorageServiceError, VerificationError
from packhorse.ratelimit import RateLimiter
from packhorse.storage.layers import Layer, ReadRateLayer, innermost
from packhorse.storage.registry import compose
from packhorse.storage.s3 import S3Backend


def _client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "PutObject")


class StubS3:
    """Just enough of a boto3 client for single PutObject publications: the first ``busy``
    conditional puts answer 409 ConditionalRequestConflict, as AWS does while another
    conditional write of the key is in flight."""

    def __init__(self, busy: int, *, then: Exception | None = None) -> None:
        self.busy = busy
        self.then = then
        self.objects: dict[str, bytes] = {}
        self.puts = 0

    def put_object(self, *, Key: str, Body: bytes, **kw: Any) -> dict[str, Any]:
        self.puts += 1
        if self.busy:
            self.busy -= 1
            raise _client_error("ConditionalRequestConflict", 409)
        if self.then is not None:
            raise self.then
        if Key in self.objects and kw.get("IfNoneMatch") == "*":
            raise _client_error("PreconditionFailed", 412)
        self.objects[Key] = Body
        return {}


def _publish(backend: Any, key: str, data: bytes) -> Any:
    with backend.open_write(key) as w:
        w.write(data)
        return w.publish(hashlib.sha256(data).hexdigest())


def test_a_busy_store_is_retried_by_the_retry_layer_only() -> None:
    raw = S3Backend("cologne-s3", StubS3(busy=1), "bucket")
    with raw.open_write("raw/a.tar") as w:  # the backend itself does not retry ...
        w.write(b"payload")
        with pytest.raises(StorageBusyError, match="'raw/a.tar'"):
            w.publish()
        assert w.publish().already_there is False  # ... and the pending write survived for another try
    pauses: list[float] = []
    client = StubS3(busy=2)
    stack = compose(S3Backend("cologne-s3", client, "bucket"), sleep=pauses.append)
    result = _publish(stack, "raw/b.tar", b"other payload")
    assert not result.already_there and client.objects == {"raw/b.tar": b"other payload"}
    assert client.puts == 3 and pauses == [0.05, 0.1]


def test_the_retry_layer_gives_up_and_never_retries_other_errors() -> None:
    pauses: list[float] = []
    client = StubS3(busy=50)
    stack = compose(S3Backend("cologne-s3", client, "bucket"), retry_attempts=4, sleep=pauses.append)
    with pytest.raises(StorageBusyError):
        _publish(stack, "raw/a.tar", b"x")
    assert client.puts == 4 and len(pauses) == 3
    client = StubS3(busy=0, then=_client_error("AccessDenied", 403))
    stack = compose(S3Backend("cologne-s3", client, "bucket"), sleep=pauses.append)
    with pytest.raises(StorageServiceError, match="AccessDenied"):
        _publish(stack, "raw/a.tar", b"x")
    assert client.puts == 1  # an operation's failure: retried by the lifecycle, with backoff
    with pytest.raises(VerificationError):  # a wrong expected sha256 is never retried either
        with compose(MemoryBackend("m")).open_write("k") as w:
            w.write(b"x")
            w.publish("0" * 64)


def test_layers_are_composed_in_one_order() -> None:
    base = MemoryBackend("lta")
    assert compose(base).layers() == ["LoggingLayer", "RetryLayer", "MemoryBackend"]  # type: ignore[attr-defined]
    fixity = compose(base, hooks=FaultPlan([]), read_bytes_per_second=1024)
    assert isinstance(fixity, Layer) and innermost(fixity) is base
    assert fixity.layers() == ["LoggingLayer", "RetryLayer", "ReadRateLayer", "FaultLayer", "MemoryBackend"]
    assert fixity.location == "lta" and fixity.cold is False


class CountingLimiter(RateLimiter):
    def __init__(self) -> None:
        super().__init__(None)
        self.taken = 0

    def take(self, nbytes: int, on_wait=None) -> None:  # type: ignore[no-untyped-def]
        self.taken += nbytes


def test_every_byte_read_through_the_rate_layer_is_counted() -> None:
    base = MemoryBackend("lta")
    data = bytes(range(256)) * 4096  # 1 MiB
    _publish(base, "raw/a.tar", data)
    limiter = CountingLimiter()
    limited = ReadRateLayer(base, limiter)
    assert limited.sha256("raw/a.tar") == hashlib.sha256(data).hexdigest()
    assert limiter.taken == len(data)
    with limited.open_read("raw/a.tar") as f:
        buf = bytearray(1000)
        assert f.readinto(buf) == 1000  # type: ignore[attr-defined]
    assert limiter.taken == len(data) + 1000


def test_a_corrupt_fault_comes_in_through_the_storage_layer() -> None:
    plan = FaultPlan([{"point": "long_term_archive.published", "action": "corrupt"}])
    base = MemoryBackend("lta")
    stack = compose(base, hooks=plan)
    _publish(stack, "raw/a.tar", b"archived bytes")
    plan.hit("long_term_archive.published")  # what publish_verified hits next
    assert base.open_read("raw/a.tar").read() != b"archived bytes"
    assert stack.sha256("raw/a.tar") != hashlib.sha256(b"archived bytes").hexdigest()
