"""Azure Blob Storage for the tests: Microsoft's emulator Azurite (npm ``azurite``), on loopback.

One ``azurite-blob`` per test run, shared by the pytest-xdist workers (:mod:`shared_service`),
on a free port bound to 127.0.0.1, its data in the run's temporary folder, started with
``--skipApiVersionCheck`` (current SDKs speak newer API versions than Azurite knows) and
``--disableTelemetry``. The account is Azurite's well-known development account; its
connection string is public (Azurite's documentation) and reaches only this process.

Seen on Azurite (docs/object-storage.md): conditional creates answer 409 BlobAlreadyExists,
the Archive tier is settable and a read of an archived blob answers 409 BlobArchived, a copy
out of Archive (a rehydration) completes at once, and immutability policies and legal holds
answer 501 Not Implemented.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from azure.storage.blob import BlobServiceClient, ContainerClient, StandardBlobTier

from free_ports import free_port
from shared_service import SharedService, start_with_retries, wait_until

ACCOUNT = "devstoreaccount1"
#: Azurite's fixed, published development key (not a secret)
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def azurite_binary() -> str | None:
    """The ``azurite-blob`` program (``npm install -g azurite``), or ``None``."""
    return shutil.which("azurite-blob")


def start_azurite(data: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Start ``azurite-blob`` over ``data`` and wait until it answers. Returns the process and
    ``{"account_url": ..., "connection_string": ...}``."""
    program = azurite_binary()
    if program is None:
        raise RuntimeError("azurite is not installed (npm install -g azurite)")
    port = free_port()
    log = data / "azurite.log"
    with open(log, "wb") as out:  # a retry (start_with_retries) reads only its own attempt
        proc = subprocess.Popen([program, "--skipApiVersionCheck", "--disableTelemetry", "--silent",
                                 "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(data)],
                                stdout=out, stderr=subprocess.STDOUT, cwd=data, start_new_session=True)
    account_url = f"http://127.0.0.1:{port}/{ACCOUNT}"
    info = {"account_url": account_url,
            "connection_string": f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
                                 f"BlobEndpoint={account_url};"}
    service = BlobServiceClient.from_connection_string(info["connection_string"])

    def ready() -> bool:
        service.get_service_properties()
        return True

    wait_until(ready, proc=proc, log=log, what="Azurite (azurite-blob)", timeout=60)
    return proc, info


class AzuriteServer:
    """The run's Azurite blob endpoint: ``account_url``, ``connection_string``."""

    def __init__(self, account_url: str, connection_string: str) -> None:
        self.account_url = account_url
        self.connection_string = connection_string

    def service(self) -> BlobServiceClient:
        """A plain client of the account (for tests that go behind packhorse's back)."""
        return BlobServiceClient.from_connection_string(self.connection_string)

    def container(self, name: str) -> ContainerClient:
        """A plain client of container ``name``."""
        return ContainerClient.from_connection_string(self.connection_string, name)

    def new_container(self) -> str:
        """Create a uniquely named container; returns its name."""
        name = f"ph-{uuid.uuid4().hex[:20]}"
        self.service().create_container(name)
        return name

    def blobs(self, container: str) -> dict[str, bytes]:
        """Every blob of ``container`` (archived ones rehydrated by a copy first, which Azurite
        completes at once): ``{name: bytes}``, the identity markers and packhorse's own
        ``_packhorse/`` blobs left out."""
        c = self.container(container)
        out = {}
        for b in c.list_blobs():
            if "_packhorse/" in b.name:
                continue
            out[b.name] = read_blob(c, b.name)
        return out


def read_blob(c: ContainerClient, name: str) -> bytes:
    """The bytes of blob ``name``, read through a temporary online copy if it is archived."""
    blob = c.get_blob_client(name)
    if str(blob.get_blob_properties().blob_tier) != "Archive":
        return bytes(blob.download_blob().readall())
    tmp = c.get_blob_client(f"_test-read/{uuid.uuid4().hex}")
    tmp.start_copy_from_url(blob.url, standard_blob_tier=StandardBlobTier.HOT, rehydrate_priority="High")
    try:
        return bytes(tmp.download_blob().readall())
    finally:
        tmp.delete_blob()


def flip_first_byte(c: ContainerClient, name: str) -> bytes:
    """Damage blob ``name`` behind packhorse's back (its first byte flipped, metadata and tier
    kept: an overwrite no packhorse code would make; an archived blob is rehydrated in place,
    which Azurite does at once, and archived again). Returns the good bytes."""
    blob = c.get_blob_client(name)
    props = blob.get_blob_properties()
    good = read_blob(c, name)
    bad = bytes([good[0] ^ 0xFF]) + good[1:]
    if str(props.blob_tier) == "Archive":  # an archived blob refuses writes (409 BlobArchived)
        blob.set_standard_blob_tier(StandardBlobTier.HOT)  # Azurite rehydrates at once
    blob.upload_blob(bad, overwrite=True, metadata=props.metadata)
    if str(props.blob_tier) == "Archive":
        blob.set_standard_blob_tier(StandardBlobTier.ARCHIVE)
    return good


def shared_azurite(folder: Path) -> SharedService:
    """The run's shared Azurite service (skips the test if Azurite is not installed, fails
    under ``CI=true``)."""
    if azurite_binary() is None:
        if os.environ.get("CI") == "true":
            raise RuntimeError("azurite is not installed (npm install -g azurite)")
        pytest.skip("Azurite (npm install -g azurite) is not installed")
    return SharedService("azurite", folder, start_with_retries(start_azurite))


def azure_location(name: str, server: AzuriteServer, container: str, *, site: str = "cologne",
                   role: str = "long_term_archive", **extra: Any) -> str:
    """A ``[[locations]]`` TOML table for an Azure location on ``server`` (credentials from
    ``AZURE_STORAGE_CONNECTION_STRING``, which the caller sets)."""
    lines = ["[[locations]]", f'name = "{name}"', f'site = "{site}"', f'role = "{role}"', 'storage = "azure"',
             f'account_url = "{server.account_url}"', f'container = "{container}"']
    for k, v in extra.items():
        lines.append(f"{k} = {v!r}" if not isinstance(v, bool) else f"{k} = {str(v).lower()}")
    return "\n".join(lines) + "\n"
