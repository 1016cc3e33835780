"""The S3 backend against moto's S3 server over HTTP: what the generic conformance suite cannot
see from the interface: multipart uploads and their abort, the checksum and metadata
sent with each object, the write-once probe, Object Lock, and the wiring in the registry."""

from __future__ import annotations

import base64
import hashlib
import os

import pytest

from packhorse.config import settings_from_dict
from packhorse.errors import ConfigError, DestinationConflictError
from packhorse.storage.layers import innermost
from packhorse.storage.registry import backend_for
from packhorse.storage.s3 import MIN_PART_BYTES, S3Backend, make_client
from s3_support import start_or_skip


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def backend(server, bucket: str, **kw) -> S3Backend:  # type: ignore[no-untyped-def]
    client = make_client(endpoint_url=server.endpoint_url, region="us-east-1", path_style=True)
    kw.setdefault("multipart_threshold_bytes", MIN_PART_BYTES)
    kw.setdefault("multipart_part_bytes", MIN_PART_BYTES)
    return S3Backend("arch", client, bucket, "lta", **kw)


def put(b: S3Backend, key: str, data: bytes):  # type: ignore[no-untyped-def]
    with b.open_write(key) as w:
        for i in range(0, len(data), 1 << 20):
            w.write(data[i:i + (1 << 20)])
        return w.publish(sha(data))


BIG = os.urandom(MIN_PART_BYTES * 2 + 12345)  # three parts


def test_multipart_object_round_trips_with_sha256_metadata_and_part_checksums(s3_server) -> None:
    bucket = s3_server.new_bucket()
    b = backend(s3_server, bucket)
    r = put(b, "raw/big.tar", BIG)
    assert (r.size, r.sha256, r.already_there) == (len(BIG), sha(BIG), False)
    assert b.sha256("raw/big.tar") == sha(BIG)
    raw = s3_server.client()
    head = raw.head_object(Bucket=bucket, Key="lta/raw/big.tar", ChecksumMode="ENABLED")
    assert head["Metadata"]["sha256"] == sha(BIG)
    assert head["ContentLength"] == len(BIG)
    # a multipart ETag is not the MD5 of the content: packhorse never compares with it
    assert head["ETag"].strip('"').endswith("-3")
    assert b.incomplete_uploads() == []
    # publishing again: already there (decided by reading back), and a different object conflicts
    assert put(b, "raw/big.tar", BIG).already_there is True
    with pytest.raises(DestinationConflictError):
        put(b, "raw/big.tar", BIG[:-1] + b"!")
    assert b.sha256("raw/big.tar") == sha(BIG) and b.incomplete_uploads() == []


def test_single_put_sends_the_sha256_as_s3_checksum(s3_server) -> None:
    bucket = s3_server.new_bucket()
    b = backend(s3_server, bucket)
    put(b, "small", b"small object")
    head = s3_server.client().head_object(Bucket=bucket, Key="lta/small", ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] == base64.b64encode(hashlib.sha256(b"small object").digest()).decode()
    assert head["Metadata"]["sha256"] == sha(b"small object")


def _count_parts(monkeypatch, b: S3Backend, fail_at: int | None = None,  # type: ignore[no-untyped-def]
                 exc: BaseException | None = None) -> list[int]:
    real = b.client.upload_part
    calls: list[int] = []

    def upload_part(**kw):  # type: ignore[no-untyped-def]
        calls.append(kw["PartNumber"])
        if kw["PartNumber"] == fail_at:
            raise exc  # type: ignore[misc]
        return real(**kw)

    monkeypatch.setattr(b.client, "upload_part", upload_part)
    return calls


def test_a_failed_multipart_upload_is_kept_and_the_retry_sends_only_the_missing_parts(s3_server,
                                                                                      monkeypatch) -> None:
    bucket = s3_server.new_bucket()
    b = backend(s3_server, bucket)
    calls = _count_parts(monkeypatch, b, fail_at=2, exc=ConnectionError("network gone"))
    with pytest.raises(Exception, match="network gone"):
        put(b, "raw/big.tar", BIG)
    assert calls == [1, 2]
    assert b.stat("raw/big.tar") is None and list(b.list()) == []  # nothing visible under the key
    assert len(b.incomplete_uploads()) == 1  # kept for the retry
    monkeypatch.undo()
    calls = _count_parts(monkeypatch, b)
    sent_before = b.bytes_uploaded
    assert put(b, "raw/big.tar", BIG).already_there is False
    assert calls == [2, 3]  # part 1 was there and verified
    assert b.bytes_uploaded - sent_before == len(BIG) - MIN_PART_BYTES
    assert b.sha256("raw/big.tar") == sha(BIG) and b.incomplete_uploads() == []


def test_a_crash_mid_multipart_upload_is_resumed_by_the_next_publication(s3_server, monkeypatch) -> None:
    bucket = s3_server.new_bucket()
    b = backend(s3_server, bucket)
    _count_parts(monkeypatch, b, fail_at=3, exc=SystemExit("process killed"))
    monkeypatch.setattr(b, "_abort_upload", lambda *a: None)  # a killed process aborts nothing
    with pytest.raises(SystemExit):
        put(b, "raw/big.tar", BIG)
    monkeypatch.undo()
    assert len(b.incomplete_uploads()) == 1
    assert b.stat("raw/big.tar") is None and list(b.list()) == []
    fresh = backend(s3_server, bucket)  # the retry runs in another process
    calls = _count_parts(monkeypatch, fresh)
    assert put(fresh, "raw/big.tar", BIG).already_there is False
    assert calls == [3] and fresh.bytes_uploaded == len(BIG) - 2 * MIN_PART_BYTES
    assert fresh.incomplete_uploads() == [] and fresh.cleanup_partials(0) == 0
    assert fresh.sha256("raw/big.tar") == sha(BIG)


def test_a_crash_before_the_first_part_leaves_an_empty_upload_the_next_publication_continues(s3_server,
                                                                                             monkeypatch) -> None:
    # the S3 counterpart of an empty partial file: killed between CreateMultipartUpload and
    # the first UploadPart, the upload holds no part; the retry continues it in one attempt
    bucket = s3_server.new_bucket()
    b = backend(s3_server, bucket)
    _count_parts(monkeypatch, b, fail_at=1, exc=SystemExit("process killed"))
    monkeypatch.setattr(b, "_abort_upload", lambda *a: None)  # a killed process aborts nothing
    with pytest.raises(SystemExit):
        put(b, "raw/big.tar", BIG)
    monkeypatch.undo()
    assert len(b.incomplete_uploads()) == 1 and b.stat("raw/big.tar") is None
    fresh = backend(s3_server, bucket)
    calls = _count_parts(monkeypatch, fresh)
    assert put(fresh, "raw/big.tar", BIG).already_there is False
    assert calls == [1, 2, 3] and fresh.bytes_uploaded == len(BIG)
    assert fresh.incomplete_uploads() == [] and fresh.sha256("raw/big.tar") == sha(BIG)


def test_a_part_that_does_not_verify_is_uploaded_again(s3_server, monkeypatch) -> None:
    bucket = s3_server.new_bucket()
    b = backend(s3_server, bucket)
    raw = s3_server.client()
    # an earlier writer's upload of the key: part 1 of other bytes (same size), part 2 right
    up = raw.create_multipart_upload(Bucket=bucket, Key="lta/raw/big.tar", ChecksumAlgorithm="SHA256")
    for number, data in ((1, os.urandom(MIN_PART_BYTES)), (2, BIG[MIN_PART_BYTES:2 * MIN_PART_BYTES])):
        raw.upload_part(Bucket=bucket, Key="lta/raw/big.tar", UploadId=up["UploadId"], PartNumber=number, Body=data,
                        ChecksumAlgorithm="SHA256",
                        ChecksumSHA256=base64.b64encode(hashlib.sha256(data).digest()).decode())
    calls = _count_parts(monkeypatch, b)
    assert put(b, "raw/big.tar", BIG).already_there is False
    assert calls == [1, 3]
    assert b.sha256("raw/big.tar") == sha(BIG) and b.incomplete_uploads() == []


@pytest.mark.parametrize("order", [(2, 1), (1, 2)], ids=["fuller-first", "fuller-last"])
def test_of_two_interrupted_uploads_the_fuller_one_is_continued_and_the_other_aborted(s3_server, monkeypatch,
                                                                                       order) -> None:
    bucket = s3_server.new_bucket()
    b = backend(s3_server, bucket)
    raw = s3_server.client()
    full = "lta/raw/big.tar"

    def leave_upload(parts: int) -> str:  # what an attempt killed after ``parts`` parts leaves
        up = raw.create_multipart_upload(Bucket=bucket, Key=full, ChecksumAlgorithm="SHA256")
        for number in range(1, parts + 1):
            data = BIG[(number - 1) * MIN_PART_BYTES:number * MIN_PART_BYTES]
            raw.upload_part(Bucket=bucket, Key=full, UploadId=up["UploadId"], PartNumber=number, Body=data,
                            ChecksumAlgorithm="SHA256",
                            ChecksumSHA256=base64.b64encode(hashlib.sha256(data).digest()).decode())
        return up["UploadId"]

    for parts in order:  # two attempts of the same operation, killed after 2 and after 1 part
        leave_upload(parts)
    calls = _count_parts(monkeypatch, b)
    assert put(b, "raw/big.tar", BIG).already_there is False
    assert calls == [3]  # the upload holding parts 1 and 2 was continued
    assert b.incomplete_uploads() == []  # the other one is aborted once the object is published
    assert b.sha256("raw/big.tar") == sha(BIG)


def test_part_matching_needs_size_and_a_digest_of_the_bytes() -> None:
    from packhorse.storage.s3 import _b64_sha256, _part_matches

    data = b"x" * 100
    checksum = _b64_sha256(hashlib.sha256(data).digest())
    md5 = hashlib.md5(data).hexdigest()
    assert _part_matches({"Size": 100, "ETag": f'"{md5}"', "ChecksumSHA256": checksum}, data, checksum)
    assert _part_matches({"Size": 100, "ETag": f'"{md5}"'}, data, checksum)  # no checksum: the MD5 ETag decides
    assert _part_matches({"Size": 100, "ETag": '"kms-opaque"', "ChecksumSHA256": checksum}, data, checksum)
    assert not _part_matches({"Size": 100, "ETag": '"kms-opaque"'}, data, checksum)  # nothing to prove it
    assert not _part_matches({"Size": 99, "ETag": f'"{md5}"', "ChecksumSHA256": checksum}, data, checksum)
    assert not _part_matches({"Size": 100, "ETag": '"' + "0" * 32 + '"', "ChecksumSHA256": checksum}, data, checksum)
    assert not _part_matches({"Size": 100, "ETag": f'"{md5}"', "ChecksumSHA256": "other"}, data, checksum)


def test_probe_key_is_removed_and_never_listed(s3_server) -> None:
    bucket = s3_server.new_bucket()
    b = backend(s3_server, bucket)
    assert b.probe_write_once() is True
    raw = s3_server.client()
    assert raw.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0


def _settings(tmp_path, location_toml: str):  # type: ignore[no-untyped-def]
    import tomllib

    base = f"""
[[sites]]
name = "cologne"
[[locations]]
name = "cologne-buffer"
site = "cologne"
role = "buffer"
path = "{tmp_path / 'buffer'}"
{location_toml}
"""
    return settings_from_dict(tomllib.loads(base), base_dir=tmp_path, environ={})


def test_registry_builds_s3_backend_after_probe(s3_server, tmp_path) -> None:
    from s3_support import s3_location

    bucket = s3_server.new_bucket()
    s = _settings(tmp_path, s3_location("cologne-s3", s3_server, bucket, prefix="archive"))
    b = backend_for(s, "cologne-s3")
    assert isinstance(innermost(b), S3Backend) and b.prefix == "archive/" and b.conditional_writes
    put(b, "x", b"x")  # type: ignore[arg-type]
    assert [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket)["Contents"]] == ["archive/x"]


def test_store_ignoring_if_none_match_is_refused_naming_the_location(tmp_path) -> None:
    from s3_support import s3_location

    server = start_or_skip(ignore_if_none_match=True)
    try:
        bucket = server.new_bucket()
        s = _settings(tmp_path, s3_location("cologne-s3", server, bucket))
        with pytest.raises(ConfigError, match="'cologne-s3'.*ignores If-None-Match"):
            backend_for(s, "cologne-s3")
        assert server.client().list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0  # probe removed
        # opting out explicitly: per-object leases and a check before writing
        from packhorse.db.session import Database

        db = Database(f"sqlite:///{tmp_path / 'ops.db'}")
        db.upgrade()
        s2 = _settings(tmp_path, s3_location("cologne-s3", server, bucket, write_once_probe=False))
        b = backend_for(s2, "cologne-s3", db=db)
        assert isinstance(innermost(b), S3Backend) and not b.conditional_writes
        put(b, "k", b"first")  # type: ignore[arg-type]
        with pytest.raises(DestinationConflictError):
            put(b, "k", b"other")  # type: ignore[arg-type]
        assert b.sha256("k") == sha(b"first")
        with pytest.raises(ConfigError, match="needs the ops database"):
            backend_for(s2, "cologne-s3")
    finally:
        server.stop()


def test_object_lock_retention_is_applied(s3_server, tmp_path) -> None:
    from s3_support import s3_location

    bucket = s3_server.new_bucket(object_lock=True)
    s = _settings(tmp_path, s3_location("cologne-s3", s3_server, bucket, object_lock_mode="GOVERNANCE",
                                        object_lock_retain_days=30))
    b = backend_for(s, "cologne-s3")
    assert isinstance(innermost(b), S3Backend)
    put(b, "raw/a.tar", b"locked bytes")
    put(b, "raw/big.tar", BIG)
    for key in ("raw/a.tar", "raw/big.tar"):
        ret = b.retention(key)
        assert ret is not None and ret[0] == "GOVERNANCE"
        import datetime as dt

        days = (ret[1] - dt.datetime.now(dt.UTC)).total_seconds() / 86400
        assert 29.9 < days <= 30.0


def test_object_lock_on_bucket_without_it_is_refused(s3_server, tmp_path) -> None:
    from s3_support import s3_location

    bucket = s3_server.new_bucket(object_lock=False)
    s = _settings(tmp_path, s3_location("cologne-s3", s3_server, bucket, object_lock_mode="COMPLIANCE",
                                        object_lock_retain_days=3650))
    with pytest.raises(ConfigError, match=f"'cologne-s3'.*{bucket}.*does not have S3 Object Lock enabled"):
        backend_for(s, "cologne-s3")


def test_s3_config_errors_name_the_key(tmp_path) -> None:
    with pytest.raises(ConfigError, match="storage 's3' but no 'bucket'"):
        _settings(tmp_path, '[[locations]]\nname = "x"\nsite = "cologne"\nrole = "long_term_archive"\nstorage = "s3"\n')
    with pytest.raises(ConfigError, match="object_lock_mode and object_lock_retain_days go together"):
        _settings(tmp_path, '[[locations]]\nname = "x"\nsite = "cologne"\nrole = "long_term_archive"\n'
                            'storage = "s3"\nbucket = "abc"\nobject_lock_mode = "GOVERNANCE"\n')
    with pytest.raises(ConfigError, match="overlaps location 'a'"):
        _settings(tmp_path, '[[locations]]\nname = "a"\nsite = "cologne"\nrole = "long_term_archive"\n'
                            'storage = "s3"\nbucket = "abc"\nprefix = "x"\n'
                            '[[locations]]\nname = "b"\nsite = "cologne"\nrole = "long_term_archive"\n'
                            'storage = "s3"\nbucket = "abc"\nprefix = "x/y"\n')
