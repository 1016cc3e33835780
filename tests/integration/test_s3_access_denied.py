"""An object store that refuses writes (``AccessDenied``: a bucket policy or a credential changed)
is a storage fault of the data location, as a read-only disk is: against moto's S3 server over
HTTP, with the store's own 403 answer (a botocore ``before-send`` handler answers it for the
write requests while the "policy" is on, as a real store does; moto enforces no bucket policy).
A publication fails and names ``AccessDenied``, the location's write probe reports it
unavailable with that fault and writes nothing, and once writes are allowed again the probe
passes, leaves no object behind, and the same publication succeeds.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse

from packhorse.errors import StorageServiceError
from packhorse.storage.faults import fault_of
from packhorse.storage.s3 import MIN_PART_BYTES, S3Backend, make_client

WRITES = ("PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload", "DeleteObject",
          "DeleteObjects", "CopyObject")
DENIED = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
          b"<Message>Access Denied</Message></Error>")


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any):  # type: ignore[no-untyped-def]
        yield self._body


def _backend(server: Any, bucket: str, policy: dict[str, bool]) -> S3Backend:
    client = make_client(endpoint_url=server.endpoint_url, region="us-east-1", path_style=True)

    def deny(request: Any, event_name: str, **_: Any) -> AWSResponse | None:
        if policy["deny_writes"] and event_name.rsplit(".", 1)[-1] in WRITES:
            return AWSResponse(request.url, 403, {"Content-Type": "application/xml"}, _Raw(DENIED))
        return None

    client.meta.events.register("before-send.s3.*", deny)
    return S3Backend("cologne-lta", client, bucket, "lta", multipart_threshold_bytes=MIN_PART_BYTES,
                     multipart_part_bytes=MIN_PART_BYTES)


def _put(b: S3Backend, key: str, data: bytes) -> Any:
    with b.open_write(key) as w:
        w.write(data)
        return w.publish(hashlib.sha256(data).hexdigest())


def test_access_denied_on_write_is_a_fault_of_the_location_and_clears_when_writes_are_allowed(s3_server) -> None:
    bucket = s3_server.new_bucket()
    policy = {"deny_writes": False}
    b = _backend(s3_server, bucket, policy)
    assert b.write_fault() is None

    policy["deny_writes"] = True
    with pytest.raises(StorageServiceError) as caught:
        _put(b, "raw/obs1.tar", b"x" * 1000)
    assert caught.value.code == "AccessDenied" and "AccessDenied" in str(caught.value)
    assert fault_of(caught.value) == ("AccessDenied", "the object store answered AccessDenied")
    err = b.write_fault()
    assert err is not None and err.fault == "AccessDenied" and err.location == "cologne-lta"
    assert f"writing in bucket {bucket!r} fails" in err.reason and not err.marker_only
    raw = s3_server.client()
    assert raw.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0  # nothing written

    policy["deny_writes"] = False
    assert b.write_fault() is None
    assert raw.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0  # the probe object is gone
    r = _put(b, "raw/obs1.tar", b"x" * 1000)
    assert not r.already_there
    assert raw.get_object(Bucket=bucket, Key="lta/raw/obs1.tar")["Body"].read() == b"x" * 1000
