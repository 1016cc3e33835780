"""The SSH client of the ``sftp`` transfer method (:mod:`packhorse.storage.sftp`) against a
private, real OpenSSH server (``sshd_support``): ranged reads over several streams return the
object's exact bytes in order; the server's host key must be in the configured known-hosts file
(unknown and changed keys refused, naming host, port and fingerprint); a key the server does
not accept is refused naming user, host and key file; a server that is down or goes away is a
retryable :class:`~packhorse.errors.SshConnectionError`; the route's bandwidth limit holds. And
the ``sftp`` pull's resumption (:func:`packhorse.stages.pull.resume_sampled`): a taken-over
partial keeps its prefix and loses a garbage tail; a difference the sampled ranges miss is
refused by the read-back before publishing, and the partial goes with it."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from packhorse.errors import (
    HostKeyError,
    LocationUnavailableError,
    SourceMissingError,
    SshAuthenticationError,
    SshConnectionError,
    VerificationError,
)
from packhorse.ratelimit import RateLimiter
from packhorse.stages.pull import resume_sampled
from packhorse.storage.base import PARTIAL_SUFFIX
from packhorse.storage.disk import DiskBackend
from packhorse.storage.identity import MARKER_FORMAT, MARKER_KEY
from packhorse.storage.sftp import SftpSource, SshEndpoint
from sshd_support import PrivateSshd, free_port, keygen


@pytest.fixture
def sshd(tmp_path: Path):
    server = PrivateSshd(tmp_path / "sshd").start()
    yield server
    server.stop()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A data location's root as the remote site has it: an identity marker and one 9 MiB object."""
    r = tmp_path / "remote-buffer"
    (r / MARKER_KEY).parent.mkdir(parents=True)
    (r / MARKER_KEY).write_text(json.dumps({"format": MARKER_FORMAT, "location": "fyst-buffer"}))
    (r / "bundles").mkdir()
    (r / "bundles/b.tar").write_bytes(os.urandom(9 * 1024 * 1024 + 12345))
    return r


def endpoint(sshd: PrivateSshd, root_folder: Path, **kw) -> SshEndpoint:
    values = dict(location="fyst-buffer", host="127.0.0.1", port=sshd.port, user=sshd.user, key_file=sshd.client_key,
                  known_hosts_file=sshd.known_hosts, root=str(root_folder), connect_timeout_seconds=5)
    values.update(kw)
    return SshEndpoint(**values)  # type: ignore[arg-type]


def test_parallel_ranged_reads_return_the_exact_bytes_in_order(sshd, root):
    data = (root / "bundles/b.tar").read_bytes()
    with SftpSource(endpoint(sshd, root), streams=4, block_bytes=256 * 1024) as src:
        src.connect()
        info = src.stat("bundles/b.tar")
        assert info is not None and info.size == len(data)
        with src.open_read("bundles/b.tar", size=len(data)) as f:
            got = f.read()
        assert hashlib.sha256(got).hexdigest() == hashlib.sha256(data).hexdigest()
        offset = 3 * 1024 * 1024 + 7  # a resumed read starts past the kept prefix
        with src.open_read("bundles/b.tar", offset=offset, size=len(data)) as f:
            assert f.read() == data[offset:]
        assert src.read_range("bundles/b.tar", 100, 1000) == data[100:1100]
        assert src.stat("bundles/none.tar") is None
        with pytest.raises(SourceMissingError):
            src.read_range("bundles/none.tar", 0, 10)
    # four streams: four SSH sessions were opened, each read a share of the object
    assert sshd.served().count("Accepted publickey") == 4


def test_a_compressed_route_reads_the_exact_bytes_over_zlib_and_an_uncompressed_one_over_none(sshd, root):
    # the route's compression = true asks OpenSSH for zlib after login; the bytes are the same
    # either way, and a kept connection serves only a transfer that asks the same
    data = b"".join(b"%08d FITS card, mostly spaces" % i + b" " * 40 for i in range(200_000))
    (root / "bundles/c.tar").write_bytes(data)
    with SftpSource(endpoint(sshd, root), streams=2, block_bytes=1024 * 1024, compression=True) as src:
        src.connect()
        assert src.compression_in_use == {"zlib@openssh.com"}
        with src.open_read("bundles/c.tar", size=len(data)) as f:
            assert f.read() == data
    with SftpSource(endpoint(sshd, root), streams=2, block_bytes=1024 * 1024) as src:
        src.connect()
        assert src.compression_in_use == {"none"}  # the compressed connections kept above are not taken
        with src.open_read("bundles/c.tar", size=len(data)) as f:
            assert f.read() == data
    assert sshd.served().count("Accepted publickey") == 4


def test_an_unknown_host_key_is_refused_naming_host_port_and_fingerprint(sshd, root, tmp_path):
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    with SftpSource(endpoint(sshd, root, known_hosts_file=empty)) as src:
        with pytest.raises(HostKeyError) as e:
            src.connect()
    msg = str(e.value)
    assert "unknown" in msg and "127.0.0.1" in msg and str(sshd.port) in msg and str(empty) in msg
    assert sshd.host_key_fingerprint() in msg
    assert not e.value.is_retryable


def test_a_changed_host_key_is_refused(sshd, root, tmp_path):
    other = keygen(tmp_path / "other_host_key")
    changed = tmp_path / "changed_known_hosts"
    changed.write_text(f"[127.0.0.1]:{sshd.port} {' '.join(Path(str(other) + '.pub').read_text().split()[:2])}\n")
    with SftpSource(endpoint(sshd, root, known_hosts_file=changed)) as src:
        with pytest.raises(HostKeyError) as e:
            src.connect()
    assert "changed" in str(e.value) and sshd.host_key_fingerprint() in str(e.value)


def test_a_key_the_server_does_not_accept_is_refused_naming_user_host_and_key(sshd, root, tmp_path):
    wrong = keygen(tmp_path / "wrong_key")
    with SftpSource(endpoint(sshd, root, key_file=wrong)) as src:
        with pytest.raises(SshAuthenticationError) as e:
            src.connect()
    msg = str(e.value)
    assert sshd.user in msg and "127.0.0.1" in msg and str(wrong) in msg
    assert not e.value.is_retryable


def test_a_server_that_is_down_is_a_retryable_connection_error(root, tmp_path):
    server = PrivateSshd(tmp_path / "down")  # keys made, never started
    with SftpSource(endpoint(server, root, port=free_port())) as src:
        with pytest.raises(SshConnectionError) as e:
            src.connect()
    assert e.value.is_retryable and "127.0.0.1" in str(e.value)
    assert e.value.step == SshConnectionError.BEFORE_DATA  # the link carried nothing: the same cut goes on


def test_a_cut_mid_read_is_a_retryable_connection_error(sshd, root):
    size = (root / "bundles/b.tar").stat().st_size
    limiter = RateLimiter(2 * 1024 * 1024, burst_seconds=0.25)  # 9 MiB take about 4 s
    with SftpSource(endpoint(sshd, root), streams=2, limiter=limiter) as src:
        with src.open_read("bundles/b.tar", size=size) as f:
            assert f.read(1024 * 1024)
            sshd.cut()
            with pytest.raises(SshConnectionError) as e:
                while f.read(1024 * 1024):
                    pass
    assert e.value.step == SshConnectionError.AFTER_DATA  # the link worked before it: a new cut begins


def test_a_missing_remote_root_or_marker_is_an_unavailable_location(sshd, root):
    with SftpSource(endpoint(sshd, root, root=str(root) + "-gone")) as src:
        with pytest.raises(LocationUnavailableError) as e:
            src.connect()
    assert not e.value.marker_only
    (root / MARKER_KEY).write_text(json.dumps({"format": MARKER_FORMAT, "location": "cologne-buffer"}))
    with SftpSource(endpoint(sshd, root)) as src:
        with pytest.raises(LocationUnavailableError) as e:
            src.connect()  # another location's storage at that root
    assert "'cologne-buffer'" in str(e.value) and not e.value.marker_only
    (root / MARKER_KEY).unlink()
    with SftpSource(endpoint(sshd, root)) as src:
        with pytest.raises(LocationUnavailableError) as e:
            src.connect()
    assert e.value.marker_only


def test_the_bandwidth_limit_holds_over_all_streams(sshd, root):
    size = (root / "bundles/b.tar").stat().st_size
    rate = 4 * 1024 * 1024
    with SftpSource(endpoint(sshd, root), streams=4, limiter=RateLimiter(rate, burst_seconds=0.25)) as src:
        src.connect()
        started = time.monotonic()
        with src.open_read("bundles/b.tar", size=size) as f:
            assert len(f.read()) == size
        took = time.monotonic() - started
    assert took >= 0.85 * (size / rate - 0.25), took


# ------------------------------------------------------------------ resuming a partial over SSH

def _pull_rest(tmp_path: Path, sshd: PrivateSshd, root: Path, partial: bytes) -> tuple[int, bytes]:
    """Leave ``partial`` as an interrupted attempt's partial of the object, resume it as the
    ``sftp`` pull does (sampled check, then the rest over 3 streams), publish with the recorded
    sha256; returns (bytes kept, the published object)."""
    data = (root / "bundles/b.tar").read_bytes()
    (tmp_path / "dst").mkdir(exist_ok=True)
    dst = DiskBackend("cologne-buffer", tmp_path / "dst")
    with dst.open_resumable_write("bundles/b.tar", 1) as first:
        first.write(partial)
        first.suspend()
    work = SimpleNamespace(check=lambda: None, progress=lambda n: None, info={})
    with SftpSource(endpoint(sshd, root), streams=3, block_bytes=512 * 1024) as src, \
            dst.open_resumable_write("bundles/b.tar", 2) as w:
        assert w.resumed_bytes == len(partial)
        w.defer_hash()
        kept = resume_sampled(work, src, w, len(data), hash_prefix=False)  # type: ignore[arg-type]
        with src.open_read("bundles/b.tar", offset=kept, size=len(data)) as f:
            while chunk := f.read(1 << 20):
                w.write(chunk)
        w.publish(hashlib.sha256(data).hexdigest())
    return kept, (tmp_path / "dst/bundles/b.tar").read_bytes()


def test_a_resumed_partial_keeps_its_prefix_and_drops_a_garbage_tail(sshd, root, tmp_path):
    data = (root / "bundles/b.tar").read_bytes()
    mib = 1024 * 1024
    kept, published = _pull_rest(tmp_path, sshd, root, data[:5 * mib] + os.urandom(3 * mib // 2))
    assert 4 * mib <= kept <= 5 * mib  # walked back past the garbage, at 1 MiB steps
    assert published == data


def test_a_partial_of_other_bytes_is_not_kept(sshd, root, tmp_path):
    data = (root / "bundles/b.tar").read_bytes()
    other = bytearray(data[:6 * 1024 * 1024])
    other[10] ^= 0xFF  # equal at its end, different in a sampled range: nothing kept
    kept, published = _pull_rest(tmp_path, sshd, root, bytes(other))
    assert kept == 0 and published == data


def test_a_difference_the_samples_miss_is_refused_before_publishing_and_the_partial_dropped(sshd, root, tmp_path):
    # the sampled check is not the proof: the read-back against the recorded sha256 is (I4)
    data = (root / "bundles/b.tar").read_bytes()
    other = bytearray(data[:6 * 1024 * 1024])
    other[100_000] ^= 0xFF  # between two sampled ranges
    with pytest.raises(VerificationError):
        _pull_rest(tmp_path, sshd, root, bytes(other))
    assert not (tmp_path / "dst/bundles/b.tar").exists()  # nothing published
    assert not [p for p in (tmp_path / "dst").rglob("*") if p.name.endswith(PARTIAL_SUFFIX)]  # next attempt: from 0


def test_a_partial_longer_than_the_object_is_cut_to_it(sshd, root, tmp_path):
    data = (root / "bundles/b.tar").read_bytes()
    kept, published = _pull_rest(tmp_path, sshd, root, data + b"tail")
    assert kept == len(data) and published == data
