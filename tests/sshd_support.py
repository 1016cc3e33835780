"""A private OpenSSH server for tests (importable as ``sshd_support``): Debian's ``sshd`` on
127.0.0.1 at a free high port, with its own host key, the test's client key in its own
``authorized_keys`` and a known-hosts file listing its host key, all in the test's folder.

``PrivateSshd(folder).start()`` starts it in the foreground of a child process (``-D``);
:meth:`PrivateSshd.cut` kills it *and* its session processes (a cut link: every open
connection drops), :meth:`PrivateSshd.start` again brings it back on the same port and keys.
SFTP requests are logged (``internal-sftp -l INFO``) to :attr:`PrivateSshd.log`.
:func:`sshd_or_skip` skips a test with the reason when ``sshd`` is not installed (``.ci/run``
installs Debian's openssh-server).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from free_ports import free_port

SSHD = "/usr/sbin/sshd"


def sshd_or_skip() -> None:
    """Skip the calling test unless Debian's ``sshd`` and ``ssh-keygen`` are installed."""
    if not os.path.exists(SSHD) or shutil.which("ssh-keygen") is None:
        pytest.skip("openssh-server is not installed (apt-get install openssh-server; .ci/run does)")


def keygen(path: Path) -> Path:
    """A new ed25519 key pair at ``path`` (and ``path.pub``, both replaced), no passphrase; returns ``path``."""
    for old in (path, Path(f"{path}.pub")):
        old.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "packhorse-test", "-f", str(path)],
                   check=True, capture_output=True)
    return path


def fingerprint(pub: Path) -> str:
    """The ``SHA256:...`` fingerprint of public key file ``pub``, as ``ssh-keygen -l`` prints it."""
    out = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(pub)], check=True, capture_output=True,
                         text=True).stdout
    return out.split()[1]


def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry))
    return out


class PrivateSshd:
    """A private sshd in ``folder`` (see the module). Attributes: ``port``, ``host_key``,
    ``client_key`` (the key a site logs in with), ``known_hosts`` (lists the host key for
    ``[127.0.0.1]:port``), ``authorized_keys``, ``log``, ``user`` (who runs the tests)."""

    def __init__(self, folder: Path) -> None:
        sshd_or_skip()
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.host_key = keygen(folder / "host_key")
        self.client_key = keygen(folder / "client_key")
        self.authorized_keys = folder / "authorized_keys"
        self.authorized_keys.write_text((folder / "client_key.pub").read_text())
        self.authorized_keys.chmod(0o600)
        self.known_hosts = folder / "known_hosts"
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {self.host_key_line()}\n")
        self.log = folder / "sshd.log"
        self.config = folder / "sshd_config"
        self.config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.host_key}\n"
            f"AuthorizedKeysFile {self.authorized_keys}\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPubkeyAuthentication yes\nPermitRootLogin prohibit-password\n"
            "StrictModes no\nUsePAM no\nPidFile none\nLogLevel VERBOSE\nMaxStartups 64\nMaxSessions 64\n"
            "Subsystem sftp internal-sftp -l INFO\n")
        self.user = _user()
        self.proc: subprocess.Popen[bytes] | None = None

    def host_key_line(self) -> str:
        """``<type> <base64>`` of the host key."""
        return " ".join((self.folder / "host_key.pub").read_text().split()[:2])

    def host_key_fingerprint(self) -> str:
        """The host key's ``SHA256:...`` fingerprint."""
        return fingerprint(self.folder / "host_key.pub")

    def start(self) -> "PrivateSshd":
        """Start (or restart) the server; returns once it accepts connections (at most 10 s)."""
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege separation folder
        self.proc = subprocess.Popen([SSHD, "-D", "-f", str(self.config), "-E", str(self.log)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"sshd exited {self.proc.returncode}: {err} {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd did not listen on port {self.port} within 10 s")

    def cut(self) -> None:
        """Kill the server and every session process it forked (SIGKILL): open connections drop."""
        if self.proc is None:
            return
        pid = self.proc.pid
        sessions = _children(pid)
        for child in sessions:
            sessions += _children(child)
        self.proc.kill()
        self.proc.wait(10)
        for child in sessions:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc = None

    stop = cut

    def served(self) -> str:
        """The server's log (SFTP requests included)."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name
