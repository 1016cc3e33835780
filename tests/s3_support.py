"""A real S3-compatible HTTP server on loopback for the tests: moto's server mode.

:class:`S3Server` starts ``moto`` in a subprocess on a free loopback port and gives clients
and fresh buckets. moto evaluates ``If-None-Match: *`` (PutObject and
CompleteMultipartUpload) as a lookup followed by a store, without a lock, in a threaded
server; AWS S3 makes the condition atomic. The launcher therefore serialises *mutating*
requests (PUT, POST, DELETE) with one lock, so conditional creates are atomic as on S3,
while reads stay concurrent. Nothing in moto's S3 behaviour is replaced.

The AWS credentials the tests use are dummies set in the environment (the standard chain).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from free_ports import free_port

LAUNCHER = Path(__file__).with_name("moto_serialized_server.py")
TEST_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "packhorse-test", "AWS_SECRET_ACCESS_KEY": "packhorse-test-secret",
                    "AWS_DEFAULT_REGION": "us-east-1"}


class S3Server:
    """moto's S3 server on ``127.0.0.1:<free port>``; ``endpoint_url`` for clients."""

    def __init__(self, *, ignore_if_none_match: bool = False, upload_log: str | None = None,
                 real_initiated_times: bool = False) -> None:
        self.port = free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, **TEST_CREDENTIALS}
        # the request log goes to a file: a pipe nobody reads would fill up and block the server
        self.log = tempfile.NamedTemporaryFile(prefix="moto-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([sys.executable, str(LAUNCHER), str(self.port),
                                      *(["--ignore-if-none-match"] if ignore_if_none_match else []),
                                      *(["--upload-log", upload_log] if upload_log else []),
                                      *(["--real-initiated-times"] if real_initiated_times else [])], env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited: {Path(self.log.name).read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("moto server did not start within 60 s") from None
                time.sleep(0.1)

    def client(self) -> Any:
        """A plain boto3 client (for test hooks that go behind packhorse's back)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name="us-east-1",
                            aws_access_key_id=TEST_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=TEST_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])

    def new_bucket(self, *, object_lock: bool = False) -> str:
        """Create a uniquely named bucket; returns its name."""
        name = f"ph-{uuid.uuid4().hex[:20]}"
        self.client().create_bucket(Bucket=name, ObjectLockEnabledForBucket=object_lock)
        return name

    def stop(self) -> None:
        """Stop the server (only the process this object started)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)


def start_or_skip(**kwargs: Any) -> S3Server:
    """Start a server; skip the test if moto is not installed (fail under ``CI=true``)."""
    try:
        import boto3  # noqa: F401
        import moto.server  # noqa: F401
    except ImportError as e:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"moto[server] is not installed: {e}")
    for k, v in TEST_CREDENTIALS.items():
        os.environ.setdefault(k, v)
    return S3Server(**kwargs)


def s3_location(name: str, server: S3Server, bucket: str, *, site: str = "cologne",
                role: str = "long_term_archive", **extra: Any) -> str:
    """A ``[[locations]]`` TOML table for an S3 location on ``server``."""
    lines = ["[[locations]]", f'name = "{name}"', f'site = "{site}"', f'role = "{role}"', 'storage = "s3"',
             f'bucket = "{bucket}"', f'endpoint_url = "{server.endpoint_url}"', 'region = "us-east-1"',
             "path_style = true"]
    for k, v in extra.items():
        lines.append(f"{k} = {v!r}" if not isinstance(v, bool) else f"{k} = {str(v).lower()}")
    return "\n".join(lines) + "\n"


def s3_site_config(folder: Path, server: S3Server, *, s3_extra: dict[str, Any] | None = None,
                   **overrides: Any) -> tuple[Path, str]:
    """The three-site test configuration with ``cologne-lta`` in a fresh bucket on ``server``
    (``cornell-lta`` stays on disk). Returns ``(config path, bucket)``."""
    from support import write_site_config

    path = write_site_config(folder, **overrides)
    bucket = server.new_bucket()
    text = path.read_text(encoding="utf-8")
    disk_block = ('[[locations]]\nname = "cologne-lta"\nsite = "cologne"\nrole = "long_term_archive"\n'
                  'path = "sites/cologne/archive"\n')
    assert disk_block in text
    text = text.replace(disk_block, s3_location("cologne-lta", server, bucket, prefix="lta",
                                                **(s3_extra or {})))
    path.write_text(text, encoding="utf-8")
    return path, bucket


def bucket_objects(server: S3Server, bucket: str) -> dict[str, bytes]:
    """Every object in ``bucket``: ``{key: bytes}``, the locations' identity markers
    (``<prefix>_packhorse/location.json``, written by ``packhorse init``) left out."""
    c = server.client()
    out = {}
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for o in page.get("Contents", []):
            if o["Key"].endswith("_packhorse/location.json"):
                continue
            out[o["Key"]] = c.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
    return out
