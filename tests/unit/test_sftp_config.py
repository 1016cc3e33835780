"""The configuration of the ``sftp`` transfer method: ``[locations.ssh]`` and a route's
``method = "sftp"`` / ``streams`` (docs/configuration.md), the endpoint built from them, and how
its failures are classified (a cut link retried for hours, a trust failure never)."""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Any

import pytest

from packhorse.config import settings_from_dict
from packhorse.domain import TransferMethod
from packhorse.engine.outcome import is_retryable
from packhorse.errors import ConfigError, HostKeyError, SshAuthenticationError, SshConnectionError
from packhorse.storage.sftp import endpoint_for


def config(ssh: dict[str, Any] | None = None, **route: Any) -> dict[str, Any]:
    buffer: dict[str, Any] = {"name": "fyst-buffer", "site": "fyst", "role": "buffer", "path": "fb"}
    if ssh is not None:
        buffer["ssh"] = ssh
    return {
        "sites": [{"name": "fyst"}, {"name": "cologne"}],
        "locations": [
            {"name": "fyst-source", "site": "fyst", "role": "source", "path": "src"},
            buffer,
            {"name": "cologne-buffer", "site": "cologne", "role": "buffer", "path": "cb"},
            {"name": "cologne-lta", "site": "cologne", "role": "long_term_archive", "path": "ca"},
        ],
        "routes": [{"source_site": "fyst", "destination_sites": ["cologne"], **route}],
    }


def refuse(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as e:
        settings_from_dict(data, source="site.toml", environ={})
    return str(e.value)


def test_an_sftp_route_reads_the_endpoint_of_the_source_buffer(tmp_path: Path) -> None:
    s = settings_from_dict(config({"host": "fyst.example.org", "key_file": "keys/id_ed25519",
                                   "known_hosts_file": "/etc/packhorse/known_hosts"}, method="sftp", streams=8),
                           base_dir=tmp_path, environ={})
    route = s.route_from("fyst")
    assert route is not None and route.method is TransferMethod.SFTP and route.streams == 8
    e = endpoint_for(s, "fyst-buffer")
    assert (e.host, e.port, e.user) == ("fyst.example.org", 22, getpass.getuser())
    assert e.key_file == tmp_path / "keys/id_ed25519"  # relative to the configuration's folder
    assert e.known_hosts_file == Path("/etc/packhorse/known_hosts")
    assert e.root == str(tmp_path / "fb")  # the location's path unless the SSH account sees another


def test_the_default_stream_count_is_four() -> None:
    s = settings_from_dict(config({"host": "h", "key_file": "k"}, method="sftp"), environ={})
    assert s.routes[0].streams == 4
    assert endpoint_for(s, "fyst-buffer").known_hosts_file == Path("~/.ssh/known_hosts").expanduser()


def test_an_sftp_route_needs_the_ssh_table_of_the_source_buffer() -> None:
    msg = refuse(config(method="sftp"))
    assert "routes[0]" in msg and "'fyst-buffer'" in msg and "[locations.ssh]" in msg


def test_streams_and_compression_only_apply_to_sftp() -> None:
    assert "streams only applies to method 'sftp'" in refuse(config(streams=2))
    assert "compression only applies to method 'sftp'" in refuse(config(compression=True))
    s = settings_from_dict(config({"host": "h", "key_file": "k"}, method="sftp", compression=True), environ={})
    assert s.routes[0].compression is True
    assert settings_from_dict(config({"host": "h", "key_file": "k"}, method="sftp"), environ={}).routes[0].compression is False


def test_an_ssh_table_needs_host_and_key_file_and_refuses_unknown_keys() -> None:
    assert "locations.1.ssh.host" in refuse(config({"key_file": "k"}, method="sftp")).replace("[", ".").replace("]", "")
    assert "key_file" in refuse(config({"host": "h"}, method="sftp"))
    assert "unknown key" in refuse(config({"host": "h", "key_file": "k", "identity": "k"}, method="sftp"))
    assert "port" in refuse(config({"host": "h", "key_file": "k", "port": 70000}, method="sftp"))


def test_a_cut_link_is_retried_for_as_long_as_it_lasts_but_a_refused_key_never() -> None:
    cut = SshConnectionError("cut", host="fyst.example.org")
    assert is_retryable(cut, retry_count=50, max_retries=3)  # the route's link, not the operation, failed
    assert is_retryable(cut, retry_count=100_000, max_retries=3)  # days of a cut link: never FAILED for it
    assert not is_retryable(HostKeyError("unknown host key"), retry_count=0, max_retries=3)
    assert not is_retryable(SshAuthenticationError("key refused"), retry_count=0, max_retries=3)
