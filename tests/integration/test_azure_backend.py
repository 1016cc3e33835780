"""The Azure Blob backend against Azurite: what the conformance suite cannot see from the
interface: the Archive tier as cold storage (rehydration by copy), resumed block uploads, the
sha256 in the blob metadata, the immutability probe (Azurite answers 501), credentials, and
the wiring in the registry."""

from __future__ import annotations

import hashlib
import os
import tomllib

import pytest
from azure.core.exceptions import ServiceRequestError

from azurite_support import ACCOUNT_KEY, azure_location, flip_first_byte
from packhorse.config import settings_from_dict
from packhorse.errors import (
    ConfigError,
    DestinationConflictError,
    OperationDeferred,
    RestoreRequiredError,
    StorageServiceError,
)
from packhorse.stages.base import already_there
from packhorse.storage.azure import REHYDRATED_PREFIX, AzureBackend, make_container_client
from packhorse.storage.layers import innermost
from packhorse.storage.registry import backend_for

MIB = 1024**2
BIG = os.urandom(3 * MIB + 4321)  # four blocks of 1 MiB


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def backend(server, container: str, **kw) -> AzureBackend:  # type: ignore[no-untyped-def]
    client = make_container_client(account_url=server.account_url, container=container,
                                   connection_string=server.connection_string, location="arch")
    kw.setdefault("block_threshold_bytes", MIB)
    kw.setdefault("block_bytes", MIB)
    return AzureBackend("arch", client, "lta", **kw)


def put(b: AzureBackend, key: str, data: bytes):  # type: ignore[no-untyped-def]
    with b.open_write(key) as w:
        for i in range(0, len(data), MIB):
            w.write(data[i:i + MIB])
        return w.publish(sha(data))


def test_a_cold_location_archives_every_blob_and_reads_it_only_after_a_rehydration(azurite) -> None:
    container = azurite.new_container()
    raw = azurite.container(container)
    b = backend(azurite, container, cold=True)
    r = put(b, "raw/inst/obs.tar", BIG)
    # read back in the hot tier before it moved: the caller need not (and could not) read it again
    assert (r.already_there, r.read_back, r.sha256) == (False, True, sha(BIG))
    props = raw.get_blob_client("lta/raw/inst/obs.tar").get_blob_properties()
    assert str(props.blob_tier) == "Archive" and props.metadata["sha256"] == sha(BIG)
    assert b.stat("raw/inst/obs.tar").size == len(BIG)  # listed and stat-able
    assert not b.restore_ready("raw/inst/obs.tar")
    with pytest.raises(RestoreRequiredError, match="'raw/inst/obs.tar' is in the Archive tier"):
        b.open_read("raw/inst/obs.tar")
    b.request_restore("raw/inst/obs.tar")
    b.request_restore("raw/inst/obs.tar")  # idempotent
    assert b.restore_ready("raw/inst/obs.tar")  # Azurite completes a rehydration at once
    assert b.sha256("raw/inst/obs.tar") == sha(BIG)
    # the original stays in Archive; the readable copy is packhorse's own, never listed
    assert str(raw.get_blob_client("lta/raw/inst/obs.tar").get_blob_properties().blob_tier) == "Archive"
    rehydrated = raw.get_blob_client(f"lta/{REHYDRATED_PREFIX}raw/inst/obs.tar").get_blob_properties()
    assert str(rehydrated.blob_tier) == "Hot"
    assert [o.key for o in b.list()] == ["raw/inst/obs.tar"]
    # the blob damaged behind packhorse's back: the old rehydrated copy is not of it any more
    flip_first_byte(raw, "lta/raw/inst/obs.tar")
    assert not b.restore_ready("raw/inst/obs.tar")
    b.request_restore("raw/inst/obs.tar")
    assert b.restore_ready("raw/inst/obs.tar") and b.sha256("raw/inst/obs.tar") != sha(BIG)
    # the same bytes again: a conflict, decided by reading the archived blob back
    with pytest.raises(DestinationConflictError):
        put(b, "raw/inst/obs.tar", BIG)
    # publishing onto an archived blob not rehydrated: the operation waits for the rehydration,
    # then decides "already there" by reading it back
    put(b, "raw/inst/other.tar", b"other bytes")
    with pytest.raises(OperationDeferred, match="not restored; restore requested"):
        put(b, "raw/inst/other.tar", b"other bytes")
    assert put(b, "raw/inst/other.tar", b"other bytes").already_there is True  # Azurite: at once
    # the identity marker and other packhorse keys stay online
    put(b, "_packhorse/location.json", b"{}")
    assert b.access_tier("_packhorse/location.json") != "Archive"
    # moved aside (a rehydrating copy), the key is free for the repair, which is archived again
    aside = b.quarantine("raw/inst/obs.tar")
    assert aside is not None and b.stat("raw/inst/obs.tar") is None
    assert put(b, "raw/inst/obs.tar", BIG).already_there is False
    assert b.access_tier("raw/inst/obs.tar") == "Archive"


def test_an_interrupted_block_upload_is_resumed_sending_only_the_missing_blocks(azurite, monkeypatch) -> None:
    container = azurite.new_container()
    b = backend(azurite, container)
    blob_type = type(b.client.get_blob_client("x"))
    real_stage = blob_type.stage_block
    staged: list[str] = []

    def flaky(self, block_id, data, **kw):  # type: ignore[no-untyped-def]
        if len(staged) == 2:
            raise ServiceRequestError("connection reset")
        staged.append(block_id)
        return real_stage(self, block_id, data, **kw)

    monkeypatch.setattr(blob_type, "stage_block", flaky)
    with pytest.raises(StorageServiceError, match="publishing 'raw/big.tar'"):
        put(b, "raw/big.tar", BIG)
    monkeypatch.setattr(blob_type, "stage_block", real_stage)
    assert b.stat("raw/big.tar") is None and [o.key for o in b.list()] == []  # nothing visible
    assert [name for name, _ in b.uncommitted_blobs()] == ["lta/raw/big.tar"]  # a partial, for the retry
    fresh = backend(azurite, container)  # the retry runs in another process
    assert put(fresh, "raw/big.tar", BIG).already_there is False
    assert fresh.bytes_uploaded == len(BIG) - 2 * MIB  # the two staged blocks were not sent again
    assert fresh.sha256("raw/big.tar") == sha(BIG) and fresh.uncommitted_blobs() == []


def test_a_partial_of_a_blob_never_committed_is_swept_when_old(azurite) -> None:
    container = azurite.new_container()
    b = backend(azurite, container)
    b.client.get_blob_client("lta/raw/left.tar").stage_block("000000-x", b"crashed publisher")
    assert b.cleanup_partials(3600) == 0 and len(b.uncommitted_blobs()) == 1
    assert b.cleanup_partials(0) == 1 and b.uncommitted_blobs() == []


def test_immutability_asked_for_on_azurite_is_refused_naming_the_location(azurite) -> None:
    container = azurite.new_container()
    b = backend(azurite, container, immutability_mode="GOVERNANCE", immutability_days=30)
    with pytest.raises(ConfigError, match=f"'arch'.*{container}.*refuses blob immutability policies.*501"):
        b.check_immutability()
    assert [x.name for x in azurite.container(container).list_blobs()] == []  # the probe is gone


def _settings(tmp_path, location_toml: str):  # type: ignore[no-untyped-def]
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


def test_registry_builds_an_azure_backend_with_credentials_from_the_environment(azurite, tmp_path,
                                                                              monkeypatch) -> None:
    container = azurite.new_container()
    s = _settings(tmp_path, azure_location("cologne-az", azurite, container, prefix="archive"))
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    with pytest.raises(ConfigError, match="'cologne-az'.*no credentials.*AZURE_STORAGE_CONNECTION_STRING"):
        backend_for(s, "cologne-az")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    b = backend_for(s, "cologne-az")
    assert isinstance(innermost(b), AzureBackend) and innermost(b).prefix == "archive/"
    put(b, "raw/x.tar", b"x")  # type: ignore[arg-type]
    assert [x.name for x in azurite.container(container).list_blobs()] == ["archive/raw/x.tar"]  # probe removed


def test_a_connection_string_in_the_config_is_never_printed(azurite, tmp_path) -> None:
    container = azurite.new_container()
    other = azurite.connection_string.replace("127.0.0.1", "localhost")
    s = _settings(tmp_path, azure_location("cologne-az", azurite, container, connection_string=other))
    assert ACCOUNT_KEY not in repr(s.location("cologne-az")) and ACCOUNT_KEY not in str(s.model_dump())
    with pytest.raises(ConfigError) as e:  # another account than account_url says
        backend_for(s, "cologne-az")
    assert "is not the account of the connection string" in str(e.value) and ACCOUNT_KEY not in str(e.value)


def test_azure_config_errors_name_the_key(tmp_path) -> None:
    loc = '[[locations]]\nname = "x"\nsite = "cologne"\nrole = "long_term_archive"\n'
    with pytest.raises(ConfigError, match="storage 'azure' but no 'account_url' and 'container'"):
        _settings(tmp_path, loc + 'storage = "azure"\naccount_url = "https://a.blob.core.windows.net"\n')
    with pytest.raises(ConfigError, match="bucket do not apply to storage 'azure'"):
        _settings(tmp_path, loc + 'storage = "azure"\naccount_url = "https://a"\ncontainer = "abc"\nbucket = "abc"\n')
    with pytest.raises(ConfigError, match="container only apply to storage 'azure'"):
        _settings(tmp_path, loc + 'storage = "s3"\nbucket = "abc"\ncontainer = "abc"\n')
    two = (loc + 'storage = "azure"\naccount_url = "https://a"\ncontainer = "abc"\nprefix = "lta"\n').replace('"x"', '"y"')
    with pytest.raises(ConfigError, match="'lta/more' in container 'abc' \\(location 'x'\\) overlaps location 'y'"):
        _settings(tmp_path, two + loc + 'storage = "azure"\naccount_url = "https://a"\ncontainer = "abc"\n'
                                        'prefix = "lta/more"\n')



def _cold_stack(azurite, tmp_path, container: str, **extra):  # type: ignore[no-untyped-def]
    """The composed stack of a cold Azure location (as workers build it) and its bare backend."""
    s = _settings(tmp_path, azure_location("cologne-az", azurite, container, prefix="lta", cold=True,
                                           connection_string=azurite.connection_string, **extra))
    stack = backend_for(s, "cologne-az")
    return stack, innermost(stack)


def test_an_archived_blob_met_by_an_archive_run_is_rehydrated_and_compared_never_a_failure(azurite, tmp_path) -> None:
    # found by a user: through the composed stack (as the archive stage sees it) an archived blob
    # under the package's name raised RestoreRequiredError, retried until FAILED
    container = azurite.new_container()
    stack, bare = _cold_stack(azurite, tmp_path, container, restore_poll_seconds=7.5)
    data = b"archived package bytes"
    assert put(bare, "raw/p.tar", data).read_back is True and bare.access_tier("raw/p.tar") == "Archive"
    with pytest.raises(OperationDeferred, match="cold storage and not restored; restore requested") as e:
        already_there(stack, "raw/p.tar", len(data), sha(data))
    assert e.value.seconds == 7.5  # the location's restore_poll_seconds: the operation waits, no retry counted
    # the rehydration was requested (Azurite completes it at once): the next look reads it back
    assert bare.stat(f"{REHYDRATED_PREFIX}raw/p.tar") is not None
    assert already_there(stack, "raw/p.tar", len(data), sha(data)) is True
    assert bare.access_tier("raw/p.tar") == "Archive"  # the original never left the Archive tier
    # other bytes of the same size: a conflict, decided by the bytes of the rehydrated copy
    other = b"ARCHIVED package bytes"
    put(bare, "raw/q.tar", other)
    with pytest.raises(OperationDeferred):
        already_there(stack, "raw/q.tar", len(data), sha(data))
    with pytest.raises(DestinationConflictError):
        already_there(stack, "raw/q.tar", len(data), sha(data))
    # another size is a conflict at once: no rehydration needed (and none requested)
    put(bare, "raw/r.tar", b"short")
    with pytest.raises(DestinationConflictError):
        already_there(stack, "raw/r.tar", len(data), sha(data))
    assert bare.stat(f"{REHYDRATED_PREFIX}raw/r.tar") is None


def test_a_hot_blob_accepted_as_already_there_in_a_cold_location_goes_to_the_archive_tier(azurite, tmp_path) -> None:
    # found by a user: a blob left in the Hot tier (a publication that crashed before its move, a
    # copy made by hand) was accepted as "already there" and stayed Hot
    container = azurite.new_container()
    stack, bare = _cold_stack(azurite, tmp_path, container)
    warm = backend(azurite, container)  # the same container, not cold: blobs stay Hot
    data = b"package bytes"
    for key in ("raw/checked.tar", "raw/published.tar", "_packhorse/own.json"):
        put(warm, key, data)
        assert warm.access_tier(key) == "Hot"
    # the archive stage's check before writing
    assert already_there(stack, "raw/checked.tar", len(data), sha(data)) is True
    assert bare.access_tier("raw/checked.tar") == "Archive"
    # a publication that meets the blob (409 BlobAlreadyExists), through the stack
    r = put(stack, "raw/published.tar", data)  # type: ignore[arg-type]
    assert r.already_there is True and bare.access_tier("raw/published.tar") == "Archive"
    # packhorse's own keys stay online
    assert already_there(stack, "_packhorse/own.json", len(data), sha(data)) is True
    assert bare.access_tier("_packhorse/own.json") == "Hot"


def test_a_refused_container_lookup_names_the_container_and_account_never_none(azurite) -> None:
    # found by a user: "looking up the container None in container 'archive'"
    container = azurite.new_container()
    wrong_key = azurite.connection_string.replace(ACCOUNT_KEY, "A" * 86 + "==")
    client = make_container_client(account_url=azurite.account_url, container=container,
                                   connection_string=wrong_key, location="arch")
    b = AzureBackend("arch", client, "lta")
    with pytest.raises(StorageServiceError) as e:
        b.root_missing()
    msg = str(e.value)
    assert f"arch: looking up container '{container}' of account 'devstoreaccount1' failed: " in msg, msg
    assert "None" not in msg and "403" in msg and "A" * 86 not in msg
    with pytest.raises(StorageServiceError, match=r"reading 'raw/x.tar' \(blob 'lta/raw/x.tar'\) in container"):
        b.open_read("raw/x.tar")
