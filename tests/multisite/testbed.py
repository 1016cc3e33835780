"""The multi-host test bed: one Linux network namespace per site, a central namespace, real links.

Every site (``fyst``, ``cologne``, ``cornell``) gets a network namespace of its own with one
address, an ``sshd`` and a ``packhorse worker --site``. Its storage folders sit under the bed's
folder, and every packhorse process of the bed runs in a mount namespace of its own in which
the other sites' folders are hidden under an empty tmpfs: no site can read another site's
files, so the only way bytes cross is the network (SFTP to the source site's buffer). The
central namespace holds a private PostgreSQL cluster, a private Redis broker, two
``packhorse manager`` and one ``packhorse monitor``, and routes between the sites.

Addresses (private range 10.201.0.0/16, used only inside the bed's namespaces)::

    central  10.201.0.1 (services: PostgreSQL :5432, Redis :6379, SSH relays :2201…)
    site i   10.201.i.2  ── veth ──  10.201.i.1 central      (i = 1 fyst, 2 cologne, 3 cornell)

Links are shaped with ``tc qdisc … tbf`` (rate) on both ends of each veth; latency comes from
the bed's own delaying TCP relay (:mod:`delay_relay`) in the central namespace, through which
the sites' SSH connections go (``[locations.ssh] host = 10.201.0.1``, port ``2200 + i``).
Faults: :meth:`TestBed.cut_site` takes a site's link down (centre and other sites unreachable:
database, broker and SSH), :meth:`TestBed.cut_ssh` drops only the SSH path to a site (its relay
stops: a transfer from it breaks mid-stream), :meth:`TestBed.heal_site` / :meth:`heal_ssh`
bring them back.

By hand (root)::

    python tests/multisite/testbed.py up /tmp/bed        # prints how to reach it; leaves it running
    python tests/multisite/testbed.py down /tmp/bed      # stops every process, removes the namespaces

Namespaces are named ``phb<tag>-<site>`` (``tag`` from the bed's folder, so two beds can run at
once); interfaces ``phb<tag><i>c`` / ``phb<tag><i>s``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
CLOCK_SHIFT = HERE.parent / "clock_shift"
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

SITES = ["fyst", "cologne", "cornell"]
CENTRAL_ADDRESS = "10.201.0.1"
PG_PORT = 5432
REDIS_PORT = 6379
PG_BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"))), Path("/usr/lib/postgresql/15/bin"))


def site_address(i: int) -> str:
    """The address of site number ``i`` (1-based) in its own namespace."""
    return f"10.201.{i}.2"


def _run(*cmd: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True, **kw)


def namespaces_work() -> str | None:
    """``None`` if this host can make network namespaces and veth pairs (root, iproute2), else why not."""
    if os.geteuid() != 0:
        return "the multi-site test bed needs root (network namespaces)"
    for tool in ("ip", "tc", "unshare", "runuser"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not Path("/usr/sbin/sshd").exists():
        return "openssh-server is not installed (apt-get install openssh-server; .ci/run does)"
    if not (PG_BIN / "initdb").exists():
        return f"PostgreSQL server binaries not found under {PG_BIN}"
    probe = f"phbprobe{os.getpid() % 10000}"
    r = _run("ip", "netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"ip netns add failed: {r.stderr.strip()}"
    _run("ip", "netns", "del", probe, check=False)
    return None


class TestBed:
    """One bed in ``root`` (a folder it owns). :meth:`up` builds it, :meth:`down` removes it.

    Attributes: ``config`` (the packhorse.toml every process reads), ``database_url``,
    ``broker_url``, ``procs`` (name → Popen of every process started), ``ns`` (site or
    ``"central"`` → namespace name).
    """

    __test__ = False  # not a pytest class

    def __init__(self, root: Path, *, rate_mbit: float | None = None, delay_ms: float = 0.0,
                 ssh_streams: int = 4, clock_ahead: dict[str, float] | None = None,
                 settle_seconds: float = 0.0, worker_processes: int = 2,
                 config_extra: dict[str, Any] | None = None) -> None:
        self.root = root.resolve()
        #: options of :meth:`write_config` the bed's configuration is written with at ``up``
        self.config_extra = dict(config_extra or {})
        #: pool processes of each site's worker (``--concurrency``; two, to spare the shared cores)
        self.worker_processes = worker_processes
        #: site → seconds its packhorse processes' clock runs ahead of the centre's (the
        #: project's clock-shift hook, ``tests/clock_shift``; negative: behind)
        self.clock_ahead = dict(clock_ahead or {})
        self.settle_seconds = settle_seconds
        self.tag = hashlib.sha1(str(self.root).encode()).hexdigest()[:4]
        self.ns = {name: f"phb{self.tag}-{name}" for name in ["central", *SITES]}
        self.rate_mbit = rate_mbit
        self.delay_ms = delay_ms
        self.ssh_streams = ssh_streams
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.config = self.root / "packhorse.toml"
        self.database_url = f"postgresql+psycopg://postgres@{CENTRAL_ADDRESS}:{PG_PORT}/packhorse"
        self.broker_url = f"redis://{CENTRAL_ADDRESS}:{REDIS_PORT}/0"
        self.logs = self.root / "logs"
        # the cluster's folder must be reachable by the postgres user: outside the bed's folder
        # (a test's temporary folder is root's alone)
        self.pg_data = Path(f"/tmp/packhorse-bed-{self.tag}") / "pg"

    # ------------------------------------------------------------------ network

    def _veth(self, i: int, side: str) -> str:
        return f"phb{self.tag}{i}{side}"

    def in_ns(self, name: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` in the namespace of ``name`` (a site or ``"central"``) and wait for it."""
        return _run("ip", "netns", "exec", self.ns[name], *cmd, check=check)

    def _network_up(self) -> None:
        for ns in self.ns.values():
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        central = self.ns["central"]
        _run("ip", "-n", central, "addr", "add", f"{CENTRAL_ADDRESS}/32", "dev", "lo")
        self.in_ns("central", "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        for i, site in enumerate(SITES, start=1):
            c, s = self._veth(i, "c"), self._veth(i, "s")
            _run("ip", "link", "add", c, "netns", central, "type", "veth", "peer", "name", s, "netns", self.ns[site])
            _run("ip", "-n", central, "addr", "add", f"10.201.{i}.1/24", "dev", c)
            _run("ip", "-n", self.ns[site], "addr", "add", f"{site_address(i)}/24", "dev", s)
            _run("ip", "-n", central, "link", "set", c, "up")
            _run("ip", "-n", self.ns[site], "link", "set", s, "up")
            _run("ip", "-n", self.ns[site], "route", "add", "default", "via", f"10.201.{i}.1")
            if self.rate_mbit:
                self.shape(site, self.rate_mbit)

    def shape(self, site: str, rate_mbit: float) -> None:
        """Limit the link of ``site`` to ``rate_mbit`` Mbit/s each way (``tc qdisc … tbf``)."""
        i = SITES.index(site) + 1
        burst = max(32_000, int(rate_mbit * 1e6 / 8 / 250))  # a 4 ms bucket, at least 32 kB
        for ns, dev in ((self.ns["central"], self._veth(i, "c")), (self.ns[site], self._veth(i, "s"))):
            _run("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_mbit}mbit",
                 "burst", str(burst), "latency", "200ms")

    def cut_site(self, site: str) -> None:
        """Take the link of ``site`` down: it reaches neither the centre nor the other sites."""
        i = SITES.index(site) + 1
        _run("ip", "-n", self.ns["central"], "link", "set", self._veth(i, "c"), "down")

    def heal_site(self, site: str) -> None:
        """Bring the link of ``site`` back (its route included)."""
        i = SITES.index(site) + 1
        _run("ip", "-n", self.ns["central"], "link", "set", self._veth(i, "c"), "up")
        _run("ip", "-n", self.ns[site], "route", "replace", "default", "via", f"10.201.{i}.1")

    def cut_ssh(self, site: str) -> None:
        """Drop the SSH path to ``site`` (its relay stops; open connections break). The relay of
        a bed another process brought up (``testbed.py cut-ssh``) is found in the central
        namespace by its command line."""
        name = f"relay-{site}"
        if name in self.procs:
            self.stop(name, sig=signal.SIGKILL)
            return
        listen = f"{CENTRAL_ADDRESS}:{2200 + SITES.index(site) + 1}".encode()
        for pid in _run("ip", "netns", "pids", self.ns["central"], check=False).stdout.split():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(a.endswith(b"delay_relay.py") for a in argv) and listen in argv:
                os.kill(int(pid), signal.SIGKILL)

    def heal_ssh(self, site: str) -> None:
        """Bring the SSH path to ``site`` back."""
        self._start_relay(site)

    # ------------------------------------------------------------------ services

    def _postgres_up(self) -> None:
        data = self.pg_data
        data.mkdir(parents=True, exist_ok=True)
        shutil.chown(data, "postgres", "postgres")
        data.chmod(0o700)
        _run("runuser", "-u", "postgres", "--", str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust",
             "-U", "postgres", "--no-sync")
        with open(data / "pg_hba.conf", "a") as f:
            f.write("host all all 10.201.0.0/16 trust\n")
        self._pg_ctl_start()
        self.in_ns("central", str(PG_BIN / "createdb"), "-h", CENTRAL_ADDRESS, "-p", str(PG_PORT), "-U", "postgres",
                   "packhorse")

    def restart_postgres(self, down_seconds: float = 0.0) -> None:
        """Stop the central database (fast), wait ``down_seconds``, start it again."""
        data = self.pg_data
        self.in_ns("central", "runuser", "-u", "postgres", "--", str(PG_BIN / "pg_ctl"), "-D", str(data), "-m",
                   "fast", "-w", "stop")
        time.sleep(down_seconds)
        self._pg_ctl_start()

    def _pg_ctl_start(self) -> None:
        data = self.pg_data
        self.in_ns("central", "runuser", "-u", "postgres", "--", str(PG_BIN / "pg_ctl"), "-D", str(data), "-w",
                   "-l", str(data / "server.log"), "-o",
                   f"-c listen_addresses={CENTRAL_ADDRESS} -p {PG_PORT} -c unix_socket_directories={data} "
                   "-c fsync=off -c max_connections=200", "start")

    def _postgres_down(self) -> None:
        data = self.pg_data
        if (data / "postmaster.pid").exists():
            _run("runuser", "-u", "postgres", "--", str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate",
                 "stop", check=False)
        shutil.rmtree(data.parent, ignore_errors=True)

    def _spawn(self, name: str, ns: str, cmd: list[str], *, hide_sites: bool = False,
               env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / f"{name}.log", "ab")
        full = ["ip", "netns", "exec", self.ns[ns]]
        if hide_sites:
            # a mount namespace of its own: every site's folder but its own is an empty tmpfs
            hidden = [str(self.root / "sites" / s) for s in SITES if s != ns]
            mounts = " && ".join(f"mount -t tmpfs -o size=1m,mode=0555 packhorse-hidden {h}" for h in hidden)
            full += ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{mounts} && exec "$@"', "sh"]
        full += cmd
        proc = subprocess.Popen(full, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(SRC), **(env or {})}, start_new_session=True)
        self.procs[name] = proc
        return proc

    def _start_relay(self, site: str) -> None:
        i = SITES.index(site) + 1
        self._spawn(f"relay-{site}", "central",
                    [sys.executable, str(HERE / "delay_relay.py"), "--listen", f"{CENTRAL_ADDRESS}:{2200 + i}",
                     "--to", f"{site_address(i)}:22", "--delay-ms", str(self.delay_ms)])
        self._wait_port("central", CENTRAL_ADDRESS, 2200 + i, f"relay to {site}")

    def _wait_port(self, ns: str, host: str, port: int, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        probe = f"import socket; socket.create_connection(({host!r}, {port}), timeout=1).close()"
        while time.monotonic() < deadline:
            if self.in_ns(ns, sys.executable, "-c", probe, check=False).returncode == 0:
                return
            time.sleep(0.2)
        raise RuntimeError(f"{what} did not listen on {host}:{port} within {timeout} s")

    def _sshd_up(self) -> None:
        keys = self.root / "keys"
        keys.mkdir(parents=True, exist_ok=True)
        client = keys / "client_key"
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "packhorse-bed", "-f", str(client))
        known = []
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        for i, site in enumerate(SITES, start=1):
            folder = self.root / "ssh" / site
            folder.mkdir(parents=True, exist_ok=True)
            host_key = folder / "host_key"
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{site}-host", "-f", str(host_key))
            auth = folder / "authorized_keys"
            auth.write_text((keys / "client_key.pub").read_text())
            auth.chmod(0o600)
            (folder / "sshd_config").write_text(
                f"Port 22\nListenAddress {site_address(i)}\nHostKey {host_key}\nAuthorizedKeysFile {auth}\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
                "PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\nPidFile none\nMaxStartups 64\n"
                "MaxSessions 64\nSubsystem sftp internal-sftp\n")
            pub = " ".join((folder / "host_key.pub").read_text().split()[:2])
            known.append(f"[{CENTRAL_ADDRESS}]:{2200 + i} {pub}\n")
            self._spawn(f"sshd-{site}", site, ["/usr/sbin/sshd", "-D", "-f", str(folder / "sshd_config"),
                                               "-E", str(self.logs / f"sshd-{site}.log")])
            self._wait_port(site, site_address(i), 22, f"sshd of {site}")
            self._start_relay(site)
        (keys / "known_hosts").write_text("".join(known))

    def _redis_up(self) -> None:
        self._spawn("redis", "central", ["redis-server", "--bind", CENTRAL_ADDRESS, "--port", str(REDIS_PORT),
                                         "--save", "", "--appendonly", "no", "--protected-mode", "no"])
        self._wait_port("central", CENTRAL_ADDRESS, REDIS_PORT, "redis")

    # ------------------------------------------------------------------ packhorse

    def write_config(self, **extra: Any) -> Path:
        """The bed's ``packhorse.toml``: fyst → cologne, cornell over SFTP; short timings."""
        s = self.root / "sites"
        for site in SITES:
            (s / site).mkdir(parents=True, exist_ok=True)
        (s / "fyst" / "source").mkdir(parents=True, exist_ok=True)
        lease = extra.get("lease_timeout_seconds", 20)
        text = f"""
[database]
url = "{self.database_url}"

[executor]
kind = "celery"
broker_url = "{self.broker_url}"

[recovery]
lease_timeout_seconds = {lease}
heartbeat_interval_seconds = {extra.get("heartbeat_interval_seconds", 2)}
# health heartbeats well inside a lease, as the defaults have them (30 + 60 ≤ 300 s): the
# monitor can then tell a site cut off from a worker that died (docs/recovery.md)
service_heartbeat_interval_seconds = {extra.get("service_heartbeat_interval_seconds", 5)}
service_dead_after_seconds = {extra.get("service_dead_after_seconds", 90)}
monitor_interval_seconds = 1
max_retries = 50
retry_backoff_base_seconds = 0.5
retry_backoff_max_seconds = 5

[managers]
poll_interval_seconds = 0.5

[packaging]
group_depth = 2
settle_seconds = {self.settle_seconds}
bundle_max_wait_seconds = {extra.get("bundle_max_wait_seconds", 2)}

[[sites]]
name = "fyst"
[[sites]]
name = "cologne"
[[sites]]
name = "cornell"

[[locations]]
name = "fyst-source"
site = "fyst"
role = "source"
path = "{s}/fyst/source"

[[locations]]
name = "fyst-buffer"
site = "fyst"
role = "buffer"
path = "{s}/fyst/buffer"
[locations.ssh]
host = "{CENTRAL_ADDRESS}"
port = 2201
user = "root"
key_file = "{self.root}/keys/client_key"
known_hosts_file = "{self.root}/keys/known_hosts"

[[locations]]
name = "cologne-buffer"
site = "cologne"
role = "buffer"
path = "{s}/cologne/buffer"

[[locations]]
name = "cologne-archive"
site = "cologne"
role = "long_term_archive"
path = "{s}/cologne/archive"

[[locations]]
name = "cornell-buffer"
site = "cornell"
role = "buffer"
path = "{s}/cornell/buffer"

[[locations]]
name = "cornell-archive"
site = "cornell"
role = "long_term_archive"
path = "{s}/cornell/archive"

[[routes]]
source_site = "fyst"
destination_sites = ["cologne", "cornell"]
method = "sftp"
streams = {self.ssh_streams}
"""
        self.config.write_text(text)
        return self.config

    def cli(self, ns: str, *args: str, timeout: float = 120, hide_sites: bool = True,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``packhorse ARGS`` in namespace ``ns`` (a site or ``"central"``) and wait for it."""
        cmd = ["ip", "netns", "exec", self.ns[ns]]
        if hide_sites:
            hidden = [str(self.root / "sites" / s) for s in SITES if s != ns]
            mounts = " && ".join(f"mount -t tmpfs -o size=1m,mode=0555 packhorse-hidden {h}" for h in hidden)
            cmd += ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{mounts} && exec "$@"', "sh"]
        cmd += [sys.executable, "-m", "packhorse", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": str(SRC), **(env or {})})

    def start_packhorse(self) -> None:
        """``init`` at each site (its own locations), then a worker per site, two managers and a monitor."""
        for site in SITES:
            r = self.cli(site, "init", "-c", str(self.config), "--site", site, timeout=180,
                         env=self.clock_env(site))
            if r.returncode != 0:
                raise RuntimeError(f"init --site {site} exited {r.returncode}: {r.stdout[-2000:]} {r.stderr[-3000:]}")
        for site in SITES:
            self.start_worker(site)
        for n in (1, 2):
            self.start_manager(n)
        self.start_monitor()

    def start_manager(self, n: int) -> None:
        """Start (or restart) central manager number ``n`` (its ``--instance``)."""
        self._spawn(f"manager-{n}", "central", [sys.executable, "-m", "packhorse", "manager", "-c", str(self.config),
                                                "--instance", str(n)], hide_sites=True)

    def start_monitor(self) -> None:
        """Start (or restart) the central monitor."""
        self._spawn("monitor", "central", [sys.executable, "-m", "packhorse", "monitor", "-c", str(self.config)],
                    hide_sites=True)

    def clock_env(self, site: str) -> dict[str, str]:
        """The environment of a packhorse process of ``site``: with the site's clock shifted when
        :attr:`clock_ahead` names it (its host clock as packhorse and Celery read it, and the
        name of a host of its own: ``<site>-host``), else nothing more."""
        ahead = self.clock_ahead.get(site)
        if not ahead:
            return {}
        return {"PYTHONPATH": f"{CLOCK_SHIFT}{os.pathsep}{SRC}", "PACKHORSE_TEST_CLOCK_SHIFT_SECONDS": str(ahead),
                "PACKHORSE_TEST_HOSTNAME": f"{site}-host"}

    def start_worker(self, site: str) -> None:
        """Start (or restart) the worker of ``site`` in its namespace (its clock shifted when
        :attr:`clock_ahead` names the site)."""
        self._spawn(f"worker-{site}", site, [sys.executable, "-m", "packhorse", "worker", "--site", site, "-c",
                                             str(self.config), "--concurrency", str(self.worker_processes)],
                    hide_sites=True,
                    env=self.clock_env(site))

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        """Stop process ``name`` (its whole process group), SIGKILL after ``timeout`` s."""
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        except ProcessLookupError:
            pass

    def status(self) -> dict[str, Any]:
        """``packhorse status --json`` as read from the centre."""
        r = self.cli("central", "status", "--json", "-c", str(self.config), timeout=60)
        return json.loads(r.stdout) if r.stdout.strip().startswith("{") else {"error": r.stderr[-2000:]}

    def log(self, name: str) -> str:
        """The output of process ``name`` so far."""
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # ------------------------------------------------------------------ lifecycle

    def up(self, *, packhorse: bool = True) -> "TestBed":
        """Build the bed: namespaces and links, PostgreSQL, Redis, sshd and relays, then packhorse."""
        self.root.mkdir(parents=True, exist_ok=True)
        if any(Path("/run/netns", ns).exists() for ns in self.ns.values()):
            self.down()  # a bed of this folder still up (brought up by another process): afresh
        self._forget_state()  # a bed brought up here before: its keys, data and markers go
        try:
            self._network_up()
            self._postgres_up()
            self._redis_up()
            self._sshd_up()
            self.write_config(**self.config_extra)
            if packhorse:
                self.start_packhorse()
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Stop every process the bed started, its PostgreSQL, remove its namespaces and its state
        (site folders, keys); the logs stay in ``logs/``, so a bed can be brought up again in the
        same folder."""
        for name in list(self.procs):
            self.stop(name, timeout=10)
        self._postgres_down()
        for ns in self.ns.values():
            # processes started by hand in the namespace (a bed brought up by another process)
            # killed processes leave the namespace only once they have exited, and until then
            # its name may not go: `up` again at once met "ip netns add" refused (a trial)
            deadline = time.monotonic() + 15
            while True:
                pids = _run("ip", "netns", "pids", ns, check=False).stdout.split()
                for pid in pids:
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
                _run("ip", "netns", "del", ns, check=False)
                if not Path("/run/netns", ns).exists() or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        self._forget_state()

    def _forget_state(self) -> None:
        """Remove the bed's state (site folders, keys, SSH servers' files); the logs stay."""
        for name in ("sites", "keys", "ssh"):
            shutil.rmtree(self.root / name, ignore_errors=True)


def bed_for_test(root: Path, **options: Any) -> TestBed:
    """A bed in ``root`` brought up for a test (``options`` as :class:`TestBed`'s); where
    namespaces cannot be made the test is skipped with the reason, or fails under ``CI=true``
    (CI runs as root and must run these tests)."""
    import pytest

    why = namespaces_work()
    if why:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and the multi-site test bed cannot run: {why}")
        pytest.skip(why)
    return TestBed(root, **options).up()


def archived_files(bed: TestBed, site: str) -> dict[str, list[str]]:
    """``{source path: [sha256 of each copy found]}`` read from the package tars in ``site``'s
    long-term archive, from outside packhorse (every member ``<bag folder>/data/<source path>``)."""
    found: dict[str, list[str]] = {}
    root = bed.root / "sites" / site / "archive"
    for tar_path in root.rglob("*.tar"):
        if "_packhorse" in tar_path.parts:
            continue
        with tarfile.open(tar_path) as tar:
            for m in tar.getmembers():
                parts = m.name.split("/", 2)
                if m.isfile() and len(parts) == 3 and parts[1] == "data":
                    member = tar.extractfile(m)
                    assert member is not None
                    found.setdefault(parts[2], []).append(hashlib.sha256(member.read()).hexdigest())
    return found


def main() -> int:
    """``testbed.py up|down ROOT``: build a bed and leave it running, or remove it;
    ``testbed.py worker ROOT SITE``: start SITE's worker again as ``up`` starts it (its
    namespace, the other sites' folders hidden, its clock shift: give the same ``--clock-ahead``);
    ``testbed.py cut-ssh|heal-ssh ROOT SITE``: drop or restore only the SSH path to SITE (give
    ``heal-ssh`` the same ``--delay-ms`` as ``up``); ``testbed.py cut-site|heal-site ROOT SITE``:
    take SITE's whole link down (centre and other sites) or bring it back;
    ``testbed.py manager ROOT 1|2`` and ``testbed.py monitor ROOT``: start a central manager or
    the monitor again as ``up`` starts them."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["up", "down", "worker", "cut-ssh", "heal-ssh", "cut-site", "heal-site",
                                      "manager", "monitor"])
    p.add_argument("root", type=Path)
    p.add_argument("site", nargs="?", choices=[*SITES, "1", "2"],
                   help="worker: the site whose worker to start; cut-ssh/heal-ssh: the site whose SSH path to "
                        "drop/restore; cut-site/heal-site: the site whose link to take down/bring back; manager: 1 or 2")
    p.add_argument("--rate-mbit", type=float, default=None, help="shape every site link to this rate")
    p.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay of the SSH relays")
    p.add_argument("--clock-ahead", action="append", default=[], metavar="SITE=SECONDS",
                   help="run SITE's packhorse processes with a clock SECONDS ahead of the centre's (repeatable)")
    p.add_argument("--settle-seconds", type=float, default=0.0, help="[packaging] settle_seconds")
    a = p.parse_args()
    ahead = {}
    for item in a.clock_ahead:
        site, _, seconds = item.partition("=")
        if site not in SITES or not seconds:
            p.error(f"--clock-ahead {item}: expected SITE=SECONDS with SITE one of {', '.join(SITES)}")
        ahead[site] = float(seconds)
    bed = TestBed(a.root, rate_mbit=a.rate_mbit, delay_ms=a.delay_ms, clock_ahead=ahead,
                  settle_seconds=a.settle_seconds)
    if a.action == "down":
        bed.down()
        return 0
    if a.action in ("cut-ssh", "heal-ssh", "cut-site", "heal-site", "worker") and a.site not in SITES:
        p.error(f"{a.action}: name the site (one of " + ", ".join(SITES) + ")")
    if a.action in ("cut-site", "heal-site"):
        (bed.cut_site if a.action == "cut-site" else bed.heal_site)(a.site)
        print(f"link of {a.site} {'down: it reaches neither the centre nor the other sites' if a.action == 'cut-site' else 'back'}")
        return 0
    if a.action in ("manager", "monitor"):
        if a.action == "manager":
            if a.site not in ("1", "2"):
                p.error("manager: name the manager, 1 or 2")
            bed.start_manager(int(a.site))
            name = f"manager-{a.site}"
        else:
            bed.start_monitor()
            name = "monitor"
        bed.procs[name].returncode = 0  # it outlives this command
        print(f"{name} started in {bed.ns['central']}; log: {bed.logs}/{name}.log")
        return 0
    if a.action in ("cut-ssh", "heal-ssh"):
        if a.site is None:
            p.error(f"{a.action}: name the site (one of " + ", ".join(SITES) + ")")
        if a.action == "cut-ssh":
            bed.cut_ssh(a.site)
        else:
            bed.heal_ssh(a.site)
            bed.procs[f"relay-{a.site}"].returncode = 0  # it outlives this command
        print(f"SSH path to {a.site} {'dropped' if a.action == 'cut-ssh' else 'back'}")
        return 0
    if a.action == "worker":
        if a.site is None:
            p.error("worker: name the site (one of " + ", ".join(SITES) + ")")
        bed.start_worker(a.site)
        bed.procs[f"worker-{a.site}"].returncode = 0  # it outlives this command
        print(f"worker of {a.site} started in {bed.ns[a.site]}; log: {bed.logs}/worker-{a.site}.log")
        return 0
    why = namespaces_work()
    if why:
        print(why, file=sys.stderr)
        return 2
    bed.up()
    for p_ in bed.procs.values():  # the bed outlives this command
        p_.returncode = 0
    print(f"test bed up in {bed.root}\n  config: {bed.config}\n  database: {bed.database_url}\n"
          f"  namespaces: {', '.join(bed.ns.values())}\n  logs: {bed.logs}\n"
          f"  drop raw files into {bed.root}/sites/fyst/source/<instrument>/<observation>/\n"
          f"  look: ip netns exec {bed.ns['central']} {sys.executable} -m packhorse status -c {bed.config}\n"
          f"  remove: {sys.executable} {__file__} down {bed.root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
